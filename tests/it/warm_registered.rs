//! Registered warm runners (`warm_mode = "registered"`) against the stand-in: idle JIT
//! runners claimed ahead take jobs the moment they are queued; the count is kept; an old one
//! is rotated (its registration deleted before the new claim); a drain leaves none. In
//! scale-set mode too, each pool's idle runners in its own scale set.

use std::time::Duration;

use crate::support::{
    daemon::{Daemon, local_provider},
    provision::eventually,
    series,
};

const LABELS: &[&str] = &["self-hosted", "linux", "x64"];

/// Stops `daemon` (a drain) and checks it left no registration.
async fn drained_to_nothing(daemon: Daemon, standin: &github_standin::Standin) {
    let (code, logs) = daemon.stop(Duration::from_secs(30)).await;
    assert_eq!(code, Some(0), "{logs}");
    assert!(
        standin.runners().is_empty(),
        "{:?}\n{logs}",
        standin.runners()
    );
}

/// Registered, idle runners at the stand-in.
fn idle(standin: &github_standin::Standin) -> Vec<github_standin::Runner> {
    standin
        .runners()
        .into_iter()
        .filter(|r| !r.busy && r.job_id.is_none())
        .collect()
}

#[actix_rt::test]
async fn idle_registered_runners_take_jobs_at_once_are_rotated_and_gone_after_a_drain() {
    let standin = crate::support::standin(100);
    let pool = local_provider(4).replace(
        "max_concurrent = 4",
        "max_concurrent = 4\nwarm = 2\nwarm_mode = \"registered\"\nwarm_max_age = \"12s\"",
    );
    // Registered ahead of their job, they are org-level runners.
    let daemon = Daemon::start_with_github(&standin, "repos = []\n", "", &pool).await;
    eventually(
        "two idle registered runners",
        Duration::from_secs(20),
        || idle(&standin).len() == 2 && idle(&standin).iter().all(|r| r.status == "online"),
    )
    .await;
    let registered_before = standin.count("generate_jitconfig");
    assert_eq!(registered_before, 2);

    // Two jobs: each is taken by a runner registered before it was queued (a warm one, or
    // the one claimed to make the count up, when the first job was handed a warm one); no
    // claim is made for either.
    standin.queue_jobs("app", LABELS, 2);
    daemon
        .wait_completed(&standin, 2, Duration::from_secs(30))
        .await;
    eventually("the count is made up", Duration::from_secs(20), || {
        idle(&standin).len() == 2
    })
    .await;
    assert_eq!(standin.count("generate_jitconfig"), registered_before + 2);
    let metrics = daemon.metrics().await;
    let outcome = |o: &str| {
        series(
            &metrics,
            &format!("ephemerd_warm_claims_total{{outcome=\"{o}\",pool=\"local\"}}"),
        )
    };
    assert_eq!((outcome("hit"), outcome("miss")), (2.0, 0.0), "{metrics}");
    // GitHub's own wait (its `created_at` to `started_at`) is counted for both, as hits.
    assert_eq!(
        series(
            &metrics,
            "ephemerd_pickup_github_seconds_count{pool=\"local\",warm=\"hit\"}"
        ),
        2.0,
        "{metrics}"
    );
    assert_eq!(
        series(&metrics, "ephemerd_warm_available{pool=\"local\"}"),
        2.0
    );
    let status = daemon.ctl_json(&["status"]).await;
    assert_eq!(status["providers"][0]["warm"]["target"], 2, "{status}");

    // Rotation: past warm_max_age each idle runner's registration is deleted, and only then
    // is its replacement claimed; the count stays.
    let old: Vec<(u64, String)> = idle(&standin).into_iter().map(|r| (r.id, r.name)).collect();
    eventually("both rotated", Duration::from_secs(40), || {
        let now = idle(&standin);
        now.len() == 2 && now.iter().all(|r| old.iter().all(|(_, n)| *n != r.name))
    })
    .await;
    let calls = standin.calls();
    for (id, name) in &old {
        let deleted = calls
            .iter()
            .position(|c| c.endpoint == "delete_runner" && c.path.ends_with(&format!("/{id}")))
            .unwrap_or_else(|| panic!("{name} was never deleted"));
        let claims_after = calls[deleted..]
            .iter()
            .filter(|c| c.endpoint == "generate_jitconfig")
            .count();
        assert!(claims_after >= 1, "a claim follows the deletion of {name}");
    }
    assert!(standin.runners().len() <= 2, "never more than the count");
    let metrics = daemon.metrics().await;
    assert!(
        series(
            &metrics,
            "ephemerd_warm_discarded_total{pool=\"local\",reason=\"age\"}"
        ) >= 2.0,
        "{metrics}"
    );

    // A drain leaves no registration.
    drained_to_nothing(daemon, &standin).await;
}

/// Scale-set mode: each pool keeps one idle runner registered in its own scale set; a job
/// assigned to the scale set is taken by it with no claim of its own, on its own pool; the
/// drain leaves no runner in either scale set.
#[actix_rt::test]
async fn in_scale_set_mode_each_pool_s_idle_runner_takes_its_own_pool_s_job() {
    let standin = crate::scaleset::standin();
    let daemon =
        crate::scaleset::start_with(&standin, 2, "warm = 1\nwarm_mode = \"registered\"").await;
    eventually(
        "an idle runner per scale set",
        Duration::from_secs(20),
        || idle(&standin).len() == 2 && idle(&standin).iter().all(|r| r.status == "online"),
    )
    .await;
    standin.queue_jobs("app", crate::scaleset::ALPHA, 1);
    standin.queue_jobs("app", &["self-hosted", "linux", "beta"], 1);
    daemon
        .wait_completed(&standin, 2, Duration::from_secs(30))
        .await;
    crate::scaleset::assert_each_job_on_its_pool(&standin);
    let metrics = daemon.metrics().await;
    for pool in ["alpha", "beta"] {
        assert_eq!(
            series(
                &metrics,
                &format!("ephemerd_warm_claims_total{{outcome=\"hit\",pool=\"{pool}\"}}")
            ),
            1.0,
            "{metrics}"
        );
    }
    eventually("the count is made up", Duration::from_secs(20), || {
        idle(&standin).len() == 2
    })
    .await;
    drained_to_nothing(daemon, &standin).await;
}

/// `kill -9` with idle registered runners alive and jobs running: the restart takes the
/// runners it knows back (an idle one is a spare again, not a leak), every job runs, jobs
/// queued while the daemon was down are served, the count is kept, and a drain leaves no
/// registration.
#[actix_rt::test]
async fn a_daemon_killed_with_idle_registered_runners_loses_nothing_and_leaks_none() {
    let standin = crate::support::standin(100);
    standin.set_behavior(github_standin::RunnerBehavior {
        job_ms: 1_500,
        ..github_standin::RunnerBehavior::default()
    });
    let pool = local_provider(4).replace(
        "max_concurrent = 4",
        "max_concurrent = 4\nwarm = 2\nwarm_mode = \"registered\"",
    );
    let daemon = Daemon::start_with_github(&standin, "repos = []\n", "", &pool).await;
    eventually(
        "two idle registered runners",
        Duration::from_secs(20),
        || idle(&standin).len() == 2 && idle(&standin).iter().all(|r| r.status == "online"),
    )
    .await;
    // One job takes a warm runner; the count is made up; then the kill, with one job running
    // and two idle runners registered.
    standin.queue_jobs("app", LABELS, 1);
    eventually(
        "a job running and two idle",
        Duration::from_secs(20),
        || standin.jobs_in("in_progress") == 1 && idle(&standin).len() == 2,
    )
    .await;
    let left = daemon.kill9().await;
    standin.queue_jobs("app", LABELS, 3);
    let daemon = Daemon::resume(&standin, left).await;
    daemon
        .wait_completed(&standin, 4, Duration::from_secs(60))
        .await;
    eventually(
        "the count is made up again",
        Duration::from_secs(30),
        || idle(&standin).len() == 2,
    )
    .await;
    // Nothing beyond the count stays registered: no runner of before the kill is leaked.
    assert_eq!(
        standin.runners().len(),
        2,
        "{:?}\n{}",
        standin.runners(),
        daemon.logs()
    );
    let claims = standin.count("generate_jitconfig");
    assert!(
        claims <= 2 + 4 + 2 + 2,
        "{claims} claims for 4 jobs and a count of 2 (one refill of the count after the kill)"
    );
    drained_to_nothing(daemon, &standin).await;
}
