//! Warm keeping, as plain decisions: how many environments a pool keeps warm now, which to
//! remove (surplus, too old, failing their check, held), how many to boot, what a boot's end
//! means, and how long failed boots hold the refill back. The supervisor ((`actors::provision::warm`))
//! boots, checks and removes; it passes the time in.

use std::{
    collections::{HashSet, VecDeque},
    time::Duration,
};

use crate::clock::Instant;

use crate::config::WarmConfig;

/// The wait after a failed boot: 10 s after the first, doubling to 5 min.
const BOOT_BACKOFF: crate::retry::Doubling =
    crate::retry::Doubling::new(Duration::from_secs(5), Duration::from_secs(300));

/// What a pool keeps warm, and what it has.
#[derive(Debug, Default)]
pub struct WarmKeeping {
    /// `warm`, `warm_max_age` (`None`: nothing is kept warm).
    config: Option<WarmConfig>,
    /// The pool's `max_concurrent`: running and warm environments together.
    max: usize,
    /// Booted and waiting, oldest first: (name, booted at).
    ready: VecDeque<(String, Instant)>,
    booting: HashSet<String>,
    held: bool,
    failures: u32,
    no_boot_before: Option<Instant>,
}

/// What a refill does.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Refill {
    /// Waiting environments beyond the target, oldest first: removed.
    pub surplus: Vec<String>,
    /// How many to boot.
    pub boot: usize,
}

/// What a boot's end means.
#[derive(Debug, PartialEq, Eq)]
pub enum Booted {
    /// Waiting for a claim now.
    Ready,
    /// Not wanted any more (the target fell meanwhile): removed.
    Surplus,
    /// It failed: removed, and no boot before `wait` has passed.
    Failed {
        /// How long the refill holds back.
        wait: Duration,
    },
}

impl WarmKeeping {
    /// Keeping for `config` (nothing warm when `None` or a zero count) in a pool of `max`.
    pub fn new(config: Option<WarmConfig>, max: usize) -> Self {
        WarmKeeping {
            config: config.filter(WarmConfig::booted),
            max,
            ..WarmKeeping::default()
        }
    }

    /// Whether the pool keeps anything warm at any time.
    pub fn enabled(&self) -> bool {
        self.config.is_some()
    }

    /// Environments waiting for a claim.
    pub fn available(&self) -> usize {
        self.ready.len()
    }

    /// Environments booting.
    pub fn booting(&self) -> usize {
        self.booting.len()
    }

    /// `warm_max_age`, when anything is kept warm.
    pub fn max_age(&self) -> Option<Duration> {
        self.config.as_ref().map(|c| c.max_age)
    }

    /// The target at unix time `unix`: the count (by the window the clock is in), 0 while
    /// held or while the pool does not accept runners, within the slots `live` runners leave.
    pub fn target(&self, unix: u64, accepting: bool, live: usize) -> usize {
        let Some(c) = &self.config else { return 0 };
        if self.held || !accepting {
            return 0;
        }
        c.target_at(c.week_time(unix))
            .min(self.max.saturating_sub(live))
    }

    /// Holds (a cordon, a drain: `true`) or resumes; a hold gives back every waiting
    /// environment, to remove.
    pub fn hold(&mut self, held: bool) -> Vec<String> {
        self.held = held;
        if held { self.clear() } else { Vec::new() }
    }

    /// Gives back every waiting environment, to remove (a hold, a stop, the pool down).
    pub fn clear(&mut self) -> Vec<String> {
        self.ready.drain(..).map(|(name, _)| name).collect()
    }

    /// The oldest waiting environment, for a claim.
    pub fn take(&mut self) -> Option<String> {
        self.ready.pop_front().map(|(name, _)| name)
    }

    /// Held against `target` at `now`: the surplus goes (oldest first), and what is lacking
    /// boots, unless failed boots hold the refill back.
    pub fn refill(&mut self, target: usize, now: Instant) -> Refill {
        let mut out = Refill::default();
        while self.ready.len() > target {
            out.surplus.extend(self.take());
        }
        if self.no_boot_before.is_some_and(|t| now < t) {
            return out;
        }
        out.boot = target.saturating_sub(self.ready.len() + self.booting.len());
        out
    }

    /// `name` boots.
    pub fn boot_started(&mut self, name: String) {
        self.booting.insert(name);
    }

    /// `name`'s boot ended at `now` (`ok`), with the target then.
    pub fn boot_ended(&mut self, name: &str, ok: bool, target: usize, now: Instant) -> Booted {
        self.booting.remove(name);
        if !ok {
            self.failures = self.failures.saturating_add(1);
            let wait = BOOT_BACKOFF.after(self.failures.saturating_add(1), 0.0);
            self.no_boot_before = Some(now + wait);
            return Booted::Failed { wait };
        }
        if self.ready.len() >= target {
            return Booted::Surplus;
        }
        self.failures = 0;
        self.ready.push_back((name.to_string(), now));
        Booted::Ready
    }

    /// The waiting environments older than `warm_max_age` at `now`: taken out, to remove.
    pub fn expire(&mut self, now: Instant) -> Vec<String> {
        let Some(max_age) = self.max_age() else {
            return Vec::new();
        };
        let (old, young): (Vec<_>, Vec<_>) = std::mem::take(&mut self.ready)
            .into_iter()
            .partition(|(_, at)| now.saturating_duration_since(*at) >= max_age);
        self.ready = young.into();
        old.into_iter().map(|(name, _)| name).collect()
    }

    /// The waiting environments' names (each to be checked).
    pub fn waiting(&self) -> Vec<String> {
        self.ready.iter().map(|(name, _)| name.clone()).collect()
    }

    /// `name` failed its check: taken out if it still waits (not taken by a claim
    /// meanwhile); `true` then, and it is to be removed and replaced.
    pub fn withdraw(&mut self, name: &str) -> bool {
        let before = self.ready.len();
        self.ready.retain(|(n, _)| n != name);
        self.ready.len() < before
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::WarmConfig;

    fn keeping(count: usize, max: usize) -> WarmKeeping {
        let config = WarmConfig {
            min: count,
            max_age: Duration::from_secs(600),
            ..WarmConfig::default()
        };
        WarmKeeping::new(Some(config), max)
    }

    fn boot_all(k: &mut WarmKeeping, n: usize, target: usize, at: Instant) {
        for i in 0..n {
            let name = format!("w{i}");
            k.boot_started(name.clone());
            assert_eq!(k.boot_ended(&name, true, target, at), Booted::Ready);
        }
    }

    #[test]
    fn the_target_is_the_count_within_the_free_slots_and_nothing_while_held_or_down() {
        let k = keeping(2, 3);
        assert_eq!(k.target(0, true, 0), 2);
        assert_eq!(k.target(0, true, 2), 1, "one slot left");
        assert_eq!(k.target(0, true, 5), 0);
        assert_eq!(k.target(0, false, 0), 0, "down");
        let mut held = keeping(2, 3);
        held.hold(true);
        assert_eq!(held.target(0, true, 0), 0);
        assert!(!WarmKeeping::new(None, 3).enabled());
        assert!(!WarmKeeping::new(Some(WarmConfig::default()), 3).enabled());
    }

    #[test]
    fn a_refill_boots_what_lacks_and_removes_the_oldest_surplus() {
        let t0 = Instant::now();
        let mut k = keeping(2, 4);
        assert_eq!(
            k.refill(2, t0),
            Refill {
                surplus: vec![],
                boot: 2
            }
        );
        boot_all(&mut k, 2, 2, t0);
        k.boot_started("w9".into());
        assert_eq!(k.refill(3, t0).boot, 0, "one is booting");
        assert_eq!(k.refill(1, t0).surplus, ["w0"]);
        assert_eq!(k.take().as_deref(), Some("w1"));
        assert_eq!(k.take(), None);
    }

    #[test]
    fn a_failed_boot_holds_the_refill_back_doubling_and_a_success_starts_over() {
        let t0 = Instant::now();
        let mut k = keeping(1, 2);
        k.boot_started("a".into());
        assert_eq!(
            k.boot_ended("a", false, 1, t0),
            Booted::Failed {
                wait: Duration::from_secs(10)
            }
        );
        assert_eq!(k.refill(1, t0 + Duration::from_secs(9)).boot, 0);
        assert_eq!(k.refill(1, t0 + Duration::from_secs(10)).boot, 1);
        k.boot_started("b".into());
        let t1 = t0 + Duration::from_secs(10);
        assert_eq!(
            k.boot_ended("b", false, 1, t1),
            Booted::Failed {
                wait: Duration::from_secs(20)
            }
        );
        let t2 = t1 + Duration::from_secs(20);
        k.boot_started("c".into());
        assert_eq!(k.boot_ended("c", true, 1, t2), Booted::Ready);
        k.take();
        k.boot_started("d".into());
        assert_eq!(
            k.boot_ended("d", false, 1, t2),
            Booted::Failed {
                wait: Duration::from_secs(10)
            }
        );
    }

    #[test]
    fn a_boot_that_ends_past_the_target_is_surplus() {
        let t0 = Instant::now();
        let mut k = keeping(1, 2);
        boot_all(&mut k, 1, 1, t0);
        k.boot_started("late".into());
        assert_eq!(k.boot_ended("late", true, 1, t0), Booted::Surplus);
        assert_eq!(k.available(), 1);
        assert_eq!(k.booting(), 0);
    }

    #[test]
    fn too_old_and_failing_ones_go_and_a_hold_gives_back_the_rest() {
        let t0 = Instant::now();
        let mut k = keeping(3, 3);
        boot_all(&mut k, 2, 3, t0);
        k.boot_started("young".into());
        k.boot_ended("young", true, 3, t0 + Duration::from_secs(300));
        assert_eq!(k.expire(t0 + Duration::from_secs(600)), ["w0", "w1"]);
        assert_eq!(k.waiting(), ["young"]);
        assert!(!k.withdraw("w0"), "already gone");
        assert!(k.withdraw("young"));
        boot_all(&mut k, 2, 3, t0);
        assert_eq!(k.hold(true), ["w0", "w1"]);
        assert_eq!(k.hold(false), Vec::<String>::new());
    }
}
