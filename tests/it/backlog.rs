//! The backlog run: the real `serve` binary against a stand-in GitHub that, like GitHub, hands
//! each runner the **oldest** queued job its labels cover, while faults keep older jobs on
//! their ladder as newer runners come up. Every runner made for a new job then takes an older
//! one first (fungibility working as designed), and the newest jobs must still run.
//!
//! 100 jobs over two label sets (`[self-hosted, linux, x64]` and `[self-hosted, linux]`), one
//! pool `[self-hosted, linux, x64]` with 16 slots, jobs 0.5 s long, delivered 50 ms apart;
//! 15 % of `generate-jitconfig` calls answer 502 and 5 % drop the connection, 20 % of runner
//! deletions answer 500, 30 % of deliveries come twice, 10 old `queued` deliveries replayed,
//! a 3 s exhausted rate window at job 40 and a `kill -9` and restart at job 60. Reconcile every
//! 20 s, ladder 1 s / 2 s / 3 s, `max_age` 120 s.
//!
//! `backlog_ci` runs three seeds on every CI run; `backlog` (ignored) runs `BACKLOG_SEEDS`
//! (default `1..=10`) for docs/benchmarks.md. Each asserts 0 jobs lost, 0 registrations and 0
//! environments left, and prints the extra claims and the deletions GitHub answered 404.

use std::time::{Duration, Instant};

use github_standin::{DeliveryFaults, Fault, Standin};

use crate::support::{
    self,
    daemon::{Daemon, SECRET, TOKEN},
};

const X64: &[&str] = &["self-hosted", "linux", "x64"];
const LINUX: &[&str] = &["self-hosted", "linux"];

/// How long a runner takes to come up before GitHub hands it a job (the real runner starts
/// its listener and opens a session first: seconds). Older jobs wait on their ladder
/// meanwhile, so newer runners take them.
const BOOT_MS: u64 = 2000;

/// What one run measured (printed whole, for docs/benchmarks.md).
#[derive(Debug)]
#[allow(dead_code)]
struct Outcome {
    lost: usize,
    claims: usize,
    extra: usize,
    registrations_left: usize,
    environments_left: usize,
    deletes_404: usize,
    claim_failures: usize,
    delete_failures: usize,
    took: Duration,
}

fn config(standin: &Standin, port: u16, state: &std::path::Path, admin: u16) -> String {
    let bin = env!("CARGO_BIN_EXE_ephemer-actors");
    format!(
        r#"
[github]
api_url = "{api}"
owner = "acme"
repos = ["app"]
token = "{TOKEN}"

[webhook]
listen = "127.0.0.1:{port}"
secret = "{SECRET}"
reconcile_interval = "20s"

[runner]
name_prefix = "b{port}"
max_concurrent = 16
shutdown_timeout = "30s"

[runner.claim_retry]
schedule = ["1s", "2s", "3s"]
max_age = "120s"

[state]
dir = "{state}"

[admin]
listen = "127.0.0.1:{admin}"

[log]
level = "debug"

[providers.local]
command = "{bin}"
args = ["standin-runner"]
labels = ["self-hosted", "linux", "x64"]
max_concurrent = 16
allow_root = true
"#,
        api = standin.url(),
        state = state.display(),
    )
}

async fn run(seed: u64) -> Outcome {
    let standin = support::standin(500);
    standin.set_behavior(github_standin::RunnerBehavior {
        job_ms: 500,
        boot_ms: std::env::var("BACKLOG_BOOT_MS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(BOOT_MS),
        ..github_standin::RunnerBehavior::default()
    });
    standin.seed_faults(seed);
    let admin = support::daemon::free_port();
    let daemon =
        Daemon::start_config(|port, state| config(&standin, port, state, admin), &[]).await;
    standin.send_webhooks_to(&format!("http://{}/webhook/github", daemon.addr), SECRET);
    standin.fail_share("generate_jitconfig", 0.15, Fault::http(502, false));
    standin.fail_share("generate_jitconfig", 0.05, Fault::Drop);
    standin.fail_share("delete_runner", 0.20, Fault::http(500, true));
    standin.set_delivery_faults(DeliveryFaults {
        duplicate_share: 0.30,
        replay_old_queued: 10,
        ..DeliveryFaults::default()
    });
    let started = Instant::now();
    let jobs = 100;
    let mut daemon = Some(daemon);
    for i in 0..jobs {
        if i == 40 {
            standin.exhaust_for(Duration::from_secs(3));
        }
        if i == 60 {
            let left = daemon.take().unwrap().kill9().await;
            daemon = Some(Daemon::resume(&standin, left).await);
        }
        standin.queue_jobs("app", if i % 2 == 0 { X64 } else { LINUX }, 1);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let daemon = daemon.unwrap();
    let deadline = Instant::now() + Duration::from_secs(360);
    while standin.jobs_in("completed") < jobs && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let took = started.elapsed();
    let completed = standin.jobs_in("completed");
    if completed < jobs {
        for job in standin.jobs().iter().filter(|j| j.status != "completed") {
            let (_, _, view) = daemon.ctl(&["jobs", &job.id.to_string()]).await;
            eprintln!(
                "backlog (seed {seed}): job {} {}:\n{view}",
                job.id, job.status
            );
        }
    }
    // Every registration made is deleted or bound to a job: the ones left now are spares the
    // sweep discharges, or deletions that failed and are tried again.
    let settle = Instant::now() + Duration::from_secs(60);
    while !standin.runners().is_empty() && Instant::now() < settle {
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let registrations_left = standin.runners().len();
    let work = daemon.runner_dir();
    let (code, logs) = daemon.stop(Duration::from_secs(60)).await;
    assert_eq!(code, Some(0), "the drain failed:\n{logs}");
    let environments_left = std::fs::read_dir(work)
        .map(|d| {
            d.flatten()
                .filter(|e| e.file_name().to_string_lossy().starts_with('b'))
                .count()
        })
        .unwrap_or(0);
    let claims = standin
        .calls_to("generate_jitconfig")
        .iter()
        .filter(|c| c.status == 201)
        .count();
    let deletes_404 = standin
        .calls_to("delete_runner")
        .iter()
        .filter(|c| c.status == 404)
        .count();
    let claim_failures = standin
        .calls_to("generate_jitconfig")
        .iter()
        .filter(|c| c.status != 201)
        .count();
    let delete_failures = standin
        .calls_to("delete_runner")
        .iter()
        .filter(|c| c.status >= 500)
        .count();
    let outcome = Outcome {
        claim_failures,
        delete_failures,
        lost: jobs - completed,
        claims,
        extra: claims.saturating_sub(jobs),
        registrations_left,
        environments_left,
        deletes_404,
        took,
    };
    println!("backlog (seed {seed}): {outcome:?}");
    if let Ok(dir) = std::env::var("BACKLOG_LOGS") {
        std::fs::write(format!("{dir}/backlog-{seed}.log"), &logs).unwrap();
    }
    if outcome.lost > 0 || outcome.registrations_left > 0 {
        eprintln!(
            "backlog (seed {seed}): registrations left {:?}\n{logs}",
            standin.runners()
        );
    }
    outcome
}

async fn seeds(seeds: impl IntoIterator<Item = u64>) {
    let mut failed = Vec::new();
    for seed in seeds {
        let o = run(seed).await;
        if o.lost > 0 || o.registrations_left > 0 || o.environments_left > 0 {
            failed.push((seed, o));
        }
    }
    assert!(
        failed.is_empty(),
        "runs that lost or left something: {failed:#?}"
    );
}

#[actix_rt::test]
async fn backlog_ci() {
    seeds([1, 2, 3]).await;
}

#[actix_rt::test]
#[ignore = "ten runs of a minute or more: run with --ignored for docs/benchmarks.md"]
async fn backlog() {
    let range = std::env::var("BACKLOG_SEEDS").unwrap_or_else(|_| "1..=10".into());
    let (lo, hi) = range
        .split_once("..=")
        .map(|(a, b)| (a.parse().unwrap(), b.parse().unwrap()))
        .unwrap_or_else(|| (range.parse().unwrap(), range.parse().unwrap()));
    seeds(lo..=hi).await;
}
