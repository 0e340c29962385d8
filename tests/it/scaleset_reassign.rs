//! The service's job reassignment against runners slower than its windows (the
//! actions/scaleset README, "Job Reassignment"; ARC#4602): an assigned job no runner took in
//! its window is withdrawn (`JobCompleted`, `canceled`, no runner) and assigned again with the
//! same ids, with a longer window each time, up to three assignments, then cancelled for good.
//! Runners that boot in 4 s against windows of 3, 6 and 9 s: the first assignment always
//! lapses, so every job's second (or third) assignment must get a runner, in both message
//! shapes, and the runners made stay bounded; then runners that boot in 10 s, slower than the
//! first two windows together, so only the third assignment can be taken. Each withdrawal
//! carries a `runnerAssignTime`, the harsher reading of the sources.

use std::time::Duration;

use github_standin::{RunnerBehavior, scaleset::MessageShape};

use crate::{
    scaleset::{ALPHA, BETA, assert_each_job_on_its_pool, standin, start},
    scaleset_fidelity::{jobs_not_run, withdrawals},
};

const SLOTS: usize = 3;

async fn run(shape: MessageShape, boot_ms: u64, jobs: usize) {
    let standin = standin();
    standin.set_behavior(RunnerBehavior {
        job_ms: 300,
        boot_ms,
        ..RunnerBehavior::default()
    });
    {
        let mut s = standin.state();
        s.scalesets.shape = shape;
        s.scalesets.assign_windows = [3, 6, 9].map(Duration::from_secs).to_vec();
        s.scalesets.reassign_delay = Duration::from_millis(500);
        s.scalesets.withdrawal_assign_time = true;
        s.scalesets.queue_token_ttl = Duration::from_secs(5);
        s.scalesets.admin_token_ttl = Duration::from_secs(65);
    }
    let daemon = start(&standin, SLOTS).await;
    for i in 0..jobs {
        standin.queue_jobs("app", if i % 2 == 0 { ALPHA } else { BETA }, 1);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    daemon
        .wait_completed(&standin, jobs, Duration::from_secs(300))
        .await;
    let cancelled = jobs_not_run(&standin);
    let withdrawn = withdrawals(&standin);
    assert!(
        cancelled.is_empty(),
        "{shape:?}: {} of {jobs} jobs cancelled by the service ({withdrawn} withdrawals): {cancelled:?}\n{}\n{}",
        cancelled.len(),
        histories(&standin, &cancelled),
        daemon.logs()
    );
    assert!(
        withdrawn as usize >= jobs / 2,
        "{shape:?}: the windows were shorter than a boot, yet only {withdrawn} withdrawals"
    );
    assert_each_job_on_its_pool(&standin);
    daemon.wait_no_runner_left(&standin).await;
    // Bounded: a runner per job, and a few spares that outlived the job they were made for.
    let registered = standin.count("actions_generate_jitconfig");
    assert!(
        registered <= jobs + 2 * SLOTS,
        "{shape:?}: {registered} runners registered for {jobs} jobs"
    );
    eprintln!(
        "scale-set reassignment {shape:?}: boots of {boot_ms} ms, {jobs} jobs ran, {withdrawn} withdrawals, {registered} registrations"
    );
    assert_eq!(daemon.stop(Duration::from_secs(30)).await.0, Some(0));
}

/// Each cancelled job's path through the service (seconds from the first request) and where
/// every job ran: what a failing test shows.
pub(crate) fn histories(standin: &github_standin::Standin, cancelled: &[u64]) -> String {
    let s = standin.state();
    let t0 = s
        .scalesets
        .requests
        .values()
        .filter_map(|r| r.history.first().map(|h| h.0))
        .min()
        .unwrap_or(0);
    s.scalesets
        .requests
        .values()
        .filter(|r| cancelled.contains(&r.job_id))
        .map(|r| {
            let steps: Vec<String> = r
                .history
                .iter()
                .map(|(at, state)| format!("{:.1}s {state:?}", (at - t0) as f64 / 1000.0))
                .collect();
            format!("job {}: {}", r.job_id, steps.join(", "))
        })
        .chain(s.jobs.values().map(|j| {
            format!(
                "job {} {} on {:?} picked {:?}",
                j.id,
                j.status,
                j.runner_name,
                j.picked_at_ms.map(|p| p.saturating_sub(t0) as f64 / 1000.0)
            )
        }))
        .collect::<Vec<_>>()
        .join("\n")
}

/// github.com's shape: assigned directly, named by `jobId`.
#[actix_rt::test]
async fn runners_slower_than_the_windows_still_run_every_job_github_com_shape() {
    run(MessageShape::Dotcom, 4000, 42).await;
}

/// A GHES's shape: offered, acquired, numbered by runner request ids.
#[actix_rt::test]
async fn runners_slower_than_the_windows_still_run_every_job_ghes_shape() {
    run(MessageShape::Ghes, 4000, 42).await;
}

/// Boots slower than the first two windows: only the third assignment can be taken, by the
/// runner made for the first, kept through both withdrawals. As many jobs as the pools hold:
/// with a backlog, the service may give a runner that comes up between a job's withdrawal and
/// its next assignment another job, and no runner booted after that makes the last window
/// (docs/operations.md, "Scale sets: jobs withdrawn and assigned again").
#[actix_rt::test]
async fn runners_slower_than_two_windows_take_the_third_assignment() {
    for shape in [MessageShape::Dotcom, MessageShape::Ghes] {
        run(shape, 10_000, 2 * SLOTS).await;
    }
}
