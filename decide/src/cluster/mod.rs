//! The fleet's shared records, as plain data (the ledger that holds them is the daemon's).

pub mod types;

pub use types::*;
