//! The runner ledger: provisioner reports, forgetting runners, the stranded self-heal, deferred
//! deletions, provider status and cordon.

use super::*;
#[allow(unused_imports)]
use crate::config::PoolName;

impl Scheduler {
    pub(super) fn defer(&mut self, due: Instant, what: Deferred, fx: &mut Vec<Effect>) {
        self.deferred.push((due, what));
        fx.push(Effect::WakeAt(due));
    }

    /// Carries out deferred decisions that are due (all of them with `all`).
    pub(super) fn run_deferred(&mut self, now: Now, all: bool, fx: &mut Vec<Effect>) {
        let (due, later): (Vec<_>, Vec<_>) = std::mem::take(&mut self.deferred)
            .into_iter()
            .partition(|(at, _)| all || *at <= now.mono);
        self.deferred = later;
        for (_, what) in due {
            match what {
                Deferred::Delete {
                    owner,
                    repo,
                    runner_id,
                    name,
                } => {
                    let ran_a_job = self.recent_runners.get(&*name).is_some_and(|r| r.3);
                    if !ran_a_job {
                        fx.push(Effect::DeleteRunner {
                            owner,
                            repo,
                            runner_id,
                            name,
                        });
                    }
                }
                Deferred::Heal { key, why } => self.heal_now(&key, why, now, fx),
            }
        }
        // One wake-up timer serves everything: ask for the next one still waiting.
        if let Some(next) = self.deferred.iter().map(|(at, _)| *at).min() {
            fx.push(Effect::WakeAt(next));
        }
    }

    /// Deletes, now, every registration still waiting for a late delivery (end of a drain).
    pub fn flush_deferred(&mut self, now: Now) -> Vec<Effect> {
        let mut fx = Vec::new();
        self.run_deferred(now, true, &mut fx);
        fx
    }

    /// A provisioner's report about a runner.
    pub fn on_runner_event(&mut self, name: &str, kind: RunnerEventKind, now: Now) -> Vec<Effect> {
        let mut fx = Vec::new();
        // An event for a runner no longer in the ledger changes nothing.
        let Some((handle, runner)) = self.runners.get_key_value(name) else {
            return fx;
        };
        let (handle, intent) = (handle.clone(), runner.intent.clone());
        match kind {
            RunnerEventKind::Started => {
                let runner = self
                    .runners
                    .get_mut(name)
                    .unwrap_or_else(|| unreachable!("looked up above"));
                runner.started_at = Some(now.mono);
                let startup = now.mono.saturating_duration_since(runner.created_at);
                let queue_wait = self
                    .jobs
                    .get(&intent)
                    .map(|rec| now.mono.saturating_duration_since(rec.received_at));
                self.observe(Observation::RunnerStarted {
                    startup,
                    queue_wait,
                });
                self.stats.runners_started += 1;
                self.note(
                    &intent,
                    now,
                    Note::RunnerStarted {
                        runner: handle,
                        after: startup,
                    },
                );
            }
            RunnerEventKind::Exited { code, reason } => {
                let runner = self.forget_runner(name, now);
                self.note(
                    &intent,
                    now,
                    Note::RunnerGone {
                        runner: handle,
                        reason,
                        code,
                    },
                );
                // A runner that exits by itself may well have run a job whose `in_progress` is
                // still on its way: wait a little before deciding it never ran one (GitHub then
                // still lists it, and it is deleted). Its own job, if never seen running, is
                // dispatched again at once (a spare is reaped later; a job is never lost).
                let delay = if reason == ExitReason::Exited {
                    DELETE_DELAY
                } else {
                    Duration::ZERO
                };
                if let Some(r) = runner
                    .as_ref()
                    .filter(|r| r.bound.is_none() && !r.registration_deleted)
                {
                    let delete = Deferred::Delete {
                        owner: r.row.intent.owner.to_string(),
                        repo: r.row.repo.clone(),
                        runner_id: r.row.id,
                        name: r.row.name.clone(),
                    };
                    self.defer(now.mono + delay, delete, &mut fx);
                }
                // A runner that exited with an error before it was seen with any job never came
                // up: its environment failed, and the job climbs its ladder item. One that ran
                // (or may have run) a sibling's job left its own stranded: dispatched again now.
                let crashed = reason == ExitReason::Exited
                    && code.is_some_and(|c| c != 0)
                    && runner.as_ref().is_some_and(|r| r.bound.is_none());
                let waiting = self
                    .jobs
                    .get(&intent)
                    .is_some_and(|r| r.phase == Phase::Seen && r.started_at.is_none());
                if let Some(r) = runner.as_ref().filter(|_| crashed && waiting) {
                    let error = format!(
                        "the runner exited with code {} before its job started",
                        code.unwrap_or_default()
                    );
                    self.environment_failed(r.provider.clone(), &intent, name, error.clone(), now);
                    let failure = Failure {
                        class: ErrorClass::UnknownRetryable,
                        retry_after: None,
                        bucket: None,
                        message: error,
                    };
                    self.failed(&intent, failure, now, &mut fx);
                } else {
                    let why = if reason == ExitReason::ProvisionerDied {
                        "its provisioner died before the job started"
                    } else {
                        "its runner exited but the job was never observed running (stranded)"
                    };
                    self.heal_stranded(&intent, why, now, &mut fx);
                }
            }
            RunnerEventKind::Failed { error } => {
                let r = self.forget_runner(name, now);
                if let Some(r) = &r {
                    fx.push(Effect::DeleteRunner {
                        owner: r.row.intent.owner.to_string(),
                        repo: r.row.repo.clone(),
                        runner_id: r.row.id,
                        name: r.row.name.clone(),
                    });
                }
                if let Some(r) = &r {
                    self.environment_failed(
                        r.provider.clone(),
                        &intent,
                        name,
                        error.to_string(),
                        now,
                    );
                }
                let waiting = matches!(self.jobs.get(&intent).map(|r| &r.phase), Some(Phase::Seen));
                if waiting && error.takes_pool_down() {
                    // The pool itself cannot run jobs (its supervisor reported it down first):
                    // the job waits for it or goes to another covering pool; no rung is spent.
                    self.set_phase(&intent, Phase::Pending);
                    self.pending.push_back(intent.clone());
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
                        message: format!("provisioning failed: {error}"),
                    };
                    self.failed(&intent, failure, now, &mut fx);
                }
            }
        }
        self.pump(now, &mut fx);
        fx
    }

    /// Counts an environment of `provider` that failed (for `status` and the metric) and notes
    /// it on the job's timeline.
    fn environment_failed(
        &mut self,
        provider: PoolName,
        job: &JobKey,
        runner: &str,
        error: String,
        now: Now,
    ) {
        if let Some(i) = self.provider_index(&provider) {
            self.slots[i].env_failures += 1;
            self.slots[i].last_env_failure = Some(error.clone());
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
    pub(super) fn forget_runner(&mut self, name: &str, now: Now) -> Option<RunnerRecord> {
        let (handle, r) = self.runners.remove_entry(name)?;
        self.ops.push(Op::DeleteRunner(r.name.clone()));
        self.release(&r.provider);
        self.observe(Observation::RunnerRemoved {
            provider: r.provider.clone(),
        });
        self.recent_runners.insert(
            handle,
            (
                r.provider.clone(),
                r.started_at,
                now.mono,
                r.bound.is_some(),
            ),
        );
        if let Some(rec) = self.jobs.get_mut(&r.intent)
            && matches!(&rec.phase, Phase::Active { runner, .. } if **runner == *name)
        {
            rec.phase = if rec.started_at.is_some() {
                Phase::Done
            } else {
                Phase::Seen
            };
        }
        Some(r)
    }

    /// Stranded self-heal: runners are fungible, so the runner made for a job may have run a
    /// sibling and exited, leaving its own job queued on GitHub, which never re-sends the
    /// webhook. A job whose runner went while it was never observed running is dispatched again
    /// at once, counted against the zombie cap.
    /// With a heal grace (pull mode), the job is looked at again once the grace has passed:
    /// a poll that has not yet seen it running is not a stranded job.
    pub(super) fn heal_stranded(
        &mut self,
        key: &JobKey,
        why: &'static str,
        now: Now,
        fx: &mut Vec<Effect>,
    ) {
        let grace = self.settings.heal_grace;
        if grace.is_zero() {
            return self.heal_now(key, why, now, fx);
        }
        let due = now.mono + grace;
        self.deferred.push((
            due,
            Deferred::Heal {
                key: key.clone(),
                why,
            },
        ));
        if let Some(next) = self.deferred.iter().map(|(at, _)| *at).min() {
            fx.push(Effect::WakeAt(next));
        }
    }

    fn heal_now(&mut self, key: &JobKey, why: &'static str, now: Now, fx: &mut Vec<Effect>) {
        let cap = self.settings.zombie_cap;
        let Some(rec) = self.jobs.get_mut(key) else {
            return;
        };
        if rec.started_at.is_some() || rec.phase != Phase::Seen || self.draining {
            return;
        }
        rec.admissions += 1;
        if rec.admissions > cap {
            let dispatches = rec.admissions;
            self.note(key, now, Note::StrandedCap { dispatches });
            self.leave_ladder(key, fx);
            return;
        }
        rec.seen_at = Some(now.mono);
        rec.phase = Phase::Pending;
        self.pending.push_back(key.clone());
        self.observe(Observation::Requeued {
            job_id: key.job_id,
            why,
        });
        self.note(key, now, Note::Requeued { why });
        self.pump(now, fx);
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
        self.observe(Observation::ProviderStatus {
            provider: provider.clone(),
            up,
            cause: cause.clone(),
        });
        if let Some(i) = self.provider_index(&provider) {
            self.slots[i].up = up;
            self.slots[i].down_cause = if up { None } else { cause };
        }
        self.pump(now, &mut fx);
        fx
    }

    /// Cordon (stop claiming) or uncordon; uncordoning is refused during the shutdown drain.
    pub fn set_cordon(&mut self, cordoned: bool, now: Now) -> Result<Vec<Effect>, ShuttingDown> {
        if !cordoned && self.shutting_down {
            return Err(ShuttingDown);
        }
        self.draining = cordoned;
        self.observe(Observation::Cordon(cordoned));
        let mut fx = Vec::new();
        self.pump(now, &mut fx);
        Ok(fx)
    }

    /// The shutdown drain: cordoned for good.
    pub fn begin_shutdown(&mut self, now: Now) -> Vec<Effect> {
        self.shutting_down = true;
        self.set_cordon(true, now).unwrap_or_default()
    }
}
