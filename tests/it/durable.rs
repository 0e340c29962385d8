//! Durable state: `kill -9` loses no job and leaks no runner. The daemon is killed without a
//! chance to drain, then started again on the same state directory.

use std::time::Duration;

use crate::support::{
    daemon::{Daemon, local_provider},
    podman::{IMAGE, Podman},
    provision::{alive, eventually},
};

/// The budget is exhausted for 8 s with 5 jobs waiting for its reset (on the ladder, or held
/// by the target's paused claims); `kill -9`; start again: all 5 run after the reset, each
/// claimed once.
#[actix_rt::test]
async fn parked_retries_survive_kill_9() {
    let standin = crate::support::standin(100);
    let extra =
        "[runner.claim_retry]\nschedule = [\"30s\"]\nrate_reset_jitter = [\"1s\", \"2s\"]\n";
    let daemon = Daemon::start(&standin, extra, &local_provider(5)).await;
    let reset = standin.exhaust_for(Duration::from_secs(8));
    standin.queue_jobs("app", &["self-hosted", "linux"], 5);
    // The first refusal proves the registration budget empty, so the target's other claims
    // wait for the reset without being sent (how many went out before it came back is a race):
    // at the kill, at least one job is on the ladder and the others wait for the reset.
    eventually(
        "a refused claim, and every job delivered",
        Duration::from_secs(10),
        || {
            standin.count("generate_jitconfig") >= 1
                && standin
                    .deliveries()
                    .iter()
                    .filter(|d| d.status == 202)
                    .count()
                    >= 5
        },
    )
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let left = daemon.kill9().await;

    let daemon = Daemon::resume(&standin, left).await;
    daemon
        .wait_completed(&standin, 5, Duration::from_secs(40))
        .await;
    let ok: Vec<_> = standin
        .calls()
        .into_iter()
        .filter(|c| c.endpoint == "generate_jitconfig" && c.status == 201)
        .collect();
    assert_eq!(ok.len(), 5, "each job claimed once:\n{}", daemon.logs());
    assert!(
        ok.iter().all(|c| c.at_ms / 1000 >= u128::from(reset)),
        "claimed only after the reset"
    );
    daemon.wait_no_runner_left(&standin).await;
    assert!(
        daemon.logs().contains("state restored"),
        "{}",
        daemon.logs()
    );
    assert_eq!(daemon.stop(Duration::from_secs(30)).await.0, Some(0));
}

/// `kill -9` with 3 jobs running under the local provisioner and 2 under Podman: after the
/// restart the runners are adopted, the jobs finish, and no stray process, container or
/// registered runner remains.
#[actix_rt::test]
async fn running_runners_are_adopted_after_kill_9() {
    let Some(podman) = Podman::start().await else {
        return;
    };
    let standin = crate::support::standin(4000);
    let providers = format!(
        r#"
[providers.local]
command = "{bin}"
args = ["standin-runner"]
allow_root = true
labels = ["self-hosted", "linux", "x64", "local"]
max_concurrent = 3

[providers.linux]
socket = "{socket}"
image = "{IMAGE}"
command = ["/usr/local/bin/ephemer-actors", "standin-runner"]
network = "host"
labels = ["self-hosted", "linux", "x64", "container"]
max_concurrent = 2
"#,
        bin = env!("CARGO_BIN_EXE_ephemer-actors"),
        socket = podman.socket
    );
    let daemon = Daemon::start(&standin, "[runner]\nmax_concurrent = 5\n", &providers).await;
    standin.queue_jobs("app", &["self-hosted", "local"], 3);
    standin.queue_jobs("app", &["self-hosted", "container"], 2);
    eventually("five jobs running", Duration::from_secs(60), || {
        standin.jobs_in("in_progress") == 5
    })
    .await;
    let local_pids: Vec<i32> = standin
        .state()
        .runner_pids
        .iter()
        .filter(|(name, _)| name.contains("-local-"))
        .map(|(_, pid)| *pid as i32)
        .collect();
    assert_eq!(local_pids.len(), 3);
    let left = daemon.kill9().await;
    assert!(
        local_pids.iter().all(|p| alive(*p)),
        "runners outlive the daemon"
    );

    let daemon = Daemon::resume(&standin, left).await;
    let ours = format!("{}-linux-", daemon.prefix());
    daemon
        .wait_completed(&standin, 5, Duration::from_secs(60))
        .await;
    daemon.wait_no_runner_left(&standin).await;
    eventually("no runner process", Duration::from_secs(30), || {
        local_pids.iter().all(|p| !alive(*p))
    })
    .await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let names = podman.container_names().await;
        if !names.contains(&ours) {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "containers left: {names}\n{}",
            daemon.logs()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(
        daemon.logs().contains("adopted a runner"),
        "{}",
        daemon.logs()
    );
    assert_eq!(daemon.stop(Duration::from_secs(30)).await.0, Some(0));
}
