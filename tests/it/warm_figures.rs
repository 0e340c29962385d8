//! Figures for docs/benchmarks.md, "Warm pools": queued -> job taken by its runner, cold
//! against `warm = 4`, 50 jobs at one a second, for a process pool with a large `runner_dir`
//! and for a container pool (and one whose containers take 3 s to start). Run by hand:
//! `cargo test --test it -- --ignored warm_figures --nocapture`.

use std::{path::Path, time::Duration};

use crate::support::daemon::{Daemon, linux_provider};

const LABELS: &[&str] = &["self-hosted", "linux", "x64"];

/// A runner install the size of actions/runner 2.330 (about 5,000 files, 240 MB) whose
/// `run.sh` starts the stand-in runner.
fn large_install(root: &Path) {
    let bin = env!("CARGO_BIN_EXE_ephemer-actors");
    let run = root.join("run.sh");
    std::fs::create_dir_all(root).unwrap();
    std::fs::write(
        &run,
        format!("#!/bin/sh\nexec {bin} standin-runner \"$@\"\n"),
    )
    .unwrap();
    std::fs::set_permissions(&run, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let blob = vec![7u8; 48 * 1024];
    for d in 0..100 {
        let dir = root.join(format!("bin/lib{d:03}"));
        std::fs::create_dir_all(&dir).unwrap();
        for f in 0..50 {
            std::fs::write(dir.join(format!("f{f:02}.dll")), &blob).unwrap();
        }
    }
}

/// p50 and p99 (and max) of queued -> taken, in ms, for the stand-in's jobs.
fn pickup(standin: &github_standin::Standin) -> (u128, u128, u128) {
    let mut waits: Vec<u128> = standin
        .jobs()
        .iter()
        .filter_map(|j| Some(j.picked_at_ms?.saturating_sub(j.queued_at_ms)))
        .collect();
    waits.sort_unstable();
    let at = |q: f64| waits[((waits.len() as f64 * q) as usize).min(waits.len() - 1)];
    (at(0.5), at(0.99), waits[waits.len() - 1])
}

async fn run(label: &str, pool: &str) {
    let standin = crate::support::standin(100);
    standin.set_behavior(github_standin::RunnerBehavior {
        job_ms: 2000,
        ..github_standin::RunnerBehavior::default()
    });
    let daemon = Daemon::start(&standin, "", pool).await;
    // Let the warm pool fill (and the cold one settle) before the first job.
    tokio::time::sleep(Duration::from_secs(15)).await;
    for _ in 0..50 {
        standin.queue_jobs("app", LABELS, 1);
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    daemon
        .wait_completed(&standin, 50, Duration::from_secs(300))
        .await;
    let (p50, p99, max) = pickup(&standin);
    let metrics = daemon.metrics().await;
    let hits: Vec<&str> = metrics
        .lines()
        .filter(|l| l.starts_with("ephemerd_warm_claims_total"))
        .collect();
    println!(
        "warm figures: {label}: queued -> taken p50 {p50} ms, p99 {p99} ms, max {max} ms; {hits:?}"
    );
    daemon.stop(Duration::from_secs(60)).await;
}

#[actix_rt::test]
#[ignore = "a measurement, run by hand"]
async fn warm_figures() {
    let dir = tempfile::tempdir().unwrap();
    let install = dir.path().join("actions-runner");
    large_install(&install);
    for warm in [0, 4] {
        let pool = format!(
            "[providers.local]\nrunner_dir = \"{}\"\nlabels = [\"self-hosted\", \"linux\", \"x64\"]\nmax_concurrent = 8\nallow_root = true\nwarm = {warm}\n",
            install.display()
        );
        run(
            &format!("process pool, 5,000-file runner_dir, warm = {warm}"),
            &pool,
        )
        .await;
    }
    let Some(podman) = crate::support::podman::Podman::start().await else {
        return;
    };
    container_runs(&podman, "container pool").await;
}

/// The container pool on `podman`, cold and then with `warm = 4`.
async fn container_runs(podman: &crate::support::podman::Podman, label: &str) {
    for warm in [0, 4] {
        let pool = linux_provider(
            &podman.socket,
            crate::support::podman::IMAGE,
            8,
            &format!(
                "command = [\"/usr/local/bin/ephemer-actors\", \"standin-runner\"]\nnetwork = \"host\"\nwarm = {warm}"
            ),
        );
        run(&format!("{label}, warm = {warm}"), &pool).await;
    }
}

/// A container pool whose containers take 3 s to start (an OCI prestart hook on the engine),
/// cold against `warm = 4`.
#[actix_rt::test]
#[ignore = "a measurement, run by hand"]
async fn warm_figures_slow_container() {
    let boot = Duration::from_secs(3);
    let Some(podman) = crate::support::podman::Podman::start_with_boot_delay(boot).await else {
        return;
    };
    container_runs(&podman, "container pool, 3 s container start").await;
}
