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

    /// The key of the `n`th registered warm runner's intent ([`Intent::Warm`]).
    pub fn warm(owner: &str, n: u64) -> Self {
        JobKey::new(owner, WARM_BASE + n.min(RECKONED_BASE - WARM_BASE - 1))
    }

    /// The key of the `n`th scale-set placeholder ([`Intent::Reckoned`]).
    pub fn reckoned(owner: &str, n: u64) -> Self {
        JobKey::new(owner, RECKONED_BASE + n.min(u64::MAX - RECKONED_BASE))
    }

    /// What the key stands for: a GitHub job, or something the daemon made up.
    pub fn intent(&self) -> Intent {
        match self.job_id {
            id if id >= RECKONED_BASE => Intent::Reckoned(id - RECKONED_BASE),
            id if id >= WARM_BASE => Intent::Warm(id - WARM_BASE),
            id => Intent::Job(id),
        }
    }

    /// Whether this is a scale-set listener's placeholder ([`Intent::Reckoned`]).
    pub fn is_reckoned(&self) -> bool {
        matches!(self.intent(), Intent::Reckoned(_))
    }

    /// Whether this is a registered warm runner's intent, not a job ([`Intent::Warm`]).
    pub fn is_warm(&self) -> bool {
        matches!(self.intent(), Intent::Warm(_))
    }
}

/// What a [`JobKey`] stands for. The daemon makes up keys for runners that serve no job yet;
/// they travel, and are stored, as job ids in ranges no GitHub id reaches (GitHub's ids, and
/// runner request ids, are far below 2^61), and only this type tells them apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Intent {
    /// A GitHub job (or a scale-set job keyed by its assignment or runner request).
    Job(u64),
    /// A registered warm runner's intent, numbered: a runner claimed ahead of any job
    /// (`warm_mode = "registered"`) is made "for" it, so it is a spare from its claim on,
    /// supply for whichever job comes.
    Warm(u64),
    /// A scale-set placeholder, numbered: GitHub's statistics say more jobs are assigned to a
    /// pool's scale set than the daemon knows (a message acknowledged by someone else, a store
    /// lost), and a placeholder claims a runner for each; the runner takes whichever assigned
    /// job GitHub gives it, and the placeholder ends there.
    Reckoned(u64),
}

/// Where warm intents' ids start (the encoding [`Intent`] reads).
const WARM_BASE: u64 = 1 << 61;

/// Where placeholders' ids start (the encoding [`Intent`] reads).
const RECKONED_BASE: u64 = 1 << 62;

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
    /// GitHub's own `created_at` (when it queued the job), in unix seconds, when an event
    /// carried it. With [`JobInfo::github_wait_secs`] it gives GitHub's `started_at` too.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub github_created_unix: Option<u32>,
    /// A scale set's `completed` that withdrew an assignment no runner took in time: the
    /// service assigns the job again in a moment, so the runner made for it is kept for that.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub withdrawn: bool,
    /// What a person reads about it (its name, workflow, branch, trigger), when a delivery
    /// said. Shared: the record and the views hold one copy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub about: Option<Arc<JobAbout>>,
}

/// What a person reads about a job, as its `workflow_job` delivery names it. Every field comes
/// from whoever can push a workflow: shown escaped, and each held to [`JobAbout::MAX`] bytes.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
pub struct JobAbout {
    /// The job's name (`workflow_job.name`).
    #[serde(default)]
    pub name: String,
    /// Its workflow's name (`workflow_job.workflow_name`).
    #[serde(default)]
    pub workflow: String,
    /// The branch it runs on (`workflow_job.head_branch`).
    #[serde(default)]
    pub branch: String,
    /// Who triggered the run (`sender.login`).
    #[serde(default)]
    pub sender: String,
}

impl JobAbout {
    /// The most bytes kept of each field (cut at a character's edge).
    pub const MAX: usize = 200;

    /// The fields, each cut to [`JobAbout::MAX`]; `None` when all are empty.
    pub fn new(name: &str, workflow: &str, branch: &str, sender: &str) -> Option<Self> {
        if [name, workflow, branch, sender]
            .iter()
            .all(|s| s.is_empty())
        {
            return None;
        }
        Some(JobAbout {
            name: cut(name),
            workflow: cut(workflow),
            branch: cut(branch),
            sender: cut(sender),
        })
    }
}

/// `s` up to [`JobAbout::MAX`] bytes, at a character's edge.
fn cut(s: &str) -> String {
    let mut end = s.len().min(JobAbout::MAX);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s[..end].to_string()
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

    #[test]
    fn what_a_person_reads_is_kept_whole_up_to_its_cap_and_cut_at_a_character() {
        assert_eq!(JobAbout::new("", "", "", ""), None);
        let long = "é".repeat(150);
        let about = JobAbout::new("build", &long, "main", "octocat").unwrap();
        assert_eq!(about.name, "build");
        assert!(about.workflow.len() <= JobAbout::MAX && about.workflow.len() >= JobAbout::MAX - 1);
        assert!(about.workflow.chars().all(|c| c == 'é'));
    }
}
