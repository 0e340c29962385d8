//! SlotTable: each pool's labels and slots (used, up or down and why, its environment
//! failures), the host's total, claim pacing per target, and the claims in flight. Plain data
//! with the rules that touch only it: which pool a job goes to, and taking and freeing slots.

use std::collections::HashMap;

use super::{ClaimPacer, ProviderSpec, SchedulerSettings};
use crate::{job::JobKey, vocab::LabelSet};

/// One pool's slots.
#[derive(Debug, Default, Clone)]
pub(super) struct Slots {
    pub(super) used: usize,
    pub(super) up: bool,
    /// Why the provider is down, as its supervisor reported.
    pub(super) down_cause: Option<String>,
    /// Environments of this pool that failed to come up, or exited before their job started.
    pub(super) env_failures: u64,
    /// The latest such failure.
    pub(super) last_env_failure: Option<String>,
    /// Its warm environments, as its supervisor last reported (pools that keep some).
    pub(super) warm: Option<crate::provision::WarmView>,
}

/// Outcome of routing one job.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Pick {
    /// No enabled provider covers the job.
    Uncovered,
    /// Covering providers exist but none is up with a free slot right now.
    Wait,
    /// This provider has a free slot.
    Provider(usize),
}

/// Slots, pacing and claims in flight.
#[derive(Debug)]
pub(super) struct SlotTable {
    /// Each pool's labels, in the settings' order.
    provider_sets: Vec<LabelSet>,
    slots: Vec<Slots>,
    used_total: usize,
    max_concurrent: usize,
    /// Claim pacing per target: the sliding window, and pauses while its credential is
    /// limited.
    pacers: Vec<ClaimPacer>,
    /// Jobs whose claim is in flight, with their target (the fair share counts them).
    claiming: HashMap<JobKey, usize>,
}

impl SlotTable {
    /// Entries held: claims in flight, claims inside the pacing windows.
    pub(super) fn census(&self, out: &mut super::Census) {
        out.push(("scheduler.claiming", self.claiming.len()));
        let paced = self.pacers.iter().map(|p| p.in_window()).sum();
        out.push(("scheduler.pacing_window", paced));
    }

    /// Pool `i`'s slots.
    pub(super) fn slot(&self, i: usize) -> &Slots {
        &self.slots[i]
    }

    /// Every pool's slots, in the settings' order.
    pub(super) fn slots(&self) -> &[Slots] {
        &self.slots
    }

    /// Slots taken, all pools.
    pub(super) fn used_total(&self) -> usize {
        self.used_total
    }

    /// Pool `i`'s labels.
    pub(super) fn set(&self, i: usize) -> &LabelSet {
        &self.provider_sets[i]
    }

    /// Target `t`'s claim pacing.
    pub(super) fn pacer_mut(&mut self, t: usize) -> &mut ClaimPacer {
        &mut self.pacers[t]
    }

    /// The claims in flight, with their target.
    pub(super) fn claiming(&self) -> &HashMap<JobKey, usize> {
        &self.claiming
    }

    /// A claim for `key`, of target `t`, is in flight.
    pub(super) fn claim_sent(&mut self, key: JobKey, t: usize) {
        self.claiming.insert(key, t);
    }

    /// The claim for `key` was answered (or dropped); its target, if it was in flight.
    pub(super) fn claim_ended(&mut self, key: &JobKey) -> Option<usize> {
        self.claiming.remove(key)
    }

    /// Pool `i`'s environment failed to come up with `error`.
    pub(super) fn env_failed(&mut self, i: usize, error: &str) {
        let slot = &mut self.slots[i];
        slot.env_failures += 1;
        slot.last_env_failure = Some(error.to_string());
    }

    /// Pool `i` is up, or down for `cause`.
    pub(super) fn set_up(&mut self, i: usize, up: bool, cause: Option<String>) {
        let slot = &mut self.slots[i];
        slot.up = up;
        slot.down_cause = if up { None } else { cause };
    }

    /// Pool `i`'s warm environments are `view`; whether that is news.
    pub(super) fn show_warm(&mut self, i: usize, view: crate::provision::WarmView) -> bool {
        let slot = &mut self.slots[i];
        let news = slot.warm != Some(view);
        slot.warm = Some(view);
        news
    }

    /// Every pool down until its supervisor reports the host check passed: no job is claimed
    /// for a pool that cannot run it.
    pub(super) fn new(settings: &SchedulerSettings) -> Self {
        SlotTable {
            provider_sets: settings
                .providers
                .iter()
                .map(|p| LabelSet::new(&p.labels))
                .collect(),
            slots: settings
                .providers
                .iter()
                .map(|_| Slots {
                    up: false,
                    down_cause: Some("starting: host check not done yet".into()),
                    ..Slots::default()
                })
                .collect(),
            used_total: 0,
            max_concurrent: settings.max_concurrent,
            pacers: settings
                .targets
                .iter()
                .map(|t| ClaimPacer::new(t.claims_per_minute))
                .collect(),
            claiming: HashMap::new(),
        }
    }

    /// The pool for a job of `target` with `labels`: the covering pool (of those that serve
    /// the target) with the fewest extra labels, a free one first among equals.
    pub(super) fn pick(
        &self,
        providers: &[ProviderSpec],
        labels: &[String],
        target: usize,
    ) -> Pick {
        let wanted = LabelSet::new(labels);
        let mut best: Option<(usize, usize, bool)> = None; // (extra labels, index, free)
        let mut covered = false;
        for (i, offered) in self.provider_sets.iter().enumerate() {
            let spec = &providers[i];
            let serves = spec.targets.as_ref().is_none_or(|t| t.contains(&target));
            if !serves || !offered.covers(&wanted) {
                continue;
            }
            covered = true;
            let slot = &self.slots[i];
            if !slot.up {
                continue;
            }
            let extra = offered.extra_over(&wanted);
            let free = slot.used < spec.max_concurrent;
            let better = match best {
                None => true,
                Some((e, _, f)) => extra < e || (extra == e && free && !f),
            };
            if better {
                best = Some((extra, i, free));
            }
        }
        match best {
            Some((_, i, true)) => Pick::Provider(i),
            _ if covered => Pick::Wait,
            _ => Pick::Uncovered,
        }
    }

    /// Whether a pool that serves `target` is up with a free slot.
    pub(super) fn room_for(&self, providers: &[ProviderSpec], target: usize) -> bool {
        providers.iter().zip(&self.slots).any(|(spec, slot)| {
            slot.up
                && slot.used < spec.max_concurrent
                && spec.targets.as_ref().is_none_or(|t| t.contains(&target))
        })
    }

    /// Whether the host's `max_concurrent` is reached.
    pub(super) fn host_full(&self) -> bool {
        self.used_total >= self.max_concurrent
    }

    /// Takes a slot of pool `i`.
    pub(super) fn take(&mut self, i: usize) {
        self.slots[i].used += 1;
        self.used_total += 1;
    }

    /// Frees a slot of pool `i` (`None`: a pool no longer configured, whose slot only the
    /// host's total counted).
    pub(super) fn free(&mut self, i: Option<usize>) {
        if let Some(i) = i {
            self.slots[i].used = self.slots[i].used.saturating_sub(1);
        }
        self.used_total = self.used_total.saturating_sub(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{PoolName, ProviderKind};

    fn pool(name: &str, labels: &[&str], max: usize, targets: Option<Vec<usize>>) -> ProviderSpec {
        ProviderSpec {
            name: PoolName::from(name),
            kind: ProviderKind::Local,
            labels: labels.iter().map(|l| l.to_string()).collect(),
            max_concurrent: max,
            targets,
            warm: None,
            accel: None,
        }
    }

    fn labels(l: &[&str]) -> Vec<String> {
        l.iter().map(|s| s.to_string()).collect()
    }

    fn capacity(pools: &[ProviderSpec], host: usize) -> SlotTable {
        let settings = SchedulerSettings {
            providers: pools.to_vec(),
            max_concurrent: host,
            ..super::super::tests::settings()
        };
        let mut c = SlotTable::new(&settings);
        for s in &mut c.slots {
            s.up = true;
        }
        c
    }

    #[test]
    fn the_most_specific_covering_pool_wins_and_a_free_one_among_equals() {
        let pools = [
            pool("wide", &["self-hosted", "linux", "x64", "gpu"], 1, None),
            pool("exact", &["self-hosted", "linux"], 1, None),
            pool("twin", &["self-hosted", "linux"], 1, None),
        ];
        let mut c = capacity(&pools, 8);
        let job = labels(&["self-hosted", "linux"]);
        assert_eq!(c.pick(&pools, &job, 0), Pick::Provider(1));
        c.take(1);
        assert_eq!(c.pick(&pools, &job, 0), Pick::Provider(2), "the free twin");
        c.take(2);
        assert_eq!(
            c.pick(&pools, &job, 0),
            Pick::Wait,
            "the wider pool is not a fallback"
        );
        assert_eq!(c.pick(&pools, &labels(&["windows"]), 0), Pick::Uncovered);
    }

    #[test]
    fn a_pool_down_or_serving_other_targets_is_not_picked() {
        let pools = [
            pool("other", &["self-hosted"], 1, Some(vec![1])),
            pool("down", &["self-hosted"], 1, None),
        ];
        let mut c = capacity(&pools, 8);
        c.slots[1].up = false;
        let job = labels(&["self-hosted"]);
        assert_eq!(
            c.pick(&pools, &job, 0),
            Pick::Wait,
            "covered, but by nothing up for it"
        );
        assert_eq!(c.pick(&pools, &job, 1), Pick::Provider(0));
    }

    #[test]
    fn slots_are_counted_per_pool_and_for_the_host() {
        let pools = [pool("a", &["x"], 2, None)];
        let mut c = capacity(&pools, 1);
        assert!(!c.host_full());
        c.take(0);
        assert!(c.host_full());
        c.free(None);
        assert_eq!(
            (c.slots[0].used, c.used_total),
            (1, 0),
            "a removed pool frees the total only"
        );
        c.free(Some(0));
        c.free(Some(0));
        assert_eq!((c.slots[0].used, c.used_total), (0, 0), "never below zero");
    }
}
