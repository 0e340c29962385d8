//! `Setup`: what the scheduler was configured with, and the lookups over it alone (a job's
//! target, a pool's index, whether a runner name is ours). It never changes after
//! [`Scheduler::new`](super::Scheduler::new): the mechanics read it, none can write it.

use std::{collections::HashMap, time::Duration};

use super::{SchedulerSettings, TargetSpec};
use crate::{config::PoolName, job::JobKey};

/// The settings, and the target index of each owner.
#[derive(Debug)]
pub struct Setup {
    pub(super) settings: SchedulerSettings,
    /// Target index per owner (lowercased).
    owners: HashMap<String, usize>,
}

impl Setup {
    /// The settings, indexed.
    pub(super) fn new(settings: SchedulerSettings) -> Self {
        Setup {
            owners: settings
                .targets
                .iter()
                .enumerate()
                .map(|(i, t)| (t.owner.to_ascii_lowercase(), i))
                .collect(),
            settings,
        }
    }

    /// The target of a job (the first, for an owner no target has: such a job is ignored at
    /// intake, so it only reaches here from an old store).
    pub(super) fn target_index(&self, key: &JobKey) -> usize {
        self.target_of(&key.owner).unwrap_or(0)
    }

    /// The name of `owner`'s target (`github.targets[].name`), or the owner itself where no
    /// target has it: what usage rows and traces name a job's target by.
    pub(super) fn target_name<'a>(&'a self, owner: &'a str) -> &'a str {
        self.target_of(owner)
            .map_or(owner, |t| self.settings.targets[t].name.as_str())
    }

    pub(super) fn provider_index(&self, pool: &PoolName) -> Option<usize> {
        self.settings.providers.iter().position(|p| p.name == *pool)
    }

    /// `runner.name_prefix`.
    pub fn name_prefix(&self) -> &str {
        &self.settings.name_prefix
    }

    /// Whether a runner name is one of this install's, of any pool, configured now or not
    /// (a pool removed from the config may have left runners): `<name_prefix>-<pool>-` and
    /// then exactly this install's id and a random part (neither has a `-`, so another
    /// host's pool whose name ends in `-<our id>` does not match: its tail is longer).
    pub fn is_ours(&self, name: &str) -> bool {
        let s = &self.settings;
        if s.providers
            .iter()
            .any(|p| name.starts_with(&s.runner_prefix(&p.name)))
        {
            return true;
        }
        crate::vocab::names_install_runner(name, &s.name_prefix, &s.install_id)
    }

    /// The targets.
    pub fn targets(&self) -> &[TargetSpec] {
        &self.settings.targets
    }

    /// The target whose owner is `owner` (case-insensitive).
    pub fn target_of(&self, owner: &str) -> Option<usize> {
        self.owners
            .get(owner)
            .or_else(|| self.owners.get(&owner.to_ascii_lowercase()))
            .copied()
    }

    /// How often to reconcile, if at all.
    pub fn reconcile_interval(&self) -> Option<Duration> {
        self.settings.reconcile_interval
    }

    /// How often the shell should [`Scheduler::prune`](super::Scheduler::prune): a quarter of the shorter of the dedup
    /// window and the retention, between 5 s and a minute, so a record outlives its window by
    /// at most that (and a daemon restarted more often than a minute still prunes).
    pub fn prune_every(&self) -> Duration {
        (self.settings.seen_ttl.min(self.settings.retention) / 4)
            .clamp(Duration::from_secs(5), Duration::from_secs(60))
    }

    /// Whether any pool keeps registered warm runners.
    pub(super) fn any_registered_warm(&self) -> bool {
        self.settings.providers.iter().any(|p| p.warm.is_some())
    }

    /// Whether pool `provider` keeps registered warm runners (its spares are those).
    pub(super) fn keeps_warm(&self, provider: &PoolName) -> bool {
        self.provider_index(provider)
            .is_some_and(|i| self.settings.providers[i].warm.is_some())
    }
}
