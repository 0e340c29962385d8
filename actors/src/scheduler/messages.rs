//! Messages the scheduler receives.

use crate::clock::Instant;
use actix::Message;

use crate::job::{JobAction, JobInfo};

/// Where a job event came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventSource {
    /// A verified webhook delivery.
    Webhook,
    /// The start-up or periodic reconcile poll.
    Reconcile,
    /// Pull mode's polls.
    Poll,
    /// Scale-set mode's message queue.
    ScaleSet,
}

/// GitHub said something about a job (a delivery, or a poll that found it queued).
#[derive(Debug, Clone, Message)]
#[rtype(result = "()")]
pub struct JobEvent {
    /// `X-GitHub-Delivery`, for logs.
    pub delivery_id: Option<String>,
    /// What happened.
    pub action: JobAction,
    /// The job.
    pub job: JobInfo,
    /// When the daemon received it (queue wait is measured from here).
    pub received: Instant,
    /// Webhook or reconcile.
    pub source: EventSource,
}

/// Stop claiming (`true`) or resume (`false`). Running jobs are untouched. Resuming is refused
/// while the daemon shuts down.
#[derive(Debug, Clone, Copy, Message)]
#[rtype(result = "Result<(), ShuttingDown>")]
pub struct SetCordon(pub bool);

/// The shutdown drain: stop claiming for good (no `SetCordon(false)` can resume it).
#[derive(Debug, Clone, Copy, Message)]
#[rtype(result = "()")]
pub struct BeginShutdown;

pub use super::core::ShuttingDown;

/// Tear down every runner now (a drain's deadline passed).
#[derive(Debug, Clone, Copy, Message)]
#[rtype(result = "()")]
pub struct TeardownAll;

/// Carry out, now, runner deletions still waiting for a late delivery (the end of a drain).
#[derive(Debug, Clone, Copy, Message)]
#[rtype(result = "()")]
pub struct FlushDeferred;

/// Ask for the scheduler's whole state (tests, embedding apps).
#[derive(Debug, Clone, Copy, Message)]
#[rtype(result = "super::core::SchedulerState")]
pub struct GetSchedulerState;

/// Ask how many entries each of the scheduler's collections holds, and how many tasks its
/// runtime has alive (`GET /api/v1/census`; what a soak samples).
#[derive(Debug, Clone, Copy, Message)]
#[rtype(result = "super::core::Census")]
pub struct GetCensus;

/// Ask for the scheduler's generation: a number that changes with every decision about a job
/// (what the status page's live updates watch).
#[derive(Debug, Clone, Copy, Message)]
#[rtype(result = "u64")]
pub struct GetGeneration;

/// Ask for the usage rows of the jobs that ended at or after `since_unix` (`usage`).
#[derive(Debug, Clone, Copy, Message)]
#[rtype(result = "Result<Vec<crate::durable::UsageRow>, String>")]
pub struct GetUsage {
    /// Unix seconds.
    pub since_unix: u64,
}

/// Ask for the status summary: capacity, providers, counts (no job list).
#[derive(Debug, Clone, Copy, Message)]
#[rtype(result = "super::core::StatusView")]
pub struct GetStatus;

/// Ask what this daemon holds of a scale set's jobs: those routed by `pin` for `owner`.
#[derive(Debug, Clone, Message)]
#[rtype(result = "super::core::PoolDemand")]
pub struct GetPoolDemand {
    /// The target's owner.
    pub owner: String,
    /// The pool's routing label.
    pub pin: String,
}

/// Ask for every job (without timelines) and runner.
#[derive(Debug, Clone, Copy, Message)]
#[rtype(result = "super::core::JobsView")]
pub struct GetJobs;

/// Ask for one job by id, with its timeline.
#[derive(Debug, Clone, Copy, Message)]
#[rtype(result = "Option<super::core::JobDetail>")]
pub struct GetJob(pub u64);

/// Ask for the retry ladder's items.
#[derive(Debug, Clone, Copy, Message)]
#[rtype(result = "super::core::RetryQueueView")]
pub struct GetRetryQueue;

/// Ask how many GitHub calls the scheduler started that have not been answered (claims,
/// deletions, busy checks): a drain waits for them, so no answer is dropped with the actors.
#[derive(Debug, Clone, Copy, Message)]
#[rtype(result = "usize")]
pub struct CallsInFlight;
