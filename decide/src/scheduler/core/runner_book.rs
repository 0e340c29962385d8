//! The runner book: every runner of ours (the ledger's rows and when each was claimed, came up
//! and was last asked about), the runners gone a moment ago (a `completed` often arrives after
//! its runner exited, and must still be counted as ours), and the decisions deferred until a
//! late delivery had its chance (deletions, heals, parked jobs' looks). Plain data with the
//! rules that touch only it.

use std::{collections::HashMap, sync::Arc, time::Duration};

use crate::clock::Instant;

use super::Deletion;
use crate::durable::RunnerRow;
use crate::{config::PoolName, job::JobKey};

/// A runner of ours: what the ledger keeps (its [`RunnerRow`], read through `Deref`), and
/// when it was claimed and came up. Read through its accessors; changed only by the
/// `RunnerBook`.
#[derive(Debug, Clone)]
pub struct RunnerRecord {
    /// The durable part.
    row: RunnerRow,
    /// Claimed at.
    created_at: Instant,
    /// Made for its intent job at (its claim, or when it was handed over as a spare): the
    /// orphan grace runs from here.
    intent_since: Instant,
    /// Environment up at.
    started_at: Option<Instant>,
    /// When the sweep may ask GitHub again whether it is busy: a minute after it asked, or
    /// `sweep::IDLE_RETRY_AFTER_ERROR` after a question GitHub failed to answer (never
    /// while an answer is outstanding).
    idle_check_due: Option<Instant>,
    /// The sweep's question is outstanding.
    idle_check_pending: bool,
    /// GitHub said it is busy (with a job whose `in_progress` never reached us): the sweep
    /// leaves it alone; its job's `completed`, or its own exit, ends it.
    seen_busy: bool,
    /// Its registration is already deleted on GitHub (by the sweep): its exit deletes nothing.
    registration_deleted: bool,
    /// A teardown was asked for: the sweep leaves it to that.
    tearing_down: bool,
    /// It started in a booted warm environment.
    warm_start: bool,
    /// How often its intent job was looked at on GitHub while it sat up and unbound for it
    /// (`sweep::UNBOUND_LOOK_AFTER`); back to 0 when it is handed another job.
    looks: u8,
    /// When its intent job is looked at next (unset: `sweep::UNBOUND_LOOK_AFTER` after it
    /// came up or was handed its job).
    look_due: Option<Instant>,
    /// A spare kept until then for the job it was made for to come back (a scale set's job
    /// withdrawn before any runner took it is assigned again moments later), or for the next
    /// job a scale set assigns (`sweep::REASSIGN_GRACE`); the sweep leaves it alone until
    /// then.
    kept_until: Option<Instant>,
}

impl RunnerRecord {
    /// A runner of `row`, claimed at `created_at` (and made for its intent job then), not up
    /// yet and never asked about.
    pub(crate) fn new(row: RunnerRow, created_at: Instant) -> Self {
        RunnerRecord {
            row,
            created_at,
            intent_since: created_at,
            started_at: None,
            idle_check_due: None,
            idle_check_pending: false,
            seen_busy: false,
            registration_deleted: false,
            tearing_down: false,
            warm_start: false,
            looks: 0,
            look_due: None,
            kept_until: None,
        }
    }

    /// A runner the store held, claimed at `created_at`, taken to be up since `up_at` (its
    /// provisioner adopts it or reports it gone).
    pub(super) fn restored(row: RunnerRow, created_at: Instant, up_at: Instant) -> Self {
        RunnerRecord {
            started_at: Some(up_at),
            ..Self::new(row, created_at)
        }
    }

    /// The durable part.
    pub fn row(&self) -> &RunnerRow {
        &self.row
    }

    /// Claimed at.
    pub fn created_at(&self) -> Instant {
        self.created_at
    }

    /// Made for its intent job at.
    pub fn intent_since(&self) -> Instant {
        self.intent_since
    }

    /// Environment up at.
    pub fn started_at(&self) -> Option<Instant> {
        self.started_at
    }

    /// The sweep's question about it is outstanding.
    pub fn idle_check_pending(&self) -> bool {
        self.idle_check_pending
    }

    /// GitHub said it is busy.
    pub fn seen_busy(&self) -> bool {
        self.seen_busy
    }

    /// Its registration is already deleted on GitHub.
    pub fn registration_deleted(&self) -> bool {
        self.registration_deleted
    }

    /// A teardown was asked for.
    pub fn tearing_down(&self) -> bool {
        self.tearing_down
    }

    /// It started in a booted warm environment.
    pub fn warm_start(&self) -> bool {
        self.warm_start
    }

    /// Looks at its intent job so far.
    pub fn looks(&self) -> u8 {
        self.looks
    }

    /// When its intent job is looked at next.
    pub fn look_due(&self) -> Option<Instant> {
        self.look_due
    }

    /// Kept as a spare until then.
    pub fn kept_until(&self) -> Option<Instant> {
        self.kept_until
    }
}

impl std::ops::Deref for RunnerRecord {
    type Target = RunnerRow;

    fn deref(&self) -> &RunnerRow {
        &self.row
    }
}

/// What an event naming a runner of ours found.
#[derive(Debug, Clone)]
pub(super) struct Named {
    /// It was bound to the event's job just now (its row changed: make it durable).
    pub(super) bound_now: Option<RunnerRow>,
    /// The job it was made for.
    pub(super) intent: JobKey,
    /// Its pool.
    pub(super) provider: PoolName,
    /// It started in a booted warm environment.
    pub(super) warm_start: bool,
}

/// What GitHub's answer about an idle runner changed.
#[derive(Debug, Clone)]
pub(super) struct IdleAnswer {
    /// An event bound it meanwhile: the answer changes nothing more.
    pub(super) bound: bool,
    /// Its pool.
    pub(super) provider: PoolName,
    /// The job it was made for.
    pub(super) intent: JobKey,
}

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
    /// Probe GitHub's service for a pool whose newest runner it refuses (`refusal`).
    Probe { pool: crate::config::PoolName },
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

    /// An event named runner `name` with job `key` (and runner id `id`, when it said one):
    /// if the runner is ours (its name, and its id when given), it is bound to `key` unless it
    /// was bound before.
    pub(super) fn named(&mut self, name: &str, id: Option<u64>, key: &JobKey) -> Option<Named> {
        let r = self.runners.get_mut(name)?;
        if id.is_some_and(|id| id != r.row.id) {
            return None;
        }
        let bound_now = r.row.bound.is_none().then(|| {
            r.row.bound = Some(key.clone());
            r.row.clone()
        });
        Some(Named {
            bound_now,
            intent: r.row.intent.clone(),
            provider: r.row.provider.clone(),
            warm_start: r.warm_start,
        })
    }

    /// Runner `name` is kept as a spare until `until`.
    pub(super) fn keep_until(&mut self, name: &str, until: Instant) {
        if let Some(r) = self.runners.get_mut(name) {
            r.kept_until = Some(until);
        }
    }

    /// Runner `name`'s environment came up at `at` (`warm`: a booted warm one).
    pub(super) fn came_up(&mut self, name: &str, at: Instant, warm: bool) -> Option<&RunnerRecord> {
        let r = self.runners.get_mut(name)?;
        r.started_at = Some(at);
        r.warm_start = warm;
        Some(r)
    }

    /// Runner `name` is handed job `key` at `now` (a spare): made for it from now, its keep,
    /// its questions and its looks start over. The job it was made for before, and its row.
    pub(super) fn hand_over(
        &mut self,
        name: &str,
        key: &JobKey,
        now: Instant,
    ) -> Option<(JobKey, RunnerRow)> {
        let r = self.runners.get_mut(name)?;
        let from = std::mem::replace(&mut r.row.intent, key.clone());
        r.intent_since = now;
        r.kept_until = None;
        r.idle_check_due = None;
        r.looks = 0;
        r.look_due = None;
        Some((from, r.row.clone()))
    }

    /// Runner `name`'s intent job is looked at now: one more look, the next one due at what
    /// `next` makes of the looks so far. The next look's time and the job.
    pub(super) fn looked(
        &mut self,
        name: &str,
        next: impl FnOnce(u8) -> Instant,
    ) -> Option<(Instant, JobKey)> {
        let r = self.runners.get_mut(name)?;
        r.looks = r.looks.saturating_add(1);
        let at = next(r.looks);
        r.look_due = Some(at);
        Some((at, r.row.intent.clone()))
    }

    /// The sweep asks GitHub whether runner `name` is busy, unless a question is outstanding
    /// or the last was asked less than `every` ago; the runner when the question is asked.
    pub(super) fn ask_idle(
        &mut self,
        name: &str,
        now: Instant,
        every: Duration,
    ) -> Option<&RunnerRecord> {
        let r = self.runners.get_mut(name)?;
        let not_yet = r.idle_check_due.is_some_and(|t| now < t);
        if r.idle_check_pending || not_yet {
            return None;
        }
        r.idle_check_due = Some(now + every);
        r.idle_check_pending = true;
        Some(r)
    }

    /// GitHub answered the sweep's question about runner `name`: `Some(true)` busy,
    /// `Some(false)` deleted (torn down next), `None` no answer (asked again at `retry_at`).
    pub(super) fn idle_answered(
        &mut self,
        name: &str,
        busy: Option<bool>,
        retry_at: Instant,
    ) -> Option<IdleAnswer> {
        let r = self.runners.get_mut(name)?;
        r.idle_check_pending = false;
        if busy.is_none() {
            r.idle_check_due = Some(retry_at);
        }
        let bound = r.row.bound.is_some();
        if !bound {
            r.seen_busy = busy == Some(true);
            r.registration_deleted = busy == Some(false);
            r.tearing_down |= busy == Some(false);
        }
        Some(IdleAnswer {
            bound,
            provider: r.row.provider.clone(),
            intent: r.row.intent.clone(),
        })
    }

    /// A teardown of runner `name` is asked for; its pool.
    pub(super) fn tear_down(&mut self, name: &str) -> Option<PoolName> {
        let r = self.runners.get_mut(name)?;
        r.tearing_down = true;
        Some(r.row.provider.clone())
    }

    /// The runner gone under `name` ran a job (see [`RecentRunners::ran_a_job`]).
    pub(super) fn gone_ran_a_job(&mut self, name: &str) -> Option<JobKey> {
        self.recent.ran_a_job(name)
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

    /// Remembers `r`, gone under `name` at `now`, for a moment.
    pub(super) fn remember_gone(&mut self, name: Arc<str>, r: &RunnerRecord, now: Instant) {
        self.recent.remember(name, r, now);
    }

    /// Forgets the runners gone longer than `keep` ago.
    pub(super) fn prune_recent(&mut self, now: Instant, keep: Duration) {
        self.recent.prune(now, keep);
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

    fn book_with(r: RunnerRecord) -> RunnerBook {
        let mut b = RunnerBook::default();
        b.runners.insert(Arc::from(r.name.as_str()), r);
        b
    }

    #[test]
    fn an_event_binds_a_runner_once_and_only_when_its_id_matches() {
        let t0 = Instant::now();
        let mut b = book_with(record("r", 1, false, t0));
        let job = JobKey::new("acme", 7);
        assert!(
            b.named("r", Some(2), &job).is_none(),
            "another's runner of that name"
        );
        let first = b.named("r", Some(1), &job).unwrap();
        assert_eq!(first.bound_now.unwrap().bound, Some(job.clone()));
        assert_eq!(first.intent, JobKey::new("acme", 1));
        let again = b.named("r", None, &JobKey::new("acme", 8)).unwrap();
        assert!(
            again.bound_now.is_none(),
            "bound before: stays with its first job"
        );
        assert_eq!(b.runner("r").unwrap().bound, Some(job));
    }

    #[test]
    fn a_spare_handed_over_starts_its_keep_questions_and_looks_over() {
        let t0 = Instant::now();
        let mut b = book_with(record("r", 1, false, t0));
        b.keep_until("r", t0 + Duration::from_secs(60));
        b.looked("r", |n| t0 + Duration::from_secs(u64::from(n)));
        b.ask_idle("r", t0, Duration::from_secs(60)).unwrap();
        let later = t0 + Duration::from_secs(5);
        let (from, row) = b.hand_over("r", &JobKey::new("acme", 2), later).unwrap();
        assert_eq!(from, JobKey::new("acme", 1));
        assert_eq!(row.intent, JobKey::new("acme", 2));
        let r = b.runner("r").unwrap();
        assert_eq!(r.intent_since(), later);
        assert_eq!((r.kept_until(), r.looks(), r.look_due()), (None, 0, None));
        assert!(
            b.ask_idle("r", later, Duration::from_secs(60)).is_none(),
            "the outstanding question is still out"
        );
    }

    #[test]
    fn an_idle_question_is_asked_once_and_again_after_no_answer() {
        let t0 = Instant::now();
        let every = Duration::from_secs(60);
        let mut b = book_with(record("r", 1, false, t0));
        assert!(b.ask_idle("r", t0, every).is_some());
        assert!(b.ask_idle("r", t0, every).is_none(), "outstanding");
        let retry = t0 + Duration::from_secs(10);
        let answer = b.idle_answered("r", None, retry).unwrap();
        assert!(!answer.bound);
        assert!(
            b.ask_idle("r", t0 + Duration::from_secs(9), every)
                .is_none()
        );
        assert!(
            b.ask_idle("r", retry, every).is_some(),
            "asked again when due"
        );
        b.idle_answered("r", Some(false), retry).unwrap();
        let r = b.runner("r").unwrap();
        assert!(r.registration_deleted() && r.tearing_down() && !r.seen_busy());
    }

    #[test]
    fn an_answer_about_a_runner_bound_meanwhile_changes_nothing_more() {
        let t0 = Instant::now();
        let mut b = book_with(record("r", 1, true, t0));
        b.ask_idle("r", t0, Duration::from_secs(60)).unwrap();
        let answer = b.idle_answered("r", Some(false), t0).unwrap();
        assert!(answer.bound);
        let r = b.runner("r").unwrap();
        assert!(!r.registration_deleted() && !r.tearing_down() && !r.idle_check_pending());
        assert_eq!(b.tear_down("r"), Some(PoolName::from("local")));
        assert!(b.runner("r").unwrap().tearing_down());
    }
}
