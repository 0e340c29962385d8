//! `ClaimPacer`: claims as GitHub counts them, at most `max_claims_per_minute` in **any**
//! 60-second window (a sliding window over the claims actually sent), and a pause that holds
//! every claim back while the credential is known to be limited: a secondary-limit answer
//! (until its `Retry-After`), or a registration budget a fresh reading proves empty (until its
//! reset). A burst under the budget is claimed at once; a larger one fills the window and then
//! follows the claims that leave it.

use std::{collections::VecDeque, time::Duration};

use crate::clock::Instant;

/// The window GitHub's per-minute limits count in.
pub const WINDOW: Duration = Duration::from_secs(60);

/// Claim pacing. Pure: time is passed in.
#[derive(Debug, Clone)]
pub struct ClaimPacer {
    per_minute: usize,
    /// When each claim still inside the window was sent, oldest first.
    sent: VecDeque<Instant>,
    /// No claim before this.
    paused_until: Option<Instant>,
}

impl ClaimPacer {
    /// Claims remembered inside the window.
    pub fn in_window(&self) -> usize {
        self.sent.len()
    }

    /// A pacer allowing `per_minute` claims in any 60 s.
    pub fn new(per_minute: u32) -> Self {
        let per_minute = per_minute.max(1) as usize;
        ClaimPacer {
            per_minute,
            sent: VecDeque::with_capacity(per_minute.min(4096)),
            paused_until: None,
        }
    }

    fn forget_old(&mut self, now: Instant) {
        while self
            .sent
            .front()
            .is_some_and(|t| now.saturating_duration_since(*t) >= WINDOW)
        {
            self.sent.pop_front();
        }
    }

    /// Takes a claim slot if the window and any pause allow one now.
    pub fn try_take(&mut self, now: Instant) -> bool {
        if self.paused_until.is_some_and(|until| now < until) {
            return false;
        }
        self.forget_old(now);
        if self.sent.len() < self.per_minute {
            self.sent.push_back(now);
            true
        } else {
            false
        }
    }

    /// When a claim may be sent next.
    pub fn next_slot_at(&mut self, now: Instant) -> Instant {
        self.forget_old(now);
        let window = if self.sent.len() < self.per_minute {
            now
        } else {
            self.sent.front().map_or(now, |oldest| *oldest + WINDOW)
        };
        self.paused_until.map_or(window, |until| until.max(window))
    }

    /// Holds every claim back until `until` (a longer pause already in place stays).
    pub fn pause_until(&mut self, until: Instant) {
        if self.paused_until.is_none_or(|p| p < until) {
            self.paused_until = Some(until);
        }
    }

    /// Until when claims are held back, if they are now.
    pub fn paused(&self, now: Instant) -> Option<Instant> {
        self.paused_until.filter(|until| now < *until)
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    /// Claims as the scheduler sends them: take while allowed, else jump to the next slot.
    fn drive(pacer: &mut ClaimPacer, jobs: usize, t0: Instant) -> Vec<Instant> {
        let (mut now, mut sent) = (t0, Vec::new());
        while sent.len() < jobs {
            if pacer.try_take(now) {
                sent.push(now);
            } else {
                now = pacer.next_slot_at(now);
            }
        }
        sent
    }

    #[test]
    fn a_burst_under_the_budget_is_claimed_at_once() {
        let t0 = Instant::now();
        let sent = drive(&mut ClaimPacer::new(150), 100, t0);
        assert!(sent.iter().all(|t| *t == t0));
    }

    #[test]
    fn a_pause_holds_every_claim_until_it_ends() {
        let t0 = Instant::now();
        let mut p = ClaimPacer::new(150);
        p.pause_until(t0 + Duration::from_secs(30));
        p.pause_until(t0 + Duration::from_secs(10));
        assert!(!p.try_take(t0 + Duration::from_secs(29)));
        assert_eq!(p.next_slot_at(t0), t0 + Duration::from_secs(30));
        assert!(p.try_take(t0 + Duration::from_secs(30)));
    }

    proptest! {
        /// However large the burst, no 60 s window holds more than the budget, and the
        /// budget is used: the first minute is full.
        #[test]
        fn no_window_holds_more_than_the_budget(per_minute in 1u32..400, jobs in 1usize..1200) {
            let t0 = Instant::now();
            let sent = drive(&mut ClaimPacer::new(per_minute), jobs, t0);
            for (i, start) in sent.iter().enumerate() {
                let in_window = sent[i..].iter().take_while(|t| **t < *start + WINDOW).count();
                prop_assert!(in_window <= per_minute as usize, "{in_window} in one window");
            }
            let first_minute = sent.iter().filter(|t| **t < t0 + WINDOW).count();
            prop_assert_eq!(first_minute, jobs.min(per_minute as usize));
        }
    }
}
