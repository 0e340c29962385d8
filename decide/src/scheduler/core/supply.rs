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

use super::{Effect, Note, Phase, RunnerRecord, observation::Observation};
use super::{Setup, State, View};
use crate::clock::Instant;
use crate::{clock::Now, durable::Op, job::JobKey, vocab::LabelSet};
use std::sync::Arc;

/// A scale set's jobs as this daemon holds them ([`Scheduler::pool_demand`]).
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

    /// Hands spares to the jobs that wait for a runner: oldest job first, each to the newest
    /// spare that can serve it (same target, same repo for repo-level runners, labels covered).
    pub(super) fn rebalance(&mut self, setup: &Setup, now: Now, fx: &mut Vec<Effect>) {
        let mut spares: Vec<(Instant, Arc<str>)> = self
            .book
            .entries()
            // One GitHub is deleting now is not handed over: the deletion would take it.
            .filter(|(_, r)| self.jobs.is_spare(r) && !r.idle_check_pending())
            .map(|(name, r)| (r.created_at(), name.clone()))
            .collect();
        if spares.is_empty() || self.draining {
            return;
        }
        spares.sort_by(|a, b| b.cmp(a));
        let waiting = self
            .admission
            .waiting(&self.jobs, self.ladder.queue().keys());
        for (_, key) in waiting {
            if spares.is_empty() {
                break;
            }
            let Some(job) = self.jobs.get(&key) else {
                continue;
            };
            let wanted = LabelSet::new(&job.info().labels);
            let target = setup.target_index(&key);
            let serves = |name: &Arc<str>| {
                self.book
                    .runner(name)
                    .is_some_and(|r| self.can_serve(setup, r, target, &job.info().repo, &wanted))
            };
            if let Some(pos) = spares.iter().position(|(_, name)| serves(name)) {
                let (_, name) = spares.remove(pos);
                self.hand_over(&key, name, now, fx);
            }
        }
    }

    /// Whether runner `r` can take a job of `target` in `repo` that wants `wanted`.
    fn can_serve(
        &self,
        setup: &Setup,
        r: &RunnerRecord,
        target: usize,
        repo: &str,
        wanted: &LabelSet,
    ) -> bool {
        setup.target_index(&r.intent) == target
            && r.repo
                .as_deref()
                .is_none_or(|own| own.eq_ignore_ascii_case(repo))
            && setup
                .provider_index(&r.provider)
                .is_some_and(|i| self.capacity.set(i).covers(wanted))
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
