//! GitHub's broker outage of 2026-07-25, scaled down: the message queue (and the rest of the
//! Actions service) answers 500 for minutes, then every scale set is deleted server-side (404),
//! then the service comes back. ARC's listeners stayed down for good (ARC#4370). Here every
//! job queued before, during and after runs on its own pool, the scale sets are made again by
//! the daemon itself, and nothing is left; the daemon is never restarted.

use std::time::Duration;

use github_standin::Fault;

use crate::{
    scaleset::{ALPHA, BETA, assert_each_job_on_its_pool, standin, start},
    scaleset_chaos::SERVICE,
    scaleset_fidelity::jobs_not_run,
};

/// How long the service answers 500 (`SCALESET_OUTAGE_SECS`; the real one lasted hours).
fn outage() -> Duration {
    Duration::from_secs(
        std::env::var("SCALESET_OUTAGE_SECS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(120),
    )
}

#[actix_rt::test]
async fn minutes_of_500_then_every_scale_set_deleted_and_the_daemon_comes_back_by_itself() {
    let standin = standin();
    let daemon = start(&standin, 2).await;
    let queue = |n: usize| {
        for i in 0..n {
            standin.queue_jobs("app", if i % 2 == 0 { ALPHA } else { BETA }, 1);
        }
    };
    queue(4);
    daemon
        .wait_completed(&standin, 4, Duration::from_secs(60))
        .await;
    let before: Vec<u64> = standin.scale_sets().iter().map(|(id, ..)| *id).collect();

    // The broker fails: 500 from the whole service, jobs still queued.
    for endpoint in SERVICE {
        standin.fail_share(endpoint, 1.0, Fault::http(500, false));
    }
    queue(4);
    tokio::time::sleep(outage() / 2).await;
    queue(2);
    tokio::time::sleep(outage() / 2).await;
    // Then the scale sets are gone server-side, and the service answers again.
    {
        let mut s = standin.state();
        for id in &before {
            s.scalesets.delete_set(*id);
        }
    }
    standin.clear_fail_shares();
    queue(4);

    daemon
        .wait_completed(&standin, 14, Duration::from_secs(300))
        .await;
    let not_run = jobs_not_run(&standin);
    assert!(
        not_run.is_empty(),
        "jobs that did not run: {not_run:?}\n{}",
        daemon.logs()
    );
    assert_each_job_on_its_pool(&standin);
    let after: Vec<u64> = standin.scale_sets().iter().map(|(id, ..)| *id).collect();
    assert_eq!(after.len(), 2, "both scale sets made again: {after:?}");
    assert!(after.iter().all(|id| !before.contains(id)), "{after:?}");
    daemon.wait_no_runner_left(&standin).await;
    let logs = daemon.logs();
    assert!(
        logs.contains("scale set: created"),
        "the daemon made them again by itself:\n{logs}"
    );
    assert_eq!(daemon.stop(Duration::from_secs(30)).await.0, Some(0));
}
