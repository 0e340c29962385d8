//! Pools that cannot run a job on this host: found by the start-up host check, reported down
//! with the cause in `status` and the log, and never claimed for.

use std::time::Duration;

use github_standin::{Standin, StandinConfig};

use crate::support::{
    daemon::{Daemon, linux_provider},
    engine::StubEngine,
    provision::eventually_async,
};

/// Podman without catatonit answers every create with "container-init binary not found": the
/// pool is down with that cause (and the package to install) before any job is claimed, and a
/// queued job for it waits instead of being claimed and failed one by one.
#[actix_rt::test]
async fn a_container_pool_whose_engine_lacks_the_init_is_down_and_claims_nothing() {
    let engine = StubEngine::start_without_init();
    let standin = Standin::start(StandinConfig::default()).unwrap();
    let providers = linux_provider(&engine.socket, "localhost/runner:test", 2, "");
    let daemon = Daemon::start(&standin, "", &providers).await;

    let pool_down = || async {
        let v = daemon.ctl_json(&["status"]).await;
        let linux = v["providers"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["provider"] == "linux")
            .cloned()
            .unwrap();
        linux["up"] == false
            && linux["down_cause"].as_str().is_some_and(|c| {
                c.contains("container-init binary not found") && c.contains("install catatonit")
            })
    };
    eventually_async(
        "the linux pool reported down with the cause",
        Duration::from_secs(20),
        pool_down,
    )
    .await;
    let (code, _, err) = daemon.ctl(&["status"]).await;
    assert_eq!(code, 1, "a pool down is status exit 1, for scripts");
    assert!(err.contains("pools down: linux"), "{err}");

    let job = standin.queue_jobs("app", &["self-hosted", "linux"], 1)[0];
    let job_waits = || async {
        let v = daemon.ctl_json(&["jobs"]).await;
        v["jobs"]
            .as_array()
            .unwrap()
            .iter()
            .any(|j| j["key"]["job_id"] == job && j["phase"]["state"] == "pending")
    };
    eventually_async(
        "the job to wait as pending",
        Duration::from_secs(20),
        job_waits,
    )
    .await;

    assert_eq!(
        standin.count("generate_jitconfig"),
        0,
        "no runner registered for a down pool"
    );
    assert_eq!(
        engine.count("/containers/create"),
        1,
        "one probe, no per-job create"
    );
    let logs = daemon.logs();
    assert!(
        logs.contains("host check failed") && logs.contains("catatonit"),
        "the log names the cause:\n{logs}"
    );
    let (_, table, _) = daemon.ctl(&["status"]).await;
    assert!(
        table.contains("down: ") && table.contains("catatonit"),
        "{table}"
    );
    assert_eq!(daemon.stop(Duration::from_secs(30)).await.0, Some(0));
}

/// A local pool whose runner command does not exist is down with that cause: no job is claimed
/// for it and no claim is spent retrying it.
#[actix_rt::test]
async fn a_local_pool_whose_command_is_missing_is_down_and_claims_nothing() {
    let standin = Standin::start(StandinConfig::default()).unwrap();
    let providers = r#"
[providers.local]
command = "/nonexistent/actions-runner/run.sh"
allow_root = true
labels = ["self-hosted", "linux", "x64"]
max_concurrent = 2
"#;
    let daemon = Daemon::start(&standin, "", providers).await;
    let pool_down = || async {
        let v = daemon.ctl_json(&["status"]).await;
        let local = v["providers"][0].clone();
        local["provisioner"] == "LocalProvisioner"
            && local["up"] == false
            && local["down_cause"]
                .as_str()
                .is_some_and(|c| c.contains("/nonexistent/actions-runner/run.sh"))
    };
    eventually_async(
        "the local pool reported down",
        Duration::from_secs(20),
        pool_down,
    )
    .await;
    standin.queue_jobs("app", &["self-hosted", "linux"], 2);
    let waiting = || async {
        let v = daemon.ctl_json(&["jobs"]).await;
        let jobs = v["jobs"].as_array().unwrap().clone();
        jobs.len() == 2 && jobs.iter().all(|j| j["phase"]["state"] == "pending")
    };
    eventually_async("both jobs to wait", Duration::from_secs(20), waiting).await;
    assert_eq!(standin.count("generate_jitconfig"), 0);
    assert_eq!(daemon.stop(Duration::from_secs(30)).await.0, Some(0));
}

/// A pool that is up but whose every environment fails to start (the image's command is
/// missing): the job's claims follow the ladder with one item and stop at `max_age`; each
/// attempt's registration is deleted, and the pool shows the failures.
#[actix_rt::test]
async fn a_pool_whose_environments_always_fail_stops_claiming_at_max_age() {
    let engine = StubEngine::start_failing_starts();
    let standin = Standin::start(StandinConfig::default()).unwrap();
    let ladder = "[runner.claim_retry]\nschedule = [\"1s\", \"2s\", \"4s\"]\njitter = 0.0\nmax_age = \"6s\"\n";
    let providers = linux_provider(&engine.socket, "localhost/runner:test", 2, "");
    let daemon = Daemon::start(&standin, ladder, &providers).await;
    wait_pool_up(&daemon).await;
    standin.queue_jobs("app", &["self-hosted", "linux"], 1);
    let given_up = || async {
        daemon
            .metrics()
            .await
            .contains("ephemerd_claim_retry_given_up_total 1")
    };
    eventually_async("the job given up", Duration::from_secs(30), given_up).await;
    let claims = few_claims_then_quiet(&standin, &daemon, 2).await;
    daemon.wait_no_runner_left(&standin).await;
    let v = daemon.ctl_json(&["status"]).await;
    let linux = &v["providers"][0];
    assert_eq!(linux["up"], true, "{v}");
    assert_eq!(linux["environment_failures"], claims as u64, "{v}");
    assert!(
        linux["last_environment_failure"]
            .as_str()
            .is_some_and(|e| e.contains("not found")),
        "{v}"
    );
    let metrics = daemon.metrics().await;
    assert!(
        metrics.contains(&format!(
            "ephemerd_environment_failures_total{{provider=\"linux\"}} {claims}"
        )),
        "{metrics}"
    );
    assert_eq!(daemon.stop(Duration::from_secs(30)).await.0, Some(0));
}

/// A local runner whose executable is removed after start-up: the first claim's environment
/// cannot start, the pool goes down with the cause, and nothing loops: a handful of claims at
/// most, each registration deleted, then quiet.
#[actix_rt::test]
async fn a_runner_executable_removed_after_start_up_costs_a_few_claims_then_nothing() {
    let standin = Standin::start(StandinConfig::default()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let runner = crate::support::write_file(dir.path(), "run.sh", "#!/bin/sh\nexit 0\n");
    std::fs::set_permissions(&runner, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let ladder = "[runner.claim_retry]\nschedule = [\"1s\", \"2s\", \"4s\"]\nmax_age = \"6s\"\n";
    let providers = format!(
        "[providers.local]\ncommand = \"{}\"\nallow_root = true\nlabels = [\"self-hosted\", \"linux\"]\n",
        runner.display()
    );
    let daemon = Daemon::start(&standin, ladder, &providers).await;
    wait_pool_up(&daemon).await;
    std::fs::remove_file(&runner).unwrap();
    standin.queue_jobs("app", &["self-hosted", "linux"], 1);
    let claims = few_claims_then_quiet(&standin, &daemon, 1).await;
    // Seen once in a fresh-machine CI run (more than 4 claims), not reproduced in 4 local
    // runs: say what the daemon saw, so the next failure explains itself.
    if claims > 4 {
        let status = daemon.ctl_json(&["status"]).await;
        let jobs = daemon.ctl_json(&["jobs"]).await;
        panic!("the pool went down after its first failure: {claims} claims; {status}; {jobs}");
    }
    daemon.wait_no_runner_left(&standin).await;
    assert_eq!(daemon.stop(Duration::from_secs(30)).await.0, Some(0));
}

/// Waits until the claims stop, then checks there were between `min` and 6 of them and that no
/// more come: the job's attempts ended.
async fn few_claims_then_quiet(standin: &Standin, daemon: &Daemon, min: usize) -> usize {
    let settled = || async {
        let before = standin.count("generate_jitconfig");
        tokio::time::sleep(Duration::from_secs(5)).await;
        before > 0 && standin.count("generate_jitconfig") == before
    };
    eventually_async("the claims to stop", Duration::from_secs(40), settled).await;
    let claims = standin.count("generate_jitconfig");
    assert!(
        (min..=6).contains(&claims),
        "{claims} claims:\n{}",
        daemon.logs()
    );
    claims
}

async fn wait_pool_up(daemon: &Daemon) {
    let up = || async { daemon.ctl_json(&["status"]).await["providers"][0]["up"] == true };
    eventually_async("the pool up", Duration::from_secs(20), up).await;
}
