//! Intake: `workflow_job` events through the dedup gate, label coverage and cordon; observed
//! starts and completions bind runners (a runner bound to a sibling's job leaves its own job
//! needing another) and trigger teardown.

use super::{
    DeliveryId, Effect, JobRecord, Note, Phase, Scheduler, bounded_conclusion,
    capacity::Pick,
    job_table::{Begin, Rest},
    observation::Observation,
};
use super::{Setup, State};
use crate::clock::Instant;
use crate::{
    clock::Now,
    durable::Op,
    job::{JobAction, JobInfo, JobKey},
};
use std::time::Duration;

/// What the dedup gate makes of a `queued` event, from the job's record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Gate {
    /// Not held: admit it (first delivery, or a record at rest past its seen TTL).
    New,
    /// Parked, and not cordoned: the delivery is a reason to look at it again.
    Parked,
    /// In flight, done (a `queued` that arrives after the job's `in_progress`: GitHub does
    /// not promise the order), or seen within the seen TTL: a duplicate that costs nothing.
    Duplicate,
}

impl Gate {
    /// The gate's verdict on `rec` (`None`: never seen) at `now`; while `cordoned`, a parked
    /// job is judged as any other record at rest.
    fn of(rec: Option<&JobRecord>, seen_ttl: Duration, cordoned: bool, now: Now) -> Gate {
        let Some(rec) = rec else {
            return Gate::New;
        };
        if matches!(rec.phase(), Phase::Parked { .. }) && !cordoned {
            return Gate::Parked;
        }
        let in_flight = matches!(
            rec.phase(),
            Phase::Pending
                | Phase::Claiming { .. }
                | Phase::Retrying
                | Phase::Active { .. }
                | Phase::Done
        );
        let recently_seen = rec
            .seen_at()
            .is_some_and(|at| now.mono.saturating_duration_since(at) < seen_ttl);
        if in_flight || recently_seen {
            Gate::Duplicate
        } else {
            Gate::New
        }
    }
}

impl Scheduler {
    /// A `workflow_job` event (webhook or reconcile).
    pub fn on_job_event(
        &mut self,
        action: JobAction,
        job: JobInfo,
        delivery: Option<&str>,
        received: Instant,
        now: Now,
    ) -> Vec<Effect> {
        let mut fx = Vec::new();
        let mut job = job;
        let outside = self.state.out_of_scope(&self.setup, &job);
        if outside.is_none() && action == JobAction::Queued {
            // The dedup gate before anything else: a delivery it turns away keeps nothing of
            // the job, so its strings are not looked up in the shared table (a redelivery storm
            // is mostly these).
            if self
                .state
                .held_already(&self.setup, &job.key, delivery, now, &mut fx)
            {
                return fx;
            }
        }
        self.state.admission.shared_mut().job(&mut job);
        if let Some(reason) = outside {
            self.state
                .ignore(&self.setup, action, job, reason, received, now);
            return fx;
        }
        match action {
            JobAction::Queued => {
                self.state
                    .queued_past_the_gate(&self.setup, job, delivery, received, now, &mut fx)
            }
            JobAction::InProgress | JobAction::Completed => {
                self.state
                    .on_started(&self.setup, action, job, delivery, now, &mut fx)
            }
            JobAction::Waiting => {
                let key = job.key.clone();
                self.state.note(&key, now, Note::AwaitingApproval);
            }
        }
        fx
    }
}

impl State {
    /// Why `job` is none of this daemon's business, if it is not: an owner no target has
    /// (case-insensitive), a repo outside its target's `repos` (when set), another App
    /// installation than its target's.
    pub(super) fn out_of_scope(&self, setup: &Setup, job: &JobInfo) -> Option<&'static str> {
        let Some(t) = setup.target_of(&job.key.owner) else {
            return Some("owner");
        };
        let s = &setup.settings.targets[t];
        if !s.repos.is_empty() && !s.repos.iter().any(|r| r.eq_ignore_ascii_case(&job.repo)) {
            return Some("repo");
        }
        if let (Some(ours), Some(theirs)) = (s.installation_id, job.installation_id)
            && ours != theirs
        {
            return Some("installation");
        }
        None
    }

    /// Leaves an out-of-scope job alone: no claim, no call; a queued one is remembered (so
    /// `jobs ID` says why) and counted.
    pub(super) fn ignore(
        &mut self,
        setup: &Setup,
        action: JobAction,
        job: JobInfo,
        reason: &'static str,
        received: Instant,
        now: Now,
    ) {
        self.observe(Observation::Ignored {
            job_id: job.key.job_id,
            reason,
        });
        if reason == "installation" {
            // Said and counted, never remembered: a job of the owner's that a delivery
            // mislabelled is admitted by the next reconcile, which lists with our own
            // installation (an ignored record would hide it from that pass).
            let t = setup.target_of(&job.key.owner);
            let ours = t.and_then(|t| setup.settings.targets[t].installation_id);
            if let (Some(installation), Some(ours)) = (job.installation_id, ours) {
                self.observe(Observation::OtherInstallation {
                    job_id: job.key.job_id,
                    repo: job.repo.to_string(),
                    installation,
                    ours,
                });
            }
            return;
        }
        if action != JobAction::Queued {
            return;
        }
        let key = job.key.clone();
        self.jobs
            .enter(&key, || JobRecord::begin(job, Begin::Ignored, received));
        self.jobs.seen_now(&key, now.mono);
        let answer = self.jobs.ignore(&key);
        self.moved(&key, answer);
        self.note(&key, now, Note::OutOfScope { reason });
    }

    pub(super) fn on_queued(
        &mut self,
        setup: &Setup,
        job: JobInfo,
        delivery: Option<&str>,
        received: Instant,
        now: Now,
        fx: &mut Vec<Effect>,
    ) {
        // 1. The dedup gate: running, pending, seen. Before the label check, so a job nobody
        //    covers costs nothing when it is delivered again.
        if self.held_already(setup, &job.key, delivery, now, fx) {
            return;
        }
        self.queued_past_the_gate(setup, job, delivery, received, now, fx);
    }

    /// A `queued` job the dedup gate let through.
    fn queued_past_the_gate(
        &mut self,
        setup: &Setup,
        job: JobInfo,
        delivery: Option<&str>,
        received: Instant,
        now: Now,
        fx: &mut Vec<Effect>,
    ) {
        let key = job.key.clone();
        self.jobs.enter(&key, || {
            JobRecord::begin(job.clone(), Begin::Seen, received)
        });
        let labels = job.labels.clone();
        let answer = self.jobs.learn(job, now.mono);
        self.moved(&key, answer);
        self.note(
            &key,
            now,
            Note::Queued {
                delivery: delivery.map(DeliveryId::new),
            },
        );

        // 2. Label coverage.
        if matches!(
            self.pick(setup, &labels, setup.target_index(&key)),
            Pick::Uncovered
        ) {
            let answer = self.jobs.rest(&key, Rest::Unroutable);
            self.moved(&key, answer);
            self.note(
                &key,
                now,
                Note::Unroutable {
                    labels: labels.clone(),
                },
            );
            self.observe(Observation::Unroutable {
                job_id: key.job_id,
                delivery: delivery.map(str::to_string),
                labels,
            });
            return;
        }
        // 3. Cordon: seen kept, not pending (a reconcile pass after the uncordon admits it).
        if self.draining {
            let answer = self.jobs.rest(&key, Rest::Seen);
            self.moved(&key, answer);
            self.note(&key, now, Note::CordonedNotAdmitted);
            return;
        }
        // 4. Pending: wait for a slot and a claim token (or a spare runner).
        self.jobs.count_admission(&key);
        let answer = self.jobs.admit(&key);
        self.moved(&key, answer);
        let t = setup.target_index(&key);
        self.admission.queue(t, key.clone());
        self.note(&key, now, Note::Admitted);
        // A spare (a registered warm runner, a runner whose job ran elsewhere) first.
        self.rebalance(setup, now, fx);
        self.pump(setup, now, fx);
    }

    /// The dedup gate, which every `queued` event in scope passes (and is counted at): whether
    /// it is for a job the daemon holds already (in flight, or seen within the seen TTL). A
    /// parked job is looked at again instead.
    fn held_already(
        &mut self,
        setup: &Setup,
        key: &JobKey,
        delivery: Option<&str>,
        now: Now,
        fx: &mut Vec<Effect>,
    ) -> bool {
        self.stats.queued_events += 1;
        let rec = self.jobs.get(key);
        match Gate::of(rec, setup.settings.seen_ttl, self.draining, now) {
            Gate::New => false,
            Gate::Parked => {
                self.admit_again(setup, key, "delivery", now);
                self.pump(setup, now, fx);
                true
            }
            Gate::Duplicate => {
                self.stats.duplicates += 1;
                self.observe(Observation::Duplicate {
                    job_id: key.job_id,
                    delivery: delivery.map(str::to_string),
                });
                true
            }
        }
    }

    pub(super) fn on_started(
        &mut self,
        setup: &Setup,
        action: JobAction,
        job: JobInfo,
        delivery: Option<&str>,
        now: Now,
        fx: &mut Vec<Effect>,
    ) {
        let key = job.key.clone();
        let runner_name = job.runner_name.clone();
        let withdrawn = job.withdrawn;
        self.jobs.enter(&key, || {
            JobRecord::begin(job.clone(), Begin::Done, now.mono)
        });
        if self.jobs.started(&key, now.mono) {
            self.ops.push(Op::JobStarted(key.clone(), now.unix));
        }
        let completes = self.jobs.heard_run(&job).unwrap_or(false);
        // Seen running: done, unless a claim or a runner of ours for it ends by itself.
        if !matches!(
            self.jobs.get(&key).map(JobRecord::phase),
            Some(Phase::Claiming { .. } | Phase::Active { .. } | Phase::Done)
        ) {
            let answer = self.jobs.complete(&key);
            self.moved(&key, answer);
        }
        self.leave_ladder(&key, fx);
        let runner = runner_name.as_deref().map(|n| self.runner_handle(n));
        self.note(&key, now, Note::Observed { action, runner });
        self.observe(Observation::JobObserved {
            job_id: key.job_id,
            delivery: delivery.map(str::to_string),
            runner: runner_name.clone(),
            action,
        });

        self.bind_named_runner(setup, &key, &job, now, fx);
        if action == JobAction::Completed && completes && !withdrawn {
            self.record_usage(setup, &key, now);
        }
        if action == JobAction::Completed {
            self.on_completed(setup, &job, now, fx);
            fx.extend(self.sweep(setup, now));
        } else {
            self.rebalance(setup, now, fx);
        }
        self.pump(setup, now, fx);
    }

    /// Binds the runner `job`'s event names to it, if it is ours (name and id), and notes a
    /// runner that took another job than its own. A runner already gone that is named now
    /// did run a job: no registration to delete, and a clean exit of it counted against its
    /// job is explained.
    fn bind_named_runner(
        &mut self,
        setup: &Setup,
        key: &JobKey,
        job: &JobInfo,
        now: Now,
        fx: &mut Vec<Effect>,
    ) {
        let runner_name = &job.runner_name;
        if let Some(intent) = runner_name
            .as_ref()
            .and_then(|n| self.book.gone_ran_a_job(n.as_str()))
        {
            self.jobs.quiet_exit_explained(&intent);
        }
        // Ours only if the name *and* the id match (a name alone could be another's).
        let runner_id = job.runner_id;
        if let Some(name) = &runner_name
            && let Some(named) = self.book.named(name.as_str(), runner_id, key)
        {
            let bound_now = named.bound_now.is_some();
            if let Some(row) = named.bound_now {
                self.ops.push(Op::PutRunner(row));
            }
            let (intent, provider) = (named.intent, named.provider);
            let warm_start = named.warm_start;
            if bound_now {
                // GitHub takes the pool's runners: an outage of its refusals is over.
                self.refusal_passed(setup, &provider, now, fx);
                self.job_taken(setup, key, provider, warm_start, job.github_wait_secs);
            }
            if intent != *key && !intent.is_warm() {
                self.observe(Observation::RunnerTookOther {
                    job_id: key.job_id,
                    runner: name.clone(),
                    intended: intent.job_id,
                });
                let runner = self.runner_handle(name);
                self.note(
                    &intent,
                    now,
                    Note::RunnerTookOther {
                        runner: runner.clone(),
                        job_id: key.job_id,
                    },
                );
                self.runner_taken(setup, &intent, &runner, now);
            }
        }
    }

    pub(super) fn on_completed(
        &mut self,
        setup: &Setup,
        job: &JobInfo,
        now: Now,
        fx: &mut Vec<Effect>,
    ) {
        let (key, runner_name) = (&job.key, job.runner_name.as_deref());
        let (runner_id, withdrawn) = (job.runner_id, job.withdrawn);
        // Teardown follows the runner named in the event (name and id), never the job a
        // runner was made for.
        let target = match runner_name {
            Some(name) => self
                .book
                .runner(name)
                .filter(|r| runner_id.is_none_or(|id| id == r.id))
                .map(|r| r.name.clone()),
            // Cancelled before any runner took it: the runner made for it may go, if it is
            // not busy with another job (as far as we know: see below).
            None => self
                .book
                .runners()
                .find(|r| &r.intent == key && r.bound.as_ref().is_none_or(|b| b == key))
                .map(|r| r.name.clone()),
        };
        let conclusion = self
            .jobs
            .get(key)
            .and_then(|r| r.info().conclusion.clone())
            .unwrap_or_else(|| "unknown".into());
        // Count the job if it ran on a runner of ours, live or just gone (a runner often exits
        // before GitHub's `completed` delivery arrives).
        let ran_on = runner_name.and_then(|n| {
            self.book
                .runner(n)
                .map(|r| (r.provider.clone(), r.started_at()))
                .or_else(|| {
                    self.book
                        .recent()
                        .get(n)
                        .map(|g| (g.provider.clone(), g.started_at))
                })
        });
        if let Some((provider, started)) = ran_on {
            self.observe(Observation::JobFinished {
                provider,
                conclusion: bounded_conclusion(&conclusion),
                duration: started.map(|s| now.mono.saturating_duration_since(s)),
            });
        }
        self.note(key, now, Note::Completed { conclusion });
        let withdrawn = withdrawn && runner_name.is_none();
        if !withdrawn {
            // Traced when its runner is gone, if one of ours still runs it.
            self.trace_on_completion(setup, key, runner_name, target.is_some(), now);
        }
        match target {
            // A scale set's job withdrawn before any runner took it comes back as a new
            // assignment in a moment: its runner, already on its way, is kept as a spare for
            // it (or for any job of the pool) instead of being torn down and claimed again.
            Some(name) if withdrawn => {
                let until = now.mono + super::sweep::REASSIGN_GRACE;
                self.book.keep_until(name.as_str(), until);
                self.wake_sweep_at(until, fx);
            }
            Some(name) if runner_name.is_some() => {
                self.tear_down(key, &name, "job completed", now, fx)
            }
            // The runner made for a job nobody ran is fungible: it may have taken another
            // job a moment ago, whose `in_progress` is still on its way (the soak caught one
            // stopped mid-job this way). So it is a spare like any other: handed to a job
            // that waits, else deleted on GitHub first, which GitHub refuses while it runs a
            // job, and only then torn down.
            Some(name) => {
                self.rebalance(setup, now, fx);
                if self
                    .book
                    .runner(&name)
                    .is_some_and(|r| self.jobs.is_spare(r))
                {
                    self.ask_idle(&name, super::sweep::REAP_CANCELLED, now, fx);
                }
            }
            None => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(phase: Phase, seen_at: Option<Instant>, t0: Instant) -> Box<JobRecord> {
        let mut rec = JobRecord::in_phase(JobInfo::default(), phase, t0);
        rec.set_seen_at(seen_at);
        rec
    }

    #[test]
    fn the_gate_admits_new_and_stale_jobs_and_drops_the_held_ones() {
        let t0 = Instant::now();
        let ttl = Duration::from_secs(600);
        let soon = Now::whole_seconds(t0 + Duration::from_secs(60), 0);
        let later = Now::whole_seconds(t0 + Duration::from_secs(601), 0);
        assert_eq!(Gate::of(None, ttl, false, soon), Gate::New);
        let seen = record(Phase::Seen, Some(t0), t0);
        assert_eq!(Gate::of(Some(&seen), ttl, false, soon), Gate::Duplicate);
        assert_eq!(
            Gate::of(Some(&seen), ttl, false, later),
            Gate::New,
            "past the TTL"
        );
        let unseen_done = record(Phase::Done, None, t0);
        assert_eq!(
            Gate::of(Some(&unseen_done), ttl, false, soon),
            Gate::Duplicate,
            "a queued after the job's in_progress: it runs already, nothing to claim"
        );
        for phase in [Phase::Pending, Phase::Retrying] {
            let rec = record(phase, Some(t0), t0);
            assert_eq!(
                Gate::of(Some(&rec), ttl, false, later),
                Gate::Duplicate,
                "in flight"
            );
        }
        let parked = record(
            Phase::Parked {
                reason: super::super::ParkReason::Zombie,
                look_unix: 0,
            },
            Some(t0),
            t0,
        );
        assert_eq!(Gate::of(Some(&parked), ttl, false, soon), Gate::Parked);
        assert_eq!(
            Gate::of(Some(&parked), ttl, true, soon),
            Gate::Duplicate,
            "cordoned: a parked job seen a moment ago is a duplicate"
        );
        assert_eq!(Gate::of(Some(&parked), ttl, true, later), Gate::New);
    }
}
