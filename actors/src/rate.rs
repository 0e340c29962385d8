//! `RateActor`: the one keeper of GitHub rate-limit readings, one per credential and bucket
//! (`X-RateLimit-Resource`: `core`, `actions_runner_registration`, ...), each with the
//! no-clobber rule.
//!
//! The GitHub client reports every answer's headers (`ObserveRate`); each new reading is pushed,
//! in order, to the subscribers of its credential (`SubscribeRate`: the scheduler, whose retry
//! ladder snaps to the reset), so no reading is fetched on the side and none can overtake a
//! decision. `GetRateSnapshot` answers status pages. The pure [`RateTracker`] makes every
//! decision; the actor only forwards and mirrors the latest reading into the four gauges. An
//! observation without `X-RateLimit-Remaining` changes no reading and no gauge.

use std::{collections::HashMap, time::Duration};

pub use crate::vocab::RateSnapshot;
use crate::{
    metrics::Metrics,
    vocab::{RateBucket, RateHeaders},
};
use actix::{Actor, Context, Handler, Message, MessageResult, Recipient, WeakRecipient};

/// Readings per credential and bucket. Pure: the time of each observation is passed in.
#[derive(Debug, Default)]
pub struct RateTracker {
    readings: HashMap<(String, RateBucket), RateSnapshot>,
}

impl RateTracker {
    /// Folds one answer's headers into the credential's reading. Returns the new reading when
    /// it changed.
    pub fn observe(&mut self, o: &ObserveRate) -> Option<RateSnapshot> {
        if o.headers.is_none() && o.retry_after.is_none() {
            return None;
        }
        let r = self
            .readings
            .entry((o.credential.clone(), o.bucket))
            .or_default();
        if let Some(h) = o.headers {
            // `X-RateLimit-Remaining` was present (else `headers` would be `None`): this is a
            // reading, even if some values did not parse.
            if h.remaining.is_some() {
                r.remaining = h.remaining;
            }
            r.limit = h.limit.or(r.limit);
            r.reset = h.reset.or(r.reset);
            r.used = h.used.or(r.used);
            r.updated = o.at_unix;
        }
        if let Some(after) = o.retry_after {
            r.retry_after = Some(after);
            r.retry_after_at = Some(o.at_unix);
        }
        Some(*r)
    }

    /// The reading of one bucket of `credential` (all empty if never observed).
    pub fn snapshot(&self, credential: &str, bucket: RateBucket) -> RateSnapshot {
        self.readings
            .get(&(credential.to_string(), bucket))
            .copied()
            .unwrap_or_default()
    }

    /// Every bucket of `credential` read so far.
    pub fn snapshots(&self, credential: &str) -> Vec<(RateBucket, RateSnapshot)> {
        let mut v: Vec<(RateBucket, RateSnapshot)> = self
            .readings
            .iter()
            .filter(|((c, _), _)| c == credential)
            .map(|((_, b), r)| (*b, *r))
            .collect();
        v.sort_by_key(|(b, _)| *b);
        v
    }
}

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

/// Actor shell over [`RateTracker`]; mirrors readings into the rate gauges.
#[derive(Debug)]
pub struct RateActor {
    tracker: RateTracker,
    metrics: Metrics,
    subscribers: Vec<(String, WeakRecipient<RateReading>)>,
}

impl RateActor {
    /// A rate actor writing into `metrics`.
    pub fn new(metrics: Metrics) -> Self {
        RateActor {
            tracker: RateTracker::default(),
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
        let changed = self.tracker.observe(&msg);
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
            for (bucket, reading) in self.tracker.snapshots(&m.credential) {
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
        MessageResult(self.tracker.snapshots(&msg.credential))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn obs(remaining: Option<u64>, reset: u64, at: u64) -> ObserveRate {
        ObserveRate {
            credential: "token".into(),
            target: "acme".into(),
            bucket: RateBucket::Core,
            headers: Some(RateHeaders {
                remaining,
                limit: Some(5000),
                reset: Some(reset),
                used: None,
                resource: RateBucket::Core,
            }),
            retry_after: None,
            status: 200,
            at_unix: at,
        }
    }

    #[test]
    fn missing_headers_change_nothing() {
        let mut t = RateTracker::default();
        t.observe(&obs(Some(10), 2000, 1000));
        let before = t.snapshot("token", RateBucket::Core);
        let none = ObserveRate {
            headers: None,
            ..obs(None, 0, 1500)
        };
        assert_eq!(t.observe(&none), None);
        assert_eq!(t.snapshot("token", RateBucket::Core), before);
        assert_eq!(before.updated, 1000);
    }

    /// The registration bucket is its own reading: a claim's answer never moves `core`.
    #[test]
    fn readings_are_kept_per_bucket() {
        let mut t = RateTracker::default();
        t.observe(&obs(Some(4000), 2000, 1000));
        t.observe(&ObserveRate {
            bucket: RateBucket::ActionsRunnerRegistration,
            ..obs(Some(0), 3000, 1001)
        });
        assert_eq!(t.snapshot("token", RateBucket::Core).remaining, Some(4000));
        let reg = t.snapshot("token", RateBucket::ActionsRunnerRegistration);
        assert_eq!((reg.remaining, reg.reset), (Some(0), Some(3000)));
        assert_eq!(t.snapshots("token").len(), 2);
    }

    #[test]
    fn readings_are_kept_per_credential() {
        let mut t = RateTracker::default();
        t.observe(&obs(Some(10), 2000, 1000));
        t.observe(&ObserveRate {
            credential: "app-installation-9".into(),
            ..obs(Some(0), 3000, 1001)
        });
        assert_eq!(t.snapshot("token", RateBucket::Core).remaining, Some(10));
        assert_eq!(
            t.snapshot("app-installation-9", RateBucket::Core).remaining,
            Some(0)
        );
        assert_eq!(
            t.snapshot("other", RateBucket::Core),
            RateSnapshot::default()
        );
    }

    #[test]
    fn exhausted_only_when_fresh_empty_and_reset_ahead() {
        let five_min = Duration::from_secs(300);
        let mut t = RateTracker::default();
        t.observe(&obs(Some(0), 1090, 1000));
        let s = t.snapshot("token", RateBucket::Core);
        assert_eq!(s.exhausted_until(1000, five_min), Some(1090));
        assert_eq!(
            s.exhausted_until(1000 + 600, five_min),
            None,
            "stale reading"
        );
        assert_eq!(s.exhausted_until(1095, five_min), None, "reset passed");
        t.observe(&obs(Some(3), 1090, 1001));
        assert_eq!(
            t.snapshot("token", RateBucket::Core)
                .exhausted_until(1001, five_min),
            None
        );
    }
}
