//! `start`: the library's composition root. It wires every actor of one instance explicitly and
//! reads top to bottom in start order; a host app may call it twice and get two independent
//! instances (nothing is registered globally).
//!
//! 0. The `Store` under `state.dir`, and what the previous run left in it.
//! 1. `RateActor`: rate readings, per credential.
//! 2. `GithubActor`: owns the GitHub client, reports every answer's rate headers to (1).
//! 3. The scheduler's context, made first so provisioners can be given its address.
//! 4. One provisioner per enabled provider (`LocalProvisioner`, `LinuxProvisioner`,
//!    `VmMacosProvisioner`, `NativeMacosProvisioner`): each a `ProvisionerSupervisor` that
//!    removes leftovers, checks the host, then runs its provisioner under the provider's
//!    restart policy, reporting to (3).
//! 5. The `SchedulerActor` and its `RetryActor`, wired to (2), (1) and (4).
//! 6. The `WebhookActor` (delivery dedup, durable record of accepted jobs), forwarding to (5),
//!    and the HTTP edge in front of it.

use std::collections::HashMap;

use actix::{Actor, Addr, AsyncContext, Context};
use actix_web::web;

use crate::{
    clock::Clock,
    config::{Config, PoolName, ProviderKind},
    github::{GithubClient, actor::GithubActor},
    http::Health,
    metrics::Metrics,
    provision::{
        LinuxProvisioner, LocalProvisioner, NativeMacosProvisioner, PoolWiring, ProvisionerHandle,
        ProvisionerSupervisor, VmMacosProvisioner,
    },
    rate::RateActor,
    retry::{Backoff, RetryActor},
    scheduler::{
        GithubHandle, RateHandle, SchedulerActor, SchedulerDeps, SchedulerSettings, start_in,
    },
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
    pub provisioners: HashMap<PoolName, Addr<ProvisionerSupervisor>>,
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
    /// Looks at the runner's releases and keeps the managed installs current (when a pool's
    /// runner version can be told, or `runner.release_check_interval` is not `"0s"`).
    pub release: Option<Addr<crate::release::actor::ReleaseActor>>,
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
            core.push((format!("supervisor:{pool}"), alive(supervisor)));
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
        let _ = self.webhook.send(Stop).await;
        let _ = self.scheduler.send(Stop).await;
        for pool in self.provisioners.values() {
            let _ = pool.send(Stop).await;
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
    let store_health = store.health();
    let install_id = crate::store::install_id(&config.state.dir)?;
    let store_closed = store.closed();
    let targets = config.targets();
    let marks = snapshot.marks.clone();

    // 1-2. Rate readings, and a GitHub client per target (its own credential, budget and
    //      App token).
    let rate_book = crate::rate::RateBook::default();
    let rate = RateActor::new(rate_book.clone(), metrics.clone()).start();
    let mut credentials = Vec::with_capacity(targets.len());
    let mut githubs = Vec::with_capacity(targets.len());
    for target in &targets {
        let client = GithubClient::new(
            &target.github,
            metrics.clone(),
            Some(rate.clone().recipient()),
        )
        .for_target(&target.name);
        credentials.push(client.rate_key());
        githubs.push((target.name.clone(), GithubActor::new(client).start()));
    }
    let github = githubs[0].1.clone();
    let rate_key = credentials[0].clone();
    let target_credentials = credentials.clone();

    // 3. The scheduler's address, before the scheduler exists.
    let scheduler_ctx = Context::<SchedulerActor>::new();
    let scheduler = scheduler_ctx.address();

    // 4. A supervised provisioner per enabled provider: LocalProvisioner, LinuxProvisioner,
    //    VmMacosProvisioner, NativeMacosProvisioner.
    // The daemon-managed runner installs (pools with neither runner_dir nor command), filled
    // and kept current by the ReleaseActor.
    let managed = crate::release::installs::ManagedInstalls::for_config(config);
    for pool in config.providers.enabled() {
        metrics.init_runner_version(pool.name.as_str());
    }
    let release = crate::release::actor::ReleaseActor::wanted(config).then(|| {
        crate::release::actor::ReleaseActor::new(config, managed.clone(), metrics.clone()).start()
    });
    let wiring = |pool: &PoolName, restart: &crate::config::RestartConfig| PoolWiring {
        managed: managed.clone(),
        versions: release.as_ref().map(|r| r.downgrade().recipient()),
        restart: restart.clone(),
        job_timeout: config.runner.job_timeout,
        events: scheduler.downgrade().recipient(),
        status: scheduler.downgrade().recipient(),
        metrics: metrics.clone(),
        clock,
        adopt: snapshot
            .runners
            .iter()
            .filter(|r| r.provider == *pool)
            .map(|r| r.name.clone())
            .collect(),
    };
    let log_dir = config.state.dir.join("logs");
    let ca_bundle = crate::provision::runner_env::write_ca_bundle(config)
        .map_err(|detail| StartError::CaBundle { detail })?;
    let mut provisioners = HashMap::new();
    for pool in config.providers.enabled() {
        let name = pool.name.clone();
        let wired = wiring(&name, &pool.common.restart);
        let settings = crate::provision::build::pool_settings(
            config,
            pool,
            &install_id,
            ca_bundle.clone(),
            log_dir.clone(),
        );
        use crate::provision::build::PoolSettings;
        let supervisor = match settings {
            PoolSettings::Process(s) if s.kind == ProviderKind::Local => {
                LocalProvisioner::start(s, wired)
            }
            PoolSettings::Process(s) => NativeMacosProvisioner::start(s, wired),
            PoolSettings::Container(s) => {
                LinuxProvisioner::start(s, wired).map_err(|detail| StartError::Provider {
                    provider: name.clone(),
                    detail,
                })?
            }
            PoolSettings::Tart(s) => VmMacosProvisioner::start(s, wired),
        };
        provisioners.insert(name, supervisor);
    }
    let handles: HashMap<PoolName, ProvisionerHandle> = provisioners
        .iter()
        .map(|(kind, pool)| {
            let handle = ProvisionerHandle {
                provision: pool.clone().recipient(),
                teardown: pool.clone().recipient(),
            };
            (kind.clone(), handle)
        })
        .collect();

    // 5. The scheduler and its retry actor.
    let deps = SchedulerDeps {
        github: githubs.iter().map(|(_, g)| GithubHandle::of(g)).collect(),
        rate: Some(RateHandle {
            book: rate_book,
            credentials,
        }),
        provisioners: handles,
        store: Some(store.clone()),
        restore: Some(snapshot),
        ledger: options.ledger.clone(),
    };
    let mut settings = SchedulerSettings::from_config(config);
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

    // 6. The webhook intake: the actor that owns delivery dedup and the durable record of
    //    accepted jobs, and the HTTP edge in front of it.
    let webhook = WebhookActor::new(
        scheduler.clone().recipient(),
        Some(store.clone()),
        metrics.clone(),
    )
    .with_ledger(options.ledger.clone())
    .with_coverage(
        config
            .providers
            .enabled()
            .iter()
            .map(|p| crate::vocab::LabelSet::new(&p.common.labels)),
    )
    .start();
    // GitHub never redelivers a failed delivery by itself: ask it to, for every target's
    // hook.
    let redeliver_on = !config.webhook.pull() && config.webhook.redeliver != Some(false);
    let redeliver = githubs
        .iter()
        .enumerate()
        .filter(|_| redeliver_on)
        .map(|(i, (name, github))| {
            use crate::webhook::redeliver::{
                RedeliverActor, RedeliverSettings, RedeliverWiring, mark_of,
            };
            let mark = mark_of(i, name);
            let place = marks.get(&mark).cloned();
            RedeliverActor::new(
                RedeliverSettings {
                    interval: config.webhook.redeliver_interval,
                    hook_id: config.webhook.hook_id,
                    public_url: config.webhook.public_url.clone(),
                    insisted: config.webhook.redeliver == Some(true),
                    max_age: config.runner.claim_retry.max_age,
                    ledger: options.ledger.clone(),
                    mark,
                },
                RedeliverWiring {
                    find: github.clone().recipient(),
                    list: github.clone().recipient(),
                    redeliver: github.clone().recipient(),
                    unprocessed: webhook.clone().recipient(),
                    expect: webhook.clone().recipient(),
                },
                Some(store.clone()),
                metrics.clone(),
                place,
            )
            .start()
        })
        .collect();

    // Pull mode: no delivery comes in; each target's polls hand jobs to the same intake actor.
    let pull = githubs
        .iter()
        .filter(|_| config.webhook.pull())
        .map(|(_, github)| {
            use crate::webhook::pull::{PullActor, PullSettings, PullWiring};
            PullActor::new(
                PullSettings {
                    active: config.webhook.poll_interval,
                    idle: config.webhook.poll_idle_interval,
                    budget: config.webhook.poll_budget,
                },
                PullWiring {
                    github: github.clone().recipient(),
                    intake: webhook.clone().recipient(),
                },
                metrics.clone(),
            )
            .start()
        })
        .collect();

    // 7. Fleet mode: the host's lease, the reaping of dead hosts, the fleet's event stream.
    let fleet = options.ledger.clone().map(|ledger| {
        let health = ledger.health();
        let gauge = metrics.ledger_up.clone();
        actix_rt::spawn(async move {
            loop {
                gauge.set(i64::from(health.is_up()));
                tokio::time::sleep(std::time::Duration::from_millis(250)).await;
            }
        });
        crate::cluster::FleetActor::new(
            ledger,
            crate::cluster::actor::FleetWiring {
                events: scheduler.clone().recipient(),
                load: scheduler.clone().recipient(),
                targets: targets
                    .iter()
                    .zip(&githubs)
                    .map(|(t, (_, github))| crate::cluster::actor::FleetTarget {
                        owner: t.github.owner.to_ascii_lowercase(),
                        delete: github.clone().recipient(),
                        list: github.clone().recipient(),
                        scopes: crate::scheduler::TargetSpec::of(t).scopes(),
                    })
                    .collect(),
                identity: crate::cluster::RunnerIdentity {
                    name_prefix: config.runner.name_prefix.clone(),
                    install_id: install_id.clone(),
                },
                rate: Some((rate.clone().recipient(), target_credentials.clone())),
            },
        )
        .start()
    });
    // Pull mode mounts no intake and needs no secret; the edge still exists (unmounted) so
    // embedding apps see one shape, keyed with a throwaway secret nobody knows.
    let keyed = |secret: &crate::config::Secret| {
        if secret.is_empty() && config.webhook.pull() {
            crate::config::Secret::new(crate::vocab::random_suffix())
        } else {
            secret.clone()
        }
    };
    let edge = if targets.len() > 1 {
        let keys = targets
            .iter()
            .map(|t| (t.github.owner.clone(), keyed(&t.webhook_secret)));
        WebhookIntake::for_targets(keys, webhook.clone(), metrics.clone())?
    } else {
        WebhookIntake::new(
            keyed(&targets[0].webhook_secret),
            webhook.clone(),
            metrics.clone(),
        )?
    };
    let intake = web::Data::new(edge.with_max_body(config.webhook.max_body));

    let health = web::Data::new(Health::default());
    let healthy = store_health.clone();
    health.add_check(STORE_CHECK, move || healthy.is_healthy());
    let gauge = metrics.store_healthy.clone();
    let closed = store_closed.clone();
    actix_rt::spawn(async move {
        while !closed.is_closed() {
            gauge.set(i64::from(store_health.is_healthy()));
            tokio::time::sleep(std::time::Duration::from_millis(250)).await;
        }
    });
    let handles = Handles {
        scheduler,
        retry,
        rate,
        github,
        targets: githubs,
        provisioners,
        webhook,
        intake,
        metrics,
        credential: rate_key,
        credentials: target_credentials,
        health,
        store_closed,
        fleet,
        ledger: options.ledger,
        redeliver,
        pull,
        release,
    };
    for (name, alive) in handles.core_actors() {
        handles.health.add_check(name, alive);
    }
    if let Some(ledger) = &handles.ledger {
        let up = ledger.health();
        handles.health.add_check(LEDGER_CHECK, move || up.is_up());
    }
    Ok(handles)
}

/// What a stop may take after `shutdown_timeout` at most: the teardown of what still runs (a
/// 60 s cap), GitHub calls in flight (30 s), the store's close (10 s), and some slack. A
/// service manager's stop window is `shutdown_timeout` plus this.
pub const AFTER_SHUTDOWN_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(120);

/// Drains an instance: cordon (no new claims, no new retries; job events keep being handled),
/// wait up to `timeout` for every runner to finish, then tear down and delete what remains.
/// Returns how many runners had to be torn down.
pub async fn drain(handles: &Handles, timeout: std::time::Duration) -> usize {
    drain_until(handles, timeout, std::future::pending()).await
}

/// Like [`drain`], but the wait for running jobs also ends when `hurry` resolves.
pub async fn drain_until(
    handles: &Handles,
    timeout: std::time::Duration,
    hurry: impl std::future::Future<Output = ()>,
) -> usize {
    use crate::scheduler::messages::{
        BeginShutdown, CallsInFlight, FlushDeferred, GetStatus, TeardownAll,
    };
    const POLL: std::time::Duration = std::time::Duration::from_millis(200);
    let runners = || async {
        handles
            .scheduler
            .send(GetStatus)
            .await
            .map(|s| s.runners)
            .unwrap_or(0)
    };
    // Claims, deletions and busy checks already sent get their answers before the actors
    // stop: a claim answered after it would leave a registration nobody runs.
    let calls = || async { handles.scheduler.send(CallsInFlight).await.unwrap_or(0) };
    let settle = || async {
        let until = tokio::time::Instant::now() + std::time::Duration::from_secs(30);
        while calls().await > 0 && tokio::time::Instant::now() < until {
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    };
    let _ = handles.scheduler.send(BeginShutdown).await;
    let deadline = tokio::time::Instant::now() + timeout;
    settle().await;
    let mut left = runners().await;
    tracing::info!(runners = left, timeout = ?timeout, "draining: waiting for running jobs");
    tokio::pin!(hurry);
    let mut hurried = false;
    while left > 0 && tokio::time::Instant::now() < deadline && !hurried {
        tokio::select! {
            () = tokio::time::sleep(POLL) => {}
            () = &mut hurry => {
                hurried = true;
                tracing::warn!(runners = left, "asked again to stop: tearing down the running jobs now");
            }
        }
        left = runners().await;
    }
    if left == 0 {
        let _ = handles.scheduler.send(FlushDeferred).await;
        settle().await;
        return 0;
    }
    if !hurried {
        tracing::warn!(
            runners = left,
            "shutdown_timeout reached; tearing down what remains"
        );
    }
    let _ = handles.scheduler.send(TeardownAll).await;
    // Teardown itself is bounded by the provisioners' kill grace; give it that long and more.
    let teardown_deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(60);
    while runners().await > 0 && tokio::time::Instant::now() < teardown_deadline {
        tokio::time::sleep(POLL).await;
    }
    let _ = handles.scheduler.send(FlushDeferred).await;
    settle().await;
    left
}
