//! What the scheduler core observed, as data ([`Observation`]), and the one place that turns
//! each into its log line and its metrics ([`record`]), so a log and a metric for one event
//! cannot drift. The core only pushes observations; the actor shell records them.

use std::time::Duration;

use crate::{config::PoolName, github::ErrorClass, job::JobAction, metrics::Metrics};

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
    /// A runner left the ledger.
    RunnerRemoved {
        /// Provider.
        provider: PoolName,
    },
    /// A runner's environment is up.
    RunnerStarted {
        /// Claim to environment up.
        startup: Duration,
        /// Queued event to environment up, when the job is known.
        queue_wait: Option<Duration>,
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
            | O::Requeued { job_id, .. } => Some(*job_id),
            _ => None,
        }
    }
}

/// Logs `o` and updates its metrics.
pub fn record(o: Observation, m: &Metrics) {
    use Observation as O;
    match o {
        O::Ignored { job_id, reason } => {
            m.webhook_ignored.with_label_values(&[reason]).inc();
            tracing::info!(
                job_id,
                reason,
                "job outside this daemon's scope: ignored, no API call"
            );
        }
        O::Duplicate { job_id, delivery } => {
            tracing::debug!(
                job_id,
                delivery_id = delivery.as_deref(),
                "duplicate queued event"
            )
        }
        O::Unroutable {
            job_id,
            delivery,
            labels,
        } => {
            m.job_uncovered(&labels);
            tracing::info!(job_id, delivery_id = delivery.as_deref(), labels = ?labels, "no provider covers the job's labels")
        }
        O::Parked { job_id, reason } => {
            m.jobs_parked.with_label_values(&[reason.as_str()]).inc();
            tracing::warn!(
                job_id,
                reason = reason.as_str(),
                "job parked: nothing claimed for it until it is looked at again"
            )
        }
        O::Readmitted { job_id, reason } => {
            if reason != "delivery" {
                m.reconcile_readmitted.with_label_values(&[reason]).inc();
            }
            tracing::info!(job_id, reason, "job admitted again")
        }
        O::QueuedIdle { jobs } => {
            m.reconcile_queued_idle
                .set(i64::try_from(jobs).unwrap_or(i64::MAX));
            if jobs > 0 {
                tracing::info!(
                    jobs,
                    "reconcile: jobs queued on GitHub that this daemon holds idle (parked or cordoned)"
                )
            }
        }
        O::SpareHandedOver {
            job_id,
            runner,
            from,
        } => tracing::info!(
            job_id,
            runner,
            made_for = from,
            "spare runner handed to a job waiting for one"
        ),
        O::RegistrationDeleted { runner } => {
            tracing::info!(runner, "runner deleted on GitHub")
        }
        O::DeletionFailed {
            runner,
            class,
            error,
            again,
        } => {
            if again {
                tracing::warn!(
                    runner,
                    error_class = class.as_str(),
                    error,
                    "deleting the runner failed; trying again later"
                )
            } else {
                tracing::error!(
                    runner,
                    error_class = class.as_str(),
                    error,
                    "deleting the runner failed; the next start's cleanup deletes it"
                )
            }
        }
        O::JobObserved {
            job_id,
            delivery,
            runner,
            action,
        } => tracing::info!(
            job_id,
            delivery_id = delivery.as_deref(),
            runner = runner.as_deref().unwrap_or("no runner"),
            action = action.as_str(),
            "job observed"
        ),
        O::RunnerTookOther {
            job_id,
            runner,
            intended,
        } => {
            tracing::info!(job_id, runner = %runner, intended, "runner picked up a different job than it was created for")
        }
        O::JobFinished {
            provider,
            conclusion,
            duration,
        } => {
            m.jobs_total
                .with_label_values(&[provider.as_str(), conclusion])
                .inc();
            if let Some(d) = duration {
                m.job_duration.observe(d.as_secs_f64());
            }
        }
        O::Claiming { job_id, provider } => {
            tracing::info!(job_id, provider = provider.as_str(), "claiming a runner")
        }
        O::ClaimFailed {
            job_id,
            target,
            provider,
            class,
            error,
        } => {
            m.jit_registration_errors
                .with_label_values(&m.target_labels(&[class.as_str()], &target))
                .inc();
            tracing::warn!(job_id, provider = provider.as_str(), error_class = class.as_str(), error = %error, "claim failed");
        }
        O::Claimed {
            job_id,
            provider,
            runner,
        } => {
            tracing::info!(job_id, provider = provider.as_str(), runner = %runner, "runner claimed; provisioning")
        }
        O::RunnerAdded { provider } => m.jobs_active.with_label_values(&[provider.as_str()]).inc(),
        O::RunnerRemoved { provider } => {
            m.jobs_active.with_label_values(&[provider.as_str()]).dec()
        }
        O::RunnerStarted {
            startup,
            queue_wait,
        } => {
            m.job_startup.observe(startup.as_secs_f64());
            if let Some(w) = queue_wait {
                m.job_queue_wait.observe(w.as_secs_f64());
            }
        }
        O::EnvironmentFailed {
            job_id,
            provider,
            runner,
            error,
        } => {
            m.environment_failures
                .with_label_values(&[provider.as_str()])
                .inc();
            tracing::warn!(job_id, provider = provider.as_str(), runner = %runner, error = %error, "runner environment failed")
        }
        O::RetryScheduled { class } => m.retry_attempts.with_label_values(&[class.as_str()]).inc(),
        O::RetryGivenUp {
            job_id,
            attempts,
            class,
        } => {
            m.retry_given_up.inc();
            tracing::warn!(
                job_id,
                attempts,
                error_class = class.as_str(),
                "claim retries given up"
            );
        }
        O::Abandoned { job_id, why } => {
            tracing::info!(job_id, reason = %why, "dispatch abandoned")
        }
        O::ClaimsPaused {
            target,
            until_unix,
            why,
        } => {
            tracing::warn!(%target, until_unix, reason = why, "claims paused")
        }
        O::Requeued { job_id, why } => {
            tracing::info!(job_id, reason = why, "dispatching the job again")
        }
        O::ProviderStatus {
            provider,
            up,
            cause,
        } => {
            m.pool_up
                .with_label_values(&[provider.as_str()])
                .set(i64::from(up));
            tracing::info!(
                provider = provider.as_str(),
                up,
                cause = cause.as_deref().unwrap_or(""),
                "provider status"
            )
        }
        O::Cordon(on) => {
            m.draining.set(i64::from(on));
            tracing::info!(cordoned = on, "cordon changed");
        }
        O::Reaping {
            runner,
            provider,
            reason,
        } => {
            tracing::info!(runner = %runner, provider = provider.as_str(), reason, "reaping runner")
        }
        O::SweepChecked { result } => m.sweep_checks.with_label_values(&[result]).inc(),
        O::Keeping { runner, why } => {
            tracing::info!(runner = %runner, reason = %why, "keeping the runner")
        }
        O::Restored {
            jobs,
            runners,
            retries,
            redispatch,
        } => tracing::info!(jobs, runners, retries, redispatch, "state restored"),
    }
}
