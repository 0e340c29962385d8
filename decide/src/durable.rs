//! The durable records, as plain data: an accepted job ([`JobRow`]), a runner of the ledger
//! ([`RunnerRow`]), a job on the retry ladder ([`RetryRow`]), one change to them ([`Op`]), and
//! everything held at start-up ([`Snapshot`]). The scheduler's core and the ladder decide in
//! these terms; the `store` (redb) and the fleet's ledger (PostgreSQL) write them.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::{
    config::PoolName,
    job::{JobInfo, JobKey},
    vocab::ErrorClass,
};

/// A job the intake accepted and nobody has seen finish yet.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobRow {
    /// The job.
    pub info: JobInfo,
    /// Unix seconds the queued event arrived.
    pub received_unix: u64,
    /// Unix seconds it was observed running (then it is only kept for dedup until pruned).
    pub started_unix: Option<u64>,
}

/// A runner in the ledger.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunnerRow {
    /// Name (also the environment's handle: directory, container or VM name).
    pub name: String,
    /// GitHub id.
    pub id: u64,
    /// Provider.
    pub provider: PoolName,
    /// Repo for repo-level runners.
    pub repo: Option<String>,
    /// The job it was created for.
    pub intent: JobKey,
    /// The job it ran, once observed.
    pub bound: Option<JobKey>,
    /// Unix seconds of the claim.
    pub created_unix: u64,
}

/// A job on the retry ladder.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RetryRow {
    /// The job.
    pub job: JobInfo,
    /// Failures so far.
    pub attempts: u32,
    /// Unix seconds of the first failure.
    pub first_failure_unix: u64,
    /// Unix seconds of the next attempt.
    pub next_attempt_unix: u64,
    /// Class of the first failure.
    pub class: ErrorClass,
    /// The latest failure.
    pub last_error: String,
}

/// What a finished job used of this host's runners: one row per job a runner was claimed for
/// here, written when GitHub says it completed, kept for `state.usage_retention`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UsageRow {
    /// The job.
    pub job: JobKey,
    /// Its repository (without the owner).
    pub repo: String,
    /// The pool its runner came from.
    pub pool: String,
    /// The GitHub target (`[[targets]]` name, or the owner) it belongs to.
    pub target: String,
    /// Unix seconds it was queued (its first delivery here).
    pub queued_unix: u64,
    /// Unix seconds it completed.
    pub ended_unix: u64,
    /// From its runner's claim to its completion, milliseconds: what it held of the host.
    pub runner_ms: u64,
    /// Claims that failed on the way.
    pub retries: u32,
    /// From queued to running, milliseconds, where it was seen running.
    #[serde(default)]
    pub pickup_ms: Option<u64>,
}

/// One change.
#[derive(Debug, Clone)]
pub enum Op {
    /// Record an accepted job unless it is already there.
    AddJob(JobRow),
    /// Mark a job observed running.
    JobStarted(JobKey, u64),
    /// Forget a job.
    DeleteJob(JobKey),
    /// Record or update a runner.
    PutRunner(RunnerRow),
    /// Forget a runner (its environment is gone).
    DeleteRunner(String),
    /// A runner's registration is gone from GitHub: its deletion was answered (or found it
    /// gone), or an event named the runner with a job, after which GitHub removes it. Only the
    /// cluster ledger keeps registrations past their environment, so only it acts on this.
    Unregistered(String),
    /// Record or update a retry.
    PutRetry(RetryRow),
    /// Forget a retry.
    DeleteRetry(JobKey),
    /// Record a named mark (replacing the last one of that name).
    PutMark(String, serde_json::Value),
    /// Record what a finished job used.
    PutUsage(UsageRow),
    /// Forget the usage of jobs that ended before these unix seconds.
    PruneUsage(u64),
}

/// Everything the store held at start-up.
#[derive(Debug, Default, Clone)]
pub struct Snapshot {
    /// Open jobs.
    pub jobs: Vec<JobRow>,
    /// The runner ledger.
    pub runners: Vec<RunnerRow>,
    /// The retry ladder.
    pub retries: Vec<RetryRow>,
    /// Named marks.
    pub marks: std::collections::HashMap<String, serde_json::Value>,
    /// Where an unreadable store was moved, if it was.
    pub moved_aside: Option<PathBuf>,
}
