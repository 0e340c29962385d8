//! The scheduler: the one owner of dedup, routing, slot and claim state. [`core`] decides (in
//! the pure `ephemer-decide` crate), [`actor`] carries decisions out, [`messages`] is what it
//! receives, [`settings_of`] reads what the core decides with from the config.

pub(crate) mod actor;
mod calls;
mod cleanup;
pub use ephemer_decide::scheduler::core;
mod fleet;
pub mod messages;
pub(crate) mod observe;
mod settings;
mod usage;

pub use actor::{
    GithubHandle, RateHandle, ScaleSetClaims, SchedulerActor, SchedulerDeps, start_in,
};
pub use core::ClaimPacer;
pub use core::{
    ClaimRequest, Effect, Note, Phase, Scheduler, SchedulerSettings, SchedulerState, TargetSpec,
};
pub use messages::JobEvent;
pub use settings::{settings_of, target_of};

#[cfg(test)]
pub(crate) use ephemer_decide::scheduler::fixtures;
#[cfg(test)]
mod tests;
