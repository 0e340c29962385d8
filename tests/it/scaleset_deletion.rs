//! A scale set deleted out of band on the service's harshest timing (issue 79's sequence):
//! runners that boot in 4 s against assignment windows of 3, 6 and 9 s all the way through
//! (every first assignment lapses, so each job's later assignment must be served), a message
//! of an unknown type at the head of a queue, every token expiring every few seconds, beta's
//! scale set deleted with jobs queued while it is gone, 20 s of 503 from the queue and the
//! Actions service (so the deletion is seen only later, or only after the restart), a `kill -9`,
//! and more jobs while no one listens. All 42 jobs run, in both message shapes.
//!
//! Seed 1 of each shape in the suite; `SCALESET_CHAOS_SEEDS` picks the seeds as for
//! `scaleset_chaos.rs` (`.ci/run` runs 2-3 in its long step).

use std::time::Duration;

use github_standin::{Fault, RunnerBehavior, scaleset::MessageShape};
use rand::{RngExt as _, SeedableRng, rngs::SmallRng};

use crate::{
    scaleset_chaos::{SERVICE, resume_until_done, seeds, start, wave},
    scaleset_fidelity::{set_id, withdrawals},
    support::provision::eventually,
};

async fn run(shape: MessageShape, seed: u64) {
    let mut rng = SmallRng::seed_from_u64(seed);
    let standin = crate::scaleset::standin();
    standin.seed_faults(seed);
    standin.set_behavior(RunnerBehavior {
        job_ms: 300,
        boot_ms: 4000,
        ..RunnerBehavior::default()
    });
    {
        let mut s = standin.state();
        s.scalesets.shape = shape;
        s.scalesets.assign_windows = [3, 6, 9].map(Duration::from_secs).to_vec();
        s.scalesets.reassign_delay = Duration::from_millis(rng.random_range(100..1000));
        s.scalesets.queue_token_ttl = Duration::from_secs(5);
        s.scalesets.admin_token_ttl = Duration::from_secs(65);
    }
    let a = start(&standin).await;
    crate::scaleset::wait_listening(&standin, 2).await;
    let alpha = set_id(&standin, "alpha");
    standin
        .state()
        .scalesets
        .inject_other(alpha, "RunnerScaleSetSomethingNew", "{}");

    let mut jobs = 0;
    wave(&standin, &mut rng, 26, 300).await;
    jobs += 26;
    // The backlog taken (a backlog larger than a pool can serve in the service's three windows
    // is lost whatever a daemon does), then two jobs per pool whose runners are booting when
    // the scale set goes.
    eventually("the first jobs are taken", Duration::from_secs(120), || {
        standin.jobs().iter().all(|j| j.picked_at_ms.is_some())
    })
    .await;
    wave(&standin, &mut rng, 4, 100).await;
    jobs += 4;
    // Beta's scale set deleted out of band at the moment the service starts failing, so the
    // listener cannot see it gone (503, not 404) until the service is back or the daemon
    // restarts; jobs queued while it is gone. The service's clock stands while it is down.
    tokio::time::sleep(Duration::from_millis(rng.random_range(0..1500))).await;
    for endpoint in SERVICE {
        standin.fail_share(endpoint, 1.0, Fault::http(503, false));
    }
    let beta = set_id(&standin, "beta");
    {
        let mut s = standin.state();
        s.scalesets.pause_clock();
        s.scalesets.delete_set(beta);
    }
    wave(&standin, &mut rng, 6, 200).await;
    jobs += 6;
    // Killed in the outage's second half, or a few seconds after it (the deletion seen first).
    let storm = Duration::from_secs(20);
    let kill_at = Duration::from_millis(rng.random_range(10_000..26_000));
    let back = || {
        standin.clear_fail_shares();
        standin.state().scalesets.resume_clock();
    };
    tokio::time::sleep(kill_at.min(storm)).await;
    let left = if kill_at < storm {
        let left = a.kill9().await;
        tokio::time::sleep(storm - kill_at).await;
        back();
        left
    } else {
        back();
        tokio::time::sleep(kill_at - storm).await;
        a.kill9().await
    };
    wave(&standin, &mut rng, 6, 100).await;
    jobs += 6;
    let a = resume_until_done(&standin, left, jobs, &format!("{shape:?} seed {seed}")).await;
    let (code, logs) = a.stop(Duration::from_secs(30)).await;
    assert_eq!(code, Some(0), "{logs}");
    eprintln!(
        "scale-set deletion {shape:?} seed {seed}: {jobs} jobs ran once each, killed {:.1} s after the outage began, {} withdrawals, {} registrations",
        kill_at.as_secs_f64(),
        withdrawals(&standin),
        standin.count("actions_generate_jitconfig")
    );
}

#[actix_rt::test]
async fn a_scale_set_deleted_under_faults_loses_no_job_github_com_shape() {
    for seed in seeds() {
        run(MessageShape::Dotcom, seed).await;
    }
}

#[actix_rt::test]
async fn a_scale_set_deleted_under_faults_loses_no_job_ghes_shape() {
    for seed in seeds() {
        run(MessageShape::Ghes, seed).await;
    }
}
