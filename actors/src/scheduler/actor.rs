//! `SchedulerActor`: the actix shell over [`Scheduler`]. Each handler reads the clock once,
//! asks the core, and carries out what it returns: claims and runner deletions go to the GitHub
//! actor, runners to their provisioner, the ladder's earliest due time to its `RetryActor`
//! (which this actor owns), durable changes to the store, observations to the log and the
//! metrics. Nothing here decides.

use std::collections::{HashMap, VecDeque};

use actix::{
    Actor, ActorFutureExt, AsyncContext, Context, Handler, MessageResult, Recipient,
    ResponseFuture, WrapFuture, prelude::SendError,
};

use super::{
    core::{Deletion, Effect, Scheduler, SchedulerSettings},
    messages::{
        BeginShutdown, FlushDeferred, GetJob, GetJobs, GetPoolDemand, GetRetryQueue,
        GetCensus, GetGeneration, GetSchedulerState, GetStatus, JobEvent, SetCordon, ShuttingDown, TeardownAll,
    },
    observe,
};
use crate::{
    clock::Clock,
    config::PoolName,
    github::{
        GithubError,
        actor::{
            DeleteRunner, GenerateJitConfig, GetJob as GetGithubJob, GetRunner, ListQueuedJobs,
            ListRunners,
        },
    },
    job::JobAction,
    metrics::Metrics,
    provision::{
        ProviderStatus, Provision, ProvisionError, ProvisionerHandle, RunnerEvent, RunnerEventKind,
    },
    retry::{ArmRetryTimer, Backoff, RetryActor, RetryDue},
    store::{Snapshot, Store},
};

/// The scheduler's mailbox; a full one makes the webhook answer 503.
pub(crate) const SCHEDULER_MAILBOX: usize = 16_384;
/// How often the orphan sweep runs (it also runs after every `completed`).
const SWEEP_EVERY: std::time::Duration = std::time::Duration::from_secs(30);
/// Seconds the start-up cleanup waits for a moment without a claim in flight.
pub(super) const CLEANUP_WAITS: u32 = 60;

/// How the scheduler reaches GitHub.
#[derive(Debug, Clone)]
pub struct GithubHandle {
    /// Claims.
    pub claim: Recipient<GenerateJitConfig>,
    /// Runner deletions.
    pub delete: Recipient<DeleteRunner>,
    /// Runner lookups (is it busy?).
    pub get_runner: Recipient<GetRunner>,
    /// The reconcile poll.
    pub list_queued: Recipient<ListQueuedJobs>,
    /// Runner listings (start-up cleanup of registrations no ledger names).
    pub list_runners: Recipient<ListRunners>,
    /// One job's state (a parked job's look).
    pub get_job: Recipient<GetGithubJob>,
}

impl GithubHandle {
    /// Every recipient from one actor that answers all of them (the `GithubActor`, or a fake).
    pub fn of<A>(addr: &actix::Addr<A>) -> Self
    where
        A: Actor<Context = Context<A>>
            + Handler<GenerateJitConfig>
            + Handler<DeleteRunner>
            + Handler<GetRunner>
            + Handler<ListQueuedJobs>
            + Handler<ListRunners>
            + Handler<GetGithubJob>,
    {
        GithubHandle {
            claim: addr.clone().recipient(),
            delete: addr.clone().recipient(),
            get_runner: addr.clone().recipient(),
            list_queued: addr.clone().recipient(),
            list_runners: addr.clone().recipient(),
            get_job: addr.clone().recipient(),
        }
    }
}

/// Where the scheduler reads the rate readings of its targets' credentials: the rate actor's
/// book (the one copy of each reading).
#[derive(Debug, Clone)]
pub struct RateHandle {
    /// The rate actor's book.
    pub book: crate::rate::RateBook,
    /// Each target's credential key (`GithubClient::rate_key`), in target order.
    pub credentials: Vec<String>,
}

/// Everything the scheduler talks to.
#[derive(Debug, Clone)]
pub struct SchedulerDeps {
    /// GitHub, one handle per target (in `SchedulerSettings::targets` order).
    pub github: Vec<GithubHandle>,
    /// The rate readings (optional: without them rate-limit failures climb the plain ladder).
    pub rate: Option<RateHandle>,
    /// Provisioners by provider.
    pub provisioners: HashMap<PoolName, ProvisionerHandle>,
    /// The durable store (`None`: state lives in memory only).
    pub store: Option<Store>,
    /// The cluster ledger (fleet mode): claims are arbitrated there first, and registrations
    /// and the ladder are mirrored to it.
    pub ledger: Option<crate::cluster::Ledger>,
    /// What the store held at start-up, to restore from.
    pub restore: Option<Snapshot>,
    /// Scale-set mode: each (owner, pool)'s listener, which registers the pool's runners in
    /// its scale set (`None` in the other modes); filled by [`ScaleSetClaims`] once the
    /// listeners run (a claim before that fails as a network error does, and retries).
    pub scalesets: Option<HashMap<(String, PoolName), Recipient<GenerateJitConfig>>>,
    /// Where each finished job's trace goes (`[telemetry]`; `None`: traces are off).
    pub traces: Option<crate::telemetry::TraceExport>,
}

/// Scale-set mode: where each (owner, pool)'s claims go (its listener).
#[derive(Debug, Clone, actix::Message)]
#[rtype(result = "()")]
pub struct ScaleSetClaims(pub HashMap<(String, PoolName), Recipient<GenerateJitConfig>>);

impl Handler<ScaleSetClaims> for SchedulerActor {
    type Result = ();

    fn handle(&mut self, ScaleSetClaims(claims): ScaleSetClaims, _: &mut Context<Self>) {
        self.deps.scalesets = Some(claims);
    }
}

/// The scheduler actor.
#[derive(Debug)]
pub struct SchedulerActor {
    pub(super) core: Scheduler,
    pub(super) deps: SchedulerDeps,
    /// Store changes mirrored to the cluster ledger, in order (fleet mode).
    pub(super) mirror: Option<crate::cluster::Mirror>,
    /// The one timer (the ladder, deferred decisions, claim pacing); owned (held strongly)
    /// by this actor.
    retry: actix::Addr<RetryActor>,
    metrics: Metrics,
    pub(super) clock: Clock,
    /// GitHub calls started and not answered yet (a drain waits for them).
    pub(super) calls_in_flight: usize,
    /// Of those, claims (whose runners are not in the ledger until answered).
    pub(super) claims_in_flight: usize,
    /// When the last batch that stored a runner is committed: a runner's environment starts
    /// after that (batches commit in order, so the last one covers every earlier row).
    runners_durable: crate::provision::Durable,
}

/// Starts a scheduler and its retry actor, wired to each other, in a context made beforehand
/// (so others can be given its address first). `seed` fixes the ladder's jitter.
pub fn start_in(
    ctx: Context<SchedulerActor>,
    settings: SchedulerSettings,
    backoff: Backoff,
    deps: SchedulerDeps,
    metrics: Metrics,
    clock: Clock,
    seed: Option<u64>,
) -> (actix::Addr<SchedulerActor>, actix::Addr<RetryActor>) {
    let addr = ctx.address();
    let retry = RetryActor::new(addr.downgrade().recipient(), clock).start();
    metrics
        .concurrent_capacity
        .set(i64::try_from(settings.max_concurrent).unwrap_or(i64::MAX));
    for p in &settings.providers {
        metrics.init_provider(p.name.as_str());
    }
    let mut core = Scheduler::new(settings, backoff, seed.unwrap_or_else(rand::random));
    let mut deps = deps;
    if let Some(rate) = &deps.rate {
        core.read_rates(rate.book.clone(), rate.credentials.clone());
    }
    let (redo, fx) = match deps.restore.take() {
        Some(snapshot) if deps.store.is_some() => core.restore(&snapshot, clock.tick()),
        _ => (Vec::new(), Vec::new()),
    };
    let mirror = deps.ledger.clone().map(crate::cluster::Mirror::spawn);
    let mut actor = SchedulerActor {
        core,
        deps,
        mirror,
        retry: retry.clone(),
        metrics,
        clock,
        calls_in_flight: 0,
        claims_in_flight: 0,
        runners_durable: crate::provision::Durable::default(),
    };
    actor.carry_out_restored(fx);
    ctx.run(actor);
    // Jobs the previous run accepted but had nothing in flight for go through the normal path.
    for job in redo {
        addr.do_send(JobEvent {
            delivery_id: None,
            action: JobAction::Queued,
            job,
            received: clock.now(),
            source: super::messages::EventSource::Reconcile,
        });
    }
    (addr, retry)
}

impl SchedulerActor {
    /// The GitHub handle of the target whose owner is `owner` (the first target's for an
    /// owner no target has).
    pub(super) fn github(&self, owner: &str) -> &GithubHandle {
        let t = self.core.setup().target_of(owner).unwrap_or(0);
        &self.deps.github[t.min(self.deps.github.len() - 1)]
    }

    /// The restored ladder's timer, before the actor runs (no context needed for it).
    fn carry_out_restored(&mut self, effects: Vec<Effect>) {
        self.persist();
        for e in effects {
            if let Effect::ArmTimer { at } = e {
                self.retry.do_send(ArmRetryTimer { at });
            }
        }
    }

    /// Carries out effects, including any that follow from a failed hand-over.
    pub(super) fn run(&mut self, effects: Vec<Effect>, ctx: &mut Context<Self>) {
        self.persist();
        let mut queue: VecDeque<Effect> = effects.into();
        while let Some(effect) = queue.pop_front() {
            match effect {
                Effect::Claim {
                    key,
                    provider,
                    request,
                } => self.claim(key, provider, request, ctx),
                Effect::Provision { provider, spec } => {
                    queue.extend(self.provision(provider, spec));
                }
                Effect::Teardown {
                    provider,
                    name,
                    reason,
                } => {
                    let msg = crate::provision::Teardown {
                        name: name.clone(),
                        reason,
                    };
                    let sent = self
                        .deps
                        .provisioners
                        .get(&provider)
                        .is_some_and(|h| deliver(&h.teardown, msg));
                    if !sent {
                        tracing::warn!(runner = %name, provider = provider.as_str(), "teardown could not reach the provisioner");
                    }
                }
                Effect::DeleteRunner(deletion) => self.delete_runner(deletion, ctx),
                Effect::LookAtJob { key, repo } => self.look_at_job(key, repo, ctx),
                Effect::ArmTimer { at } => self.retry.do_send(ArmRetryTimer { at }),
                Effect::CheckIdle {
                    owner,
                    name,
                    runner_id,
                    repo,
                    reason,
                } => self.check_idle(owner, name, runner_id, repo, reason, ctx),
            }
        }
    }

    /// Hands a runner to its pool's provisioner; when none takes it, the core hears its
    /// environment failed (and says what follows).
    fn provision(&mut self, provider: PoolName, spec: crate::provision::RunnerSpec) -> Vec<Effect> {
        let name = spec.name.clone();
        let provision = Provision {
            spec,
            durable: self.runners_durable.clone(),
        };
        let sent = match self.deps.provisioners.get(&provider) {
            Some(h) => deliver(&h.provision, provision),
            None => false,
        };
        if sent {
            return Vec::new();
        }
        let kind = RunnerEventKind::Failed {
            error: ProvisionError::HostUnavailable(format!("provider {provider} is not running")),
        };
        let fx = self.core.on_runner_event(&name, kind, self.clock.tick());
        self.persist();
        fx
    }

    /// An unbound runner is deleted on GitHub if it is idle (GitHub refuses to delete a busy
    /// one); the core hears which.
    fn check_idle(
        &mut self,
        owner: String,
        name: String,
        runner_id: u64,
        repo: Option<String>,
        reason: &'static str,
        ctx: &mut Context<Self>,
    ) {
        // Delete first, tear down after: GitHub refuses to delete a runner that
        // is running a job, atomically with handing it one, where a busy check
        // followed by a teardown can kill a job assigned in between.
        let delete = self.github(&owner).delete.clone();
        let fut = async move {
            match delete.send(DeleteRunner { repo, runner_id }).await {
                Ok(Ok(())) => Ok(false),
                Ok(Err(e)) if e.is_runner_busy() => Ok(true),
                Ok(Err(e)) => Err(e),
                Err(e) => Err(GithubError::Network {
                    endpoint: "delete_runner",
                    detail: e.to_string(),
                }),
            }
        };
        self.calls_in_flight += 1;
        ctx.spawn(fut.into_actor(self).map(move |busy, act, ctx| {
            act.calls_in_flight -= 1;
            let fx = act
                .core
                .on_idle_checked(&name, busy, reason, act.clock.tick());
            act.run(fx, ctx);
        }));
    }

    /// Hands the core's state changes to the store (in order; the store commits them in
    /// groups), and its observations to the log and the metrics.
    pub(super) fn persist(&mut self) {
        let mut ops = self.core.take_ops();
        if let Some(mirror) = &self.mirror {
            // A cordoned host hands on what each change leaves without a runner (a claim it
            // abandoned, a runner that failed at boot): no other host takes a job it holds.
            mirror.send(&ops, self.core.view().is_draining() && !ops.is_empty());
        }
        // Only the ledger keeps registrations past their environment: no commit for these.
        ops.retain(|op| !matches!(op, crate::durable::Op::Unregistered(_)));
        if let Some(store) = &self.deps.store
            && !ops.is_empty()
        {
            if ops
                .iter()
                .any(|op| matches!(op, crate::durable::Op::PutRunner(_)))
            {
                self.runners_durable = crate::provision::Durable::after(store.send_committed(ops));
            } else {
                store.send(ops);
            }
        }
        for trace in self.core.take_traces() {
            if let Some(export) = &self.deps.traces {
                export.send(trace);
            }
        }
        for o in self.core.take_observations() {
            // Every line about a job carries its id, repo and pool, in text and JSON logs (looked
            // up only when such lines are written).
            let span = match o.job_id() {
                Some(job_id) => {
                    let span = tracing::info_span!(
                        "job",
                        job_id,
                        repo = tracing::field::Empty,
                        pool = tracing::field::Empty
                    );
                    if !span.is_disabled() {
                        let (repo, pool) = self.core.view().job_context(job_id);
                        span.record("repo", tracing::field::display(&repo));
                        span.record("pool", tracing::field::display(&pool));
                    }
                    span
                }
                None => tracing::Span::none(),
            };
            let _in_job = span.enter();
            observe::record(o, &self.metrics);
        }
        self.metrics
            .retry_queue_depth
            .set(i64::try_from(self.core.view().ladder_depth()).unwrap_or(i64::MAX));
    }
}

/// Sends an internal message: a full mailbox still queues it (`do_send`), a closed one fails.
fn deliver<M>(to: &Recipient<M>, msg: M) -> bool
where
    M: actix::Message + Send,
    M::Result: Send,
{
    match to.try_send(msg) {
        Ok(()) => true,
        Err(SendError::Full(msg)) => {
            to.do_send(msg);
            true
        }
        Err(SendError::Closed(_)) => false,
    }
}

impl SchedulerActor {
    /// Lists queued jobs on GitHub (queued and in-progress runs, every page, every repo) and
    /// feeds them through the normal dedup path: the backstop for deliveries that never came.
    fn reconcile(&mut self, ctx: &mut Context<Self>) {
        for t in 0..self.deps.github.len() {
            self.reconcile_target(t, ctx);
        }
    }

    /// One target's reconcile pass.
    fn reconcile_target(&mut self, t: usize, ctx: &mut Context<Self>) {
        let list = self.deps.github[t].list_queued.clone();
        ctx.spawn(async move { list.send(ListQueuedJobs).await }.into_actor(self).map(move |result, act, ctx| {
            let pass = match result {
                Ok(Ok(pass)) => pass,
                Ok(Err(e)) => {
                    tracing::warn!(error_class = e.class().as_str(), error = %e, "reconcile failed; trying again next interval");
                    return;
                }
                Err(e) => {
                    tracing::warn!(error = %e, "github actor unavailable for reconcile");
                    return;
                }
            };
            for (repo, e) in &pass.failed {
                act.metrics.reconcile_repo_failures.inc();
                tracing::warn!(repo = %repo, error_class = e.class().as_str(), error = %e, "reconcile: this repo failed; its jobs wait for the next pass");
            }
            if pass.deferred > 0 {
                tracing::info!(deferred = pass.deferred, "reconcile: the core budget runs low; the remaining repos wait for the next pass");
            }
            tracing::info!(queued = pass.jobs.len(), repos = pass.listed, failed = pass.failed.len(), "reconcile: queued jobs on GitHub");
            // A full listing also says which held jobs are no longer queued on GitHub.
            let complete = pass.failed.is_empty() && pass.deferred == 0;
            let fx = act
                .core
                .on_reconcile_pass(t, pass.jobs, complete, act.clock.tick());
            act.run(fx, ctx);
        }));
    }
}

impl Actor for SchedulerActor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        if let Some(every) = self.core.setup().reconcile_interval() {
            // Once at start-up (GitHub never re-sends what was queued while we were down),
            // then as a periodic backstop.
            self.reconcile(ctx);
            ctx.run_interval(every, |act, ctx| act.reconcile(ctx));
        }
        ctx.set_mailbox_capacity(SCHEDULER_MAILBOX);
        ctx.run_interval(self.core.setup().prune_every(), |act, _| {
            act.core.prune(act.clock.tick());
            act.persist();
        });
        if self.deps.store.is_some() {
            self.delete_unledgered_runners(ctx);
        }
        ctx.run_interval(SWEEP_EVERY, |act, ctx| {
            let fx = act.core.sweep(act.clock.tick());
            act.run(fx, ctx);
        });
    }

    fn stopped(&mut self, _: &mut Self::Context) {
        // The retry timer is this actor's child: it goes with it. Pending store writes were
        // handed over already; dropping this actor drops its store handle.
        self.retry.do_send(crate::lifecycle::Stop);
    }
}

crate::stop_on_request!(SchedulerActor);

impl Handler<super::messages::CallsInFlight> for SchedulerActor {
    type Result = usize;

    fn handle(&mut self, _: super::messages::CallsInFlight, _: &mut Context<Self>) -> usize {
        self.calls_in_flight
    }
}

impl Handler<JobEvent> for SchedulerActor {
    type Result = ();

    fn handle(&mut self, m: JobEvent, ctx: &mut Context<Self>) {
        let now = self.clock.tick();
        let fx = self
            .core
            .on_job_event(m.action, m.job, m.delivery_id.as_deref(), m.received, now);
        self.run(fx, ctx);
    }
}

impl Handler<RetryDue> for SchedulerActor {
    type Result = ();

    fn handle(&mut self, _: RetryDue, ctx: &mut Context<Self>) {
        let fx = self.core.on_timer(self.clock.tick());
        self.run(fx, ctx);
    }
}

impl Handler<RunnerEvent> for SchedulerActor {
    type Result = ();

    fn handle(&mut self, m: RunnerEvent, ctx: &mut Context<Self>) {
        let fx = self
            .core
            .on_runner_event(&m.name, m.kind, self.clock.tick());
        self.run(fx, ctx);
    }
}

impl Handler<ProviderStatus> for SchedulerActor {
    type Result = ();

    fn handle(&mut self, m: ProviderStatus, ctx: &mut Context<Self>) {
        let fx = self
            .core
            .on_provider_status(m.provider, m.up, m.cause, self.clock.tick());
        self.run(fx, ctx);
    }
}

impl Handler<crate::provision::warm::WarmStatus> for SchedulerActor {
    type Result = ();

    fn handle(&mut self, m: crate::provision::warm::WarmStatus, _: &mut Context<Self>) {
        self.core.on_warm_status(&m.provider, m.view);
    }
}

impl SchedulerActor {
    /// Tells every pool to stop keeping environments warm (and remove them), or to resume.
    fn hold_warm(&self, hold: bool) {
        for pool in self.deps.provisioners.values() {
            pool.warm.do_send(crate::provision::warm::WarmHold(hold));
        }
    }
}

impl Handler<SetCordon> for SchedulerActor {
    type Result = Result<(), ShuttingDown>;

    fn handle(&mut self, m: SetCordon, ctx: &mut Context<Self>) -> Self::Result {
        let fx = self.core.set_cordon(m.0, self.clock.tick())?;
        self.run(fx, ctx);
        // A cordoned host keeps nothing warm.
        self.hold_warm(m.0);
        if m.0 {
            self.release_to_fleet();
        }
        Ok(())
    }
}

impl Handler<BeginShutdown> for SchedulerActor {
    type Result = ();

    fn handle(&mut self, _: BeginShutdown, ctx: &mut Context<Self>) {
        let fx = self.core.begin_shutdown(self.clock.tick());
        self.run(fx, ctx);
        self.hold_warm(true);
        self.release_to_fleet();
    }
}

impl Handler<FlushDeferred> for SchedulerActor {
    type Result = ResponseFuture<()>;

    /// Resolves once every deletion it started has an answer, so a drain can exit after it.
    fn handle(&mut self, _: FlushDeferred, _: &mut Context<Self>) -> Self::Result {
        let fx = self.core.flush_deferred(self.clock.tick());
        self.persist();
        let sends: Vec<_> = fx
            .into_iter()
            .filter_map(|e| match e {
                Effect::DeleteRunner(Deletion {
                    owner,
                    repo,
                    runner_id,
                    ..
                }) => {
                    let delete = self.github(&owner).delete.clone();
                    // The drain ends after this: a deletion that fails is tried twice more,
                    // a second apart (the next start's cleanup finds what is still left).
                    Some(async move {
                        for attempt in 0..3 {
                            let msg = DeleteRunner {
                                repo: repo.clone(),
                                runner_id,
                            };
                            if let Ok(Ok(())) = delete.send(msg).await {
                                return;
                            }
                            if attempt < 2 {
                                tokio::time::sleep(std::time::Duration::from_secs(1)).await;
                            }
                        }
                    })
                }
                _ => None,
            })
            .collect();
        Box::pin(async move {
            futures_util::future::join_all(sends).await;
        })
    }
}

impl Handler<TeardownAll> for SchedulerActor {
    type Result = ();

    fn handle(&mut self, _: TeardownAll, ctx: &mut Context<Self>) {
        let fx = self.core.teardown_all(self.clock.tick());
        self.run(fx, ctx);
    }
}

/// The read-only queries: each answers from the core at the current time.
macro_rules! queries {
    ($($msg:ident => |$core:ident, $m:ident, $now:ident| $answer:expr;)+) => {$(
        impl Handler<$msg> for SchedulerActor {
            type Result = MessageResult<$msg>;

            fn handle(&mut self, $m: $msg, _: &mut Context<Self>) -> Self::Result {
                let ($core, $now) = (&self.core, self.clock.tick());
                MessageResult($answer)
            }
        }
    )+};
}

queries! {
    GetSchedulerState => |core, _m, now| core.view().everything(now);
    GetStatus => |core, _m, now| core.view().status(now);
    GetJobs => |core, _m, now| core.view().jobs_view(now);
    GetJob => |core, m, now| core.view().job_detail(m.0, now);
    GetRetryQueue => |core, _m, now| core.view().retry_queue(now);
    GetPoolDemand => |core, m, _now| core.view().pool_demand(&m.owner, &m.pin);
    GetGeneration => |core, _m, _now| core.view().generation();
    GetCensus => |core, _m, _now| {
        let mut census = core.view().census();
        census.push(("runtime.tasks", crate::tasks::alive()));
        census
    };
}
