//! Warm environments: a pool keeps some booted ahead of their claims (`warm`), so a runner
//! starts in one at once instead of waiting for a container, a VM or a copied install.
//!
//! The supervisor owns them (they outlive a crashed provisioner; nobody's job is in them).
//! A warm environment holds no runner, no registration and no secret: at a claim the runner's
//! JIT config goes into the oldest waiting one ([`Backend::warm_start`]), and another boots in
//! the background. Environments running and warm together stay within the pool's
//! `max_concurrent`. Every [`WARM_TICK`] the pool is held against its target (which a time
//! window may raise or lower): one older than `warm_max_age`, one that fails its readiness
//! check, or one built from what is no longer current is replaced; more than the target are
//! removed. A cordon or a drain ([`WarmHold`]) stops the refill and removes what is warm; a
//! restart removes what an earlier run left warm with the rest of its leftovers (warm
//! environments carry runner-like names).

use std::{
    cell::Cell,
    collections::{HashSet, VecDeque},
    rc::Rc,
    time::Duration,
};

use actix::{ActorFutureExt, AsyncContext, Context, Handler, Message, WrapFuture};
use tokio::time::Instant;

use super::{Backend, ProvisionerSupervisor};
use crate::config::WarmConfig;

/// How often a pool's warm environments are checked and its target read again.
pub const WARM_TICK: Duration = Duration::from_secs(5);
/// The wait after a failed boot, doubling to [`BOOT_BACKOFF_CAP`].
const BOOT_BACKOFF: Duration = Duration::from_secs(5);
const BOOT_BACKOFF_CAP: Duration = Duration::from_secs(300);
/// How long a hold waits for the removals (and boots in flight) to finish.
const HOLD_WAIT: Duration = Duration::from_secs(60);

/// A pool's warm environments, as `status` shows them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct WarmView {
    /// Booted and waiting for a claim.
    pub available: usize,
    /// Booting.
    pub booting: usize,
    /// How many the pool keeps now (its count or window, within its free slots; 0 while
    /// cordoned, draining or down).
    pub target: usize,
}

/// A pool's warm environments changed (to the scheduler, for `status`).
#[derive(Debug, Clone, Message)]
#[rtype(result = "()")]
pub struct WarmStatus {
    /// The pool.
    pub provider: crate::config::PoolName,
    /// What it has.
    pub view: WarmView,
}

/// What a pool keeps warm.
#[derive(Debug, Clone)]
pub struct WarmSettings {
    /// `warm`, `warm_max_age`.
    pub config: WarmConfig,
    /// The pool's `max_concurrent`: running and warm environments together.
    pub max: usize,
    /// What the pool's runner names start with; a warm environment's name does too.
    pub prefix: String,
    /// Where the pool's [`WarmStatus`] goes (the scheduler, held weakly).
    pub report: Option<actix::WeakRecipient<WarmStatus>>,
}

/// Stop keeping environments warm and remove the warm ones (`true`: a cordon, a drain), or
/// resume (`false`). Answers once the removals are done.
#[derive(Debug, Clone, Copy, Message)]
#[rtype(result = "()")]
pub struct WarmHold(pub bool);

/// A pool's warm environments.
#[derive(Debug, Default)]
pub struct WarmPool {
    settings: Option<WarmSettings>,
    /// Booted and waiting, oldest first: (name, booted at).
    ready: VecDeque<(String, Instant)>,
    booting: HashSet<String>,
    held: bool,
    failures: u32,
    no_boot_before: Option<Instant>,
    /// Boots and removals in flight (a hold waits for them).
    in_flight: Rc<Cell<usize>>,
}

impl WarmPool {
    /// The warm pool of `settings` (nothing warm when `None` or a zero count).
    pub fn new(settings: Option<WarmSettings>) -> Self {
        WarmPool {
            settings: settings.filter(|s| s.config.booted()),
            ..WarmPool::default()
        }
    }

    /// Whether the pool keeps anything warm at any time.
    pub fn enabled(&self) -> bool {
        self.settings.is_some()
    }

    /// Environments waiting for a claim.
    pub fn available(&self) -> usize {
        self.ready.len()
    }

    /// Takes every waiting environment's name (the supervisor stops: it removes them).
    pub(super) fn drain_ready(&mut self) -> Vec<String> {
        self.ready.drain(..).map(|(name, _)| name).collect()
    }
}

/// A counter held while a boot or removal runs.
struct InFlight(Rc<Cell<usize>>);

impl InFlight {
    fn new(count: &Rc<Cell<usize>>) -> Self {
        count.set(count.get() + 1);
        InFlight(count.clone())
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.set(self.0.get().saturating_sub(1));
    }
}

impl<B: Backend> ProvisionerSupervisor<B> {
    /// Takes the oldest warm environment for a claim, if one waits; counts a hit or a miss.
    pub(super) fn warm_take(&mut self) -> Option<String> {
        if !self.warm.enabled() {
            return None;
        }
        let pool = self.backend.pool().as_str();
        let taken = self.warm.ready.pop_front().map(|(name, _)| name);
        self.metrics
            .warm
            .claims
            .with_label_values(&[pool, if taken.is_some() { "hit" } else { "miss" }])
            .inc();
        self.warm_gauges();
        taken
    }

    /// The pool's target now: its count (by the window the clock is in), 0 while held or
    /// down, within the slots the running runners leave.
    fn warm_target(&self) -> usize {
        let Some(s) = &self.warm.settings else {
            return 0;
        };
        if self.warm.held || !self.accepting {
            return 0;
        }
        let want = s.config.target_at(s.config.week_time(self.clock.unix()));
        want.min(s.max.saturating_sub(self.live.len()))
    }

    /// Boots what the target lacks; removes what is beyond it (the oldest first).
    pub(super) fn warm_refill(&mut self, ctx: &mut Context<Self>) {
        if !self.warm.enabled() {
            return;
        }
        let target = self.warm_target();
        while self.warm.ready.len() > target {
            if let Some((name, _)) = self.warm.ready.pop_front() {
                self.warm_discard(name, "surplus", ctx);
            }
        }
        let now = self.clock.now();
        if self.warm.no_boot_before.is_some_and(|t| now < t) {
            self.warm_gauges();
            return;
        }
        let have = self.warm.ready.len() + self.warm.booting.len();
        for _ in have..target {
            self.warm_boot(ctx);
        }
        self.warm_gauges();
    }

    fn warm_boot(&mut self, ctx: &mut Context<Self>) {
        let Some(s) = &self.warm.settings else { return };
        let name = format!("{}-warm-{}", s.prefix, crate::vocab::random_suffix());
        self.warm.booting.insert(name.clone());
        let guard = InFlight::new(&self.warm.in_flight);
        let boot = self.backend.clone().warm_boot(name.clone());
        ctx.spawn(boot.into_actor(self).map(move |result, act, ctx| {
            act.warm.booting.remove(&name);
            match result {
                Ok(()) if act.warm.ready.len() < act.warm_target() => {
                    act.warm.failures = 0;
                    tracing::info!(provider = act.backend.pool().as_str(), warm = %name, "warm environment ready");
                    act.warm.ready.push_back((name, act.clock.now()));
                }
                Ok(()) => act.warm_discard(name, "surplus", ctx),
                Err(error) => {
                    act.warm.failures += 1;
                    let wait = BOOT_BACKOFF
                        .saturating_mul(1 << act.warm.failures.min(8))
                        .min(BOOT_BACKOFF_CAP);
                    act.warm.no_boot_before = Some(act.clock.now() + wait);
                    tracing::warn!(provider = act.backend.pool().as_str(), warm = %name, %error, retry_in = ?wait, "a warm environment failed to boot");
                    act.warm_discard(name, "failed", ctx);
                }
            }
            drop(guard);
            act.warm_gauges();
        }));
    }

    /// Removes warm environment `name`, counting why.
    fn warm_discard(&mut self, name: String, reason: &'static str, ctx: &mut Context<Self>) {
        self.metrics
            .warm
            .discarded
            .with_label_values(&[self.backend.pool().as_str(), reason])
            .inc();
        if reason != "surplus" {
            tracing::info!(provider = self.backend.pool().as_str(), warm = %name, reason, "warm environment removed");
        }
        let guard = InFlight::new(&self.warm.in_flight);
        let stop = self.backend.clone().stop(name);
        ctx.spawn(stop.into_actor(self).map(move |(), _, _| drop(guard)));
    }

    /// The periodic look: too old, failing its check or stale goes; then the refill.
    pub(super) fn warm_tick(&mut self, ctx: &mut Context<Self>) {
        let Some(max_age) = self.warm.settings.as_ref().map(|s| s.config.max_age) else {
            return;
        };
        let now = self.clock.now();
        let (old, young): (Vec<_>, Vec<_>) = std::mem::take(&mut self.warm.ready)
            .into_iter()
            .partition(|(_, at)| now.saturating_duration_since(*at) >= max_age);
        self.warm.ready = young.into();
        for (name, _) in old {
            self.warm_discard(name, "age", ctx);
        }
        for (name, _) in self.warm.ready.clone() {
            let check = self.backend.clone().warm_ready(name.clone());
            ctx.spawn(check.into_actor(self).map(move |answer, act, ctx| {
                let Err(reason) = answer else { return };
                // Still waiting (not taken by a claim meanwhile): replaced.
                let before = act.warm.ready.len();
                act.warm.ready.retain(|(n, _)| *n != name);
                if act.warm.ready.len() < before {
                    act.warm_discard(name, reason, ctx);
                    act.warm_refill(ctx);
                }
            }));
        }
        self.warm_refill(ctx);
    }

    /// Removes every warm environment (a hold, a stop); boots in flight remove theirs when
    /// they end.
    pub(super) fn warm_clear(&mut self, ctx: &mut Context<Self>) {
        for (name, _) in std::mem::take(&mut self.warm.ready) {
            self.warm_discard(name, "surplus", ctx);
        }
        self.warm_gauges();
    }

    fn warm_gauges(&self) {
        let Some(settings) = &self.warm.settings else {
            return;
        };
        let view = WarmView {
            available: self.warm.ready.len(),
            booting: self.warm.booting.len(),
            target: self.warm_target(),
        };
        if let Some(to) = settings
            .report
            .as_ref()
            .and_then(actix::WeakRecipient::upgrade)
        {
            to.do_send(WarmStatus {
                provider: self.backend.pool().clone(),
                view,
            });
        }
        let pool = self.backend.pool().as_str();
        let m = &self.metrics.warm;
        m.available
            .with_label_values(&[pool])
            .set(i64::try_from(self.warm.ready.len()).unwrap_or(i64::MAX));
        m.booting
            .with_label_values(&[pool])
            .set(i64::try_from(self.warm.booting.len()).unwrap_or(i64::MAX));
    }

    /// Starts the periodic look, when the pool keeps anything warm.
    pub(super) fn warm_start_ticking(&mut self, ctx: &mut Context<Self>) {
        if self.warm.enabled() {
            ctx.run_interval(WARM_TICK, |act, ctx| act.warm_tick(ctx));
        }
    }
}

impl<B: Backend> Handler<WarmHold> for ProvisionerSupervisor<B> {
    type Result = actix::ResponseFuture<()>;

    fn handle(&mut self, WarmHold(hold): WarmHold, ctx: &mut Context<Self>) -> Self::Result {
        self.warm.held = hold;
        if hold {
            self.warm_clear(ctx);
        } else {
            self.warm_refill(ctx);
        }
        let in_flight = self.warm.in_flight.clone();
        Box::pin(async move {
            let until = tokio::time::Instant::now() + HOLD_WAIT;
            while hold && in_flight.get() > 0 && tokio::time::Instant::now() < until {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
    }
}
