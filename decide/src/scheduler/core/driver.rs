//! A test driver for the core: it carries every effect out the way the actor shell does,
//! against a scripted GitHub (claims granted in order, deletions refused for busy runners) and
//! provisioners that boot at once, with time moved by hand. Decisions that span many messages
//! (fungibility, the sweep, the ladder) are tested with it at the core; the actor tests keep
//! the wiring.

use std::{collections::VecDeque, time::Duration};

use crate::clock::Instant;

use super::{
    Effect, Scheduler, SchedulerSettings, SchedulerState,
    tests::{at, core, core_with},
};
use crate::{
    clock::Now,
    config::Secret,
    github::{GithubError, JitRunner, error::HttpFailure},
    job::{JobAction, JobInfo, JobKey},
    provision::{ExitReason, RunnerEventKind},
    rate::RateBook,
    vocab::{RateBucket, RateHeaders},
};

/// How often the shell runs the orphan sweep.
const SWEEP_EVERY: u64 = 30;

/// The core, its clock, and what GitHub was asked.
pub(super) struct Driver {
    pub(super) s: Scheduler,
    t0: Instant,
    /// Seconds since `t0`.
    pub(super) now: u64,
    /// The one timer's due time.
    timer: Option<Instant>,
    /// Claims sent, in order (job, second).
    pub(super) claims: Vec<(JobKey, u64)>,
    /// Claims answered with these errors first, in order.
    pub(super) script: VecDeque<GithubError>,
    /// Registrations deleted.
    pub(super) deletes: Vec<u64>,
    /// Deletions (and the sweep's busy checks) asked.
    pub(super) asks: usize,
    /// Runners GitHub says run a job (their deletion is refused).
    pub(super) busy: Vec<u64>,
    /// Claims (`claim <n>`) and deletions (`delete <runner id>`), in the order made.
    pub(super) calls: Vec<String>,
    /// Looks at a job carried out (job, second); answered by the test (`looked`).
    pub(super) looks: Vec<(u64, u64)>,
}

impl Driver {
    /// A core whose one pool (`local`, 4 slots, `[self-hosted, linux, x64]`) is up, at second
    /// 0; the ladder climbs 30 s, 60 s; the orphan grace is 600 s.
    pub(super) fn new() -> Self {
        let (s, t0) = core();
        Self::of(s, t0)
    }

    fn of(s: Scheduler, t0: Instant) -> Self {
        Driver {
            s,
            t0,
            now: 0,
            timer: None,
            claims: Vec::new(),
            script: VecDeque::new(),
            deletes: Vec::new(),
            asks: 0,
            busy: Vec::new(),
            calls: Vec::new(),
            looks: Vec::new(),
        }
    }

    /// A core with `settings` whose first pool is up, at second 0, with what that brought
    /// carried out.
    pub(super) fn with(settings: SchedulerSettings) -> Self {
        let (s, t0, fx) = core_with(settings);
        let mut d = Self::of(s, t0);
        d.carry(fx);
        d
    }

    /// A complete reconcile pass that lists `queued` jobs on GitHub; returns the jobs the core
    /// asked to look at.
    pub(super) fn reconcile(&mut self, queued: Vec<JobInfo>) -> Vec<u64> {
        let fx = self.s.on_reconcile_pass(0, queued, true, self.at());
        let looks = fx
            .iter()
            .filter_map(|e| match e {
                Effect::LookAtJob { key, .. } => Some(key.job_id),
                _ => None,
            })
            .collect();
        self.carry(fx);
        looks
    }

    /// GitHub's answer to a look at job `id`.
    pub(super) fn looked(&mut self, id: u64, status: &str) {
        let fx = self
            .s
            .on_job_looked(&JobKey::new("acme", id), Ok(status.into()), self.at());
        self.carry(fx);
    }

    /// Cordons (or uncordons) the core.
    pub(super) fn cordon(&mut self, on: bool) {
        let fx = self.s.set_cordon(on, self.at()).unwrap();
        self.carry(fx);
    }

    fn at(&self) -> Now {
        at(self.t0, self.now)
    }

    /// Job `id` is queued with `labels`.
    pub(super) fn queued(&mut self, id: u64, labels: &[&str]) {
        self.send(
            JobAction::Queued,
            crate::scheduler::fixtures::job(id, labels),
        );
    }

    /// A job event.
    pub(super) fn send(&mut self, action: JobAction, job: JobInfo) {
        let now = self.at();
        let fx = self.s.on_job_event(action, job, Some("d"), now.mono, now);
        self.carry(fx);
    }

    /// Runner `name` exits by itself with `code`.
    pub(super) fn exited(&mut self, name: &str, code: i32) {
        let kind = RunnerEventKind::Exited {
            code: Some(code),
            reason: ExitReason::Exited,
            detail: None,
        };
        let fx = self.s.on_runner_event(name, kind, self.at());
        self.carry(fx);
    }

    /// GitHub refuses runner `name` as too old (it exits 7); with `newest`, the shell said its
    /// install is that release, the newest (an outage).
    pub(super) fn refused(&mut self, name: &str, newest: Option<&str>) {
        if let Some(version) = newest {
            let kind = RunnerEventKind::RefusedNewest {
                version: version.into(),
            };
            let fx = self.s.on_runner_event(name, kind, self.at());
            self.carry(fx);
        }
        self.exited(name, crate::provision::RUNNER_VERSION_DEPRECATED);
    }

    /// Moves time on by `secs`, a second at a time: the timer fires when due, and the sweep
    /// runs every 30 s, as in the shell.
    pub(super) fn advance(&mut self, secs: u64) {
        for _ in 0..secs {
            self.now += 1;
            let now = self.at();
            if self.timer.is_some_and(|t| t <= now.mono) {
                self.timer = None;
                let fx = self.s.on_timer(now);
                self.carry(fx);
            }
            if self.now.is_multiple_of(SWEEP_EVERY) {
                let fx = self.s.sweep(now);
                self.carry(fx);
            }
        }
    }

    /// The rate actor's book holds a reading of the registration budget: `remaining`, reset
    /// `reset_in` s from now, taken `age` s ago.
    pub(super) fn read_rates(&mut self, remaining: u64, reset_in: u64, age: u64) {
        let now = self.at().unix;
        let bucket = RateBucket::ActionsRunnerRegistration;
        let headers = RateHeaders {
            remaining: Some(remaining),
            limit: Some(5000),
            reset: Some(now + reset_in),
            used: None,
            resource: bucket,
        };
        let book = RateBook::default();
        book.observe("token", bucket, Some(headers), None, now - age);
        self.s.read_rates(book, vec!["token".into()]);
    }

    /// What the status page would show.
    pub(super) fn state(&self) -> SchedulerState {
        self.s.view().everything(self.at())
    }

    /// Now, for the core's views.
    pub(super) fn state_now(&self) -> Now {
        self.at()
    }

    /// Job `id`'s phase.
    pub(super) fn phase(&self, id: u64) -> super::Phase {
        self.s
            .view()
            .job(&JobKey::new("acme", id))
            .unwrap()
            .phase()
            .clone()
    }

    /// The runner made for job `id`.
    pub(super) fn runner_of(&self, id: u64) -> String {
        self.s
            .view()
            .runners()
            .find(|r| r.intent.job_id == id)
            .map(|r| r.name.clone())
            .unwrap_or_else(|| panic!("no runner for job {id}"))
    }

    /// The GitHub id of runner `name`.
    pub(super) fn id_of(&self, name: &str) -> u64 {
        self.s
            .view()
            .runners()
            .find(|r| *r.name == *name)
            .unwrap()
            .id
    }

    /// Whether runner `name` is in the ledger.
    pub(super) fn has_runner(&self, name: &str) -> bool {
        self.s.view().runners().any(|r| *r.name == *name)
    }

    /// Carries effects out, and those that follow from their answers.
    fn carry(&mut self, fx: Vec<Effect>) {
        let mut queue: VecDeque<Effect> = fx.into();
        while let Some(effect) = queue.pop_front() {
            let now = self.at();
            let more = match effect {
                Effect::Claim {
                    key,
                    provider,
                    request,
                } => {
                    self.claims.push((key.clone(), self.now));
                    let id = self.claims.len() as u64;
                    self.calls.push(format!("claim {id}"));
                    let answer = match self.script.pop_front() {
                        Some(e) => Err(e),
                        None => Ok(JitRunner {
                            id,
                            name: format!("{}{id}", request.name_base),
                            encoded_jit_config: Secret::new("jit"),
                        }),
                    };
                    self.s.on_claim_result(key, provider, answer, now)
                }
                Effect::Provision { spec, .. } => self.s.on_runner_event(
                    &spec.name,
                    RunnerEventKind::Started { warm: false },
                    now,
                ),
                Effect::Teardown { name, .. } => {
                    let gone = RunnerEventKind::gone(ExitReason::TornDown);
                    self.s.on_runner_event(&name, gone, now)
                }
                Effect::DeleteRunner(deletion) => {
                    let result = self.delete(deletion.runner_id);
                    self.s.on_runner_deleted(deletion, result, now)
                }
                Effect::CheckIdle {
                    name,
                    runner_id,
                    reason,
                    ..
                } => {
                    // The shell deletes first: GitHub refuses for a runner that runs a job.
                    let busy = match self.delete(runner_id) {
                        Ok(()) => Ok(false),
                        Err(e) if e.is_runner_busy() => Ok(true),
                        Err(e) => Err(e),
                    };
                    self.s.on_idle_checked(&name, busy, reason, now)
                }
                Effect::ArmTimer { at } => {
                    self.timer = at;
                    Vec::new()
                }
                Effect::LookAtJob { key, .. } => {
                    self.looks.push((key.job_id, self.now));
                    Vec::new()
                }
            };
            queue.extend(more);
        }
    }

    fn delete(&mut self, runner_id: u64) -> Result<(), GithubError> {
        self.asks += 1;
        if self.busy.contains(&runner_id) {
            return Err(GithubError::Http(HttpFailure {
                endpoint: "delete_runner",
                status: 422,
                message: "Bad request - Runner \"x\" is still running a job".into(),
                documentation_url: None,
                rate_remaining: None,
                rate_bucket: None,
                rate_reset: None,
                retry_after: None,
            }));
        }
        self.deletes.push(runner_id);
        self.calls.push(format!("delete {runner_id}"));
        Ok(())
    }

    /// The claim offsets (seconds) of job `id`.
    pub(super) fn claim_times(&self, id: u64) -> Vec<u64> {
        self.claims
            .iter()
            .filter(|(k, _)| k.job_id == id)
            .map(|(_, at)| *at)
            .collect()
    }

    /// Time passed, as a duration.
    pub(super) fn elapsed(&self) -> Duration {
        Duration::from_secs(self.now)
    }
}
