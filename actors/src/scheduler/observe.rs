//! What the scheduler core observed, as data ([`Observation`]), and the one place that turns
//! each into its log line and its metrics ([`record`]), so a log and a metric for one event
//! cannot drift. The core only pushes observations; the actor shell records them.

pub(crate) use super::core::observation::Observation;
use crate::{config::PoolName, metrics::Metrics};

/// Logs `o` and updates its metrics: each kind in its family's function.
pub(crate) fn record(o: Observation, m: &Metrics) {
    let Some(o) = admission(o, m) else { return };
    let Some(o) = job_runners(o, m) else { return };
    let Some(o) = claims(o, m) else { return };
    let Some(o) = runners_and_retries(o, m) else {
        return;
    };
    pools(o, m);
}

/// A job's admission: ignored, duplicate, unroutable, parked, admitted again, held idle. Anything else is handed back.
fn admission(o: Observation, m: &Metrics) -> Option<Observation> {
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
        O::OtherInstallation {
            job_id,
            repo,
            installation,
            ours,
        } => {
            m.webhook_unknown_installation.inc();
            tracing::warn!(
                job_id,
                repo = ?repo,
                installation,
                ours,
                "a delivery from an App installation this daemon does not know: not acted on; the reconcile admits the job if the owner's installation lists it queued"
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
            tracing::info!(job_id, delivery_id = delivery.as_deref(), labels = %labels.join(", "), "no provider covers the job's labels")
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
        other => return Some(other),
    }
    None
}

/// What became of a job and the runner that served it. Anything else is handed back.
fn job_runners(o: Observation, m: &Metrics) -> Option<Observation> {
    use Observation as O;
    match o {
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
        other => return Some(other),
    }
    None
}

/// Claims, warm claims and GitHub's pickups. Anything else is handed back.
fn claims(o: Observation, m: &Metrics) -> Option<Observation> {
    use Observation as O;
    match o {
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
        O::WarmClaiming { provider } => {
            tracing::debug!(
                provider = provider.as_str(),
                "claiming a registered warm runner"
            )
        }
        O::WarmRegisteredOne { provider, runner } => {
            tracing::info!(provider = provider.as_str(), runner = %runner, "registered warm runner claimed; provisioning")
        }
        O::WarmClaimFailed {
            provider,
            class,
            error,
        } => {
            m.warm
                .discarded
                .with_label_values(&[provider.as_str(), "failed"])
                .inc();
            tracing::warn!(provider = provider.as_str(), error_class = class.as_str(), error = %error, "warm claim failed; the pool's warm claims wait")
        }
        O::WarmRegistered {
            provider,
            available,
            booting,
        } => {
            let gauge = |g: &prometheus::IntGaugeVec, n: usize| {
                g.with_label_values(&[provider.as_str()])
                    .set(i64::try_from(n).unwrap_or(i64::MAX))
            };
            gauge(&m.warm.available, available);
            gauge(&m.warm.booting, booting);
        }
        O::GithubPickup {
            provider,
            hit,
            secs,
        } => m
            .warm
            .github_pickup
            .with_label_values(&[provider.as_str(), if hit { "hit" } else { "miss" }])
            .observe(f64::from(secs)),
        O::WarmOutcome { provider, hit } => m
            .warm
            .claims
            .with_label_values(&[provider.as_str(), if hit { "hit" } else { "miss" }])
            .inc(),
        other => return Some(other),
    }
    None
}

/// Runners started and removed, environments failed, retries, requeues. Anything else is handed back.
fn runners_and_retries(o: Observation, m: &Metrics) -> Option<Observation> {
    use Observation as O;
    match o {
        O::RunnerOutdated {
            provider,
            runner,
            wait,
        } => tracing::warn!(
            runner,
            provider = provider.as_str(),
            wait_secs = wait.as_secs(),
            "the runner exited with code 7: GitHub refused its version as too old; its job is claimed again after the wait, not counted as a failure"
        ),
        O::RefusalOutage {
            provider,
            runner,
            version,
        } => {
            m.runner_refusal_outages
                .with_label_values(&[provider.as_str()])
                .inc();
            tracing::warn!(
                runner,
                provider = provider.as_str(),
                "{}: the pool's refused jobs wait for the service, one probing it every {} s at most",
                ephemer_decide::release::policy::outage_line(&version),
                ephemer_decide::scheduler::core::refusal::PROBE_WAIT_MAX.as_secs()
            )
        }
        O::RefusalOutageOver {
            provider,
            version,
            why,
        } => tracing::info!(
            provider = provider.as_str(),
            version,
            "GitHub's refusal of the pool's newest runner release is over: {why}"
        ),
        O::RunnerRemoved { provider } => {
            m.jobs_active.with_label_values(&[provider.as_str()]).dec()
        }
        O::RunnerStarted {
            startup,
            queue_wait,
            provider,
            warm,
        } => {
            m.job_startup.observe(startup.as_secs_f64());
            if let Some(w) = queue_wait {
                m.job_queue_wait.observe(w.as_secs_f64());
                m.warm
                    .pickup
                    .with_label_values(&[provider.as_str(), if warm { "hit" } else { "miss" }])
                    .observe(w.as_secs_f64());
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
        other => return Some(other),
    }
    None
}

/// A runner reaped: a warm one's discard counted by why.
fn reaping(runner: &str, provider: &PoolName, reason: &'static str, m: &Metrics) {
    let warm = match reason {
        crate::scheduler::core::REAP_WARM_AGE => Some("age"),
        crate::scheduler::core::REAP_WARM_SURPLUS => Some("surplus"),
        _ => None,
    };
    if let Some(why) = warm {
        m.warm
            .discarded
            .with_label_values(&[provider.as_str(), why])
            .inc();
    }
    tracing::info!(runner, provider = provider.as_str(), reason, "reaping runner")
}

/// Pools up or down, the cordon, reaping, the sweep, the daemon's own state.
fn pools(o: Observation, m: &Metrics) {
    use Observation as O;
    match o {
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
        } => reaping(&runner, &provider, reason, m),
        O::SweepChecked { result } => m.sweep_checks.with_label_values(&[result]).inc(),
        O::Keeping { runner, why } => {
            tracing::info!(runner = %runner, reason = %why, "keeping the runner")
        }
        O::TransitionRefused { job_id, from, to } => tracing::error!(
            job_id,
            from,
            to,
            "the scheduler asked for a move its job table does not allow; the job was left as it \
             was (a bug: please report it with this job's timeline)"
        ),
        O::Restored {
            jobs,
            runners,
            retries,
            redispatch,
        } => tracing::info!(jobs, runners, retries, redispatch, "state restored"),
        // Recorded by the families above (named, so a new kind must be placed somewhere).
        O::Ignored { .. }
        | O::OtherInstallation { .. }
        | O::RunnerOutdated { .. }
        | O::RefusalOutage { .. }
        | O::RefusalOutageOver { .. }
        | O::Duplicate { .. }
        | O::Unroutable { .. }
        | O::Parked { .. }
        | O::Readmitted { .. }
        | O::QueuedIdle { .. }
        | O::SpareHandedOver { .. }
        | O::RegistrationDeleted { .. }
        | O::DeletionFailed { .. }
        | O::JobObserved { .. }
        | O::RunnerTookOther { .. }
        | O::JobFinished { .. }
        | O::Claiming { .. }
        | O::ClaimFailed { .. }
        | O::Claimed { .. }
        | O::RunnerAdded { .. }
        | O::WarmClaiming { .. }
        | O::WarmRegisteredOne { .. }
        | O::WarmClaimFailed { .. }
        | O::WarmRegistered { .. }
        | O::GithubPickup { .. }
        | O::WarmOutcome { .. }
        | O::RunnerRemoved { .. }
        | O::RunnerStarted { .. }
        | O::EnvironmentFailed { .. }
        | O::RetryScheduled { .. }
        | O::RetryGivenUp { .. }
        | O::Abandoned { .. }
        | O::ClaimsPaused { .. }
        | O::Requeued { .. } => {}
    }
}
