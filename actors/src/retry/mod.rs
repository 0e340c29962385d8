//! The claim retry ladder: the pure [`Backoff`] and [`RetryQueue`], the one doubling wait
//! every other retry loop uses ([`Doubling`], counted by [`DoublingBackoff`]), and the
//! [`RetryActor`] that
//! arms the scheduler's one timer (the earliest of its ladder's next item, its deferred
//! decisions and its claim pacing's next token).

mod actor;

pub use actor::{ArmRetryTimer, GetRetryTimer, RetryActor, RetryDue, RetryTimerView};
pub use ephemer_decide::retry::*;
