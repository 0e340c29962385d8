//! The GitHub wing: the rate readings' book and its `RateActor`, and a `GithubActor` per target
//! (its own credential, budget and App token), each reporting every answer's rate headers to
//! the rate actor.

use actix::{Actor, Addr};

use crate::{
    config::Target,
    github::{GithubClient, actor::GithubActor},
    metrics::Metrics,
    rate::{RateActor, RateBook},
};

/// What the GitHub wing started.
pub(super) struct GithubWing {
    /// The readings, shared with the scheduler's core.
    pub(super) book: RateBook,
    /// Their one writer.
    pub(super) rate: Addr<RateActor>,
    /// Each target's actor, with its name, in config order.
    pub(super) actors: Vec<(String, Addr<GithubActor>)>,
    /// Each target's credential key (`GithubClient::rate_key`), in target order.
    pub(super) credentials: Vec<String>,
    /// Each target's client (its connection and credential), in target order.
    pub(super) clients: Vec<GithubClient>,
}

/// Starts the rate actor and one GitHub actor per target.
pub(super) fn start(targets: &[Target], metrics: &Metrics) -> GithubWing {
    let book = RateBook::default();
    let rate = RateActor::new(book.clone(), metrics.clone()).start();
    let mut credentials = Vec::with_capacity(targets.len());
    let mut actors = Vec::with_capacity(targets.len());
    let mut clients = Vec::with_capacity(targets.len());
    for target in targets {
        let client = GithubClient::new(
            &target.github,
            metrics.clone(),
            Some(rate.clone().recipient()),
        )
        .for_target(&target.name);
        credentials.push(client.rate_key());
        clients.push(client.clone());
        actors.push((target.name.clone(), GithubActor::new(client).start()));
    }
    GithubWing {
        book,
        rate,
        actors,
        credentials,
        clients,
    }
}
