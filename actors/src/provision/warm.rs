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

use std::{cell::Cell, rc::Rc, time::Duration};

use actix::{ActorFutureExt, AsyncContext, Context, Handler, Message, WrapFuture};

use super::{
    Backend, ProvisionerSupervisor,
    warm_keeping::{Booted, WarmKeeping},
};
use crate::config::WarmConfig;

/// How often a pool's warm environments are checked and its target read again.
pub const WARM_TICK: Duration = Duration::from_secs(5);
/// How long a hold waits for the removals (and boots in flight) to finish.
const HOLD_WAIT: Duration = Duration::from_secs(60);

pub use ephemer_decide::provision::WarmView;

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

/// A pool's warm environments: the decisions ([`WarmKeeping`]) and where they are carried out.
#[derive(Debug, Default)]
pub struct WarmPool {
    keeping: WarmKeeping,
    /// What the pool's warm environments are named after.
    prefix: String,
    /// Where the pool's [`WarmStatus`] goes.
    report: Option<actix::WeakRecipient<WarmStatus>>,
    /// Boots and removals in flight (a hold waits for them).
    in_flight: Rc<Cell<usize>>,
}

impl WarmPool {
    /// The warm pool of `settings` (nothing warm when `None` or a zero count).
    pub fn new(settings: Option<WarmSettings>) -> Self {
        let Some(s) = settings else {
            return WarmPool::default();
        };
        WarmPool {
            keeping: WarmKeeping::new(Some(s.config), s.max),
            prefix: s.prefix,
            report: s.report,
            in_flight: Rc::default(),
        }
    }

    /// Whether the pool keeps anything warm at any time.
    pub fn enabled(&self) -> bool {
        self.keeping.enabled()
    }

    /// Environments waiting for a claim.
    pub fn available(&self) -> usize {
        self.keeping.available()
    }

    /// Takes every waiting environment's name (the supervisor stops: it removes them).
    pub(super) fn drain_ready(&mut self) -> Vec<String> {
        self.keeping.clear()
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
        let taken = self.warm.keeping.take();
        self.metrics
            .warm
            .claims
            .with_label_values(&[pool, if taken.is_some() { "hit" } else { "miss" }])
            .inc();
        self.warm_gauges();
        taken
    }

    /// The pool's target now ([`WarmKeeping::target`]).
    fn warm_target(&self) -> usize {
        self.warm
            .keeping
            .target(self.clock.unix(), self.accepting, self.live.len())
    }

    /// Boots what the target lacks; removes what is beyond it (the oldest first).
    pub(super) fn warm_refill(&mut self, ctx: &mut Context<Self>) {
        if !self.warm.enabled() {
            return;
        }
        let refill = self
            .warm
            .keeping
            .refill(self.warm_target(), self.clock.now());
        for name in refill.surplus {
            self.warm_discard(name, "surplus", ctx);
        }
        for _ in 0..refill.boot {
            self.warm_boot(ctx);
        }
        self.warm_gauges();
    }

    fn warm_boot(&mut self, ctx: &mut Context<Self>) {
        let name = format!(
            "{}-warm-{}",
            self.warm.prefix,
            crate::vocab::random_suffix()
        );
        self.warm.keeping.boot_started(name.clone());
        let guard = InFlight::new(&self.warm.in_flight);
        let boot = self.backend.clone().warm_boot(name.clone());
        ctx.spawn(boot.into_actor(self).map(move |result, act, ctx| {
            let (target, now) = (act.warm_target(), act.clock.now());
            let pool = act.backend.pool().clone();
            match (act.warm.keeping.boot_ended(&name, result.is_ok(), target, now), result) {
                (Booted::Ready, _) => {
                    tracing::info!(provider = pool.as_str(), warm = %name, "warm environment ready");
                }
                (Booted::Surplus, _) => act.warm_discard(name, "surplus", ctx),
                (Booted::Failed { wait }, result) => {
                    let error = result.err().map(|e| e.to_string()).unwrap_or_default();
                    tracing::warn!(provider = pool.as_str(), warm = %name, %error, retry_in = ?wait, "a warm environment failed to boot");
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
        if !self.warm.enabled() {
            return;
        }
        for name in self.warm.keeping.expire(self.clock.now()) {
            self.warm_discard(name, "age", ctx);
        }
        for name in self.warm.keeping.waiting() {
            let check = self.backend.clone().warm_ready(name.clone());
            ctx.spawn(check.into_actor(self).map(move |answer, act, ctx| {
                let Err(reason) = answer else { return };
                // Still waiting (not taken by a claim meanwhile): replaced.
                if act.warm.keeping.withdraw(&name) {
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
        for name in self.warm.keeping.clear() {
            self.warm_discard(name, "surplus", ctx);
        }
        self.warm_gauges();
    }

    fn warm_gauges(&self) {
        if !self.warm.enabled() {
            return;
        }
        let view = WarmView {
            available: self.warm.keeping.available(),
            booting: self.warm.keeping.booting(),
            target: self.warm_target(),
        };
        if let Some(to) = self
            .warm
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
            .set(i64::try_from(view.available).unwrap_or(i64::MAX));
        m.booting
            .with_label_values(&[pool])
            .set(i64::try_from(view.booting).unwrap_or(i64::MAX));
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
        for name in self.warm.keeping.hold(hold) {
            self.warm_discard(name, "surplus", ctx);
        }
        if !hold {
            self.warm_refill(ctx);
        }
        self.warm_gauges();
        let in_flight = self.warm.in_flight.clone();
        Box::pin(async move {
            let until = tokio::time::Instant::now() + HOLD_WAIT;
            while hold && in_flight.get() > 0 && tokio::time::Instant::now() < until {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
    }
}
