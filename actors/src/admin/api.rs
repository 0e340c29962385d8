//! The admin API's answers, as types both sides use: the admin handlers serialize them and
//! `ephemer-actors status|jobs|cordon` deserializes them. Built from the scheduler's views;
//! a job's timeline travels as its sentences.

use serde::{Deserialize, Serialize};

use crate::{
    job::JobKey,
    retry::{RetryTimerView, RetryView},
    scheduler::{
        Phase,
        core::{JobDetail, JobView, ProviderView, RunnerRecord, Stats},
    },
    vocab::{ErrorClass, ProviderKind, RateSnapshot},
};

/// `GET /api/v1/status`
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StatusAnswer {
    /// Daemon version.
    pub version: String,
    /// Seconds since the instance started.
    pub uptime_seconds: u64,
    /// Cordoned or draining.
    pub draining: bool,
    /// Global slots.
    pub capacity: Capacity,
    /// Per provider.
    pub providers: Vec<ProviderLine>,
    /// Jobs waiting for a slot.
    pub pending: usize,
    /// Runners alive.
    pub runners: usize,
    /// Items waiting on the retry ladder.
    pub retry_queue_depth: usize,
    /// The ladder's one timer.
    pub retry_timer: Option<RetryTimerView>,
    /// The latest rate-limit reading of the credential.
    pub rate: Option<RateSnapshot>,
    /// Counters.
    pub stats: Stats,
}

/// Global slots.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub struct Capacity {
    /// `runner.max_concurrent`.
    pub max_concurrent: usize,
    /// In use.
    pub used: usize,
}

/// One provider (pool).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ProviderLine {
    /// Which.
    pub provider: ProviderKind,
    /// Its provisioner (`LocalProvisioner`, ...).
    pub provisioner: String,
    /// Taking runners.
    pub up: bool,
    /// Why not.
    pub down_cause: Option<String>,
    /// Slots in use.
    pub used: usize,
    /// Slots.
    pub max: usize,
    /// Labels.
    pub labels: Vec<String>,
}

impl From<ProviderView> for ProviderLine {
    fn from(p: ProviderView) -> Self {
        ProviderLine {
            provider: p.provider,
            provisioner: p.provisioner.to_string(),
            up: p.up,
            down_cause: p.down_cause,
            used: p.used,
            max: p.max,
            labels: p.labels,
        }
    }
}

/// One line of a job's timeline.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TimelineLine {
    /// Unix seconds.
    pub at: u64,
    /// What was decided and why.
    pub text: String,
}

/// A job.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct JobLine {
    /// Identity.
    pub key: JobKey,
    /// Repo.
    pub repo: String,
    /// Labels.
    pub labels: Vec<String>,
    /// Where it stands.
    pub phase: Phase,
    /// Waiting, claiming or retrying.
    pub pending: bool,
    /// Admitted within the dedup window.
    pub seen: bool,
    /// Observed in progress or completed.
    pub started: bool,
    /// Admissions (zombie counter).
    pub admissions: u32,
    /// Failed claims (or environments).
    pub retry_attempts: u32,
    /// First failure's class.
    pub error_class: Option<ErrorClass>,
    /// Next retry, unix seconds.
    pub next_attempt_unix: Option<u64>,
    /// The runner GitHub gave it.
    pub runner_name: Option<String>,
    /// Every decision (only in `GET /api/v1/jobs/{id}`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub timeline: Vec<TimelineLine>,
}

impl From<JobView> for JobLine {
    fn from(j: JobView) -> Self {
        JobLine {
            key: j.key,
            repo: j.repo,
            labels: j.labels,
            phase: j.phase,
            pending: j.pending,
            seen: j.seen,
            started: j.started,
            admissions: j.admissions,
            retry_attempts: j.retry_attempts,
            error_class: j.error_class,
            next_attempt_unix: j.next_attempt_unix,
            runner_name: j.runner_name,
            timeline: j
                .timeline
                .into_iter()
                .map(|e| TimelineLine {
                    at: e.at,
                    text: e.note.to_string(),
                })
                .collect(),
        }
    }
}

/// A runner of ours.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RunnerLine {
    /// Name.
    pub name: String,
    /// GitHub id.
    pub id: u64,
    /// Provider.
    pub provider: ProviderKind,
    /// Repo for repo-level runners.
    pub repo: Option<String>,
    /// The job it was made for.
    pub intent: JobKey,
    /// The job GitHub gave it, once observed.
    pub bound: Option<JobKey>,
    /// Unix seconds of the claim.
    pub created_unix: u64,
}

impl From<RunnerRecord> for RunnerLine {
    fn from(r: RunnerRecord) -> Self {
        RunnerLine {
            name: r.name,
            id: r.id,
            provider: r.provider,
            repo: r.repo,
            intent: r.intent,
            bound: r.bound,
            created_unix: r.created_unix,
        }
    }
}

/// A job's item on the retry ladder.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RetryLine {
    /// Failures so far.
    pub attempts: u32,
    /// Class of the first failure.
    pub class: ErrorClass,
    /// Seconds until the next attempt (`None` while one is in flight).
    pub next_attempt_in_secs: Option<f64>,
    /// Seconds since the first failure.
    pub first_failure_secs_ago: f64,
    /// The latest failure.
    pub last_error: String,
}

impl From<RetryView> for RetryLine {
    fn from(r: RetryView) -> Self {
        RetryLine {
            attempts: r.attempts,
            class: r.class,
            next_attempt_in_secs: r.next_attempt_in_secs,
            first_failure_secs_ago: r.first_failure_secs_ago,
            last_error: r.last_error,
        }
    }
}

/// `GET /api/v1/jobs`
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct JobsAnswer {
    /// Every job the scheduler knows (without timelines).
    pub jobs: Vec<JobLine>,
    /// Every runner of ours.
    pub runners: Vec<RunnerLine>,
}

/// `GET /api/v1/jobs/{id}`
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct JobAnswer {
    /// The job, with its timeline.
    pub job: JobLine,
    /// Its ladder item, if on the ladder.
    pub retry: Option<RetryLine>,
    /// Runners made for it or bound to it.
    pub runners: Vec<RunnerLine>,
}

impl From<JobDetail> for JobAnswer {
    fn from(d: JobDetail) -> Self {
        JobAnswer {
            job: d.job.into(),
            retry: d.retry.map(Into::into),
            runners: d.runners.into_iter().map(Into::into).collect(),
        }
    }
}

/// `POST /api/v1/cordon`, `/uncordon`
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub struct CordonAnswer {
    /// Cordoned now.
    pub cordoned: bool,
}

/// Any refusal.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ErrorAnswer {
    /// Why.
    pub error: String,
}
