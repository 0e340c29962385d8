//! The slice of the config the scheduler's core decides with, read from a [`Config`].

use std::time::Duration;

use super::core::{
    ProviderSpec, SEEN_TTL, STARTED_TTL_NO_TIMEOUT, SchedulerSettings, TargetSpec, ZOMBIE_CAP,
};
use crate::config::{Config, WebhookMode};

/// Scale-set mode: how long a runner's job may stay unobserved after the runner exits.
const SCALESET_HEAL_GRACE: Duration = Duration::from_secs(5);
/// Fleet mode: another host's `in_progress` reaches this one with that host's next round trip
/// to the ledger, up to [`crate::cluster::lazy::LINGER`] later: a runner of ours that exited
/// meanwhile most likely ran a job another host heard of.
const FLEET_HEAL_GRACE: Duration = Duration::from_secs(2);

/// The scheduler settings a config implies.
pub fn settings_of(c: &Config) -> SchedulerSettings {
    let targets: Vec<TargetSpec> = c.targets().iter().map(target_of).collect();
    let providers = c
        .providers
        .enabled()
        .into_iter()
        .map(|pool| ProviderSpec {
            name: pool.name.clone(),
            kind: pool.kind(),
            labels: c.routing_labels(pool),
            max_concurrent: pool.common.max_concurrent,
            targets: pool.common.targets.as_ref().map(|names| {
                targets
                    .iter()
                    .enumerate()
                    .filter(|(_, t)| names.contains(&t.name))
                    .map(|(i, _)| i)
                    .collect()
            }),
            warm: pool
                .common
                .warm
                .registered()
                .then(|| pool.common.warm.clone()),
            accel: match &pool.spec {
                crate::config::PoolSpec::LinuxVm(v) => Some(v.accel.as_str().to_string()),
                _ => None,
            },
        })
        .collect();
    SchedulerSettings {
        providers,
        max_concurrent: c.runner.max_concurrent,
        name_prefix: c.runner.name_prefix.clone(),
        install_id: String::new(),
        targets,
        retry_enabled: c.runner.claim_retry.enabled,
        seen_ttl: SEEN_TTL.min(c.state.retention),
        retention: c.state.retention,
        usage_retention: c.state.usage_retention,
        started_ttl: c
            .runner
            .job_timeout
            .map_or(STARTED_TTL_NO_TIMEOUT, |t| t + SEEN_TTL),
        zombie_cap: ZOMBIE_CAP,
        heal_grace: match c.webhook.mode {
            WebhookMode::Pull => c.webhook.poll_interval * 2 + Duration::from_secs(1),
            // A scale set's `JobStarted` comes in a queue message, after a poll's answer.
            WebhookMode::ScaleSet => SCALESET_HEAL_GRACE,
            WebhookMode::Push => Duration::ZERO,
        }
        .max(if c.cluster.is_some() {
            FLEET_HEAL_GRACE
        } else {
            Duration::ZERO
        }),
        orphan_grace: c
            .runner
            .orphan_sweep
            .enabled
            .then_some(c.runner.orphan_sweep.grace),
        // A scale set's queue redelivers what was not acknowledged, and its jobs are not
        // workflow job ids the REST listing knows.
        reconcile_interval: c
            .webhook
            .reconcile_interval
            .filter(|_| !c.webhook.scaleset()),
        fleet: c.cluster.is_some(),
        scaleset: c.webhook.scaleset(),
        traces: c.telemetry.otlp_endpoint.is_some(),
    }
}

/// The scheduler's view of a config's target.
pub fn target_of(t: &crate::config::Target) -> TargetSpec {
    TargetSpec {
        name: t.name.clone(),
        owner: t.github.owner.clone(),
        repos: t.github.repos.clone(),
        installation_id: match &t.github.auth {
            crate::config::GithubAuth::App(app) => Some(app.installation_id),
            crate::config::GithubAuth::Token(_) => None,
        },
        claims_per_minute: t.github.max_claims_per_minute,
        weight: t.weight.max(1),
    }
}
