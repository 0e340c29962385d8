//! Running one provisioner under its supervisor, outside the daemon, and watching its events.

use std::{
    sync::{Arc, Mutex},
    time::Duration,
};

use actix::{Actor, Addr, Context, Handler};
use ephemer_actors_core::{
    clock::Clock,
    config::{GithubAuth, GithubConfig, RestartConfig, Secret},
    github::{GithubClient, JitRunner},
    job::JobKey,
    metrics::Metrics,
    provision::{
        Backend, ExitReason, ProviderStatus, ProvisionerSupervisor, RunnerEvent, RunnerEventKind,
        RunnerSpec,
    },
};
use github_standin::Standin;

/// Every event a provisioner reported.
#[derive(Debug, Default, Clone)]
pub struct Events(pub Arc<Mutex<Vec<RunnerEvent>>>);

impl Events {
    /// Waits (real time) until an event for `name` matches `pred`.
    pub async fn wait_for(
        &self,
        name: &str,
        within: Duration,
        pred: impl Fn(&RunnerEventKind) -> bool,
    ) -> RunnerEventKind {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            if let Some(e) = self
                .0
                .lock()
                .unwrap()
                .iter()
                .find(|e| e.name == name && pred(&e.kind))
            {
                return e.kind.clone();
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "no matching event for {name}: {:?}",
                self.0.lock().unwrap()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

struct Recorder(Events);

impl Actor for Recorder {
    type Context = Context<Self>;
}

impl Handler<RunnerEvent> for Recorder {
    type Result = ();
    fn handle(&mut self, m: RunnerEvent, _: &mut Context<Self>) {
        (self.0).0.lock().unwrap().push(m);
    }
}

impl Handler<ProviderStatus> for Recorder {
    type Result = ();
    fn handle(&mut self, _: ProviderStatus, _: &mut Context<Self>) {}
}

/// Starts `backend` under a supervisor (default restart policy) with `job_timeout`.
pub fn supervise<B: Backend>(
    backend: B,
    job_timeout: Option<Duration>,
) -> (Addr<ProvisionerSupervisor<B>>, Events) {
    supervise_warm(backend, job_timeout, None)
}

/// [`supervise`], keeping environments warm per `warm`.
pub fn supervise_warm<B: Backend>(
    backend: B,
    job_timeout: Option<Duration>,
    warm: Option<ephemer_actors_core::provision::warm::WarmSettings>,
) -> (Addr<ProvisionerSupervisor<B>>, Events) {
    let events = Events::default();
    let recorder = Recorder(events.clone()).start();
    // The supervisor holds its parent weakly: keep the recorder alive for the whole test.
    std::mem::forget(recorder.clone());
    let sup = ProvisionerSupervisor::new(
        backend,
        job_timeout,
        RestartConfig::default(),
        recorder.downgrade().recipient(),
        recorder.downgrade().recipient(),
        Metrics::new(),
        Clock::real(),
    )
    .with_warm(warm)
    .start();
    (sup, events)
}

/// Registers a JIT runner at the stand-in, as a claim would.
pub async fn claim(standin: &Standin, name_base: &str, labels: &[&str]) -> JitRunner {
    let config = GithubConfig {
        api_url: standin.url(),
        owner: "acme".into(),
        repos: vec![],
        auth: GithubAuth::Token(Secret::new("ghp_standin_token")),
        runner_group_id: 1,
        runner_group: None,
        enterprise: None,
        max_claims_per_minute: 150,
        ca_file: None,
        proxy: None,
    };
    let labels: Vec<String> = labels.iter().map(|l| l.to_string()).collect();
    GithubClient::new(&config, Metrics::new(), None)
        .generate_jitconfig(None, name_base, &labels)
        .await
        .expect("claim at the stand-in")
}

/// The spec a scheduler would send for `runner`.
pub fn spec(runner: &JitRunner, job_id: u64) -> RunnerSpec {
    RunnerSpec {
        name: runner.name.clone(),
        runner_id: runner.id,
        jit_config: runner.encoded_jit_config.clone(),
        intent: JobKey::new("acme", job_id),
        labels: vec![],
    }
}

/// Waits (real time) until `cond` holds.
pub async fn eventually(what: &str, within: Duration, cond: impl Fn() -> bool) {
    let deadline = tokio::time::Instant::now() + within;
    while !cond() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Like `eventually`, for a condition that has to ask something (an HTTP call, a CLI run).
pub async fn eventually_async<F, Fut>(what: &str, within: Duration, cond: F)
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + within;
    while !cond().await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Whether a process exists and is not a zombie (an orphan's zombie may wait for a reaper).
pub fn alive(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| state != "Z" && state != "X"),
        Err(_) => false,
    }
}

/// Waits for runner `name` to exit by itself with code 0.
pub async fn wait_clean_exit(events: &Events, name: &str, within: Duration) {
    let exit = events
        .wait_for(name, within, |k| {
            matches!(k, RunnerEventKind::Exited { .. })
        })
        .await;
    assert_eq!(
        exit,
        RunnerEventKind::Exited {
            code: Some(0),
            reason: ExitReason::Exited,
            detail: None,
        }
    );
}
