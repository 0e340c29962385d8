//! The scheduler and retry actors together, on paused time, with a fake GitHub and a fake
//! provisioner behind the same `Recipient`s the real ones use: the wiring. Retries go through the
//! real fire path: claim fails -> the scheduler's ladder -> ArmRetryTimer -> RetryActor timer ->
//! RetryDue -> scheduler -> claim.

use std::{
    collections::{HashMap, VecDeque},
    sync::{Arc, Mutex},
    time::Duration,
};

use crate::clock::Instant;
use actix::{Actor, Addr, Context, Handler, Message, Recipient, ResponseFuture};

use super::{
    actor::{GithubHandle, RateHandle, SchedulerActor, SchedulerDeps, start_in},
    core::{Abandon, Note, ParkReason, Phase, RetryQueueView, SchedulerSettings, SchedulerState},
    messages::{EventSource, GetRetryQueue, GetSchedulerState, JobEvent, SetCordon},
};
use crate::{
    clock::Clock,
    config::{ClaimRetryConfig, PoolName, ProviderKind, Secret},
    github::{
        GithubError, JitRunner,
        actor::{DeleteRunner, GenerateJitConfig, GetRunner},
        error::HttpFailure,
    },
    job::{JobAction, JobInfo, JobKey},
    metrics::Metrics,
    provision::{
        ExitReason, Provision, ProvisionError, ProvisionerHandle, RunnerEvent, RunnerEventKind,
        Teardown,
    },
    rate::{ObserveRate, RateActor},
    retry::{Backoff, GetRetryTimer, RetryActor},
};

use crate::scheduler::fixtures::{UNIX0, http, limited};

// ----- fakes ---------------------------------------------------------------------------------

#[derive(Default)]
struct GhLog {
    claims: Vec<(Instant, GenerateJitConfig)>,
    deletes: Vec<u64>,
    busy: Vec<u64>,
    /// Deletions asked, refused or not (the sweep's busy check is a deletion).
    gets: usize,
    /// Runners handed a job just after a look at them: listed idle, refused deletion as busy.
    busy_since_looked: Vec<u64>,
    script: VecDeque<Result<(), GithubError>>,
    otherwise: Option<GithubError>,
    /// What a look at a job answers (`queued` unless set).
    job_status: String,
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
        log.claims.push((crate::clock::mono_now(), m.clone()));
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
                name: format!("{}{id}", m.name_base),
                encoded_jit_config: Secret::new(format!("jit-{id}")),
            })
        })
    }
}

impl Handler<GetRunner> for FakeGithub {
    type Result = ResponseFuture<Result<Option<crate::github::RunnerInfo>, GithubError>>;
    fn handle(&mut self, m: GetRunner, _: &mut Context<Self>) -> Self::Result {
        let busy = {
            let mut log = self.log.lock().unwrap();
            log.gets += 1;
            log.busy.contains(&m.runner_id)
        };
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
    type Result = ResponseFuture<Result<crate::github::reconcile::Reconciled, GithubError>>;
    fn handle(
        &mut self,
        _: crate::github::actor::ListQueuedJobs,
        _: &mut Context<Self>,
    ) -> Self::Result {
        Box::pin(async { Ok(Default::default()) })
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

impl Handler<crate::github::actor::GetJob> for FakeGithub {
    type Result = ResponseFuture<Result<(JobInfo, String), GithubError>>;
    fn handle(&mut self, m: crate::github::actor::GetJob, _: &mut Context<Self>) -> Self::Result {
        let status = match self.log.lock().unwrap().job_status.as_str() {
            "" => "queued".to_string(),
            other => other.to_string(),
        };
        Box::pin(async move {
            Ok((
                JobInfo {
                    key: JobKey::new("acme", m.job_id),
                    ..JobInfo::default()
                },
                status,
            ))
        })
    }
}

impl Handler<DeleteRunner> for FakeGithub {
    type Result = ResponseFuture<Result<(), GithubError>>;
    fn handle(&mut self, m: DeleteRunner, _: &mut Context<Self>) -> Self::Result {
        let mut log = self.log.lock().unwrap();
        log.gets += 1;
        if log.busy.contains(&m.runner_id) || log.busy_since_looked.contains(&m.runner_id) {
            // As GitHub answers for a runner that runs a job.
            return Box::pin(async {
                Err(GithubError::Http(HttpFailure {
                    endpoint: "delete_runner",
                    status: 422,
                    message: "Bad request - Runner \"x\" is still running a job\"".into(),
                    documentation_url: None,
                    rate_remaining: None,
                    rate_bucket: None,
                    rate_reset: None,
                    retry_after: None,
                }))
            });
        }
        log.deletes.push(m.runner_id);
        Box::pin(async { Ok(()) })
    }
}

/// Starts every runner at once (or fails every one with `fail`) and tears it down on request.
struct FakeProvisioner {
    provider: PoolName,
    sink: Option<Recipient<RunnerEvent>>,
    provisioned: Arc<Mutex<Vec<String>>>,
    fail: Option<ProvisionError>,
}

impl Actor for FakeProvisioner {
    type Context = Context<Self>;
}

#[derive(Message)]
#[rtype(result = "()")]
struct SetSink(Recipient<RunnerEvent>);

crate::stop_on_request!(FakeProvisioner);

impl Handler<crate::lifecycle::CrashProvisioner> for FakeProvisioner {
    type Result = ();

    fn handle(&mut self, _: crate::lifecycle::CrashProvisioner, _: &mut Context<Self>) {}
}

impl Handler<crate::provision::warm::WarmHold> for FakeProvisioner {
    type Result = ();

    fn handle(&mut self, _: crate::provision::warm::WarmHold, _: &mut Context<Self>) {}
}

impl Handler<SetSink> for FakeProvisioner {
    type Result = ();
    fn handle(&mut self, m: SetSink, _: &mut Context<Self>) {
        self.sink = Some(m.0);
    }
}

impl Handler<Provision> for FakeProvisioner {
    type Result = ();
    fn handle(&mut self, m: Provision, _: &mut Context<Self>) {
        self.provisioned.lock().unwrap().push(m.spec.name.clone());
        let kind = match &self.fail {
            Some(error) => RunnerEventKind::Failed {
                error: error.clone(),
            },
            None => RunnerEventKind::Started { warm: false },
        };
        if let Some(s) = &self.sink {
            s.do_send(RunnerEvent {
                provider: self.provider.clone(),
                name: m.spec.name,
                kind,
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
                detail: None,
            };
            s.do_send(RunnerEvent {
                provider: self.provider.clone(),
                name: m.name,
                kind,
            });
        }
    }
}

// ----- harness -------------------------------------------------------------------------------

pub(super) struct Harness {
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
    /// Every environment fails to start with this.
    provision_error: Option<ProvisionError>,
    /// `runner.claim_retry.enabled`.
    retry_enabled: bool,
}

impl Setup {
    /// One pool and the daemon with `slots` slots each: pacing, not slots, bounds the claims.
    fn wide(slots: usize) -> Setup {
        Setup {
            max_concurrent: slots,
            providers: vec![(ProviderKind::Local, vec!["self-hosted", "linux"], slots)],
            ..Setup::default()
        }
    }
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
            provision_error: None,
            retry_enabled: true,
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
    let rate_book = crate::rate::RateBook::default();
    let rate = RateActor::new(rate_book.clone(), metrics.clone()).start();
    let provisioned = Arc::new(Mutex::new(Vec::new()));
    let mut provisioners = HashMap::new();
    let mut fakes = Vec::new();
    for (kind, _, _) in &s.providers {
        let fake = FakeProvisioner {
            provider: PoolName::from(*kind),
            sink: None,
            provisioned: provisioned.clone(),
            fail: s.provision_error.clone(),
        }
        .start();
        provisioners.insert(
            PoolName::from(*kind),
            ProvisionerHandle {
                provision: fake.clone().recipient(),
                teardown: fake.clone().recipient(),
                stop: fake.clone().recipient(),
                crash: fake.clone().recipient(),
                crash_child: fake.clone().recipient(),
                warm: fake.clone().recipient(),
            },
        );
        fakes.push(fake);
    }
    let settings = SchedulerSettings {
        providers: s
            .providers
            .iter()
            .map(|(kind, labels, max)| super::core::ProviderSpec {
                name: (*kind).into(),
                kind: *kind,
                labels: labels.iter().map(|l| l.to_string()).collect(),
                max_concurrent: *max,
                targets: None,
                warm: None,
            accel: None,
            })
            .collect(),
        max_concurrent: s.max_concurrent,
        name_prefix: "ephemer".into(),
        install_id: String::new(),
        targets: vec![super::core::TargetSpec {
            claims_per_minute: s.claims_per_minute,
            ..super::core::TargetSpec::new("acme")
        }],
        retry_enabled: s.retry_enabled,
        seen_ttl: super::core::SEEN_TTL,
        started_ttl: Duration::from_secs(7200),
        retention: Duration::from_secs(3600),
        usage_retention: Duration::from_secs(86_400),
        zombie_cap: super::core::ZOMBIE_CAP,
        heal_grace: Duration::ZERO,
        orphan_grace: Some(Duration::from_secs(600)),
        reconcile_interval: None,
        fleet: false,
        scaleset: false,
        traces: false,
    };
    let backoff = Backoff::try_new(&ClaimRetryConfig {
        schedule: s.schedule.iter().map(|d| Duration::from_secs(*d)).collect(),
        max_age: Duration::from_secs(s.max_age),
        jitter: 0.0,
        ..ClaimRetryConfig::default()
    })
    .unwrap();
    let deps = SchedulerDeps {
        github: vec![GithubHandle::of(&github)],
        rate: Some(RateHandle {
            book: rate_book,
            credentials: vec!["token".into()],
        }),
        provisioners,
        store: None,
        restore: None,
        scalesets: None,
        traces: None,
        ledger: None,
    };
    let (sched, retry) = start_in(
        Context::new(),
        settings,
        backoff,
        deps,
        metrics.clone(),
        clock,
        Some(42),
    );
    for fake in fakes {
        fake.send(SetSink(sched.clone().recipient())).await.unwrap();
    }
    // Every fake pool passes its host check at once (a supervisor reports this in production).
    for (kind, _, _) in &s.providers {
        sched
            .send(crate::provision::ProviderStatus {
                provider: PoolName::from(*kind),
                up: true,
                cause: None,
            })
            .await
            .unwrap();
    }
    // Round-trip once so every actor has started before time moves.
    sched.send(GetSchedulerState).await.unwrap();
    retry.send(GetRetryTimer).await.unwrap();
    Harness {
        sched,
        retry,
        rate,
        gh,
        provisioned,
        metrics,
        clock,
        t0: crate::clock::mono_now(),
    }
}

use super::fixtures::job;

fn event(action: JobAction, job: JobInfo) -> JobEvent {
    JobEvent {
        delivery_id: None,
        action,
        job,
        received: crate::clock::mono_now(),
        source: EventSource::Webhook,
    }
}

impl Harness {
    async fn send(&self, action: JobAction, job: JobInfo) {
        self.sched.send(event(action, job)).await.unwrap();
    }

    async fn queued(&self, id: u64, labels: &[&str]) {
        self.send(JobAction::Queued, job(id, labels)).await;
    }

    /// Queues jobs `ids` (one second of virtual time to let their claims go out).
    async fn queued_many(&self, ids: std::ops::Range<u64>) {
        for id in ids {
            self.queued(id, LINUX).await;
        }
        self.run_for(Duration::from_secs(1)).await;
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

    /// The ladder (from the scheduler, its owner) and the number of armed timers.
    async fn ladder(&self) -> (RetryQueueView, usize) {
        let q = self.sched.send(GetRetryQueue).await.unwrap();
        let t = self.retry.send(GetRetryTimer).await.unwrap();
        (q, t.armed_timers)
    }

    /// A reading of the registration bucket: `remaining`, reset `reset_in` s from now, taken
    /// `age` s ago.
    async fn seed_rate(&self, remaining: u64, reset_in: u64, age: u64) {
        let now = self.clock.unix();
        let headers = crate::github::rate::RateHeaders {
            remaining: Some(remaining),
            limit: Some(5000),
            reset: Some(now.saturating_add(reset_in)),
            used: None,
            resource: crate::vocab::RateBucket::ActionsRunnerRegistration,
        };
        self.rate
            .send(ObserveRate {
                target: "acme".into(),
                credential: "token".into(),
                bucket: crate::vocab::RateBucket::ActionsRunnerRegistration,
                headers: Some(headers),
                retry_after: None,
                status: 403,
                at_unix: now - age,
            })
            .await
            .unwrap();
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

/// The claim times (s) of one job whose claims answer `script`, with a registration-bucket
/// reading (remaining, reset in, age) seeded first, over `secs` of virtual time.
async fn claim_offsets_for(
    script: Vec<Result<(), GithubError>>,
    reading: Option<(u64, u64, u64)>,
    secs: u64,
) -> Vec<u64> {
    let h = harness(Setup {
        script,
        ..Setup::default()
    })
    .await;
    if let Some((remaining, reset_in, age)) = reading {
        h.seed_rate(remaining, reset_in, age).await;
    }
    h.queued(1, LINUX).await;
    h.run_for(Duration::from_secs(secs)).await;
    h.claim_offsets()
}

mod dispatch;
mod fungible;
mod ladder;
mod paths;
