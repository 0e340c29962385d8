//! Supervision: a provisioner that panics mid-job is torn down, its runners reported, and it is
//! re-created per its restart policy (or left down). Paused time; a fake backend.

use std::{
    cell::RefCell,
    collections::HashMap,
    rc::Rc,
    sync::{Arc, Mutex},
    time::Duration,
};

use actix::{Actor, Addr, Context, Handler};

use super::*;
use crate::{
    clock::Clock,
    config::{RestartConfig, RestartPolicy},
    metrics::Metrics,
};

/// Starts runners that run until `finish(name)`; panics on `start` once `explode` is set;
/// fails a start with `fail_start` when set.
#[derive(Debug, Default)]
struct FakeBackend {
    explode: RefCell<bool>,
    fail_start: RefCell<Option<ProvisionError>>,
    exits: RefCell<HashMap<String, tokio::sync::oneshot::Sender<Option<i32>>>>,
    stopped: RefCell<Vec<String>>,
}

#[derive(Debug, Clone)]
struct Fake(Rc<FakeBackend>);

impl Backend for Fake {
    fn kind(&self) -> ProviderKind {
        ProviderKind::Local
    }

    fn pool(&self) -> &PoolName {
        static LOCAL: std::sync::OnceLock<PoolName> = std::sync::OnceLock::new();
        LOCAL.get_or_init(|| PoolName::new("local"))
    }
    fn start(
        self,
        spec: RunnerSpec,
    ) -> impl Future<Output = Result<RunningRunner, ProvisionError>> {
        assert!(
            !*self.0.explode.borrow(),
            "provisioner blew up (on purpose)"
        );
        let failure = self.0.fail_start.borrow().clone();
        let (tx, rx) = tokio::sync::oneshot::channel();
        if failure.is_none() {
            self.0.exits.borrow_mut().insert(spec.name, tx);
        }
        async move {
            if let Some(error) = failure {
                return Err(error);
            }
            Ok(RunningRunner {
                exited: Box::pin(async move { rx.await.unwrap_or(None) }),
            })
        }
    }
    fn stop(self, name: String) -> impl Future<Output = ()> {
        self.0.stopped.borrow_mut().push(name.clone());
        if let Some(tx) = self.0.exits.borrow_mut().remove(&name) {
            let _ = tx.send(Some(143));
        }
        async {}
    }
    async fn reap_leftovers(self, _keep: Vec<String>) -> Vec<String> {
        Vec::new()
    }
    /// A runner started earlier and not stopped is still there: watched again.
    fn adopt(self, name: String) -> impl Future<Output = Option<RunningRunner>> {
        let mut exits = self.0.exits.borrow_mut();
        let found = exits.contains_key(&name).then(|| {
            let (tx, rx) = tokio::sync::oneshot::channel();
            exits.insert(name, tx);
            RunningRunner {
                exited: Box::pin(async move { rx.await.unwrap_or(None) }),
            }
        });
        async move { found }
    }
}

#[derive(Default)]
struct Seen {
    events: Vec<RunnerEvent>,
    status: Vec<bool>,
}

struct Recorder(Arc<Mutex<Seen>>);

impl Actor for Recorder {
    type Context = Context<Self>;
}

impl Handler<RunnerEvent> for Recorder {
    type Result = ();
    fn handle(&mut self, m: RunnerEvent, _: &mut Context<Self>) {
        self.0.lock().unwrap().events.push(m);
    }
}

impl Handler<ProviderStatus> for Recorder {
    type Result = ();
    fn handle(&mut self, m: ProviderStatus, _: &mut Context<Self>) {
        self.0.lock().unwrap().status.push(m.up);
    }
}

fn spec(name: &str) -> RunnerSpec {
    RunnerSpec {
        name: name.into(),
        runner_id: 1,
        jit_config: crate::config::Secret::new("jit"),
        intent: crate::job::JobKey::new("acme", 1),
        labels: vec![],
    }
}

async fn supervised(
    policy: RestartPolicy,
    max_restarts: u32,
) -> (
    Addr<ProvisionerSupervisor<Fake>>,
    Fake,
    Arc<Mutex<Seen>>,
    Metrics,
) {
    tokio::time::pause();
    let seen = Arc::new(Mutex::new(Seen::default()));
    let recorder = Recorder(seen.clone()).start();
    // The supervisor holds its parent weakly: keep the recorder alive for the whole test.
    std::mem::forget(recorder.clone());
    let fake = Fake(Rc::new(FakeBackend::default()));
    let metrics = Metrics::new();
    let restart = RestartConfig {
        policy,
        max_restarts,
        within: Duration::from_secs(60),
        backoff: Duration::from_secs(1),
    };
    let sup = ProvisionerSupervisor::new(
        fake.clone(),
        None,
        restart,
        recorder.downgrade().recipient(),
        recorder.downgrade().recipient(),
        metrics.clone(),
        Clock::real(),
    )
    .start();
    settle().await;
    (sup, fake, seen, metrics)
}

async fn settle() {
    for _ in 0..20 {
        tokio::task::yield_now().await;
    }
    tokio::time::sleep(Duration::from_millis(10)).await;
    for _ in 0..20 {
        tokio::task::yield_now().await;
    }
}

fn kinds(seen: &Arc<Mutex<Seen>>) -> Vec<(String, RunnerEventKind)> {
    seen.lock()
        .unwrap()
        .events
        .iter()
        .map(|e| (e.name.clone(), e.kind.clone()))
        .collect()
}

/// A provisioner that panics is restarted, and the new one adopts the runners the dead one
/// held: a job half done goes on (its runner is not torn down); a runner whose start died with
/// the provisioner is reported lost.
#[actix_rt::test]
async fn a_panic_mid_job_restarts_and_the_new_provisioner_adopts_its_runners() {
    let (sup, fake, seen, metrics) = supervised(RestartPolicy::Permanent, 5).await;
    sup.send(Provision::now(spec("r-a"))).await.unwrap();
    settle().await;
    assert_eq!(
        kinds(&seen),
        vec![("r-a".to_string(), RunnerEventKind::Started { warm: false })]
    );

    *fake.0.explode.borrow_mut() = true;
    sup.send(Provision::now(spec("r-b"))).await.unwrap();
    settle().await;
    *fake.0.explode.borrow_mut() = false;
    tokio::time::sleep(Duration::from_secs(2)).await;
    settle().await;
    assert_eq!(
        metrics
            .provisioner_restarts
            .with_label_values(&["local"])
            .get(),
        1
    );
    assert_eq!(
        seen.lock().unwrap().status,
        vec![true, false, true],
        "up, down, up again"
    );
    assert!(
        !fake.0.stopped.borrow().contains(&"r-a".to_string()),
        "the running runner was torn down"
    );
    let lost = RunnerEventKind::Exited {
        code: None,
        reason: ExitReason::Lost,
        detail: None,
    };
    let events = kinds(&seen);
    assert!(events.contains(&("r-b".to_string(), lost)), "{events:?}");
    assert!(
        !events
            .iter()
            .any(|(n, k)| n == "r-a" && !matches!(k, RunnerEventKind::Started { .. })),
        "{events:?}"
    );

    // The adopted runner's end is reported by the new provisioner.
    let tx = fake.0.exits.borrow_mut().remove("r-a").unwrap();
    tx.send(Some(0)).unwrap();
    settle().await;
    assert!(
        kinds(&seen)
            .iter()
            .any(|(n, k)| n == "r-a" && matches!(k, RunnerEventKind::Exited { code: Some(0), .. })),
        "{:?}",
        kinds(&seen)
    );
    sup.send(Provision::now(spec("r-c"))).await.unwrap();
    settle().await;
    assert_eq!(
        kinds(&seen).last().unwrap(),
        &("r-c".to_string(), RunnerEventKind::Started { warm: false })
    );
}

#[actix_rt::test]
async fn policy_never_leaves_the_provider_down() {
    let (sup, fake, seen, metrics) = supervised(RestartPolicy::Never, 5).await;
    *fake.0.explode.borrow_mut() = true;
    sup.send(Provision::now(spec("r-a"))).await.unwrap();
    tokio::time::sleep(Duration::from_secs(5)).await;
    settle().await;
    assert_eq!(seen.lock().unwrap().status, vec![true, false]);
    assert_eq!(
        metrics
            .provisioner_restarts
            .with_label_values(&["local"])
            .get(),
        0
    );
    sup.send(Provision::now(spec("r-b"))).await.unwrap();
    settle().await;
    assert!(
        matches!(
            kinds(&seen).last().unwrap().1,
            RunnerEventKind::Failed { .. }
        ),
        "a down provider refuses runners"
    );
}

#[actix_rt::test]
async fn the_restart_budget_is_enforced() {
    let (sup, fake, seen, metrics) = supervised(RestartPolicy::Permanent, 2).await;
    *fake.0.explode.borrow_mut() = true;
    for i in 0..4 {
        sup.send(Provision::now(spec(&format!("r-{i}"))))
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_secs(2)).await;
        settle().await;
    }
    assert_eq!(
        metrics
            .provisioner_restarts
            .with_label_values(&["local"])
            .get(),
        2
    );
    assert_eq!(
        seen.lock().unwrap().status.last(),
        Some(&false),
        "down once the budget is spent"
    );
}

#[actix_rt::test]
async fn teardown_stops_the_runner_and_reports_it() {
    let (sup, fake, seen, _) = supervised(RestartPolicy::Permanent, 5).await;
    sup.send(Provision::now(spec("r-a"))).await.unwrap();
    settle().await;
    sup.send(Teardown {
        name: "r-a".into(),
        reason: "test",
    })
    .await
    .unwrap();
    settle().await;
    assert_eq!(
        kinds(&seen).last().unwrap(),
        &(
            "r-a".to_string(),
            RunnerEventKind::Exited {
                code: Some(143),
                reason: ExitReason::TornDown,
                detail: None,
            }
        )
    );
    assert!(
        fake.0
            .stopped
            .borrow()
            .iter()
            .filter(|n| *n == "r-a")
            .count()
            >= 1
    );
    // Tearing down a runner nobody knows still answers, so no slot leaks.
    sup.send(Teardown {
        name: "ghost".into(),
        reason: "test",
    })
    .await
    .unwrap();
    settle().await;
    assert_eq!(kinds(&seen).last().unwrap().0, "ghost");
}

/// Asks for runner `name` whose record is not committed yet; commit it through the sender.
async fn provision_uncommitted(
    sup: &Addr<ProvisionerSupervisor<Fake>>,
    name: &str,
) -> tokio::sync::oneshot::Sender<Result<(), String>> {
    let (commit, committed) = tokio::sync::oneshot::channel::<Result<(), String>>();
    sup.send(Provision {
        spec: spec(name),
        durable: Durable::after(async move { committed.await.unwrap() }),
    })
    .await
    .unwrap();
    commit
}

/// A runner's environment starts only once the scheduler's record of it is committed: a
/// daemon killed before the commit leaves no runner that a restart would remove as a
/// leftover after it took a job.
#[actix_rt::test]
async fn a_runner_starts_only_after_its_record_is_committed() {
    let (sup, fake, seen, _) = supervised(RestartPolicy::Permanent, 5).await;
    let commit = provision_uncommitted(&sup, "r-a").await;
    settle().await;
    assert!(
        !fake.0.exits.borrow().contains_key("r-a"),
        "started before its record was committed"
    );
    assert!(kinds(&seen).is_empty());

    commit.send(Ok(())).unwrap();
    settle().await;
    assert!(fake.0.exits.borrow().contains_key("r-a"));
    assert_eq!(
        kinds(&seen),
        vec![("r-a".to_string(), RunnerEventKind::Started { warm: false })]
    );
}

/// A runner torn down while it starts (the sweep reaps a spare a moment after its claim) makes
/// its start fail, as the process backend's does when the runner's gate is killed before it
/// opens. That failure is the teardown's doing: reported as the teardown, it leaves the pool
/// up. (Reported as the start's error, a host failure, it took the soak's pool down for 30 s.)
#[actix_rt::test]
async fn a_start_that_fails_because_of_its_teardown_leaves_the_pool_up() {
    let (sup, fake, seen, _) = supervised(RestartPolicy::Permanent, 5).await;
    *fake.0.fail_start.borrow_mut() = Some(ProvisionError::HostUnavailable(
        "cannot let the runner start: Broken pipe (os error 32)".into(),
    ));
    let commit = provision_uncommitted(&sup, "r-a").await;
    settle().await;
    sup.send(Teardown {
        name: "r-a".into(),
        reason: "spare",
    })
    .await
    .unwrap();
    commit.send(Ok(())).unwrap();
    settle().await;
    assert_eq!(
        kinds(&seen),
        vec![(
            "r-a".to_string(),
            RunnerEventKind::Exited {
                code: None,
                reason: ExitReason::TornDown,
                detail: None,
            }
        )]
    );
    assert_eq!(seen.lock().unwrap().status, vec![true], "the pool stayed up");

    // The same failure without a teardown is the host's: the pool goes down.
    sup.send(Provision::now(spec("r-b"))).await.unwrap();
    settle().await;
    assert!(
        matches!(kinds(&seen).last().unwrap().1, RunnerEventKind::Failed { .. }),
        "{:?}",
        kinds(&seen)
    );
    assert_eq!(seen.lock().unwrap().status, vec![true, false]);
}
