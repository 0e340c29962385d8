//! `Backoff`: the claim retry ladder as pure arithmetic.
//!
//! Rung `attempt - 1` of the schedule (the last rung repeats), moved by up to ±`jitter` of
//! itself. Each failure's own class decides: a rate-limit failure while its bucket is provably
//! empty (remaining 0 in a reading under five minutes old, reset ahead) waits for the reset plus
//! a uniform pick in `rate_reset_jitter`, so daemons sharing a token do not stampede. A
//! `Retry-After` on the failed answer is a floor, with the ladder's jitter added on top; a
//! server-side failure never waits less than its rung, whatever `Retry-After` says. Numbers from
//! the network are capped before any arithmetic, so no answer can overflow a time.

use std::time::Duration;

use rand::{Rng, RngExt as _};
use serde::Serialize;

use crate::{
    config::ClaimRetryConfig,
    vocab::{ErrorClass, RateSnapshot},
};

/// A rate reading older than this is not trusted to prove the budget empty.
pub const RATE_READING_FRESH: Duration = Duration::from_secs(5 * 60);

/// Why a ladder could not be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InvalidBackoff {
    /// No rungs.
    #[error("the retry schedule is empty")]
    Empty,
    /// A rung shorter than the one before.
    #[error("the retry schedule decreases at rung {0}")]
    Decreasing(usize),
    /// Jitter outside [0, 1].
    #[error("jitter must be within [0, 1]")]
    Jitter,
    /// `rate_reset_jitter` with lo >= hi.
    #[error("rate_reset_jitter needs lo < hi")]
    ResetWindow,
}

/// Why a retry was scheduled when it was.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum DelayReason {
    /// The ladder's rung (0-based).
    Ladder {
        /// Rung index.
        rung: usize,
    },
    /// The failed answer's `Retry-After`.
    RetryAfter,
    /// The budget was provably empty until this unix time.
    RateReset {
        /// Reset, unix seconds.
        reset: u64,
    },
}

/// The validated ladder.
#[derive(Debug, Clone)]
pub struct Backoff {
    schedule: Vec<Duration>,
    jitter: f64,
    max_age: Duration,
    reset_jitter: (Duration, Duration),
}

impl Backoff {
    /// Validates a claim-retry config into a ladder.
    pub fn try_new(c: &ClaimRetryConfig) -> Result<Self, InvalidBackoff> {
        if c.schedule.is_empty() {
            return Err(InvalidBackoff::Empty);
        }
        if let Some(i) = (1..c.schedule.len()).find(|&i| c.schedule[i] < c.schedule[i - 1]) {
            return Err(InvalidBackoff::Decreasing(i));
        }
        if !(0.0..=1.0).contains(&c.jitter) {
            return Err(InvalidBackoff::Jitter);
        }
        if c.rate_reset_jitter.0 >= c.rate_reset_jitter.1 {
            return Err(InvalidBackoff::ResetWindow);
        }
        Ok(Backoff {
            schedule: c.schedule.clone(),
            jitter: c.jitter,
            max_age: c.max_age,
            reset_jitter: c.rate_reset_jitter,
        })
    }

    /// Give up once the first failure is older than this.
    pub fn max_age(&self) -> Duration {
        self.max_age
    }

    /// The delay before retry number `attempt` (1 = after the first failure).
    pub fn ladder(&self, attempt: u32, rng: &mut impl Rng) -> (Duration, DelayReason) {
        let rung = (attempt.max(1) as usize - 1).min(self.schedule.len() - 1);
        let base = self.rung(attempt);
        let delay = if self.jitter == 0.0 {
            base
        } else {
            let spread = base.as_secs_f64() * self.jitter;
            let offset = rng.random_range(-spread..spread);
            Duration::from_secs_f64((base.as_secs_f64() + offset).max(0.0))
        };
        (delay, DelayReason::Ladder { rung })
    }

    /// The longest any wait can usefully be: past `max_age` plus the last rung a job is given
    /// up anyway. Untrusted inputs (`Retry-After`, a rate reset) are capped to this first.
    pub fn longest_wait(&self) -> Duration {
        let last = self.schedule.last().copied().unwrap_or_default();
        self.max_age.saturating_add(last)
    }

    /// The un-jittered rung for retry number `attempt`.
    pub fn rung(&self, attempt: u32) -> Duration {
        let rung = (attempt.max(1) as usize - 1).min(self.schedule.len() - 1);
        self.schedule[rung]
    }

    /// The delay before retry number `attempt`, given this failure's class and `Retry-After`,
    /// and the latest reading of the bucket its call spent.
    pub fn delay(
        &self,
        attempt: u32,
        class: ErrorClass,
        retry_after: Option<Duration>,
        rate: Option<&RateSnapshot>,
        now_unix: u64,
        rng: &mut impl Rng,
    ) -> (Duration, DelayReason) {
        let cap = self.longest_wait();
        let rung = self.ladder(attempt, rng);
        let snap = (class == ErrorClass::RateLimit)
            .then(|| rate.and_then(|r| r.exhausted_until(now_unix, RATE_READING_FRESH)))
            .flatten()
            .map(|reset| {
                let (lo, hi) = self.reset_jitter;
                let pick =
                    Duration::from_secs_f64(rng.random_range(lo.as_secs_f64()..hi.as_secs_f64()));
                let until = Duration::from_secs(reset.saturating_sub(now_unix)).min(cap);
                (until.saturating_add(pick), DelayReason::RateReset { reset })
            });
        let after = retry_after.map(|after| {
            let after = after.min(cap);
            let spread = after.as_secs_f64() * self.jitter * rng.random_range(0.0..=1.0);
            let jittered = after.saturating_add(Duration::from_secs_f64(spread));
            // Any other failure keeps the ladder's spacing (`Retry-After: 0` on a 503 is no
            // reason to hammer); a rate limit waits at least a second.
            match class {
                ErrorClass::RateLimit => (
                    jittered.max(Duration::from_secs(1)),
                    DelayReason::RetryAfter,
                ),
                _ if jittered < rung.0 => rung,
                _ => (jittered, DelayReason::RetryAfter),
            }
        });
        match (snap, after) {
            (Some(s), Some(a)) => {
                if a.0 > s.0 {
                    a
                } else {
                    s
                }
            }
            (Some(s), None) => s,
            (None, Some(a)) => a,
            (None, None) => rung,
        }
    }
}

#[cfg(test)]
mod tests {
    use rand::{SeedableRng, rngs::SmallRng};

    use super::*;

    fn cfg(schedule: &[u64], jitter: f64) -> ClaimRetryConfig {
        ClaimRetryConfig {
            schedule: schedule.iter().map(|s| Duration::from_secs(*s)).collect(),
            jitter,
            ..ClaimRetryConfig::default()
        }
    }

    #[test]
    fn ladder_climbs_and_repeats_the_last_rung() {
        let b = Backoff::try_new(&cfg(&[30, 60, 120], 0.0)).unwrap();
        let mut rng = SmallRng::seed_from_u64(1);
        let delays: Vec<u64> = (1..=5).map(|a| b.ladder(a, &mut rng).0.as_secs()).collect();
        assert_eq!(delays, vec![30, 60, 120, 120, 120]);
    }

    #[test]
    fn jitter_stays_within_its_fraction() {
        let b = Backoff::try_new(&cfg(&[100], 0.2)).unwrap();
        let mut rng = SmallRng::seed_from_u64(7);
        for _ in 0..1000 {
            let d = b.ladder(1, &mut rng).0.as_secs_f64();
            assert!((80.0..120.0).contains(&d), "{d}");
        }
    }

    #[test]
    fn rate_snap_retry_after_and_stale_readings() {
        let b = Backoff::try_new(&ClaimRetryConfig::default()).unwrap();
        let mut rng = SmallRng::seed_from_u64(3);
        let now = 1_000_000;
        let empty = RateSnapshot {
            remaining: Some(0),
            reset: Some(now + 90),
            updated: now,
            ..Default::default()
        };
        for _ in 0..200 {
            let (d, why) = b.delay(1, ErrorClass::RateLimit, None, Some(&empty), now, &mut rng);
            assert!(
                d >= Duration::from_secs(95) && d < Duration::from_secs(115),
                "{d:?}"
            );
            assert_eq!(why, DelayReason::RateReset { reset: now + 90 });
        }
        let stale = RateSnapshot {
            updated: now - 600,
            ..empty
        };
        let (d, why) = b.delay(1, ErrorClass::RateLimit, None, Some(&stale), now, &mut rng);
        assert!(matches!(why, DelayReason::Ladder { rung: 0 }) && d <= Duration::from_secs(36));
        let (d, why) = b.delay(
            1,
            ErrorClass::RateLimit,
            Some(Duration::from_secs(700)),
            Some(&empty),
            now,
            &mut rng,
        );
        assert_eq!(why, DelayReason::RetryAfter, "the longer wait wins");
        assert!(
            d >= Duration::from_secs(700) && d <= Duration::from_secs(840),
            "{d:?}"
        );
        let (_, why) = b.delay(1, ErrorClass::ServerSide, None, Some(&empty), now, &mut rng);
        assert!(
            matches!(why, DelayReason::Ladder { .. }),
            "only rate-limit failures snap"
        );
    }

    #[test]
    fn invalid_ladders_are_refused() {
        assert_eq!(
            Backoff::try_new(&cfg(&[], 0.0)).unwrap_err(),
            InvalidBackoff::Empty
        );
        assert_eq!(
            Backoff::try_new(&cfg(&[60, 30], 0.0)).unwrap_err(),
            InvalidBackoff::Decreasing(1)
        );
        assert_eq!(
            Backoff::try_new(&cfg(&[30], 1.5)).unwrap_err(),
            InvalidBackoff::Jitter
        );
    }
}
