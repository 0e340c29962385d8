//! The job table: one record per job, and the one place a record changes. A record's fields
//! are private; its phase moves only through the typed transitions below, each of which
//! refuses a move the state diagram (ARCHITECTURE.md, "A job's life") does not have, and its
//! counters and times change only through named methods. The scheduler's files decide *when*
//! a job moves; this file alone says *whether* it may.

use std::{
    collections::{HashMap, HashSet},
    sync::Arc,
    time::Duration,
};

use crate::{
    clock::{Instant, Now},
    config::PoolName,
    github::ErrorClass,
    job::{JobInfo, JobKey},
};

use super::{Note, ParkReason, Phase, RunnerRecord, TimelineEntry, timeline::TIMELINE_CAP};

/// What the scheduler knows about a job. Read through its accessors; changed only by the
/// `JobTable`.
#[derive(Debug, Clone)]
pub struct JobRecord {
    info: JobInfo,
    phase: Phase,
    /// Last admitted (the dedup window runs from here).
    seen_at: Option<Instant>,
    /// Observed `in_progress` or `completed` (any runner).
    started_at: Option<Instant>,
    /// When the first queued event for it arrived.
    received_at: Instant,
    /// Admissions so far (each a dispatch: a delivery, a reconcile, a heal).
    admissions: u32,
    /// Runners made for it that sat idle until the sweep reaped them (the zombie counter).
    idle_reaps: u8,
    /// Runners made for it that exited cleanly with no job seen on them, not yet explained by
    /// a late event.
    quiet_exits: u8,
    /// Runners made for it that GitHub refused as too old (exit code 7).
    outdated_exits: u8,
    /// What its ladder item held when it left the ladder (failures, the latest one's class).
    ladder_left: Option<(u32, ErrorClass)>,
    /// Every decision taken about it.
    timeline: Vec<TimelineEntry>,
    /// Fleet mode: delivered to another host's intake, which asks the ledger first.
    delivered_elsewhere: bool,
    /// Its trace was built (each job is traced once).
    traced: bool,
}

/// The phases a record may be made in: a job comes in seen (then admitted, or not), out of
/// scope, or already running.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Begin {
    /// Known, nothing in flight yet.
    Seen,
    /// Outside the configured scope.
    Ignored,
    /// First heard of running or finished.
    Done,
}

/// Where a job's dispatch may stop with nothing in flight.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Rest {
    /// Held: looked at again by a reconcile pass or the stranded heal.
    Seen,
    /// No pool covers it.
    Unroutable,
    /// It ran (elsewhere, or its runner's job was seen).
    Done,
}

/// A transition the state diagram does not have, or one asked of a job with no record.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    /// No record for the job.
    #[error("no record of the job")]
    Unknown,
    /// The record's phase has no edge to the asked one.
    #[error("no transition from {from} to {to}")]
    Edge {
        /// The phase it is in.
        from: &'static str,
        /// The phase asked for.
        to: &'static str,
    },
}

impl JobRecord {
    fn new(info: JobInfo, phase: Phase, received_at: Instant) -> Box<Self> {
        Box::new(JobRecord {
            info,
            phase,
            seen_at: None,
            started_at: None,
            received_at,
            admissions: 0,
            idle_reaps: 0,
            quiet_exits: 0,
            outdated_exits: 0,
            ladder_left: None,
            timeline: Vec::new(),
            delivered_elsewhere: false,
            traced: false,
        })
    }

    /// A record of `info` made in `begin`, received at `received_at`.
    pub(super) fn begin(info: JobInfo, begin: Begin, received_at: Instant) -> Box<Self> {
        let phase = match begin {
            Begin::Seen => Phase::Seen,
            Begin::Ignored => Phase::Ignored,
            Begin::Done => Phase::Done,
        };
        Self::new(info, phase, received_at)
    }

    /// A record in any phase, for tests that start from one.
    #[cfg(test)]
    pub(super) fn in_phase(info: JobInfo, phase: Phase, received_at: Instant) -> Box<Self> {
        Self::new(info, phase, received_at)
    }

    /// Sets when it was last seen, for tests that start from a record.
    #[cfg(test)]
    pub(super) fn set_seen_at(&mut self, at: Option<Instant>) {
        self.seen_at = at;
    }

    /// Adds a note, for tests that start from a record.
    #[cfg(test)]
    pub(super) fn push_note(&mut self, at_ms: u64, note: Note) {
        self.timeline.push(TimelineEntry { at_ms, note });
    }

    /// A record the store held: received at `received`, started at `started` (then done, its
    /// windows running from then), seen at `now` otherwise; its timeline says it was restored.
    pub(super) fn restored(
        info: JobInfo,
        received: Instant,
        started: Option<Instant>,
        now: Now,
    ) -> Box<Self> {
        let mut rec = Self::new(info, Phase::Seen, received);
        rec.seen_at = Some(now.mono);
        rec.started_at = started;
        if started.is_some() {
            rec.phase = Phase::Done;
            rec.seen_at = Some(received);
        }
        rec.timeline.push(TimelineEntry {
            at_ms: now.unix_ms,
            note: Note::Restored,
        });
        rec
    }

    /// Latest information.
    pub fn info(&self) -> &JobInfo {
        &self.info
    }

    /// Where it stands.
    pub fn phase(&self) -> &Phase {
        &self.phase
    }

    /// Last admitted (the dedup window runs from here).
    pub fn seen_at(&self) -> Option<Instant> {
        self.seen_at
    }

    /// Observed `in_progress` or `completed`, on any runner.
    pub fn started_at(&self) -> Option<Instant> {
        self.started_at
    }

    /// When the first queued event for it arrived.
    pub fn received_at(&self) -> Instant {
        self.received_at
    }

    /// Admissions so far.
    pub fn admissions(&self) -> u32 {
        self.admissions
    }

    /// Runners made for it reaped idle.
    pub fn idle_reaps(&self) -> u8 {
        self.idle_reaps
    }

    /// Runners made for it that exited cleanly with no job seen, not yet explained.
    pub fn quiet_exits(&self) -> u8 {
        self.quiet_exits
    }

    /// Runners made for it that GitHub refused as too old.
    pub fn outdated_exits(&self) -> u8 {
        self.outdated_exits
    }

    /// What its ladder item held when it left the ladder.
    pub fn ladder_left(&self) -> Option<(u32, ErrorClass)> {
        self.ladder_left
    }

    /// Every decision taken about it, oldest first.
    pub fn timeline(&self) -> &[TimelineEntry] {
        &self.timeline
    }

    /// Fleet mode: delivered to another host's intake.
    pub fn delivered_elsewhere(&self) -> bool {
        self.delivered_elsewhere
    }

    /// Its trace was built.
    pub fn traced(&self) -> bool {
        self.traced
    }

    /// Whether its phase is `Active` on runner `runner`.
    pub fn active_on(&self, runner: &str) -> bool {
        matches!(&self.phase, Phase::Active { runner: r, .. } if **r == *runner)
    }
}

/// Whether the state diagram has an edge from `from` to `to` (ARCHITECTURE.md, "A job's
/// life"). `Done` is final and reachable from anywhere; a claim starts only from `Pending`; a
/// runner is bound only to a job that waits for one, is held, or whose runner is replaced (never
/// to a parked, uncovered or out-of-scope one); a job with something in flight (a claim, a
/// runner) stops first before it can be found uncovered or out of scope.
pub fn edge(from: &Phase, to: &Phase) -> bool {
    use Phase::*;
    match (from, to) {
        (_, Done) => true,
        (Done, _) => false,
        (_, Claiming { .. }) => matches!(from, Pending),
        (_, Active { .. }) => {
            matches!(
                from,
                Claiming { .. } | Pending | Retrying | Active { .. } | Seen
            )
        }
        (_, Unroutable | Ignored) => !matches!(from, Claiming { .. } | Active { .. }),
        (_, Pending | Retrying | Seen | Parked { .. }) => true,
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

/// Every job's record, and the notes counter.
#[derive(Debug, Default)]
pub(super) struct JobTable {
    /// Boxed: a map slot is then a pointer, and its spare slots (a hash map keeps about a
    /// quarter free) cost 40 B each instead of the record's 300.
    /// A fast seeded hash: every delivery looks its job up here a few times (SipHash showed
    /// in the intake's profile, docs/benchmarks.md).
    jobs: HashMap<JobKey, Box<JobRecord>, foldhash::fast::RandomState>,
    /// Notes taken so far: every decision about a job takes one, so a page that saw this
    /// number has seen every change it shows.
    notes_taken: u64,
    /// Transitions refused so far (each a scheduler bug; the property test wants none).
    refused: u64,
    /// Every record's phases in order, from its making (`new`) on: the property test checks
    /// each history is a path of the diagram.
    #[cfg(test)]
    moves: Vec<(u64, &'static str, &'static str)>,
}

impl JobTable {
    /// `key`'s record.
    pub(super) fn get(&self, key: &JobKey) -> Option<&JobRecord> {
        self.jobs.get(key).map(|r| &**r)
    }

    /// Whether `key` has a record.
    pub(super) fn knows(&self, key: &JobKey) -> bool {
        self.jobs.contains_key(key)
    }

    /// Every record, with its key.
    pub(super) fn iter(&self) -> impl Iterator<Item = (&JobKey, &JobRecord)> {
        self.jobs.iter().map(|(k, r)| (k, &**r))
    }

    /// Every record.
    pub(super) fn records(&self) -> impl Iterator<Item = &JobRecord> {
        self.jobs.values().map(|r| &**r)
    }

    /// Notes taken so far.
    pub(super) fn notes_taken(&self) -> u64 {
        self.notes_taken
    }

    /// Transitions refused so far.
    #[cfg(test)]
    pub(super) fn refused(&self) -> u64 {
        self.refused
    }

    /// Puts `rec` in as `key`'s record (a restored one: no transition).
    pub(super) fn insert(&mut self, key: JobKey, rec: Box<JobRecord>) {
        self.moved(&key, "new", rec.phase.name());
        self.jobs.insert(key, rec);
    }

    /// Keeps a move in the history the tests read.
    #[cfg(test)]
    fn moved(&mut self, key: &JobKey, from: &'static str, to: &'static str) {
        self.moves.push((key.job_id, from, to));
    }

    /// Moves are kept for the tests only.
    #[cfg(not(test))]
    fn moved(&mut self, _: &JobKey, _: &'static str, _: &'static str) {}

    /// Every record's moves so far, oldest first: (job, from, to), `new` for its making.
    #[cfg(test)]
    pub(super) fn moves(&self) -> &[(u64, &'static str, &'static str)] {
        &self.moves
    }

    /// Makes `key`'s record with `make` unless there is one; whether it was made.
    pub(super) fn enter(&mut self, key: &JobKey, make: impl FnOnce() -> Box<JobRecord>) -> bool {
        if self.jobs.contains_key(key) {
            return false;
        }
        self.insert(key.clone(), make());
        true
    }

    fn rec(&mut self, key: &JobKey) -> Result<&mut JobRecord, Refused> {
        self.jobs
            .get_mut(key)
            .map(|r| &mut **r)
            .ok_or(Refused::Unknown)
    }

    /// Moves `key` to `to` along an edge of the diagram.
    fn go(&mut self, key: &JobKey, to: Phase) -> Result<(), Refused> {
        let rec = self.jobs.get_mut(key).ok_or(Refused::Unknown)?;
        if !edge(&rec.phase, &to) {
            let refused = Refused::Edge {
                from: rec.phase.name(),
                to: to.name(),
            };
            self.refused += 1;
            return Err(refused);
        }
        let from = std::mem::replace(&mut rec.phase, to).name();
        let to = rec.phase.name();
        self.moved(key, from, to);
        Ok(())
    }

    /// `key` waits for a slot and a claim token.
    pub(super) fn admit(&mut self, key: &JobKey) -> Result<(), Refused> {
        self.go(key, Phase::Pending)
    }

    /// A claim for `key` is in flight, for `provider`.
    pub(super) fn claim(&mut self, key: &JobKey, provider: PoolName) -> Result<(), Refused> {
        self.go(key, Phase::Claiming { provider })
    }

    /// `key` has runner `runner` of `provider`: claimed for it, handed over as a spare, or
    /// found in the ledger.
    pub(super) fn claimed(
        &mut self,
        key: &JobKey,
        provider: PoolName,
        runner: Arc<str>,
    ) -> Result<(), Refused> {
        self.go(key, Phase::Active { provider, runner })
    }

    /// `key` is on the retry ladder.
    pub(super) fn retry(&mut self, key: &JobKey) -> Result<(), Refused> {
        self.go(key, Phase::Retrying)
    }

    /// `key` is parked for `reason` until `look_unix`.
    pub(super) fn park(
        &mut self,
        key: &JobKey,
        reason: ParkReason,
        look_unix: u64,
    ) -> Result<(), Refused> {
        self.go(key, Phase::Parked { reason, look_unix })
    }

    /// Parked `key` is looked at again at `look_unix`, not sooner.
    pub(super) fn look_later(&mut self, key: &JobKey, look_unix: u64) -> Result<(), Refused> {
        match &mut self.rec(key)?.phase {
            Phase::Parked { look_unix: at, .. } => {
                *at = look_unix;
                self.moved(key, "parked", "parked");
                Ok(())
            }
            other => {
                let from = other.name();
                self.refused += 1;
                Err(Refused::Edge { from, to: "parked" })
            }
        }
    }

    /// `key` ran (here or elsewhere): nothing more to do.
    pub(super) fn complete(&mut self, key: &JobKey) -> Result<(), Refused> {
        self.go(key, Phase::Done)
    }

    /// `key`'s dispatch stops with nothing in flight, at `rest`.
    pub(super) fn rest(&mut self, key: &JobKey, rest: Rest) -> Result<(), Refused> {
        self.go(
            key,
            match rest {
                Rest::Seen => Phase::Seen,
                Rest::Unroutable => Phase::Unroutable,
                Rest::Done => Phase::Done,
            },
        )
    }

    /// `key` is out of the configured scope.
    pub(super) fn ignore(&mut self, key: &JobKey) -> Result<(), Refused> {
        self.go(key, Phase::Ignored)
    }

    /// `key`'s runner went: done if it was seen started, held otherwise. Only when its phase
    /// is `Active` on `runner` (a runner made for it and since handed another job is not its
    /// own); whether it moved.
    pub(super) fn runner_gone(&mut self, key: &JobKey, runner: &str) -> bool {
        let Some(rec) = self.jobs.get(key) else {
            return false;
        };
        if !rec.active_on(runner) {
            return false;
        }
        let rest = if rec.started_at.is_some() {
            Rest::Done
        } else {
            Rest::Seen
        };
        self.rest(key, rest).is_ok()
    }

    /// A new account of `key` (a delivery, a reconcile's answer): its information, kept what
    /// it said of the sender when the new account names none; seen at `now`.
    pub(super) fn learn(&mut self, job: JobInfo, now: Instant) -> Result<(), Refused> {
        let rec = self.rec(&job.key.clone())?;
        // What a delivery said about the job outlives a later account that says less (a
        // reconcile's REST answer names no sender).
        let about = match (rec.info.about.take(), job.about.clone()) {
            (Some(had), Some(new)) if new.sender.is_empty() => Some(had),
            (had, new) => new.or(had),
        };
        rec.info = job;
        rec.info.about = about;
        rec.seen_at = Some(now);
        Ok(())
    }

    /// Replaces `key`'s information whole (another host's account of it), seen at `now`.
    pub(super) fn replace_info(&mut self, job: JobInfo, now: Instant) -> Result<(), Refused> {
        let rec = self.rec(&job.key.clone())?;
        rec.info = job;
        rec.seen_at = Some(now);
        Ok(())
    }

    /// An `in_progress` or `completed` account of `job`: the runner it names, GitHub's own
    /// times, and its conclusion. Whether this is the first word of its completion.
    pub(super) fn heard_run(&mut self, job: &JobInfo) -> Result<bool, Refused> {
        let rec = self.rec(&job.key)?;
        rec.info.runner_name = job.runner_name.clone();
        rec.info.runner_id = job.runner_id;
        if rec.info.about.is_none() {
            rec.info.about = job.about.clone();
        }
        // GitHub's own times: a start is known from `in_progress` on, not at `queued`.
        if job.github_wait_secs.is_some() {
            rec.info.github_wait_secs = job.github_wait_secs;
        }
        if job.github_created_unix.is_some() {
            rec.info.github_created_unix = job.github_created_unix;
        }
        // The first word of its completion (a redelivered `completed` says it again).
        let completes = job.conclusion.is_some() && rec.info.conclusion.is_none();
        if job.conclusion.is_some() {
            rec.info.conclusion = job.conclusion.clone();
        }
        Ok(completes)
    }

    /// `key` was seen started at `at`, unless it was before; whether this is the first time.
    pub(super) fn started(&mut self, key: &JobKey, at: Instant) -> bool {
        match self.rec(key) {
            Ok(rec) if rec.started_at.is_none() => {
                rec.started_at = Some(at);
                true
            }
            _ => false,
        }
    }

    /// `key` was admitted (again) at `now`: one more admission, its dedup window restarted.
    pub(super) fn admitted_at(&mut self, key: &JobKey, now: Instant) {
        if let Ok(rec) = self.rec(key) {
            rec.admissions += 1;
            rec.seen_at = Some(now);
        }
    }

    /// One more admission of `key`, its dedup window left as it is.
    pub(super) fn count_admission(&mut self, key: &JobKey) {
        if let Ok(rec) = self.rec(key) {
            rec.admissions += 1;
        }
    }

    /// `key`'s dedup window is over: a re-dispatch passes the gate.
    pub(super) fn unsee(&mut self, key: &JobKey) {
        if let Ok(rec) = self.rec(key) {
            rec.seen_at = None;
        }
    }

    /// `key` is seen at `now` (its dedup window restarts).
    pub(super) fn seen_now(&mut self, key: &JobKey, now: Instant) {
        if let Ok(rec) = self.rec(key) {
            rec.seen_at = Some(now);
        }
    }

    /// A runner made for `key` was reaped idle: the count so far.
    pub(super) fn idle_reaped(&mut self, key: &JobKey) -> u8 {
        self.rec(key).map_or(0, |r| {
            r.idle_reaps = r.idle_reaps.saturating_add(1);
            r.idle_reaps
        })
    }

    /// A runner made for `key` exited cleanly with no job seen: the count so far (0 when
    /// the job has no record).
    pub(super) fn quiet_exit(&mut self, key: &JobKey) -> u8 {
        self.rec(key).map_or(0, |r| {
            r.quiet_exits = r.quiet_exits.saturating_add(1);
            r.quiet_exits
        })
    }

    /// A late event explained one of `key`'s quiet exits.
    pub(super) fn quiet_exit_explained(&mut self, key: &JobKey) {
        if let Ok(r) = self.rec(key) {
            r.quiet_exits = r.quiet_exits.saturating_sub(1);
        }
    }

    /// A runner made for `key` was refused as too old: the count so far (1 when the job has
    /// no record).
    pub(super) fn outdated_exit(&mut self, key: &JobKey) -> u8 {
        self.rec(key).map_or(1, |r| {
            r.outdated_exits = r.outdated_exits.saturating_add(1);
            r.outdated_exits
        })
    }

    /// `key` left the ladder holding `attempts` failures, the latest of `class`.
    pub(super) fn left_ladder(&mut self, key: &JobKey, attempts: u32, class: ErrorClass) {
        if let Ok(r) = self.rec(key) {
            r.ladder_left = Some((attempts, class));
        }
    }

    /// `key` was delivered to another host's intake.
    pub(super) fn delivered_elsewhere(&mut self, key: &JobKey) {
        if let Ok(r) = self.rec(key) {
            r.delivered_elsewhere = true;
        }
    }

    /// `key`'s trace was built.
    pub(super) fn traced(&mut self, key: &JobKey) {
        if let Ok(r) = self.rec(key) {
            r.traced = true;
        }
    }

    /// The held jobs never seen started (restored from the store): each one's dedup window
    /// ends, so its re-dispatch passes the gate; their information.
    pub(super) fn unsee_held(&mut self) -> Vec<JobInfo> {
        self.jobs
            .values_mut()
            .filter(|r| r.phase == Phase::Seen && r.started_at.is_none())
            .map(|r| {
                r.seen_at = None;
                r.info.clone()
            })
            .collect()
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

    /// Whether runner `r` is free to serve another job: alive, unbound, not on its way out,
    /// and the job it was made for no longer waits for it (started, gone, or moved on).
    pub(super) fn is_spare(&self, r: &RunnerRecord) -> bool {
        if r.bound.is_some() || r.tearing_down() || r.registration_deleted() || r.seen_busy() {
            return false;
        }
        self.get(&r.intent)
            .is_none_or(|j| j.started_at.is_some() || !j.active_on(&r.name))
    }

    /// Whether `key` waits for a runner: not started, and pending or on the ladder.
    pub(super) fn needs_runner(&self, key: &JobKey) -> bool {
        self.jobs.get(key).is_some_and(|j| {
            j.started_at.is_none() && matches!(j.phase, Phase::Pending | Phase::Retrying)
        })
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
        gone
    }

    /// Entries held: the records and their notes.
    pub(super) fn census(&self, out: &mut super::Census) {
        out.push(("scheduler.jobs", self.jobs.len()));
        out.push((
            "scheduler.timeline_notes",
            self.jobs.values().map(|r| r.timeline.len()).sum(),
        ));
    }
}

#[cfg(test)]
#[path = "job_table_tests.rs"]
mod tests;
