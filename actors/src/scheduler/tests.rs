//! The scheduler and retry actors together, on paused time, with a fake GitHub and a fake
//! provisioner behind the same `Recipient`s the real ones use. Retries go through the real
//! fire path: RetryActor timer -> RetryDue -> scheduler -> claim -> failure -> ScheduleRetry.

use std::{
    collections::{HashMap, VecDeque},
    sync::{Arc, Mutex},
    time::Duration,
};

use actix::{Actor, Addr, Context, Handler, Message, Recipient, ResponseFuture};
use tokio::time::Instant;

use super::{
    actor::{GithubHandle, RateHandle, SchedulerActor, SchedulerDeps, start},
    core::{Phase, SchedulerSettings, SchedulerState},
    messages::{EventSource, GetSchedulerState, JobEvent, SetCordon},
};
use crate::{
    clock::Clock,
    config::{ClaimRetryConfig, ProviderKind, Secret},
    github::{
        GithubError, JitRunner,
        actor::{DeleteRunner, GenerateJitConfig, GetRunner},
        error::HttpFailure,
    },
    job::{JobAction, JobInfo, JobKey},
    metrics::Metrics,
    provision::{ExitReason, Provision, ProvisionerHandle, RunnerEvent, RunnerEventKind, Teardown},
    rate::{ObserveRate, RateActor},
    retry::{Backoff, GetRetryQueue, RetryActor},
};

const UNIX0: u64 = 1_800_000_000;

// ----- fakes ---------------------------------------------------------------------------------

#[derive(Default)]
struct GhLog {
    claims: Vec<(Instant, GenerateJitConfig)>,
    deletes: Vec<u64>,
    busy: Vec<u64>,
    script: VecDeque<Result<(), GithubError>>,
    otherwise: Option<GithubError>,
}

struct FakeGithub {
    log: Arc<Mutex<GhLog>>,
    next_id: u64,
}

impl Actor for FakeGithub {
    type Context = Context<Self>;
}

impl Handler<GenerateJitConfig> for FakeGithub {
    type Result = ResponseFuture<Result<JitRunner, GithubError>>;
    fn handle(&mut self, m: GenerateJitConfig, _: &mut Context<Self>) -> Self::Result {
        self.next_id += 1;
        let id = self.next_id;
        let mut log = self.log.lock().unwrap();
        log.claims.push((Instant::now(), m.clone()));
        let outcome = log
            .script
            .pop_front()
            .unwrap_or_else(|| match &log.otherwise {
                Some(e) => Err(e.clone()),
                None => Ok(()),
            });
        Box::pin(async move {
            outcome.map(|()| JitRunner {
                id,
                name: format!("{}-{id}", m.name_base),
                encoded_jit_config: Secret::new(format!("jit-{id}")),
            })
        })
    }
}

impl Handler<GetRunner> for FakeGithub {
    type Result = ResponseFuture<Result<Option<crate::github::RunnerInfo>, GithubError>>;
    fn handle(&mut self, m: GetRunner, _: &mut Context<Self>) -> Self::Result {
        let busy = self.log.lock().unwrap().busy.contains(&m.runner_id);
        Box::pin(async move {
            Ok(Some(crate::github::RunnerInfo {
                id: m.runner_id,
                name: String::new(),
                status: "online".into(),
                busy,
            }))
        })
    }
}

impl Handler<crate::github::actor::ListQueuedJobs> for FakeGithub {
    type Result = ResponseFuture<Result<Vec<JobInfo>, GithubError>>;
    fn handle(
        &mut self,
        _: crate::github::actor::ListQueuedJobs,
        _: &mut Context<Self>,
    ) -> Self::Result {
        Box::pin(async { Ok(Vec::new()) })
    }
}

impl Handler<crate::github::actor::ListRunners> for FakeGithub {
    type Result = ResponseFuture<Result<Vec<crate::github::RunnerInfo>, GithubError>>;
    fn handle(
        &mut self,
        _: crate::github::actor::ListRunners,
        _: &mut Context<Self>,
    ) -> Self::Result {
        Box::pin(async { Ok(Vec::new()) })
    }
}

impl Handler<DeleteRunner> for FakeGithub {
    type Result = ResponseFuture<Result<(), GithubError>>;
    fn handle(&mut self, m: DeleteRunner, _: &mut Context<Self>) -> Self::Result {
        self.log.lock().unwrap().deletes.push(m.runner_id);
        Box::pin(async { Ok(()) })
    }
}

/// Starts every runner at once and tears it down on request.
struct FakeProvisioner {
    provider: ProviderKind,
    sink: Option<Recipient<RunnerEvent>>,
    provisioned: Arc<Mutex<Vec<String>>>,
}

impl Actor for FakeProvisioner {
    type Context = Context<Self>;
}

#[derive(Message)]
#[rtype(result = "()")]
struct SetSink(Recipient<RunnerEvent>);

impl Handler<SetSink> for FakeProvisioner {
    type Result = ();
    fn handle(&mut self, m: SetSink, _: &mut Context<Self>) {
        self.sink = Some(m.0);
    }
}

impl Handler<Provision> for FakeProvisioner {
    type Result = ();
    fn handle(&mut self, m: Provision, _: &mut Context<Self>) {
        self.provisioned.lock().unwrap().push(m.0.name.clone());
        if let Some(s) = &self.sink {
            s.do_send(RunnerEvent {
                provider: self.provider,
                name: m.0.name,
                kind: RunnerEventKind::Started,
            });
        }
    }
}

impl Handler<Teardown> for FakeProvisioner {
    type Result = ();
    fn handle(&mut self, m: Teardown, _: &mut Context<Self>) {
        if let Some(s) = &self.sink {
            let kind = RunnerEventKind::Exited {
                code: Some(0),
                reason: ExitReason::TornDown,
            };
            s.do_send(RunnerEvent {
                provider: self.provider,
                name: m.name,
                kind,
            });
        }
    }
}

// ----- harness -------------------------------------------------------------------------------

struct Harness {
    sched: Addr<SchedulerActor>,
    retry: Addr<RetryActor>,
    rate: Addr<RateActor>,
    gh: Arc<Mutex<GhLog>>,
    provisioned: Arc<Mutex<Vec<String>>>,
    metrics: Metrics,
    clock: Clock,
    t0: Instant,
}

struct Setup {
    schedule: Vec<u64>,
    max_age: u64,
    providers: Vec<(ProviderKind, Vec<&'static str>, usize)>,
    max_concurrent: usize,
    claims_per_minute: u32,
    script: Vec<Result<(), GithubError>>,
    otherwise: Option<GithubError>,
}

impl Default for Setup {
    fn default() -> Self {
        Setup {
            schedule: vec![30, 60, 120],
            max_age: 5400,
            providers: vec![(ProviderKind::Local, vec!["self-hosted", "linux", "x64"], 4)],
            max_concurrent: 4,
            claims_per_minute: 150,
            script: Vec::new(),
            otherwise: None,
        }
    }
}

async fn harness(s: Setup) -> Harness {
    tokio::time::pause();
    let clock = Clock::virtual_from(UNIX0);
    let metrics = Metrics::new();
    let gh = Arc::new(Mutex::new(GhLog {
        script: s.script.into(),
        otherwise: s.otherwise,
        ..GhLog::default()
    }));
    let github = FakeGithub {
        log: gh.clone(),
        next_id: 0,
    }
    .start();
    let rate = RateActor::new(metrics.clone()).start();
    let provisioned = Arc::new(Mutex::new(Vec::new()));
    let mut provisioners = HashMap::new();
    let mut fakes = Vec::new();
    for (kind, _, _) in &s.providers {
        let fake = FakeProvisioner {
            provider: *kind,
            sink: None,
            provisioned: provisioned.clone(),
        }
        .start();
        provisioners.insert(
            *kind,
            ProvisionerHandle {
                provision: fake.clone().recipient(),
                teardown: fake.clone().recipient(),
            },
        );
        fakes.push(fake);
    }
    let settings = SchedulerSettings {
        providers: s
            .providers
            .iter()
            .map(|(kind, labels, max)| super::core::ProviderSpec {
                kind: *kind,
                labels: labels.iter().map(|l| l.to_string()).collect(),
                max_concurrent: *max,
            })
            .collect(),
        max_concurrent: s.max_concurrent,
        name_prefix: "ephemer".into(),
        repo_level: false,
        retry_enabled: true,
        claims_per_minute: s.claims_per_minute,
        seen_ttl: super::core::SEEN_TTL,
        started_ttl: Duration::from_secs(7200),
        zombie_cap: super::core::ZOMBIE_CAP,
        orphan_grace: Some(Duration::from_secs(600)),
        reconcile_interval: None,
        repos: Vec::new(),
    };
    let backoff = Backoff::try_new(&ClaimRetryConfig {
        schedule: s.schedule.iter().map(|d| Duration::from_secs(*d)).collect(),
        max_age: Duration::from_secs(s.max_age),
        jitter: 0.0,
        ..ClaimRetryConfig::default()
    })
    .unwrap();
    let deps = SchedulerDeps {
        github: GithubHandle::of(&github),
        rate: Some(RateHandle {
            get: rate.clone().recipient(),
            credential: "token".into(),
        }),
        provisioners,
        store: None,
        restore: None,
    };
    let (sched, retry) = start(settings, backoff, deps, metrics.clone(), clock, Some(42));
    for fake in fakes {
        fake.send(SetSink(sched.clone().recipient())).await.unwrap();
    }
    // Every fake pool passes its host check at once (a supervisor reports this in production).
    for (kind, _, _) in &s.providers {
        sched
            .send(crate::provision::ProviderStatus {
                provider: *kind,
                up: true,
                cause: None,
            })
            .await
            .unwrap();
    }
    // Round-trip once so every actor has started before time moves.
    sched.send(GetSchedulerState).await.unwrap();
    retry.send(GetRetryQueue).await.unwrap();
    Harness {
        sched,
        retry,
        rate,
        gh,
        provisioned,
        metrics,
        clock,
        t0: Instant::now(),
    }
}

fn job(id: u64, labels: &[&str]) -> JobInfo {
    JobInfo {
        key: JobKey::new("acme", id),
        repo: "app".into(),
        run_id: 1,
        run_attempt: 1,
        labels: labels.iter().map(|l| l.to_string()).collect(),
        runner_name: None,
        runner_id: None,
        conclusion: None,
        installation_id: None,
    }
}

fn event(action: JobAction, job: JobInfo) -> JobEvent {
    JobEvent {
        delivery_id: None,
        action,
        job,
        received: Instant::now(),
        source: EventSource::Webhook,
    }
}

fn http(status: u16, remaining: Option<u64>, retry_after: Option<u64>) -> GithubError {
    GithubError::Http(HttpFailure {
        endpoint: "generate_jitconfig",
        status,
        message: "scripted".into(),
        documentation_url: None,
        rate_remaining: remaining,
        rate_reset: None,
        retry_after: retry_after.map(Duration::from_secs),
    })
}

impl Harness {
    async fn send(&self, action: JobAction, job: JobInfo) {
        self.sched.send(event(action, job)).await.unwrap();
    }

    async fn queued(&self, id: u64, labels: &[&str]) {
        self.send(JobAction::Queued, job(id, labels)).await;
    }

    /// Lets every ready message and timer due by `d` from now run.
    async fn run_for(&self, d: Duration) {
        tokio::time::sleep(d).await;
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        self.sched.send(GetSchedulerState).await.unwrap();
    }

    fn claim_offsets(&self) -> Vec<u64> {
        self.gh
            .lock()
            .unwrap()
            .claims
            .iter()
            .map(|(at, _)| at.duration_since(self.t0).as_secs())
            .collect()
    }

    fn claims(&self) -> usize {
        self.gh.lock().unwrap().claims.len()
    }

    async fn state(&self) -> SchedulerState {
        self.sched.send(GetSchedulerState).await.unwrap()
    }

    async fn phase(&self, id: u64) -> Phase {
        let st = self.state().await;
        st.jobs
            .into_iter()
            .find(|j| j.key.job_id == id)
            .map(|j| j.phase)
            .expect("job known")
    }
}

const LINUX: &[&str] = &["self-hosted", "linux"];

// ----- tests ---------------------------------------------------------------------------------

/// The seed's ladder bug, through the real fire path: 30s, 1m, 2m, 2m, then given up at
/// max_age; the first failure's time is kept across fires.
#[actix_rt::test]
async fn ladder_climbs_through_the_fire_path_and_gives_up_at_max_age() {
    let h = harness(Setup {
        max_age: 300,
        otherwise: Some(http(502, None, None)),
        ..Setup::default()
    })
    .await;
    h.queued(1, LINUX).await;
    h.run_for(Duration::from_secs(400)).await;
    let offsets = h.claim_offsets();
    assert_eq!(offsets, vec![0, 30, 90, 210, 330], "gaps 30s, 1m, 2m, 2m");
    assert_eq!(h.metrics.retry_given_up.get(), 1);
    assert_eq!(
        h.metrics
            .retry_attempts
            .with_label_values(&["server_side"])
            .get(),
        4
    );
    assert_eq!(h.phase(1).await, Phase::Seen);
    let q = h.retry.send(GetRetryQueue).await.unwrap();
    assert_eq!((q.depth, q.items.len(), q.armed_timers), (0, 0, 0));
    let st = h.state().await;
    let timeline: Vec<_> = st.jobs[0].timeline.iter().map(|n| n.text.clone()).collect();
    assert!(
        timeline
            .iter()
            .any(|t| t.contains("retry #4 scheduled for") && t.contains("(in 120.0s;")),
        "{timeline:#?}"
    );
    assert!(
        timeline
            .iter()
            .any(|t| t.contains("gave up after 5 attempts")),
        "{timeline:#?}"
    );
    h.run_for(Duration::from_secs(3600)).await;
    assert_eq!(h.claims(), 5, "nothing after giving up");
}

#[actix_rt::test]
async fn a_retry_that_fails_again_stays_and_a_success_drops_it() {
    let h = harness(Setup {
        script: vec![Err(http(502, None, None)), Err(http(503, None, None))],
        ..Setup::default()
    })
    .await;
    h.queued(1, LINUX).await;
    h.run_for(Duration::from_secs(45)).await;
    let q = h.retry.send(GetRetryQueue).await.unwrap();
    assert_eq!(
        (q.depth, q.items[0].attempts),
        (1, 2),
        "the failed retry is back on the ladder"
    );
    h.run_for(Duration::from_secs(600)).await;
    assert_eq!(h.claim_offsets(), vec![0, 30, 90]);
    assert!(matches!(h.phase(1).await, Phase::Active { .. }));
    let q = h.retry.send(GetRetryQueue).await.unwrap();
    assert_eq!((q.depth, q.items.len()), (0, 0), "success drops the item");
    assert_eq!(h.provisioned.lock().unwrap().len(), 1);
}

async fn seed_rate(h: &Harness, remaining: u64, reset_in: u64, age: u64) {
    let now = h.clock.unix();
    let headers = crate::github::rate::RateHeaders {
        remaining: Some(remaining),
        limit: Some(5000),
        reset: Some(now + reset_in),
        used: None,
        core: true,
    };
    h.rate
        .send(ObserveRate {
            credential: "token".into(),
            headers: Some(headers),
            retry_after: None,
            status: 403,
            at_unix: now - age,
        })
        .await
        .unwrap();
}

#[actix_rt::test]
async fn an_empty_budget_snaps_the_retry_to_the_reset() {
    let h = harness(Setup {
        script: vec![Err(http(403, Some(0), None))],
        ..Setup::default()
    })
    .await;
    seed_rate(&h, 0, 90, 0).await;
    h.queued(1, LINUX).await;
    h.run_for(Duration::from_secs(200)).await;
    let offsets = h.claim_offsets();
    assert_eq!(offsets.len(), 2, "{offsets:?}");
    assert!(
        (95..115).contains(&offsets[1]),
        "retry at reset + [5s, 25s): {offsets:?}"
    );
}

#[actix_rt::test]
async fn a_stale_reading_falls_back_to_the_ladder() {
    let h = harness(Setup {
        script: vec![Err(http(403, Some(0), None))],
        ..Setup::default()
    })
    .await;
    seed_rate(&h, 0, 90, 600).await;
    h.queued(1, LINUX).await;
    h.run_for(Duration::from_secs(200)).await;
    assert_eq!(h.claim_offsets(), vec![0, 30]);
}

#[actix_rt::test]
async fn retry_after_wins() {
    let h = harness(Setup {
        script: vec![Err(http(429, Some(10), Some(7)))],
        ..Setup::default()
    })
    .await;
    seed_rate(&h, 0, 90, 0).await;
    h.queued(1, LINUX).await;
    h.run_for(Duration::from_secs(200)).await;
    assert_eq!(h.claim_offsets(), vec![0, 7]);
}

#[actix_rt::test]
async fn a_label_mismatched_job_delivered_ten_times_costs_nothing() {
    let h = harness(Setup::default()).await;
    for _ in 0..10 {
        h.queued(9, &["self-hosted", "gpu"]).await;
    }
    h.run_for(Duration::from_secs(1)).await;
    assert_eq!(h.claims(), 0);
    assert!(h.gh.lock().unwrap().deletes.is_empty());
    let st = h.state().await;
    let j = &st.jobs[0];
    assert!(j.seen && !j.pending, "{j:?}");
    assert_eq!(j.phase, Phase::Unroutable);
    assert_eq!(st.stats.duplicates, 9);
}

#[actix_rt::test]
async fn the_same_job_delivered_five_times_at_once_is_claimed_once() {
    let h = harness(Setup::default()).await;
    for _ in 0..5 {
        h.sched
            .try_send(event(JobAction::Queued, job(3, LINUX)))
            .unwrap();
    }
    h.run_for(Duration::from_secs(1)).await;
    assert_eq!(h.claims(), 1);
    assert_eq!(h.provisioned.lock().unwrap().len(), 1);
}

#[actix_rt::test]
async fn in_progress_or_completed_while_retrying_stops_the_retries() {
    let h = harness(Setup {
        otherwise: Some(http(502, None, None)),
        ..Setup::default()
    })
    .await;
    h.queued(1, LINUX).await;
    h.queued(2, LINUX).await;
    h.run_for(Duration::from_secs(5)).await;
    assert_eq!(h.claims(), 2);
    h.send(
        JobAction::InProgress,
        JobInfo {
            runner_name: Some("someone-else".into()),
            ..job(1, LINUX)
        },
    )
    .await;
    h.send(
        JobAction::Completed,
        JobInfo {
            conclusion: Some("cancelled".into()),
            ..job(2, LINUX)
        },
    )
    .await;
    h.run_for(Duration::from_secs(3600)).await;
    assert_eq!(h.claims(), 2, "no claim after the job was seen elsewhere");
    let q = h.retry.send(GetRetryQueue).await.unwrap();
    assert_eq!((q.depth, q.items.len()), (0, 0));
    assert_eq!(h.phase(1).await, Phase::Done);
    assert_eq!(h.phase(2).await, Phase::Done);
}

#[actix_rt::test]
async fn not_found_and_validation_failures_are_not_retried() {
    let h = harness(Setup {
        script: vec![
            Err(http(404, Some(10), None)),
            Err(http(422, Some(10), None)),
        ],
        ..Setup::default()
    })
    .await;
    h.queued(1, LINUX).await;
    h.run_for(Duration::from_secs(1)).await;
    h.queued(2, LINUX).await;
    h.run_for(Duration::from_secs(300)).await;
    assert_eq!(h.claims(), 2);
    let q = h.retry.send(GetRetryQueue).await.unwrap();
    assert_eq!(q.items.len(), 0);
    assert_eq!(h.phase(1).await, Phase::Seen);
    assert_eq!(h.phase(2).await, Phase::Seen);
    assert_eq!(
        h.metrics
            .jit_registration_errors
            .with_label_values(&["non_retryable"])
            .get(),
        2
    );
}

#[actix_rt::test]
async fn routing_picks_the_most_specific_covering_provider_then_a_free_one() {
    let h = harness(Setup {
        providers: vec![
            (
                ProviderKind::Local,
                vec!["self-hosted", "linux", "x64", "big"],
                1,
            ),
            (ProviderKind::Linux, vec!["self-hosted", "linux", "x64"], 1),
            (
                ProviderKind::NativeMacos,
                vec!["self-hosted", "linux", "x64"],
                1,
            ),
        ],
        ..Setup::default()
    })
    .await;
    for id in 1..=3 {
        h.queued(id, &["Self-Hosted", "LINUX"]).await;
    }
    h.run_for(Duration::from_secs(1)).await;
    let bases: Vec<String> =
        h.gh.lock()
            .unwrap()
            .claims
            .iter()
            .map(|(_, c)| c.name_base.clone())
            .collect();
    assert_eq!(
        bases,
        vec!["ephemer-linux", "ephemer-native-macos"],
        "fewest extra labels first, then a free slot"
    );
    let st = h.state().await;
    assert_eq!(st.pending, 1, "the third waits for a most-specific slot");
    h.queued(4, &["big"]).await;
    h.run_for(Duration::from_secs(1)).await;
    assert_eq!(
        h.gh.lock().unwrap().claims.last().unwrap().1.name_base,
        "ephemer-local"
    );
}

#[actix_rt::test]
async fn slots_are_held_until_the_runner_goes_and_released_before_a_retry_wait() {
    let h = harness(Setup {
        max_concurrent: 1,
        script: vec![Err(http(502, None, None))],
        ..Setup::default()
    })
    .await;
    h.queued(1, LINUX).await;
    h.queued(2, LINUX).await;
    h.run_for(Duration::from_secs(1)).await;
    // Job 1 failed and waits 30 s on the ladder without its slot: job 2 got it.
    assert_eq!(h.claims(), 2);
    let st = h.state().await;
    assert_eq!(st.used, 1);
    h.run_for(Duration::from_secs(60)).await;
    assert_eq!(h.claims(), 2, "job 1's retry waits for job 2's runner");
    let runner = h.state().await.runners[0].name.clone();
    h.send(
        JobAction::Completed,
        JobInfo {
            runner_name: Some(runner),
            conclusion: Some("success".into()),
            ..job(2, LINUX)
        },
    )
    .await;
    h.run_for(Duration::from_secs(1)).await;
    assert_eq!(h.claims(), 3);
    assert_eq!(
        h.metrics
            .jobs_total
            .with_label_values(&["local", "success"])
            .get(),
        1
    );
}

#[actix_rt::test]
async fn a_parked_dispatch_claims_nothing_after_a_cordon() {
    let h = harness(Setup {
        max_concurrent: 1,
        ..Setup::default()
    })
    .await;
    h.queued(1, LINUX).await;
    h.queued(2, LINUX).await;
    h.run_for(Duration::from_secs(1)).await;
    assert_eq!(h.claims(), 1);
    h.sched.send(SetCordon(true)).await.unwrap();
    let runner = h.state().await.runners[0].name.clone();
    h.send(
        JobAction::Completed,
        JobInfo {
            runner_name: Some(runner),
            ..job(1, LINUX)
        },
    )
    .await;
    h.run_for(Duration::from_secs(60)).await;
    assert_eq!(h.claims(), 1);
    let st = h.state().await;
    assert_eq!(
        (st.used, st.pending),
        (0, 0),
        "slot released, nothing pending"
    );
    assert_eq!(h.metrics.draining.get(), 1);
}

#[actix_rt::test]
async fn a_burst_is_paced_by_the_claim_budget() {
    let h = harness(Setup {
        max_concurrent: 1000,
        claims_per_minute: 60,
        providers: vec![(ProviderKind::Local, vec!["self-hosted", "linux"], 1000)],
        ..Setup::default()
    })
    .await;
    for id in 0..100 {
        h.queued(id, LINUX).await;
    }
    h.run_for(Duration::from_secs(1)).await;
    assert_eq!(h.claims(), 6, "a tenth of the budget at once");
    h.run_for(Duration::from_secs(60)).await;
    let n = h.claims();
    assert!((60..=66).contains(&n), "{n} claims after a minute");
}

/// 10,000 parked jobs hold exactly one armed timer, and all fire when due.
#[actix_rt::test]
async fn ten_thousand_parked_jobs_arm_one_timer() {
    let h = harness(Setup::default()).await;
    for id in 0..10_000u64 {
        h.retry.do_send(crate::retry::ScheduleRetry {
            job: job(id, LINUX),
            failure: crate::retry::Failure {
                class: crate::github::ErrorClass::ServerSide,
                retry_after: None,
                message: "x".into(),
            },
            rate: None,
        });
    }
    let q = h.retry.send(GetRetryQueue).await.unwrap();
    assert_eq!((q.depth, q.armed_timers), (10_000, 1));
    assert_eq!(q.next_due_in_secs, Some(30.0));
    assert_eq!(h.metrics.retry_queue_depth.get(), 10_000);
}

/// A provider whose provisioner died and stays down: the unstarted job it held is re-queued and
/// runs on the other covering provider; new jobs go there too. Nothing is lost.
#[actix_rt::test]
async fn jobs_of_a_dead_provider_move_to_another_covering_provider() {
    let h = harness(Setup {
        providers: vec![
            (ProviderKind::Local, vec!["self-hosted", "linux"], 2),
            (ProviderKind::Linux, vec!["self-hosted", "linux", "x64"], 2),
        ],
        ..Setup::default()
    })
    .await;
    h.queued(1, LINUX).await;
    h.run_for(Duration::from_secs(1)).await;
    let runner = h.state().await.runners[0].clone();
    assert_eq!(
        runner.provider,
        ProviderKind::Local,
        "the most specific provider first"
    );

    h.sched
        .send(crate::provision::ProviderStatus {
            provider: ProviderKind::Local,
            up: false,
            cause: Some("restart policy is never".into()),
        })
        .await
        .unwrap();
    let died = RunnerEventKind::Exited {
        code: None,
        reason: ExitReason::ProvisionerDied,
    };
    h.sched
        .send(RunnerEvent {
            provider: ProviderKind::Local,
            name: runner.name.clone(),
            kind: died,
        })
        .await
        .unwrap();
    h.queued(2, LINUX).await;
    h.run_for(Duration::from_secs(1)).await;

    let st = h.state().await;
    let providers: Vec<_> = st
        .runners
        .iter()
        .map(|r| (r.intent.job_id, r.provider))
        .collect();
    assert!(
        providers.contains(&(1, ProviderKind::Linux)),
        "{providers:?}"
    );
    assert!(
        providers.contains(&(2, ProviderKind::Linux)),
        "{providers:?}"
    );
    assert_eq!(
        h.gh.lock().unwrap().deletes,
        vec![runner.id],
        "the dead runner's registration is deleted"
    );
}

fn runner_of(st: &SchedulerState, job_id: u64) -> String {
    st.runners
        .iter()
        .find(|r| r.intent.job_id == job_id)
        .map(|r| r.name.clone())
        .expect("runner for job")
}

async fn exited(h: &Harness, name: &str) {
    let kind = RunnerEventKind::Exited {
        code: Some(0),
        reason: ExitReason::Exited,
    };
    h.sched
        .send(RunnerEvent {
            provider: ProviderKind::Local,
            name: name.into(),
            kind,
        })
        .await
        .unwrap();
}

/// Runner A (made for job 1) runs sibling job 2 and exits; job 1 never ran and its own runner
/// crashed: job 1 is dispatched again at once.
#[actix_rt::test]
async fn a_stranded_job_is_dispatched_again_at_once() {
    let h = harness(Setup::default()).await;
    h.queued(1, LINUX).await;
    h.queued(2, LINUX).await;
    h.run_for(Duration::from_secs(1)).await;
    let st = h.state().await;
    let (a, b) = (runner_of(&st, 1), runner_of(&st, 2));
    // Runner b (made for job 2) crashes at boot; runner a takes job 2, completes it, exits.
    exited(&h, &b).await;
    h.send(
        JobAction::InProgress,
        JobInfo {
            runner_name: Some(a.clone()),
            ..job(2, LINUX)
        },
    )
    .await;
    h.send(
        JobAction::Completed,
        JobInfo {
            runner_name: Some(a.clone()),
            conclusion: Some("success".into()),
            ..job(2, LINUX)
        },
    )
    .await;
    h.run_for(Duration::from_secs(1)).await;
    // Job 2's runner crashing re-dispatched job 2 once (it had not started yet then); job 1's
    // runner a exiting after running job 2 re-dispatches job 1.
    exited(&h, &a).await;
    h.run_for(Duration::from_secs(1)).await;
    let st = h.state().await;
    assert!(
        st.runners.iter().any(|r| r.intent.job_id == 1),
        "job 1 has a new runner: {:?}",
        st.runners
    );
    let timeline = st
        .jobs
        .iter()
        .find(|j| j.key.job_id == 1)
        .unwrap()
        .timeline
        .clone();
    assert!(
        timeline.iter().any(|n| n.text.contains("stranded")),
        "{timeline:#?}"
    );
}

/// Two same-label jobs whose runners swapped: no re-dispatch, and completing one job tears down
/// only the runner that ran it, never the other job's live runner.
#[actix_rt::test]
async fn same_label_jobs_that_swap_runners_are_left_alone() {
    let h = harness(Setup::default()).await;
    h.queued(1, LINUX).await;
    h.queued(2, LINUX).await;
    h.run_for(Duration::from_secs(1)).await;
    let st = h.state().await;
    let (a, b) = (runner_of(&st, 1), runner_of(&st, 2));
    h.send(
        JobAction::InProgress,
        JobInfo {
            runner_name: Some(b.clone()),
            ..job(1, LINUX)
        },
    )
    .await;
    h.send(
        JobAction::InProgress,
        JobInfo {
            runner_name: Some(a.clone()),
            ..job(2, LINUX)
        },
    )
    .await;
    h.send(
        JobAction::Completed,
        JobInfo {
            runner_name: Some(b.clone()),
            conclusion: Some("success".into()),
            ..job(1, LINUX)
        },
    )
    .await;
    h.run_for(Duration::from_secs(1)).await;
    let st = h.state().await;
    assert_eq!(
        st.runners
            .iter()
            .map(|r| r.name.clone())
            .collect::<Vec<_>>(),
        vec![a.clone()],
        "only b (which ran job 1) went"
    );
    exited(&h, &a).await;
    h.run_for(Duration::from_secs(1)).await;
    assert_eq!(h.claims(), 2, "no re-dispatch");
}

/// Spares: a runner whose own job ran elsewhere covers a queued job its labels cover (here the
/// job whose runner went to a sibling); a spare nothing needs is reaped at the next sweep (after
/// any `completed`) and deleted on GitHub.
#[actix_rt::test]
async fn spare_runners_cover_demand_and_the_surplus_is_reaped() {
    let h = harness(Setup::default()).await;
    for id in 1..=4 {
        h.queued(id, LINUX).await;
    }
    h.run_for(Duration::from_secs(1)).await;
    let st = h.state().await;
    let (a, b, c, d) = (
        runner_of(&st, 1),
        runner_of(&st, 2),
        runner_of(&st, 3),
        runner_of(&st, 4),
    );
    // a takes job 2: b (made for job 2) is a spare, but job 1 still needs a runner.
    h.send(
        JobAction::InProgress,
        JobInfo {
            runner_name: Some(a.clone()),
            ..job(2, LINUX)
        },
    )
    .await;
    // Job 4 runs on a peer's runner: d is a spare nothing needs.
    h.send(
        JobAction::InProgress,
        JobInfo {
            runner_name: Some("peer-runner".into()),
            ..job(4, LINUX)
        },
    )
    .await;
    // A completed anywhere triggers the sweep.
    h.send(
        JobAction::InProgress,
        JobInfo {
            runner_name: Some(c.clone()),
            ..job(3, LINUX)
        },
    )
    .await;
    h.send(
        JobAction::Completed,
        JobInfo {
            runner_name: Some(c.clone()),
            conclusion: Some("success".into()),
            ..job(3, LINUX)
        },
    )
    .await;
    h.run_for(Duration::from_secs(1)).await;
    let st = h.state().await;
    let names: Vec<String> = st.runners.iter().map(|r| r.name.clone()).collect();
    assert!(
        names.contains(&a) && names.contains(&b),
        "b covers job 1: {names:?}"
    );
    assert!(
        !names.contains(&d),
        "the surplus spare d is reaped: {names:?}"
    );
    assert!(!names.contains(&c), "c ran its job and went");
    let d_id = h.gh.lock().unwrap().claims.len();
    assert_eq!(d_id, 4, "no new claim");
    assert_eq!(
        h.gh.lock().unwrap().deletes.len(),
        1,
        "the reaped spare is deleted on GitHub"
    );
}

/// A runner nobody takes is reaped after the grace and deleted on GitHub (its job, never seen
/// running, is dispatched again, counting toward the zombie cap); a job cancelled before any
/// runner took it has its runner torn down at once.
#[actix_rt::test]
async fn orphans_are_reaped_after_the_grace_and_cancelled_jobs_at_once() {
    let h = harness(Setup::default()).await;
    h.queued(1, LINUX).await;
    h.queued(2, LINUX).await;
    h.run_for(Duration::from_secs(1)).await;
    let first = runner_of(&h.state().await, 1);
    h.send(
        JobAction::Completed,
        JobInfo {
            conclusion: Some("cancelled".into()),
            ..job(2, LINUX)
        },
    )
    .await;
    h.run_for(Duration::from_secs(1)).await;
    assert_eq!(
        h.state().await.runners.len(),
        1,
        "the cancelled job's runner went at once"
    );
    assert_eq!(h.gh.lock().unwrap().deletes.len(), 1);
    h.run_for(Duration::from_secs(630)).await;
    let st = h.state().await;
    assert!(
        st.runners.iter().all(|r| r.name != first),
        "the orphan went after the grace"
    );
    assert_eq!(
        h.gh.lock().unwrap().deletes.len(),
        2,
        "and was deleted on GitHub"
    );
    let j1 = st.jobs.iter().find(|j| j.key.job_id == 1).unwrap();
    assert_eq!(j1.admissions, 2, "job 1 dispatched again once");
}

/// A spare whose `in_progress` is late (GitHub says busy) is not reaped.
#[actix_rt::test]
async fn a_busy_spare_is_not_reaped() {
    let h = harness(Setup::default()).await;
    h.queued(1, LINUX).await;
    h.queued(2, LINUX).await;
    h.run_for(Duration::from_secs(1)).await;
    let st = h.state().await;
    let b = st
        .runners
        .iter()
        .find(|r| r.intent.job_id == 2)
        .unwrap()
        .clone();
    h.gh.lock().unwrap().busy.push(b.id);
    // Job 2 ran on a peer: b is a spare with no demand, but GitHub says it is busy.
    h.send(
        JobAction::InProgress,
        JobInfo {
            runner_name: Some("peer".into()),
            ..job(2, LINUX)
        },
    )
    .await;
    h.send(
        JobAction::Completed,
        JobInfo {
            runner_name: Some("peer".into()),
            conclusion: Some("success".into()),
            ..job(2, LINUX)
        },
    )
    .await;
    h.run_for(Duration::from_secs(1)).await;
    assert!(
        h.state().await.runners.iter().any(|r| r.name == b.name),
        "busy spare kept"
    );
    h.gh.lock().unwrap().busy.clear();
    h.run_for(Duration::from_secs(31)).await;
    assert!(
        !h.state().await.runners.iter().any(|r| r.name == b.name),
        "reaped once idle"
    );
}

/// A runner that exits by itself before its `in_progress` arrives ran a job: GitHub removed
/// it, so no deletion is spent on it. One that ran nothing is deleted once the wait is over.
#[actix_rt::test]
async fn late_in_progress_spares_a_needless_deletion() {
    let h = harness(Setup::default()).await;
    h.queued(1, LINUX).await;
    h.queued(2, LINUX).await;
    h.run_for(Duration::from_secs(1)).await;
    let st = h.state().await;
    let (a, b) = (runner_of(&st, 1), runner_of(&st, 2));
    exited(&h, &a).await;
    exited(&h, &b).await;
    h.send(
        JobAction::InProgress,
        JobInfo {
            runner_name: Some(a.clone()),
            ..job(1, LINUX)
        },
    )
    .await;
    h.send(
        JobAction::Completed,
        JobInfo {
            runner_name: Some(a.clone()),
            conclusion: Some("success".into()),
            ..job(1, LINUX)
        },
    )
    .await;
    let id = |name: &str| st.runners.iter().find(|r| r.name == name).unwrap().id;
    let (a_id, b_id) = (id(&a), id(&b));
    h.run_for(Duration::from_secs(5)).await;
    assert!(
        !h.gh.lock().unwrap().deletes.contains(&b_id),
        "nothing deleted before the wait is over"
    );
    h.run_for(Duration::from_secs(40)).await;
    let deletes = h.gh.lock().unwrap().deletes.clone();
    assert!(
        deletes.contains(&b_id),
        "the runner that ran nothing is deleted: {deletes:?}"
    );
    assert!(
        !deletes.contains(&a_id),
        "the runner that ran job 1 is not: {deletes:?}"
    );
    assert_eq!(
        h.metrics
            .jobs_total
            .with_label_values(&["local", "success"])
            .get(),
        1
    );
}
