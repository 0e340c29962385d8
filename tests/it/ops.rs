//! Operating a running daemon: the admin API through the CLI (`status`, `jobs`, `jobs <id>`,
//! `cordon`, `uncordon`), `/metrics` after a run, and the process the supervisor sees.

use std::time::Duration;

use github_standin::{Standin, StandinConfig};

use crate::support::{
    daemon::{Daemon, local_provider},
    provision::eventually,
};

async fn ctl(d: &Daemon, args: &[&str]) -> (i32, String, String) {
    d.ctl(args).await
}

/// `jobs <id>` on a job that was retried twice shows both failures, their classes and the
/// times chosen.
#[actix_rt::test]
async fn the_timeline_of_a_job_retried_twice() {
    let standin = crate::support::standin(100);
    let ladder = "[runner.claim_retry]\nschedule = [\"1s\", \"2s\"]\njitter = 0.0\n";
    let daemon = Daemon::start(&standin, ladder, &local_provider(2)).await;
    standin.fail_status("generate_jitconfig", 502, 2);
    let job = standin.queue_jobs("app", &["self-hosted", "linux"], 1)[0];
    eventually("the job to complete", Duration::from_secs(30), || {
        standin.jobs_in("completed") == 1
    })
    .await;

    let (code, out, err) = ctl(&daemon, &["jobs", &job.to_string()]).await;
    assert_eq!(code, 0, "{err}");
    let failures = out
        .lines()
        .filter(|l| l.contains("claim failed (server_side)"))
        .count();
    assert_eq!(failures, 2, "{out}");
    assert!(
        out.contains("retry #1 scheduled for")
            && out.contains("(in 1.0s; ladder rung 1; server_side)"),
        "{out}"
    );
    assert!(
        out.contains("retry #2 scheduled for")
            && out.contains("(in 2.0s; ladder rung 2; server_side)"),
        "{out}"
    );
    assert!(out.contains("claimed runner"), "{out}");
    assert!(out.contains("completed (success)"), "{out}");

    let (code, json, _) = ctl(&daemon, &["jobs", &job.to_string(), "--json"]).await;
    assert_eq!(code, 0);
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(v["job"]["retry_attempts"], 2);
    assert_eq!(v["job"]["error_class"], "server_side");

    let (code, out, _) = ctl(&daemon, &["jobs"]).await;
    assert_eq!(code, 0);
    assert!(out.contains(&job.to_string()), "{out}");
    // A job's URL, as GitHub's UI shows it, names the job too.
    let url = format!("https://github.com/acme/app/actions/runs/1000/job/{job}?pr=3");
    let (code, by_url, err) = ctl(&daemon, &["jobs", &url, "--json"]).await;
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&by_url).unwrap()["job"]["retry_attempts"],
        2
    );
    // Filters: the job is done, in app.
    let listed = |out: &str| out.contains(&job.to_string());
    let (_, out, _) = ctl(&daemon, &["jobs", "--repo", "app"]).await;
    assert!(listed(&out), "{out}");
    let (_, out, _) = ctl(&daemon, &["jobs", "--repo", "other"]).await;
    assert!(!listed(&out), "{out}");
    let (_, out, _) = ctl(&daemon, &["jobs", "--state", "retrying"]).await;
    assert!(!listed(&out), "{out}");
    let (code, _, err) = ctl(&daemon, &["jobs", "https://github.com/acme/app/pulls"]).await;
    assert_eq!(code, 2, "not a job: a usage error");
    assert!(err.contains("job's URL"), "{err}");
    let (code, out, _) = ctl(&daemon, &["jobs", "424242"]).await;
    assert_ne!(code, 0, "{out}");
    assert_eq!(daemon.stop(Duration::from_secs(30)).await.0, Some(0));
}

#[actix_rt::test]
async fn status_and_cordon_through_the_cli() {
    let standin = Standin::start(StandinConfig::default()).unwrap();
    let daemon = Daemon::start(&standin, "", &local_provider(2)).await;
    let (code, out, err) = ctl(&daemon, &["status"]).await;
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("cordoned: no") && out.contains("local"),
        "{out}"
    );
    assert_eq!(ctl(&daemon, &["cordon"]).await.0, 0);
    let (code, json, err) = ctl(&daemon, &["status", "--json"]).await;
    assert_eq!(
        code, 0,
        "cordoned is an operator's choice, not a fault: {err}"
    );
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(v["draining"], true);
    assert_eq!(v["shutting_down"], false);
    // Cordoned: a queued job is not claimed.
    standin.queue_jobs("app", &["self-hosted", "linux"], 1);
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert_eq!(standin.count("generate_jitconfig"), 0);
    assert!(daemon.metrics().await.contains("ephemerd_draining 1"));
    assert_eq!(ctl(&daemon, &["uncordon"]).await.0, 0);
    let (_, json, _) = ctl(&daemon, &["status", "--json"]).await;
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&json).unwrap()["draining"],
        false
    );
    assert_eq!(daemon.stop(Duration::from_secs(30)).await.0, Some(0));
}

/// The global `--config` goes before the command too; `drain --wait` cordons and returns once
/// the last running job has finished; with no config named and no default file, a control
/// command falls back to the default admin address, and an unreadable named one exits 2.
#[actix_rt::test]
async fn drain_wait_returns_when_the_last_job_finishes() {
    let standin = crate::support::standin(3_000);
    let daemon = Daemon::start(&standin, "", &local_provider(2)).await;
    let config = daemon.config.display().to_string();
    let mut cmd = crate::support::daemon();
    cmd.args(["-c", &config, "status"]);
    let (code, out, err) = crate::support::output(cmd).await;
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("POOL"), "{out}");

    standin.queue_jobs("app", &["self-hosted", "linux"], 2);
    eventually("both jobs running", Duration::from_secs(20), || {
        standin.jobs_in("in_progress") == 2
    })
    .await;
    let mut cmd = crate::support::daemon();
    cmd.args(["-c", &config, "drain", "--wait"]);
    let (code, out, err) = crate::support::output(cmd).await;
    assert_eq!(code, 0, "{out}{err}");
    assert_eq!(
        standin.jobs_in("completed"),
        2,
        "drain --wait returned before the jobs finished: {out}"
    );
    assert!(out.contains("drained"), "{out}");
    // Cordoned: a new job waits.
    standin.queue_jobs("app", &["self-hosted", "linux"], 1);
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert_eq!(standin.count("generate_jitconfig"), 2);

    let mut cmd = crate::support::daemon();
    cmd.args(["status", "-c", "/nonexistent/config.toml"]);
    assert_eq!(
        crate::support::output(cmd).await.0,
        2,
        "an unreadable config is exit 2"
    );
    assert_eq!(daemon.stop(Duration::from_secs(30)).await.0, Some(0));
}

/// Every scheduler line about a job sits in that job's span: its id, repo and pool, so
/// `grep job_id=N` finds them all.
#[actix_rt::test]
async fn a_jobs_log_lines_carry_its_span() {
    let standin = crate::support::standin(100);
    let daemon = Daemon::start(&standin, "", &local_provider(2)).await;
    let job = standin.queue_jobs("app", &["self-hosted", "linux"], 1)[0];
    daemon
        .wait_completed(&standin, 1, Duration::from_secs(30))
        .await;
    let logs = daemon.logs();
    let span = format!("job{{job_id={job} repo=app pool=local}}");
    for what in ["claiming a runner", "runner claimed; provisioning"] {
        assert!(
            logs.lines().any(|l| l.contains(&span) && l.contains(what)),
            "no {what:?} line in {span}:\n{logs}"
        );
    }
    assert_eq!(daemon.stop(Duration::from_secs(30)).await.0, Some(0));
}

/// The daemon starts itself again once with mimalloc's memory options (src/alloc.rs): the
/// process the supervisor started keeps its pid and name, has the options, and runs jobs.
#[actix_rt::test]
async fn the_daemon_runs_with_its_allocator_options_under_its_own_name_and_pid() {
    let standin = crate::support::standin(100);
    let daemon = Daemon::start(&standin, "", &local_provider(1)).await;
    let pid = daemon.pid();
    let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap();
    assert_eq!(comm.trim(), "ephemer-actors");
    let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap();
    let environ = String::from_utf8_lossy(&environ);
    for option in ["MIMALLOC_ARENA_EAGER_COMMIT=0", "MIMALLOC_PURGE_DELAY=0"] {
        assert!(
            environ.split('\0').any(|kv| kv == option),
            "{option} is not in the daemon's environment"
        );
    }
    standin.queue_jobs("app", &["self-hosted", "linux"], 1);
    daemon
        .wait_completed(&standin, 1, Duration::from_secs(30))
        .await;
    assert_eq!(daemon.pid(), pid);
    assert_eq!(daemon.stop(Duration::from_secs(30)).await.0, Some(0));
}

/// After a run, `/metrics` holds every metric of the contract with sane values.
#[actix_rt::test]
async fn every_contract_metric_after_a_run() {
    let standin = crate::support::standin(100);
    let daemon = Daemon::start(&standin, "", &local_provider(4)).await;
    standin.fail_status("generate_jitconfig", 502, 1);
    standin.queue_jobs("app", &["self-hosted", "linux"], 6);
    eventually("six jobs to complete", Duration::from_secs(40), || {
        standin.jobs_in("completed") == 6
    })
    .await;
    eventually("runners gone", Duration::from_secs(20), || {
        standin.runners().is_empty()
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let m = daemon.metrics().await;
    let value = |series: &str| -> f64 {
        m.lines()
            .find(|l| l.starts_with(series) && l[series.len()..].starts_with(' '))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("{series} missing in\n{m}"))
    };
    for name in ephemer_actors_core::metrics::CONTRACT_METRICS {
        assert!(m.contains(&format!("# TYPE {name} ")), "{name} missing");
    }
    // The claims spend actions_runner_registration, the start-up listing core: each bucket
    // has its reading, under its resource label.
    for bucket in ["actions_runner_registration", "core"] {
        let series = |name: &str| format!("{name}{{resource=\"{bucket}\"}}");
        assert_eq!(value(&series("ephemerd_github_api_rate_limit")), 5000.0);
        assert!(value(&series("ephemerd_github_api_rate_remaining")) > 4900.0);
        assert!(value(&series("ephemerd_github_api_rate_updated_seconds")) > 1.7e9);
        assert!(
            value(&series("ephemerd_github_api_rate_reset_seconds"))
                > value(&series("ephemerd_github_api_rate_updated_seconds"))
        );
    }
    // One claim per job, and at most a few more when runners swap jobs under load (a job whose
    // runner ran a sibling is dispatched again; the spare is then reaped).
    let claims =
        value("ephemerd_github_api_requests_total{code=\"201\",endpoint=\"generate_jitconfig\"}");
    assert!((6.0..=9.0).contains(&claims), "{claims}");
    assert_eq!(
        value("ephemerd_github_api_requests_total{code=\"502\",endpoint=\"generate_jitconfig\"}"),
        1.0
    );
    assert_eq!(
        value("ephemerd_github_webhook_events_total{action=\"queued\"}"),
        6.0
    );
    assert_eq!(
        value("ephemerd_github_webhook_events_total{action=\"completed\"}"),
        6.0
    );
    assert_eq!(
        value("ephemerd_github_jit_registration_errors_total{class=\"server_side\"}"),
        1.0
    );
    assert_eq!(
        value("ephemerd_claim_retry_attempts_total{class=\"server_side\"}"),
        1.0
    );
    assert_eq!(
        value("ephemerd_jobs_total{conclusion=\"success\",provider=\"local\"}"),
        6.0
    );
    assert_eq!(value("ephemerd_jobs_active{provider=\"local\"}"), 0.0);
    // Every job's runner started; a claim that raced its job starting elsewhere is deleted
    // without starting an environment.
    for started in [
        "ephemerd_job_queue_wait_seconds_count",
        "ephemerd_job_startup_seconds_count",
    ] {
        let n = value(started);
        assert!(
            (6.0..=claims).contains(&n),
            "{started} {n} (claims {claims})"
        );
    }
    assert_eq!(value("ephemerd_job_duration_seconds_count"), 6.0);
    assert_eq!(value("ephemerd_claim_retry_queue_depth"), 0.0);
    assert_eq!(value("ephemerd_concurrent_capacity"), 4.0);
    assert_eq!(value("ephemerd_draining"), 0.0);
    assert!(value("ephemerd_uptime_seconds") >= 0.0);
    assert_eq!(daemon.stop(Duration::from_secs(30)).await.0, Some(0));
}
