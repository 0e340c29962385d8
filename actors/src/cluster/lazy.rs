//! What a host writes to the ledger without waiting for it: the registrations it made and
//! the ones that went, the ladder of the jobs it holds (from the scheduler's store ops), and
//! the `in_progress` and `completed` deliveries it answered. None of them is something a
//! survivor needs at once (docs/fleet.md, "What the ledger promises"), so none costs a round
//! trip of its own on the happy path: they ride along the next round trip this host makes
//! anyway (a `queued` delivery's record, a claim decision), and go on their own only after
//! [`LINGER`] without one, or at once when a cordoned or draining host gives jobs back.
//!
//! One writer at a time (a rider, or the mirror task), in the order they were made; a write
//! the database refused goes back in front of what came since, and is tried again.

use std::{
    collections::HashSet,
    sync::Mutex,
    time::{Duration, Instant},
};

use crate::{
    durable::Op,
    job::{JobAction, JobInfo},
};

/// How long a lazy change waits for a round trip to ride on before it goes on its own.
pub(crate) const LINGER: Duration = Duration::from_secs(1);

/// Job events held at most; past that a delivery is recorded before its answer again (a
/// ledger down for long: the memory stays bounded and GitHub is told 503).
pub(crate) const MAX_EVENTS: usize = 20_000;

/// What waits to be written.
#[derive(Debug, Default)]
pub(crate) struct Batch {
    /// Store ops the ledger keeps, in order.
    pub ops: Vec<Op>,
    /// Job events, at most one per job: the furthest along (a job's `completed` makes its
    /// `in_progress` moot, and one statement cannot move a row twice).
    pub events: Vec<(JobAction, JobInfo)>,
    /// Give this host's unstarted jobs back to the fleet once the rest is written.
    pub release: bool,
}

impl Batch {
    /// Whether there is nothing to write.
    pub(crate) fn is_empty(&self) -> bool {
        self.ops.is_empty() && self.events.is_empty() && !self.release
    }

    /// Adds `action` for `info`'s job, keeping one event per job: the later one, unless the
    /// earlier is further along.
    fn add_event(&mut self, action: JobAction, info: JobInfo) {
        let rank = |a: JobAction| match a {
            JobAction::Completed => 2,
            _ => 1,
        };
        match self.events.iter_mut().find(|(_, i)| i.key == info.key) {
            Some(held) if rank(held.0) <= rank(action) => *held = (action, info),
            Some(_) => {}
            None => self.events.push((action, info)),
        }
    }

    /// `later` after this batch, in order.
    fn append(&mut self, later: Batch) {
        self.ops.extend(later.ops);
        for (action, info) in later.events {
            self.add_event(action, info);
        }
        self.release |= later.release;
    }
}

#[derive(Debug, Default)]
struct Pending {
    batch: Batch,
    /// When the oldest change in `batch` was made.
    since: Option<Instant>,
    /// Registrations sent (a runner's row is put again when it binds to a job; the ledger's
    /// row does not change, so it is not sent again).
    mirrored: HashSet<String>,
}

/// The queue of lazy changes, shared by every handle on one host's ledger.
#[derive(Debug, Default)]
pub(crate) struct Lazy {
    pending: Mutex<Pending>,
    /// Held by whoever is writing a batch: one batch in flight at a time keeps the order.
    pub(super) writer: std::sync::Arc<tokio::sync::Mutex<()>>,
    pub(super) wake: tokio::sync::Notify,
}

impl Lazy {
    fn pending(&self) -> std::sync::MutexGuard<'_, Pending> {
        self.pending.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Queues the store ops the ledger keeps (the others are host-local).
    pub(crate) fn push_ops(&self, ops: &[Op], release: bool) {
        let mut p = self.pending();
        let before = (p.batch.ops.len(), p.batch.release);
        for op in ops {
            let keep = match op {
                Op::PutRunner(r) => p.mirrored.insert(r.name.clone()),
                Op::DeleteRunner(name) => {
                    p.mirrored.remove(name);
                    true
                }
                Op::PutRetry(_) | Op::Unregistered(_) => true,
                _ => false,
            };
            if keep {
                p.batch.ops.push(op.clone());
            }
        }
        p.batch.release |= release;
        if (p.batch.ops.len(), p.batch.release) != before {
            p.since.get_or_insert_with(Instant::now);
            drop(p);
            self.wake.notify_one();
        }
    }

    /// Queues a job event; false when [`MAX_EVENTS`] are held already.
    pub(crate) fn push_event(&self, action: JobAction, info: JobInfo) -> bool {
        let mut p = self.pending();
        if p.batch.events.len() >= MAX_EVENTS {
            return false;
        }
        p.batch.add_event(action, info);
        p.since.get_or_insert_with(Instant::now);
        drop(p);
        self.wake.notify_one();
        true
    }

    /// When the queue should be written on its own: `None` when empty, now when jobs are to
    /// be given back, else [`LINGER`] after its oldest change.
    pub(crate) fn due(&self) -> Option<Instant> {
        let p = self.pending();
        if p.batch.is_empty() {
            return None;
        }
        let since = p.since.unwrap_or_else(Instant::now);
        Some(if p.batch.release {
            since.min(Instant::now())
        } else {
            since + LINGER
        })
    }

    /// Everything queued, for a writer (who holds `writer`).
    pub(super) fn take(&self) -> Batch {
        let mut p = self.pending();
        p.since = None;
        std::mem::take(&mut p.batch)
    }

    /// A batch the database refused goes back in front of what came since.
    pub(super) fn put_back(&self, mut batch: Batch) {
        let mut p = self.pending();
        let since = p.since.take();
        batch.append(std::mem::take(&mut p.batch));
        p.batch = batch;
        p.since = Some(since.unwrap_or_else(Instant::now));
    }

    /// Whether a round trip may take the queue along: something is queued, no other write
    /// is out, and no jobs are to be given back (that waits for the mirror task).
    pub(super) fn rideable(&self) -> bool {
        let p = self.pending();
        !p.batch.is_empty() && !p.batch.release
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{job::JobKey, scheduler::fixtures::job};

    fn on(id: u64) -> JobInfo {
        job(id, &["self-hosted"])
    }

    #[test]
    fn one_event_per_job_the_furthest_along() {
        let lazy = Lazy::default();
        assert!(lazy.due().is_none());
        assert!(lazy.push_event(JobAction::InProgress, on(1)));
        assert!(lazy.push_event(JobAction::InProgress, on(2)));
        assert!(lazy.push_event(JobAction::Completed, on(1)));
        // A late copy of an in_progress does not undo the completed.
        assert!(lazy.push_event(JobAction::InProgress, on(1)));
        let due = lazy.due().expect("something is queued");
        assert!(due > Instant::now() + LINGER / 2, "it lingers");
        let b = lazy.take();
        let got: Vec<(JobAction, u64)> = b.events.iter().map(|(a, i)| (*a, i.key.job_id)).collect();
        assert_eq!(got, [(JobAction::Completed, 1), (JobAction::InProgress, 2)]);
        assert!(lazy.due().is_none());
    }

    #[test]
    fn a_refused_batch_goes_back_in_front_and_a_release_is_due_at_once() {
        let lazy = Lazy::default();
        let runner = crate::durable::RunnerRow {
            name: "r1".into(),
            id: 7,
            provider: crate::config::PoolName::from("local"),
            repo: None,
            intent: JobKey::new("acme", 1),
            bound: None,
            created_unix: 0,
        };
        lazy.push_ops(&[Op::PutRunner(runner.clone())], false);
        // Put again when it binds: not sent twice.
        lazy.push_ops(&[Op::PutRunner(runner)], false);
        let first = lazy.take();
        assert_eq!(first.ops.len(), 1);
        lazy.push_ops(&[Op::DeleteRunner("r1".into())], false);
        lazy.put_back(first);
        let b = lazy.take();
        assert!(matches!(b.ops[0], Op::PutRunner(_)));
        assert!(matches!(b.ops[1], Op::DeleteRunner(_)));
        assert!(!lazy.rideable());
        lazy.push_ops(&[], true);
        assert!(!lazy.rideable(), "a release waits for the mirror task");
        assert!(lazy.due().unwrap() <= Instant::now());
        // Host-local ops are not the ledger's.
        let fresh = Lazy::default();
        fresh.push_ops(&[Op::JobStarted(JobKey::new("a", 1), 1)], false);
        assert!(fresh.due().is_none());
    }
}
