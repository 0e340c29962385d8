//! The job vocabulary every actor shares: a job's identity, what is known about it, and the
//! `workflow_job` actions. Plain data; no behaviour beyond label arithmetic.

use std::{fmt, sync::Arc};

use serde::{Deserialize, Serialize};

/// A job's identity: GitHub job ids are global, the owner keeps several GitHub targets apart.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Default, Serialize, Deserialize)]
pub struct JobKey {
    /// The repository owner (lowercased). Shared: the scheduler keeps one copy per owner.
    pub owner: Arc<str>,
    /// GitHub's job id.
    pub job_id: u64,
}

impl JobKey {
    /// A key; the owner is lowercased so `Acme` and `acme` are one owner.
    pub fn new(owner: &str, job_id: u64) -> Self {
        let owner = if owner.bytes().any(|b| b.is_ascii_uppercase()) {
            Arc::from(owner.to_ascii_lowercase())
        } else {
            Arc::from(owner)
        };
        JobKey { owner, job_id }
    }

    /// Whether this is a scale-set listener's placeholder: a job GitHub assigned to a scale
    /// set that this daemon never heard of, stood in for until a runner takes the real one
    /// (see [`RECKONED_BASE`]).
    pub fn is_reckoned(&self) -> bool {
        self.job_id >= RECKONED_BASE
    }

    /// Whether this is a registered warm runner's intent, not a job (see [`WARM_BASE`]).
    pub fn is_warm(&self) -> bool {
        (WARM_BASE..RECKONED_BASE).contains(&self.job_id)
    }
}

/// Job ids from here up to [`RECKONED_BASE`] name registered warm runners' intents, never
/// GitHub jobs: a runner claimed ahead of any job (`warm_mode = "registered"`) is made "for"
/// one of these, so it is a spare from its claim on, supply for whichever job comes.
pub const WARM_BASE: u64 = 1 << 61;

/// Job ids from here up name placeholders, never GitHub jobs: in scale-set mode GitHub's
/// statistics can say more jobs are assigned to a pool's scale set than the daemon knows (a
/// message acknowledged by someone else, a store lost), and a placeholder job claims a
/// runner for each; the runner takes whichever assigned job GitHub gives it, and the
/// placeholder ends there. (GitHub's ids, and runner request ids, are far below 2^62.)
pub const RECKONED_BASE: u64 = 1 << 62;

impl fmt::Display for JobKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.owner, self.job_id)
    }
}

/// The `action` of a `workflow_job` delivery.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum JobAction {
    /// The job was created and waits for a runner.
    Queued,
    /// A runner (any runner) took the job.
    InProgress,
    /// The job finished, whatever its conclusion (also when cancelled before any runner).
    Completed,
    /// The job waits for an environment approval.
    Waiting,
}

impl JobAction {
    /// Parses GitHub's spelling; unknown future actions give `None` and are ignored.
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "queued" => JobAction::Queued,
            "in_progress" => JobAction::InProgress,
            "completed" => JobAction::Completed,
            "waiting" => JobAction::Waiting,
            _ => return None,
        })
    }

    /// GitHub's spelling, also the `action` metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            JobAction::Queued => "queued",
            JobAction::InProgress => "in_progress",
            JobAction::Completed => "completed",
            JobAction::Waiting => "waiting",
        }
    }
}

/// What a delivery (or a reconcile poll) tells about one job.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct JobInfo {
    /// Identity.
    pub key: JobKey,
    /// Repository name (without the owner). Shared, as the owner.
    pub repo: Arc<str>,
    /// Workflow run id.
    pub run_id: u64,
    /// Run attempt (re-runs get new job ids).
    pub run_attempt: u32,
    /// The job's `runs-on` labels. Shared: the scheduler keeps one copy per label set.
    pub labels: Arc<[String]>,
    /// The runner that took it (`in_progress`, `completed`); may not be the one we made for it.
    pub runner_name: Option<String>,
    /// That runner's id.
    pub runner_id: Option<u64>,
    /// `success`, `failure`, `cancelled`, ... once completed. Shared, as the owner.
    pub conclusion: Option<Arc<str>>,
    /// The App installation the delivery came from.
    pub installation_id: Option<u64>,
    /// GitHub's `started_at` less its `created_at`, in seconds, when an event carried both:
    /// how long the job was queued before a runner took it, by GitHub's own clock.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub github_wait_secs: Option<u32>,
    /// A scale set's `completed` that withdrew an assignment no runner took in time: the
    /// service assigns the job again in a moment, so the runner made for it is kept for that.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub withdrawn: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn actions_round_trip_and_unknown_is_none() {
        for a in [
            JobAction::Queued,
            JobAction::InProgress,
            JobAction::Completed,
            JobAction::Waiting,
        ] {
            assert_eq!(JobAction::parse(a.as_str()), Some(a));
        }
        assert_eq!(JobAction::parse("requested"), None);
    }
}
