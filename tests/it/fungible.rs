//! Fungible runners end to end: a runner that crashes at boot while its sibling runs the other
//! job, a job cancelled before any runner took it (its runner idle, or already running another
//! job), and a job whose webhook never arrived.

use std::time::Duration;

use github_standin::{RunnerBehavior, Standin, StandinConfig};

use crate::support::{
    daemon::{Daemon, local_provider},
    provision::{alive, eventually},
};

const LABELS: &[&str] = &["self-hosted", "linux"];

/// One stand-in runner crashes at boot while its sibling runs the other job: the job left
/// without a runner is dispatched again when the runner made for it exits, and both jobs run.
#[actix_rt::test]
async fn a_runner_crashing_at_boot_strands_nothing() {
    let standin = Standin::start(StandinConfig::default()).unwrap();
    standin.set_behavior(RunnerBehavior {
        job_ms: 300,
        crash_next: 1,
        ..RunnerBehavior::default()
    });
    // A runner that exits with an error before it was seen with any job climbs its job's ladder
    // (a short one here); one that was seen with a job leaves its own stranded: dispatched again
    // at once. Which one the crash is depends on whether its job's `in_progress` came first.
    let ladder = "[runner.claim_retry]\nschedule = [\"1s\"]\n";
    let daemon = Daemon::start(&standin, ladder, &local_provider(4)).await;
    standin.queue_jobs("app", LABELS, 2);
    daemon
        .wait_completed(&standin, 2, Duration::from_secs(60))
        .await;
    daemon.wait_no_runner_left(&standin).await;
    // One extra claim for the job left behind; a second one only when the surviving runner's
    // own job had not been reported running yet when it exited (the surplus is then reaped).
    let claims = standin.count("generate_jitconfig");
    assert!((3..=4).contains(&claims), "{claims} claims");
    let logs = daemon.logs();
    assert!(
        logs.contains("stranded") || logs.contains("before its job started"),
        "{logs}"
    );
    assert_eq!(daemon.stop(Duration::from_secs(30)).await.0, Some(0));
}

/// A job cancelled before any runner took it: its runner is torn down, deleted on GitHub, and its
/// process is gone.
#[actix_rt::test]
async fn a_job_cancelled_before_pickup_leaves_no_runner() {
    let standin = Standin::start(StandinConfig::default()).unwrap();
    standin.set_behavior(RunnerBehavior {
        hold: true,
        ..RunnerBehavior::default()
    });
    let daemon = Daemon::start(&standin, "", &local_provider(2)).await;
    let job = standin.queue_jobs("app", LABELS, 1)[0];
    eventually("the runner to connect", Duration::from_secs(20), || {
        !standin.state().runner_pids.is_empty()
    })
    .await;
    let pid = *standin.state().runner_pids.values().next().unwrap() as i32;
    assert!(alive(pid));
    standin.cancel_job(job);
    eventually("the runner to be deleted", Duration::from_secs(20), || {
        standin.runners().is_empty()
    })
    .await;
    eventually("its process to be gone", Duration::from_secs(20), || {
        !alive(pid)
    })
    .await;
    assert_eq!(standin.count("delete_runner"), 1);
    assert_eq!(daemon.stop(Duration::from_secs(30)).await.0, Some(0));
}

/// The runner made for a job that is cancelled before any runner took it may already run
/// another job, whose `in_progress` has not reached the daemon: it must not be stopped
/// mid-job. Job B (no delivery) waits at GitHub before job A; A's runner takes B, B's
/// `in_progress` is held back, and A is cancelled. The runner runs B to its end; stopped,
/// B would fail as "lost communication" once its lock lapsed (2 s here).
#[actix_rt::test]
async fn a_cancelled_jobs_runner_that_took_another_job_runs_it_to_the_end() {
    let standin = Standin::start(StandinConfig {
        job_lock: Duration::from_secs(2),
        ..StandinConfig::default()
    })
    .unwrap();
    standin.set_behavior(RunnerBehavior {
        hold: true,
        ..RunnerBehavior::default()
    });
    let daemon = Daemon::start(&standin, "", &local_provider(2)).await;
    let b = standin.add_jobs("app", LABELS, 1)[0];
    let a = standin.queue_jobs("app", LABELS, 1)[0];
    eventually("A's runner to connect", Duration::from_secs(20), || {
        !standin.state().runner_pids.is_empty()
    })
    .await;
    standin.set_delivery_faults(github_standin::DeliveryFaults {
        swap_in_progress_and_completed: true,
        ..Default::default()
    });
    standin.set_behavior(RunnerBehavior {
        job_ms: 4000,
        ..RunnerBehavior::default()
    });
    eventually("A's runner to take B", Duration::from_secs(20), || {
        standin
            .jobs()
            .iter()
            .any(|j| j.id == b && j.status == "in_progress")
    })
    .await;
    let pid = *standin.state().runner_pids.values().next().unwrap() as i32;
    standin.cancel_job(a);
    daemon
        .wait_completed(&standin, 2, Duration::from_secs(30))
        .await;
    let job_b = standin.jobs().into_iter().find(|j| j.id == b).unwrap();
    assert!(
        !job_b.abandoned && job_b.conclusion.as_deref() == Some("success"),
        "B ran to its end: {job_b:?}\n{}",
        daemon.logs()
    );
    daemon.wait_no_runner_left(&standin).await;
    assert!(!alive(pid), "the runner went after B");
    assert!(
        standin
            .calls_to("delete_runner")
            .iter()
            .any(|c| c.status == 422),
        "the daemon asked to delete the runner, and GitHub refused: it was busy"
    );
    assert_eq!(daemon.stop(Duration::from_secs(30)).await.0, Some(0));
}

/// A job whose queued webhook never arrived runs after the next reconcile.
#[actix_rt::test]
async fn a_lost_delivery_is_caught_by_the_reconcile() {
    let standin = Standin::start(StandinConfig::default()).unwrap();
    let daemon = Daemon::start_reconciling(&standin, "2s", "", &local_provider(2)).await;
    standin.add_jobs("app", LABELS, 1);
    daemon
        .wait_completed(&standin, 1, Duration::from_secs(30))
        .await;
    assert!(
        standin.deliveries().iter().all(|d| d.action != "queued"),
        "no queued webhook was ever sent"
    );
    assert_eq!(standin.count("generate_jitconfig"), 1);
    assert_eq!(daemon.stop(Duration::from_secs(30)).await.0, Some(0));
}

/// A job the daemon holds idle while GitHub lists it queued (it came while the daemon was
/// cordoned, and a second delivery inside the dedup window is a duplicate) is admitted by the
/// next reconcile pass once the cordon is lifted, and counted.
#[actix_rt::test]
async fn a_job_held_idle_is_admitted_by_the_next_reconcile() {
    let standin = Standin::start(StandinConfig::default()).unwrap();
    let daemon = Daemon::start_reconciling(&standin, "2s", "", &local_provider(2)).await;
    let (code, _, err) = daemon.ctl(&["cordon"]).await;
    assert_eq!(code, 0, "{err}");
    standin.queue_jobs("app", LABELS, 1);
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert_eq!(standin.count("generate_jitconfig"), 0);
    let (code, _, err) = daemon.ctl(&["uncordon"]).await;
    assert_eq!(code, 0, "{err}");
    daemon
        .wait_completed(&standin, 1, Duration::from_secs(30))
        .await;
    assert_eq!(standin.count("generate_jitconfig"), 1);
    let metrics = daemon.metrics().await;
    assert!(
        metrics.contains("ephemerd_reconcile_readmitted_total{reason=\"idle\"} 1"),
        "{metrics}"
    );
    assert_eq!(daemon.stop(Duration::from_secs(30)).await.0, Some(0));
}
