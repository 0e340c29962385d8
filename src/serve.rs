//! `serve`: the daemon's composition root. It reads top to bottom in start order.
//!
//! 1. the actix `System` and the shared values (metrics, health);
//! 2. the state directory;
//! 3. in fleet mode, the cluster ledger (connected, schema migrated); then the actors, through
//!    the library's `system::start` (rate, GitHub, provisioners under their supervisors,
//!    scheduler and retry, webhook intake, and the fleet actor);
//! 4. the HTTP listeners: webhook (intake, `/healthz`, `/readyz`, and `/metrics` unless it has
//!    a listener of its own) and metrics;
//! 5. ready; wait for SIGTERM or SIGINT;
//! 6. drain: cordon, wait for running jobs up to `shutdown_timeout`, tear down what remains;
//! 7. stop the listeners, return (exit 0).

use std::time::Duration;

use actix_web::{App, HttpServer, dev::ServerHandle, web};
use anyhow::Context;
use ephemer_actors_core::{
    admin::{self, Admin, access::Access},
    clock::Clock,
    config::{AdminListen, Config},
    http::{Health, configure_metrics},
    metrics::Metrics,
    system::{self, Handles, StartOptions},
    webhook::WebhookIntake,
};
use tokio::signal::unix::{SignalKind, signal};

/// How long `serve` waits for the cluster ledger at start before exiting 1 (the service
/// manager starts it again).
const LEDGER_PATIENCE: Duration = Duration::from_secs(30);

/// How long the HTTP listeners wait for in-flight requests when stopping.
const HTTP_SHUTDOWN: Duration = Duration::from_secs(2);
/// Connections the webhook listener holds open at most (GitHub opens few; a flood is refused).
const WEBHOOK_MAX_CONNECTIONS: usize = 1024;
/// The webhook listener's workers: one. Every delivery meets the others in the intake's one
/// lock (the delivery ids it has seen) and on the scheduler's one thread, so a second worker
/// adds no capacity a CI host needs (one verifies some 50,000 signed deliveries a second on
/// the 2-core bench machine) and costs each delivery the traffic between two cores: 18 µs of
/// CPU a delivery on one worker against 22 µs on two, measured (docs/benchmarks.md, "Intake,
/// measured from outside"). The host's other cores are left to its runners; a body over 64 KiB
/// is hashed one at a time either way (`webhook/gate.rs`).
const WEBHOOK_WORKERS: usize = 1;

/// Runs the daemon on a fresh actix `System` until a shutdown signal.
pub fn run(config: Config) -> anyhow::Result<()> {
    actix_rt::System::new().block_on(serve(config))
}

/// The listeners of one instance, bound and running.
pub struct Listeners {
    /// Where the webhook listener is bound (useful when configured with port 0).
    pub webhook: std::net::SocketAddr,
    /// Where the admin API is bound.
    pub admin: AdminListen,
    handles: Vec<ServerHandle>,
}

impl Listeners {
    /// Stops every listener gracefully.
    pub async fn stop(self) {
        for h in self.handles {
            h.stop(true).await;
        }
    }
}

/// Binds the webhook and metrics listeners of an instance.
pub fn listen(config: &Config, handles: &Handles) -> anyhow::Result<Listeners> {
    let health = handles.health.clone();
    let metrics = web::Data::new(handles.metrics.clone());
    let intake = handles.intake.clone();
    let path = config.webhook.path.clone();
    let metrics_on_webhook = config.metrics.listen.is_none();
    // Pull and scale-set modes take no delivery: the listener serves health (and metrics) only.
    let push = config.webhook.push();
    let webhook = {
        let (metrics, health) = (metrics.clone(), health.clone());
        HttpServer::new(move || {
            let app = App::new()
                .app_data(health.clone())
                .app_data(metrics.clone())
                .configure(Health::configure)
                .configure(|cfg| {
                    if push {
                        cfg.service(WebhookIntake::resource(intake.clone(), &path));
                    }
                });
            if metrics_on_webhook {
                app.configure(configure_metrics)
            } else {
                app
            }
        })
        .disable_signals()
        .shutdown_timeout(HTTP_SHUTDOWN.as_secs())
        .workers(WEBHOOK_WORKERS)
        // Bounds on what one peer can hold open: connections (per worker, of which there is
        // one), and the time a request's headers may take (its body has the intake's own
        // timeout).
        .max_connections(WEBHOOK_MAX_CONNECTIONS)
        .client_request_timeout(std::time::Duration::from_secs(5))
        .bind(config.webhook.listen)
        .with_context(|| format!("cannot bind webhook.listen {}", config.webhook.listen))?
    };
    let webhook_addr = webhook.addrs()[0];
    let mut servers = vec![webhook.run()];
    let token = admin::access::load_or_create(&config.state.dir).with_context(|| {
        format!(
            "cannot read or create the admin token in {}",
            config.state.dir.display()
        )
    })?;
    let admin = web::Data::new(Admin::new(handles).with_access(Access::new(token)));
    let access = admin.access().clone();
    let admin_server = HttpServer::new(move || {
        App::new()
            .app_data(admin.clone())
            .configure(Admin::configure)
    })
    .workers(1)
    .disable_signals()
    .shutdown_timeout(HTTP_SHUTDOWN.as_secs());
    let bind_error = || format!("cannot bind admin.listen {}", config.admin.listen);
    let (admin_server, admin_addr) = match &config.admin.listen {
        AdminListen::Tcp(addr) => {
            let server = admin_server.bind(addr).with_context(bind_error)?;
            let bound = server.addrs()[0];
            access.listening_on(bound);
            (server, AdminListen::Tcp(bound))
        }
        AdminListen::Unix(path) => {
            // A socket left by an earlier run would refuse the bind.
            let _ = std::fs::remove_file(path);
            let server = admin_server.bind_uds(path).with_context(bind_error)?;
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
                .with_context(|| format!("cannot make {} private", path.display()))?;
            access.listening_on_socket();
            (server, AdminListen::Unix(path.clone()))
        }
    };
    servers.push(admin_server.run());
    if let Some(listen) = config.metrics.listen {
        let server = HttpServer::new(move || {
            App::new()
                .app_data(metrics.clone())
                .configure(configure_metrics)
        })
        .workers(1)
        .disable_signals()
        .shutdown_timeout(HTTP_SHUTDOWN.as_secs())
        .bind(listen)
        .with_context(|| format!("cannot bind metrics.listen {listen}"))?
        .run();
        servers.push(server);
    }
    let handles = servers.iter().map(|s| s.handle()).collect();
    for server in servers {
        actix_rt::spawn(server);
    }
    Ok(Listeners {
        webhook: webhook_addr,
        admin: admin_addr,
        handles,
    })
}

async fn serve(config: Config) -> anyhow::Result<()> {
    // From the first moment: a SIGTERM during start-up is kept and drains right after it.
    let mut signals = Signals::new()?;
    for warning in ephemer_actors_core::harden::harden_process()
        .into_iter()
        .chain(config.warnings())
    {
        tracing::warn!("{warning}");
    }
    let metrics = Metrics::for_config(&config);
    metrics.set_build_info(env!("CARGO_PKG_VERSION"), env!("EPHEMER_COMMIT"));

    std::fs::create_dir_all(&config.state.dir)
        .with_context(|| format!("cannot create state.dir {}", config.state.dir.display()))?;

    // Fleet mode: the shared ledger, connected and migrated before anything is accepted.
    let ledger = match &config.cluster {
        Some(cluster) => {
            let ledger =
                ephemer_actors_core::cluster::Ledger::connect(cluster, &config, LEDGER_PATIENCE)
                    .await
                    .context("cannot use the cluster ledger (cluster.url)")?;
            ledger
                .take_lease()
                .await
                .context("cannot take this host's lease in the cluster ledger")?;
            Some(ledger)
        }
        None => None,
    };
    let options = StartOptions {
        ledger,
        ..StartOptions::default()
    };
    let handles = system::start(&config, metrics, Clock::real(), options)
        .context("cannot start the actors")?;
    // A runner group named in the config is resolved before anything is accepted: a name the
    // org does not have would fail every claim. A GitHub that cannot be reached now is asked
    // again at the first claim.
    for (target, (_, github)) in config.targets().iter().zip(&handles.targets) {
        let Some(name) = &target.github.runner_group else {
            continue;
        };
        use ephemer_actors_core::github::{GithubError, actor::ResolveRunnerGroup};
        match github.send(ResolveRunnerGroup).await {
            Ok(Ok(id)) => {
                tracing::info!(target = %target.name, group = %name, id, "runners register in this runner group")
            }
            Ok(Err(e @ GithubError::NoRunnerGroup { .. })) => {
                handles.clone().halt().await;
                anyhow::bail!("{e}");
            }
            Ok(Err(e)) => {
                tracing::warn!(target = %target.name, group = %name, error = %e, "cannot look up the runner group now; the first claim will")
            }
            Err(e) => anyhow::bail!("the GitHub actor is gone: {e}"),
        }
    }
    let listeners = match listen(&config, &handles) {
        Ok(listeners) => listeners,
        Err(e) => {
            // A listener that cannot bind stops the start: the actors go first, inside the
            // runtime (dropped after it, their timers would panic on the way out).
            handles.shutdown(Duration::from_secs(0)).await;
            return Err(e);
        }
    };

    handles.health.set_ready();
    let notifier = std::rc::Rc::new(crate::notify::Notifier::from_env());
    notifier.send("READY=1\nSTATUS=serving");
    if let Some(interval) = crate::notify::Notifier::watchdog() {
        let (notifier, handles) = (notifier.clone(), handles.clone());
        actix_rt::spawn(async move {
            // A daemon whose core actor died stops feeding the watchdog (and exits anyway).
            while handles.dead_core_actor().is_none() {
                notifier.send("WATCHDOG=1");
                tokio::time::sleep(interval / 2).await;
            }
        });
    }
    tracing::info!(
        webhook = %listeners.webhook,
        admin = %listeners.admin,
        path = %config.webhook.path,
        mode = config.webhook.mode.as_str(),
        providers = ?config.providers.enabled().iter().map(|p| p.name.as_str()).collect::<Vec<_>>(),
        version = env!("CARGO_PKG_VERSION"),
        "ephemer-actors serving"
    );

    let signal_name = tokio::select! {
        signal = signals.next() => signal,
        actor = dead_core_actor(&handles) => {
            // Never a daemon that answers 503 forever while its service manager thinks it
            // runs: exit, and let the restart pick the state up from the store (runners
            // still running are adopted).
            tracing::error!(actor, "a core actor died; exiting 1 so the service manager starts the daemon again from its durable state");
            std::process::exit(1);
        }
    };
    tracing::info!(
        signal = signal_name,
        "shutdown signal received; draining (a second one tears the running jobs down at once)"
    );
    let hurry = async move {
        let again = signals.next().await;
        tracing::warn!(signal = again, "second shutdown signal");
    };
    notifier.send("STOPPING=1\nSTATUS=draining");
    let progress = actix_rt::spawn(drain_progress(notifier.clone(), handles.clone()));
    let torn_down = handles
        .shutdown_until(config.runner.shutdown_timeout, hurry)
        .await;
    progress.abort();
    notifier.send(&format!("STATUS=stopped; {torn_down} runners torn down"));
    listeners.stop().await;
    tracing::info!(torn_down, "stopped cleanly");
    Ok(())
}

/// How often a drain tells the service manager how far it is.
const DRAIN_TICK: Duration = Duration::from_secs(5);

/// While a drain runs: a `STATUS=` line with the runners left, and more stop time (three
/// ticks' worth, renewed every tick), so a drain of any length never meets the unit's
/// `TimeoutStopSec` while it makes progress, and a hung one does, three ticks after it hung.
async fn drain_progress(notifier: std::rc::Rc<crate::notify::Notifier>, handles: Handles) {
    use ephemer_actors_core::scheduler::messages::GetStatus;
    if !notifier.enabled() {
        return;
    }
    loop {
        let left = match handles.scheduler.send(GetStatus).await {
            Ok(status) => status.runners,
            Err(_) => 0,
        };
        notifier.send(&format!(
            "STATUS=draining: {left} runners still running\nEXTEND_TIMEOUT_USEC={}",
            (DRAIN_TICK * 3).as_micros()
        ));
        tokio::time::sleep(DRAIN_TICK).await;
    }
}

/// How often `serve` looks for a dead core actor.
const WATCHDOG_EVERY: Duration = Duration::from_millis(250);

/// Resolves with the name of the first core actor found dead.
async fn dead_core_actor(handles: &Handles) -> String {
    loop {
        if let Some(name) = handles.dead_core_actor() {
            return name;
        }
        tokio::time::sleep(WATCHDOG_EVERY).await;
    }
}

/// SIGTERM and SIGINT, listened for from the start of `serve`.
struct Signals {
    term: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
}

impl Signals {
    fn new() -> anyhow::Result<Self> {
        Ok(Signals {
            term: signal(SignalKind::terminate()).context("cannot listen for SIGTERM")?,
            int: signal(SignalKind::interrupt()).context("cannot listen for SIGINT")?,
        })
    }

    /// The name of the next SIGTERM or SIGINT.
    async fn next(&mut self) -> &'static str {
        tokio::select! {
            _ = self.term.recv() => "SIGTERM",
            _ = self.int.recv() => "SIGINT",
        }
    }
}
