//! The claim retry ladder, pure: the backoff with its rungs, jitter and rate-reset snap
//! ([`Backoff`]), the queue of due retries ([`RetryQueue`]), and the one doubling backoff every
//! other retry loop uses ([`Doubling`]). The timers that carry them are the daemon's.

mod backoff;
mod doubling;
mod queue;

pub use backoff::{Backoff, DelayReason, InvalidBackoff, RATE_READING_FRESH};
pub use doubling::{Doubling, DoublingBackoff};
pub use queue::{Failure, MAX_WAIT, RetryItem, RetryQueue, RetryView, Scheduled};
