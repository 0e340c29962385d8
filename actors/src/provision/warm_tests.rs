//! Warm environments at the supervisor, in paused time with a virtual clock: a time window
//! raises and lowers the count, a claim takes the oldest and one boots in its place, a hold
//! removes them all, and age replaces them. A fake backend boots at once.

use std::{cell::RefCell, rc::Rc, time::Duration};

use actix::Actor;

use super::{warm::*, *};
use crate::{
    clock::Clock,
    config::{
        RestartConfig, WarmConfig,
        warm::{WarmWindow, parse_days},
    },
    metrics::Metrics,
};

#[derive(Debug, Default)]
struct Booted {
    live: Vec<String>,
    started_in: Vec<String>,
    stopped: Vec<String>,
}

#[derive(Debug, Clone, Default)]
struct WarmFake(Rc<RefCell<Booted>>);

impl Backend for WarmFake {
    fn kind(&self) -> ProviderKind {
        ProviderKind::Local
    }
    fn pool(&self) -> &PoolName {
        static LOCAL: std::sync::OnceLock<PoolName> = std::sync::OnceLock::new();
        LOCAL.get_or_init(|| PoolName::new("local"))
    }
    async fn start(self, _spec: RunnerSpec) -> Result<RunningRunner, ProvisionError> {
        Ok(RunningRunner {
            exited: Box::pin(std::future::pending()),
        })
    }
    async fn stop(self, name: String) {
        let mut b = self.0.borrow_mut();
        b.live.retain(|n| *n != name);
        b.stopped.push(name);
    }
    async fn reap_leftovers(self, _keep: Vec<String>) -> Vec<String> {
        Vec::new()
    }
    async fn adopt(self, _name: String) -> Option<RunningRunner> {
        None
    }
    async fn warm_boot(self, name: String) -> Result<(), ProvisionError> {
        self.0.borrow_mut().live.push(name);
        Ok(())
    }
    async fn warm_ready(self, name: String) -> Result<(), &'static str> {
        if self.0.borrow().live.contains(&name) {
            Ok(())
        } else {
            Err("dead")
        }
    }
    async fn warm_start(
        self,
        warm: String,
        spec: RunnerSpec,
    ) -> Result<RunningRunner, ProvisionError> {
        {
            let mut b = self.0.borrow_mut();
            b.live.retain(|n| *n != warm);
            b.started_in.push(warm);
        }
        self.start(spec).await
    }
}

/// Takes the supervisor's reports and drops them.
struct Sink;

impl Actor for Sink {
    type Context = actix::Context<Self>;
}

impl actix::Handler<RunnerEvent> for Sink {
    type Result = ();
    fn handle(&mut self, _: RunnerEvent, _: &mut actix::Context<Self>) {}
}

impl actix::Handler<ProviderStatus> for Sink {
    type Result = ();
    fn handle(&mut self, _: ProviderStatus, _: &mut actix::Context<Self>) {}
}

/// Monday 2026-12-07 07:59:00 UTC.
const MONDAY_0759: u64 = 1_796_628_600 + 29 * 60;

async fn settle() {
    for _ in 0..50 {
        tokio::task::yield_now().await;
    }
}

async fn pass(secs: u64) {
    for _ in 0..secs {
        tokio::time::advance(Duration::from_secs(1)).await;
        settle().await;
    }
}

#[actix_rt::test]
async fn a_window_raises_and_lowers_the_count_claims_take_the_oldest_and_a_hold_removes_all() {
    tokio::time::pause();
    let fake = WarmFake::default();
    let metrics = Metrics::new();
    let config = WarmConfig {
        min: 1,
        windows: vec![WarmWindow {
            days: parse_days("mon-fri").unwrap(),
            from: 8 * 60,
            to: 9 * 60,
            min: 3,
        }],
        time_zone: Some("UTC".into()),
        max_age: Duration::from_secs(2 * 3600),
        ..WarmConfig::default()
    };
    let sink = Sink.start();
    std::mem::forget(sink.clone());
    let sup = ProvisionerSupervisor::new(
        fake.clone(),
        None,
        RestartConfig::default(),
        sink.downgrade().recipient(),
        sink.downgrade().recipient(),
        metrics.clone(),
        Clock::virtual_from(MONDAY_0759),
    )
    .with_warm(Some(WarmSettings {
        config,
        max: 4,
        prefix: "t-local-x".into(),
        report: None,
    }))
    .start();
    let available = || metrics.warm.available.with_label_values(&["local"]).get();
    settle().await;
    pass(1).await;
    assert_eq!(available(), 1, "one warm before the window");

    pass(65).await;
    assert_eq!(available(), 3, "the window (08:00-09:00) keeps three");
    assert_eq!(fake.0.borrow().live.len(), 3);

    // A claim takes the oldest; another boots in its place.
    let oldest = fake.0.borrow().live[0].clone();
    sup.send(Provision::now(RunnerSpec {
        name: "t-local-xrunner1".into(),
        runner_id: 1,
        jit_config: crate::config::Secret::new("jit"),
        intent: crate::job::JobKey::new("acme", 1),
        labels: vec![],
    }))
    .await
    .unwrap();
    pass(1).await;
    assert_eq!(fake.0.borrow().started_in, vec![oldest]);
    assert_eq!(available(), 3, "refilled within the 3 free slots");
    let hits = metrics
        .warm
        .claims
        .with_label_values(&["local", "hit"])
        .get();
    assert_eq!(hits, 1);

    // 09:00: the window closes; back to one (the surplus removed), the running runner apart.
    pass(3600).await;
    assert_eq!(available(), 1, "after the window");
    assert_eq!(fake.0.borrow().live.len(), 1);
    assert!(
        metrics
            .warm
            .discarded
            .with_label_values(&["local", "surplus"])
            .get()
            >= 2
    );

    // Older than warm_max_age (2 h): replaced.
    let before = fake.0.borrow().live.clone();
    pass(2 * 3600).await;
    let after = fake.0.borrow().live.clone();
    assert_eq!(after.len(), 1);
    assert_ne!(before, after, "replaced once too old");
    assert!(
        metrics
            .warm
            .discarded
            .with_label_values(&["local", "age"])
            .get()
            >= 1
    );

    // A hold (a cordon, a drain) removes every warm one and answers once they are gone.
    sup.send(WarmHold(true)).await.unwrap();
    assert_eq!(available(), 0);
    assert!(fake.0.borrow().live.is_empty());
    pass(30).await;
    assert!(fake.0.borrow().live.is_empty(), "no refill while held");
    sup.send(WarmHold(false)).await.unwrap();
    pass(1).await;
    assert_eq!(available(), 1, "resumed");
}
