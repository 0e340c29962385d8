//! `Scheduler`: every scheduling decision, as a plain struct. No actix, no I/O, no clock: each
//! method takes the time ([`Now`]) and returns the [`Effect`]s the actor shell must carry out.
//!
//! It owns the job table (dedup: pending / running / seen, observed `started`), the runner
//! ledger, the slot counts, claim pacing, and cordon. Decisions follow the original's order for
//! a queued job: dedup gate (running, pending, seen) before the label check; a job no provider
//! covers is remembered as seen (so a re-delivery costs nothing) and never made pending; cordon
//! before the zombie count; route and claim only when a slot and a claim token are free.

use std::{
    collections::{HashMap, VecDeque},
    time::Duration,
};

use serde::Serialize;
use tokio::time::Instant;

use super::bucket::TokenBucket;
use crate::{
    clock::Now,
    config::{Config, ProviderKind},
    github::{ErrorClass, GithubError, JitRunner, actor::GenerateJitConfig},
    job::{JobAction, JobInfo, JobKey, label_set},
    metrics::Metrics,
    provision::{ExitReason, Provision, RunnerEventKind, RunnerSpec},
    retry::{Failure, Scheduled},
    store::{Op, RunnerRow, Snapshot},
};

/// A job is remembered as seen this long; a re-delivery inside it is a duplicate.
pub const SEEN_TTL: Duration = Duration::from_secs(10 * 60);
/// How long an observed start is remembered when there is no job timeout.
pub const STARTED_TTL_NO_TIMEOUT: Duration = Duration::from_secs(6 * 3600);
/// Admissions after which a job GitHub keeps listing but never runs is left alone.
pub const ZOMBIE_CAP: u32 = 5;
/// How long a runner that exited by itself may wait for its job's `in_progress` before it is
/// taken for one that never ran a job (and deleted on GitHub).
pub const DELETE_DELAY: Duration = Duration::from_secs(10);
/// Timeline entries kept per job.
const TIMELINE_CAP: usize = 64;

/// The slice of config the scheduler decides with.
#[derive(Debug, Clone)]
pub struct SchedulerSettings {
    /// Enabled providers, in tie-break order.
    pub providers: Vec<ProviderSpec>,
    /// `runner.max_concurrent`.
    pub max_concurrent: usize,
    /// `runner.name_prefix`.
    pub name_prefix: String,
    /// Repo-level runners (`github.repos` non-empty): claim in the job's repo.
    pub repo_level: bool,
    /// `runner.claim_retry.enabled`.
    pub retry_enabled: bool,
    /// `github.max_claims_per_minute`.
    pub claims_per_minute: u32,
    /// Seen TTL.
    pub seen_ttl: Duration,
    /// How long an observed start is remembered.
    pub started_ttl: Duration,
    /// Zombie cap.
    pub zombie_cap: u32,
    /// `runner.orphan_sweep`: `None` when disabled, else the grace.
    pub orphan_grace: Option<Duration>,
    /// `webhook.reconcile_interval`: `None` when disabled.
    pub reconcile_interval: Option<Duration>,
    /// `github.repos`.
    pub repos: Vec<String>,
}

impl SchedulerSettings {
    /// The settings a config implies.
    pub fn from_config(c: &Config) -> Self {
        let providers = c
            .providers
            .enabled()
            .into_iter()
            .map(|(kind, common)| ProviderSpec {
                kind,
                labels: common.labels.clone(),
                max_concurrent: common.max_concurrent,
            })
            .collect();
        SchedulerSettings {
            providers,
            max_concurrent: c.runner.max_concurrent,
            name_prefix: c.runner.name_prefix.clone(),
            repo_level: !c.github.repos.is_empty(),
            retry_enabled: c.runner.claim_retry.enabled,
            claims_per_minute: c.github.max_claims_per_minute,
            seen_ttl: SEEN_TTL,
            started_ttl: c
                .runner
                .job_timeout
                .map_or(STARTED_TTL_NO_TIMEOUT, |t| t + SEEN_TTL),
            zombie_cap: ZOMBIE_CAP,
            orphan_grace: c
                .runner
                .orphan_sweep
                .enabled
                .then_some(c.runner.orphan_sweep.grace),
            reconcile_interval: c.webhook.reconcile_interval,
            repos: c.github.repos.clone(),
        }
    }
}

/// One enabled provider, as routing sees it.
#[derive(Debug, Clone)]
pub struct ProviderSpec {
    /// Which provisioner.
    pub kind: ProviderKind,
    /// Labels its runners register with (as configured).
    pub labels: Vec<String>,
    /// Its slot count.
    pub max_concurrent: usize,
}

/// What the actor shell must do after a decision.
#[derive(Debug)]
pub enum Effect {
    /// Call generate-jitconfig; report back with `on_claim_result`.
    Claim {
        /// The job.
        key: JobKey,
        /// The provider the runner is for.
        provider: ProviderKind,
        /// The call.
        request: GenerateJitConfig,
    },
    /// Hand a claimed runner to its provisioner.
    Provision {
        /// Which provisioner.
        provider: ProviderKind,
        /// The message.
        msg: Provision,
    },
    /// Ask a provisioner to stop a runner.
    Teardown {
        /// Which provisioner.
        provider: ProviderKind,
        /// Runner name.
        name: String,
        /// Why.
        reason: &'static str,
    },
    /// Delete a runner registration on GitHub (it never ran a job, so it will not go by itself).
    DeleteRunner {
        /// Repo for repo-level runners.
        repo: Option<String>,
        /// Runner id.
        runner_id: u64,
        /// Runner name, for logs.
        name: String,
    },
    /// Put a failed claim on the retry ladder.
    ScheduleRetry {
        /// The job.
        job: JobInfo,
        /// The failure.
        failure: Failure,
    },
    /// Take a job off the ladder (claimed, started elsewhere, abandoned).
    CancelRetry {
        /// The job.
        key: JobKey,
    },
    /// Ask GitHub whether a runner is busy before reaping it (its `in_progress` may be late);
    /// report back with `on_idle_checked`.
    CheckIdle {
        /// Runner name.
        name: String,
        /// Runner id.
        runner_id: u64,
        /// Repo for repo-level runners.
        repo: Option<String>,
        /// Why it would be reaped.
        reason: &'static str,
    },
    /// Call `wake` at this time (the claim pacing has no token before then).
    WakeAt(Instant),
}

/// Where a job stands.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum Phase {
    /// Admitted before; nothing in flight (failed, abandoned, cordoned, zombie, torn down).
    Seen,
    /// No enabled provider's labels cover the job; remembered only to make re-deliveries free.
    Unroutable,
    /// Waiting for a slot or a claim token.
    Pending,
    /// generate-jitconfig in flight; a slot is held.
    Claiming {
        /// For this provider.
        provider: ProviderKind,
    },
    /// On the retry ladder; no slot held.
    Retrying,
    /// A runner was claimed for it and its environment is starting or running.
    Active {
        /// The provider.
        provider: ProviderKind,
        /// The runner created for the job.
        runner: String,
    },
    /// Observed in progress or completed (on any runner); nothing more to do.
    Done,
}

/// One line of a job's timeline.
#[derive(Debug, Clone, Serialize)]
pub struct Note {
    /// Unix seconds.
    pub at: u64,
    /// What was decided and why.
    pub text: String,
}

/// What the scheduler knows about a job.
#[derive(Debug, Clone)]
pub struct JobRecord {
    /// Latest information.
    pub info: JobInfo,
    /// Where it stands.
    pub phase: Phase,
    /// Last admitted (the dedup TTL runs from here).
    pub seen_at: Option<Instant>,
    /// Observed `in_progress` or `completed` (any runner).
    pub started_at: Option<Instant>,
    /// When the first queued event for it arrived.
    pub received_at: Instant,
    /// Admissions so far (the zombie counter).
    pub admissions: u32,
    /// Failures on the ladder so far.
    pub retry_attempts: u32,
    /// Class of the first failed claim.
    pub error_class: Option<ErrorClass>,
    /// Unix seconds of the next retry, when on the ladder.
    pub next_attempt_unix: Option<u64>,
    /// Whether the retry actor holds an item for it.
    pub on_ladder: bool,
    /// Every decision taken about it.
    pub timeline: Vec<Note>,
}

impl JobRecord {
    fn new(info: JobInfo, phase: Phase, received_at: Instant) -> Self {
        JobRecord {
            info,
            phase,
            seen_at: None,
            started_at: None,
            received_at,
            admissions: 0,
            retry_attempts: 0,
            error_class: None,
            next_attempt_unix: None,
            on_ladder: false,
            timeline: Vec::new(),
        }
    }
}

/// A runner of ours.
#[derive(Debug, Clone, Serialize)]
pub struct RunnerRecord {
    /// Name.
    pub name: String,
    /// GitHub id.
    pub id: u64,
    /// Provider.
    pub provider: ProviderKind,
    /// Repo for repo-level runners.
    pub repo: Option<String>,
    /// The job it was created for.
    pub intent: JobKey,
    /// The job GitHub gave it, once observed.
    pub bound: Option<JobKey>,
    /// Claimed at.
    #[serde(skip)]
    pub created_at: Instant,
    /// Environment up at.
    #[serde(skip)]
    pub started_at: Option<Instant>,
    /// Unix seconds of the claim.
    pub created_unix: u64,
}

#[derive(Debug, Default, Clone)]
struct Slots {
    used: usize,
    up: bool,
    /// Why the provider is down, as its supervisor reported.
    down_cause: Option<String>,
}

/// Outcome of routing one job.
enum Pick {
    /// No enabled provider covers the job.
    Uncovered,
    /// Covering providers exist but none is up with a free slot right now.
    Wait,
    /// This provider has a free slot.
    Provider(usize),
}

/// The scheduler.
#[derive(Debug)]
pub struct Scheduler {
    settings: SchedulerSettings,
    provider_sets: Vec<Vec<String>>,
    jobs: HashMap<JobKey, JobRecord>,
    runners: HashMap<String, RunnerRecord>,
    pending: VecDeque<JobKey>,
    slots: Vec<Slots>,
    used_total: usize,
    bucket: TokenBucket,
    /// Runners gone recently (name -> provider, started, gone at): a `completed` often arrives
    /// after its runner exited, and must still be counted as ours.
    recent_runners: HashMap<String, (ProviderKind, Option<Instant>, Instant, bool)>,
    draining: bool,
    metrics: Metrics,
    stats: Stats,
    /// State changes waiting to be made durable.
    ops: Vec<Op>,
    /// Decisions waiting for a late delivery (see `DELETE_DELAY`, `HEAL_DELAY`).
    deferred: Vec<(Instant, Deferred)>,
}

/// A decision taken later, once a late `in_progress` had its chance to arrive.
#[derive(Debug, Clone)]
enum Deferred {
    /// Delete a runner registration unless the runner turns out to have run a job.
    Delete {
        repo: Option<String>,
        runner_id: u64,
        name: String,
    },
}

/// Counters for status views and tests.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct Stats {
    /// Queued events received.
    pub queued_events: u64,
    /// Queued events dropped by the dedup gate.
    pub duplicates: u64,
    /// Claims sent.
    pub claims: u64,
    /// Claims that failed.
    pub claim_failures: u64,
    /// Runners that reported started.
    pub runners_started: u64,
    /// Dispatches abandoned because the job was observed running elsewhere.
    pub satisfied_elsewhere: u64,
}

impl Scheduler {
    /// A scheduler with no jobs.
    pub fn new(settings: SchedulerSettings, metrics: Metrics, now: Now) -> Self {
        let provider_sets = settings
            .providers
            .iter()
            .map(|p| label_set(&p.labels))
            .collect();
        let slots = settings
            .providers
            .iter()
            // Down until its supervisor reports the host check passed: no job is claimed for a
            // pool that cannot run it.
            .map(|_| Slots {
                used: 0,
                up: false,
                down_cause: Some("starting: host check not done yet".into()),
            })
            .collect();
        metrics
            .concurrent_capacity
            .set(i64::try_from(settings.max_concurrent).unwrap_or(i64::MAX));
        for p in &settings.providers {
            metrics.init_provider(p.kind.as_str());
        }
        Scheduler {
            bucket: TokenBucket::new(settings.claims_per_minute, now.mono),
            settings,
            provider_sets,
            jobs: HashMap::new(),
            runners: HashMap::new(),
            pending: VecDeque::new(),
            slots,
            used_total: 0,
            recent_runners: HashMap::new(),
            draining: false,
            metrics,
            stats: Stats::default(),
            ops: Vec::new(),
            deferred: Vec::new(),
        }
    }

    fn defer(&mut self, due: Instant, what: Deferred, fx: &mut Vec<Effect>) {
        self.deferred.push((due, what));
        fx.push(Effect::WakeAt(due));
    }

    /// Carries out deferred decisions that are due (all of them with `all`).
    fn run_deferred(&mut self, now: Now, all: bool, fx: &mut Vec<Effect>) {
        let (due, later): (Vec<_>, Vec<_>) = std::mem::take(&mut self.deferred)
            .into_iter()
            .partition(|(at, _)| all || *at <= now.mono);
        self.deferred = later;
        for (_, what) in due {
            match what {
                Deferred::Delete {
                    repo,
                    runner_id,
                    name,
                } => {
                    let ran_a_job = self.recent_runners.get(&name).is_some_and(|r| r.3);
                    if !ran_a_job {
                        fx.push(Effect::DeleteRunner {
                            repo,
                            runner_id,
                            name,
                        });
                    }
                }
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

    /// State changes to make durable since the last call (the actor hands them to the store).
    pub fn take_ops(&mut self) -> Vec<Op> {
        std::mem::take(&mut self.ops)
    }

    fn row(r: &RunnerRecord) -> RunnerRow {
        RunnerRow {
            name: r.name.clone(),
            id: r.id,
            provider: r.provider,
            repo: r.repo.clone(),
            intent: r.intent.clone(),
            bound: r.bound.clone(),
            created_unix: r.created_unix,
        }
    }

    /// Rebuilds the state a previous run left in the store. Ledger runners hold their slots
    /// (their provisioners adopt or clean them up and report back); jobs on the ladder wait
    /// for it; jobs observed running stay satisfied. Returns the open jobs that had nothing in
    /// flight: the caller dispatches them again through the normal path.
    pub fn restore(&mut self, snapshot: &Snapshot, now: Now) -> Vec<JobInfo> {
        let ago = |unix: u64| {
            now.mono
                .checked_sub(Duration::from_secs(now.unix.saturating_sub(unix)))
                .unwrap_or(now.mono)
        };
        for row in &snapshot.jobs {
            let mut rec = JobRecord::new(row.info.clone(), Phase::Seen, ago(row.received_unix));
            rec.seen_at = Some(now.mono);
            rec.started_at = row.started_unix.map(ago);
            if rec.started_at.is_some() {
                rec.phase = Phase::Done;
            }
            rec.timeline.push(Note {
                at: now.unix,
                text: "restored from the state store after a restart".into(),
            });
            self.jobs.insert(row.info.key.clone(), rec);
        }
        for r in &snapshot.runners {
            let Some(i) = self.provider_index(r.provider) else {
                // The provider was disabled since: nothing will adopt it; forget it.
                self.ops.push(Op::DeleteRunner(r.name.clone()));
                continue;
            };
            self.slots[i].used += 1;
            self.used_total += 1;
            self.metrics
                .jobs_active
                .with_label_values(&[r.provider.as_str()])
                .inc();
            self.runners.insert(
                r.name.clone(),
                RunnerRecord {
                    name: r.name.clone(),
                    id: r.id,
                    provider: r.provider,
                    repo: r.repo.clone(),
                    intent: r.intent.clone(),
                    bound: r.bound.clone(),
                    created_at: ago(r.created_unix),
                    started_at: Some(now.mono),
                    created_unix: r.created_unix,
                },
            );
            let rec = self.jobs.entry(r.intent.clone()).or_insert_with(|| {
                JobRecord::new(
                    JobInfo {
                        key: r.intent.clone(),
                        ..JobInfo::default()
                    },
                    Phase::Seen,
                    now.mono,
                )
            });
            if rec.started_at.is_none() {
                rec.phase = Phase::Active {
                    provider: r.provider,
                    runner: r.name.clone(),
                };
            }
        }
        for r in &snapshot.retries {
            let rec = self
                .jobs
                .entry(r.job.key.clone())
                .or_insert_with(|| JobRecord::new(r.job.clone(), Phase::Seen, now.mono));
            if rec.started_at.is_none() && rec.phase == Phase::Seen {
                rec.phase = Phase::Retrying;
                rec.on_ladder = true;
                rec.retry_attempts = r.attempts;
                rec.error_class = Some(r.class);
                rec.next_attempt_unix = Some(r.next_attempt_unix);
            }
        }
        let redo: Vec<JobInfo> = self
            .jobs
            .values_mut()
            .filter(|r| r.phase == Phase::Seen && r.started_at.is_none())
            .map(|r| {
                // Let the re-dispatch through the dedup gate.
                r.seen_at = None;
                r.info.clone()
            })
            .collect();
        tracing::info!(
            jobs = snapshot.jobs.len(),
            runners = snapshot.runners.len(),
            retries = snapshot.retries.len(),
            redispatch = redo.len(),
            "state restored"
        );
        redo
    }

    fn note(&mut self, key: &JobKey, now: Now, text: impl Into<String>) {
        if let Some(rec) = self.jobs.get_mut(key) {
            if rec.timeline.len() == TIMELINE_CAP {
                rec.timeline.remove(1);
            }
            rec.timeline.push(Note {
                at: now.unix,
                text: text.into(),
            });
        }
    }

    fn provider_index(&self, kind: ProviderKind) -> Option<usize> {
        self.settings.providers.iter().position(|p| p.kind == kind)
    }

    // ----- intake -------------------------------------------------------------------------

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
        match action {
            JobAction::Queued => self.on_queued(job, delivery, received, now, &mut fx),
            JobAction::InProgress | JobAction::Completed => {
                self.on_started(action, job, delivery, now, &mut fx)
            }
            JobAction::Waiting => {
                let key = job.key.clone();
                self.note(&key, now, "waiting for an environment approval");
            }
        }
        fx
    }

    fn on_queued(
        &mut self,
        job: JobInfo,
        delivery: Option<&str>,
        received: Instant,
        now: Now,
        fx: &mut Vec<Effect>,
    ) {
        self.stats.queued_events += 1;
        let key = job.key.clone();
        // 1. The dedup gate: running, pending, seen. Before the label check, so a job nobody
        //    covers costs nothing when it is delivered again.
        if let Some(rec) = self.jobs.get(&key) {
            let in_flight = matches!(
                rec.phase,
                Phase::Pending | Phase::Claiming { .. } | Phase::Retrying | Phase::Active { .. }
            );
            let recently_seen = rec
                .seen_at
                .is_some_and(|at| now.mono.saturating_duration_since(at) < self.settings.seen_ttl);
            if in_flight || recently_seen {
                self.stats.duplicates += 1;
                tracing::debug!(
                    job_id = key.job_id,
                    delivery_id = delivery,
                    "duplicate queued event"
                );
                return;
            }
        }
        let rec = self
            .jobs
            .entry(key.clone())
            .or_insert_with(|| JobRecord::new(job.clone(), Phase::Seen, received));
        rec.info = job;
        rec.seen_at = Some(now.mono);
        let labels = rec.info.labels.clone();
        self.note(
            &key,
            now,
            format!(
                "queued event received (delivery {})",
                delivery.unwrap_or("-")
            ),
        );

        // 2. Label coverage.
        if matches!(self.pick(&labels), Pick::Uncovered) {
            self.set_phase(&key, Phase::Unroutable);
            self.note(
                &key,
                now,
                format!("no enabled provider covers labels {labels:?}; not claimed"),
            );
            tracing::info!(job_id = key.job_id, delivery_id = delivery, labels = ?labels, "no provider covers the job's labels");
            return;
        }
        // 3. Cordon: no zombie charge, seen kept, not pending.
        if self.draining {
            self.set_phase(&key, Phase::Seen);
            self.note(&key, now, "cordoned: not admitted");
            return;
        }
        // 4. Zombie cap.
        let admissions = {
            let rec = self.jobs.get_mut(&key).unwrap_or_else(|| unreachable!());
            rec.admissions += 1;
            rec.admissions
        };
        if admissions > self.settings.zombie_cap {
            self.set_phase(&key, Phase::Seen);
            self.note(
                &key,
                now,
                format!("admitted {admissions} times without running: left alone"),
            );
            if admissions == self.settings.zombie_cap + 1 {
                tracing::warn!(
                    job_id = key.job_id,
                    admissions,
                    "job keeps coming back without running; zombie cap reached"
                );
            }
            return;
        }
        // 5. Pending: wait for a slot and a claim token.
        self.set_phase(&key, Phase::Pending);
        self.pending.push_back(key.clone());
        self.note(&key, now, "admitted; waiting for a slot");
        self.pump(now, fx);
    }

    fn on_started(
        &mut self,
        action: JobAction,
        job: JobInfo,
        delivery: Option<&str>,
        now: Now,
        fx: &mut Vec<Effect>,
    ) {
        let key = job.key.clone();
        let runner_name = job.runner_name.clone();
        let rec = self
            .jobs
            .entry(key.clone())
            .or_insert_with(|| JobRecord::new(job.clone(), Phase::Done, now.mono));
        if rec.started_at.is_none() {
            rec.started_at = Some(now.mono);
            self.ops.push(Op::JobStarted(key.clone(), now.unix));
        }
        let rec = self
            .jobs
            .get_mut(&key)
            .unwrap_or_else(|| unreachable!("inserted above"));
        rec.info.runner_name = job.runner_name.clone();
        rec.info.runner_id = job.runner_id;
        if job.conclusion.is_some() {
            rec.info.conclusion = job.conclusion.clone();
        }
        let was = rec.phase.clone();
        let on_ladder = std::mem::take(&mut rec.on_ladder);
        match was {
            Phase::Pending | Phase::Retrying | Phase::Seen | Phase::Unroutable => {
                rec.phase = Phase::Done;
                rec.next_attempt_unix = None;
            }
            Phase::Claiming { .. } | Phase::Active { .. } | Phase::Done => {}
        }
        if on_ladder {
            fx.push(Effect::CancelRetry { key: key.clone() });
        }
        let who = runner_name.as_deref().unwrap_or("no runner");
        self.note(&key, now, format!("{} on {who}", action.as_str()));
        tracing::info!(
            job_id = key.job_id,
            delivery_id = delivery,
            runner = who,
            action = action.as_str(),
            "job observed"
        );

        // Bind the runner named in the event, if it is ours.
        // A runner already gone that is named now did run a job: no registration to delete.
        if let Some(gone) = runner_name
            .as_ref()
            .and_then(|n| self.recent_runners.get_mut(n))
        {
            gone.3 = true;
        }
        if let Some(name) = &runner_name
            && let Some(runner) = self.runners.get_mut(name)
        {
            if runner.bound.is_none() {
                runner.bound = Some(key.clone());
                let row = Self::row(runner);
                self.ops.push(Op::PutRunner(row));
            }
            if runner.intent != key {
                let intent = runner.intent.clone();
                tracing::info!(job_id = key.job_id, runner = %name, intended = intent.job_id, "runner picked up a different job than it was created for");
                self.note(
                    &intent,
                    now,
                    format!("its runner {name} took job {} instead", key.job_id),
                );
            }
        }
        if action == JobAction::Completed {
            self.on_completed(&key, runner_name.as_deref(), now, fx);
            fx.extend(self.sweep(now));
        }
    }

    fn on_completed(
        &mut self,
        key: &JobKey,
        runner_name: Option<&str>,
        now: Now,
        fx: &mut Vec<Effect>,
    ) {
        // Teardown follows the runner named in the event, never the job a runner was made for.
        let target = match runner_name {
            Some(name) => self.runners.get(name).map(|r| r.name.clone()),
            // Cancelled before any runner took it: the runner made for it may go, if it is
            // not busy with another job.
            None => self
                .runners
                .values()
                .find(|r| &r.intent == key && r.bound.as_ref().is_none_or(|b| b == key))
                .map(|r| r.name.clone()),
        };
        let conclusion = self
            .jobs
            .get(key)
            .and_then(|r| r.info.conclusion.clone())
            .unwrap_or_else(|| "unknown".into());
        // Count the job if it ran on a runner of ours, live or just gone (a runner often exits
        // before GitHub's `completed` delivery arrives).
        let ran_on = runner_name.and_then(|n| {
            self.runners
                .get(n)
                .map(|r| (r.provider, r.started_at))
                .or_else(|| {
                    self.recent_runners
                        .get(n)
                        .map(|(p, started, _, _)| (*p, *started))
                })
        });
        if let Some((provider, started)) = ran_on {
            self.metrics
                .jobs_total
                .with_label_values(&[provider.as_str(), bounded_conclusion(&conclusion)])
                .inc();
            if let Some(started) = started {
                self.metrics
                    .job_duration
                    .observe(now.mono.saturating_duration_since(started).as_secs_f64());
            }
        }
        self.note(key, now, format!("completed ({conclusion})"));
        if let Some(name) = target {
            let provider = self.runners[&name].provider;
            self.note(key, now, format!("tearing down runner {name}"));
            fx.push(Effect::Teardown {
                provider,
                name,
                reason: "job completed",
            });
        }
    }

    // ----- dispatch -----------------------------------------------------------------------

    fn set_phase(&mut self, key: &JobKey, phase: Phase) {
        if let Some(rec) = self.jobs.get_mut(key) {
            rec.phase = phase;
        }
    }

    fn pick(&self, labels: &[String]) -> Pick {
        let wanted = label_set(labels);
        let mut best: Option<(usize, usize, bool)> = None; // (extra labels, index, free)
        let mut covered = false;
        for (i, offered) in self.provider_sets.iter().enumerate() {
            if !wanted.iter().all(|w| offered.binary_search(w).is_ok()) {
                continue;
            }
            covered = true;
            let slot = &self.slots[i];
            if !slot.up {
                continue;
            }
            let extra = offered.len() - wanted.len();
            let free = slot.used < self.settings.providers[i].max_concurrent;
            let better = match best {
                None => true,
                Some((e, _, f)) => extra < e || (extra == e && free && !f),
            };
            if better {
                best = Some((extra, i, free));
            }
        }
        match best {
            Some((_, i, true)) => Pick::Provider(i),
            _ if covered => Pick::Wait,
            _ => Pick::Uncovered,
        }
    }

    /// Starts claims for pending jobs while slots and claim tokens allow.
    fn pump(&mut self, now: Now, fx: &mut Vec<Effect>) {
        let mut waiting = VecDeque::with_capacity(self.pending.len());
        while let Some(key) = self.pending.pop_front() {
            let Some(rec) = self.jobs.get(&key) else {
                continue;
            };
            if rec.phase != Phase::Pending {
                continue;
            }
            if self.draining {
                self.abandon(
                    &key,
                    Phase::Seen,
                    "cordoned while waiting for a slot",
                    now,
                    fx,
                );
                continue;
            }
            if rec.started_at.is_some() {
                self.stats.satisfied_elsewhere += 1;
                self.abandon(
                    &key,
                    Phase::Done,
                    "observed running elsewhere: nothing to claim",
                    now,
                    fx,
                );
                continue;
            }
            if self.used_total >= self.settings.max_concurrent {
                waiting.push_back(key);
                break;
            }
            let labels = rec.info.labels.clone();
            let i = match self.pick(&labels) {
                Pick::Provider(i) => i,
                Pick::Wait => {
                    waiting.push_back(key);
                    continue;
                }
                Pick::Uncovered => {
                    self.abandon(
                        &key,
                        Phase::Unroutable,
                        "no enabled provider covers it any more",
                        now,
                        fx,
                    );
                    continue;
                }
            };
            if !self.bucket.try_take(now.mono) {
                fx.push(Effect::WakeAt(self.bucket.next_token_at(now.mono)));
                waiting.push_back(key);
                break;
            }
            self.start_claim(key, i, now, fx);
        }
        waiting.extend(self.pending.drain(..));
        self.pending = waiting;
    }

    fn abandon(&mut self, key: &JobKey, phase: Phase, why: &str, now: Now, fx: &mut Vec<Effect>) {
        if let Some(rec) = self.jobs.get_mut(key) {
            rec.phase = phase;
            rec.next_attempt_unix = None;
            if std::mem::take(&mut rec.on_ladder) {
                fx.push(Effect::CancelRetry { key: key.clone() });
            }
        }
        tracing::info!(job_id = key.job_id, reason = why, "dispatch abandoned");
        self.note(key, now, format!("dispatch abandoned: {why}"));
    }

    fn start_claim(&mut self, key: JobKey, i: usize, now: Now, fx: &mut Vec<Effect>) {
        let spec = &self.settings.providers[i];
        let provider = spec.kind;
        let request = GenerateJitConfig {
            repo: self
                .settings
                .repo_level
                .then(|| self.jobs[&key].info.repo.clone()),
            name_base: format!("{}-{}", self.settings.name_prefix, provider.name_part()),
            labels: spec.labels.clone(),
        };
        self.slots[i].used += 1;
        self.used_total += 1;
        self.stats.claims += 1;
        self.set_phase(&key, Phase::Claiming { provider });
        self.note(
            &key,
            now,
            format!("routed to {provider}; claiming a runner"),
        );
        tracing::info!(
            job_id = key.job_id,
            provider = provider.as_str(),
            "claiming a runner"
        );
        fx.push(Effect::Claim {
            key,
            provider,
            request,
        });
    }

    fn release(&mut self, provider: ProviderKind) {
        if let Some(i) = self.provider_index(provider) {
            self.slots[i].used = self.slots[i].used.saturating_sub(1);
        }
        self.used_total = self.used_total.saturating_sub(1);
    }

    /// Called by the shell when the claim pacing timer fires.
    pub fn wake(&mut self, now: Now) -> Vec<Effect> {
        let mut fx = Vec::new();
        self.run_deferred(now, false, &mut fx);
        self.pump(now, &mut fx);
        fx
    }

    /// The answer to a claim.
    pub fn on_claim_result(
        &mut self,
        key: JobKey,
        provider: ProviderKind,
        result: Result<JitRunner, GithubError>,
        now: Now,
    ) -> Vec<Effect> {
        let mut fx = Vec::new();
        match result {
            Ok(runner) => self.claimed(key, provider, runner, now, &mut fx),
            Err(e) => {
                self.release(provider);
                self.stats.claim_failures += 1;
                let class = e.class();
                self.metrics
                    .jit_registration_errors
                    .with_label_values(&[class.as_str()])
                    .inc();
                tracing::warn!(job_id = key.job_id, provider = provider.as_str(), error_class = class.as_str(), error = %e, "claim failed");
                self.note(&key, now, format!("claim failed ({class}): {e}"));
                let failure = Failure {
                    class,
                    retry_after: e.retry_after(),
                    message: e.to_string(),
                };
                self.failed(&key, failure, now, &mut fx);
            }
        }
        self.pump(now, &mut fx);
        fx
    }

    fn claimed(
        &mut self,
        key: JobKey,
        provider: ProviderKind,
        runner: JitRunner,
        now: Now,
        fx: &mut Vec<Effect>,
    ) {
        let repo = self.settings.repo_level.then(|| {
            self.jobs
                .get(&key)
                .map(|r| r.info.repo.clone())
                .unwrap_or_default()
        });
        let started = self.jobs.get(&key).and_then(|r| r.started_at).is_some();
        if self.draining || started {
            // The claim raced a cordon or the job starting elsewhere: the runner is not needed
            // and has not connected yet, so delete it rather than start an environment.
            self.release(provider);
            let why = if self.draining {
                "cordoned during the claim"
            } else {
                "started elsewhere during the claim"
            };
            fx.push(Effect::DeleteRunner {
                repo,
                runner_id: runner.id,
                name: runner.name.clone(),
            });
            let phase = if started { Phase::Done } else { Phase::Seen };
            self.abandon(&key, phase, why, now, fx);
            return;
        }
        let spec = RunnerSpec {
            name: runner.name.clone(),
            runner_id: runner.id,
            jit_config: runner.encoded_jit_config,
            intent: key.clone(),
            labels: self
                .provider_index(provider)
                .map(|i| self.settings.providers[i].labels.clone())
                .unwrap_or_default(),
        };
        self.runners.insert(
            runner.name.clone(),
            RunnerRecord {
                name: runner.name.clone(),
                id: runner.id,
                provider,
                repo,
                intent: key.clone(),
                bound: None,
                created_at: now.mono,
                started_at: None,
                created_unix: now.unix,
            },
        );
        let row = Self::row(&self.runners[&runner.name]);
        self.ops.push(Op::PutRunner(row));
        self.metrics
            .jobs_active
            .with_label_values(&[provider.as_str()])
            .inc();
        if let Some(rec) = self.jobs.get_mut(&key) {
            rec.phase = Phase::Active {
                provider,
                runner: runner.name.clone(),
            };
            rec.next_attempt_unix = None;
            if std::mem::take(&mut rec.on_ladder) {
                fx.push(Effect::CancelRetry { key: key.clone() });
            }
        }
        self.note(
            &key,
            now,
            format!(
                "claimed runner {} (id {}) on {provider}",
                runner.name, runner.id
            ),
        );
        tracing::info!(job_id = key.job_id, provider = provider.as_str(), runner = %runner.name, "runner claimed; provisioning");
        fx.push(Effect::Provision {
            provider,
            msg: Provision(spec),
        });
    }

    /// A claim or a provisioning attempt failed: onto the ladder, or give up.
    fn failed(&mut self, key: &JobKey, failure: Failure, now: Now, fx: &mut Vec<Effect>) {
        let Some(rec) = self.jobs.get_mut(key) else {
            return;
        };
        if rec.started_at.is_some() {
            self.abandon(key, Phase::Done, "observed running elsewhere", now, fx);
            return;
        }
        rec.error_class.get_or_insert(failure.class);
        if self.settings.retry_enabled && failure.class.is_retryable() && !self.draining {
            rec.phase = Phase::Retrying;
            rec.on_ladder = true;
            fx.push(Effect::ScheduleRetry {
                job: rec.info.clone(),
                failure,
            });
        } else {
            let why = if self.draining {
                "cordoned: no retry"
            } else if !failure.class.is_retryable() {
                "not retryable"
            } else {
                "claim retry disabled"
            };
            self.abandon(key, Phase::Seen, why, now, fx);
        }
    }

    /// The retry actor's decision about a failure.
    pub fn on_retry_decided(&mut self, key: &JobKey, outcome: &Scheduled, now: Now) -> Vec<Effect> {
        let mut fx = Vec::new();
        match outcome {
            Scheduled::Retry {
                delay,
                attempts,
                reason,
                class,
                ..
            } => {
                if let Some(rec) = self.jobs.get_mut(key) {
                    rec.retry_attempts = *attempts;
                    rec.next_attempt_unix = Some(now.unix + delay.as_secs());
                    rec.error_class = Some(*class);
                }
                let due = std::time::UNIX_EPOCH + std::time::Duration::from_secs(now.unix) + *delay;
                self.note(
                    key,
                    now,
                    format!(
                        "retry #{attempts} scheduled for {} (in {:.1}s; {}; first failure {class})",
                        humantime::format_rfc3339_seconds(due),
                        delay.as_secs_f64(),
                        describe(reason)
                    ),
                );
            }
            Scheduled::GaveUp {
                attempts,
                age,
                class,
            } => {
                if let Some(rec) = self.jobs.get_mut(key) {
                    rec.on_ladder = false;
                }
                tracing::warn!(
                    job_id = key.job_id,
                    attempts,
                    error_class = class.as_str(),
                    "claim retries given up"
                );
                self.abandon(
                    key,
                    Phase::Seen,
                    &format!(
                        "gave up after {attempts} attempts over {}s ({class})",
                        age.as_secs()
                    ),
                    now,
                    &mut fx,
                );
            }
            Scheduled::NotRetryable { class } => {
                if let Some(rec) = self.jobs.get_mut(key) {
                    rec.on_ladder = false;
                }
                self.abandon(
                    key,
                    Phase::Seen,
                    &format!("not retryable ({class})"),
                    now,
                    &mut fx,
                );
            }
        }
        fx
    }

    /// A retry came due: dispatch the job again through the normal path.
    pub fn on_retry_due(&mut self, job: JobInfo, attempts: u32, now: Now) -> Vec<Effect> {
        let mut fx = Vec::new();
        let key = job.key.clone();
        let Some(rec) = self.jobs.get_mut(&key) else {
            fx.push(Effect::CancelRetry { key });
            return fx;
        };
        if rec.phase != Phase::Retrying {
            rec.on_ladder = false;
            fx.push(Effect::CancelRetry { key });
            return fx;
        }
        rec.next_attempt_unix = None;
        if self.draining {
            self.abandon(&key, Phase::Seen, "cordoned: retry dropped", now, &mut fx);
            return fx;
        }
        rec.phase = Phase::Pending;
        self.pending.push_back(key.clone());
        self.note(
            &key,
            now,
            format!("retry #{attempts} due; waiting for a slot"),
        );
        self.pump(now, &mut fx);
        fx
    }

    // ----- runners ------------------------------------------------------------------------

    /// A provisioner's report about a runner.
    pub fn on_runner_event(&mut self, name: &str, kind: RunnerEventKind, now: Now) -> Vec<Effect> {
        let mut fx = Vec::new();
        let Some(runner) = self.runners.get_mut(name) else {
            tracing::debug!(runner = name, event = ?kind, "event for a runner we no longer track");
            return fx;
        };
        let intent = runner.intent.clone();
        match kind {
            RunnerEventKind::Started => {
                runner.started_at = Some(now.mono);
                let startup = now.mono.saturating_duration_since(runner.created_at);
                self.metrics.job_startup.observe(startup.as_secs_f64());
                if let Some(rec) = self.jobs.get(&intent) {
                    let wait = now.mono.saturating_duration_since(rec.received_at);
                    self.metrics.job_queue_wait.observe(wait.as_secs_f64());
                }
                self.stats.runners_started += 1;
                self.note(
                    &intent,
                    now,
                    format!(
                        "runner {name} started ({:.2}s after the claim)",
                        startup.as_secs_f64()
                    ),
                );
            }
            RunnerEventKind::Exited { code, reason } => {
                let runner = self.forget_runner(name, now);
                self.note(
                    &intent,
                    now,
                    format!("runner {name} gone ({reason:?}, exit code {code:?})"),
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
                    && r.bound.is_none()
                {
                    self.defer(
                        now.mono + delay,
                        Deferred::Delete {
                            repo: r.repo,
                            runner_id: r.id,
                            name: r.name,
                        },
                        &mut fx,
                    );
                }
                let why = if reason == ExitReason::ProvisionerDied {
                    "its provisioner died before the job started"
                } else {
                    "its runner exited but the job was never observed running (stranded)"
                };
                self.heal_stranded(&intent, why, now, &mut fx);
            }
            RunnerEventKind::Failed { error } => {
                let r = self.forget_runner(name, now);
                if let Some(r) = r {
                    fx.push(Effect::DeleteRunner {
                        repo: r.repo,
                        runner_id: r.id,
                        name: r.name,
                    });
                }
                tracing::warn!(job_id = intent.job_id, runner = name, error = %error, "runner environment failed to start");
                self.note(
                    &intent,
                    now,
                    format!("environment for {name} failed: {error}"),
                );
                let failure = Failure {
                    class: ErrorClass::UnknownRetryable,
                    retry_after: None,
                    message: format!("provisioning failed: {error}"),
                };
                if matches!(self.jobs.get(&intent).map(|r| &r.phase), Some(Phase::Seen)) {
                    self.failed(&intent, failure, now, &mut fx);
                }
            }
        }
        self.pump(now, &mut fx);
        fx
    }

    /// Removes a runner from the ledger, frees its slot, and leaves its intent job `Seen`.
    fn forget_runner(&mut self, name: &str, now: Now) -> Option<RunnerRecord> {
        let r = self.runners.remove(name)?;
        self.ops.push(Op::DeleteRunner(r.name.clone()));
        self.release(r.provider);
        self.metrics
            .jobs_active
            .with_label_values(&[r.provider.as_str()])
            .dec();
        self.recent_runners.insert(
            r.name.clone(),
            (r.provider, r.started_at, now.mono, r.bound.is_some()),
        );
        if let Some(rec) = self.jobs.get_mut(&r.intent)
            && matches!(&rec.phase, Phase::Active { runner, .. } if runner == name)
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
    fn heal_stranded(&mut self, key: &JobKey, why: &str, now: Now, fx: &mut Vec<Effect>) {
        let cap = self.settings.zombie_cap;
        let Some(rec) = self.jobs.get_mut(key) else {
            return;
        };
        if rec.started_at.is_some() || rec.phase != Phase::Seen || self.draining {
            return;
        }
        rec.admissions += 1;
        if rec.admissions > cap {
            let n = rec.admissions;
            self.note(
                key,
                now,
                format!("stranded after {n} dispatches: left alone (zombie cap)"),
            );
            return;
        }
        rec.seen_at = Some(now.mono);
        rec.phase = Phase::Pending;
        self.pending.push_back(key.clone());
        tracing::info!(
            job_id = key.job_id,
            reason = why,
            "dispatching the job again"
        );
        self.note(key, now, format!("re-queued: {why}"));
        self.pump(now, fx);
    }

    /// A provider went down (with the cause) or came up.
    pub fn on_provider_status(
        &mut self,
        provider: ProviderKind,
        up: bool,
        cause: Option<String>,
        now: Now,
    ) -> Vec<Effect> {
        let mut fx = Vec::new();
        tracing::info!(
            provider = provider.as_str(),
            up,
            cause = cause.as_deref().unwrap_or(""),
            "provider status"
        );
        if let Some(i) = self.provider_index(provider) {
            self.slots[i].up = up;
            self.slots[i].down_cause = if up { None } else { cause };
        }
        self.pump(now, &mut fx);
        fx
    }

    /// Cordon (stop claiming) or uncordon.
    pub fn set_cordon(&mut self, cordoned: bool, now: Now) -> Vec<Effect> {
        self.draining = cordoned;
        self.metrics.draining.set(i64::from(cordoned));
        tracing::info!(cordoned, "cordon changed");
        let mut fx = Vec::new();
        self.pump(now, &mut fx);
        fx
    }

    /// The orphan sweep. An unbound runner older than the grace is reaped (nobody wanted it).
    /// A *spare* (an unbound runner whose own job ran elsewhere) covers one unit of uncovered
    /// demand (a queued job its labels cover that no live runner was made for), newest spare
    /// first; the surplus is reaped at once instead of waiting out the grace. Reaped runners are
    /// deleted on GitHub when they report their exit (they never ran a job).
    pub fn sweep(&mut self, now: Now) -> Vec<Effect> {
        let mut fx = Vec::new();
        let Some(grace) = self.settings.orphan_grace else {
            return fx;
        };
        // A job still needs a runner if it has not started and no runner made for it is still
        // free to take it (its own runner may have been given a sibling).
        let has_free_runner = |j: &JobRecord| match &j.phase {
            Phase::Active { runner, .. } => {
                self.runners.get(runner).is_some_and(|r| r.bound.is_none())
            }
            _ => false,
        };
        let mut demand: Vec<(JobKey, Vec<String>)> = self
            .jobs
            .values()
            .filter(|j| {
                j.started_at.is_none()
                    && j.admissions <= self.settings.zombie_cap
                    && matches!(
                        j.phase,
                        Phase::Pending
                            | Phase::Claiming { .. }
                            | Phase::Retrying
                            | Phase::Active { .. }
                    )
                    && !has_free_runner(j)
            })
            .map(|j| (j.info.key.clone(), label_set(&j.info.labels)))
            .collect();
        demand.sort();
        let mut unbound: Vec<&RunnerRecord> = self
            .runners
            .values()
            .filter(|r| r.bound.is_none())
            .collect();
        unbound.sort_by(|a, b| b.created_at.cmp(&a.created_at).then(a.name.cmp(&b.name)));
        let mut reap: Vec<(String, ProviderKind, JobKey, &'static str)> = Vec::new();
        for r in unbound {
            let intent_started = self
                .jobs
                .get(&r.intent)
                .is_none_or(|j| j.started_at.is_some());
            if intent_started {
                let offered = self
                    .provider_index(r.provider)
                    .map(|i| self.provider_sets[i].clone())
                    .unwrap_or_default();
                let covers =
                    |wanted: &Vec<String>| wanted.iter().all(|w| offered.binary_search(w).is_ok());
                if let Some(pos) = demand.iter().position(|(_, wanted)| covers(wanted)) {
                    demand.remove(pos);
                    continue;
                }
                reap.push((
                    r.name.clone(),
                    r.provider,
                    r.intent.clone(),
                    "spare runner: its job ran elsewhere and no queued job needs it",
                ));
            } else if now.mono.saturating_duration_since(r.created_at) >= grace {
                reap.push((
                    r.name.clone(),
                    r.provider,
                    r.intent.clone(),
                    "orphan: no job took it within the grace",
                ));
            }
        }
        for (name, _, _, why) in reap {
            let r = &self.runners[&name];
            fx.push(Effect::CheckIdle {
                runner_id: r.id,
                repo: r.repo.clone(),
                name,
                reason: why,
            });
        }
        fx
    }

    /// GitHub's answer about a runner the sweep would reap: reap it only if it is still ours,
    /// still unbound, and GitHub says it is not busy (or no longer knows it).
    pub fn on_idle_checked(
        &mut self,
        name: &str,
        busy: Result<bool, GithubError>,
        reason: &'static str,
        now: Now,
    ) -> Vec<Effect> {
        let mut fx = Vec::new();
        let Some(r) = self.runners.get(name).filter(|r| r.bound.is_none()) else {
            return fx;
        };
        let (provider, intent) = (r.provider, r.intent.clone());
        match busy {
            Ok(false) => {
                tracing::info!(runner = %name, provider = provider.as_str(), reason, "reaping runner");
                self.note(&intent, now, format!("runner {name} reaped: {reason}"));
                fx.push(Effect::Teardown {
                    provider,
                    name: name.to_string(),
                    reason,
                });
            }
            Ok(true) => {
                tracing::info!(runner = %name, "runner looked idle but GitHub says it is busy; keeping it");
            }
            Err(e) => {
                tracing::warn!(runner = %name, error_class = e.class().as_str(), error = %e, "cannot check the runner; keeping it for now");
            }
        }
        fx
    }

    /// Tears down every runner (the end of a drain). Runners that never ran a job are deleted
    /// on GitHub when they report their exit.
    pub fn teardown_all(&mut self, now: Now) -> Vec<Effect> {
        let mut fx = Vec::new();
        let runners: Vec<(String, ProviderKind, JobKey)> = self
            .runners
            .values()
            .map(|r| (r.name.clone(), r.provider, r.intent.clone()))
            .collect();
        for (name, provider, intent) in runners {
            self.note(
                &intent,
                now,
                format!("drain deadline: tearing down runner {name}"),
            );
            fx.push(Effect::Teardown {
                provider,
                name,
                reason: "shutdown timeout reached",
            });
        }
        fx
    }

    /// `runner.name_prefix`.
    pub fn name_prefix(&self) -> &str {
        &self.settings.name_prefix
    }

    /// Repos of repo-level runners (empty: org-level).
    pub fn repos(&self) -> &[String] {
        &self.settings.repos
    }

    /// How often to reconcile, if at all.
    pub fn reconcile_interval(&self) -> Option<Duration> {
        self.settings.reconcile_interval
    }

    /// Forgets jobs whose dedup and started windows have passed.
    pub fn prune(&mut self, now: Now) {
        let seen_ttl = self.settings.seen_ttl;
        let started_ttl = self.settings.started_ttl;
        let referenced: std::collections::HashSet<&JobKey> = self
            .runners
            .values()
            .flat_map(|r| std::iter::once(&r.intent).chain(r.bound.as_ref()))
            .collect();
        let expired = |at: Option<Instant>, ttl: Duration| {
            at.is_none_or(|t| now.mono.saturating_duration_since(t) >= ttl)
        };
        let gone: Vec<JobKey> = self
            .jobs
            .iter()
            .filter(|(k, r)| {
                matches!(r.phase, Phase::Seen | Phase::Unroutable | Phase::Done)
                    && expired(r.seen_at, seen_ttl)
                    && expired(r.started_at, started_ttl)
                    && !referenced.contains(k)
            })
            .map(|(k, _)| k.clone())
            .collect();
        for k in gone {
            self.jobs.remove(&k);
            self.ops.push(Op::DeleteJob(k.clone()));
        }
        self.recent_runners
            .retain(|_, (_, _, gone, _)| now.mono.saturating_duration_since(*gone) < seen_ttl);
    }

    // ----- views --------------------------------------------------------------------------

    /// True while cordoned.
    pub fn is_draining(&self) -> bool {
        self.draining
    }

    /// Runners alive.
    pub fn runner_count(&self) -> usize {
        self.runners.len()
    }

    /// Runners of ours, by name.
    pub fn runners(&self) -> impl Iterator<Item = &RunnerRecord> {
        self.runners.values()
    }

    /// A job's record.
    pub fn job(&self, key: &JobKey) -> Option<&JobRecord> {
        self.jobs.get(key)
    }

    /// Counters.
    pub fn stats(&self) -> Stats {
        self.stats
    }

    /// Everything, for status pages.
    pub fn view(&self, now: Now) -> SchedulerState {
        let mut jobs: Vec<JobView> = self
            .jobs
            .values()
            .map(|r| JobView {
                key: r.info.key.clone(),
                repo: r.info.repo.clone(),
                labels: r.info.labels.clone(),
                phase: r.phase.clone(),
                pending: matches!(
                    r.phase,
                    Phase::Pending | Phase::Claiming { .. } | Phase::Retrying
                ),
                seen: r.seen_at.is_some_and(|t| {
                    now.mono.saturating_duration_since(t) < self.settings.seen_ttl
                }),
                started: r.started_at.is_some(),
                admissions: r.admissions,
                retry_attempts: r.retry_attempts,
                error_class: r.error_class,
                next_attempt_unix: r.next_attempt_unix,
                runner_name: r.info.runner_name.clone(),
                timeline: r.timeline.clone(),
            })
            .collect();
        jobs.sort_by(|a, b| a.key.cmp(&b.key));
        let mut runners: Vec<RunnerRecord> = self.runners.values().cloned().collect();
        runners.sort_by(|a, b| a.name.cmp(&b.name));
        SchedulerState {
            draining: self.draining,
            max_concurrent: self.settings.max_concurrent,
            used: self.used_total,
            providers: self
                .settings
                .providers
                .iter()
                .zip(&self.slots)
                .map(|(p, s)| ProviderView {
                    provider: p.kind,
                    up: s.up,
                    down_cause: s.down_cause.clone(),
                    used: s.used,
                    max: p.max_concurrent,
                    labels: p.labels.clone(),
                })
                .collect(),
            pending: self.pending.len(),
            stats: self.stats,
            jobs,
            runners,
        }
    }
}

fn describe(reason: &crate::retry::DelayReason) -> String {
    use crate::retry::DelayReason as R;
    match reason {
        R::Ladder { rung } => format!("ladder rung {}", rung + 1),
        R::RetryAfter => "Retry-After".into(),
        R::RateReset { reset } => format!("rate budget empty until {reset}"),
    }
}

/// GitHub's conclusions, so the metric label stays bounded.
fn bounded_conclusion(c: &str) -> &'static str {
    match c {
        "success" => "success",
        "failure" => "failure",
        "cancelled" => "cancelled",
        "skipped" => "skipped",
        "timed_out" => "timed_out",
        "neutral" => "neutral",
        "action_required" => "action_required",
        _ => "unknown",
    }
}

/// A job, for status views.
#[derive(Debug, Clone, Serialize)]
pub struct JobView {
    /// Identity.
    pub key: JobKey,
    /// Repo.
    pub repo: String,
    /// Labels.
    pub labels: Vec<String>,
    /// Where it stands.
    pub phase: Phase,
    /// In the original's terms: in `pending` (waiting, claiming or retrying).
    pub pending: bool,
    /// In the original's terms: in `seen` (admitted within the TTL).
    pub seen: bool,
    /// Observed in progress or completed.
    pub started: bool,
    /// Admissions (zombie counter).
    pub admissions: u32,
    /// Ladder failures.
    pub retry_attempts: u32,
    /// First failure's class.
    pub error_class: Option<ErrorClass>,
    /// Next retry, unix seconds.
    pub next_attempt_unix: Option<u64>,
    /// Runner GitHub gave it.
    pub runner_name: Option<String>,
    /// Decisions.
    pub timeline: Vec<Note>,
}

/// A provider, for status views.
#[derive(Debug, Clone, Serialize)]
pub struct ProviderView {
    /// Which.
    pub provider: ProviderKind,
    /// Accepting runners.
    pub up: bool,
    /// Why it is not (its host check failed, it stopped, it is starting).
    pub down_cause: Option<String>,
    /// Slots in use.
    pub used: usize,
    /// Slots.
    pub max: usize,
    /// Labels.
    pub labels: Vec<String>,
}

/// The scheduler's state, for `GetSchedulerState` and the admin API.
#[derive(Debug, Clone, Serialize)]
pub struct SchedulerState {
    /// Cordoned.
    pub draining: bool,
    /// Global slots.
    pub max_concurrent: usize,
    /// Global slots in use.
    pub used: usize,
    /// Per provider.
    pub providers: Vec<ProviderView>,
    /// Jobs waiting for a slot.
    pub pending: usize,
    /// Counters.
    pub stats: Stats,
    /// Every job known.
    pub jobs: Vec<JobView>,
    /// Every runner of ours.
    pub runners: Vec<RunnerRecord>,
}
