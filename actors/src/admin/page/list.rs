//! `GET /jobs`: every job the scheduler knows, newest first, filtered by pool, repo, state and
//! target and searched by job or run id, from a plain GET form (no script needed).

use maud::{Markup, html};
use serde::Deserialize;

use super::render::{STATES, age, job_link, layout, state_of, workflow_branch};
use crate::scheduler::core::{JobView, StatusView};

/// The jobs a page shows at most.
const SHOWN: usize = 500;

/// The list's filters, as the query string gives them; an empty field filters nothing.
#[derive(Debug, Default, Deserialize)]
pub(super) struct Filter {
    #[serde(default)]
    pool: String,
    #[serde(default)]
    repo: String,
    #[serde(default)]
    state: String,
    #[serde(default)]
    target: String,
    /// A job id or a run id.
    #[serde(default)]
    q: String,
}

impl Filter {
    /// Whether `job` passes every filter. `targets` are (name, owner) pairs: a target filter
    /// matches either.
    fn keeps(&self, job: &JobView, targets: &[(String, String)]) -> bool {
        let given = |f: &str| !f.trim().is_empty();
        if given(&self.pool) && job.pool.as_deref() != Some(self.pool.trim()) {
            return false;
        }
        if given(&self.repo) {
            let want = self.repo.trim();
            let full = format!("{}/{}", job.key.owner, job.repo);
            if !job.repo.eq_ignore_ascii_case(want) && !full.eq_ignore_ascii_case(want) {
                return false;
            }
        }
        if given(&self.state) && state_of(&job.phase).unwrap_or("other") != self.state.trim() {
            return false;
        }
        if given(&self.target) {
            let want = self.target.trim();
            let owner = targets
                .iter()
                .find(|(name, _)| name == want)
                .map_or(want, |(_, owner)| owner.as_str());
            if !job.key.owner.eq_ignore_ascii_case(owner) {
                return false;
            }
        }
        if given(&self.q) {
            let Ok(id) = self.q.trim().parse::<u64>() else {
                return false;
            };
            if job.key.job_id != id && job.run_id != id {
                return false;
            }
        }
        true
    }
}

/// The jobs `filter` keeps, newest first.
pub(super) fn kept<'j>(
    jobs: &'j [JobView],
    filter: &Filter,
    status: &StatusView,
) -> Vec<&'j JobView> {
    let targets: Vec<(String, String)> = status
        .targets
        .iter()
        .map(|t| (t.name.clone(), t.owner.clone()))
        .collect();
    let mut kept: Vec<&JobView> = jobs
        .iter()
        .filter(|j| !j.key.is_warm() && !j.key.is_reckoned())
        .filter(|j| filter.keeps(j, &targets))
        .collect();
    kept.sort_by_key(|j| std::cmp::Reverse((j.arrived_unix, j.key.job_id)));
    kept
}

/// The page: the form, then the jobs it keeps.
pub(super) fn page(jobs: &[JobView], filter: &Filter, status: &StatusView, now: u64) -> Markup {
    let kept = kept(jobs, filter, status);
    let pools: Vec<&str> = status
        .providers
        .iter()
        .map(|p| p.provider.as_str())
        .collect();
    let body = html! {
        h1 { "Jobs" }
        form.filters method="get" action="/jobs" role="search" {
            label { "Job or run id " input name="q" type="search" inputmode="numeric" value=(filter.q); }
            label { "Repo " input name="repo" value=(filter.repo); }
            label { "Pool " select name="pool" {
                option value="" { "any" }
                @for p in &pools { option value=(p) selected[filter.pool == *p] { (p) } }
            } }
            label { "State " select name="state" {
                option value="" { "any" }
                @for (st, words) in STATES { option value=(st) title=(words) selected[filter.state == st] { (st) } }
                option value="other" selected[filter.state == "other"] { "not dispatched" }
            } }
            label { "Target " select name="target" {
                option value="" { "any" }
                @for t in &status.targets { option value=(t.name) selected[filter.target == t.name] { (t.name) " (" (t.owner) ")" } }
            } }
            button type="submit" { "Show" }
        }
        p #job-count { (kept.len()) " of " (jobs.len()) " jobs" @if kept.len() > SHOWN { "; the newest " (SHOWN) " shown" } "." }
        div.scroll { table #job-list {
            thead { tr { th scope="col" { "Job" } th scope="col" { "Repo" } th scope="col" { "Workflow, branch" } th scope="col" { "Pool" } th scope="col" { "State" } th scope="col" { "Arrived" } } }
            tbody {
                @for j in kept.iter().take(SHOWN) {
                    tr class={ "q-" (state_of(&j.phase).unwrap_or("")) } {
                        th scope="row" { (job_link(j)) }
                        td { (j.key.owner) "/" (j.repo) }
                        td { (workflow_branch(j)) }
                        td { (j.pool.as_deref().unwrap_or("-")) }
                        td { (state_of(&j.phase).unwrap_or("not dispatched")) }
                        td { @if let Some(at) = j.arrived_unix { (age(now.saturating_sub(at))) " ago" } }
                    }
                }
            }
        } }
    };
    layout("Jobs", body)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{job::JobKey, scheduler::core::Phase};

    fn job(
        owner: &str,
        id: u64,
        run: u64,
        repo: &str,
        pool: Option<&str>,
        phase: Phase,
    ) -> JobView {
        JobView {
            key: JobKey::new(owner, id),
            repo: repo.into(),
            labels: vec![],
            phase,
            pending: false,
            seen: false,
            started: false,
            admissions: 1,
            idle_reaps: 0,
            retry_attempts: 0,
            error_class: None,
            next_attempt_unix: None,
            runner_name: None,
            run_id: run,
            arrived_unix: Some(id),
            run_attempt: 1,
            pool: pool.map(Into::into),
            about: None,
            timeline: vec![],
        }
    }

    fn filter(q: &str) -> Filter {
        serde_urlencoded::from_str(q).unwrap()
    }

    #[test]
    fn each_filter_keeps_only_its_jobs_and_the_search_takes_a_job_or_a_run_id() {
        let jobs = [
            job("acme", 1, 10, "app", Some("linux"), Phase::Done),
            job("acme", 2, 10, "web", Some("mac"), Phase::Pending),
            job("other", 3, 30, "app", None, Phase::Unroutable),
        ];
        let targets = vec![("main".to_string(), "acme".to_string())];
        let ids = |f: &Filter| -> Vec<u64> {
            jobs.iter()
                .filter(|j| f.keeps(j, &targets))
                .map(|j| j.key.job_id)
                .collect()
        };
        assert_eq!(ids(&filter("")), [1, 2, 3]);
        assert_eq!(ids(&filter("pool=linux")), [1]);
        assert_eq!(ids(&filter("repo=app")), [1, 3]);
        assert_eq!(ids(&filter("repo=acme%2Fapp")), [1]);
        assert_eq!(ids(&filter("state=done")), [1]);
        assert_eq!(ids(&filter("state=other")), [3]);
        assert_eq!(ids(&filter("target=main")), [1, 2]);
        assert_eq!(ids(&filter("target=other")), [3]);
        assert_eq!(ids(&filter("q=10")), [1, 2]);
        assert_eq!(ids(&filter("q=3")), [3]);
        assert_eq!(ids(&filter("q=x")), Vec::<u64>::new());
        assert_eq!(ids(&filter("q=10&pool=mac&state=pending")), [2]);
    }
}
