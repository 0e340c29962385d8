//! Parking and the backstop. A job is never forgotten while GitHub lists it queued: one the
//! daemon stops claiming for (its runners always reaped idle, its claims given up on) is
//! *parked* with a time to look at it again, and a reconcile pass admits every job GitHub
//! lists as queued that the daemon holds in no active phase.

use super::{
    Effect, Note, PARK_LOOK, ParkReason, Phase, Scheduler, observation::Observation,
    runner_book::Deferred,
};
use super::{JobRecord, job_table::Rest};
use super::{Setup, State};
use crate::{
    clock::Now,
    github::GithubError,
    job::{JobAction, JobInfo, JobKey},
};

/// A job held for a runner is looked at when the reconcile has not listed it queued, only
/// once it was admitted this long ago (a listing may trail a delivery by a moment).
pub const UNLISTED_AFTER: std::time::Duration = std::time::Duration::from_secs(60);

impl Scheduler {
    /// A reconcile pass over target `target`: the jobs GitHub lists as queued. A job the daemon
    /// does not know is admitted as a delivery would be; one it holds in no active phase (seen
    /// and idle, or parked past its look) is admitted again. What stays held idle (parked
    /// before its look, or cordoned) is counted for the `ephemerd_reconcile_queued_idle` gauge.
    pub fn on_reconcile(&mut self, target: usize, jobs: Vec<JobInfo>, now: Now) -> Vec<Effect> {
        self.on_reconcile_pass(target, jobs, false, now)
    }

    /// [`Scheduler::on_reconcile`]; with `complete` (every repo of the target listed), a job
    /// this daemon still holds for a runner that GitHub no longer lists as queued, admitted
    /// more than `UNLISTED_AFTER` ago, is looked at: its `in_progress` or `completed` may
    /// have been lost (delivered while the daemon was down), and a runner kept for it would
    /// wait for a job that will never come.
    pub fn on_reconcile_pass(
        &mut self,
        target: usize,
        jobs: Vec<JobInfo>,
        complete: bool,
        now: Now,
    ) -> Vec<Effect> {
        let mut fx = Vec::new();
        if complete {
            let listed: std::collections::HashSet<&JobKey> = jobs.iter().map(|j| &j.key).collect();
            let unlisted: Vec<(JobKey, String)> = self
                .state
                .jobs
                .iter()
                .filter(|(key, j)| {
                    j.started_at().is_none()
                        && !key.is_warm()
                        && !key.is_reckoned()
                        && self.setup.target_index(key) == target
                        && !listed.contains(key)
                        && now.mono.saturating_duration_since(j.received_at()) >= UNLISTED_AFTER
                        && matches!(
                            j.phase(),
                            Phase::Pending
                                | Phase::Retrying
                                | Phase::Claiming { .. }
                                | Phase::Active { .. }
                        )
                })
                .map(|(key, j)| (key.clone(), j.info().repo.to_string()))
                .collect();
            for (key, repo) in unlisted {
                self.state.ask_where(&self.setup, key, repo, now, &mut fx);
            }
        }
        let mut idle = 0;
        for job in jobs {
            let key = job.key.clone();
            let Some(rec) = self.state.jobs.get(&key) else {
                self.on_job_event(JobAction::Queued, job, Some("reconcile"), now.mono, now)
                    .into_iter()
                    .for_each(|e| fx.push(e));
                let admitted = self.state.jobs.get(&key).is_some_and(|r| {
                    matches!(
                        r.phase(),
                        Phase::Pending | Phase::Claiming { .. } | Phase::Active { .. }
                    )
                });
                if admitted {
                    self.state.observe(Observation::Readmitted {
                        job_id: key.job_id,
                        reason: "unknown",
                    });
                }
                continue;
            };
            if rec.started_at().is_some() {
                continue;
            }
            match rec.phase() {
                Phase::Seen if !self.state.draining => {
                    self.state.admit_again(&self.setup, &key, "idle", now)
                }
                Phase::Parked { look_unix, .. }
                    if *look_unix <= now.unix && !self.state.draining =>
                {
                    self.state.admit_again(&self.setup, &key, "parked", now)
                }
                Phase::Seen | Phase::Parked { .. } => idle += 1,
                _ => {}
            }
        }
        self.state.admission.set_held_idle(target, idle);
        self.state.observe(Observation::QueuedIdle {
            jobs: self.state.admission.held_idle(),
        });
        self.state.pump(&self.setup, now, &mut fx);
        fx
    }
}

impl State {
    /// The sweep reaped `runner`, made for `key`, after it sat idle for the whole grace: GitHub
    /// did not hand it that job. The one zombie signal: after `zombie_cap` of these the job is
    /// parked; before, its runner's exit dispatches it again.
    pub(super) fn idle_reaped(
        &mut self,
        setup: &Setup,
        key: &JobKey,
        runner: &str,
        now: Now,
        fx: &mut Vec<Effect>,
    ) {
        let cap = setup.settings.zombie_cap;
        let Some(rec) = self.jobs.get(key) else {
            return;
        };
        if rec.started_at().is_some() || !rec.active_on(runner) {
            return;
        }
        if u32::from(self.jobs.idle_reaped(key)) >= cap {
            self.park(key, ParkReason::Zombie, now, fx);
        }
    }

    /// Parks `key`: nothing claimed for it until its next look (`PARK_LOOK` from now), a
    /// delivery for it, or a reconcile pass that lists it queued after that time.
    pub(super) fn park(
        &mut self,
        key: &JobKey,
        reason: ParkReason,
        now: Now,
        fx: &mut Vec<Effect>,
    ) {
        let look_unix = now.unix.saturating_add(PARK_LOOK.as_secs());
        let answer = self.jobs.park(key, reason, look_unix);
        self.moved(key, answer);
        self.leave_ladder(key, fx);
        self.observe(Observation::Parked {
            job_id: key.job_id,
            reason,
        });
        self.note(key, now, Note::Parked { reason, look_unix });
        self.defer(
            now.mono + PARK_LOOK,
            Deferred::Look { key: key.clone() },
            fx,
        );
    }

    /// A parked job's look is due: GitHub is asked whether it is still queued.
    pub(super) fn look_at(&mut self, setup: &Setup, key: &JobKey, now: Now, fx: &mut Vec<Effect>) {
        let Some(rec) = self.jobs.get(key) else {
            return;
        };
        match rec.phase() {
            // Admitted or run meanwhile; or parked again since, with a later look of its own.
            Phase::Parked { look_unix, .. } if *look_unix <= now.unix => {}
            _ => return,
        }
        let repo = rec.info().repo.to_string();
        self.ask_where(setup, key.clone(), repo, now, fx);
    }

    /// Asks GitHub where `key` stands ([`Scheduler::on_job_looked`] takes the answer). In
    /// scale-set mode GitHub cannot say: a job is a runner request the REST API does not know,
    /// and it stays assigned to the scale set until its `JobCompleted` comes (the queue keeps
    /// that message until it is acknowledged). The answer is then `queued`, at once (on the
    /// next timer), so a parked job is claimed for again.
    pub(super) fn ask_where(
        &mut self,
        setup: &Setup,
        key: JobKey,
        repo: String,
        now: Now,
        fx: &mut Vec<Effect>,
    ) {
        if setup.settings.scaleset {
            self.unanswerable.push((now.mono, key));
            self.rearm_timer(fx);
        } else {
            fx.push(Effect::LookAtJob { key, repo });
        }
    }

    /// The looks [`State::ask_where`] answered itself, taken as `queued`.
    pub(super) fn answer_unanswerable(&mut self, setup: &Setup, now: Now, fx: &mut Vec<Effect>) {
        for (_, key) in std::mem::take(&mut self.unanswerable) {
            fx.extend(self.on_job_looked(setup, &key, Ok("queued".to_string()), now));
        }
    }

    /// GitHub's answer about a parked job ([`Scheduler::on_job_looked`]).
    pub(super) fn on_job_looked(
        &mut self,
        setup: &Setup,
        key: &JobKey,
        status: Result<String, GithubError>,
        now: Now,
    ) -> Vec<Effect> {
        let mut fx = Vec::new();
        if !matches!(
            self.jobs.get(key).map(|j| j.phase()),
            Some(Phase::Parked { .. })
        ) {
            self.unlisted_looked(setup, key, status, now, &mut fx);
            return fx;
        }
        match status.as_deref() {
            Ok("queued") if !self.draining => {
                self.admit_again(setup, key, "parked", now);
                self.pump(setup, now, &mut fx);
            }
            Ok(status @ ("in_progress" | "completed")) => {
                let status = if status == "completed" {
                    "completed"
                } else {
                    "in_progress"
                };
                let answer = self.jobs.complete(key);
                self.moved(key, answer);
                self.note(key, now, Note::LookedAt { status });
            }
            Err(GithubError::Http(f)) if f.status == 404 => {
                let answer = self.jobs.complete(key);
                self.moved(key, answer);
                self.note(key, now, Note::LookedAt { status: "gone" });
            }
            _ => {
                if matches!(
                    self.jobs.get(key).map(JobRecord::phase),
                    Some(Phase::Parked { .. })
                ) {
                    let answer = self
                        .jobs
                        .look_later(key, now.unix.saturating_add(PARK_LOOK.as_secs()));
                    self.moved(key, answer);
                }
                self.defer(
                    now.mono + PARK_LOOK,
                    Deferred::Look { key: key.clone() },
                    &mut fx,
                );
            }
        }
        fx
    }

    /// Admits a known job again (a parked job looked at, a job held idle that a reconcile pass
    /// found queued): past the dedup window, without spending anything toward its cap.
    pub(super) fn admit_again(
        &mut self,
        setup: &Setup,
        key: &JobKey,
        reason: &'static str,
        now: Now,
    ) {
        let Some(rec) = self.jobs.get(key) else {
            return;
        };
        if rec.started_at().is_some() || self.draining {
            return;
        }
        let answer = self.jobs.admit(key);
        if !self.moved(key, answer) {
            return;
        }
        self.jobs.admitted_at(key, now.mono);
        let t = setup.target_index(key);
        self.admission.queue(t, key.clone());
        self.observe(Observation::Readmitted {
            job_id: key.job_id,
            reason,
        });
        self.note(key, now, Note::Readmitted { reason });
    }

    /// The answer about a job held for a runner (the reconcile did not list it queued, or its
    /// runner sat idle, or exited quietly): one GitHub says started or finished (its events
    /// were lost) is marked started, so the runner kept for it becomes a spare (handed on, or
    /// reaped by the sweep); one gone is done. Queued, or no answer: it keeps waiting as it
    /// was, and one whose runner went (`Seen`) is dispatched again.
    fn unlisted_looked(
        &mut self,
        setup: &Setup,
        key: &JobKey,
        status: Result<String, GithubError>,
        now: Now,
        fx: &mut Vec<Effect>,
    ) {
        let Some(rec) = self.jobs.get(key) else {
            return;
        };
        if rec.started_at().is_some() {
            return;
        }
        let status = match status.as_deref() {
            Ok("in_progress") => "in_progress",
            Ok("completed") => "completed",
            Err(GithubError::Http(f)) if f.status == 404 => "gone",
            _ => {
                // Only a job whose runner went (still stranded) is dispatched again.
                self.dispatch_again(setup, key, super::ledger::QUIET_EXIT_LOOKED, now, fx);
                return;
            }
        };
        self.jobs.started(key, now.mono);
        self.ops
            .push(crate::durable::Op::JobStarted(key.clone(), now.unix));
        self.note(key, now, Note::LookedAt { status });
        if !matches!(
            self.jobs.get(key).map(|j| j.phase()),
            Some(Phase::Claiming { .. })
        ) {
            // A claim in flight ends by itself (started during the claim).
            self.abandon(key, Rest::Done, Note::RanElsewhere, now, fx);
        }
        // The sweep hands its runner on first (`rebalance`), else deletes it.
        fx.extend(self.sweep(setup, now));
        self.pump(setup, now, fx);
    }
}
