//! Durability: the state changes handed to the store, and rebuilding state after a restart.

use super::{
    Effect, JobRecord, Phase, RunnerRecord, Scheduler, job_table::Begin, observation::Observation,
};
use super::{Setup, State};
use crate::{
    clock::Now,
    durable::{Op, Snapshot},
    job::JobInfo,
};
use std::{sync::Arc, time::Duration};

impl Scheduler {
    /// State changes to make durable since the last call (the actor hands them to the store).
    pub fn take_ops(&mut self) -> Vec<Op> {
        std::mem::take(&mut self.state.ops)
    }

    /// Rebuilds the state a previous run left in the store. Ledger runners hold their slots
    /// (their provisioners adopt or clean them up and report back); jobs on the ladder wait
    /// for it; jobs observed running stay satisfied. Returns the open jobs that had nothing in
    /// flight (the caller dispatches them again through the normal path), and the effects of
    /// the restored ladder (its timer).
    pub fn restore(&mut self, snapshot: &Snapshot, now: Now) -> (Vec<JobInfo>, Vec<Effect>) {
        self.state.restore_jobs(snapshot, now);
        self.state.restore_runners(&self.setup, snapshot, now);
        let mut fx = Vec::new();
        self.state.restore_ladder(snapshot, now, &mut fx);
        self.state.rearm_timer(&mut fx);
        // Let the re-dispatch through the dedup gate.
        let redo: Vec<JobInfo> = self.state.jobs.unsee_held();
        self.state.observe(Observation::Restored {
            jobs: snapshot.jobs.len(),
            runners: snapshot.runners.len(),
            retries: snapshot.retries.len(),
            redispatch: redo.len(),
        });
        (redo, fx)
    }
}

impl State {
    /// The jobs the store held: seen, and done when they were observed running.
    fn restore_jobs(&mut self, snapshot: &Snapshot, now: Now) {
        let ago = |unix| ago(now, unix);
        for row in &snapshot.jobs {
            let mut info = row.info.clone();
            self.admission.shared_mut().job(&mut info);
            let key = info.key.clone();
            let rec =
                JobRecord::restored(info, ago(row.received_unix), row.started_unix.map(ago), now);
            self.jobs.insert(key, rec);
        }
    }

    /// The runners the store held: each holds its slot, and its job is active on it unless
    /// the job was observed running.
    fn restore_runners(&mut self, setup: &Setup, snapshot: &Snapshot, now: Now) {
        let ago = |unix| ago(now, unix);
        for r in &snapshot.runners {
            let Some(i) = setup.provider_index(&r.provider) else {
                // The provider was disabled since: nothing will adopt it; forget it.
                self.ops.push(Op::DeleteRunner(r.name.clone()));
                continue;
            };
            self.capacity.take(i);
            self.observe(Observation::RunnerAdded {
                provider: r.provider.clone(),
            });
            let handle: Arc<str> = Arc::from(r.name.as_str());
            self.book.insert(
                handle.clone(),
                RunnerRecord::restored(r.clone(), ago(r.created_unix), now.mono),
            );
            self.jobs.enter(&r.intent, || {
                JobRecord::begin(
                    JobInfo {
                        key: r.intent.clone(),
                        ..JobInfo::default()
                    },
                    Begin::Seen,
                    now.mono,
                )
            });
            if self
                .jobs
                .get(&r.intent)
                .is_some_and(|j| j.started_at().is_none())
            {
                let answer = self.jobs.claimed(&r.intent, r.provider.clone(), handle);
                self.moved(&r.intent, answer);
            }
        }
    }

    /// The ladder comes back with its original times; an item whose job has moved on
    /// (started, or a runner in the ledger) leaves it.
    fn restore_ladder(&mut self, snapshot: &Snapshot, now: Now, fx: &mut Vec<Effect>) {
        // The ladder comes back with its original times; an item whose job has moved on
        // (started, or a runner in the ledger) leaves it.
        self.ladder
            .queue_mut()
            .restore(&snapshot.retries, now.mono, now.unix);
        for r in &snapshot.retries {
            if !self.jobs.knows(&r.job.key) {
                let mut info = r.job.clone();
                self.admission.shared_mut().job(&mut info);
                let key = info.key.clone();
                self.jobs
                    .insert(key, JobRecord::begin(info, Begin::Seen, now.mono));
            }
            let Some(rec) = self.jobs.get(&r.job.key) else {
                continue;
            };
            if rec.started_at().is_none() && *rec.phase() == Phase::Seen {
                let answer = self.jobs.retry(&r.job.key);
                self.moved(&r.job.key, answer);
            } else if rec.started_at().is_none() && matches!(rec.phase(), Phase::Active { .. }) {
                // An attempt was in flight (a runner in the ledger): the item waits for it.
                self.ladder.queue_mut().hold(&r.job.key);
            } else {
                self.leave_ladder(&r.job.key, fx);
            }
        }
    }
}

/// The monotonic instant of unix second `unix`, read against `now` (now, for one ahead).
fn ago(now: Now, unix: u64) -> crate::clock::Instant {
    now.mono
        .checked_sub(Duration::from_secs(now.unix.saturating_sub(unix)))
        .unwrap_or(now.mono)
}
