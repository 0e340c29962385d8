//! The chaos run: many jobs over two label sets through an embedded instance against the
//! stand-in, with faults at random moments, and a count at the end of what was lost and left.
//!
//! Ignored by default (it takes minutes); `.ci/run` runs it with `CHAOS_JOBS=1000`, and
//! docs/benchmarks.md records a 10,000-job run. `CHAOS_SEED` picks the fault schedule;
//! `CHAOS_ONLY=<fault>` repeats one kind of fault (to see what it costs alone).
//!
//! Faults: 5xx storms and dropped connections on claims, an exhausted rate window, duplicated,
//! replayed and out-of-order deliveries, lost `queued` deliveries (the reconcile finds those), a
//! provisioner panic (its supervisor restarts it), a store that cannot write for 3 s, an
//! abrupt stop of every actor (no drain; runner processes left running, as after `kill -9`)
//! followed by a start on the same state, which adopts them, and a backlog: jobs of two label
//! sets one pool covers, 50 ms apart, runners that take 2 s to come up, and a share of every
//! claim and deletion failing for the whole wave, so older jobs wait on their ladder while the
//! runners made for newer ones come up and, as GitHub hands out the oldest job first, take
//! them. The real `kill -9` of the daemon binary is `durable.rs`'s and `backlog.rs`'s.

use std::time::{Duration, Instant};

use ephemer_actors_core::{
    config::{Config, Environment},
    lifecycle::CrashProvisioner,
    store::StoreFaults,
};
use github_standin::{DeliveryFaults, Fault, RunnerBehavior, Standin};
use rand::{RngExt as _, SeedableRng, rngs::SmallRng};

use crate::support::{
    self,
    daemon::{SECRET, free_port},
};

const LINUX: &[&str] = &["self-hosted", "linux"];
const X64: &[&str] = &["self-hosted", "linux", "x64"];
const MACOS: &[&str] = &["self-hosted", "macos"];

/// Two process pools (two label sets) of stand-in runners, a short ladder, a frequent
/// reconcile, and no claim pacing to speak of (the stand-in has no secondary limit).
fn config(standin: &Standin, state: &std::path::Path) -> Config {
    let bin = env!("CARGO_BIN_EXE_ephemer-actors");
    let text = format!(
        r#"
[github]
api_url = "{api}"
owner = "acme"
repos = ["app"]
token = "ghp_standin_token"
max_claims_per_minute = 6000

[webhook]
listen = "127.0.0.1:{port}"
secret = "{SECRET}"
reconcile_interval = "5s"

[runner]
name_prefix = "chaos"
max_concurrent = 16
shutdown_timeout = "30s"

[runner.claim_retry]
schedule = ["1s", "2s", "4s"]
max_age = "30m"

[runner.orphan_sweep]
grace = "20s"

[state]
dir = "{state}"

[admin]
listen = "127.0.0.1:{admin}"

[providers.local]
command = "{bin}"
args = ["standin-runner"]
labels = ["self-hosted", "linux", "x64"]
max_concurrent = 8
allow_root = true
# Room for a panic a wave when CHAOS_ONLY=ProvisionerPanic (the default budget, 5 a minute,
# rightly keeps a pool that keeps crashing down).
restart = {{ policy = "permanent", max_restarts = 100, within = "1m", backoff = "200ms" }}

[providers.native_macos]
command = "{bin}"
args = ["standin-runner"]
labels = ["self-hosted", "macos", "arm64"]
max_concurrent = 8
allow_root = true
restart = {{ policy = "permanent", max_restarts = 100, within = "1m", backoff = "200ms" }}
"#,
        api = standin.url(),
        port = free_port(),
        admin = free_port(),
        state = state.display(),
    );
    Config::from_toml_str(&text, None, &Environment::default()).unwrap()
}

/// One fault, chosen by the schedule.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Chaos {
    ServerErrors,
    DroppedConnections,
    RateWindow,
    MessyDeliveries,
    LostDeliveries,
    ProvisionerPanic,
    UnwritableStore,
    Restart,
    Backlog,
}

const ALL: [Chaos; 9] = [
    Chaos::ServerErrors,
    Chaos::DroppedConnections,
    Chaos::RateWindow,
    Chaos::MessyDeliveries,
    Chaos::LostDeliveries,
    Chaos::ProvisionerPanic,
    Chaos::UnwritableStore,
    Chaos::Restart,
    Chaos::Backlog,
];

#[actix_rt::test]
#[ignore = "minutes long: run with --ignored (CI does, with CHAOS_JOBS=1000)"]
async fn chaos() {
    let jobs: usize = std::env::var("CHAOS_JOBS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200);
    let seed: u64 = std::env::var("CHAOS_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(7);
    let mut rng = SmallRng::seed_from_u64(seed);
    // CHAOS_LOG=<file>: the instance's log, for finding out what went wrong.
    if let Ok(path) = std::env::var("CHAOS_LOG") {
        let file = std::fs::File::create(path).unwrap();
        let _ = tracing_subscriber::fmt()
            .with_writer(std::sync::Mutex::new(file))
            .with_ansi(false)
            .with_env_filter("info")
            .try_init();
    }
    let standin = support::standin(20);
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let config = config(&standin, &state);
    let faults = StoreFaults::default();
    let (mut handles, mut addr) = crate::embed::instance(&standin, &config, faults.clone());
    let started = Instant::now();

    // Waves of jobs, a fault before each (every kind at least once), alternating label sets.
    // CHAOS_ONLY=<fault> (e.g. `Restart`) repeats one fault, to see what it costs alone.
    let kinds: Vec<Chaos> = match std::env::var("CHAOS_ONLY") {
        Ok(only) => ALL
            .into_iter()
            .filter(|c| format!("{c:?}") == only)
            .collect(),
        Err(_) => ALL.to_vec(),
    };
    assert!(!kinds.is_empty(), "CHAOS_ONLY names none of {ALL:?}");
    let waves = (jobs / 50).max(kinds.len());
    let mut schedule: Vec<Chaos> = kinds.clone();
    while schedule.len() < waves {
        schedule.push(kinds[rng.random_range(0..kinds.len())]);
    }
    let mut queued = 0;
    let mut injected = Vec::new();
    for (wave, chaos) in schedule.iter().enumerate() {
        let left = waves - wave;
        let n = (jobs - queued).div_ceil(left);
        match chaos {
            Chaos::ServerErrors => {
                standin.fail_status("generate_jitconfig", 502, rng.random_range(5..30))
            }
            Chaos::DroppedConnections => {
                standin.fail_next("generate_jitconfig", rng.random_range(2..10), Fault::Drop)
            }
            Chaos::RateWindow => {
                standin.exhaust_for(Duration::from_secs(rng.random_range(2..6)));
            }
            Chaos::MessyDeliveries => standin.set_delivery_faults(DeliveryFaults {
                extra_copies: 1,
                replays: 1,
                drop_next_queued: 0,
                swap_in_progress_and_completed: true,
                ..DeliveryFaults::default()
            }),
            Chaos::LostDeliveries => standin.set_delivery_faults(DeliveryFaults {
                drop_next_queued: rng.random_range(1..10),
                ..DeliveryFaults::default()
            }),
            Chaos::ProvisionerPanic => {
                for pool in handles.provisioners.values() {
                    pool.crash_child.do_send(CrashProvisioner);
                }
            }
            Chaos::UnwritableStore => faults.set_unwritable(true),
            Chaos::Restart => {
                // Every actor stopped at once, no drain: what a `kill -9` leaves (runner
                // processes go on; the store keeps what it acknowledged).
                assert!(handles.halt().await, "the store did not close");
                (handles, addr) = crate::embed::instance(&standin, &config, faults.clone());
            }
            Chaos::Backlog => {
                standin.set_behavior(RunnerBehavior {
                    job_ms: 500,
                    boot_ms: 2000,
                    ..RunnerBehavior::default()
                });
                standin.fail_share("generate_jitconfig", 0.15, Fault::http(502, false));
                standin.fail_share("generate_jitconfig", 0.05, Fault::Drop);
                standin.fail_share("delete_runner", 0.20, Fault::http(500, true));
                standin.set_delivery_faults(DeliveryFaults {
                    duplicate_share: 0.3,
                    replay_old_queued: 10,
                    ..DeliveryFaults::default()
                });
            }
        }
        injected.push(format!("{chaos:?}"));
        for i in 0..n {
            if *chaos == Chaos::Backlog {
                standin.queue_jobs("app", if i % 2 == 0 { X64 } else { LINUX }, 1);
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
            let labels = if (queued + i) % 2 == 0 { LINUX } else { MACOS };
            standin.queue_jobs("app", labels, 1);
        }
        queued += n;
        tokio::time::sleep(Duration::from_millis(rng.random_range(200..1500))).await;
        match chaos {
            Chaos::UnwritableStore => {
                tokio::time::sleep(Duration::from_secs(3)).await;
                faults.set_unwritable(false);
            }
            Chaos::MessyDeliveries | Chaos::LostDeliveries => {
                standin.set_delivery_faults(DeliveryFaults::default())
            }
            Chaos::Backlog => {
                // The faults last while the backlog drains (the jobs of this wave are still
                // queued or on their ladder), then stop.
                tokio::time::sleep(Duration::from_secs(5)).await;
                standin.clear_fail_shares();
                standin.set_delivery_faults(DeliveryFaults::default());
                standin.set_behavior(RunnerBehavior {
                    job_ms: 20,
                    ..RunnerBehavior::default()
                });
            }
            _ => {}
        }
    }

    // Every job runs; then nothing of ours is left.
    let deadline = Instant::now() + Duration::from_secs(120 + jobs as u64 / 5);
    let mut last = (0, Instant::now());
    while standin.jobs_in("completed") < jobs && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let done = standin.jobs_in("completed");
        if done != last.0 {
            last = (done, Instant::now());
        } else if last.1.elapsed() > Duration::from_secs(30) {
            eprintln!("chaos: no progress for 30 s at {done} of {jobs}");
            last.1 = Instant::now();
        }
    }
    let completed = standin.jobs_in("completed");
    if completed < jobs {
        let stuck: Vec<String> = standin
            .jobs()
            .iter()
            .filter(|j| j.status != "completed")
            .map(|j| format!("{} {} {:?}", j.id, j.status, j.runner_name))
            .collect();
        eprintln!("chaos: not completed: {stuck:?}");
        for line in stuck.iter().take(3) {
            let id = line.split(' ').next().unwrap();
            let (_, view) = support::http_get(&addr, &format!("/ci/api/v1/jobs/{id}"))
                .await
                .unwrap_or_default();
            eprintln!("chaos: job {id}: {view}");
        }
    }
    let ran = started.elapsed();
    handles.shutdown(Duration::from_secs(30)).await;
    let registrations_left = standin.runners().len();
    let work = ephemer_actors_core::config::StateConfig::at(state).runner_dir();
    let runners_left = std::fs::read_dir(work)
        .map(|d| {
            d.flatten()
                .filter(|e| e.file_name().to_string_lossy().starts_with("chaos-"))
                .count()
        })
        .unwrap_or(0);
    let claims = standin
        .calls_to("generate_jitconfig")
        .iter()
        .filter(|c| c.status == 201)
        .count();
    println!(
        "chaos (seed {seed}): {jobs} jobs over {waves} waves in {:.0?}; faults {}; \
         jobs run {completed}, jobs lost {}, claims {claims} (extra {}), runners left \
         {runners_left}, registrations left {registrations_left}",
        ran,
        injected.join(","),
        jobs - completed,
        claims.saturating_sub(jobs),
    );
    assert_eq!(completed, jobs, "jobs lost");
    assert_eq!(runners_left, 0, "runner environments left");
    assert_eq!(
        registrations_left,
        0,
        "registrations left: {:?}",
        standin.runners()
    );
}
