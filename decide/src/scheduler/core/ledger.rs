//! The runner ledger: provisioner reports and what each way a runner ends means for its job
//! (it ran a job, its environment failed, it exited cleanly with no job seen, it was torn
//! down), forgetting runners, deferred deletions and their retries, provider status and cordon.

use super::{
    DELETE_ATTEMPTS, DELETE_DELAY, DELETE_RETRY_FIRST, Deletion, Effect, MAX_WAIT_DELETE, Note,
    Phase, QUIET_EXITS_FREE, RunnerRecord, Scheduler, ShuttingDown, observation::Observation,
    runner_book::Deferred,
};
use super::{Setup, State};
use crate::clock::Instant;
use crate::{
    clock::Now,
    config::PoolName,
    durable::Op,
    github::{ErrorClass, GithubError},
    job::JobKey,
    provision::{ExitReason, RunnerEventKind},
    retry::Failure,
};
use std::time::Duration;

/// Why a stranded job (held for a runner that went before the job was seen on it) goes on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Strand {
    /// Its runner took a sibling's job.
    SiblingTookIt,
    /// Its provisioner died before the job started.
    ProvisionerDied,
    /// Its runner exited 0 with no event naming it: the job most likely ran, so GitHub is
    /// asked before the job is dispatched again.
    QuietExit,
    /// Its runner went in any other way.
    RunnerWent,
    /// GitHub refused its runner's version (exit code 7).
    Outdated,
}

impl Strand {
    /// The words for the job's timeline and the log.
    pub(super) fn why(self) -> &'static str {
        match self {
            Strand::SiblingTookIt => "its runner ran a sibling's job",
            Strand::ProvisionerDied => "its provisioner died before the job started",
            Strand::QuietExit => {
                "its runner exited cleanly but no job was seen on it (its events may be late)"
            }
            Strand::RunnerWent => "its runner went before the job started",
            Strand::Outdated => {
                "GitHub refused its runner's version as too old (exit code 7); claimed again once the pool's install is updated"
            }
        }
    }
}

/// Why a job of a quiet exit is dispatched again once GitHub was asked.
pub(super) const QUIET_EXIT_LOOKED: &str =
    "its runner exited cleanly, no job was seen on it, and GitHub does not say it started";

impl Scheduler {
    /// Deletes, now, every registration still waiting for a late delivery (end of a drain).
    pub fn flush_deferred(&mut self, now: Now) -> Vec<Effect> {
        let mut fx = Vec::new();
        self.state.run_deferred(&self.setup, now, true, &mut fx);
        fx
    }

    /// A provisioner's report about a runner.
    pub fn on_runner_event(&mut self, name: &str, kind: RunnerEventKind, now: Now) -> Vec<Effect> {
        let mut fx = Vec::new();
        // An event for a runner no longer in the ledger changes nothing.
        let Some((handle, runner)) = self.state.book.runner_with_handle(name) else {
            return fx;
        };
        let (handle, intent) = (handle.clone(), runner.intent.clone());
        let pool = runner.provider.clone();
        match kind {
            RunnerEventKind::Started { warm } => {
                self.state.runner_started(name, handle, &intent, warm, now)
            }
            RunnerEventKind::Exited {
                code,
                reason,
                detail,
            } => {
                let runner = self.state.forget_runner(&self.setup, name, now);
                self.state.note(
                    &intent,
                    now,
                    Note::RunnerGone {
                        runner: handle.clone(),
                        reason,
                        code,
                        detail: detail.map(std::sync::Arc::from),
                    },
                );
                if let Some(r) = runner {
                    self.state
                        .trace_on_runner_gone(&self.setup, handle, &r, now);
                    if reason == ExitReason::Exited {
                        self.state.warm_runner_lost(&self.setup, &r, now);
                    }
                    self.state.runner_ended(
                        &self.setup,
                        &intent,
                        name,
                        r,
                        code,
                        reason,
                        now,
                        &mut fx,
                    );
                }
            }
            RunnerEventKind::Egress { seen } => {
                let runner = handle.clone();
                let seen = std::sync::Arc::new(seen);
                self.state.note(&intent, now, Note::Egress { runner, seen });
                return fx;
            }
            RunnerEventKind::RefusedNewest { version } => {
                self.state.refused_newest(&pool, name, &version, now);
                return fx;
            }
            RunnerEventKind::Failed { error } => {
                self.state
                    .environment_not_made(&self.setup, name, &intent, error, now, &mut fx)
            }
        }
        self.state.pump(&self.setup, now, &mut fx);
        fx
    }

    /// GitHub's answer to a registration's deletion: one that failed is tried again later
    /// (5 s, then doubling to 5 min, `DELETE_ATTEMPTS` in all; a registration still left after
    /// that is found by the next start's cleanup). Already gone counts as deleted.
    pub fn on_runner_deleted(
        &mut self,
        deletion: Deletion,
        result: Result<(), GithubError>,
        now: Now,
    ) -> Vec<Effect> {
        let mut fx = Vec::new();
        let Err(e) = result else {
            let runner = deletion.name;
            self.state.ops.push(Op::Unregistered(runner.clone()));
            self.state
                .observe(Observation::RegistrationDeleted { runner });
            return fx;
        };
        let attempt = deletion.attempt + 1;
        let again = attempt < DELETE_ATTEMPTS && !self.state.shutting_down;
        self.state.observe(Observation::DeletionFailed {
            runner: deletion.name.clone(),
            class: e.class(),
            error: e.to_string(),
            again,
        });
        if again {
            let wait = (DELETE_RETRY_FIRST * 2u32.saturating_pow(attempt - 1)).min(MAX_WAIT_DELETE);
            let what = Deferred::Delete(Deletion {
                attempt,
                ..deletion
            });
            self.state.defer(now.mono + wait, what, &mut fx);
        }
        fx
    }

    /// A pool's warm environments changed (for `status`).
    pub fn on_warm_status(&mut self, provider: &PoolName, view: crate::provision::WarmView) {
        if let Some(i) = self.setup.provider_index(provider) {
            self.state.capacity.show_warm(i, view);
        }
    }

    /// A provider went down (with the cause) or came up.
    pub fn on_provider_status(
        &mut self,
        provider: PoolName,
        up: bool,
        cause: Option<String>,
        now: Now,
    ) -> Vec<Effect> {
        let mut fx = Vec::new();
        self.state.observe(Observation::ProviderStatus {
            provider: provider.clone(),
            up,
            cause: cause.clone(),
        });
        if let Some(i) = self.setup.provider_index(&provider) {
            self.state.capacity.set_up(i, up, cause);
        }
        self.state.pump(&self.setup, now, &mut fx);
        fx
    }

    /// Cordon (stop claiming) or uncordon; uncordoning is refused during the shutdown drain.
    pub fn set_cordon(&mut self, cordoned: bool, now: Now) -> Result<Vec<Effect>, ShuttingDown> {
        if !cordoned && self.state.shutting_down {
            return Err(ShuttingDown);
        }
        self.state.draining = cordoned;
        self.state.observe(Observation::Cordon(cordoned));
        let mut fx = Vec::new();
        self.state.pump(&self.setup, now, &mut fx);
        Ok(fx)
    }

    /// The shutdown drain: cordoned for good. Idle spares are deleted at once (no job will be
    /// handed to them now), not at the sweep's next turn.
    pub fn begin_shutdown(&mut self, now: Now) -> Vec<Effect> {
        self.state.shutting_down = true;
        let mut fx = self.set_cordon(true, now).unwrap_or_default();
        fx.extend(self.state.sweep(&self.setup, now));
        fx
    }
}

impl State {
    pub(super) fn defer(&mut self, due: Instant, what: Deferred, fx: &mut Vec<Effect>) {
        self.book.defer(due, what);
        self.rearm_timer(fx);
    }

    /// Carries out deferred decisions that are due (all of them with `all`).
    pub(super) fn run_deferred(
        &mut self,
        setup: &Setup,
        now: Now,
        all: bool,
        fx: &mut Vec<Effect>,
    ) {
        for what in self.book.take_due(now.mono, all) {
            match what {
                Deferred::Delete(deletion) => {
                    let gone = self.book.recent().get(&deletion.name);
                    if gone.is_some_and(|r| r.ran_a_job) {
                        // A late event named it with a job: GitHub removes it after that job.
                        self.ops.push(Op::Unregistered(deletion.name));
                    } else {
                        fx.push(Effect::DeleteRunner(deletion));
                    }
                }
                Deferred::Heal {
                    key,
                    why: Strand::Outdated,
                } => {
                    if self.outdated_wait_over(&key) {
                        self.heal_now(setup, &key, Strand::Outdated, now, fx)
                    }
                }
                Deferred::Heal { key, why } => self.heal_now(setup, &key, why, now, fx),
                Deferred::Probe { pool } => self.probe(setup, &pool, now, fx),
                Deferred::Look { key } => self.look_at(setup, &key, now, fx),
            }
        }
        self.rearm_timer(fx);
    }

    /// A runner's environment came up and its process started.
    fn runner_started(
        &mut self,
        name: &str,
        handle: std::sync::Arc<str>,
        intent: &JobKey,
        warm: bool,
        now: Now,
    ) {
        let runner = self
            .book
            .came_up(name, now.mono, warm)
            .unwrap_or_else(|| unreachable!("looked up above"));
        let startup = now.mono.saturating_duration_since(runner.created_at());
        let queue_wait = self
            .jobs
            .get(intent)
            .map(|rec| now.mono.saturating_duration_since(rec.received_at()));
        let provider = runner.provider.clone();
        self.observe(Observation::RunnerStarted {
            startup,
            queue_wait,
            provider,
            warm,
        });
        self.stats.runners_started += 1;
        self.note(
            intent,
            now,
            Note::RunnerStarted {
                runner: handle,
                after: startup,
                warm,
            },
        );
    }

    /// A runner's environment could not be made: its registration goes, and its job waits for
    /// the pool (a pool that cannot run jobs) or climbs the ladder.
    fn environment_not_made(
        &mut self,
        setup: &Setup,
        name: &str,
        intent: &JobKey,
        error: crate::provision::ProvisionError,
        now: Now,
        fx: &mut Vec<Effect>,
    ) {
        let intent = intent.clone();
        let r = self.forget_runner(setup, name, now);
        if let Some(r) = &r {
            fx.push(Effect::DeleteRunner(Deletion::of(r)));
        }
        if let Some(r) = &r {
            self.warm_runner_lost(setup, r, now);
            self.environment_failed(
                setup,
                r.provider.clone(),
                &intent,
                name,
                error.to_string(),
                now,
            );
        }
        let waiting = matches!(self.jobs.get(&intent).map(|r| r.phase()), Some(Phase::Seen));
        if waiting && error.takes_pool_down() {
            // The pool itself cannot run jobs (its supervisor reported it down first):
            // the job waits for it or goes to another covering pool; no rung is spent.
            let answer = self.jobs.admit(&intent);
            self.moved(&intent, answer);
            let t = setup.target_index(&intent);
            self.admission.queue(t, intent.clone());
            let why = "its pool cannot run jobs right now";
            self.observe(Observation::Requeued {
                job_id: intent.job_id,
                why,
            });
            self.note(&intent, now, Note::Requeued { why });
        } else if waiting {
            let failure = Failure {
                class: error.class(),
                retry_after: None,
                bucket: None,
                reading: None,
                message: format!("provisioning failed: {error}"),
            };
            self.failed(setup, &intent, failure, now, fx);
        }
    }

    /// What a runner's end means for its registration and for the job it was made for. It
    /// ended one of four ways:
    /// - it **ran a job** (an event named it, or it exited 0 by itself: a JIT runner exits 0
    ///   after its one job and GitHub removes its registration): if the job was a sibling's,
    ///   its own job was dispatched again when the event named it. Never a failure.
    /// - it **failed** before any job (a non-zero exit by itself): its job's ladder climbs.
    /// - it was **torn down** (reaped by the sweep, its job cancelled, a drain) or its
    ///   provisioner died: its job, if still waiting, is dispatched again. An idle reap was
    ///   counted toward the zombie cap when the sweep decided it.
    /// - it exited 0 with no event naming it (a **quiet exit**): most likely a job whose
    ///   events are late; dispatched again at once, unless its job's runners keep doing so.
    #[allow(clippy::too_many_arguments)]
    fn runner_ended(
        &mut self,
        setup: &Setup,
        intent: &JobKey,
        name: &str,
        r: RunnerRecord,
        code: Option<i32>,
        reason: ExitReason,
        now: Now,
        fx: &mut Vec<Effect>,
    ) {
        let by_itself = reason == ExitReason::Exited;
        let clean = by_itself && code == Some(0);
        let ran_a_job = r.bound.is_some() || clean;
        if clean {
            self.book.gone_ran_a_job(name);
        }
        if r.bound.is_some() && !r.registration_deleted() {
            // An event named it with a job: GitHub removes it after that job. (A clean exit
            // alone is a guess: the ledger keeps that one for a survivor to delete.)
            self.ops.push(Op::Unregistered(r.name.clone()));
        }
        // A runner that may not have run a job leaves a registration GitHub keeps: delete it.
        // One that exits by itself, or was found gone after a restart, may still be named by a
        // late `in_progress`: wait a little.
        if !ran_a_job && !r.registration_deleted() {
            let delay = if by_itself || reason == ExitReason::Lost {
                DELETE_DELAY
            } else {
                Duration::ZERO
            };
            self.defer(now.mono + delay, Deferred::Delete(Deletion::of(&r)), fx);
        }
        // Its job, if it still waits for this runner (it is `Seen` now), goes on.
        let waiting = self
            .jobs
            .get(intent)
            .is_some_and(|j| *j.phase() == Phase::Seen && j.started_at().is_none());
        if !waiting || r.bound.is_some() {
            if waiting {
                self.heal_stranded(setup, intent, Strand::SiblingTookIt, now, fx);
            }
            return;
        }
        if by_itself && code == Some(crate::provision::RUNNER_VERSION_DEPRECATED) {
            // The install is too old for GitHub, or GitHub is in an outage: not the job's
            // fault nor the host's. The job waits and is claimed again (`refusal`).
            return self.refused_exit(&r.provider, name, intent, now, fx);
        }
        if by_itself && !clean {
            let error = match code {
                Some(c) => format!("the runner exited with code {c} before its job started"),
                None => "the runner was killed before its job started".into(),
            };
            return self.attempt_failed(setup, &r, error, now, fx);
        }
        if clean {
            let quiet = self.jobs.quiet_exit(intent);
            if quiet > QUIET_EXITS_FREE {
                let error =
                    format!("{quiet} of its runners exited cleanly without being seen with a job");
                return self.attempt_failed(setup, &r, error, now, fx);
            }
        }
        let why = match reason {
            ExitReason::ProvisionerDied => Strand::ProvisionerDied,
            ExitReason::Exited => Strand::QuietExit,
            _ => Strand::RunnerWent,
        };
        self.heal_stranded(setup, intent, why, now, fx);
    }

    /// An attempt for `intent` failed in its environment: counted for the pool, and the job's
    /// ladder item climbs.
    fn attempt_failed(
        &mut self,
        setup: &Setup,
        r: &RunnerRecord,
        error: String,
        now: Now,
        fx: &mut Vec<Effect>,
    ) {
        let (intent, name) = (&r.intent, r.name.as_str());
        self.environment_failed(setup, r.provider.clone(), intent, name, error.clone(), now);
        let failure = Failure {
            class: ErrorClass::UnknownRetryable,
            retry_after: None,
            bucket: None,
            reading: None,
            message: error,
        };
        self.failed(setup, intent, failure, now, fx);
    }

    /// Counts an environment of `provider` that failed (for `status` and the metric) and notes
    /// it on the job's timeline.
    fn environment_failed(
        &mut self,
        setup: &Setup,
        provider: PoolName,
        job: &JobKey,
        runner: &str,
        error: String,
        now: Now,
    ) {
        if let Some(i) = setup.provider_index(&provider) {
            self.capacity.env_failed(i, &error);
        }
        self.observe(Observation::EnvironmentFailed {
            job_id: job.job_id,
            provider,
            runner: runner.to_string(),
            error: error.clone(),
        });
        self.note(
            job,
            now,
            Note::EnvironmentFailed {
                runner: self.runner_handle(runner),
                error,
            },
        );
    }

    /// Removes a runner from the ledger, frees its slot, and leaves its intent job `Seen`.
    pub(super) fn forget_runner(
        &mut self,
        setup: &Setup,
        name: &str,
        now: Now,
    ) -> Option<RunnerRecord> {
        let (handle, r) = self.book.remove(name)?;
        self.ops.push(Op::DeleteRunner(r.name.clone()));
        self.release(setup, &r.provider);
        self.observe(Observation::RunnerRemoved {
            provider: r.provider.clone(),
        });
        self.book.remember_gone(handle, &r, now.mono);
        self.jobs.runner_gone(&r.intent, name);
        Some(r)
    }

    /// Stranded self-heal: GitHub never re-sends a queued webhook, so a job whose runner went
    /// while it was never observed running is dispatched again at once. Nothing here counts
    /// toward the zombie cap (only an idle reap does: `on_idle_checked`).
    /// With a heal grace (pull mode), the job is looked at again once the grace has passed:
    /// a poll that has not yet seen it running is not a stranded job.
    pub(super) fn heal_stranded(
        &mut self,
        setup: &Setup,
        key: &JobKey,
        why: Strand,
        now: Now,
        fx: &mut Vec<Effect>,
    ) {
        let grace = setup.settings.heal_grace;
        if grace.is_zero() {
            return self.heal_now(setup, key, why, now, fx);
        }
        let what = Deferred::Heal {
            key: key.clone(),
            why,
        };
        self.defer(now.mono + grace, what, fx);
    }

    /// After a quiet exit the job is looked at on GitHub first: a JIT runner exits 0 after
    /// its one job, so the job most likely ran and its events are late or were lost (a fleet
    /// host killed before it wrote the starts it heard). One request instead of a
    /// registration, a runner's boot and its deletion; `on_job_looked` dispatches the job
    /// again if GitHub still lists it queued, or cannot say.
    fn heal_now(
        &mut self,
        setup: &Setup,
        key: &JobKey,
        why: Strand,
        now: Now,
        fx: &mut Vec<Effect>,
    ) {
        let Some(rec) = self.stranded(key) else {
            return;
        };
        if why == Strand::QuietExit && !key.is_reckoned() && !rec.info().repo.is_empty() {
            let repo = rec.info().repo.to_string();
            self.ask_where(setup, key.clone(), repo, now, fx);
            return;
        }
        self.dispatch_again(setup, key, why.why(), now, fx);
    }

    /// Job `key`, if it is still stranded: held `Seen` (its runner gone), never seen started,
    /// and the daemon not draining.
    fn stranded(&self, key: &JobKey) -> Option<&super::JobRecord> {
        self.jobs
            .get(key)
            .filter(|r| r.started_at().is_none() && *r.phase() == Phase::Seen && !self.draining)
    }

    /// Dispatches stranded job `key` again ([`State::stranded`]).
    pub(super) fn dispatch_again(
        &mut self,
        setup: &Setup,
        key: &JobKey,
        why: &'static str,
        now: Now,
        fx: &mut Vec<Effect>,
    ) {
        if self.stranded(key).is_none() {
            return;
        }
        self.jobs.admitted_at(key, now.mono);
        let answer = self.jobs.admit(key);
        self.moved(key, answer);
        let t = setup.target_index(key);
        self.admission.queue(t, key.clone());
        self.observe(Observation::Requeued {
            job_id: key.job_id,
            why,
        });
        self.note(key, now, Note::Requeued { why });
        self.pump(setup, now, fx);
    }
}
