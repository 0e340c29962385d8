//! `start`: the library's composition root. It wires every actor of one instance explicitly,
//! one wing at a time, in start order; a host app may call it twice and get two independent
//! instances (nothing is registered globally).
//!
//! 0. The `Store` under `state.dir`, and what the previous run left in it.
//! 1. The GitHub wing ([`github`]): the rate readings and a `GithubActor` per target.
//! 2. The scheduler's context, made first so the pools can be given its address.
//! 3. The pools wing ([`pools`]): the `ReleaseActor` and a supervised provisioner per pool.
//! 4. The `SchedulerActor` and its `RetryActor`, wired to (1) and (3).
//! 5. The intake wing ([`intake`]): the `WebhookActor` forwarding to (4), its HTTP edge, and
//!    the redelivery or pull actors.
//! 6. The scale-set wing ([`scalesets`], scale-set mode): a `ScaleSetListener` per pool.
//! 7. The fleet wing ([`fleet`], fleet mode): the `FleetActor`.
//!
//! Every actor started here is in [`Handles`] and stopped by [`Handles::halt`]; the only task
//! spawned beside them mirrors the store's health and ends when the store closes.

use std::collections::HashMap;

use actix::{Addr, AsyncContext, Context};
use actix_web::web;

mod drain;
mod fleet;
mod github;
mod intake;
mod pools;
mod scalesets;

pub use drain::{AFTER_SHUTDOWN_TIMEOUT, drain, drain_until};

use crate::{
    clock::Clock,
    config::{Config, PoolName},
    github::actor::GithubActor,
    http::Health,
    metrics::Metrics,
    provision::ProvisionerHandle,
    rate::RateActor,
    retry::{Backoff, RetryActor},
    scheduler::{GithubHandle, RateHandle, SchedulerActor, SchedulerDeps, start_in},
    store::{Store, StoreClosed},
    webhook::{WebhookActor, WebhookIntake},
};

/// Why an instance could not start.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StartError {
    /// The actors need a running actix `System` (`#[actix_web::main]`, `actix_rt::System`).
    #[error(
        "system::start must be called inside a running actix System (e.g. under #[actix_web::main])"
    )]
    NoSystem,
    /// The retry ladder is invalid (config validation normally catches this first).
    #[error("claim_retry: {0}")]
    Backoff(#[from] crate::retry::InvalidBackoff),
    /// A provider could not be set up.
    #[error("providers.{provider}: {detail}")]
    Provider {
        /// Which.
        provider: PoolName,
        /// What went wrong.
        detail: String,
    },
    /// The webhook intake refused its settings.
    #[error("webhook: {0}")]
    Intake(#[from] crate::webhook::IntakeError),
    /// The CA bundle for runners could not be written.
    #[error("github.ca_file: cannot write the runners' CA bundle: {detail}")]
    CaBundle {
        /// What went wrong.
        detail: String,
    },
    /// The state store could not be opened.
    #[error("state: {0}")]
    Store(#[from] crate::store::StoreError),
    /// The trace exporter (`[telemetry]`) could not be made.
    #[error("telemetry: {0}")]
    Telemetry(#[from] crate::telemetry::TraceExportError),
}

/// The addresses of one running instance.
#[derive(Debug, Clone)]
pub struct Handles {
    /// The scheduler (job events, cordon, state).
    pub scheduler: Addr<SchedulerActor>,
    /// The retry ladder.
    pub retry: Addr<RetryActor>,
    /// Rate readings.
    pub rate: Addr<RateActor>,
    /// GitHub, as the first target's credential (the only one without `[[github.targets]]`).
    pub github: Addr<GithubActor>,
    /// Every target's GitHub actor, in config order (the first is `github`), with its name.
    pub targets: Vec<(String, Addr<GithubActor>)>,
    /// One supervisor per enabled provider.
    pub provisioners: HashMap<PoolName, ProvisionerHandle>,
    /// The webhook actor (delivery dedup, the durable record of accepted jobs).
    pub webhook: Addr<WebhookActor>,
    /// The webhook intake's HTTP edge, to mount with `WebhookIntake::resource`.
    pub intake: web::Data<WebhookIntake>,
    /// This instance's metrics.
    pub metrics: Metrics,
    /// The credential the rate readings are kept under (the first target's).
    pub credential: String,
    /// Each target's credential key, in target order.
    pub credentials: Vec<String>,
    /// Each target's owner (lowercased) and the web address its jobs are seen at (github.com,
    /// or the GHES host), for the status page's links.
    pub web: Vec<(String, String)>,
    /// Where each pool's egress audit log is (`<state>/egress`), for `GET /api/v1/egress`.
    pub egress_dir: std::path::PathBuf,
    /// This instance's readiness (`/readyz`): set ready once its listeners are up; draining
    /// from the start of a shutdown.
    pub health: web::Data<Health>,
    /// Says when the instance's state store is closed (after [`Handles::shutdown`]).
    pub store_closed: StoreClosed,
    /// Fleet mode: the host's lease and the fleet's event stream.
    pub fleet: Option<Addr<crate::cluster::FleetActor>>,
    /// Fleet mode: the cluster ledger.
    pub ledger: Option<crate::cluster::Ledger>,
    /// Asks GitHub to redeliver failed deliveries (push mode, unless `webhook.redeliver =
    /// false`): one per target.
    pub redeliver: Vec<Addr<crate::webhook::redeliver::RedeliverActor>>,
    /// Pull mode: polls GitHub for what changed, one per target.
    pub pull: Vec<Addr<crate::webhook::pull::PullActor>>,
    /// Scale-set mode: one listener per pool (and target it serves).
    pub scalesets: Vec<Addr<crate::scaleset::ScaleSetListener>>,
    /// Looks at the runner's releases and keeps the managed installs current (when a pool's
    /// runner version can be told, or `runner.release_check_interval` is not `"0s"`).
    pub release: Option<Addr<crate::release::actor::ReleaseActor>>,
    /// The trace exporter (`[telemetry]`), flushed at a shutdown.
    pub(crate) traces: Option<crate::telemetry::TraceExport>,
}

/// The readiness check of the store (the others are core actors).
const STORE_CHECK: &str = "store";
/// The readiness check of the cluster ledger (fleet mode): not a dead actor, a database that
/// did not answer; the host reconnects by itself.
const LEDGER_CHECK: &str = "ledger";

/// Says whether an actor is still running.
type Alive = Box<dyn Fn() -> bool + Send + Sync>;

impl Handles {
    /// The actors an instance cannot work without (a provider's supervisor restarts its own
    /// provisioner; nothing restarts these), each with a liveness check.
    fn core_actors(&self) -> Vec<(String, Alive)> {
        fn alive<A: actix::Actor>(a: &Addr<A>) -> Alive {
            let a = a.clone();
            Box::new(move || a.connected())
        }
        let mut core: Vec<(String, Alive)> = [
            ("scheduler", alive(&self.scheduler)),
            ("retry", alive(&self.retry)),
            ("rate", alive(&self.rate)),
            ("github", alive(&self.github)),
            ("webhook", alive(&self.webhook)),
        ]
        .map(|(name, alive)| (name.to_string(), alive))
        .into();
        for (name, github) in self.targets.iter().skip(1) {
            core.push((format!("github:{name}"), alive(github)));
        }
        for (pool, supervisor) in &self.provisioners {
            let supervisor = supervisor.clone();
            core.push((
                format!("supervisor:{pool}"),
                Box::new(move || supervisor.connected()),
            ));
        }
        core
    }

    /// A core actor that has died (a panic) while the instance is not shutting down: the
    /// instance cannot recover it in place (its state is in the store, not in a sibling), so
    /// `serve` exits 1 and the service manager starts it again from that state.
    pub fn dead_core_actor(&self) -> Option<String> {
        if self.health.is_draining() {
            return None;
        }
        // The readiness checks are the core actors' liveness, and the store's health.
        self.health
            .failing()
            .into_iter()
            .find(|name| name != STORE_CHECK && name != LEDGER_CHECK)
    }

    /// Shuts the instance down, leaving the host app running: `/readyz` answers 503; the
    /// scheduler drains (cordon; job events are still taken so finished runners are torn
    /// down; running jobs get up to `timeout`, then what remains is torn down); then the
    /// intake closes (503, nothing recorded from then on), every actor and its timers stop,
    /// parents before children, and the state store is closed, so the same `state.dir` can be
    /// started again in this process. Returns how many runners had to be torn down.
    pub async fn shutdown(self, timeout: std::time::Duration) -> usize {
        self.shutdown_until(timeout, std::future::pending()).await
    }

    /// Like [`Handles::shutdown`], but the wait for running jobs also ends when `hurry`
    /// resolves (a second SIGTERM): what still runs is torn down at once.
    pub async fn shutdown_until(
        self,
        timeout: std::time::Duration,
        hurry: impl std::future::Future<Output = ()>,
    ) -> usize {
        self.health.set_draining(true);
        let torn_down = drain_until(&self, timeout, hurry).await;
        let _ = self.webhook.send(crate::webhook::Close).await;
        // Fleet mode: the job events and registration changes this host has not written yet
        // reach the ledger before it goes.
        if let Some(ledger) = &self.ledger
            && !ledger.flush(std::time::Duration::from_secs(5)).await
        {
            tracing::warn!(
                "some job events and registration changes never reached the cluster ledger: the other hosts' reconcile finds where those jobs stand"
            );
        }
        // The traces of the jobs the drain finished reach the collector before it goes.
        if let Some(traces) = &self.traces
            && !traces.flush(std::time::Duration::from_secs(5)).await
        {
            tracing::warn!(
                "some job traces were not sent to the OTLP collector before the shutdown"
            );
        }
        if !self.halt().await {
            tracing::warn!("the state store is still open 10 s after the shutdown");
        }
        tracing::info!(torn_down, "instance stopped");
        torn_down
    }

    /// Stops every actor at once, parents first (each stops the children it owns: scheduler
    /// -> retry timer, supervisor -> provisioner), without a drain: runners go on, the store
    /// keeps what it acknowledged. True once the store is closed (waited for up to 10 s).
    /// The end of [`Handles::shutdown`]; alone, what a `kill -9` leaves, for fault tests.
    pub async fn halt(self) -> bool {
        use crate::lifecycle::Stop;
        for redeliver in &self.redeliver {
            let _ = redeliver.send(Stop).await;
        }
        if let Some(release) = &self.release {
            let _ = release.send(Stop).await;
        }
        for pull in &self.pull {
            let _ = pull.send(Stop).await;
        }
        for listener in &self.scalesets {
            let _ = listener.send(Stop).await;
        }
        let _ = self.webhook.send(Stop).await;
        let _ = self.scheduler.send(Stop).await;
        for pool in self.provisioners.values() {
            let _ = pool.stop.send(Stop).await;
        }
        if let Some(fleet) = &self.fleet {
            let _ = fleet.send(Stop).await;
        }
        for (_, github) in &self.targets {
            let _ = github.send(Stop).await;
        }
        let _ = self.rate.send(Stop).await;
        let store_closed = self.store_closed.clone();
        drop(self);
        store_closed.wait(std::time::Duration::from_secs(10)).await
    }
}

/// Options that tests and the demo change; production uses the defaults.
#[derive(Debug, Clone, Default)]
pub struct StartOptions {
    /// Fixes retry jitter.
    pub seed: Option<u64>,
    /// A switch on the state store's disk (fault tests, chaos runs).
    pub store_faults: crate::store::StoreFaults,
    /// The cluster ledger, connected (`Ledger::connect`), for fleet mode (`[cluster]`).
    pub ledger: Option<crate::cluster::Ledger>,
}

/// Starts every actor of one instance on the current actix System.
pub fn start(
    config: &Config,
    metrics: Metrics,
    clock: Clock,
    options: StartOptions,
) -> Result<Handles, StartError> {
    if actix_rt::System::try_current().is_none() {
        return Err(StartError::NoSystem);
    }
    let backoff = Backoff::try_new(&config.runner.claim_retry)?;

    // 0. The durable state a previous run left.
    let (store, snapshot) = Store::open_with(&config.state.dir, options.store_faults.clone())?;
    let install_id = crate::store::install_id(&config.state.dir)?;
    let targets = config.targets();
    let marks = snapshot.marks.clone();
    let traces = crate::telemetry::TraceExport::start(
        &config.telemetry,
        metrics.traces.clone(),
        Some(&config.state.dir),
    )?;

    // 1. GitHub.
    let github = github::start(&targets, &metrics);

    // 2. The scheduler's address, before the scheduler exists.
    let scheduler_ctx = Context::<SchedulerActor>::new();
    let scheduler = scheduler_ctx.address();

    // 3. The pools.
    let reports = pools::PoolReports {
        events: scheduler.downgrade().recipient(),
        status: scheduler.downgrade().recipient(),
        warm: scheduler.downgrade().recipient(),
    };
    let pools = pools::start(
        config,
        &install_id,
        reports,
        &snapshot.runners,
        &metrics,
        clock,
    )?;

    // 4. The scheduler and its retry actor.
    let deps = scheduler_deps(
        config,
        &github,
        &pools,
        &store,
        snapshot,
        options.ledger.clone(),
        traces.clone(),
    );
    let mut settings = crate::scheduler::settings_of(config);
    settings.install_id = install_id.clone();
    let (scheduler, retry) = start_in(
        scheduler_ctx,
        settings,
        backoff,
        deps,
        metrics.clone(),
        clock,
        options.seed,
    );

    edges(
        config,
        &targets,
        Core {
            scheduler,
            retry,
            github,
            pools,
            store,
            marks,
            install_id,
            metrics,
            ledger: options.ledger,
            traces,
        },
    )
}

/// What the scheduler is started with: GitHub's actors and rate book, the pools, the store and
/// the state it restores from, the scale-set record, the fleet ledger.
fn scheduler_deps(
    config: &Config,
    github: &github::GithubWing,
    pools: &pools::PoolsWing,
    store: &Store,
    snapshot: crate::store::Snapshot,
    ledger: Option<crate::cluster::Ledger>,
    traces: Option<crate::telemetry::TraceExport>,
) -> SchedulerDeps {
    SchedulerDeps {
        github: github
            .actors
            .iter()
            .map(|(_, g)| GithubHandle::of(g))
            .collect(),
        rate: Some(RateHandle {
            book: github.book.clone(),
            credentials: github.credentials.clone(),
        }),
        provisioners: pools.provisioners.clone(),
        store: Some(store.clone()),
        restore: Some(snapshot),
        scalesets: config.webhook.scaleset().then(HashMap::new),
        ledger,
        traces,
    }
}

/// What [`start`] made before the edges: the scheduler, GitHub, the pools, the store.
struct Core {
    scheduler: Addr<SchedulerActor>,
    retry: Addr<RetryActor>,
    github: github::GithubWing,
    pools: pools::PoolsWing,
    store: Store,
    marks: HashMap<String, serde_json::Value>,
    install_id: String,
    metrics: Metrics,
    ledger: Option<crate::cluster::Ledger>,
    traces: Option<crate::telemetry::TraceExport>,
}

/// Starts the edges around `core` (the intake, scale-set listeners, fleet mode) and hands
/// everything back as one instance's [`Handles`].
fn edges(
    config: &Config,
    targets: &[crate::config::Target],
    core: Core,
) -> Result<Handles, StartError> {
    // 5. The intake.
    let intake = intake::start(
        config,
        targets,
        intake::IntakeWiring {
            scheduler: &core.scheduler,
            github: &core.github.actors,
            store: &core.store,
            ledger: core.ledger.clone(),
            marks: &core.marks,
            metrics: &core.metrics,
        },
    )?;

    // 6. Scale-set mode: a listener per pool.
    let scalesets = scalesets::start(
        config,
        targets,
        scalesets::ScaleSetWiringIn {
            scheduler: &core.scheduler,
            webhook: &intake.webhook,
            github: &core.github,
            store: &core.store,
            marks: &core.marks,
            install_id: &core.install_id,
            ledger: core.ledger.clone(),
            metrics: &core.metrics,
        },
    );

    // 7. Fleet mode.
    let fleet = core.ledger.clone().map(|ledger| {
        fleet::start(
            ledger,
            config,
            targets,
            &core.install_id,
            &core.scheduler,
            &core.github,
            &core.metrics,
        )
    });
    Ok(handles(config, core, intake, scalesets, fleet))
}

/// One instance's [`Handles`]: its core, its edges, and the store's and core actors'
/// readiness checks.
fn handles(
    config: &Config,
    core: Core,
    intake: intake::IntakeWing,
    scalesets: Vec<Addr<crate::scaleset::ScaleSetListener>>,
    fleet: Option<Addr<crate::cluster::FleetActor>>,
) -> Handles {
    let Core {
        scheduler,
        retry,
        github,
        pools,
        store,
        metrics,
        ledger,
        traces,
        ..
    } = core;
    let health = store_health(&store, &metrics);
    let handles = Handles {
        scheduler,
        retry,
        rate: github.rate,
        github: github.actors[0].1.clone(),
        targets: github.actors,
        provisioners: pools.provisioners,
        webhook: intake.webhook,
        intake: intake.edge,
        metrics,
        credential: github.credentials[0].clone(),
        credentials: github.credentials,
        web: web_urls(config),
        egress_dir: config.state.dir.join("egress"),
        health,
        store_closed: store.closed(),
        fleet,
        ledger,
        redeliver: intake.redeliver,
        pull: intake.pull,
        scalesets,
        release: pools.release,
        traces,
    };
    handles.add_health_checks();
    handles
}

impl Handles {
    /// `/healthz` answers for the core actors and, in fleet mode, the ledger.
    fn add_health_checks(&self) {
        for (name, alive) in self.core_actors() {
            self.health.add_check(name, alive);
        }
        if let Some(ledger) = &self.ledger {
            let up = ledger.health();
            self.health.add_check(LEDGER_CHECK, move || up.is_up());
        }
    }
}

/// The health checks, starting with the store's, and the task that keeps its gauge.
fn store_health(store: &Store, metrics: &Metrics) -> web::Data<Health> {
    let health = web::Data::new(Health::default());
    let store_health = store.health();
    let healthy = store_health.clone();
    health.add_check(STORE_CHECK, move || healthy.is_healthy());
    let gauge = metrics.store_healthy.clone();
    let closed = store.closed();
    crate::tasks::spawn(async move {
        while !closed.is_closed() {
            gauge.set(i64::from(store_health.is_healthy()));
            tokio::time::sleep(std::time::Duration::from_millis(250)).await;
        }
    });
    health
}

/// Each target's owner (lowercase) and the web address its jobs' pages are at.
fn web_urls(config: &Config) -> Vec<(String, String)> {
    config
        .targets()
        .iter()
        .map(|t| {
            (
                t.github.owner.to_ascii_lowercase(),
                crate::github::web_url(&t.github.api_url),
            )
        })
        .collect()
}
