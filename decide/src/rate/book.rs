//! The rate-limit readings themselves, one [`RateBook`] per daemon. The `RateActor` is its one writer (it folds every answer's headers in, with
//! the no-clobber rule); the scheduler's core reads it when it decides a retry's delay or holds
//! claims back, so a reading is kept once. Pure: the time of each observation is passed in.

use std::{
    collections::HashMap,
    sync::{Arc, PoisonError, RwLock},
    time::Duration,
};

use crate::vocab::{RateBucket, RateHeaders, RateSnapshot};

/// The daemon's readings per credential and bucket, shared: the rate actor writes, the
/// scheduler's core reads. Cloning shares the same readings.
#[derive(Debug, Clone, Default)]
pub struct RateBook(Arc<RwLock<Readings>>);

type Readings = HashMap<(String, RateBucket), RateSnapshot>;

impl RateBook {
    /// Folds one answer's headers into the credential's reading. Returns the new reading when
    /// it changed.
    pub fn observe(
        &self,
        credential: &str,
        bucket: RateBucket,
        headers: Option<RateHeaders>,
        retry_after: Option<Duration>,
        at_unix: u64,
    ) -> Option<RateSnapshot> {
        if headers.is_none() && retry_after.is_none() {
            return None;
        }
        let mut readings = self.0.write().unwrap_or_else(PoisonError::into_inner);
        let r = readings
            .entry((credential.to_string(), bucket))
            .or_default();
        if let Some(h) = headers {
            // `X-RateLimit-Remaining` was present (else `headers` would be `None`): this is a
            // reading, even if some values did not parse.
            if h.remaining.is_some() {
                r.remaining = h.remaining;
            }
            r.limit = h.limit.or(r.limit);
            r.reset = h.reset.or(r.reset);
            r.used = h.used.or(r.used);
            r.updated = at_unix;
        }
        if let Some(after) = retry_after {
            r.retry_after = Some(after);
            r.retry_after_at = Some(at_unix);
        }
        Some(*r)
    }

    /// The reading of one bucket of `credential`, if it was ever read.
    pub fn get(&self, credential: &str, bucket: RateBucket) -> Option<RateSnapshot> {
        let readings = self.0.read().unwrap_or_else(PoisonError::into_inner);
        readings.get(&(credential.to_string(), bucket)).copied()
    }

    /// The reading of one bucket of `credential` (all empty if never observed).
    pub fn snapshot(&self, credential: &str, bucket: RateBucket) -> RateSnapshot {
        self.get(credential, bucket).unwrap_or_default()
    }

    /// Every bucket of `credential` read so far.
    pub fn snapshots(&self, credential: &str) -> Vec<(RateBucket, RateSnapshot)> {
        let readings = self.0.read().unwrap_or_else(PoisonError::into_inner);
        let mut v: Vec<(RateBucket, RateSnapshot)> = readings
            .iter()
            .filter(|((c, _), _)| c == credential)
            .map(|((_, b), r)| (*b, *r))
            .collect();
        v.sort_by_key(|(b, _)| *b);
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(remaining: Option<u64>, reset: u64) -> Option<RateHeaders> {
        Some(RateHeaders {
            remaining,
            limit: Some(5000),
            reset: Some(reset),
            used: None,
            resource: RateBucket::Core,
        })
    }

    /// An answer on `token`'s `core` bucket.
    fn obs(t: &RateBook, remaining: Option<u64>, reset: u64, at: u64) {
        t.observe(
            "token",
            RateBucket::Core,
            headers(remaining, reset),
            None,
            at,
        );
    }

    #[test]
    fn missing_headers_change_nothing() {
        let t = RateBook::default();
        obs(&t, Some(10), 2000, 1000);
        let before = t.snapshot("token", RateBucket::Core);
        assert_eq!(t.observe("token", RateBucket::Core, None, None, 1500), None);
        assert_eq!(t.snapshot("token", RateBucket::Core), before);
        assert_eq!(before.updated, 1000);
    }

    /// The registration bucket is its own reading: a claim's answer never moves `core`.
    #[test]
    fn readings_are_kept_per_bucket() {
        let t = RateBook::default();
        obs(&t, Some(4000), 2000, 1000);
        let reg = RateBucket::ActionsRunnerRegistration;
        t.observe("token", reg, headers(Some(0), 3000), None, 1001);
        assert_eq!(t.snapshot("token", RateBucket::Core).remaining, Some(4000));
        let reg = t.snapshot("token", RateBucket::ActionsRunnerRegistration);
        assert_eq!((reg.remaining, reg.reset), (Some(0), Some(3000)));
        assert_eq!(t.snapshots("token").len(), 2);
    }

    #[test]
    fn readings_are_kept_per_credential() {
        let t = RateBook::default();
        obs(&t, Some(10), 2000, 1000);
        let app = "app-installation-9";
        t.observe(app, RateBucket::Core, headers(Some(0), 3000), None, 1001);
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
        let t = RateBook::default();
        obs(&t, Some(0), 1090, 1000);
        let s = t.snapshot("token", RateBucket::Core);
        assert_eq!(s.exhausted_until(1000, five_min), Some(1090));
        assert_eq!(
            s.exhausted_until(1000 + 600, five_min),
            None,
            "stale reading"
        );
        assert_eq!(s.exhausted_until(1095, five_min), None, "reset passed");
        obs(&t, Some(3), 1090, 1001);
        assert_eq!(
            t.snapshot("token", RateBucket::Core)
                .exhausted_until(1001, five_min),
            None
        );
    }
}
