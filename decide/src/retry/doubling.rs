//! `Doubling`: the one wait every retry loop outside the claim ladder uses. It starts at
//! `first`, doubles with each failure in a row up to `cap`, and is moved by up to ±`jitter` of
//! itself (a draw in `[0, 1)` is passed in, so it stays pure). The store's writer, the ledger's
//! connection, mirror and event stream, pull mode's idle polls, the scale-set session, warm
//! boots and warm claims each give it their numbers; the claim ladder ([`super::Backoff`]) is
//! the one schedule that is not a doubling.

use std::time::Duration;

/// A doubling wait's numbers.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Doubling {
    /// The wait after the first failure.
    pub first: Duration,
    /// The most it grows to.
    pub cap: Duration,
    /// How far a wait is moved, as a share of itself (0: not at all; 0.2: 80 % to 120 %).
    pub jitter: f64,
}

impl Doubling {
    /// From `first`, doubling to `cap`, without jitter.
    pub const fn new(first: Duration, cap: Duration) -> Self {
        Doubling {
            first,
            cap,
            jitter: 0.0,
        }
    }

    /// The same, moved by up to ±`jitter` of each wait.
    pub const fn jittered(self, jitter: f64) -> Self {
        Doubling { jitter, ..self }
    }

    /// The wait after `failures` failures in a row (0 and 1: `first`), placed in the jitter
    /// band by `draw`.
    pub fn after(&self, failures: u32, draw: f64) -> Duration {
        let doublings = failures.saturating_sub(1).min(31);
        let base = self.first.saturating_mul(1u32 << doublings).min(self.cap);
        self.placed(base, draw)
    }

    /// The wait that follows `last` (`first` when there was none), without jitter: for loops
    /// that keep their last wait rather than a count.
    pub fn following(&self, last: Option<Duration>) -> Duration {
        last.map_or(self.first, |w| w.saturating_mul(2).min(self.cap))
    }

    fn placed(&self, base: Duration, draw: f64) -> Duration {
        if self.jitter <= 0.0 {
            return base;
        }
        let j = self.jitter.clamp(0.0, 1.0);
        base.mul_f64(1.0 - j + 2.0 * j * draw.clamp(0.0, 1.0))
    }
}

/// A doubling wait with its count of failures in a row: `next` after each failure, `reset`
/// after a success.
#[derive(Debug, Clone, PartialEq)]
pub struct DoublingBackoff {
    policy: Doubling,
    failures: u32,
}

impl DoublingBackoff {
    /// A count at zero for `policy`.
    pub fn new(policy: Doubling) -> Self {
        DoublingBackoff {
            policy,
            failures: 0,
        }
    }

    /// The wait after one more failure; `draw` in `[0, 1)` places it in the jitter band.
    pub fn next(&mut self, draw: f64) -> Duration {
        self.failures = self.failures.saturating_add(1);
        self.policy.after(self.failures, draw)
    }

    /// Back to the first wait (after a success).
    pub fn reset(&mut self) {
        self.failures = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: fn(u64) -> Duration = Duration::from_secs;

    #[test]
    fn it_doubles_to_its_cap_and_never_overflows() {
        let d = Doubling::new(S(5), S(300));
        let waits: Vec<u64> = (0..9).map(|n| d.after(n, 0.5).as_secs()).collect();
        assert_eq!(waits, [5, 5, 10, 20, 40, 80, 160, 300, 300]);
        assert_eq!(d.after(u32::MAX, 0.5), S(300));
        assert_eq!(d.following(None), S(5));
        assert_eq!(d.following(Some(S(200))), S(300));
    }

    #[test]
    fn jitter_moves_a_wait_within_its_band() {
        let d = Doubling::new(S(10), S(60)).jittered(0.2);
        assert_eq!(d.after(1, 0.0), S(8));
        assert_eq!(d.after(1, 0.5), S(10));
        assert!(d.after(1, 0.999) < S(12));
        assert_eq!(d.after(1, 7.0), S(12), "a draw out of range is clamped");
    }

    #[test]
    fn the_count_starts_over_after_a_success() {
        let mut b = DoublingBackoff::new(Doubling::new(S(5), S(60)).jittered(0.2));
        let waits: Vec<u64> = (0..6).map(|_| b.next(0.5).as_secs()).collect();
        assert_eq!(waits, [5, 10, 20, 40, 60, 60]);
        assert!(b.next(0.0) >= S(48));
        assert!(b.next(1.0) <= S(72));
        b.reset();
        assert_eq!(b.next(0.5), S(5));
    }
}
