//! The scheduler: the one owner of dedup, routing, slot and claim state. [`core`] decides,
//! [`actor`] carries decisions out, [`messages`] is what it receives.

pub mod actor;
mod calls;
mod cleanup;
pub mod core;
mod fleet;
pub mod messages;
pub mod observe;

pub use actor::{
    GithubHandle, RateHandle, ScaleSetClaims, SchedulerActor, SchedulerDeps, start_in,
};
pub use core::ClaimPacer;
pub use core::{
    ClaimRequest, Effect, Note, Phase, Scheduler, SchedulerSettings, SchedulerState, TargetSpec,
};
pub use messages::JobEvent;

#[cfg(test)]
pub(crate) mod fixtures;
#[cfg(test)]
mod tests;
