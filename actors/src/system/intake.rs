//! The intake wing: the `WebhookActor` (delivery dedup, the durable record of accepted jobs)
//! forwarding to the scheduler, the HTTP edge in front of it, and what feeds it besides
//! deliveries: a `RedeliverActor` per target (push mode: GitHub never redelivers a failed
//! delivery by itself) or a `PullActor` per target (pull mode: no delivery comes in).

use std::{collections::HashMap, sync::Arc};

use actix::{Actor, Addr};
use actix_web::web;

use super::StartError;
use crate::{
    cluster::Ledger,
    config::{Config, GithubAuth, Secret, Target},
    github::actor::GithubActor,
    metrics::Metrics,
    scheduler::SchedulerActor,
    store::Store,
    vocab::LabelSet,
    webhook::{
        HookIds, TargetKey, WebhookActor, WebhookIntake,
        pull::{PullActor, PullSettings, PullWiring},
        redeliver::{RedeliverActor, RedeliverSettings, RedeliverWiring, mark_of},
    },
};

/// What the intake wing started.
pub(super) struct IntakeWing {
    pub(super) webhook: Addr<WebhookActor>,
    /// The HTTP edge, to mount.
    pub(super) edge: web::Data<WebhookIntake>,
    pub(super) redeliver: Vec<Addr<RedeliverActor>>,
    pub(super) pull: Vec<Addr<PullActor>>,
}

/// Everything the intake wing is wired to.
pub(super) struct IntakeWiring<'a> {
    pub(super) scheduler: &'a Addr<SchedulerActor>,
    /// Each target's GitHub actor, with its name, in config order.
    pub(super) github: &'a [(String, Addr<GithubActor>)],
    pub(super) store: &'a Store,
    pub(super) ledger: Option<Ledger>,
    /// Named marks the store held (where each redelivery pass left off).
    pub(super) marks: &'a HashMap<String, serde_json::Value>,
    pub(super) metrics: &'a Metrics,
}

/// Starts the intake of `config`'s targets.
pub(super) fn start(
    config: &Config,
    targets: &[Target],
    w: IntakeWiring<'_>,
) -> Result<IntakeWing, StartError> {
    let hook = &config.webhook;
    let webhook = WebhookActor::new(
        w.scheduler.clone().recipient(),
        Some(w.store.clone()),
        w.metrics.clone(),
    )
    .with_ledger(w.ledger.clone())
    .with_delivery_window(config.state.retention)
    .with_coverage(
        config
            .providers
            .enabled()
            .iter()
            .map(|p| LabelSet::new(&config.routing_labels(p))),
    );
    let handoff = webhook.handoff();
    let webhook = webhook.start();
    // What tells each target's deliveries apart: the hooks its redelivery pass finds with its
    // own credential (`webhook.hook_id` is everyone's: it names no target by itself) and
    // its App.
    let books: Vec<std::sync::Arc<HookIds>> = targets.iter().map(|_| Arc::default()).collect();
    let redeliver = start_redeliver(config, &w, &webhook, &books);
    let pull = start_pull(config, &w, &webhook);
    let edge = edge(config, targets, &books, &webhook, w.metrics)?;
    Ok(IntakeWing {
        webhook,
        edge: web::Data::new(edge.with_max_body(hook.max_body).with_handoff(handoff)),
        redeliver,
        pull,
    })
}

/// Push mode's redelivery pass, one per target (unless `redeliver = false`).
fn start_redeliver(
    config: &Config,
    w: &IntakeWiring<'_>,
    webhook: &Addr<WebhookActor>,
    books: &[Arc<HookIds>],
) -> Vec<Addr<RedeliverActor>> {
    let hook = &config.webhook;
    let redeliver_on = hook.push() && hook.redeliver != Some(false);
    w.github
        .iter()
        .enumerate()
        .filter(|_| redeliver_on)
        .map(|(i, (name, github))| {
            let mark = mark_of(i, name);
            let place = w.marks.get(&mark).cloned();
            RedeliverActor::new(
                RedeliverSettings {
                    interval: hook.redeliver_interval,
                    hook_id: hook.hook_id,
                    public_url: hook.public_url.clone(),
                    insisted: hook.redeliver == Some(true),
                    max_age: config.runner.claim_retry.max_age,
                    ledger: w.ledger.clone(),
                    mark,
                    learned: books.get(i).cloned(),
                },
                RedeliverWiring {
                    find: github.clone().recipient(),
                    list: github.clone().recipient(),
                    redeliver: github.clone().recipient(),
                    unprocessed: webhook.clone().recipient(),
                    expect: webhook.clone().recipient(),
                },
                Some(w.store.clone()),
                w.metrics.clone(),
                place,
            )
            .start()
        })
        .collect()
}

/// Pull mode's poller, one per target.
fn start_pull(
    config: &Config,
    w: &IntakeWiring<'_>,
    webhook: &Addr<WebhookActor>,
) -> Vec<Addr<PullActor>> {
    let hook = &config.webhook;
    w.github
        .iter()
        .filter(|_| hook.pull())
        .map(|(_, github)| {
            PullActor::new(
                PullSettings {
                    active: hook.poll_interval,
                    idle: hook.poll_idle_interval,
                    budget: hook.poll_budget,
                },
                PullWiring {
                    github: github.clone().recipient(),
                    intake: webhook.clone().recipient(),
                },
                w.metrics.clone(),
            )
            .start()
        })
        .collect()
}

/// The HTTP edge: each target's key (its secret, the hooks its pass found, its App).
fn edge(
    config: &Config,
    targets: &[Target],
    books: &[Arc<HookIds>],
    webhook: &Addr<WebhookActor>,
    metrics: &Metrics,
) -> Result<WebhookIntake, StartError> {
    let hook = &config.webhook;
    // Pull and scale-set modes mount no intake and need no secret; the edge still exists (unmounted) so
    // embedding apps see one shape, keyed with a throwaway secret nobody knows.
    let keyed = |secret: &Secret| {
        if secret.is_empty() && !hook.push() {
            Secret::new(crate::vocab::random_suffix())
        } else {
            secret.clone()
        }
    };
    Ok(if targets.len() > 1 {
        let keys = targets
            .iter()
            .zip(books)
            .map(|(t, book)| {
                let mut key =
                    TargetKey::new(Some(t.github.owner.clone()), keyed(&t.webhook_secret));
                key.hooks = book.clone();
                key.app_id = match &t.github.auth {
                    GithubAuth::App(app) => Some(app.app_id),
                    GithubAuth::Token(_) => None,
                };
                key
            })
            .collect();
        WebhookIntake::for_target_keys(keys, webhook.clone(), metrics.clone())?
    } else {
        WebhookIntake::new(
            keyed(&targets[0].webhook_secret),
            webhook.clone(),
            metrics.clone(),
        )?
    })
}
