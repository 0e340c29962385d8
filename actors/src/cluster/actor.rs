//! `FleetActor`: this host's citizenship in the fleet. On a heartbeat (a third of
//! `cluster.lease`) it renews the lease with what the host reports (pools, load), reaps the
//! hosts whose lease expired (their unstarted jobs go back to `queued` for every host to hear;
//! their registrations are deleted on GitHub, a busy one left to finish its job), and prunes
//! old rows now and then. It also runs the event stream ([`super::stream::listen`]) and writes
//! this credential's rate readings when the budget runs low, so every host's claim decision
//! sees them.

use std::time::Duration;

use actix::{
    Actor, ActorFutureExt, AsyncContext, Context, Handler, Message, Recipient, WrapFuture,
};

use super::{DeadRegistration, Ledger, stream::FleetEvent};
use crate::{
    github::actor::DeleteRunner,
    rate::{RateReading, SubscribeRate},
    vocab::RateSnapshot,
};

/// How often old rows are pruned.
const PRUNE_EVERY: Duration = Duration::from_secs(300);

/// What this host reports with its lease.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Load {
    /// Its pools: name, kind, labels, slots, up.
    pub pools: serde_json::Value,
    /// Runners it has.
    pub used: usize,
    /// Its slots.
    pub capacity: usize,
}

/// Ask the scheduler for this host's [`Load`].
#[derive(Debug, Clone, Copy, Message)]
#[rtype(result = "Load")]
pub struct GetLoad;

/// Who the fleet actor talks to.
#[derive(Debug, Clone)]
pub struct FleetWiring {
    /// The scheduler: fleet events in, load out.
    pub events: Recipient<FleetEvent>,
    /// See `events`.
    pub load: Recipient<GetLoad>,
    /// Deletes a dead host's registrations.
    pub delete: Recipient<DeleteRunner>,
    /// Rate readings of this host's credential.
    pub rate: Option<(Recipient<SubscribeRate>, String)>,
}

/// The fleet actor.
#[derive(Debug)]
pub struct FleetActor {
    ledger: Ledger,
    wiring: FleetWiring,
    beating: bool,
    /// Per resource, whether the last reading written was low.
    low: std::collections::HashMap<String, bool>,
}

impl FleetActor {
    /// A fleet actor over `ledger`.
    pub fn new(ledger: Ledger, wiring: FleetWiring) -> Self {
        FleetActor {
            ledger,
            wiring,
            beating: false,
            low: Default::default(),
        }
    }

    fn beat(&mut self, ctx: &mut Context<Self>) {
        if self.beating {
            return;
        }
        self.beating = true;
        let ledger = self.ledger.clone();
        let load = self.wiring.load.clone();
        let fut = async move {
            let load = load.send(GetLoad).await.unwrap_or_default();
            ledger
                .heartbeat(&load.pools, load.used as i32, load.capacity as i32)
                .await?;
            ledger.reap().await
        };
        ctx.spawn(fut.into_actor(self).map(|result, act, ctx| {
            act.beating = false;
            match result {
                Ok(dead) => {
                    for registration in dead {
                        act.delete(registration, ctx);
                    }
                }
                Err(e) => tracing::warn!(error = %e, "cluster heartbeat failed"),
            }
        }));
    }

    fn delete(&mut self, r: DeadRegistration, ctx: &mut Context<Self>) {
        let ledger = self.ledger.clone();
        let delete = self.wiring.delete.clone();
        ctx.spawn(
            async move {
                let answer = delete
                    .send(DeleteRunner {
                        repo: r.repo.clone(),
                        runner_id: r.runner_id,
                    })
                    .await;
                match answer {
                    Ok(Ok(())) => {
                        tracing::info!(runner = %r.name, host = %r.host, "deleted a dead host's registration");
                        if let Err(e) = ledger.forget_registration(&r.name).await {
                            tracing::warn!(error = %e, runner = %r.name, "cannot forget a deleted registration");
                        }
                    }
                    Ok(Err(e)) if e.is_runner_busy() => tracing::info!(
                        runner = %r.name, host = %r.host,
                        "a dead host's runner is running a job; GitHub finishes it, tried again later"
                    ),
                    Ok(Err(e)) => tracing::warn!(error = %e, runner = %r.name, "cannot delete a dead host's registration; tried again later"),
                    Err(e) => tracing::warn!(error = %e, "the GitHub actor is gone"),
                }
            }
            .into_actor(self),
        );
    }
}

impl Actor for FleetActor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        ctx.spawn(
            super::stream::listen(self.ledger.clone(), self.wiring.events.clone()).into_actor(self),
        );
        if let Some((subscribe, credential)) = &self.wiring.rate {
            let _ = subscribe.try_send(SubscribeRate {
                credential: credential.clone(),
                to: ctx.address().downgrade().recipient(),
            });
        }
        self.beat(ctx);
        let every = (self.ledger.lease() / 3).max(Duration::from_millis(500));
        ctx.run_interval(every, |act, ctx| act.beat(ctx));
        ctx.run_interval(PRUNE_EVERY, |act, ctx| {
            let ledger = act.ledger.clone();
            ctx.spawn(
                async move {
                    if let Err(e) = ledger.prune().await {
                        tracing::warn!(error = %e, "cannot prune the cluster ledger");
                    }
                }
                .into_actor(act),
            );
        });
    }
}

crate::stop_on_request!(FleetActor);

/// A reading is worth sharing when it is low (under a tenth of its limit, or empty), or when
/// it is the first good one after a low one: that is when another host's claim decision
/// changes. Readings in between cost nothing.
fn worth_sharing(reading: &RateSnapshot, was_low: bool) -> Option<bool> {
    let remaining = reading.remaining?;
    let low = match reading.limit {
        Some(limit) if limit > 0 => remaining.saturating_mul(10) < limit,
        _ => remaining == 0,
    };
    (low || was_low).then_some(low)
}

impl Handler<RateReading> for FleetActor {
    type Result = ();

    fn handle(&mut self, m: RateReading, ctx: &mut Context<Self>) {
        let resource = m.bucket.as_str().to_string();
        let was_low = self.low.get(&resource).copied().unwrap_or(false);
        let Some(low) = worth_sharing(&m.reading, was_low) else {
            return;
        };
        self.low.insert(resource.clone(), low);
        let ledger = self.ledger.clone();
        ctx.spawn(
            async move {
                if let Err(e) = ledger.put_rate(&resource, &m.reading).await {
                    tracing::warn!(error = %e, "cannot share a rate reading with the fleet");
                }
            }
            .into_actor(self),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_low_readings_and_the_recovery_are_shared() {
        let r = |remaining, limit| RateSnapshot {
            remaining: Some(remaining),
            limit: Some(limit),
            ..RateSnapshot::default()
        };
        assert_eq!(worth_sharing(&r(5000, 5000), false), None);
        assert_eq!(worth_sharing(&r(400, 5000), false), Some(true));
        assert_eq!(worth_sharing(&r(0, 5000), true), Some(true));
        assert_eq!(worth_sharing(&r(5000, 5000), true), Some(false));
    }
}
