//! The embedding example (`examples/embed/src/main.rs`, included here as it is) in a host app: an
//! instance runs a job, shuts down while the host keeps serving (no actor left running, no
//! GitHub call afterwards, a delivery answered 503), and a second instance on the same state
//! dir in the same process runs a job.

use std::time::Duration;

use actix_web::{App, HttpServer, web};
use ephemer_actors_core::{
    config::{Config, Environment},
    system::Handles,
};
use github_standin::Standin;

use crate::support::{
    daemon::{SECRET, config as daemon_config, free_port, local_provider},
    http_get,
    provision::eventually,
};

#[allow(dead_code)]
#[path = "../../examples/embed/src/main.rs"]
mod example;

const LABELS: &[&str] = &["self-hosted", "linux"];

/// An instance against `standin`, reconciling every second, with a local pool.
pub(crate) fn config(standin: &Standin, state: &std::path::Path) -> Config {
    let port = free_port();
    let text = daemon_config(standin, port, state, "1s", "", &local_provider(2));
    Config::from_toml_str(&text, None, &Environment::default()).unwrap()
}

/// Serves the host app (its own `/hello`, the instance under `scope`) on a free port.
pub(crate) fn host(
    handles: &Handles,
    scope: &'static str,
) -> (String, actix_web::dev::ServerHandle) {
    let port = free_port();
    let instance = handles.clone();
    let server = HttpServer::new(move || {
        App::new()
            .route("/hello", web::get().to(example::hello))
            .configure(|cfg| example::mount(cfg, scope, &instance, "/webhook/github"))
    })
    .workers(1)
    .disable_signals()
    .bind(("127.0.0.1", port))
    .unwrap()
    .run();
    let handle = server.handle();
    actix_rt::spawn(server);
    (format!("127.0.0.1:{port}"), handle)
}

/// An instance of `config` with this switch on its store's disk, served by a host app under
/// `/ci` that `standin` delivers to: its handles and the host's address.
pub(crate) fn instance(
    standin: &Standin,
    config: &Config,
    faults: ephemer_actors_core::store::StoreFaults,
) -> (Handles, String) {
    use ephemer_actors_core::{clock::Clock, metrics::Metrics, system};
    let handles = system::start(
        config,
        Metrics::new(),
        Clock::real(),
        system::StartOptions {
            store_faults: faults,
            ..system::StartOptions::default()
        },
    )
    .unwrap();
    handles.health.set_ready();
    let (addr, _server) = host(&handles, "/ci");
    standin.send_webhooks_to(&format!("http://{addr}/ci/webhook/github"), SECRET);
    (handles, addr)
}

/// An actor's name and whether it is still running (asked through a weak address).
type Watched = (&'static str, Box<dyn Fn() -> bool>);

/// The actors still running.
fn alive(weak: &[Watched]) -> Vec<&'static str> {
    weak.iter()
        .filter(|(_, connected)| connected())
        .map(|(name, _)| *name)
        .collect()
}

/// Every watched actor runs (a redelivery actor with no hook to watch stops by itself).
fn assert_all_running(actors: &[Watched]) {
    let running = alive(actors);
    assert!(
        actors
            .iter()
            .all(|(name, _)| *name == "RedeliverActor" || running.contains(name)),
        "{running:?}"
    );
}

/// Every actor of the instance, held weakly.
fn watch(handles: &Handles) -> Vec<Watched> {
    fn w<A: actix::Actor>(name: &'static str, a: &actix::Addr<A>) -> Watched {
        let weak = a.downgrade();
        (
            name,
            Box::new(move || weak.upgrade().is_some_and(|a| a.connected())),
        )
    }
    let mut v = vec![
        w("SchedulerActor", &handles.scheduler),
        w("RetryActor", &handles.retry),
        w("RateActor", &handles.rate),
        w("GithubActor", &handles.github),
        w("WebhookActor", &handles.webhook),
    ];
    for pool in handles.provisioners.values() {
        let weak = pool.stop.downgrade();
        v.push((
            "LocalProvisioner",
            Box::new(move || weak.upgrade().is_some_and(|p| p.connected())),
        ));
    }
    v.extend(handles.redeliver.iter().map(|a| w("RedeliverActor", a)));
    v.extend(handles.pull.iter().map(|a| w("PullActor", a)));
    v.extend(handles.release.iter().map(|a| w("ReleaseActor", a)));
    v.extend(handles.fleet.iter().map(|a| w("FleetActor", a)));
    v
}

#[actix_rt::test]
async fn an_embedded_instance_runs_a_job_shuts_down_and_starts_again_on_the_same_state() {
    let standin = crate::support::standin(100);
    let state = tempfile::tempdir().unwrap();
    let config = config(&standin, state.path());

    let handles = example::start_instance(&config).unwrap();
    let (addr, server) = host(&handles, "/ci");
    standin.send_webhooks_to(&format!("http://{addr}/ci/webhook/github"), SECRET);
    assert_eq!(http_get(&addr, "/ci/readyz").await.map(|r| r.0), Some(200));
    standin.queue_jobs("app", LABELS, 1);
    eventually("the job to complete", Duration::from_secs(30), || {
        standin.jobs_in("completed") == 1
    })
    .await;

    // Observed in code, through the embedding API alone.
    let seen = example::observe(&handles).await;
    assert!(
        seen.starts_with("1 pools, 0 jobs waiting") && seen.ends_with("1 claims so far"),
        "{seen}"
    );

    let actors = watch(&handles);
    assert_all_running(&actors);
    handles.shutdown(Duration::from_secs(20)).await;
    assert!(
        alive(&actors).is_empty(),
        "alive after shutdown: {:?}",
        alive(&actors)
    );
    assert_eq!(
        http_get(&addr, "/hello").await.map(|r| r.0),
        Some(200),
        "the host keeps serving"
    );
    assert_eq!(http_get(&addr, "/ci/readyz").await.map(|r| r.0), Some(503));

    // No GitHub call after the shutdown, though the reconcile ran every second before it.
    let calls = standin.calls().len();
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert_eq!(
        standin.calls().len(),
        calls,
        "GitHub calls after the shutdown"
    );

    // A queued delivery to the stopped instance is refused, so GitHub keeps it.
    standin.queue_jobs("app", LABELS, 1);
    eventually(
        "the delivery to be answered",
        Duration::from_secs(10),
        || {
            standin
                .deliveries()
                .iter()
                .any(|d| d.action == "queued" && d.status != 0 && d.status != 202)
        },
    )
    .await;
    let refused: Vec<u16> = standin
        .deliveries()
        .iter()
        .filter(|d| d.action == "queued")
        .map(|d| d.status)
        .collect();
    assert_eq!(refused, vec![202, 503]);
    assert_eq!(standin.calls().len(), calls);
    server.stop(true).await;

    // A second instance on the same state dir, in the same process: the store was closed.
    // Its start-up reconcile finds the job the stopped instance refused, and runs it.
    let again = example::start_instance(&config).expect("the same state dir starts again");
    let (addr, server) = host(&again, "/ci");
    standin.send_webhooks_to(&format!("http://{addr}/ci/webhook/github"), SECRET);
    eventually(
        "the second job to complete",
        Duration::from_secs(30),
        || standin.jobs_in("completed") == 2,
    )
    .await;
    again.shutdown(Duration::from_secs(20)).await;
    server.stop(true).await;
    assert!(standin.runners().is_empty(), "{:?}", standin.runners());
}

/// Outside an actix System, `start` says so instead of panicking, and creates nothing.
#[test]
fn start_outside_an_actix_system_is_an_error() {
    let state = tempfile::tempdir().unwrap();
    let dir = state.path().join("state");
    let text = format!(
        "[github]\nowner = \"acme\"\ntoken = \"t\"\n[webhook]\nsecret = \"s\"\n[state]\ndir = \"{}\"\n[providers.local]\ncommand = \"/bin/true\"\nallow_same_user = true\n",
        dir.display()
    );
    let config = Config::from_toml_str(&text, None, &Environment::default()).unwrap();
    let err = example::start_instance(&config).unwrap_err();
    assert_eq!(err, ephemer_actors_core::system::StartError::NoSystem);
    assert!(!dir.exists(), "nothing created");
}

/// Fleet mode: an embedded instance with a ledger runs a job, and `Handles::shutdown` leaves
/// nothing running. Every actor (the fleet actor, the redelivery and release actors too) is
/// gone when asked through a weak address, and no task keeps writing the gauges the instance
/// mirrored: set to a sentinel after the shutdown, `ephemerd_ledger_up` and
/// `ephemerd_store_healthy` keep it (a task left looping would overwrite it within 250 ms).
#[actix_rt::test]
async fn a_fleet_instance_shuts_down_with_no_actor_or_task_left_running() {
    use ephemer_actors_core::{clock::Clock, cluster::Ledger, metrics::Metrics, system};
    let Some(pg) = crate::support::postgres::Postgres::start() else {
        return;
    };
    let standin = crate::support::standin(100);
    let state = tempfile::tempdir().unwrap();
    let extra = crate::cluster::extra(&pg, "h1", "30s", "");
    let text = daemon_config(
        &standin,
        free_port(),
        state.path(),
        "1s",
        &extra,
        &local_provider(2),
    );
    let config = Config::from_toml_str(&text, None, &Environment::default()).unwrap();
    let cluster = config.cluster.as_ref().unwrap();
    let ledger = Ledger::connect(cluster, &config, Duration::from_secs(30))
        .await
        .unwrap();
    ledger.take_lease().await.unwrap();
    let options = system::StartOptions {
        ledger: Some(ledger),
        ..system::StartOptions::default()
    };
    let handles = system::start(&config, Metrics::new(), Clock::real(), options).unwrap();
    handles.health.set_ready();
    let (addr, server) = host(&handles, "/ci");
    standin.send_webhooks_to(&format!("http://{addr}/ci/webhook/github"), SECRET);
    standin.queue_jobs("app", &["self-hosted", "linux", "x64"], 1);
    eventually("the job to complete", Duration::from_secs(30), || {
        standin.jobs_in("completed") == 1
    })
    .await;

    let actors = watch(&handles);
    assert!(
        actors.iter().any(|(name, _)| *name == "FleetActor"),
        "fleet mode starts a fleet actor"
    );
    assert_all_running(&actors);
    let metrics = handles.metrics.clone();
    handles.shutdown(Duration::from_secs(20)).await;
    assert!(
        alive(&actors).is_empty(),
        "alive after shutdown: {:?}",
        alive(&actors)
    );
    metrics.ledger_up.set(7);
    metrics.store_healthy.set(7);
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        (metrics.ledger_up.get(), metrics.store_healthy.get()),
        (7, 7),
        "a task still writes the gauges after the shutdown"
    );
    server.stop(true).await;
}
