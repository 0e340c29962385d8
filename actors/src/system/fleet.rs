//! The fleet wing (fleet mode, `[cluster]`): the `FleetActor` that holds this host's lease,
//! reaps dead hosts' registrations, listens to the fleet's event stream, shares low rate
//! readings, and mirrors whether the ledger answers into `ephemerd_ledger_up`. Everything it
//! runs is the actor's (its intervals, its stream), so it stops with the actor.

use actix::{Actor, Addr};

use super::github::GithubWing;
use crate::{
    cluster::{
        FleetActor, Ledger, RunnerIdentity,
        actor::{FleetTarget, FleetWiring},
    },
    config::{Config, Target},
    metrics::Metrics,
    scheduler::SchedulerActor,
};

/// Starts the fleet actor of `ledger`.
pub(super) fn start(
    ledger: Ledger,
    config: &Config,
    targets: &[Target],
    install_id: &str,
    scheduler: &Addr<SchedulerActor>,
    github: &GithubWing,
    metrics: &Metrics,
) -> Addr<FleetActor> {
    FleetActor::new(
        ledger,
        FleetWiring {
            events: scheduler.clone().recipient(),
            load: scheduler.clone().recipient(),
            targets: targets
                .iter()
                .zip(&github.actors)
                .map(|(t, (_, github))| FleetTarget {
                    owner: t.github.owner.to_ascii_lowercase(),
                    delete: github.clone().recipient(),
                    list: github.clone().recipient(),
                    scopes: crate::scheduler::target_of(t).scopes(),
                })
                .collect(),
            identity: RunnerIdentity {
                name_prefix: config.runner.name_prefix.clone(),
                install_id: install_id.to_string(),
            },
            rate: Some((github.rate.clone().recipient(), github.credentials.clone())),
            ledger_up: metrics.ledger_up.clone(),
            round_trips: metrics.ledger_round_trips.clone(),
        },
    )
    .start()
}
