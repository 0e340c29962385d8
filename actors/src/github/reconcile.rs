//! The reconcile's listing: every queued job of the repos the credentials reach, repo by repo.
//!
//! A repo that fails costs only its own jobs this pass (counted, logged, tried again next
//! pass); archived and disabled repos run no workflows and are skipped; the listing is conditional
//! (an unchanged page is a 304, free of rate limit), and a pass stops early when the `core`
//! budget runs low, the next pass starting where this one stopped.

use serde::Deserialize;

use super::{GithubClient, GithubError, auth::Credentials, client::ApiJob};
use crate::job::JobInfo;

/// A pass stops early once `core` has less than this fraction of its limit left (and at
/// least [`LOW_BUDGET_FLOOR`]): claims, which are what the budget is for, need it more.
const LOW_BUDGET_SHARE: u64 = 10;
/// ... and never below this many requests.
const LOW_BUDGET_FLOOR: u64 = 100;

#[derive(Deserialize)]
pub(super) struct RunsPage {
    pub(super) workflow_runs: Vec<Run>,
}

#[derive(Deserialize)]
pub(super) struct Run {
    pub(super) id: u64,
}

#[derive(Deserialize)]
pub(super) struct JobsPage {
    pub(super) jobs: Vec<ApiJob>,
}

#[derive(Deserialize)]
struct ReposPage {
    repositories: Vec<Repo>,
}

#[derive(Deserialize)]
struct Repo {
    name: String,
    #[serde(default)]
    archived: bool,
    #[serde(default)]
    disabled: bool,
}

/// What one reconcile pass found.
#[derive(Debug, Default)]
pub struct Reconciled {
    /// Queued jobs, from every repo that answered.
    pub jobs: Vec<JobInfo>,
    /// Repos that failed (their jobs wait for the next pass), with why.
    pub failed: Vec<(String, GithubError)>,
    /// Repos listed this pass.
    pub listed: usize,
    /// Repos left for the next pass because the budget ran low.
    pub deferred: usize,
    /// Where the next pass starts (an index into the repo list).
    pub next_start: usize,
}

impl GithubClient {
    /// Every queued job of `repo`: the jobs of its queued *and* in-progress runs (a running
    /// workflow can still hold queued jobs), every page.
    pub async fn list_queued_jobs(&self, repo: &str) -> Result<Vec<JobInfo>, GithubError> {
        let owner = self.target().0.to_string();
        let mut out = Vec::new();
        for status in ["queued", "in_progress"] {
            let runs_path = format!("/repos/{owner}/{repo}/actions/runs");
            let pages: Vec<RunsPage> = self
                .paginate("list_runs", &runs_path, &[("status", status)])
                .await?;
            for run in pages.into_iter().flat_map(|p| p.workflow_runs) {
                let jobs_path = format!("/repos/{owner}/{repo}/actions/runs/{}/jobs", run.id);
                let pages: Vec<JobsPage> = self.paginate("list_jobs", &jobs_path, &[]).await?;
                out.extend(
                    pages
                        .into_iter()
                        .flat_map(|p| p.jobs)
                        .filter(|j| j.status == "queued")
                        .map(|j| self.job_info(repo, j)),
                );
            }
        }
        out.sort_by_key(|j| j.key.job_id);
        out.dedup_by_key(|j| j.key.job_id);
        Ok(out)
    }

    /// The repos to poll: the configured ones, else every repo the credentials reach that is
    /// neither archived nor disabled.
    pub async fn repos(&self) -> Result<Vec<String>, GithubError> {
        let (owner, configured, credentials) = self.target();
        if !configured.is_empty() {
            return Ok(configured.to_vec());
        }
        let repos: Vec<Repo> = match credentials {
            Credentials::App(_) => {
                let pages: Vec<ReposPage> = self
                    .paginate("installation_repos", "/installation/repositories", &[])
                    .await?;
                pages.into_iter().flat_map(|p| p.repositories).collect()
            }
            Credentials::Token(_) => {
                let path = format!("/orgs/{owner}/repos");
                let pages: Vec<Vec<Repo>> = self.paginate("org_repos", &path, &[]).await?;
                pages.into_iter().flatten().collect()
            }
        };
        Ok(repos
            .into_iter()
            .filter(|r| !r.archived && !r.disabled)
            .map(|r| r.name)
            .collect())
    }

    /// True when `core` has so little left that a reconcile should leave the rest for later.
    fn budget_low(&self) -> bool {
        self.core_left().is_some_and(|(remaining, limit)| {
            remaining < (limit / LOW_BUDGET_SHARE).max(LOW_BUDGET_FLOOR)
        })
    }

    /// One reconcile pass over the repos, starting at `start` (where the last pass stopped).
    pub async fn reconcile(&self, start: usize) -> Result<Reconciled, GithubError> {
        let repos = self.repos().await?;
        let mut out = Reconciled::default();
        let n = repos.len();
        let first = if n == 0 { 0 } else { start % n };
        for i in 0..n {
            let at = (first + i) % n;
            if self.budget_low() {
                out.deferred = n - i;
                out.next_start = at;
                return Ok(out);
            }
            let repo = &repos[at];
            match self.list_queued_jobs(repo).await {
                Ok(jobs) => out.jobs.extend(jobs),
                Err(e) => out.failed.push((repo.clone(), e)),
            }
            out.listed += 1;
        }
        out.next_start = first;
        Ok(out)
    }
}
