//! What the daemon knows of GitHub's rate-limit budgets: the latest reading per bucket, and
//! whether a bucket is provably empty.

mod book;

pub use book::RateBook;
