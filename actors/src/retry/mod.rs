//! The claim retry ladder: the pure [`Backoff`] and [`RetryQueue`], and the [`RetryActor`] that
//! arms one timer for the earliest due item.

mod actor;
mod backoff;
mod queue;

pub use actor::{ArmRetryTimer, GetRetryTimer, RetryActor, RetryDue, RetryTimerView};
pub use backoff::{Backoff, DelayReason, InvalidBackoff, RATE_READING_FRESH};
pub use queue::{Failure, MAX_WAIT, RetryItem, RetryQueue, RetryView, Scheduled};
