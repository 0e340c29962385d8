//! Admission: the queue of jobs waiting for a slot or a claim token, the shared copies of the
//! strings jobs repeat, and what the last reconcile pass found held idle. The records
//! themselves are the job table's (`job_table.rs`).

use std::collections::VecDeque;

use crate::clock::Instant;

use super::{job_table::JobTable, shared::Shared};
use crate::job::JobKey;

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
    fn push_back(&mut self, target: usize, key: JobKey) {
        self.queue(target).push_back(key);
    }

    /// `key`, of `target`, is next (it was first already, and waits for a token).
    fn push_front(&mut self, target: usize, key: JobKey) {
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
    fn take(&mut self, targets: usize) -> Vec<VecDeque<JobKey>> {
        let mut queues = std::mem::take(&mut self.queues);
        queues.resize_with(targets.max(queues.len()), VecDeque::new);
        queues
    }

    fn restore(&mut self, queues: Vec<VecDeque<JobKey>>) {
        self.queues = queues;
    }
}

/// The queue and what it shares.
#[derive(Debug)]
pub(super) struct Admission {
    /// Jobs waiting for a slot or a claim token, per target, oldest first.
    pending: Pending,
    /// One copy of each owner, repository, label set and conclusion the jobs repeat.
    shared: Shared,
    /// Per target: jobs its last reconcile pass found queued on GitHub that the daemon holds
    /// idle (parked before their look, or cordoned).
    held_idle: Vec<usize>,
}

impl Admission {
    /// An empty queue for `targets` targets.
    pub(super) fn new(targets: usize) -> Self {
        Admission {
            pending: Pending::new(targets),
            shared: Shared::default(),
            held_idle: vec![0; targets],
        }
    }

    /// The jobs waiting for a slot or a claim token.
    pub(super) fn pending(&self) -> &Pending {
        &self.pending
    }

    /// `key`, of `target`, waits behind the others.
    pub(super) fn queue(&mut self, target: usize, key: JobKey) {
        self.pending.push_back(target, key);
    }

    /// `key`, of `target`, is next (it was first already, and waits for a token).
    pub(super) fn queue_first(&mut self, target: usize, key: JobKey) {
        self.pending.push_front(target, key);
    }

    /// The queues, `targets` of them, taken out to decide on (give them back with
    /// [`Admission::restore_queues`]).
    pub(super) fn take_queues(&mut self, targets: usize) -> Vec<VecDeque<JobKey>> {
        self.pending.take(targets)
    }

    /// The queues taken out, back.
    pub(super) fn restore_queues(&mut self, queues: Vec<VecDeque<JobKey>>) {
        self.pending.restore(queues);
    }

    /// The shared strings, to intern a job's or a runner's.
    pub(super) fn shared_mut(&mut self) -> &mut Shared {
        &mut self.shared
    }

    /// Forgets the shared copies no job or runner holds any more.
    pub(super) fn prune_shared(&mut self) {
        self.shared.prune();
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

    /// The jobs of `table` that wait for a runner, among the pending ones and `on_ladder`:
    /// oldest first, each once.
    pub(super) fn waiting<'a>(
        &'a self,
        table: &JobTable,
        on_ladder: impl Iterator<Item = &'a JobKey>,
    ) -> Vec<(Instant, JobKey)> {
        let mut waiting: Vec<(Instant, JobKey)> = self
            .pending
            .iter()
            .chain(on_ladder)
            .filter(|k| table.needs_runner(k))
            .filter_map(|k| Some((table.get(k)?.received_at(), k.clone())))
            .collect();
        waiting.sort();
        waiting.dedup();
        waiting
    }

    /// Entries held: the waiting queues, the shared copies.
    pub(super) fn census(&self, out: &mut super::Census) {
        out.push(("scheduler.pending", self.pending.len()));
        self.shared.census(out);
    }
}
