//! The scale-set wing (`webhook.mode = "scaleset"`): a `ScaleSetListener` per pool and
//! target the pool serves, handing jobs to the intake and registering the pool's runners; the
//! scheduler is told where each pool's claims go.

use std::collections::HashMap;

use actix::{Actor, Addr};

use super::github::GithubWing;
use crate::{
    config::{Config, Target},
    github::actions::ActionsClient,
    metrics::Metrics,
    scaleset::{Mark, ScaleSetListener, ScaleSetSettings, ScaleSetWiring, mark_of},
    scheduler::{ScaleSetClaims, SchedulerActor},
    store::Store,
    webhook::WebhookActor,
};

/// Everything the wing is wired to.
pub(super) struct ScaleSetWiringIn<'a> {
    pub(super) scheduler: &'a Addr<SchedulerActor>,
    pub(super) webhook: &'a Addr<WebhookActor>,
    pub(super) github: &'a GithubWing,
    pub(super) store: &'a Store,
    pub(super) marks: &'a HashMap<String, serde_json::Value>,
    pub(super) install_id: &'a str,
    pub(super) ledger: Option<crate::cluster::Ledger>,
    pub(super) metrics: &'a Metrics,
}

/// Starts the listeners (none outside scale-set mode) and tells the scheduler about them.
pub(super) fn start(
    config: &Config,
    targets: &[Target],
    w: ScaleSetWiringIn<'_>,
) -> Vec<Addr<ScaleSetListener>> {
    if !config.webhook.scaleset() {
        return Vec::new();
    }
    let owner_name = format!("{}-{}", crate::config::cluster::hostname(), w.install_id);
    let mut listeners = Vec::new();
    let mut claims = HashMap::new();
    for (t, target) in targets.iter().enumerate() {
        let client = ActionsClient::new(w.github.clients[t].clone());
        for pool in config.providers.enabled() {
            let serves = pool
                .common
                .targets
                .as_ref()
                .is_none_or(|names| names.contains(&target.name));
            if !serves {
                continue;
            }
            let mark = w
                .marks
                .get(&mark_of(&target.github.owner, pool.name.as_str()))
                .and_then(|v| serde_json::from_value::<Mark>(v.clone()).ok())
                .unwrap_or_default();
            let listener = ScaleSetListener::new(
                client.clone(),
                ScaleSetSettings {
                    pool: pool.name.clone(),
                    labels: pool.common.labels.clone(),
                    // What the pool can produce, as ARC sends its `maxRunners`: the service
                    // holds its assignments against it. Never the free slots.
                    max: pool.common.max_concurrent.min(config.runner.max_concurrent),
                    disable_update: config.runner.update.auto_update
                        && pool
                            .process()
                            .is_some_and(|p| p.program == crate::config::RunnerProgram::Managed),
                    runner_group: target.github.runner_group.clone(),
                    runner_group_id: target.github.runner_group_id,
                    owner_name: owner_name.clone(),
                    mark,
                },
                ScaleSetWiring {
                    intake: w.webhook.clone().recipient(),
                    scheduler: w.scheduler.downgrade(),
                    store: Some(w.store.clone()),
                    ledger: w.ledger.clone(),
                },
                w.metrics.clone(),
            )
            .start();
            claims.insert(
                (target.github.owner.to_ascii_lowercase(), pool.name.clone()),
                listener.clone().recipient(),
            );
            listeners.push(listener);
        }
    }
    w.scheduler.do_send(ScaleSetClaims(claims));
    listeners
}
