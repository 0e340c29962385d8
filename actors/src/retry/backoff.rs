//! `Backoff`: the claim retry ladder as pure arithmetic.
//!
//! Rung `attempt - 1` of the schedule (the last rung repeats), moved by up to ±`jitter` of
//! itself. A `Retry-After` on the failed answer wins. A rate-limit failure while the budget is
//! provably empty (remaining 0 in a reading under five minutes old, reset ahead) waits for the
//! reset plus a uniform pick in `rate_reset_jitter`, so daemons sharing a token do not stampede.

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
        let base = self.schedule[rung];
        let delay = if self.jitter == 0.0 {
            base
        } else {
            let spread = base.as_secs_f64() * self.jitter;
            let offset = rng.random_range(-spread..spread);
            Duration::from_secs_f64((base.as_secs_f64() + offset).max(0.0))
        };
        (delay, DelayReason::Ladder { rung })
    }

    /// The delay before retry number `attempt`, given the failure's class and `Retry-After`,
    /// and the latest rate reading.
    pub fn delay(
        &self,
        attempt: u32,
        class: ErrorClass,
        retry_after: Option<Duration>,
        rate: Option<&RateSnapshot>,
        now_unix: u64,
        rng: &mut impl Rng,
    ) -> (Duration, DelayReason) {
        if let Some(after) = retry_after {
            return (after, DelayReason::RetryAfter);
        }
        if class == ErrorClass::RateLimit
            && let Some(reset) = rate.and_then(|r| r.exhausted_until(now_unix, RATE_READING_FRESH))
        {
            let (lo, hi) = self.reset_jitter;
            let pick = rng.random_range(lo.as_secs_f64()..hi.as_secs_f64());
            let wait = Duration::from_secs(reset - now_unix) + Duration::from_secs_f64(pick);
            return (wait, DelayReason::RateReset { reset });
        }
        self.ladder(attempt, rng)
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
            Some(Duration::from_secs(7)),
            Some(&empty),
            now,
            &mut rng,
        );
        assert_eq!((d, why), (Duration::from_secs(7), DelayReason::RetryAfter));
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
