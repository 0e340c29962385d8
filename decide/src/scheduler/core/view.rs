//! Read-only views of the scheduler for the admin API and tests.

use super::View;
use super::{JobRecord, Phase, RunnerRecord, Stats, TimelineEntry};
use crate::{
    clock::Now, config::PoolName, durable::RunnerRow, github::ErrorClass, job::JobKey,
    retry::RetryView, vocab::RateSnapshot,
};
use serde::Serialize;

impl<'a> View<'a> {
    /// True while cordoned.
    pub fn is_draining(&self) -> bool {
        self.state.draining
    }

    /// Runners alive.
    pub fn runner_count(&self) -> usize {
        self.state.book.len()
    }

    /// Runners of ours, by name.
    pub fn runners(&self) -> impl Iterator<Item = &'a RunnerRecord> + use<'a> {
        self.state.book.runners()
    }

    /// A job's record.
    pub fn job(&self, key: &JobKey) -> Option<&'a JobRecord> {
        self.state.jobs.get(key)
    }

    /// The repo and pool of a target's job `job_id`, for its log span (`-` where unknown: a
    /// job of another owner, one already forgotten, one not routed yet).
    pub fn job_context(&self, job_id: u64) -> (String, String) {
        let record = self
            .setup
            .settings
            .targets
            .iter()
            .find_map(|t| self.state.jobs.get(&JobKey::new(&t.owner, job_id)));
        match record {
            Some(r) => {
                let pool = match &r.phase() {
                    Phase::Claiming { provider } | Phase::Active { provider, .. } => {
                        provider.to_string()
                    }
                    _ => "-".into(),
                };
                (r.info().repo.to_string(), pool)
            }
            None => ("-".into(), "-".into()),
        }
    }

    /// A number that changes whenever a job's state does (a decision was taken about one):
    /// what a live page compares to know it must fetch again.
    pub fn generation(&self) -> u64 {
        self.state.jobs.notes_taken()
    }

    /// Counters.
    pub fn stats(&self) -> Stats {
        self.state.stats
    }

    /// Items waiting on the retry ladder.
    pub fn ladder_depth(&self) -> usize {
        self.state.ladder.queue().len()
    }

    /// The ladder's items, for status pages.
    pub fn retry_queue(&self, now: Now) -> RetryQueueView {
        RetryQueueView {
            depth: self.state.ladder.queue().len(),
            items: self.state.ladder.queue().views(now.mono),
        }
    }

    fn job_view(&self, r: &JobRecord, now: Now, timeline: bool) -> JobView {
        let item = self.state.ladder.queue().get(&r.info().key);
        JobView {
            key: r.info().key.clone(),
            repo: r.info().repo.to_string(),
            labels: r.info().labels.to_vec(),
            phase: r.phase().clone(),
            pending: matches!(
                r.phase(),
                Phase::Pending | Phase::Claiming { .. } | Phase::Retrying
            ),
            seen: r.seen_at().is_some_and(|t| {
                now.mono.saturating_duration_since(t) < self.setup.settings.seen_ttl
            }),
            started: r.started_at().is_some(),
            admissions: r.admissions(),
            idle_reaps: r.idle_reaps(),
            retry_attempts: item
                .map(|i| i.attempts)
                .or(r.ladder_left().map(|(n, _)| n))
                .unwrap_or(0),
            error_class: item.map(|i| i.class).or(r.ladder_left().map(|(_, c)| c)),
            next_attempt_unix: item.and_then(|i| i.next_attempt).map(|at| {
                now.unix
                    .saturating_add(at.saturating_duration_since(now.mono).as_secs())
            }),
            runner_name: r.info().runner_name.clone(),
            run_id: r.info().run_id,
            arrived_unix: r.timeline().first().map(TimelineEntry::at),
            run_attempt: r.info().run_attempt,
            pool: super::hour::pool_of(r).map(|p| p.to_string()),
            about: r.info().about.clone(),
            timeline: if timeline {
                r.timeline().to_vec()
            } else {
                Vec::new()
            },
        }
    }

    fn job_views(&self, now: Now, timelines: bool) -> Vec<JobView> {
        let mut jobs: Vec<JobView> = self
            .state
            .jobs
            .records()
            .map(|r| self.job_view(r, now, timelines))
            .collect();
        jobs.sort_by(|a, b| a.key.cmp(&b.key));
        jobs
    }

    fn sorted_runners(&self, keep: impl Fn(&RunnerRecord) -> bool) -> Vec<RunnerRow> {
        let mut runners: Vec<RunnerRow> = self
            .state
            .book
            .runners()
            .filter(|r| keep(r))
            .map(|r| r.row().clone())
            .collect();
        runners.sort_by(|a, b| a.name.cmp(&b.name));
        runners
    }

    /// The summary for `status`: no job list.
    pub fn status(&self, now: Now) -> StatusView {
        StatusView {
            last_hour: self.last_hour(now.unix),
            draining: self.state.draining,
            shutting_down: self.state.shutting_down,
            capacity: Capacity {
                max_concurrent: self.setup.settings.max_concurrent,
                used: self.state.capacity.used_total(),
            },
            providers: self.provider_views(now),
            pending: self.state.admission.pending().len(),
            runners: self.state.book.len(),
            retry_queue_depth: self.state.ladder.queue().len(),
            stats: self.state.stats,
            targets: self.target_views(),
        }
    }

    fn target_views(&self) -> Vec<TargetView> {
        let held = self.state.held_per_target(self.setup);
        let mut pending = vec![0; self.setup.settings.targets.len()];
        for (t, n) in self.state.admission.pending().per_target().enumerate() {
            if let Some(p) = pending.get_mut(t) {
                *p += n;
            }
        }
        self.setup
            .settings
            .targets
            .iter()
            .enumerate()
            .map(|(t, spec)| TargetView {
                name: spec.name.clone(),
                owner: spec.owner.clone(),
                weight: spec.weight,
                held: held[t],
                pending: pending[t],
                rate: Default::default(),
            })
            .collect()
    }

    fn provider_views(&self, now: Now) -> Vec<ProviderView> {
        self.setup
            .settings
            .providers
            .iter()
            .zip(self.state.capacity.slots())
            .map(|(p, s)| ProviderView {
                provider: p.name.clone(),
                kind: p.kind,
                provisioner: p.kind.provisioner_name().to_string(),
                up: s.up,
                down_cause: s.down_cause.clone(),
                used: s.used,
                max: p.max_concurrent,
                labels: p.labels.clone(),
                environment_failures: s.env_failures,
                last_environment_failure: s.last_env_failure.clone(),
                warm: s.warm,
                accel: p.accel.clone(),
                refusal: self.state.refusals.status(&p.name, now.unix),
            })
            .collect()
    }

    /// Every job (without timelines) and runner, for `jobs`.
    pub fn jobs_view(&self, now: Now) -> JobsView {
        JobsView {
            jobs: self.job_views(now, false),
            runners: self.sorted_runners(|_| true),
        }
    }

    /// One job by id, with its timeline, its ladder item and the runners made for or bound
    /// to it, for `jobs <id>`.
    pub fn job_detail(&self, job_id: u64, now: Now) -> Option<JobDetail> {
        let r = self
            .state
            .jobs
            .records()
            .find(|r| r.info().key.job_id == job_id)?;
        let key = &r.info().key;
        Some(JobDetail {
            job: self.job_view(r, now, true),
            retry: self
                .state
                .ladder
                .queue()
                .views(now.mono)
                .into_iter()
                .find(|v| &v.key == key),
            runners: self.sorted_runners(|x| &x.intent == key || x.bound.as_ref() == Some(key)),
            ledger: None,
        })
    }

    /// Everything, for tests and embedding apps that want the whole picture.
    pub fn everything(&self, now: Now) -> SchedulerState {
        SchedulerState {
            status: self.status(now),
            jobs: self.job_views(now, true),
            runners: self.sorted_runners(|_| true),
        }
    }
}

/// A job, for status views.
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
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
    /// Admissions (dispatches: deliveries, heals, re-admissions).
    pub admissions: u32,
    /// Runners made for it that sat idle until reaped (the zombie counter; parked at the cap).
    #[serde(default)]
    pub idle_reaps: u8,
    /// Ladder failures.
    pub retry_attempts: u32,
    /// First failure's class.
    pub error_class: Option<ErrorClass>,
    /// Next retry, unix seconds.
    pub next_attempt_unix: Option<u64>,
    /// Runner GitHub gave it.
    pub runner_name: Option<String>,
    /// Its workflow run (for a link to the job on GitHub).
    #[serde(default)]
    pub run_id: u64,
    /// When its first note was taken (it arrived), unix seconds.
    #[serde(default)]
    pub arrived_unix: Option<u64>,
    /// Its run's attempt (a re-run's jobs are new jobs with the next attempt).
    #[serde(default = "first_attempt")]
    pub run_attempt: u32,
    /// The pool it was routed to last, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pool: Option<String>,
    /// Its name, workflow, branch and trigger, when a delivery said.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub about: Option<std::sync::Arc<crate::job::JobAbout>>,
    /// Decisions.
    pub timeline: Vec<TimelineEntry>,
}

fn first_attempt() -> u32 {
    1
}

/// Global slots.
#[derive(Debug, Clone, Copy, Serialize, serde::Deserialize)]
pub struct Capacity {
    /// `runner.max_concurrent`.
    pub max_concurrent: usize,
    /// In use.
    pub used: usize,
}

/// The summary for `status`.
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct StatusView {
    /// Each pool's last hour, in five-minute buckets (the page's charts).
    #[serde(default)]
    pub last_hour: Vec<super::hour::PoolHour>,
    /// Cordoned (by an operator, or by a shutdown).
    pub draining: bool,
    /// Shutting down: a drain that ends with the daemon's exit.
    #[serde(default)]
    pub shutting_down: bool,
    /// Global slots.
    pub capacity: Capacity,
    /// Per provider.
    pub providers: Vec<ProviderView>,
    /// Jobs waiting for a slot.
    pub pending: usize,
    /// Runners alive.
    pub runners: usize,
    /// Items waiting on the retry ladder.
    pub retry_queue_depth: usize,
    /// Counters.
    pub stats: Stats,
    /// Each GitHub target: its share of the slots now, and (filled in by the admin API) its
    /// budget.
    #[serde(default)]
    pub targets: Vec<TargetView>,
}

/// A GitHub target, for `status`.
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct TargetView {
    /// Its name (the `target` metric label).
    pub name: String,
    /// Its owner.
    pub owner: String,
    /// Its share of scarce slots.
    pub weight: u32,
    /// Slots its claims in flight and runners hold now.
    pub held: usize,
    /// Its jobs waiting for a slot or a claim token.
    pub pending: usize,
    /// The latest rate-limit reading of each bucket of its credential.
    #[serde(default)]
    pub rate: std::collections::BTreeMap<crate::vocab::RateBucket, RateSnapshot>,
}

/// The ladder, for status pages.
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct RetryQueueView {
    /// Items waiting for their next attempt.
    pub depth: usize,
    /// Every item, waiting or in flight.
    pub items: Vec<RetryView>,
}

/// Every job and runner, for `jobs`.
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct JobsView {
    /// Jobs, without timelines.
    pub jobs: Vec<JobView>,
    /// Runners.
    pub runners: Vec<RunnerRow>,
}

/// One job in full, for `jobs <id>`.
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct JobDetail {
    /// The job, with its timeline.
    pub job: JobView,
    /// Its ladder item, if on the ladder.
    pub retry: Option<RetryView>,
    /// Runners made for it or bound to it.
    pub runners: Vec<RunnerRow>,
    /// Fleet mode: where the cluster ledger says it stands, and which host holds it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ledger: Option<crate::cluster::JobHolder>,
}

/// A provider, for status views.
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct ProviderView {
    /// The pool's name.
    pub provider: PoolName,
    /// Its kind.
    pub kind: crate::config::ProviderKind,
    /// The provisioner actor serving it (`LocalProvisioner`, `LinuxProvisioner`, ...).
    pub provisioner: String,
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
    /// Environments that failed to come up (or exited before their job started) since start:
    /// a pool that is up but whose environments keep failing shows it here.
    #[serde(default)]
    pub environment_failures: u64,
    /// The latest such failure.
    #[serde(default)]
    pub last_environment_failure: Option<String>,
    /// Its warm environments, in a pool that keeps some.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub warm: Option<crate::provision::WarmView>,
    /// A VM pool's accelerator: `kvm`, or `tcg` (software, 10-50x slower).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub accel: Option<String>,
    /// While GitHub refuses the pool's newest runner release (likely its outage): what the
    /// pool does about it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refusal: Option<String>,
}

/// The scheduler's whole state, for `GetSchedulerState`: tests and embedding apps.
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct SchedulerState {
    /// The summary.
    #[serde(flatten)]
    pub status: StatusView,
    /// Every job known, with its timeline.
    pub jobs: Vec<JobView>,
    /// Every runner of ours.
    pub runners: Vec<RunnerRow>,
}
