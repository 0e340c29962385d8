//! A token bucket that paces claims under `github.max_claims_per_minute`.
//!
//! Capacity is a tenth of the per-minute budget and the refill rate the rest, so no 60-second
//! window ever holds more than the budget, while a burst still starts at once.

use std::time::Duration;

use tokio::time::Instant;

/// Float slack when comparing token counts.
const EPSILON: f64 = 1e-9;

/// Claim pacing. Pure: time is passed in.
#[derive(Debug, Clone)]
pub struct TokenBucket {
    capacity: f64,
    tokens: f64,
    per_sec: f64,
    last: Instant,
}

impl TokenBucket {
    /// A full bucket allowing `per_minute` claims in any minute.
    pub fn new(per_minute: u32, now: Instant) -> Self {
        let per_minute = f64::from(per_minute.max(1));
        let capacity = (per_minute / 10.0).floor().max(1.0);
        TokenBucket {
            capacity,
            tokens: capacity,
            per_sec: (per_minute - capacity).max(1.0) / 60.0,
            last: now,
        }
    }

    fn refill(&mut self, now: Instant) {
        let elapsed = now.saturating_duration_since(self.last).as_secs_f64();
        self.tokens = (self.tokens + elapsed * self.per_sec).min(self.capacity);
        self.last = now;
    }

    /// Takes a token if one is there.
    pub fn try_take(&mut self, now: Instant) -> bool {
        self.refill(now);
        if self.tokens >= 1.0 - EPSILON {
            self.tokens = (self.tokens - 1.0).max(0.0);
            true
        } else {
            false
        }
    }

    /// When the next token will be there.
    pub fn next_token_at(&mut self, now: Instant) -> Instant {
        self.refill(now);
        if self.tokens >= 1.0 - EPSILON {
            return now;
        }
        // Round up to the next millisecond so a wake-up never lands a hair too early.
        let wait = (1.0 - self.tokens) / self.per_sec;
        now + Duration::from_millis((wait * 1000.0).ceil() as u64 + 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_minute_holds_more_than_the_budget() {
        let t0 = Instant::now();
        let mut b = TokenBucket::new(150, t0);
        let mut taken = Vec::new();
        let mut now = t0;
        while now < t0 + Duration::from_secs(300) {
            if b.try_take(now) {
                taken.push(now);
            } else {
                now = b.next_token_at(now);
            }
        }
        for (i, start) in taken.iter().enumerate() {
            let in_window = taken[i..]
                .iter()
                .take_while(|t| **t < *start + Duration::from_secs(60))
                .count();
            assert!(in_window <= 150, "{in_window} claims in one minute");
        }
        assert!(
            taken.len() >= 135 * 5 - 10,
            "{} claims in 5 minutes",
            taken.len()
        );
        let burst = taken.iter().filter(|t| **t == t0).count();
        assert_eq!(burst, 15, "a tenth of the budget starts at once");
    }
}
