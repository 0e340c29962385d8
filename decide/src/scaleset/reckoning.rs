//! The reckoning's decisions: when a scale set's statistics are read against the jobs this
//! daemon holds, what a gap seen twice calls for, and which held jobs go first when GitHub
//! no longer assigns them. The listener in `ephemer-actors-core` reads the statistics and the
//! scheduler's demand, and carries the answer out (its module docs tell the whole story).

use std::time::Duration;

use crate::{clock::Instant, job::JobKey};

/// Readings at least this far apart: a gap must outlive the messages in flight.
pub const RECKON_EVERY: Duration = Duration::from_secs(15);

/// The last reading.
#[derive(Debug, Default, Clone)]
pub struct Reckoner {
    at: Option<Instant>,
    gap: Option<i64>,
}

impl Reckoner {
    /// Whether a reading is due at `now` ([`RECKON_EVERY`] after the last).
    pub fn due(&self, now: Instant) -> bool {
        self.at
            .is_none_or(|at| now.saturating_duration_since(at) >= RECKON_EVERY)
    }

    /// A reading at `now` found `gap` (assigned minus held): what it calls for, after the
    /// last reading's gap.
    pub fn read(&mut self, now: Instant, gap: i64) -> Amend {
        let step = amend(self.gap, gap);
        self.at = Some(now);
        self.gap = Some(gap);
        step
    }

    /// What a reading called for was carried out: the next reading waits for it to show
    /// (runners claimed and taken, jobs withdrawn) before it acts again.
    pub fn acted(&mut self) {
        self.gap = None;
    }
}

/// What a reading calls for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Amend {
    /// Nothing.
    Nothing,
    /// Claim this many runners for assigned jobs never heard of.
    Fill(usize),
    /// Drop this many held jobs GitHub no longer assigns.
    Withdraw(usize),
}

/// The amend for gap `now` (assigned minus held) after gap `before`: only a gap of the same
/// sign on both readings, by the smaller of the two.
pub fn amend(before: Option<i64>, now: i64) -> Amend {
    match before {
        Some(b) if b > 0 && now > 0 => Amend::Fill(usize::try_from(b.min(now)).unwrap_or(0)),
        Some(b) if b < 0 && now < 0 => {
            Amend::Withdraw(usize::try_from((-b).min(-now)).unwrap_or(0))
        }
        _ => Amend::Nothing,
    }
}

/// The jobs to withdraw, `n` at most: placeholders (newest first), then `orphans` (oldest
/// first), among those still waiting.
pub fn to_withdraw(waiting: &[JobKey], orphans: &[u64], n: usize) -> Vec<JobKey> {
    let placeholders = waiting.iter().rev().filter(|k| k.is_reckoned());
    let orphaned = waiting
        .iter()
        .filter(|k| !k.is_reckoned() && orphans.contains(&k.job_id));
    placeholders.chain(orphaned).take(n).cloned().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reading_is_due_every_fifteen_seconds_and_acts_on_a_gap_held_since_the_last() {
        let t0 = Instant::now();
        let mut r = Reckoner::default();
        assert!(r.due(t0));
        assert_eq!(r.read(t0, 2), Amend::Nothing, "seen once");
        assert!(!r.due(t0 + Duration::from_secs(14)));
        let t1 = t0 + RECKON_EVERY;
        assert!(r.due(t1));
        assert_eq!(r.read(t1, 3), Amend::Fill(2));
        r.acted();
        assert_eq!(
            r.read(t1 + RECKON_EVERY, 3),
            Amend::Nothing,
            "after acting, the gap must be seen twice again"
        );
    }

    #[test]
    fn only_a_gap_seen_twice_is_acted_on_by_the_smaller_reading() {
        assert_eq!(amend(None, 3), Amend::Nothing);
        assert_eq!(amend(Some(0), 3), Amend::Nothing);
        assert_eq!(amend(Some(-2), 3), Amend::Nothing);
        assert_eq!(amend(Some(5), 3), Amend::Fill(3));
        assert_eq!(amend(Some(2), 3), Amend::Fill(2));
        assert_eq!(amend(Some(-1), -4), Amend::Withdraw(1));
        assert_eq!(amend(Some(3), -4), Amend::Nothing);
        assert_eq!(amend(Some(0), 0), Amend::Nothing);
    }

    #[test]
    fn placeholders_go_first_then_orphans_and_never_a_job_from_a_message() {
        let k = |id| JobKey::new("acme", id);
        let p = |n| JobKey::reckoned("acme", n);
        let waiting = vec![k(10), k(11), p(1), k(12), p(2)];
        assert_eq!(to_withdraw(&waiting, &[12, 10], 3), [p(2), p(1), k(10)]);
        assert_eq!(to_withdraw(&waiting, &[], 5).len(), 2);
        assert!(to_withdraw(&[k(10), k(11)], &[], 2).is_empty());
    }
}
