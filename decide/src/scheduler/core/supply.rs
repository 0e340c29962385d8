//! Fungibility as accounting. GitHub hands a JIT runner the oldest queued job its labels
//! cover, not the job it was made for. So demand is the set of jobs that wait for a runner
//! (pending, or on the ladder), supply is the runners claimed, booting or idle and not yet
//! bound, and a runner is *for* a job only until an event says otherwise:
//!
//! - a runner named in a sibling's event leaves its own job needing another (`runner_taken`):
//!   dispatched again at once, which is not a failure and counts toward nothing;
//! - an unbound runner whose job no longer needs it is a spare (`is_spare`), handed to the
//!   oldest waiting job it can serve (`rebalance`) before any new claim is made for it; a
//!   spare nobody can use is surplus, which the sweep reaps.

use super::{
    Effect, JobRecord, Note, Phase, RunnerRecord, capacity::SlotTable, job_table::JobTable,
    observation::Observation, runner_book::RunnerBook,
};
use super::{Setup, State, View};
use crate::clock::Instant;
use crate::{clock::Now, durable::Op, job::JobKey, vocab::LabelSet};
use std::sync::Arc;

/// A scale set's jobs as this daemon holds them ([`View::pool_demand`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PoolDemand {
    /// Not yet taken by a runner, oldest first (placeholders among them).
    pub waiting: Vec<JobKey>,
    /// Taken by a runner of ours that is still there.
    pub running: usize,
}

impl State {
    /// Runner `runner`, made for `intent`, was named in another job's event: `intent` lost its
    /// supply and waits for a runner again (a spare, or a new claim), at once.
    pub(super) fn runner_taken(
        &mut self,
        setup: &Setup,
        intent: &JobKey,
        runner: &Arc<str>,
        now: Now,
    ) {
        let Some(rec) = self.jobs.get(intent) else {
            return;
        };
        let its_own = rec.active_on(runner);
        let started = rec.started_at().is_some();
        if intent.is_reckoned() && its_own {
            // A placeholder's runner took an assigned job: the placeholder stood for exactly
            // that, and is done.
            let answer = self.jobs.complete(intent);
            self.moved(intent, answer);
            self.ops.push(Op::DeleteJob(intent.clone()));
            self.note(
                intent,
                now,
                Note::Recorded("its runner took a job assigned to the scale set".into()),
            );
            return;
        }
        if started || !its_own || self.draining {
            return;
        }
        let answer = self.jobs.admit(intent);
        if !self.moved(intent, answer) {
            return;
        }
        self.jobs.admitted_at(intent, now.mono);
        let t = setup.target_index(intent);
        self.admission.queue(t, intent.clone());
        let why = "its runner ran a sibling's job";
        self.observe(Observation::Requeued {
            job_id: intent.job_id,
            why,
        });
        self.note(intent, now, Note::Requeued { why });
    }

    /// Hands spares to the jobs that wait for a runner ([`handovers`] plans which to which).
    pub(super) fn rebalance(&mut self, setup: &Setup, now: Now, fx: &mut Vec<Effect>) {
        if self.draining {
            return;
        }
        let serves = |r: &RunnerRecord, job: &JobRecord, wanted: &LabelSet| {
            can_serve(
                setup,
                &self.capacity,
                r,
                &job.info().key,
                &job.info().repo,
                wanted,
            )
        };
        let plan = handovers(
            || {
                self.admission
                    .waiting(&self.jobs, self.ladder.queue().keys())
            },
            &self.jobs,
            &self.book,
            serves,
        );
        for (key, name) in plan {
            self.hand_over(&key, name, now, fx);
        }
    }

    /// Makes spare `name` the runner of waiting job `key` (its ladder item, if any, waits for
    /// this attempt, as for a claimed runner).
    fn hand_over(&mut self, key: &JobKey, name: Arc<str>, now: Now, _fx: &mut Vec<Effect>) {
        let Some((from, row)) = self.book.hand_over(&name, key, now.mono) else {
            return;
        };
        let provider = row.provider.clone();
        self.ops.push(Op::PutRunner(row));
        self.ladder.queue_mut().hold(key);
        let answer = self.jobs.claimed(key, provider, name.clone());
        self.moved(key, answer);
        self.observe(Observation::SpareHandedOver {
            job_id: key.job_id,
            runner: name.to_string(),
            from: from.job_id,
        });
        self.note(
            key,
            now,
            Note::SpareHandedOver {
                runner: name,
                from: from.job_id,
            },
        );
    }
}

/// Which spare each waiting job gets: oldest job first (`waiting` lists them in that order,
/// asked only when there is a spare), each the newest spare that `serves` it. A spare is an unbound runner whose job no longer needs it;
/// one GitHub is deleting now is not handed over (the deletion would take it).
pub(super) fn handovers(
    waiting: impl FnOnce() -> Vec<(Instant, JobKey)>,
    jobs: &JobTable,
    book: &RunnerBook,
    serves: impl Fn(&RunnerRecord, &JobRecord, &LabelSet) -> bool,
) -> Vec<(JobKey, Arc<str>)> {
    let mut spares: Vec<(Instant, &Arc<str>, &RunnerRecord)> = book
        .entries()
        .filter(|(_, r)| jobs.is_spare(r) && !r.idle_check_pending())
        .map(|(name, r)| (r.created_at(), name, r))
        .collect();
    spares.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| b.1.cmp(a.1)));
    let mut plan = Vec::new();
    if spares.is_empty() {
        return plan;
    }
    for (_, key) in waiting() {
        if spares.is_empty() {
            break;
        }
        let Some(job) = jobs.get(&key) else {
            continue;
        };
        let wanted = LabelSet::new(&job.info().labels);
        if let Some(pos) = spares.iter().position(|(_, _, r)| serves(r, job, &wanted)) {
            let (_, name, _) = spares.remove(pos);
            plan.push((key, name.clone()));
        }
    }
    plan
}

/// Whether runner `r` can take job `key` of `repo` that wants `wanted`: same target, same
/// repo for a repo-level runner, its pool's labels cover them.
fn can_serve(
    setup: &Setup,
    capacity: &SlotTable,
    r: &RunnerRecord,
    key: &JobKey,
    repo: &str,
    wanted: &LabelSet,
) -> bool {
    setup.target_index(&r.intent) == setup.target_index(key)
        && r.repo
            .as_deref()
            .is_none_or(|own| own.eq_ignore_ascii_case(repo))
        && setup
            .provider_index(&r.provider)
            .is_some_and(|i| capacity.set(i).covers(wanted))
}

impl<'a> View<'a> {
    /// What this daemon holds of the jobs routed by `pin` (a scale set's routing label) for
    /// `owner`: the ones that still wait for a runner to take them, and how many run on a
    /// runner of ours. GitHub's `totalAssignedJobs` for the scale set counts the same jobs.
    pub fn pool_demand(&self, owner: &str, pin: &str) -> PoolDemand {
        let mine = |key: &JobKey, labels: &[String]| {
            key.owner.eq_ignore_ascii_case(owner) && labels.iter().any(|l| l == pin)
        };
        let mut waiting: Vec<(Instant, JobKey)> = self
            .state
            .jobs
            .iter()
            .filter(|(key, j)| {
                mine(key, &j.info().labels)
                    && j.started_at().is_none()
                    && j.info().conclusion.is_none()
                    && !matches!(j.phase(), Phase::Done | Phase::Ignored | Phase::Unroutable)
            })
            .map(|(key, j)| (j.received_at(), key.clone()))
            .collect();
        waiting.sort();
        // Running: started, not completed, on a runner of ours (live, or gone a moment ago
        // with GitHub's `JobCompleted` not yet in).
        let bound: std::collections::HashSet<&JobKey> = self
            .state
            .book
            .runners()
            .filter_map(|r| r.bound.as_ref())
            .collect();
        let running = self
            .state
            .jobs
            .iter()
            .filter(|(key, j)| {
                mine(key, &j.info().labels)
                    && j.started_at().is_some()
                    && j.info().conclusion.is_none()
                    && (bound.contains(key)
                        || j.info().runner_name.as_deref().is_some_and(|n| {
                            self.state.book.has(n) || self.state.book.recent().get(n).is_some()
                        }))
            })
            .count();
        PoolDemand {
            waiting: waiting.into_iter().map(|(_, k)| k).collect(),
            running,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{config::PoolName, durable::RunnerRow, job::JobInfo};
    use std::time::Duration;

    fn spare(book: &mut RunnerBook, name: &str, made: Instant) {
        let row = RunnerRow {
            name: name.into(),
            id: 1,
            provider: PoolName::from("local"),
            repo: None,
            // Made for a job with no record (it ran elsewhere and was forgotten).
            intent: JobKey::new("acme", 99),
            bound: None,
            created_unix: 0,
        };
        book.insert(Arc::from(name), RunnerRecord::new(row, made));
    }

    fn waiting(jobs: &mut JobTable, id: u64, at: Instant) -> (Instant, JobKey) {
        let info = JobInfo {
            key: JobKey::new("acme", id),
            ..JobInfo::default()
        };
        let key = info.key.clone();
        jobs.insert(key.clone(), JobRecord::in_phase(info, Phase::Pending, at));
        (at, key)
    }

    fn names(plan: &[(JobKey, Arc<str>)]) -> Vec<(u64, &str)> {
        plan.iter().map(|(k, n)| (k.job_id, &**n)).collect()
    }

    #[test]
    fn the_oldest_job_gets_the_newest_spare_that_serves_it() {
        let t0 = Instant::now();
        let (mut book, mut jobs) = (RunnerBook::default(), JobTable::default());
        spare(&mut book, "old", t0);
        spare(&mut book, "new", t0 + Duration::from_secs(10));
        let queue = vec![waiting(&mut jobs, 1, t0), waiting(&mut jobs, 2, t0)];

        let any = |_: &RunnerRecord, _: &JobRecord, _: &LabelSet| true;
        let plan = handovers(|| queue.clone(), &jobs, &book, any);
        assert_eq!(names(&plan), [(1, "new"), (2, "old")]);

        // The newest spare cannot serve the oldest job: it takes the next, and the newest
        // goes to the job it can serve.
        let not_new_for_1 = |r: &RunnerRecord, j: &JobRecord, _: &LabelSet| {
            !(&*r.name == "new" && j.info().key.job_id == 1)
        };
        let plan = handovers(|| queue.clone(), &jobs, &book, not_new_for_1);
        assert_eq!(names(&plan), [(1, "old"), (2, "new")]);

        // Nobody served: no hand-over; more jobs than spares: the oldest are served.
        let none = |_: &RunnerRecord, _: &JobRecord, _: &LabelSet| false;
        assert!(handovers(|| queue.clone(), &jobs, &book, none).is_empty());
        let mut more = queue.clone();
        more.push(waiting(&mut jobs, 3, t0));
        assert_eq!(handovers(|| more, &jobs, &book, any).len(), 2);
    }

    #[test]
    fn with_no_spare_the_waiting_jobs_are_not_even_listed() {
        let (book, jobs) = (RunnerBook::default(), JobTable::default());
        let listed = |_: &RunnerRecord, _: &JobRecord, _: &LabelSet| true;
        let plan = handovers(|| panic!("listed with no spare"), &jobs, &book, listed);
        assert!(plan.is_empty());
    }
}
