//! Runner usage by repo, pool or target: what `ephemer-actors usage` and the page's usage
//! table say, from the durable [`UsageRow`]s. Pure: rows in, lines out.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::durable::UsageRow;

/// The value at `q` (0..1) of `sorted`, by nearest rank; `None` when it is empty.
pub fn nearest_rank(sorted: &[u64], q: f64) -> Option<u64> {
    if sorted.is_empty() {
        return None;
    }
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    Some(sorted[rank - 1])
}

/// What the lines are per.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum UsageBy {
    /// `owner/repo`.
    #[default]
    Repo,
    /// The pool.
    Pool,
    /// The GitHub target.
    Target,
}

impl UsageBy {
    /// Parses `repo`, `pool` or `target`.
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "repo" => UsageBy::Repo,
            "pool" => UsageBy::Pool,
            "target" => UsageBy::Target,
            _ => return None,
        })
    }

    /// The word, as the CLI and the CSV header say it.
    pub fn as_str(self) -> &'static str {
        match self {
            UsageBy::Repo => "repo",
            UsageBy::Pool => "pool",
            UsageBy::Target => "target",
        }
    }
}

/// One repo's (pool's, target's) use.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct UsageLine {
    /// The repo (`owner/repo`), pool or target.
    pub key: String,
    /// Jobs that completed on a runner claimed here.
    pub jobs: u64,
    /// Their runners' minutes, from claim to completion.
    pub runner_minutes: f64,
    /// Claims that failed on their way.
    pub retries: u64,
    /// Queued to running, median, milliseconds.
    pub pickup_p50_ms: Option<u64>,
    /// The same, 90th percentile.
    pub pickup_p90_ms: Option<u64>,
}

/// The lines for `rows`, by `by`, most runner-minutes first.
pub fn summarize(rows: &[UsageRow], by: UsageBy) -> Vec<UsageLine> {
    let mut groups: BTreeMap<String, (u64, u64, u64, Vec<u64>)> = BTreeMap::new();
    for r in rows {
        let key = match by {
            UsageBy::Repo => format!("{}/{}", r.job.owner, r.repo),
            UsageBy::Pool => r.pool.clone(),
            UsageBy::Target => r.target.clone(),
        };
        let g = groups.entry(key).or_default();
        g.0 += 1;
        g.1 += r.runner_ms;
        g.2 += u64::from(r.retries);
        g.3.extend(r.pickup_ms);
    }
    let mut lines: Vec<UsageLine> = groups
        .into_iter()
        .map(|(key, (jobs, ms, retries, mut pickups))| {
            pickups.sort_unstable();
            let at = |q: f64| nearest_rank(&pickups, q);
            UsageLine {
                key,
                jobs,
                runner_minutes: ms as f64 / 60_000.0,
                retries,
                pickup_p50_ms: at(0.5),
                pickup_p90_ms: at(0.9),
            }
        })
        .collect();
    lines.sort_by(|a, b| {
        b.runner_minutes
            .total_cmp(&a.runner_minutes)
            .then_with(|| a.key.cmp(&b.key))
    });
    lines
}

/// A key as a CSV cell. A key is a repository, pool or target name from GitHub or the config:
/// one that starts like a formula (`=`, `+`, `-`, `@`, a tab or a carriage return) would be
/// run by a spreadsheet that opens the file, so it is led by `'` (OWASP's guard); one with a
/// comma, a quote or a line end is quoted.
pub fn csv_cell(key: &str) -> String {
    let guarded = if key.starts_with(['=', '+', '-', '@', '\t', '\r']) {
        format!("'{key}")
    } else {
        key.to_string()
    };
    if guarded.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", guarded.replace('"', "\"\""))
    } else {
        guarded
    }
}

/// `lines` as CSV, with a header; each key through [`csv_cell`].
pub fn csv(lines: &[UsageLine], by: UsageBy) -> String {
    let mut out = format!(
        "{},jobs,runner_minutes,retries,pickup_p50_ms,pickup_p90_ms\n",
        by.as_str()
    );
    let opt = |v: Option<u64>| v.map_or_else(String::new, |v| v.to_string());
    for l in lines {
        let key = csv_cell(&l.key);
        out += &format!(
            "{key},{},{:.2},{},{},{}\n",
            l.jobs,
            l.runner_minutes,
            l.retries,
            opt(l.pickup_p50_ms),
            opt(l.pickup_p90_ms)
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::job::JobKey;

    fn row(id: u64, repo: &str, pool: &str, minutes: u64, retries: u32, pickup: u64) -> UsageRow {
        UsageRow {
            job: JobKey::new("acme", id),
            repo: repo.into(),
            pool: pool.into(),
            target: "main".into(),
            queued_unix: 1_000,
            ended_unix: 2_000,
            runner_ms: minutes * 60_000,
            retries,
            pickup_ms: Some(pickup),
        }
    }

    #[test]
    fn known_jobs_give_known_minutes_per_repo_and_pool() {
        let rows = [
            row(1, "app", "linux", 10, 0, 100),
            row(2, "app", "mac", 5, 2, 300),
            row(3, "web", "linux", 30, 1, 200),
        ];
        let repos = summarize(&rows, UsageBy::Repo);
        assert_eq!(repos.len(), 2);
        assert_eq!((repos[0].key.as_str(), repos[0].jobs), ("acme/web", 1));
        assert_eq!(repos[0].runner_minutes, 30.0);
        assert_eq!(
            (repos[1].key.as_str(), repos[1].jobs, repos[1].retries),
            ("acme/app", 2, 2)
        );
        assert_eq!(repos[1].runner_minutes, 15.0);
        assert_eq!(
            (repos[1].pickup_p50_ms, repos[1].pickup_p90_ms),
            (Some(100), Some(300))
        );
        let pools = summarize(&rows, UsageBy::Pool);
        assert_eq!(pools[0].key, "linux");
        assert_eq!(pools[0].runner_minutes, 40.0);
        assert_eq!(pools[1].runner_minutes, 5.0);
        let targets = summarize(&rows, UsageBy::Target);
        assert_eq!((targets[0].jobs, targets[0].runner_minutes), (3, 45.0));
        assert_eq!(
            csv(&pools, UsageBy::Pool),
            "pool,jobs,runner_minutes,retries,pickup_p50_ms,pickup_p90_ms\n\
             linux,2,40.00,1,100,200\nmac,1,5.00,2,300,300\n"
        );
    }

    #[test]
    fn a_key_a_spreadsheet_would_run_is_guarded() {
        assert_eq!(csv_cell("=HYPERLINK(\"x\")"), "\"'=HYPERLINK(\"\"x\"\")\"");
        for bad in ["+1", "-2", "@SUM(A1)", "\tx", "\rx"] {
            assert!(
                csv_cell(bad).trim_start_matches('"').starts_with('\''),
                "{bad:?}"
            );
        }
        assert_eq!(csv_cell("acme/app"), "acme/app");
        assert_eq!(csv_cell("a\rb"), "\"a\rb\"");
    }

    #[test]
    fn a_key_with_a_comma_is_quoted_in_csv() {
        let mut r = row(1, "app", "a,\"b\"", 1, 0, 1);
        r.pickup_ms = None;
        let text = csv(&summarize(&[r], UsageBy::Pool), UsageBy::Pool);
        assert!(text.ends_with("\"a,\"\"b\"\"\",1,1.00,0,,\n"), "{text}");
    }
}
