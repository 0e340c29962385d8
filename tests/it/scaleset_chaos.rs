//! The scale-set chaos run: the Actions service at its harshest, as the sources describe it,
//! against the daemon binary. Two pools of 3, a backlog larger than the pools, runners that
//! first come up after the service's assignment window (so jobs are withdrawn and assigned
//! again with the same ids), a message of an unknown type at the head of a queue, `null` in
//! every field the service leaves unset, every token expiring every few seconds, a second host
//! refused the session, 20 s of 503 from the whole service, a scale set deleted out of band,
//! and a `kill -9` with jobs queued while the daemon is down. Every job must run once on a
//! runner of its own pool's scale set, no registration may be left, and every poll must have
//! said the pool's whole capacity.
//!
//! The service's assignment window is scaled down from its real ~5 minutes: 3 s while runners
//! are slow, then 15 s, so that three assignments outlast the 503 storm as three real ones
//! outlast a quarter of an hour's outage (a job withdrawn three times is cancelled by the
//! service, whatever the daemon does).
//!
//! Both message shapes, seed 1 of each by default; `SCALESET_CHAOS_SEEDS=N` runs seeds 1..=N
//! of each and `A-B` seeds A..=B (`.ci/run` runs 2-3 after the suite ran 1; docs/benchmarks.md
//! records a run of 5).

use std::time::Duration;

use github_standin::{Fault, RunnerBehavior, Standin, scaleset::MessageShape};
use rand::{RngExt as _, SeedableRng, rngs::SmallRng};

use crate::{
    scaleset::{ALPHA, BETA, ORG_LEVEL, assert_each_job_on_its_pool, standin, two_pools_with},
    scaleset_fidelity::{assert_capacity_always, jobs_not_run, set_id, withdrawals},
    support::{daemon::Daemon, provision::eventually},
};

/// Every endpoint of the Actions service.
pub(crate) const SERVICE: &[&str] = &[
    "actions_admin_connection",
    "actions_get_runner_group",
    "actions_get_scale_set",
    "actions_create_scale_set",
    "actions_get_scale_set_by_id",
    "actions_update_scale_set",
    "actions_create_session",
    "actions_refresh_session",
    "actions_delete_session",
    "actions_acquire_jobs",
    "actions_generate_jitconfig",
    "actions_get_message",
    "actions_delete_message",
    "actions_delete_runner",
];

pub(crate) const SLOTS: usize = 3;

pub(crate) async fn start(standin: &Standin) -> Daemon {
    let daemon = Daemon::start_with_github(
        standin,
        ORG_LEVEL,
        &format!(
            "[webhook]\nmode = \"scaleset\"\n[runner]\nmax_concurrent = {}\n\
             [runner.claim_retry]\nschedule = [\"2s\", \"5s\"]\njitter = 0.0\n",
            SLOTS * 2
        ),
        &two_pools_with(SLOTS, ""),
    )
    .await;
    standin.state().webhook = None;
    daemon
}

/// Queues `n` jobs alternately on the two pools, `gap` (up to) apart.
pub(crate) async fn wave(standin: &Standin, rng: &mut SmallRng, n: usize, gap_ms: u64) {
    for i in 0..n {
        standin.queue_jobs("app", if i % 2 == 0 { ALPHA } else { BETA }, 1);
        tokio::time::sleep(Duration::from_millis(rng.random_range(0..=gap_ms))).await;
    }
}

async fn run(shape: MessageShape, seed: u64) {
    let mut rng = SmallRng::seed_from_u64(seed);
    let standin = standin();
    standin.seed_faults(seed);
    // Runners slower than the window at first: every job of the first wave is withdrawn and
    // assigned again at least once.
    standin.set_behavior(RunnerBehavior {
        job_ms: 300,
        boot_ms: 3500,
        ..RunnerBehavior::default()
    });
    let boot_ms = rng.random_range(200..1500);
    {
        let mut s = standin.state();
        s.scalesets.shape = shape;
        s.scalesets.assign_windows = vec![Duration::from_secs(3)];
        s.scalesets.reassign_delay = Duration::from_millis(rng.random_range(100..1000));
        s.scalesets.queue_token_ttl = Duration::from_secs(5);
        s.scalesets.admin_token_ttl = Duration::from_secs(65);
    }
    let a = start(&standin).await;
    crate::scaleset::wait_listening(&standin, 2).await;

    // A second host for the same scale sets is refused the session and waits, doing nothing.
    let b = start(&standin).await;
    let held = || async {
        let json = b.ctl_json(&["status"]).await;
        json["scalesets"]
            .as_array()
            .is_some_and(|l| l.len() == 2 && l.iter().all(|x| x["state"] == "held_elsewhere"))
    };
    let mut refused = false;
    for _ in 0..100 {
        if held().await {
            refused = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(refused, "the second host was not refused:\n{}", b.logs());
    assert_eq!(b.stop(Duration::from_secs(30)).await.0, Some(0));

    // Something the daemon cannot read at the head of alpha's queue.
    let alpha = set_id(&standin, "alpha");
    standin
        .state()
        .scalesets
        .inject_other(alpha, "RunnerScaleSetSomethingNew", "{}");

    let mut jobs = 0;
    wave(&standin, &mut rng, 12, 100).await;
    jobs += 12;
    eventually(
        "the first wave's jobs are withdrawn and assigned again",
        Duration::from_secs(30),
        || {
            let s = standin.state();
            s.scalesets
                .requests
                .values()
                .filter(|r| r.withdrawals > 0)
                .count()
                >= 6
        },
    )
    .await;
    standin.set_behavior(RunnerBehavior {
        job_ms: 300,
        boot_ms,
        ..RunnerBehavior::default()
    });
    standin.state().scalesets.assign_windows = vec![Duration::from_secs(15)];
    wave(&standin, &mut rng, 12, 100).await;
    jobs += 12;

    // 20 s of 503 from the whole service, jobs still coming.
    tokio::time::sleep(Duration::from_millis(rng.random_range(500..3000))).await;
    for endpoint in SERVICE {
        standin.fail_share(endpoint, 1.0, Fault::http(503, false));
    }
    wave(&standin, &mut rng, 10, 500).await;
    jobs += 10;
    tokio::time::sleep(Duration::from_secs(20).saturating_sub(Duration::from_millis(2500))).await;
    standin.clear_fail_shares();

    // Beta's scale set deleted out of band (GitHub removes ones it thinks unused).
    let beta = set_id(&standin, "beta");
    standin.state().scalesets.delete_set(beta);
    wave(&standin, &mut rng, 6, 200).await;
    jobs += 6;

    // kill -9 mid-stream, jobs queued while no one listens, then the same host again.
    tokio::time::sleep(Duration::from_millis(rng.random_range(500..4000))).await;
    let left = a.kill9().await;
    wave(&standin, &mut rng, 8, 100).await;
    jobs += 8;
    let a = resume_until_done(&standin, left, jobs, &format!("{shape:?} seed {seed}")).await;
    let queues = || {
        standin
            .state()
            .scalesets
            .sets
            .values()
            .map(|s| {
                (
                    s.name.clone(),
                    s.queue
                        .iter()
                        .map(|m| (m.id, m.items.len(), m.other.is_some()))
                        .collect::<Vec<_>>(),
                )
            })
            .collect::<Vec<_>>()
    };
    for _ in 0..300 {
        if queues().iter().all(|(_, q)| q.is_empty()) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        queues().iter().all(|(_, q)| q.is_empty()),
        "{shape:?} seed {seed}: messages never acknowledged: {:?}\n{}",
        queues(),
        a.logs()
    );
    let (code, logs) = a.stop(Duration::from_secs(30)).await;
    assert_eq!(code, Some(0), "{logs}");
    let withdrawals = withdrawals(&standin);
    let registrations = standin.count("actions_generate_jitconfig");
    eprintln!(
        "scale-set chaos {shape:?} seed {seed}: {jobs} jobs ran once each, runners up after {boot_ms} ms (3.5 s at first), {withdrawals} withdrawals, {registrations} registrations"
    );
}

/// The daemon killed (`left`) started again on its state, until the `jobs` queued completed:
/// every one ran once, on its own pool, no registration is left, and every poll said the
/// pool's whole capacity. `run` names the run in a failure.
pub(crate) async fn resume_until_done(
    standin: &Standin,
    left: (tempfile::TempDir, u16),
    jobs: usize,
    run: &str,
) -> Daemon {
    let a = Daemon::resume(standin, left).await;
    standin.state().webhook = None;
    a.wait_completed(standin, jobs, Duration::from_secs(420))
        .await;
    let given_up = jobs_not_run(standin);
    assert!(
        given_up.is_empty(),
        "{run}: jobs that did not run: {given_up:?}\n{}\n{}",
        crate::scaleset_reassign::histories(standin, &given_up),
        a.logs()
    );
    assert_each_job_on_its_pool(standin);
    a.wait_no_runner_left(standin).await;
    assert_capacity_always(standin, SLOTS as u64);
    a
}

/// The seeds to run: `SCALESET_CHAOS_SEEDS=N` is seeds 1 to N, `A-B` seeds A to B (`.ci/run`
/// runs 2-3 in its long step: the suite has run seed 1 already); seed 1 alone by default.
pub(crate) fn seeds() -> std::ops::RangeInclusive<u64> {
    seed_range(std::env::var("SCALESET_CHAOS_SEEDS").ok().as_deref())
}

fn seed_range(text: Option<&str>) -> std::ops::RangeInclusive<u64> {
    let parse = |t: &str| t.trim().parse::<u64>().ok().filter(|n| *n >= 1);
    let Some(text) = text else { return 1..=1 };
    let range = match text.split_once('-') {
        Some((a, b)) => parse(a).zip(parse(b)).map(|(a, b)| a..=b),
        None => parse(text).map(|n| 1..=n),
    };
    match range {
        Some(r) if !r.is_empty() => r,
        _ => panic!("SCALESET_CHAOS_SEEDS is N or A-B (1 <= A <= B), not {text:?}"),
    }
}

#[test]
fn the_seed_setting_is_a_count_or_a_range() {
    assert_eq!(seed_range(None), 1..=1);
    assert_eq!(seed_range(Some("5")), 1..=5);
    assert_eq!(seed_range(Some("2-5")), 2..=5);
    for bad in ["0", "5-2", "x", "2-", ""] {
        assert!(
            std::panic::catch_unwind(|| seed_range(Some(bad))).is_err(),
            "{bad}"
        );
    }
}

#[actix_rt::test]
async fn scaleset_chaos_github_com_shape() {
    for seed in seeds() {
        run(MessageShape::Dotcom, seed).await;
    }
}

#[actix_rt::test]
async fn scaleset_chaos_ghes_shape() {
    for seed in seeds() {
        run(MessageShape::Ghes, seed).await;
    }
}
