//! Warm pools: environments booted before their claims. A local pool's warm environment is
//! its runner's directory, prepared ahead (with `runner_dir`, the install's copy).

use std::{path::Path, time::Duration};

use crate::support::{
    daemon::{Daemon, local_provider},
    provision::eventually,
    series,
};

const LABELS: &[&str] = &["self-hosted", "linux", "x64"];

/// The warm directories in `root`.
fn warm_dirs(root: &Path) -> Vec<String> {
    std::fs::read_dir(root)
        .map(|entries| {
            entries
                .flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.contains("-warm-"))
                .collect()
        })
        .unwrap_or_default()
}

/// A daemon whose local pool keeps 2 warm of 3 slots, once both are warm: (the stand-in, the
/// daemon, its runners' work root).
async fn warm_local_pool() -> (github_standin::Standin, Daemon, std::path::PathBuf) {
    let standin = crate::support::standin(100);
    let pool = local_provider(3).replace("max_concurrent = 3", "max_concurrent = 3\nwarm = 2");
    let daemon = Daemon::start(&standin, "", &pool).await;
    let root = daemon.runner_dir();
    eventually("two warm directories", Duration::from_secs(20), || {
        warm_dirs(&root).len() == 2
    })
    .await;
    (standin, daemon, root)
}

/// A pool keeping 2 warm out of 3 slots: a burst of 6 jobs takes the warm ones (and whatever
/// the refill has ready, else boots cold), and every job runs; the pool is warm again after; a
/// warm directory removed behind the daemon's back is replaced; warm directories gone at the
/// moment of their claims fall back to new ones and lose no job; a cordon removes what is warm
/// and an uncordon brings it back; the stop leaves no warm directory behind.
#[actix_rt::test]
async fn a_warm_pool_serves_a_burst_replaces_the_dead_and_leaves_nothing_on_cordon_or_stop() {
    let (standin, daemon, root) = warm_local_pool().await;
    let metrics = daemon.metrics().await;
    assert_eq!(
        series(&metrics, "ephemerd_warm_available{pool=\"local\"}"),
        2.0
    );
    let status = daemon.ctl_json(&["status"]).await;
    assert_eq!(
        status["providers"][0]["warm"],
        serde_json::json!({ "available": 2, "booting": 0, "target": 2 }),
        "{status}"
    );
    let (_, text, _) = daemon.ctl(&["status"]).await;
    assert!(
        text.contains("warm: 2 ready, 0 booting (keeps 2 now)"),
        "{text}"
    );

    standin.queue_jobs("app", LABELS, 6);
    daemon
        .wait_completed(&standin, 6, Duration::from_secs(60))
        .await;
    daemon.wait_no_runner_left(&standin).await;
    let metrics = daemon.metrics().await;
    let hits = series(
        &metrics,
        "ephemerd_warm_claims_total{outcome=\"hit\",pool=\"local\"}",
    );
    let misses = series(
        &metrics,
        "ephemerd_warm_claims_total{outcome=\"miss\",pool=\"local\"}",
    );
    // Booting a command pool's directory is quick, so the burst may find one warm each time.
    assert!(hits >= 2.0, "the warm ones were used: {hits}");
    assert_eq!(hits + misses, 6.0, "one start per job");
    assert_eq!(
        series(
            &metrics,
            "ephemerd_pickup_seconds_count{pool=\"local\",warm=\"hit\"}"
        ),
        hits
    );

    // Warm again; one of them removed behind the daemon's back is replaced.
    eventually("the pool is warm again", Duration::from_secs(20), || {
        warm_dirs(&root).len() == 2
    })
    .await;
    let victim = warm_dirs(&root)[0].clone();
    std::fs::remove_dir_all(root.join(&victim)).unwrap();
    eventually("the dead one is replaced", Duration::from_secs(20), || {
        let now = warm_dirs(&root);
        now.len() == 2 && !now.contains(&victim)
    })
    .await;
    let metrics = daemon.metrics().await;
    assert_eq!(
        series(
            &metrics,
            "ephemerd_warm_discarded_total{pool=\"local\",reason=\"dead\"}"
        ),
        1.0
    );

    // Both warm directories gone just before two claims take them: each runner starts in a
    // new directory instead, and both jobs run.
    eventually("warm again", Duration::from_secs(20), || {
        warm_dirs(&root).len() == 2
    })
    .await;
    for dir in warm_dirs(&root) {
        std::fs::remove_dir_all(root.join(dir)).unwrap();
    }
    standin.queue_jobs("app", LABELS, 2);
    daemon
        .wait_completed(&standin, 8, Duration::from_secs(60))
        .await;
    assert!(
        daemon
            .logs()
            .contains("the warm environment failed at the claim; starting the runner in a new one"),
        "{}",
        daemon.logs()
    );

    // Cordoned: nothing warm; uncordoned: warm again.
    assert_eq!(daemon.ctl(&["cordon"]).await.0, 0);
    eventually(
        "a cordon removes the warm ones",
        Duration::from_secs(20),
        || warm_dirs(&root).is_empty(),
    )
    .await;
    assert_eq!(daemon.ctl(&["uncordon"]).await.0, 0);
    eventually(
        "warm again after the uncordon",
        Duration::from_secs(20),
        || warm_dirs(&root).len() == 2,
    )
    .await;

    let (code, logs) = daemon.stop(Duration::from_secs(30)).await;
    assert_eq!(code, Some(0), "{logs}");
    assert_eq!(warm_dirs(&root), Vec::<String>::new(), "{logs}");
}

/// A container pool keeping 2 warm: the warm containers run with no runner and no secret in
/// them (no JIT config, none of the pool's `env`); jobs start in them and run; the pool is warm
/// again after; the stop leaves no container, warm or not.
#[actix_rt::test]
async fn a_container_pool_starts_runners_in_warm_containers_that_hold_no_secret() {
    let Some(podman) = crate::support::podman::Podman::start().await else {
        return;
    };
    let standin = crate::support::standin(200);
    let providers = crate::support::daemon::linux_provider(
        &podman.socket,
        crate::support::podman::IMAGE,
        3,
        "command = [\"/usr/local/bin/ephemer-actors\", \"standin-runner\"]\nnetwork = \"host\"\nwarm = 2\nenv = { TEAM_TOKEN = \"team-secret-7f3a\" }",
    );
    let daemon = Daemon::start(&standin, "", &providers).await;
    let docker =
        bollard::Docker::connect_with_unix(&podman.socket, 60, bollard::API_DEFAULT_VERSION)
            .unwrap();
    let warm_names = || async {
        podman
            .container_names()
            .await
            .split_whitespace()
            .filter(|n| n.contains("-warm-"))
            .map(str::to_string)
            .collect::<Vec<_>>()
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let mut warm = warm_names().await;
    while warm.len() < 2 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "no warm containers:\n{}",
            daemon.logs()
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
        warm = warm_names().await;
    }
    let inspect = docker
        .inspect_container(
            &warm[0],
            None::<bollard::query_parameters::InspectContainerOptions>,
        )
        .await
        .unwrap();
    let env = inspect.config.unwrap().env.unwrap_or_default().join(" ");
    assert!(!env.contains("ACTIONS_RUNNER_INPUT_JITCONFIG"), "{env}");
    assert!(!env.contains("team-secret"), "{env}");
    assert!(inspect.state.unwrap().running.unwrap_or(false));

    standin.queue_jobs("app", LABELS, 4);
    daemon
        .wait_completed(&standin, 4, Duration::from_secs(120))
        .await;
    daemon.wait_no_runner_left(&standin).await;
    let metrics = daemon.metrics().await;
    let hits = series(
        &metrics,
        "ephemerd_warm_claims_total{outcome=\"hit\",pool=\"linux\"}",
    );
    assert!(
        hits >= 2.0,
        "runners started in warm containers: {hits}\n{}",
        daemon.logs()
    );
    assert!(daemon.logs().contains("runner started in a warm container"));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while warm_names().await.len() < 2 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "not warm again:\n{}",
            daemon.logs()
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let ours = format!("{}-linux-", daemon.prefix());
    assert_eq!(daemon.stop(Duration::from_secs(30)).await.0, Some(0));
    let names = podman.container_names().await;
    assert!(!names.contains(&ours), "containers left: {names}");
}

/// A daemon killed with `kill -9` while two directories were warm: the restart removes them
/// with its leftovers and prepares new ones; none leaks, and jobs run.
#[actix_rt::test]
async fn a_restart_after_kill_9_removes_what_was_warm_and_warms_anew() {
    let (standin, daemon, root) = warm_local_pool().await;
    let before = warm_dirs(&root);
    let daemon = Daemon::resume(&standin, daemon.kill9().await).await;
    eventually(
        "the old ones removed, two new ones warm",
        Duration::from_secs(30),
        || {
            let now = warm_dirs(&root);
            now.len() == 2 && now.iter().all(|d| !before.contains(d))
        },
    )
    .await;
    assert!(
        daemon
            .logs()
            .contains("removed leftover runner environments"),
        "{}",
        daemon.logs()
    );
    standin.queue_jobs("app", LABELS, 2);
    daemon
        .wait_completed(&standin, 2, Duration::from_secs(60))
        .await;
    assert_eq!(daemon.stop(Duration::from_secs(30)).await.0, Some(0));
    assert_eq!(warm_dirs(&root), Vec::<String>::new());
}
