//! What the core observed, as data: the shell turns each [`Observation`] into its log line and
//! its metrics (`scheduler::observe::record`), so the core never logs or counts.

use std::time::Duration;

use crate::{config::PoolName, github::ErrorClass, job::JobAction};

/// Something the scheduler decided or saw that operators count or read.
#[derive(Debug, Clone, PartialEq)]
pub enum Observation {
    /// A job outside the configured owner, repos or installation.
    Ignored {
        /// Job.
        job_id: u64,
        /// `owner`, `repo` or `installation`.
        reason: &'static str,
    },
    /// A delivery from an App installation this daemon does not know (GitHub sent other
    /// Apps' installation ids in June 2026, runs-on#509): not recorded, so the reconcile
    /// (which lists with the daemon's own installation) admits the job if it is the owner's.
    OtherInstallation {
        /// Job.
        job_id: u64,
        /// Its repository.
        repo: String,
        /// The installation the delivery named.
        installation: u64,
        /// The daemon's.
        ours: u64,
    },
    /// A runner exited with code 7: GitHub refused its version; its job is claimed again
    /// after `wait`.
    RunnerOutdated {
        /// Its pool.
        provider: crate::config::PoolName,
        /// The runner.
        runner: String,
        /// How long its job waits.
        wait: Duration,
    },
    /// GitHub refused runner `runner` of `provider`, whose install is the newest release
    /// `version`: an outage begins; the pool's refused jobs wait for a probe (`refusal`).
    RefusalOutage {
        /// Its pool.
        provider: crate::config::PoolName,
        /// The runner.
        runner: String,
        /// The release GitHub refuses.
        version: String,
    },
    /// A pool's outage ended (`why`).
    RefusalOutageOver {
        /// Its pool.
        provider: crate::config::PoolName,
        /// The release GitHub refused.
        version: String,
        /// Why it is over.
        why: &'static str,
    },
    /// A queued event dropped by the dedup gate.
    Duplicate {
        /// Job.
        job_id: u64,
        /// Delivery.
        delivery: Option<String>,
    },
    /// No enabled provider covers the job.
    Unroutable {
        /// Job.
        job_id: u64,
        /// Delivery.
        delivery: Option<String>,
        /// Its labels.
        labels: std::sync::Arc<[String]>,
    },
    /// A job was parked (its runners always reaped idle, or its claims given up on).
    Parked {
        /// Job.
        job_id: u64,
        /// Why.
        reason: crate::scheduler::core::ParkReason,
    },
    /// The scheduler asked the job table for a move its state diagram does not have; the
    /// record was left as it was. A bug to report: the job may need an operator's look.
    TransitionRefused {
        /// Job.
        job_id: u64,
        /// The phase it is in.
        from: &'static str,
        /// The phase asked for.
        to: &'static str,
    },
    /// A known job admitted again (`parked`, `idle`, `delivery`) or an unknown one admitted by
    /// a reconcile pass (`unknown`).
    Readmitted {
        /// Job.
        job_id: u64,
        /// Why.
        reason: &'static str,
    },
    /// Jobs the last reconcile passes found queued on GitHub that the daemon holds idle.
    QueuedIdle {
        /// How many.
        jobs: usize,
    },
    /// A spare runner was handed to a job waiting for one.
    SpareHandedOver {
        /// The job.
        job_id: u64,
        /// Runner.
        runner: String,
        /// The job it was made for.
        from: u64,
    },
    /// A runner's registration was deleted on GitHub (or was gone already).
    RegistrationDeleted {
        /// Runner.
        runner: String,
    },
    /// Deleting a runner's registration failed.
    DeletionFailed {
        /// Runner.
        runner: String,
        /// Class.
        class: ErrorClass,
        /// What went wrong.
        error: String,
        /// Whether it is tried again.
        again: bool,
    },
    /// `in_progress` or `completed` seen.
    JobObserved {
        /// Job.
        job_id: u64,
        /// Delivery.
        delivery: Option<String>,
        /// Runner named in the event.
        runner: Option<String>,
        /// Which.
        action: JobAction,
    },
    /// A runner ran another job than the one it was made for.
    RunnerTookOther {
        /// The job it ran.
        job_id: u64,
        /// Runner.
        runner: String,
        /// The job it was made for.
        intended: u64,
    },
    /// A job ran to completion on a runner of ours.
    JobFinished {
        /// Provider.
        provider: PoolName,
        /// Bounded conclusion.
        conclusion: &'static str,
        /// How long its runner ran, when known.
        duration: Option<Duration>,
    },
    /// A claim started.
    Claiming {
        /// Job.
        job_id: u64,
        /// Provider.
        provider: PoolName,
    },
    /// A claim failed.
    ClaimFailed {
        /// The job's target (the `target` label, when metrics carry one).
        target: String,
        /// Job.
        job_id: u64,
        /// Provider.
        provider: PoolName,
        /// Class.
        class: ErrorClass,
        /// What went wrong.
        error: String,
    },
    /// A runner was registered and handed to its provisioner.
    Claimed {
        /// Job.
        job_id: u64,
        /// Provider.
        provider: PoolName,
        /// Runner.
        runner: String,
    },
    /// A runner entered the ledger (claimed, or restored after a restart).
    RunnerAdded {
        /// Provider.
        provider: PoolName,
    },
    /// A registered warm runner is being claimed.
    WarmClaiming {
        /// Pool.
        provider: PoolName,
    },
    /// A registered warm runner was claimed and goes to its pool.
    WarmRegisteredOne {
        /// Pool.
        provider: PoolName,
        /// Runner.
        runner: String,
    },
    /// A warm claim failed; the pool's warm claims wait a while.
    WarmClaimFailed {
        /// Pool.
        provider: PoolName,
        /// Error class.
        class: ErrorClass,
        /// The error.
        error: String,
    },
    /// A registered pool's warm runners changed.
    WarmRegistered {
        /// Pool.
        provider: PoolName,
        /// Registered, up and idle.
        available: usize,
        /// Claimed or booting.
        booting: usize,
    },
    /// A job of a pool that keeps registered warm runners started with no claim made for it
    /// (`hit`: a runner registered ahead took it) or after one (`miss`).
    WarmOutcome {
        /// Pool.
        provider: PoolName,
        /// Got a warm runner.
        hit: bool,
    },
    /// A job was taken by a runner of ours, and its event carried GitHub's `created_at`
    /// and `started_at` (or the scale set's queue and assignment times).
    GithubPickup {
        /// Pool.
        provider: PoolName,
        /// Its runner started warm (or, registered, no claim was made for it).
        hit: bool,
        /// `started_at` less `created_at`, whole seconds.
        secs: u32,
    },
    /// A runner left the ledger.
    RunnerRemoved {
        /// Provider.
        provider: PoolName,
    },
    /// A runner's environment is up.
    RunnerStarted {
        /// Claim to environment up.
        startup: Duration,
        /// Queued event to environment up, when the job is known: the job's pickup.
        queue_wait: Option<Duration>,
        /// The pool.
        provider: PoolName,
        /// Whether the runner started in an environment booted ahead (a warm one).
        warm: bool,
    },
    /// A runner's environment could not be made.
    EnvironmentFailed {
        /// The job it was made for.
        job_id: u64,
        /// Its pool.
        provider: PoolName,
        /// Runner.
        runner: String,
        /// What went wrong.
        error: String,
    },
    /// A failed claim went onto the ladder.
    RetryScheduled {
        /// Class of its first failure.
        class: ErrorClass,
    },
    /// The ladder gave up on a job.
    RetryGivenUp {
        /// Job.
        job_id: u64,
        /// Failures in all.
        attempts: u32,
        /// Class of the first failure.
        class: ErrorClass,
    },
    /// A job's dispatch stopped with nothing in flight.
    Abandoned {
        /// Job.
        job_id: u64,
        /// Why.
        why: String,
    },
    /// Every claim is held back until `until_unix`.
    ClaimsPaused {
        /// The target whose claims wait.
        target: String,
        /// Unix seconds.
        until_unix: u64,
        /// Why.
        why: &'static str,
    },
    /// A job is dispatched again.
    Requeued {
        /// Job.
        job_id: u64,
        /// Why.
        why: &'static str,
    },
    /// A provider went up or down.
    ProviderStatus {
        /// Provider.
        provider: PoolName,
        /// Up.
        up: bool,
        /// Why down.
        cause: Option<String>,
    },
    /// Cordon changed.
    Cordon(bool),
    /// The sweep reaps a runner GitHub says is idle.
    Reaping {
        /// Runner.
        runner: String,
        /// Provider.
        provider: PoolName,
        /// Why.
        reason: &'static str,
    },
    /// GitHub answered the sweep's busy check: `idle`, `busy` or `error`.
    SweepChecked {
        /// The answer.
        result: &'static str,
    },
    /// The sweep keeps a runner GitHub says is busy, or could not ask about.
    Keeping {
        /// Runner.
        runner: String,
        /// Why.
        why: String,
    },
    /// State rebuilt from the store.
    Restored {
        /// Open jobs.
        jobs: usize,
        /// Ledger runners.
        runners: usize,
        /// Ladder items.
        retries: usize,
        /// Jobs dispatched again.
        redispatch: usize,
    },
}

impl Observation {
    /// The job this observation is about, if it is about one: the shell logs it inside that
    /// job's span.
    pub fn job_id(&self) -> Option<u64> {
        use Observation as O;
        match self {
            O::Ignored { job_id, .. }
            | O::Duplicate { job_id, .. }
            | O::Unroutable { job_id, .. }
            | O::Parked { job_id, .. }
            | O::Readmitted { job_id, .. }
            | O::SpareHandedOver { job_id, .. }
            | O::JobObserved { job_id, .. }
            | O::RunnerTookOther { job_id, .. }
            | O::Claiming { job_id, .. }
            | O::ClaimFailed { job_id, .. }
            | O::Claimed { job_id, .. }
            | O::EnvironmentFailed { job_id, .. }
            | O::RetryGivenUp { job_id, .. }
            | O::Abandoned { job_id, .. }
            | O::Requeued { job_id, .. }
            | O::TransitionRefused { job_id, .. } => Some(*job_id),
            _ => None,
        }
    }
}
