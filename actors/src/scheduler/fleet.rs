//! The scheduler shell's claim call, and its part in fleet mode: a claim asks the cluster
//! ledger first (the core hands it over only after the offer delay that lets the host that
//! received the delivery, then the fleet's most specific, least loaded pool ask first; a host
//! that hears the job granted meanwhile never asks) and calls GitHub only when this host holds
//! the job; the fleet's events and
//! releases come in as [`FleetEvent`]s; the host's load goes out with its lease.

use actix::{ActorFutureExt, AsyncContext, Context, Handler, MessageResult, WrapFuture};

use super::{SchedulerActor, core::ClaimRequest};
use crate::{
    cluster::{Acquire, Load, PACED_LEDGER, actor::GetLoad, stream::FleetEvent},
    config::PoolName,
    github::{GithubError, actor::GenerateJitConfig},
    job::{JobAction, JobInfo, JobKey},
};

/// How long a claim waits when the ledger did not answer.
const LEDGER_RETRY: std::time::Duration = std::time::Duration::from_secs(2);

impl SchedulerActor {
    /// A claim: in fleet mode the ledger decides first whether this host may make it.
    pub(super) fn claim(
        &mut self,
        key: JobKey,
        provider: PoolName,
        request: ClaimRequest,
        ctx: &mut Context<Self>,
    ) {
        // A registered warm runner is made for no job: there is nothing to ask the ledger.
        let Some(ledger) = self.deps.ledger.clone().filter(|_| !key.is_warm()) else {
            self.call_github_claim(key, provider, request, ctx);
            return;
        };
        // The core waited out the offer delay before it asked for this claim.
        self.ask_ledger(ledger, key, provider, request, ctx);
    }

    /// Asks the ledger whether this host may claim; calls GitHub if granted.
    fn ask_ledger(
        &mut self,
        ledger: crate::cluster::Ledger,
        key: JobKey,
        provider: PoolName,
        request: ClaimRequest,
        ctx: &mut Context<Self>,
    ) {
        let info = self.core.view().job_info(&key).unwrap_or_else(|| JobInfo {
            key: key.clone(),
            ..JobInfo::default()
        });
        self.calls_in_flight += 1;
        self.claims_in_flight += 1;
        ctx.spawn(async move { ledger.acquire(&info).await }.into_actor(self).map(move |answer, act, ctx| {
            act.calls_in_flight -= 1;
            act.claims_in_flight -= 1;
            let answer = answer.unwrap_or_else(|e| {
                tracing::warn!(job_id = key.job_id, error = %e, "cannot ask the cluster ledger for a claim");
                Acquire::Paced {
                    wait: LEDGER_RETRY,
                    why: PACED_LEDGER,
                }
            });
            if answer == Acquire::Granted {
                act.call_github_claim(key, provider, request, ctx);
            } else {
                let fx = act
                    .core
                    .on_acquire_refused(key, provider, answer, act.clock.tick());
                act.run(fx, ctx);
            }
        }));
    }

    /// generate-jitconfig through the GitHub actor; the answer goes to the core.
    fn call_github_claim(
        &mut self,
        key: JobKey,
        provider: PoolName,
        request: ClaimRequest,
        ctx: &mut Context<Self>,
    ) {
        // Scale-set mode: the runner is registered in the pool's scale set.
        let claim = match &self.deps.scalesets {
            None => Some(self.github(&key.owner).claim.clone()),
            Some(listeners) => listeners
                .get(&(key.owner.to_string(), provider.clone()))
                .cloned(),
        };
        let request = GenerateJitConfig {
            repo: request.repo,
            name_base: request.name_base,
            labels: request.labels,
        };
        let fut = async move {
            let Some(claim) = claim else {
                return Err(GithubError::Network {
                    endpoint: "actions_generate_jitconfig",
                    detail: "the pool's scale-set listener is not running".into(),
                });
            };
            claim.send(request).await.unwrap_or_else(|e| {
                Err(GithubError::Network {
                    endpoint: "generate_jitconfig",
                    detail: format!("github actor unavailable: {e}"),
                })
            })
        };
        self.calls_in_flight += 1;
        self.claims_in_flight += 1;
        ctx.spawn(fut.into_actor(self).map(move |result, act, ctx| {
            act.calls_in_flight -= 1;
            act.claims_in_flight -= 1;
            let fx = act
                .core
                .on_claim_result(key, provider, result, act.clock.tick());
            act.run(fx, ctx);
        }));
    }

    /// Gives the jobs this host holds and has no runner for back to the fleet (a cordon or a
    /// drain), so another host takes them: after the ledger has every change made before.
    pub(super) fn release_to_fleet(&mut self) {
        if let Some(mirror) = &self.mirror {
            mirror.send(&[], true);
        }
    }
}

impl Handler<FleetEvent> for SchedulerActor {
    type Result = ();

    fn handle(&mut self, m: FleetEvent, ctx: &mut Context<Self>) {
        let now = self.clock.tick();
        let fx = match m {
            FleetEvent::Job { action, info, .. } => self.core.on_fleet_job_event(action, info, now),
            FleetEvent::Held { key, host } => self.core.on_held_elsewhere(key, host, now),
            FleetEvent::Open(info) => {
                self.core
                    .on_job_event(JobAction::Queued, info, None, now.mono, now)
            }
            FleetEvent::Released { job, by } => self.core.readmit(job, by, now),
        };
        self.run(fx, ctx);
    }
}

impl Handler<GetLoad> for SchedulerActor {
    type Result = MessageResult<GetLoad>;

    fn handle(&mut self, _: GetLoad, _: &mut Context<Self>) -> MessageResult<GetLoad> {
        let load: Load = self.core.load();
        MessageResult(load)
    }
}
