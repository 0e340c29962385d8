//! `RateActor`: the one writer of GitHub rate-limit readings, one per credential and bucket
//! (`X-RateLimit-Resource`: `core`, `actions_runner_registration`, ...), each with the
//! no-clobber rule, kept in the [`RateBook`] (`book.rs`, pure).
//!
//! The GitHub client reports every answer's headers (`ObserveRate`); the actor folds each into
//! the book, mirrors it into the four gauges, and pushes it to the subscribers of its
//! credential (`SubscribeRate`: the fleet actor, which shares low readings). The scheduler's
//! core reads the book itself when it decides, so a reading is held once. `GetRateSnapshot`
//! answers status pages. An observation without `X-RateLimit-Remaining` changes no reading and
//! no gauge.

use std::time::Duration;

pub use crate::vocab::RateSnapshot;
use crate::{
    metrics::Metrics,
    vocab::{RateBucket, RateHeaders},
};
use actix::{Actor, Context, Handler, Message, MessageResult, Recipient, WeakRecipient};
pub use ephemer_decide::rate::RateBook;

/// One GitHub answer's rate information.
#[derive(Debug, Clone, Message)]
#[rtype(result = "()")]
pub struct ObserveRate {
    /// Which credential's budget this is.
    pub credential: String,
    /// The target whose client saw it (its metrics' `target` label).
    pub target: String,
    /// Which of its buckets.
    pub bucket: RateBucket,
    /// The `X-RateLimit-*` headers; `None` when `X-RateLimit-Remaining` was absent.
    pub headers: Option<RateHeaders>,
    /// `Retry-After`, if sent.
    pub retry_after: Option<Duration>,
    /// HTTP status of the answer.
    pub status: u16,
    /// Unix seconds when the answer arrived.
    pub at_unix: u64,
}

/// Asks for the latest reading of every bucket of a credential.
#[derive(Debug, Clone, Message)]
#[rtype(result = "Vec<(RateBucket, RateSnapshot)>")]
pub struct GetRateSnapshot {
    /// The credential (`GithubClient::rate_key`).
    pub credential: String,
}

/// A new reading of one bucket of a credential's budget, pushed to its subscribers.
#[derive(Debug, Clone, Message)]
#[rtype(result = "()")]
pub struct RateReading {
    /// The credential.
    pub credential: String,
    /// The bucket.
    pub bucket: RateBucket,
    /// The reading.
    pub reading: RateSnapshot,
}

/// Push every new reading of `credential` to `to` (held weakly: a subscriber that stopped is
/// dropped).
#[derive(Debug, Clone, Message)]
#[rtype(result = "()")]
pub struct SubscribeRate {
    /// The credential (`GithubClient::rate_key`).
    pub credential: String,
    /// Where readings go.
    pub to: WeakRecipient<RateReading>,
}

impl SubscribeRate {
    /// Subscribes `to` once to each distinct credential of `credentials` (targets may share
    /// one: they then share its readings).
    pub fn each(
        rate: &Recipient<SubscribeRate>,
        credentials: &[String],
        to: &WeakRecipient<RateReading>,
    ) {
        let mut seen = std::collections::HashSet::new();
        for credential in credentials.iter().filter(|c| seen.insert(*c)) {
            rate.do_send(SubscribeRate {
                credential: credential.clone(),
                to: to.clone(),
            });
        }
    }
}

/// Actor shell over the [`RateBook`]; mirrors readings into the rate gauges.
#[derive(Debug)]
pub struct RateActor {
    book: RateBook,
    metrics: Metrics,
    subscribers: Vec<(String, WeakRecipient<RateReading>)>,
}

impl RateActor {
    /// A rate actor keeping its readings in `book` (which the scheduler reads) and writing
    /// into `metrics`.
    pub fn new(book: RateBook, metrics: Metrics) -> Self {
        RateActor {
            book,
            metrics,
            subscribers: Vec::new(),
        }
    }
}

impl Actor for RateActor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        ctx.set_mailbox_capacity(1024);
    }
}

impl Handler<ObserveRate> for RateActor {
    type Result = ();

    fn handle(&mut self, msg: ObserveRate, _: &mut Context<Self>) {
        let is_reading = msg.headers.is_some();
        let changed = self.book.observe(
            &msg.credential,
            msg.bucket,
            msg.headers,
            msg.retry_after,
            msg.at_unix,
        );
        if let Some(r) = changed
            && is_reading
        {
            let labels = self
                .metrics
                .target_labels(&[msg.bucket.as_str()], &msg.target);
            let set = |g: &prometheus::IntGaugeVec, v: Option<u64>| {
                if let Some(v) = v {
                    g.with_label_values(&labels)
                        .set(i64::try_from(v).unwrap_or(i64::MAX));
                }
            };
            set(&self.metrics.rate_remaining, r.remaining);
            set(&self.metrics.rate_limit, r.limit);
            set(&self.metrics.rate_reset_seconds, r.reset);
            set(&self.metrics.rate_updated_seconds, Some(r.updated));
        }
        if let Some(r) = changed {
            self.subscribers.retain(|(credential, to)| {
                let Some(to) = to.upgrade() else {
                    return false;
                };
                if *credential == msg.credential {
                    to.do_send(RateReading {
                        credential: credential.clone(),
                        bucket: msg.bucket,
                        reading: r,
                    });
                }
                true
            });
        }
    }
}

crate::stop_on_request!(RateActor);

impl Handler<SubscribeRate> for RateActor {
    type Result = ();

    fn handle(&mut self, m: SubscribeRate, _: &mut Context<Self>) {
        // The current readings first, so the subscriber starts from what is known.
        if let Some(to) = m.to.upgrade() {
            for (bucket, reading) in self.book.snapshots(&m.credential) {
                to.do_send(RateReading {
                    credential: m.credential.clone(),
                    bucket,
                    reading,
                });
            }
        }
        self.subscribers.push((m.credential, m.to));
    }
}

impl Handler<GetRateSnapshot> for RateActor {
    type Result = MessageResult<GetRateSnapshot>;

    fn handle(&mut self, msg: GetRateSnapshot, _: &mut Context<Self>) -> Self::Result {
        MessageResult(self.book.snapshots(&msg.credential))
    }
}
