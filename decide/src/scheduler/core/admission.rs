//! Admission: the job table (one record per job, with its phase and timeline), the queue of
//! jobs waiting for a slot or a claim token, the shared copies of the strings jobs repeat, and
//! what the last reconcile pass found held idle. Plain data with the rules that touch only it:
//! a timeline's cap, which jobs wait for a runner, and which records may be forgotten.

use std::{
    collections::{HashMap, HashSet, VecDeque},
    time::Duration,
};

use crate::clock::Instant;

use super::{JobRecord, Note, Phase, TimelineEntry, shared::Shared, timeline::TIMELINE_CAP};
use crate::{clock::Now, job::JobKey};

/// Jobs waiting for a slot or a claim token: a queue per target, so a decision takes the
/// target's next job without sorting the whole backlog by target first (docs/benchmarks.md,
/// "A burst on one host": that sort made each decision cost time in proportion to the backlog).
#[derive(Debug, Default)]
pub(super) struct Pending {
    queues: Vec<VecDeque<JobKey>>,
}

impl Pending {
    pub(super) fn new(targets: usize) -> Self {
        Pending {
            queues: vec![VecDeque::new(); targets.max(1)],
        }
    }

    fn queue(&mut self, target: usize) -> &mut VecDeque<JobKey> {
        if target >= self.queues.len() {
            self.queues.resize_with(target + 1, VecDeque::new);
        }
        &mut self.queues[target]
    }

    /// `key`, of `target`, waits behind the others.
    pub(super) fn push_back(&mut self, target: usize, key: JobKey) {
        self.queue(target).push_back(key);
    }

    /// `key`, of `target`, is next (it was first already, and waits for a token).
    pub(super) fn push_front(&mut self, target: usize, key: JobKey) {
        self.queue(target).push_front(key);
    }

    /// Every waiting job, target by target.
    pub(super) fn iter(&self) -> impl Iterator<Item = &JobKey> {
        self.queues.iter().flatten()
    }

    pub(super) fn len(&self) -> usize {
        self.queues.iter().map(VecDeque::len).sum()
    }

    pub(super) fn is_empty(&self) -> bool {
        self.queues.iter().all(VecDeque::is_empty)
    }

    /// Jobs waiting, of each target.
    pub(super) fn per_target(&self) -> impl Iterator<Item = usize> + '_ {
        self.queues.iter().map(VecDeque::len)
    }

    /// The queues, `targets` of them, taken out to decide on (give them back with
    /// [`Pending::restore`]).
    pub(super) fn take(&mut self, targets: usize) -> Vec<VecDeque<JobKey>> {
        let mut queues = std::mem::take(&mut self.queues);
        queues.resize_with(targets.max(queues.len()), VecDeque::new);
        queues
    }

    pub(super) fn restore(&mut self, queues: Vec<VecDeque<JobKey>>) {
        self.queues = queues;
    }
}

/// How long records at rest are kept: since they were last seen (the dedup window), since
/// their start (a job that may still run), since a finished job's start (its retention).
#[derive(Debug, Clone, Copy)]
pub(super) struct Ttl {
    pub(super) seen: Duration,
    pub(super) started: Duration,
    pub(super) done: Duration,
}

/// The job table and its queue.
#[derive(Debug)]
pub(super) struct Admission {
    /// Boxed: a map slot is then a pointer, and its spare slots (a hash map keeps about a
    /// quarter free) cost 40 B each instead of the record's 300.
    /// A fast seeded hash: every delivery looks its job up here a few times (SipHash showed
    /// in the intake's profile, docs/benchmarks.md).
    jobs: HashMap<JobKey, Box<JobRecord>, foldhash::fast::RandomState>,
    /// Jobs waiting for a slot or a claim token, per target, oldest first.
    pending: Pending,
    /// One copy of each owner, repository, label set and conclusion the jobs repeat.
    shared: Shared,
    /// Per target: jobs its last reconcile pass found queued on GitHub that the daemon holds
    /// idle (parked before their look, or cordoned).
    held_idle: Vec<usize>,
    /// Notes taken so far: every decision about a job takes one, so a page that saw this
    /// number has seen every change it shows.
    notes_taken: u64,
}

impl Admission {
    /// An empty table for `targets` targets.
    pub(super) fn new(targets: usize) -> Self {
        Admission {
            jobs: HashMap::default(),
            pending: Pending::new(targets),
            shared: Shared::default(),
            held_idle: vec![0; targets],
            notes_taken: 0,
        }
    }

    /// Notes taken so far (see the field).
    pub(super) fn notes_taken(&self) -> u64 {
        self.notes_taken
    }

    /// `key`'s record.
    pub(super) fn job(&self, key: &JobKey) -> Option<&JobRecord> {
        self.jobs.get(key).map(|r| &**r)
    }

    /// `key`'s record, to change.
    pub(super) fn job_mut(&mut self, key: &JobKey) -> Option<&mut JobRecord> {
        self.jobs.get_mut(key).map(|r| &mut **r)
    }

    /// `key`'s record, made by `make` if there is none.
    pub(super) fn record_or(
        &mut self,
        key: JobKey,
        make: impl FnOnce() -> Box<JobRecord>,
    ) -> &mut JobRecord {
        self.jobs.entry(key).or_insert_with(make)
    }

    /// Puts `rec` in as `key`'s record.
    pub(super) fn insert(&mut self, key: JobKey, rec: Box<JobRecord>) {
        self.jobs.insert(key, rec);
    }

    /// Whether `key` has a record.
    pub(super) fn knows(&self, key: &JobKey) -> bool {
        self.jobs.contains_key(key)
    }

    /// Every record, with its key.
    pub(super) fn jobs(&self) -> impl Iterator<Item = (&JobKey, &JobRecord)> {
        self.jobs.iter().map(|(k, r)| (k, &**r))
    }

    /// Every record.
    pub(super) fn records(&self) -> impl Iterator<Item = &JobRecord> {
        self.jobs.values().map(|r| &**r)
    }

    /// Every record, to change.
    pub(super) fn records_mut(&mut self) -> impl Iterator<Item = &mut JobRecord> {
        self.jobs.values_mut().map(|r| &mut **r)
    }

    /// The jobs waiting for a slot or a claim token.
    pub(super) fn pending(&self) -> &Pending {
        &self.pending
    }

    /// The jobs waiting for a slot or a claim token, to queue or take.
    pub(super) fn pending_mut(&mut self) -> &mut Pending {
        &mut self.pending
    }

    /// The shared strings, to intern a job's or a runner's.
    pub(super) fn shared_mut(&mut self) -> &mut Shared {
        &mut self.shared
    }

    /// Jobs the last reconcile pass found queued on GitHub and held idle, all targets.
    pub(super) fn held_idle(&self) -> usize {
        self.held_idle.iter().sum()
    }

    /// Records what `target`'s reconcile pass found held idle.
    pub(super) fn set_held_idle(&mut self, target: usize, idle: usize) {
        if let Some(held) = self.held_idle.get_mut(target) {
            *held = idle;
        }
    }

    /// Adds `note` to `key`'s timeline. At the cap, the oldest note but the first goes (the
    /// first says how the job came in).
    pub(super) fn note(&mut self, key: &JobKey, now: Now, note: Note) {
        self.notes_taken = self.notes_taken.wrapping_add(1);
        if let Some(rec) = self.jobs.get_mut(key) {
            if rec.timeline.len() == TIMELINE_CAP {
                rec.timeline.remove(1);
            } else if rec.timeline.len() == rec.timeline.capacity() {
                // Grown two entries at a time, not doubled: most jobs keep a handful of notes
                // and 100,000 of them may be held at once (docs/benchmarks.md: a done job's
                // nine notes reserved sixteen entries when doubled, twelve four at a time,
                // ten now; the few reallocations cost less than the room).
                rec.timeline.reserve_exact(2);
            }
            rec.timeline.push(TimelineEntry {
                at_ms: now.unix_ms,
                note,
            });
        }
    }

    /// Sets `key`'s phase, if it is known.
    pub(super) fn set_phase(&mut self, key: &JobKey, phase: Phase) {
        if let Some(rec) = self.jobs.get_mut(key) {
            rec.phase = phase;
        }
    }

    /// Whether `key` waits for a runner: not started, and pending or on the ladder.
    pub(super) fn needs_runner(&self, key: &JobKey) -> bool {
        self.jobs.get(key).is_some_and(|j| {
            j.started_at.is_none() && matches!(j.phase, Phase::Pending | Phase::Retrying)
        })
    }

    /// The jobs that wait for a runner, among the pending ones and `on_ladder`: oldest first,
    /// each once.
    pub(super) fn waiting<'a>(
        &'a self,
        on_ladder: impl Iterator<Item = &'a JobKey>,
    ) -> Vec<(Instant, JobKey)> {
        let mut waiting: Vec<(Instant, JobKey)> = self
            .pending
            .iter()
            .chain(on_ladder)
            .filter(|k| self.needs_runner(k))
            .filter_map(|k| Some((self.jobs.get(k)?.received_at, k.clone())))
            .collect();
        waiting.sort();
        waiting.dedup();
        waiting
    }

    /// Forgets the records at rest (seen, unroutable, ignored or done) whose dedup and started
    /// windows have passed (a finished job's start: its retention) and no runner in
    /// `referenced` points at; returns their keys.
    pub(super) fn prune(
        &mut self,
        now: Now,
        ttl: Ttl,
        referenced: &HashSet<&JobKey>,
    ) -> Vec<JobKey> {
        let expired = |at: Option<Instant>, ttl: Duration| {
            at.is_none_or(|t| now.mono.saturating_duration_since(t) >= ttl)
        };
        let gone: Vec<JobKey> = self
            .jobs
            .iter()
            .filter(|(k, r)| {
                let started = match r.phase {
                    Phase::Done => ttl.done,
                    Phase::Seen | Phase::Unroutable | Phase::Ignored => ttl.started,
                    _ => return false,
                };
                expired(r.seen_at, ttl.seen)
                    && expired(r.started_at, started)
                    && !referenced.contains(k)
            })
            .map(|(k, _)| k.clone())
            .collect();
        for k in &gone {
            self.jobs.remove(k);
        }
        self.shared.prune();
        gone
    }
}

impl Admission {
    /// Entries held: the job table, the waiting queues, the shared copies.
    pub(super) fn census(&self, out: &mut super::Census) {
        out.push(("scheduler.jobs", self.jobs.len()));
        out.push(("scheduler.pending", self.pending.len()));
        out.push((
            "scheduler.timeline_notes",
            self.jobs.values().map(|r| r.timeline.len()).sum(),
        ));
        self.shared.census(out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::job::JobInfo;

    fn table(now: Instant) -> Admission {
        let mut a = Admission::new(1);
        for (id, phase) in [
            (1, Phase::Pending),
            (2, Phase::Retrying),
            (3, Phase::Seen),
            (4, Phase::Done),
        ] {
            let info = JobInfo {
                key: JobKey::new("acme", id),
                ..JobInfo::default()
            };
            // Job 1 arrived last: the oldest waiting job is 2.
            let at = now + Duration::from_secs(10 - id);
            a.jobs
                .insert(info.key.clone(), JobRecord::new(info, phase, at));
        }
        a.pending.push_back(0, JobKey::new("acme", 1));
        a
    }

    #[test]
    fn a_timeline_keeps_its_first_note_and_the_latest_at_the_cap() {
        let t0 = Instant::now();
        let mut a = table(t0);
        let key = JobKey::new("acme", 1);
        for i in 0..(TIMELINE_CAP as u64 + 5) {
            let now = Now::whole_seconds(t0, 1_000 + i);
            a.note(&key, now, Note::RetryDue { attempt: 1 });
        }
        let timeline = &a.jobs[&key].timeline;
        assert_eq!(timeline.len(), TIMELINE_CAP);
        assert_eq!(timeline[0].at(), 1_000, "the first note stays");
        assert_eq!(
            timeline.last().unwrap().at(),
            1_000 + TIMELINE_CAP as u64 + 4
        );
    }

    #[test]
    fn waiting_jobs_are_the_unstarted_pending_and_retrying_oldest_first_once() {
        let t0 = Instant::now();
        let mut a = table(t0);
        let ladder = [JobKey::new("acme", 2), JobKey::new("acme", 1)];
        let keys: Vec<u64> = a
            .waiting(ladder.iter())
            .into_iter()
            .map(|(_, k)| k.job_id)
            .collect();
        assert_eq!(keys, vec![2, 1], "oldest first, job 1 once");
        a.jobs.get_mut(&JobKey::new("acme", 2)).unwrap().started_at = Some(t0);
        assert!(
            !a.needs_runner(&JobKey::new("acme", 2)),
            "started elsewhere"
        );
        assert!(!a.needs_runner(&JobKey::new("acme", 3)), "at rest");
    }

    #[test]
    fn only_records_at_rest_past_their_windows_and_unreferenced_are_forgotten() {
        let t0 = Instant::now();
        let mut a = table(t0);
        let later = Now::whole_seconds(t0 + Duration::from_secs(700), 0);
        let done = JobKey::new("acme", 4);
        let referenced: HashSet<&JobKey> = [&done].into_iter().collect();
        let d = Duration::from_secs(600);
        let ttl = Ttl {
            seen: d,
            started: d,
            done: d,
        };
        let gone = a.prune(later, ttl, &referenced);
        assert_eq!(
            gone,
            vec![JobKey::new("acme", 3)],
            "pending, retrying and a runner's job stay"
        );
        assert_eq!(a.jobs.len(), 3);
        a.jobs.get_mut(&done).unwrap().seen_at = Some(later.mono);
        assert!(
            a.prune(later, ttl, &HashSet::new()).is_empty(),
            "seen a moment ago"
        );
    }

    #[test]
    fn a_finished_job_is_kept_for_its_retention_and_a_started_one_at_rest_for_longer() {
        let t0 = Instant::now();
        let mut a = table(t0);
        for (id, phase) in [(3, Phase::Seen), (4, Phase::Done)] {
            let rec = a.jobs.get_mut(&JobKey::new("acme", id)).unwrap();
            rec.phase = phase;
            rec.started_at = Some(t0);
        }
        let ttl = Ttl {
            seen: Duration::from_secs(60),
            started: Duration::from_secs(7200),
            done: Duration::from_secs(120),
        };
        let at = |secs| Now::whole_seconds(t0 + Duration::from_secs(secs), 0);
        assert!(
            a.prune(at(119), ttl, &HashSet::new()).is_empty(),
            "inside the retention"
        );
        assert_eq!(
            a.prune(at(120), ttl, &HashSet::new()),
            vec![JobKey::new("acme", 4)],
            "the finished job goes at its retention; one seen started, not finished, stays"
        );
        assert_eq!(
            a.prune(at(7200), ttl, &HashSet::new()),
            vec![JobKey::new("acme", 3)]
        );
    }
}
