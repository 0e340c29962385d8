//! `ProvisionerSupervisor`: the parent that applies a provider's restart policy.
//!
//! actix's own `Supervisor` restarts only actors that stop themselves and does nothing for a
//! panic, so supervision is ours: the parent forwards `Provision`/`Teardown` to its current
//! child and relays the child's runner events, so it always knows which runners the child holds.
//! When the child dies, the parent creates the next one after `backoff`, and the new
//! child adopts the runners the dead one held (backends find an environment by name), so a job
//! half done goes on; one that is gone is reported lost. Unless the policy (`permanent` |
//! `transient` | `never`) or the budget (`max_restarts` within `within`) says no: then those
//! runners' environments are torn down, each reported as `ProvisionerDied` (the scheduler
//! re-queues jobs that never started), the provider is reported down and its jobs go to
//! another covering provider or wait.

use std::{
    collections::{HashSet, VecDeque},
    time::Duration,
};

use crate::clock::Instant;
use actix::{
    Actor, ActorContext, ActorFutureExt, Addr, AsyncContext, Context, Handler, WeakRecipient,
    WrapFuture,
};

use super::{
    Backend, ChildStopped, ExitReason, ProviderStatus, Provision, ProvisionError, ProvisionerActor,
    RunnerEvent, RunnerEventKind, Teardown,
};
use crate::{
    clock::Clock,
    config::{RestartConfig, RestartPolicy},
    metrics::Metrics,
};

/// How often a pool whose host check failed is checked again.
pub(super) const PROBE_INTERVAL: Duration = Duration::from_secs(30);
/// How often a pool's runner version is asked again (an image re-pulled under its tag).
pub(super) const VERSION_INTERVAL: Duration = Duration::from_secs(3600);

/// Sends `m` to `to` if it is still alive.
fn tell<M>(to: &WeakRecipient<M>, m: M)
where
    M: actix::Message + Send,
    M::Result: Send,
{
    if let Some(to) = to.upgrade() {
        to.do_send(m);
    }
}

/// The parent of one provider's provisioner, over its backend `B`.
pub struct ProvisionerSupervisor<B: Backend> {
    pub(super) backend: B,
    /// `runner.job_timeout`, each child's.
    job_timeout: Option<Duration>,
    restart: RestartConfig,
    child: Option<Addr<ProvisionerActor<B>>>,
    generation: u64,
    pub(super) live: HashSet<String>,
    restarts: VecDeque<Instant>,
    /// Weak: the scheduler owns the provisioners, not the other way round.
    scheduler: WeakRecipient<RunnerEvent>,
    status: WeakRecipient<ProviderStatus>,
    pub(super) metrics: Metrics,
    pub(super) clock: Clock,
    adopt: Vec<String>,
    /// Whether the last host check of the current child passed (no runner starts before).
    pub(super) accepting: bool,
    /// Why the pool is down, as last reported.
    down_cause: Option<String>,
    /// A host re-check is waiting to run.
    recheck_armed: bool,
    /// Where the runner version the backend can tell goes (the `ReleaseActor`).
    versions: Option<WeakRecipient<crate::release::actor::RunnerVersionSeen>>,
    /// Where a runner GitHub refused as too old is said (the `ReleaseActor`).
    refused: Option<WeakRecipient<crate::release::actor::RunnerRefused>>,
    /// The environments kept warm.
    pub(super) warm: super::warm::WarmPool,
}

impl<B: Backend> std::fmt::Debug for ProvisionerSupervisor<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProvisionerSupervisor")
            .field("provider", self.backend.pool())
            .field("generation", &self.generation)
            .field("live", &self.live.len())
            .finish()
    }
}

impl<B: Backend> ProvisionerSupervisor<B> {
    /// A supervisor of provisioners over `backend`, each killing a runner after `job_timeout`.
    pub fn new(
        backend: B,
        job_timeout: Option<Duration>,
        restart: RestartConfig,
        scheduler: WeakRecipient<RunnerEvent>,
        status: WeakRecipient<ProviderStatus>,
        metrics: Metrics,
        clock: Clock,
    ) -> Self {
        ProvisionerSupervisor {
            backend,
            job_timeout,
            restart,
            child: None,
            generation: 0,
            live: HashSet::new(),
            restarts: VecDeque::new(),
            scheduler,
            status,
            metrics,
            clock,
            adopt: Vec::new(),
            accepting: false,
            down_cause: None,
            recheck_armed: false,
            versions: None,
            refused: None,
            warm: super::warm::WarmPool::default(),
        }
    }

    /// Keeps environments warm per `settings` (`None`: none).
    pub fn with_warm(mut self, settings: Option<super::warm::WarmSettings>) -> Self {
        self.warm = super::warm::WarmPool::new(settings);
        self
    }

    /// Reports the runner version the backend can tell (a container pool's image) to
    /// `versions`, after each passing host check and every [`VERSION_INTERVAL`]; and each
    /// runner that exits because GitHub refused its version to `refused`.
    pub fn with_versions(
        mut self,
        versions: Option<WeakRecipient<crate::release::actor::RunnerVersionSeen>>,
        refused: Option<WeakRecipient<crate::release::actor::RunnerRefused>>,
    ) -> Self {
        self.versions = versions;
        self.refused = refused;
        self
    }

    fn tell_version(&mut self, ctx: &mut Context<Self>) {
        let Some(to) = self.versions.clone() else {
            return;
        };
        let pool = self.backend.pool().clone();
        let asked = self.backend.clone().runner_version();
        ctx.spawn(asked.into_actor(self).map(move |found, _, _| match found {
            Ok(Some(version)) => tell(&to, crate::release::actor::RunnerVersionSeen { pool, version }),
            Ok(None) => {}
            Err(e) => tracing::warn!(provider = pool.as_str(), error = %e, "cannot tell the runner's version"),
        }));
    }

    /// Runners an earlier run started (from the ledger): adopted at start, not reaped.
    pub fn with_adopted(mut self, names: Vec<String>) -> Self {
        self.adopt = names;
        self
    }

    fn spawn_child(&mut self, ctx: &mut Context<Self>) {
        self.generation += 1;
        let me = ctx.address();
        let child = ProvisionerActor::new(
            self.backend.clone(),
            me.downgrade().recipient(),
            me.downgrade().recipient(),
            self.generation,
            self.job_timeout,
        );
        self.child = Some(child.start());
        self.check_host(true, ctx);
    }

    /// Probes the host before the pool takes runners: up when the probe passes; otherwise down
    /// with the cause (logged once per distinct cause) and probed again after `PROBE_INTERVAL`,
    /// so a host fixed by the operator comes back without a restart. A new child's first probe
    /// holds the mailbox (`blocking`), so runners sent meanwhile wait for its answer.
    fn check_host(&mut self, blocking: bool, ctx: &mut Context<Self>) {
        let generation = self.generation;
        let probe = self.backend.clone().probe();
        let answer = probe.into_actor(self).map(move |result, act: &mut Self, ctx| {
            if act.generation != generation || act.child.is_none() {
                return;
            }
            let provider = act.backend.pool().clone();
        let provisioner = act.backend.kind().provisioner_name();
            match result {
                Ok(()) => {
                    if let Some(was) = act.down_cause.take() {
                        tracing::info!(provider = provider.as_str(), provisioner, previous_cause = %was, "host check passes again; the pool takes runners");
                    }
                    act.accepting = true;
                    act.tell_version(ctx);
                    act.warm_refill(ctx);
                    tell(&act.status, ProviderStatus {
                        provider,
                        up: true,
                        cause: None,
                    });
                }
                Err(cause) => act.pool_down(cause.to_string(), ctx),
            }
        });
        if blocking {
            ctx.wait(answer);
        } else {
            ctx.spawn(answer);
        }
    }

    /// The pool cannot take runners: say why (logged once per distinct cause), and check the
    /// host again after `PROBE_INTERVAL`. A check already waiting is not doubled.
    fn pool_down(&mut self, cause: String, ctx: &mut Context<Self>) {
        let provider = self.backend.pool().clone();
        let provisioner = self.backend.kind().provisioner_name();
        if self.down_cause.as_deref() != Some(cause.as_str()) {
            tracing::error!(provider = provider.as_str(), provisioner, %cause, retry_in = ?PROBE_INTERVAL, "host check failed: the pool is down and no job is claimed for it");
        }
        self.accepting = false;
        self.warm_clear(ctx);
        self.down_cause = Some(cause.clone());
        tell(
            &self.status,
            ProviderStatus {
                provider,
                up: false,
                cause: Some(cause),
            },
        );
        if self.recheck_armed {
            return;
        }
        self.recheck_armed = true;
        let generation = self.generation;
        ctx.run_later(PROBE_INTERVAL, move |act, ctx| {
            act.recheck_armed = false;
            if act.generation == generation && act.child.is_some() {
                act.check_host(false, ctx);
            }
        });
    }

    fn report(&self, name: &str, kind: RunnerEventKind) {
        tell(
            &self.scheduler,
            RunnerEvent {
                provider: self.backend.pool().clone(),
                name: name.to_string(),
                kind,
            },
        );
    }

    /// Whether the policy and the budget allow another restart now.
    fn may_restart(&mut self, panicked: bool) -> Result<(), NoRestart> {
        match self.restart.policy {
            RestartPolicy::Never => return Err(NoRestart::Never),
            RestartPolicy::Transient if !panicked => return Err(NoRestart::StoppedNormally),
            _ => {}
        }
        let now = self.clock.now();
        while self
            .restarts
            .front()
            .is_some_and(|t| now.saturating_duration_since(*t) >= self.restart.within)
        {
            self.restarts.pop_front();
        }
        if self.restarts.len() >= self.restart.max_restarts as usize {
            return Err(NoRestart::Budget(self.restarts.len(), self.restart.within));
        }
        self.restarts.push_back(now);
        Ok(())
    }
}

impl<B: Backend> Actor for ProvisionerSupervisor<B> {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        ctx.set_mailbox_capacity(4096);
        if self.versions.is_some() {
            ctx.run_interval(VERSION_INTERVAL, |act, ctx| {
                if act.accepting {
                    act.tell_version(ctx);
                }
            });
        }
        if let Some(warning) = self.backend.startup_warning() {
            tracing::warn!(
                provider = self.backend.pool().as_str(),
                provisioner = self.backend.kind().provisioner_name(),
                "{warning}"
            );
        }
        self.metrics
            .warm
            .init_pool(self.backend.pool().as_str(), self.warm.enabled());
        self.warm_start_ticking(ctx);
        // Leftovers of an earlier run (warm environments among them) go before the first
        // runner starts.
        let reap = self.backend.clone().reap_leftovers(self.adopt.clone());
        ctx.wait(reap.into_actor(self).map(|removed, act, ctx| {
            if !removed.is_empty() {
                tracing::info!(provider = act.backend.pool().as_str(), provisioner = act.backend.kind().provisioner_name(), count = removed.len(), names = %removed.join(", "), "removed leftover runner environments");
            }
            act.spawn_child(ctx);
            // Runners from the ledger: the new child watches them (or reports them lost).
            let adopt = std::mem::take(&mut act.adopt);
            if let Some(child) = act.child.as_ref().filter(|_| !adopt.is_empty()) {
                act.live.extend(adopt.iter().cloned());
                child.do_send(super::Adopt { names: adopt });
            }
        }));
    }
}

impl<B: Backend> Handler<crate::lifecycle::Stop> for ProvisionerSupervisor<B> {
    type Result = ();

    /// Stops the provisioner it owns, then itself; no restart follows.
    fn handle(&mut self, _: crate::lifecycle::Stop, ctx: &mut Context<Self>) {
        if let Some(child) = self.child.take() {
            child.do_send(crate::lifecycle::Stop);
        }
        self.accepting = false;
        // Detached: the removals outlive this actor (a drain removed them already).
        for name in self.warm.drain_ready() {
            crate::tasks::spawn(self.backend.clone().stop(name));
        }
        ctx.stop();
    }
}

impl<B: Backend> Handler<crate::lifecycle::Crash> for ProvisionerSupervisor<B> {
    type Result = ();

    fn handle(&mut self, _: crate::lifecycle::Crash, _: &mut Context<Self>) {
        panic!("ProvisionerSupervisor crashed on request (a fault test)");
    }
}

impl<B: Backend> Handler<crate::lifecycle::CrashProvisioner> for ProvisionerSupervisor<B> {
    type Result = ();

    fn handle(&mut self, _: crate::lifecycle::CrashProvisioner, _: &mut Context<Self>) {
        if let Some(child) = &self.child {
            child.do_send(crate::lifecycle::Crash);
        }
    }
}

impl<B: Backend> Handler<Provision> for ProvisionerSupervisor<B> {
    type Result = ();

    fn handle(&mut self, m: Provision, _: &mut Context<Self>) {
        let name = m.spec.name.clone();
        match self.child.clone() {
            Some(child) if child.connected() && self.accepting => {
                self.live.insert(name);
                // The refill waits for this runner's start (its event), so a new warm
                // environment's boot does not compete with the start on the engine.
                match self.warm_take() {
                    Some(warm) => child.do_send(super::StartIn {
                        spec: m.spec,
                        durable: m.durable,
                        warm,
                    }),
                    None => child.do_send(m),
                }
            }
            _ => self.report(
                &name,
                RunnerEventKind::Failed {
                    error: ProvisionError::HostUnavailable(match &self.down_cause {
                        Some(cause) => format!("provider {} is down: {cause}", self.backend.pool()),
                        None => format!("provider {} is down", self.backend.pool()),
                    }),
                },
            ),
        }
    }
}

impl<B: Backend> Handler<Teardown> for ProvisionerSupervisor<B> {
    type Result = ();

    fn handle(&mut self, m: Teardown, ctx: &mut Context<Self>) {
        match &self.child {
            Some(child) if child.connected() => child.do_send(m),
            _ => {
                let name = m.name;
                let cleanup = self.backend.clone().stop(name.clone());
                ctx.spawn(cleanup.into_actor(self).map(move |(), act, _| {
                    act.live.remove(&name);
                    act.report(&name, RunnerEventKind::gone(ExitReason::TornDown));
                }));
            }
        }
    }
}

impl<B: Backend> Handler<RunnerEvent> for ProvisionerSupervisor<B> {
    type Result = ();

    fn handle(&mut self, m: RunnerEvent, ctx: &mut Context<Self>) {
        if matches!(
            m.kind,
            RunnerEventKind::Exited { .. } | RunnerEventKind::Failed { .. }
        ) {
            self.live.remove(&m.name);
        }
        let refused = matches!(
            &m.kind,
            RunnerEventKind::Exited {
                code: Some(crate::provision::RUNNER_VERSION_DEPRECATED),
                reason: crate::provision::ExitReason::Exited,
                ..
            }
        );
        if refused && let Some(to) = self.refused.as_ref().and_then(WeakRecipient::upgrade) {
            // The `ReleaseActor` says whether the install is the newest release (GitHub's
            // outage); the scheduler hears that before the exit, so the job is held for a
            // probe rather than a long wait. Nothing else reaches this pool meanwhile.
            let ask = to.send(crate::release::actor::RunnerRefused {
                pool: self.backend.pool().clone(),
                runner: m.name.clone(),
            });
            ctx.wait(ask.into_actor(self).map(move |verdict, act, ctx| {
                if let Ok(Some(version)) = verdict {
                    let kind = RunnerEventKind::RefusedNewest { version };
                    let told = RunnerEvent {
                        provider: m.provider.clone(),
                        name: m.name.clone(),
                        kind,
                    };
                    tell(&act.scheduler, told);
                }
                act.runner_event(m, ctx);
            }));
            return;
        }
        self.runner_event(m, ctx);
    }
}

impl<B: Backend> ProvisionerSupervisor<B> {
    /// A runner's event, after a refusal's verdict: warm refill, pool down, the scheduler told.
    fn runner_event(&mut self, m: RunnerEvent, ctx: &mut Context<Self>) {
        // A runner started (what was taken is replaced now) or a slot is free.
        self.warm_refill(ctx);
        // A failure of the whole pool (the engine gone, the command missing) takes it down
        // before the scheduler hears of the runner, so the job is not handed to it again.
        if let RunnerEventKind::Failed { error } = &m.kind
            && error.takes_pool_down()
            && self.accepting
        {
            self.pool_down(error.to_string(), ctx);
        }
        tell(&self.scheduler, m);
    }
}

impl<B: Backend> Handler<ChildStopped> for ProvisionerSupervisor<B> {
    type Result = ();

    fn handle(&mut self, m: ChildStopped, ctx: &mut Context<Self>) {
        if m.generation != self.generation {
            return;
        }
        self.child = None;
        self.accepting = false;
        let provider = self.backend.pool().clone();
        let provisioner = self.backend.kind().provisioner_name();
        tracing::error!(
            provider = provider.as_str(),
            provisioner,
            panicked = m.panicked,
            runners = self.live.len(),
            "provisioner stopped"
        );
        let restart = self.may_restart(m.panicked);
        if restart.is_err() {
            // Nobody will watch what the dead child held: torn down and reported, so the
            // scheduler sends those jobs elsewhere.
            for name in std::mem::take(&mut self.live) {
                let cleanup = self.backend.clone().stop(name.clone());
                ctx.spawn(cleanup.into_actor(self).map(move |(), act, _| {
                    act.report(&name, RunnerEventKind::gone(ExitReason::ProvisionerDied));
                }));
            }
        }
        tell(
            &self.status,
            ProviderStatus {
                provider: provider.clone(),
                up: false,
                cause: Some(match &restart {
                    Ok(()) => "provisioner stopped; restarting".into(),
                    Err(why) => format!("provisioner stopped and stays down: {why}"),
                }),
            },
        );
        match restart {
            Ok(()) => {
                self.metrics
                    .provisioner_restarts
                    .with_label_values(&[provider.as_str()])
                    .inc();
                tracing::warn!(provider = provider.as_str(), provisioner, backoff = ?self.restart.backoff, "restarting provisioner");
                // The runners the dead child held go on (their jobs may be half done): the new
                // child adopts them by name, or reports those that are gone.
                ctx.run_later(self.restart.backoff, |act, ctx| {
                    act.spawn_child(ctx);
                    let adopt: Vec<String> = act.live.iter().cloned().collect();
                    if let Some(child) = act.child.as_ref().filter(|_| !adopt.is_empty()) {
                        child.do_send(super::Adopt { names: adopt });
                    }
                });
            }
            Err(why) => {
                tracing::error!(provider = provider.as_str(), provisioner, reason = %why, "provisioner stays down; its jobs go to another covering provider or wait");
            }
        }
    }
}

/// Why a provisioner that stopped is not restarted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
enum NoRestart {
    /// `restart = "never"`.
    #[error("restart policy is never")]
    Never,
    /// It stopped without a panic under `restart = "transient"`.
    #[error("stopped normally (transient policy)")]
    StoppedNormally,
    /// Its budget of restarts within the window is spent.
    #[error("{0} restarts within {1:?} already")]
    Budget(usize, std::time::Duration),
}
