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

use super::{DeadRegistration, Ledger, Load, RunnerIdentity, stream::FleetEvent};
use crate::{
    github::actor::{DeleteRunner, ListRunners},
    rate::{RateReading, SubscribeRate},
    vocab::RateSnapshot,
};

/// How often `ephemerd_ledger_up` is brought up to date.
const LEDGER_UP_EVERY: Duration = Duration::from_millis(250);
/// How often old rows are pruned.
const PRUNE_EVERY: Duration = Duration::from_secs(300);

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
    /// Where runners are registered, per GitHub target (the first serves an owner no
    /// target has).
    pub targets: Vec<FleetTarget>,
    /// This host's runner names.
    pub identity: RunnerIdentity,
    /// Rate readings of the targets' credentials (shared with the fleet when low).
    pub rate: Option<(Recipient<SubscribeRate>, Vec<String>)>,
    /// `ephemerd_ledger_up`: whether the ledger's last operation succeeded, kept current by
    /// the actor (it stops with it).
    pub ledger_up: prometheus::IntGauge,
    /// `ephemerd_ledger_round_trips_total`, brought up to the ledger's own count with
    /// `ledger_up`.
    pub round_trips: prometheus::IntCounter,
}

/// One GitHub target, as the fleet actor reaches it.
#[derive(Debug, Clone)]
pub struct FleetTarget {
    /// Its owner (lowercased).
    pub owner: String,
    /// Deletes a dead host's registrations.
    pub delete: Recipient<DeleteRunner>,
    /// Lists registrations, to find a dead host's that the ledger never heard of (made just
    /// before it died).
    pub list: Recipient<ListRunners>,
    /// Where runners are registered: the repos of repo-level runners, else `[None]` (the org).
    pub scopes: Vec<Option<String>>,
}

/// The fleet actor.
#[derive(Debug)]
pub struct FleetActor {
    ledger: Ledger,
    wiring: FleetWiring,
    beating: bool,
    /// Per credential and resource, whether the last reading written was low.
    low: std::collections::HashMap<(String, String), bool>,
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
        let identity = self.wiring.identity.clone();
        let fut = async move {
            let load = load.send(GetLoad).await.unwrap_or_default();
            ledger
                .heartbeat(
                    &load.pools,
                    load.used as i32,
                    load.capacity as i32,
                    &identity,
                )
                .await?;
            let registrations = ledger.reap().await?;
            let hosts = ledger.dead_hosts_to_sweep().await?;
            Ok::<_, super::LedgerError>((registrations, hosts))
        };
        ctx.spawn(fut.into_actor(self).map(|result, act, ctx| {
            act.beating = false;
            match result {
                Ok((registrations, hosts)) => {
                    for registration in registrations {
                        act.delete(registration, ctx);
                    }
                    for (host, identity) in hosts {
                        act.sweep(host, identity, ctx);
                    }
                }
                Err(e) => tracing::warn!(error = %e, "cluster heartbeat failed"),
            }
        }));
    }

    /// Looks on GitHub for a dead host's runners (by the shape of their names) and deletes
    /// the idle ones; a busy one is left to finish its job. When none is left at all, the
    /// host is forgotten.
    fn sweep(&mut self, host: String, identity: RunnerIdentity, ctx: &mut Context<Self>) {
        if identity.install_id.is_empty() {
            return;
        }
        let scopes: Vec<_> = self
            .wiring
            .targets
            .iter()
            .flat_map(|t| {
                t.scopes
                    .iter()
                    .map(|repo| (t.list.clone(), t.delete.clone(), repo.clone()))
            })
            .collect();
        let ledger = self.ledger.clone();
        let prefix = format!("{}-", identity.name_prefix);
        ctx.spawn(
            async move {
                let mut left = 0usize;
                for (list, delete, repo) in scopes {
                    let listed = list
                        .send(ListRunners {
                            repo: repo.clone(),
                            name_prefix: prefix.clone(),
                        })
                        .await;
                    let Ok(Ok(runners)) = listed else {
                        tracing::warn!(%host, repo = repo.as_deref().unwrap_or("(the owner's runners)"), "cannot list a dead host's runners; tried again later");
                        return;
                    };
                    for r in runners.into_iter().filter(|r| {
                        crate::vocab::names_install_runner(
                            &r.name,
                            &identity.name_prefix,
                            &identity.install_id,
                        )
                    }) {
                        left += 1;
                        if r.busy {
                            continue;
                        }
                        let deleted = delete
                            .send(DeleteRunner {
                                repo: repo.clone(),
                                runner_id: r.id,
                            })
                            .await;
                        if matches!(deleted, Ok(Ok(()))) {
                            left -= 1;
                            tracing::info!(runner = %r.name, %host, "deleted a dead host's idle runner");
                            let _ = ledger.forget_registration(&r.name).await;
                        }
                    }
                }
                if left == 0 {
                    tracing::info!(%host, "no runner of the dead host is left; forgetting it");
                    if let Err(e) = ledger.forget_host(&host).await {
                        tracing::warn!(error = %e, %host, "cannot forget a dead host");
                    }
                }
            }
            .into_actor(self),
        );
    }

    fn delete(&mut self, r: DeadRegistration, ctx: &mut Context<Self>) {
        let ledger = self.ledger.clone();
        let targets = &self.wiring.targets;
        let Some(target) = targets
            .iter()
            .find(|t| t.owner.eq_ignore_ascii_case(&r.owner))
            .or(targets.first())
        else {
            return;
        };
        let delete = target.delete.clone();
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
        if let Some((subscribe, credentials)) = &self.wiring.rate {
            let to = ctx.address().downgrade().recipient();
            SubscribeRate::each(subscribe, credentials, &to);
        }
        self.beat(ctx);
        ctx.run_interval(LEDGER_UP_EVERY, |act, _| {
            let up = act.ledger.health().is_up();
            act.wiring.ledger_up.set(i64::from(up));
            let trips = act.ledger.round_trips();
            let counted = act.wiring.round_trips.get();
            act.wiring.round_trips.inc_by(trips.saturating_sub(counted));
        });
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
        let key = (m.credential.clone(), resource.clone());
        let was_low = self.low.get(&key).copied().unwrap_or(false);
        let Some(low) = worth_sharing(&m.reading, was_low) else {
            return;
        };
        self.low.insert(key, low);
        let ledger = self.ledger.clone();
        ctx.spawn(
            async move {
                if let Err(e) = ledger.put_rate(&m.credential, &resource, &m.reading).await {
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
