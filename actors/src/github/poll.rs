//! Pull mode's listing: what changed in each repo's workflow jobs since the last pass, found
//! with conditional requests.
//!
//! Per repo, a pass asks for the queued and the in-progress runs, then for the jobs of every
//! run listed and of every run that still had a job not finished (a run that just completed
//! leaves both lists; its jobs' last state is read once more). Every request carries the last
//! `ETag` in `If-None-Match`: an unchanged listing is a 304, which "does not count against your
//! primary rate limit" (docs.github.com, "Best practices for using the REST API": use
//! conditional requests). An idle repo costs two free 304s a pass.

use std::collections::{BTreeSet, HashMap};

use super::{
    GithubClient, GithubError,
    reconcile::{JobsPage, RunsPage},
};
use crate::job::{JobAction, JobInfo};

/// The repo list is asked for again after this long.
const REPOS_REFRESH: std::time::Duration = std::time::Duration::from_secs(10 * 60);

/// What the polls know between passes: each job's last status, and the repo list.
#[derive(Debug, Default, Clone)]
pub struct PollMemory {
    /// Job id -> (repo, run id, last status seen).
    jobs: HashMap<u64, (String, u64, String)>,
    repos: Vec<String>,
    repos_at: Option<tokio::time::Instant>,
}

impl PollMemory {
    /// Jobs known queued or running.
    pub fn open_jobs(&self) -> usize {
        self.jobs
            .values()
            .filter(|(_, _, s)| s != "completed")
            .count()
    }

    /// Forgets what was seen of a job, so the next pass reports it again (its event was not
    /// taken).
    pub fn forget(&mut self, job_id: u64) {
        self.jobs.remove(&job_id);
    }
}

/// What one pass found and cost.
#[derive(Debug, Default)]
pub struct PollOutcome {
    /// Jobs whose status changed (or that were seen for the first time), oldest id first.
    pub events: Vec<(JobAction, JobInfo)>,
    /// Requests answered with a body (counted against `core`).
    pub spent: u32,
    /// Requests answered 304 (free).
    pub free: u32,
    /// Repos whose listing failed this pass (tried again next pass).
    pub failed: Vec<(String, GithubError)>,
}

impl GithubClient {
    /// One pull pass over every repo, against and updating `memory`.
    pub async fn poll_pass(&self, memory: &mut PollMemory) -> Result<PollOutcome, GithubError> {
        let stale = memory
            .repos_at
            .is_none_or(|at| at.elapsed() >= REPOS_REFRESH);
        if stale {
            memory.repos = self.repos().await?;
            memory.repos_at = Some(tokio::time::Instant::now());
        }
        let mut out = PollOutcome::default();
        for repo in memory.repos.clone() {
            if let Err(e) = self.poll_repo(&repo, memory, &mut out).await {
                out.failed.push((repo, e));
            }
        }
        out.events.sort_by_key(|(_, j)| j.key.job_id);
        Ok(out)
    }

    async fn poll_repo(
        &self,
        repo: &str,
        memory: &mut PollMemory,
        out: &mut PollOutcome,
    ) -> Result<(), GithubError> {
        let owner = self.owner().to_string();
        let runs_path = format!("/repos/{owner}/{repo}/actions/runs");
        let mut runs = BTreeSet::new();
        for status in ["queued", "in_progress"] {
            let (pages, spent, free) = self
                .paginate_counted::<RunsPage>("list_runs", &runs_path, &[("status", status)])
                .await?;
            out.spent += spent;
            out.free += free;
            runs.extend(
                pages
                    .into_iter()
                    .flat_map(|p| p.workflow_runs)
                    .map(|r| r.id),
            );
        }
        // Runs that left both lists with a job not seen finished: read their jobs once more.
        runs.extend(
            memory
                .jobs
                .values()
                .filter(|(r, _, status)| r == repo && status != "completed")
                .map(|(_, run, _)| *run),
        );
        for run in &runs {
            let jobs_path = format!("/repos/{owner}/{repo}/actions/runs/{run}/jobs");
            let (pages, spent, free) = self
                .paginate_counted::<JobsPage>("list_jobs", &jobs_path, &[])
                .await?;
            out.spent += spent;
            out.free += free;
            for job in pages.into_iter().flat_map(|p| p.jobs) {
                let status = job.status.clone();
                let known = memory.jobs.get(&job.id).map(|(_, _, s)| s.as_str());
                if known == Some(status.as_str()) {
                    continue;
                }
                let Some(action) = JobAction::parse(&status) else {
                    continue;
                };
                memory
                    .jobs
                    .insert(job.id, (repo.to_string(), job.run_id, status));
                out.events.push((action, self.job_info(repo, job)));
            }
        }
        // Finished jobs of runs no longer listed are forgotten.
        memory
            .jobs
            .retain(|_, (r, run, status)| r != repo || status != "completed" || runs.contains(run));
        Ok(())
    }
}
