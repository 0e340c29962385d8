//! The runner stays current: a pool without `runner_dir` or `command` runs a release the daemon
//! downloads, verifies and switches to by itself, without dropping a job. The stand-in GitHub
//! serves the releases API and the archives; its runner tells a runner behind the latest
//! release to update itself, as GitHub does, unless its settings turn that off.

use std::{path::Path, time::Duration};

use crate::support::{self, daemon::Daemon, provision::eventually};

const BIN: &str = env!("CARGO_BIN_EXE_ephemer-actors");

fn archive(version: &str) -> Vec<u8> {
    standin_runner::release_archive(version, Path::new(BIN), &["standin-runner"]).unwrap()
}

/// Waits until the stand-in's job `job` completed.
async fn job_completed(standin: &github_standin::Standin, job: u64) {
    eventually("the job to complete", Duration::from_secs(90), || {
        standin
            .jobs()
            .iter()
            .any(|j| j.id == job && j.status == "completed")
    })
    .await;
}

/// The log of the runner that ran `job` (the stand-in records which runner took it).
fn runner_log(daemon: &Daemon, standin: &github_standin::Standin, job: u64) -> String {
    let runner = standin
        .jobs()
        .into_iter()
        .find(|j| j.id == job)
        .and_then(|j| j.runner_name)
        .unwrap_or_else(|| panic!("no runner took job {job}"));
    std::fs::read_to_string(
        daemon
            .state_dir()
            .join("logs")
            .join(format!("{runner}.log")),
    )
    .unwrap_or_default()
}

/// Each `(series, value)` of `metrics` ends with its value.
fn assert_series(metrics: &str, want: &[(&str, &str)]) {
    for (series, value) in want {
        let line = metrics
            .lines()
            .find(|l| l.starts_with(series))
            .unwrap_or_else(|| panic!("no {series}:\n{metrics}"));
        assert!(line.ends_with(value), "{line}");
    }
}

async fn wait_done(standin: &github_standin::Standin, job: u64, daemon: &Daemon) {
    eventually("the job to complete", Duration::from_secs(60), || {
        standin
            .jobs()
            .iter()
            .any(|j| j.id == job && j.status == "completed")
    })
    .await;
    let _ = daemon;
}

/// Release N installed at start; N+1 with an archive that does not match its digest is refused
/// (metric, log, `status`) and the pool stays on N; a job then runs on N and its runner does not
/// update itself, while a runner of an operator's install would. N+2, published while a job
/// runs: installed within one check; the running job finishes on N, the next runs on N+2, and N
/// is removed. With the releases out of reach, jobs keep running and `doctor` warns.
#[actix_rt::test]
async fn a_managed_pool_follows_the_releases_without_dropping_a_job() {
    let standin = support::standin(300);
    standin.publish_release("2.330.0", archive("2.330.0"));
    let operator = tempfile::tempdir().unwrap();
    standin_runner::write_install_version(
        operator.path(),
        Path::new(BIN),
        &["standin-runner"],
        "2.330.0",
    )
    .unwrap();
    let providers = format!(
        r#"
[providers.local]
labels = ["self-hosted", "linux", "x64"]
max_concurrent = 1
allow_root = true

[providers.operator]
kind = "local"
runner_dir = "{}"
labels = ["self-hosted", "linux", "operator"]
max_concurrent = 1
allow_root = true
"#,
        operator.path().display()
    );
    let daemon = Daemon::start(
        &standin,
        "[runner]\nrelease_check_interval = \"1s\"\n",
        &providers,
    )
    .await;
    let runners = daemon.runner_dir().join("runners");
    eventually("release N to be installed", Duration::from_secs(30), || {
        runners.join("2.330.0/.ephemer-verified").exists()
    })
    .await;

    // N+1: its archive does not match the digest the release states.
    standin.publish_release_with_digest(
        "2.331.0",
        archive("2.331.0"),
        &format!("sha256:{}", "0".repeat(64)),
    );
    eventually("N+1 to be refused", Duration::from_secs(30), || {
        daemon.logs().contains("runner release 2.331.0 refused")
    })
    .await;
    let metrics = daemon.metrics().await;
    assert!(
        metrics.contains("ephemerd_runner_release_refused_total{reason=\"digest\"} 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains("ephemerd_runner_version_info{pool=\"local\",version=\"2.330.0\"} 1"),
        "{metrics}"
    );
    assert!(!runners.join("2.331.0").exists(), "nothing switched");
    let status = daemon.ctl_json(&["status"]).await;
    let problem = status["runner"]["problem"].as_str().unwrap_or_default();
    assert!(problem.contains("refused"), "{status:#}");

    // A job on N: the daemon told its runner not to update itself, though N+1 is out.
    let job = standin.queue_jobs("app", &["self-hosted", "linux", "x64"], 1)[0];
    wait_done(&standin, job, &daemon).await;
    let log = runner_log(&daemon, &standin, job);
    assert!(log.contains(" 2.330.0 connecting"), "{log}");
    assert!(!log.contains("self-updating"), "{log}");
    // The operator's install (not the daemon's to keep) does update itself in the job's copy:
    // the stand-in runner would, so the line above proves something.
    let job = standin.queue_jobs("app", &["self-hosted", "linux", "operator"], 1)[0];
    wait_done(&standin, job, &daemon).await;
    let log = runner_log(&daemon, &standin, job);
    assert!(
        log.contains("self-updating from 2.330.0 to 2.331.0"),
        "{log}"
    );

    // N+2 comes out while a job runs on N.
    standin.set_behavior(github_standin::RunnerBehavior {
        job_ms: 4000,
        ..Default::default()
    });
    let long = standin.queue_jobs("app", &["self-hosted", "linux", "x64"], 1)[0];
    eventually("the long job to run", Duration::from_secs(30), || {
        standin
            .jobs()
            .iter()
            .any(|j| j.id == long && j.status == "in_progress")
    })
    .await;
    standin.publish_release("2.332.0", archive("2.332.0"));
    eventually("N+2 to be installed", Duration::from_secs(10), || {
        runners.join("2.332.0/.ephemer-verified").exists()
    })
    .await;
    assert!(
        runners.join("2.330.0").exists(),
        "N is removed while a job still runs from it"
    );
    standin.set_behavior(github_standin::RunnerBehavior {
        job_ms: 300,
        ..Default::default()
    });
    wait_done(&standin, long, &daemon).await;
    assert!(runner_log(&daemon, &standin, long).contains(" 2.330.0 connecting"));
    let next = standin.queue_jobs("app", &["self-hosted", "linux", "x64"], 1)[0];
    wait_done(&standin, next, &daemon).await;
    let log = runner_log(&daemon, &standin, next);
    assert!(log.contains(" 2.332.0 connecting"), "{log}");
    assert!(!log.contains("self-updating"), "{log}");
    eventually(
        "N to be removed once unused",
        Duration::from_secs(10),
        || !runners.join("2.330.0").exists(),
    )
    .await;
    let (_, out, _) = daemon.ctl(&["status"]).await;
    assert!(out.contains("latest release 2.332.0"), "{out}");
    assert!(
        out.contains("2.332.0 (current; kept current by the daemon)")
            && out.contains("operator           2.330.0 (behind by"),
        "{out}"
    );
    let (_, _, downloads) = standin.release_requests();
    assert_eq!(
        downloads, 3,
        "each release downloaded once (N, N+1 refused, N+2)"
    );

    // github.com out of reach: jobs keep running on what is installed; doctor warns.
    standin.set_releases_unreachable(true);
    let offline = standin.queue_jobs("app", &["self-hosted", "linux", "x64"], 1)[0];
    wait_done(&standin, offline, &daemon).await;
    let (_, out, _) = daemon.ctl(&["doctor"]).await;
    assert!(
        out.contains("warn runner.release: cannot look at the runner's releases"),
        "{out}"
    );
    assert!(out.contains("pool.local.runner: runner 2.332.0"), "{out}");
    assert_eq!(daemon.stop(Duration::from_secs(30)).await.0, Some(0));
}

/// Checks cost nothing when nothing changed: every look after the first is answered 304.
#[actix_rt::test]
async fn an_unchanged_release_costs_nothing() {
    let standin = support::standin(300);
    standin.publish_release("2.330.0", archive("2.330.0"));
    let daemon = Daemon::start(
        &standin,
        "[runner]\nrelease_check_interval = \"1s\"\n",
        "[providers.local]\nallow_root = true\nmax_concurrent = 1\n",
    )
    .await;
    eventually("three looks", Duration::from_secs(30), || {
        standin.release_requests().0 >= 4
    })
    .await;
    let (asked, unchanged, downloads) = standin.release_requests();
    assert_eq!(unchanged, asked - 1, "only the first look gets a body");
    assert_eq!(downloads, 1);
    assert_eq!(daemon.stop(Duration::from_secs(30)).await.0, Some(0));
}

/// A stand-in publishing 2.330.0 and a daemon whose managed local pool installed it, with the
/// next release check an hour away.
async fn managed_on_2_330() -> (github_standin::Standin, Daemon) {
    let standin = support::standin(300);
    standin.publish_release("2.330.0", archive("2.330.0"));
    let providers = r#"
[providers.local]
labels = ["self-hosted", "linux", "x64"]
max_concurrent = 1
allow_root = true
"#;
    let daemon = Daemon::start(
        &standin,
        "[runner]\nrelease_check_interval = \"1h\"\n",
        providers,
    )
    .await;
    let runners = daemon.runner_dir().join("runners");
    eventually("release N to be installed", Duration::from_secs(30), || {
        runners.join("2.330.0/.ephemer-verified").exists()
    })
    .await;
    (standin, daemon)
}

/// GitHub refuses a runner that is too old ("Runner version vX is deprecated and cannot
/// receive messages"); told by `ACTIONS_RUNNER_RETURN_VERSION_DEPRECATED_EXIT_CODE`, which the
/// daemon sets for every runner, it exits 7. The managed pool fetches and verifies the newest
/// release at once (the next check is an hour away), the job is claimed again on it, and
/// nothing counts the refusal as a failure of the job or the pool.
#[actix_rt::test]
async fn a_runner_refused_as_too_old_updates_the_install_and_its_job_runs_on_the_new_one() {
    let (standin, daemon) = managed_on_2_330().await;
    standin.publish_release("2.331.0", archive("2.331.0"));
    standin.set_behavior(github_standin::RunnerBehavior {
        deprecated_below: Some("2.331.0".into()),
        ..Default::default()
    });
    let job = standin.queue_jobs("app", &["self-hosted", "linux", "x64"], 1)[0];
    job_completed(&standin, job).await;
    let log = runner_log(&daemon, &standin, job);
    assert!(log.contains(" 2.331.0 connecting"), "{log}");
    let logs = daemon.logs();
    assert!(
        logs.contains("GitHub refused the runner's version as too old (exit code 7): fetching the newest release now"),
        "{logs}"
    );
    let metrics = daemon.metrics().await;
    assert_series(
        &metrics,
        &[
            ("ephemerd_runner_refused_as_old_total{pool=\"local\"}", " 1"),
            (
                "ephemerd_environment_failures_total{provider=\"local\"}",
                " 0",
            ),
            ("ephemerd_claim_retry_given_up_total", " 0"),
        ],
    );
    let climbed: Vec<&str> = metrics
        .lines()
        .filter(|l| l.starts_with("ephemerd_claim_retry_attempts_total{") && !l.ends_with(" 0"))
        .collect();
    assert!(
        climbed.is_empty(),
        "nothing climbed the ladder: {climbed:?}"
    );
    assert_eq!(standin.calls_to("generate_jitconfig").len(), 2);
    assert_eq!(daemon.stop(Duration::from_secs(30)).await.0, Some(0));
}

/// GitHub refuses the newest release for a while (its 2026-08-06 outage did so to the latest
/// runner): the first refusal looks at the releases, which say nothing newer; each refusal
/// after it is said to be an outage, in the log and `status`, counted, and fetches nothing.
/// The three jobs wait for the service, one probing it at a time every 5 s at most; once the
/// service takes the runner again they run within seconds, on the same install, nothing
/// downloaded again and nothing on the claim ladder.
#[actix_rt::test]
async fn a_refusal_of_the_newest_release_is_an_outage_and_its_jobs_run_soon_after_it() {
    let (standin, daemon) = managed_on_2_330().await;
    let (looks, _, downloads) = standin.release_requests();
    standin.set_behavior(github_standin::RunnerBehavior {
        deprecated_below: Some("9.0.0".into()),
        ..Default::default()
    });
    let jobs = standin.queue_jobs("app", &["self-hosted", "linux", "x64"], 3);
    let line = "GitHub refuses runner 2.330.0, the newest release: likely an outage";
    eventually(
        "a refusal said to be an outage",
        Duration::from_secs(60),
        || daemon.logs().contains(line),
    )
    .await;
    let (code, status, _) = daemon.ctl(&["status"]).await;
    assert_eq!(code, 0);
    assert!(status.contains(&format!("  refused: {line}")), "{status}");
    // The outage goes on for a while: the jobs wait, probing.
    tokio::time::sleep(Duration::from_secs(15)).await;
    let claims_in_outage = standin.calls_to("generate_jitconfig").len();
    standin.set_behavior(github_standin::RunnerBehavior::default());
    let back = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis();
    for &job in &jobs {
        job_completed(&standin, job).await;
    }
    let first_ran = standin
        .jobs()
        .iter()
        .filter(|j| jobs.contains(&j.id))
        .filter_map(|j| j.picked_at_ms)
        .min()
        .expect("a job started");
    let ran_after = first_ran.saturating_sub(back);
    eprintln!(
        "first job ran {ran_after} ms after the service's return; {claims_in_outage} claims in the outage"
    );
    assert!(
        ran_after <= 10_000,
        "the first job ran {ran_after} ms after the service's return:\n{}",
        daemon.logs()
    );
    // Three first claims and about one probe per 5 s, not three.
    assert!(
        claims_in_outage <= 3 + 15 / 5 + 3,
        "{claims_in_outage} claims in the outage:\n{}",
        daemon.logs()
    );
    let log = runner_log(&daemon, &standin, jobs[0]);
    assert!(log.contains(" 2.330.0 connecting"), "{log}");
    let (looks_after, _, downloads_after) = standin.release_requests();
    assert_eq!(
        looks_after - looks,
        1,
        "one look for the run of refusals:\n{}",
        daemon.logs()
    );
    assert_eq!(downloads_after, downloads, "nothing downloaded again");
    let metrics = daemon.metrics().await;
    assert_series(
        &metrics,
        &[
            (
                "ephemerd_runner_refusal_outages_total{pool=\"local\"}",
                " 1",
            ),
            ("ephemerd_claim_retry_given_up_total", " 0"),
        ],
    );
    assert!(
        daemon
            .logs()
            .contains("GitHub's refusal of the pool's newest runner release is over"),
        "{}",
        daemon.logs()
    );
    assert_eq!(daemon.stop(Duration::from_secs(30)).await.0, Some(0));
}

/// An operator's install older than 2.329.0, the oldest runner GitHub registers since 2026:
/// the pool is down with that cause before any registration, and its job waits unclaimed.
#[actix_rt::test]
async fn an_install_github_would_refuse_takes_its_pool_down_before_any_registration() {
    let standin = support::standin(300);
    let operator = tempfile::tempdir().unwrap();
    standin_runner::write_install_version(
        operator.path(),
        Path::new(BIN),
        &["standin-runner"],
        "2.320.0",
    )
    .unwrap();
    let providers = format!(
        r#"
[providers.operator]
kind = "local"
runner_dir = "{}"
labels = ["self-hosted", "linux", "operator"]
max_concurrent = 1
allow_root = true
"#,
        operator.path().display()
    );
    let daemon = Daemon::start(&standin, "", &providers).await;
    crate::support::provision::eventually_async(
        "the pool down with the cause",
        Duration::from_secs(20),
        || async {
            let v = daemon.ctl_json(&["status"]).await;
            v["providers"].as_array().into_iter().flatten().any(|p| {
                p["provider"] == "operator"
                    && p["up"] == false
                    && p["down_cause"]
                        .as_str()
                        .is_some_and(|c| c.contains("runner 2.320.0 is older than 2.329.0"))
            })
        },
    )
    .await;
    standin.queue_jobs("app", &["self-hosted", "linux", "operator"], 1);
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(standin.calls_to("generate_jitconfig").len(), 0);
    assert_eq!(daemon.stop(Duration::from_secs(30)).await.0, Some(0));
}
