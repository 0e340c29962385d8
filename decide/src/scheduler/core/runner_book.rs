//! The runner book: every runner of ours (the ledger's rows and when each was claimed, came up
//! and was last asked about), the runners gone a moment ago (a `completed` often arrives after
//! its runner exited, and must still be counted as ours), and the decisions deferred until a
//! late delivery had its chance (deletions, heals, parked jobs' looks). Plain data with the
//! rules that touch only it.

use std::{collections::HashMap, sync::Arc, time::Duration};

use crate::clock::Instant;

use super::{Deletion, RunnerRecord};
use crate::{config::PoolName, job::JobKey};

/// A runner that left the ledger a moment ago.
#[derive(Debug, Clone)]
pub(super) struct GoneRunner {
    pub(super) provider: PoolName,
    /// Its environment came up at.
    pub(super) started_at: Option<Instant>,
    gone_at: Instant,
    /// It ran a job (an event named it, or it exited cleanly by itself): GitHub removes its
    /// registration, so it is not deleted.
    pub(super) ran_a_job: bool,
    /// The job it was made for last.
    pub(super) intent: JobKey,
}

/// Runners gone recently, by name.
#[derive(Debug, Default)]
pub(super) struct RecentRunners(HashMap<Arc<str>, GoneRunner>);

impl RecentRunners {
    /// Remembers `r`, leaving the ledger under `name` at `now`.
    pub(super) fn remember(&mut self, name: Arc<str>, r: &RunnerRecord, now: Instant) {
        let gone = GoneRunner {
            provider: r.provider.clone(),
            started_at: r.started_at,
            gone_at: now,
            ran_a_job: r.bound.is_some(),
            intent: r.intent.clone(),
        };
        self.0.insert(name, gone);
    }

    /// The runner gone under `name`.
    pub(super) fn get(&self, name: &str) -> Option<&GoneRunner> {
        self.0.get(name)
    }

    /// Marks the runner gone under `name` as one that ran a job; returns the job it was made
    /// for when this is news (it was not known to have run one).
    pub(super) fn ran_a_job(&mut self, name: &str) -> Option<JobKey> {
        let gone = self.0.get_mut(name).filter(|g| !g.ran_a_job)?;
        gone.ran_a_job = true;
        Some(gone.intent.clone())
    }

    /// Forgets the runners gone longer than `keep` ago.
    pub(super) fn prune(&mut self, now: Instant, keep: Duration) {
        self.0
            .retain(|_, g| now.saturating_duration_since(g.gone_at) < keep);
    }
}

/// A decision taken later, once a late `in_progress` had its chance to arrive.
#[derive(Debug, Clone)]
pub(super) enum Deferred {
    /// Delete a runner registration unless the runner turns out to have run a job.
    Delete(Deletion),
    /// Dispatch a stranded job again unless it has been observed running by then.
    Heal {
        key: JobKey,
        why: super::ledger::Strand,
    },
    /// Look at a parked job again.
    Look { key: JobKey },
}

/// The runners of ours, the ones just gone, and the deferred decisions.
#[derive(Debug, Default)]
pub(super) struct RunnerBook {
    runners: HashMap<Arc<str>, RunnerRecord>,
    recent: RecentRunners,
    /// Decisions waiting for a late delivery (see `DELETE_DELAY`, `heal_grace`), failed
    /// deletions waiting to be tried again, and parked jobs' next looks.
    deferred: Vec<(Instant, Deferred)>,
}

impl RunnerBook {
    /// Runner `name` as notes share it: the ledger's copy, a recently gone runner's, or a
    /// fresh one for a runner that is not ours (a name repeated in five notes of a job is then
    /// held once).
    pub(super) fn handle(&self, name: &str) -> Arc<str> {
        self.runners
            .get_key_value(name)
            .map(|(k, _)| k.clone())
            .or_else(|| self.recent.0.get_key_value(name).map(|(k, _)| k.clone()))
            .unwrap_or_else(|| Arc::from(name))
    }

    /// Runner `name`.
    pub(super) fn runner(&self, name: &str) -> Option<&RunnerRecord> {
        self.runners.get(name)
    }

    /// Runner `name`, to change.
    pub(super) fn runner_mut(&mut self, name: &str) -> Option<&mut RunnerRecord> {
        self.runners.get_mut(name)
    }

    /// Runner `name` with the name's shared copy.
    pub(super) fn runner_with_handle(&self, name: &str) -> Option<(&Arc<str>, &RunnerRecord)> {
        self.runners.get_key_value(name)
    }

    /// Every runner of ours.
    pub(super) fn runners(&self) -> impl Iterator<Item = &RunnerRecord> {
        self.runners.values()
    }

    /// Every runner of ours, with its name's shared copy.
    pub(super) fn entries(&self) -> impl Iterator<Item = (&Arc<str>, &RunnerRecord)> {
        self.runners.iter()
    }

    /// Entries held: runners of ours, runners just gone, deferred decisions.
    pub(super) fn census(&self, out: &mut super::Census) {
        out.push(("scheduler.runners", self.runners.len()));
        out.push(("scheduler.recent_runners", self.recent.0.len()));
        out.push(("scheduler.deferred", self.deferred.len()));
    }

    /// How many runners of ours there are.
    pub(super) fn len(&self) -> usize {
        self.runners.len()
    }

    /// Whether `name` is a runner of ours.
    pub(super) fn has(&self, name: &str) -> bool {
        self.runners.contains_key(name)
    }

    /// Books runner `r` under `name`.
    pub(super) fn insert(&mut self, name: Arc<str>, r: RunnerRecord) {
        self.runners.insert(name, r);
    }

    /// Takes runner `name` out of the book.
    pub(super) fn remove(&mut self, name: &str) -> Option<(Arc<str>, RunnerRecord)> {
        self.runners.remove_entry(name)
    }

    /// The runners gone a moment ago.
    pub(super) fn recent(&self) -> &RecentRunners {
        &self.recent
    }

    /// The runners gone a moment ago, to remember or mark one.
    pub(super) fn recent_mut(&mut self) -> &mut RecentRunners {
        &mut self.recent
    }

    /// Takes `what` at `due`.
    pub(super) fn defer(&mut self, due: Instant, what: Deferred) {
        self.deferred.push((due, what));
    }

    /// The decisions due at `now` (all of them with `all`), in the order they were deferred.
    pub(super) fn take_due(&mut self, now: Instant, all: bool) -> Vec<Deferred> {
        let (due, later): (Vec<_>, Vec<_>) = std::mem::take(&mut self.deferred)
            .into_iter()
            .partition(|(at, _)| all || *at <= now);
        self.deferred = later;
        due.into_iter().map(|(_, what)| what).collect()
    }

    /// When the next deferred decision is due.
    pub(super) fn next_due(&self) -> Option<Instant> {
        self.deferred.iter().map(|(at, _)| *at).min()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::durable::RunnerRow;

    fn record(name: &str, intent: u64, bound: bool, now: Instant) -> RunnerRecord {
        let row = RunnerRow {
            name: name.into(),
            id: 1,
            provider: PoolName::from("local"),
            repo: None,
            intent: JobKey::new("acme", intent),
            bound: bound.then(|| JobKey::new("acme", intent + 100)),
            created_unix: 0,
        };
        RunnerRecord::new(row, now)
    }

    #[test]
    fn deferred_decisions_come_due_in_order_and_the_next_time_is_the_earliest() {
        let t0 = Instant::now();
        let mut b = RunnerBook::default();
        let look = |id| Deferred::Look {
            key: JobKey::new("acme", id),
        };
        b.defer(t0 + Duration::from_secs(20), look(1));
        b.defer(t0 + Duration::from_secs(10), look(2));
        b.defer(t0 + Duration::from_secs(30), look(3));
        assert_eq!(b.next_due(), Some(t0 + Duration::from_secs(10)));
        let due = b.take_due(t0 + Duration::from_secs(20), false);
        let ids: Vec<u64> = due
            .iter()
            .map(|d| match d {
                Deferred::Look { key } => key.job_id,
                _ => 0,
            })
            .collect();
        assert_eq!(ids, vec![1, 2], "deferral order, not due order");
        assert_eq!(b.next_due(), Some(t0 + Duration::from_secs(30)));
        assert_eq!(b.take_due(t0, true).len(), 1, "a flush takes the rest");
        assert_eq!(b.next_due(), None);
    }

    #[test]
    fn a_gone_runner_is_named_by_its_handle_until_it_is_pruned() {
        let t0 = Instant::now();
        let mut b = RunnerBook::default();
        let name: Arc<str> = Arc::from("ephemer-local-1");
        b.recent
            .remember(name.clone(), &record("ephemer-local-1", 1, false, t0), t0);
        assert!(Arc::ptr_eq(&b.handle("ephemer-local-1"), &name), "one copy");
        assert_eq!(
            b.recent.ran_a_job("ephemer-local-1"),
            Some(JobKey::new("acme", 1))
        );
        assert_eq!(b.recent.ran_a_job("ephemer-local-1"), None, "news once");
        b.recent
            .prune(t0 + Duration::from_secs(60), Duration::from_secs(60));
        assert!(b.recent.get("ephemer-local-1").is_none());
        assert!(!Arc::ptr_eq(&b.handle("ephemer-local-1"), &name));
    }

    #[test]
    fn a_runner_that_ran_a_job_is_remembered_as_such() {
        let t0 = Instant::now();
        let mut b = RunnerBook::default();
        b.recent
            .remember(Arc::from("r"), &record("r", 1, true, t0), t0);
        assert!(b.recent.get("r").unwrap().ran_a_job);
        assert_eq!(b.recent.ran_a_job("r"), None);
    }
}
