//! Scale-set mode's reckoning: GitHub's `totalAssignedJobs` held against the jobs the daemon
//! knows. Jobs assigned to a scale set whose `JobAssigned` never reached the daemon still get
//! runners; a job of a scale set GitHub deleted, assigned anew in the new one, leaves no
//! runner behind.

use std::time::Duration;

use crate::{
    scaleset::{ALPHA, assert_each_job_on_its_pool, one_job_waiting, standin, start},
    support::provision::{eventually, eventually_async},
};

/// Three jobs assigned with no message at all (as if another consumer had acknowledged it):
/// the daemon knows none of them, the statistics say 3, and runners are claimed for them
/// until all ran. Then one assigned job never heard of is cancelled before a runner took it:
/// the runner claimed for it goes.
#[actix_rt::test]
async fn assigned_jobs_never_heard_of_get_runners_and_a_cancelled_one_leaves_none() {
    let standin = standin();
    let daemon = start(&standin, 2).await;
    standin.state().scalesets.swallow_assigned = 3;
    standin.queue_jobs("app", ALPHA, 3);
    daemon
        .wait_completed(&standin, 3, Duration::from_secs(90))
        .await;
    daemon.wait_no_runner_left(&standin).await;
    assert_each_job_on_its_pool(&standin);
    let metrics = daemon.metrics().await;
    let filled: u64 = metrics
        .lines()
        .find(|l| l.starts_with("ephemerd_scaleset_reckoned_total{action=\"fill\",pool=\"alpha\"}"))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
        .unwrap_or_else(|| panic!("{metrics}"));
    assert!(
        (3..=4).contains(&filled),
        "runners claimed for them: {filled}"
    );
    assert!(
        daemon
            .logs()
            .contains("GitHub assigned jobs this daemon never heard of"),
        "{}",
        daemon.logs()
    );

    // Runners that never take a job: the placeholder's runner waits; the job is cancelled.
    standin.set_behavior(github_standin::RunnerBehavior {
        hold: true,
        ..github_standin::RunnerBehavior::default()
    });
    let registered = standin.count("actions_generate_jitconfig");
    standin.state().scalesets.swallow_assigned = 1;
    let id = standin.queue_jobs("app", ALPHA, 1)[0];
    eventually(
        "a runner is claimed for the job never heard of",
        Duration::from_secs(60),
        || {
            standin.count("actions_generate_jitconfig") > registered
                && !standin.runners().is_empty()
        },
    )
    .await;
    standin.cancel_job(id);
    eventually(
        "the placeholder is withdrawn and its runner goes",
        Duration::from_secs(60),
        || standin.runners().is_empty(),
    )
    .await;
    let metrics = daemon.metrics().await;
    assert!(
        metrics.contains("ephemerd_scaleset_reckoned_total{action=\"withdraw\",pool=\"alpha\"} 1"),
        "{}",
        metrics
            .lines()
            .filter(|l| l.contains("reckoned"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    // GitHub's side goes first (the registration deleted), the runner's teardown after it.
    eventually_async(
        "the daemon counts no runner",
        Duration::from_secs(30),
        || async { daemon.ctl_json(&["status"]).await["runners"] == 0 },
    )
    .await;
    assert_eq!(daemon.stop(Duration::from_secs(30)).await.0, Some(0));
}

/// A job waits in a scale set (its runner claimed but not yet given it) when GitHub deletes
/// the scale set: the daemon makes it again, GitHub assigns the job anew there, and it runs
/// once, on a runner of the new scale set; the runner of the old one is not left behind.
#[actix_rt::test]
async fn a_job_of_a_deleted_scale_set_runs_once_in_the_new_one_and_leaves_no_runner() {
    let standin = standin();
    let (daemon, id) = one_job_waiting(&standin).await;
    let old = standin
        .scale_sets()
        .iter()
        .find(|(_, n, _, _)| n == "alpha")
        .map(|(id, ..)| *id)
        .unwrap();
    standin.state().scalesets.delete_set(old);
    eventually(
        "alpha's scale set is made again and the job is assigned there",
        Duration::from_secs(60),
        || {
            let sets = standin.scale_sets();
            let new = sets
                .iter()
                .find(|(sid, n, _, o)| n == "alpha" && *sid != old && o.is_some());
            new.is_some_and(|(sid, ..)| {
                standin
                    .state()
                    .scalesets
                    .request_of(id)
                    .is_some_and(|r| r.set_id == *sid)
            })
        },
    )
    .await;
    standin.set_behavior(github_standin::RunnerBehavior::default());
    daemon
        .wait_completed(&standin, 1, Duration::from_secs(60))
        .await;
    eventually(
        "the old scale set's job is withdrawn and no runner is left",
        Duration::from_secs(60),
        || standin.runners().is_empty(),
    )
    .await;
    let logs = daemon.logs();
    assert!(logs.contains("scale set: made again"), "{logs}");
    assert!(
        logs.contains("its old jobs still waiting are withdrawn, the service assigns them anew"),
        "{logs}"
    );
    // The registration goes with the job at the service; the daemon's runner a moment later,
    // once its process has exited and its teardown is done.
    eventually_async(
        "the daemon's last runner gone",
        Duration::from_secs(30),
        || async { daemon.ctl_json(&["status"]).await["runners"] == 0 },
    )
    .await;
    assert_eq!(daemon.stop(Duration::from_secs(30)).await.0, Some(0));
}
