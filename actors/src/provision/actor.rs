//! `ProvisionerActor`: the shell every provider shares. It starts runners through its
//! [`Backend`], watches each until it exits, enforces `job_timeout`, tears down on request, and
//! reports every step as a [`RunnerEvent`]. It holds no job knowledge and never calls GitHub.
//!
//! When it dies (a panic included) its `stopped()` tells its supervisor, which cleans up the
//! runners it had and applies the restart policy. `stopped()` only sends; it cannot panic.

use std::{collections::HashMap, time::Duration};

use actix::{
    Actor, ActorFutureExt, AsyncContext, Context, Handler, Message, SpawnHandle, WeakRecipient,
    WrapFuture,
};

use super::{Backend, ExitReason, Provision, RunnerEvent, RunnerEventKind, Teardown};

/// A provisioner actor ended (normally or by a panic).
#[derive(Debug, Clone, Copy, Message)]
#[rtype(result = "()")]
pub struct ChildStopped {
    /// Which incarnation.
    pub generation: u64,
    /// Whether it died by a panic.
    pub panicked: bool,
}

/// Watch runners an earlier run started (from the runner ledger), or report them lost.
#[derive(Debug, Clone, Message)]
#[rtype(result = "()")]
pub struct Adopt {
    /// Runner names.
    pub names: Vec<String>,
}

#[derive(Debug)]
struct Live {
    reason: Option<ExitReason>,
    timeout: Option<SpawnHandle>,
}

/// One incarnation of a provider's provisioner, over its backend `B`.
#[derive(Debug)]
pub struct ProvisionerActor<B: Backend> {
    backend: B,
    /// Weak: the supervisor owns this actor, not the other way round.
    events: WeakRecipient<RunnerEvent>,
    stopped_to: WeakRecipient<ChildStopped>,
    generation: u64,
    job_timeout: Option<Duration>,
    runners: HashMap<String, Live>,
}

impl<B: Backend> ProvisionerActor<B> {
    /// A provisioner reporting runner events to `events` and its own end to `stopped_to`.
    pub fn new(
        backend: B,
        events: WeakRecipient<RunnerEvent>,
        stopped_to: WeakRecipient<ChildStopped>,
        generation: u64,
        job_timeout: Option<Duration>,
    ) -> Self {
        ProvisionerActor {
            backend,
            events,
            stopped_to,
            generation,
            job_timeout,
            runners: HashMap::new(),
        }
    }

    fn report(&self, name: &str, kind: RunnerEventKind) {
        let Some(events) = self.events.upgrade() else {
            return;
        };
        events.do_send(RunnerEvent {
            provider: self.backend.pool().clone(),
            name: name.to_string(),
            kind,
        });
    }

    /// Gone without an exit code of its own, with what its teardown could not remove.
    fn report_gone(&self, name: &str, reason: ExitReason) {
        self.report(
            name,
            RunnerEventKind::Exited {
                code: None,
                reason,
                detail: self.backend.left_behind(name),
            },
        );
    }

    /// The runner exited: remove what is left of it, then report.
    fn on_exit(&mut self, name: String, code: Option<i32>, ctx: &mut Context<Self>) {
        let live = self.runners.remove(&name);
        let reason = live
            .as_ref()
            .and_then(|l| l.reason)
            .unwrap_or(ExitReason::Exited);
        if let Some(h) = live.and_then(|l| l.timeout) {
            ctx.cancel_future(h);
        }
        let cleanup = self.backend.clone().stop(name.clone());
        ctx.spawn(cleanup.into_actor(self).map(move |(), act, _| {
            tracing::info!(provider = act.backend.pool().as_str(), provisioner = act.backend.kind().provisioner_name(), runner = %name, reason = reason.words(), code, "runner finished and cleaned up");
            // How the environment ended, where it ended by itself (a teardown's end is the
            // daemon's doing, said by the reason).
            let ended = act
                .backend
                .end_words(&name)
                .filter(|_| reason == ExitReason::Exited);
            if let Some(seen) = act.backend.egress_met(&name) {
                act.report(&name, RunnerEventKind::Egress { seen });
            }
            let left = act.backend.left_behind(&name);
            let detail = match (ended, left) {
                (Some(ended), Some(left)) => Some(format!("{ended}; {left}")),
                (ended, left) => ended.or(left),
            };
            act.report(
                &name,
                RunnerEventKind::Exited {
                    code,
                    reason,
                    detail,
                },
            );
        }));
    }

    /// Stops a live runner; its watcher reports the exit.
    fn kill(&mut self, name: &str, reason: ExitReason, ctx: &mut Context<Self>) {
        if let Some(live) = self.runners.get_mut(name) {
            live.reason.get_or_insert(reason);
        }
        ctx.spawn(self.backend.clone().stop(name.to_string()).into_actor(self));
    }
}

impl<B: Backend> Actor for ProvisionerActor<B> {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        ctx.set_mailbox_capacity(4096);
    }

    fn stopped(&mut self, _: &mut Self::Context) {
        // Runs during a panic's unwinding too; only send, never panic here.
        let Some(parent) = self.stopped_to.upgrade() else {
            return;
        };
        parent.do_send(ChildStopped {
            generation: self.generation,
            panicked: std::thread::panicking(),
        });
    }
}

impl<B: Backend> Handler<crate::lifecycle::Stop> for ProvisionerActor<B> {
    type Result = ();

    fn handle(&mut self, _: crate::lifecycle::Stop, ctx: &mut Self::Context) {
        actix::ActorContext::stop(ctx);
    }
}

impl<B: Backend> Handler<crate::lifecycle::Crash> for ProvisionerActor<B> {
    type Result = ();

    fn handle(&mut self, _: crate::lifecycle::Crash, _: &mut Self::Context) {
        panic!("ProvisionerActor crashed on request (a fault test)");
    }
}

/// Start a runner in a warm environment (booted before the claim) the supervisor hands over.
#[derive(Debug, Clone, Message)]
#[rtype(result = "()")]
pub struct StartIn {
    /// The runner.
    pub spec: super::RunnerSpec,
    /// When its record is durable ([`super::Provision::durable`]).
    pub durable: super::Durable,
    /// The warm environment's name.
    pub warm: String,
}

impl<B: Backend> Handler<Provision> for ProvisionerActor<B> {
    type Result = ();

    fn handle(&mut self, m: Provision, ctx: &mut Context<Self>) {
        self.launch(m.spec, m.durable, None, ctx);
    }
}

impl<B: Backend> Handler<StartIn> for ProvisionerActor<B> {
    type Result = ();

    fn handle(&mut self, m: StartIn, ctx: &mut Context<Self>) {
        self.launch(m.spec, m.durable, Some(m.warm), ctx);
    }
}

impl<B: Backend> ProvisionerActor<B> {
    /// Starts `spec`'s runner: in warm environment `warm` when one is given (a warm start that
    /// fails removes the environment and starts the runner the cold way), else in a new one.
    fn launch(
        &mut self,
        spec: super::RunnerSpec,
        durable: super::Durable,
        warm: Option<String>,
        ctx: &mut Context<Self>,
    ) {
        let name = spec.name.clone();
        self.runners.insert(
            name.clone(),
            Live {
                reason: None,
                timeout: None,
            },
        );
        let backend = self.backend.clone();
        let start = async move {
            durable.wait().await;
            if let Some(warm) = warm {
                match backend.clone().warm_start(warm.clone(), spec.clone()).await {
                    Ok(running) => return Ok((running, true)),
                    Err(error) => {
                        tracing::warn!(provider = backend.pool().as_str(), runner = %spec.name, warm = %warm, %error, "the warm environment failed at the claim; starting the runner in a new one");
                        backend.clone().stop(warm).await;
                    }
                }
            }
            backend.start(spec).await.map(|running| (running, false))
        };
        ctx.spawn(start.into_actor(self).map(move |result, act, ctx| match result {
            Ok((running, warm)) => {
                let torn_down_while_starting = act.runners.get(&name).and_then(|l| l.reason).is_some();
                act.report(&name, RunnerEventKind::Started { warm });
                if let Some(limit) = act.job_timeout {
                    let n = name.clone();
                    let h = ctx.run_later(limit, move |act, ctx| {
                        tracing::warn!(runner = %n, "job_timeout reached; killing the runner");
                        act.kill(&n, ExitReason::TimedOut, ctx);
                    });
                    if let Some(live) = act.runners.get_mut(&name) {
                        live.timeout = Some(h);
                    }
                }
                if torn_down_while_starting {
                    ctx.spawn(act.backend.clone().stop(name.clone()).into_actor(act));
                }
                let n = name.clone();
                ctx.spawn(running.exited.into_actor(act).map(move |code, act, ctx| act.on_exit(n, code, ctx)));
            }
            Err(error) => {
                // Torn down while it started: the start failed because its environment was
                // being removed (the gate's pipe broken, the directory gone), which says
                // nothing about the host. Reported as the teardown it was, it never takes the
                // pool down.
                if let Some(reason) = act.runners.remove(&name).and_then(|l| l.reason) {
                    tracing::info!(provider = act.backend.pool().as_str(), runner = %name, %error, "runner torn down while it started");
                    let cleanup = act.backend.clone().stop(name.clone());
                    ctx.spawn(cleanup.into_actor(act).map(move |(), act, _| {
                        act.report_gone(&name, reason);
                    }));
                    return;
                }
                tracing::warn!(provider = act.backend.pool().as_str(), provisioner = act.backend.kind().provisioner_name(), runner = %name, %error, "runner environment failed to start");
                let cleanup = act.backend.clone().stop(name.clone());
                ctx.spawn(cleanup.into_actor(act).map(move |(), act, _| {
                    act.report(&name, RunnerEventKind::Failed { error });
                }));
            }
        }));
    }
}

impl<B: Backend> Handler<Adopt> for ProvisionerActor<B> {
    type Result = ();

    fn handle(&mut self, m: Adopt, ctx: &mut Context<Self>) {
        for name in m.names {
            self.runners.insert(
                name.clone(),
                Live {
                    reason: None,
                    timeout: None,
                },
            );
            let adopt = self.backend.clone().adopt(name.clone());
            ctx.spawn(
                adopt
                    .into_actor(self)
                    .map(move |found, act, ctx| match found {
                        Some(running) => {
                            let n = name.clone();
                            ctx.spawn(
                                running
                                    .exited
                                    .into_actor(act)
                                    .map(move |code, act, ctx| act.on_exit(n, code, ctx)),
                            );
                        }
                        None => {
                            act.runners.remove(&name);
                            let cleanup = act.backend.clone().stop(name.clone());
                            ctx.spawn(cleanup.into_actor(act).map(move |(), act, _| {
                        tracing::info!(runner = %name, "runner from before the restart is gone");
                        act.report_gone(&name, ExitReason::Lost);
                    }));
                        }
                    }),
            );
        }
    }
}

impl<B: Backend> Handler<Teardown> for ProvisionerActor<B> {
    type Result = ();

    fn handle(&mut self, m: Teardown, ctx: &mut Context<Self>) {
        tracing::info!(provider = self.backend.pool().as_str(), provisioner = self.backend.kind().provisioner_name(), runner = %m.name, reason = m.reason, "tearing down");
        if self.runners.contains_key(&m.name) {
            self.kill(&m.name, ExitReason::TornDown, ctx);
            return;
        }
        // Not ours (any more): make sure nothing is left, and say so, so no slot leaks.
        let name = m.name;
        let cleanup = self.backend.clone().stop(name.clone());
        ctx.spawn(cleanup.into_actor(self).map(move |(), act, _| {
            act.report_gone(&name, ExitReason::TornDown);
        }));
    }
}
