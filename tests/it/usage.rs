//! `ephemer-actors usage`: what the jobs a daemon ran used of its runners, per repo and per
//! pool, from its durable records: the known jobs give their known minutes, the same on the
//! page, and after a restart.

use std::time::Duration;

use crate::support::{
    self,
    daemon::{Daemon, local_provider},
};

const LABELS: &[&str] = &["self-hosted", "linux"];

/// A job's runner-minutes as its timeline says them: from its runner's claim to the sight of
/// its completion.
async fn minutes_of(admin: &str, job: u64) -> f64 {
    let (_, body) = support::http_get(admin, &format!("/api/v1/jobs/{job}"))
        .await
        .unwrap();
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    let at = |starts: &str| {
        v["job"]["timeline"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["text"].as_str().unwrap().starts_with(starts))
            .and_then(|e| e["at_ms"].as_u64())
            .unwrap_or_else(|| panic!("no {starts:?} in {v}"))
    };
    (at("completed on") - at("claimed runner")) as f64 / 60_000.0
}

#[actix_rt::test]
async fn usage_gives_each_repo_and_pool_its_jobs_minutes_and_keeps_them_over_a_restart() {
    let standin = support::standin(100);
    standin.add_repos(&["web"]);
    let daemon = Daemon::start_with_github(
        &standin,
        "repos = [\"app\", \"web\"]",
        "",
        &local_provider(1),
    )
    .await;
    // One job at a time: each runner takes the job it was claimed for (with two queued, a
    // runner may take the other: runners are fungible), so each job's own notes say its
    // minutes.
    let mut ids = Vec::new();
    for (n, repo) in ["app", "app", "web"].into_iter().enumerate() {
        ids.push(standin.queue_jobs(repo, LABELS, 1)[0]);
        daemon
            .wait_completed(&standin, n + 1, Duration::from_secs(30))
            .await;
    }
    let (app, web) = (&ids[..2], &ids[2..]);
    let admin = daemon.admin_addr();
    let mut want_app = 0.0;
    for job in app {
        want_app += minutes_of(&admin, *job).await;
    }
    let want_web = minutes_of(&admin, web[0]).await;

    let by = |out: &str| -> serde_json::Value { serde_json::from_str(out).unwrap() };
    let (code, out, err) = daemon.ctl(&["usage", "--by", "repo", "--json"]).await;
    assert_eq!(code, 0, "{err}");
    let lines = by(&out)["lines"].clone();
    let line = |key: &str| {
        lines
            .as_array()
            .unwrap()
            .iter()
            .find(|l| l["key"] == key)
            .unwrap_or_else(|| panic!("no {key} in {lines}"))
            .clone()
    };
    assert_eq!(line("acme/app")["jobs"], 2);
    assert_eq!(line("acme/web")["jobs"], 1);
    let close = |got: &serde_json::Value, want: f64| (got.as_f64().unwrap() - want).abs() < 1e-9;
    assert!(
        close(&line("acme/app")["runner_minutes"], want_app),
        "{lines} vs {want_app}"
    );
    assert!(
        close(&line("acme/web")["runner_minutes"], want_web),
        "{lines} vs {want_web}"
    );

    let (code, csv, _) = daemon.ctl(&["usage", "--by", "pool", "--csv"]).await;
    assert_eq!(code, 0);
    let mut rows = csv.lines();
    assert_eq!(
        rows.next(),
        Some("pool,jobs,runner_minutes,retries,pickup_p50_ms,pickup_p90_ms")
    );
    assert!(rows.next().unwrap().starts_with("local,3,"), "{csv}");
    let (code, _, err) = daemon.ctl(&["usage", "--by", "team"]).await;
    assert_eq!(code, 2, "{err}");

    let (_, page) = support::http_get(&admin, "/usage?since=1d&by=repo")
        .await
        .unwrap();
    assert!(page.contains("<th scope=\"row\">acme/app</th>"), "{page}");

    // The rows are the store's: a restart keeps them.
    let (left, code, _) = daemon.stop_keeping(Duration::from_secs(30)).await;
    assert_eq!(code, Some(0));
    let daemon = Daemon::resume(&standin, left).await;
    let (code, out, err) = daemon.ctl(&["usage", "--by", "repo", "--json"]).await;
    assert_eq!(code, 0, "{err}");
    let jobs: u64 = by(&out)["lines"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["jobs"].as_u64().unwrap())
        .sum();
    assert_eq!(jobs, 3, "{out}");
    assert_eq!(daemon.stop(Duration::from_secs(30)).await.0, Some(0));
}
