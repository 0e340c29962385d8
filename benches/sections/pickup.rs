//! Pickup latency: webhook -> JIT call (and -> runner started) at 200 deliveries a second, first
//! with runners that cost next to nothing to start (`/bin/sleep`, exec'd directly: the
//! daemon's own share), then with real stand-in runners that take their job and finish.

use std::time::{Duration, Instant as StdInstant};

use ephemer_actors_core::{clock::Clock, github::signature::sign, metrics::Metrics, system};
use github_standin::{RunnerBehavior, Standin, StandinConfig};

use super::{SECRET, body, config, percentiles, serve_intake};

const TOTAL: u64 = 1000;

/// The section: prints its table rows.
pub async fn pickup() {
    println!("\n## Pickup latency\n");
    println!("| 1,000 queued webhooks at 200/s | p50 | p99 |");
    println!("|---|---|---|");
    let (j50, j99) = with_sleep().await;
    println!(
        "| webhook sent -> JIT call, runners `/bin/sleep` (target p50 <= 2 ms, p99 <= 10 ms) | {j50:.1} ms | {j99:.1} ms |"
    );
    let run = with_standin_runners(Duration::from_millis(5), TOTAL).await;
    let ((j50, j99), (r50, r99)) = (run.to_claim, run.to_pick);
    println!("| queued -> JIT call, real stand-in runners | {j50:.1} ms | {j99:.1} ms |");
    println!(
        "| queued -> job taken by its runner, real stand-in runners | {r50:.1} ms | {r99:.1} ms |"
    );
    let (u50, u99) = run.to_up;
    println!("| queued -> its runner up and asking for a job | {u50:.1} ms | {u99:.1} ms |");
    let (w50, w99) = run.runner_wait;
    println!("| runner up -> job taken (the runner's own wait) | {w50:.1} ms | {w99:.1} ms |");
    // Issue 42's rate: 200 jobs a minute, process runners.
    let run = with_standin_runners(Duration::from_millis(300), SLOW_TOTAL).await;
    let ((j50, j99), (r50, r99)) = (run.to_claim, run.to_pick);
    println!(
        "\n| {SLOW_TOTAL} jobs queued at 200 a minute, stand-in process runners | p50 | p99 |"
    );
    println!("|---|---|---|");
    println!("| queued -> JIT call | {j50:.1} ms | {j99:.1} ms |");
    println!(
        "| queued -> job taken by its runner (target p50 <= 20 ms, p99 <= 100 ms) | {r50:.1} ms | {r99:.1} ms |"
    );
    let (u50, u99) = run.to_up;
    println!(
        "| queued -> its runner up and asking for a job (the daemon's share, with the runner process's start) | {u50:.1} ms | {u99:.1} ms |"
    );
    let (w50, w99) = run.runner_wait;
    println!(
        "| runner up -> job taken (the stand-in runner's own wait; it polls every {POLL_MS} ms) | {w50:.1} ms | {w99:.1} ms |"
    );
    println!(
        "| of which claim answered -> runner process started (the daemon's provisioning), mean | {:.1} ms | |",
        run.startup_mean
    );
}

/// Jobs of the 200-a-minute run.
const SLOW_TOTAL: u64 = 100;
/// The stand-in runner's wait between polls for a job.
const POLL_MS: u64 = 100;

/// What one run with stand-in runners measured.
struct RunnerRun {
    /// Queued (the stand-in's clock) -> JIT call, p50 / p99 ms.
    to_claim: (f64, f64),
    /// Queued -> the job taken by its runner, p50 / p99 ms.
    to_pick: (f64, f64),
    /// Queued -> the job's runner first asking for a job, p50 / p99 ms.
    to_up: (f64, f64),
    /// The runner's first ask -> the job taken, p50 / p99 ms.
    runner_wait: (f64, f64),
    /// Claim answered -> runner process started (the daemon's provisioning), mean ms.
    startup_mean: f64,
}

/// The i-th sent paired with the i-th claim: deliveries are claimed first come, first served.
fn paired(sent_ms: &[u128], mut at_ms: Vec<u128>) -> (f64, f64) {
    at_ms.sort_unstable();
    let lat: Vec<f64> = sent_ms
        .iter()
        .zip(&at_ms)
        .map(|(s, c)| c.saturating_sub(*s) as f64)
        .collect();
    assert!(!lat.is_empty(), "nothing was claimed");
    percentiles(lat)
}

fn claim_ms(standin: &Standin) -> Vec<u128> {
    standin
        .calls_to("generate_jitconfig")
        .iter()
        .map(|c| c.at_ms)
        .collect()
}

async fn wait_for(what: impl Fn() -> bool) {
    let deadline = StdInstant::now() + Duration::from_secs(90);
    while !what() && StdInstant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Our own signed deliveries at 200/s; each runner is `/bin/sleep 600`.
async fn with_sleep() -> (f64, f64) {
    let standin = Standin::start(StandinConfig::default()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(
        &standin.url(),
        &dir.path().join("state"),
        "[runner]\nmax_concurrent = 2000\n",
        "/bin/sleep",
        "[\"600\"]",
    );
    let handles = system::start(&cfg, Metrics::new(), Clock::real(), Default::default()).unwrap();
    let url = serve_intake(&handles);
    let client = awc::Client::default();
    let mut sent_ms = Vec::new();
    let mut tick = tokio::time::interval(Duration::from_millis(5));
    let mut pending = Vec::new();
    for i in 0..TOTAL {
        tick.tick().await;
        let b = body(2_000_000 + i, &["self-hosted", "linux"]);
        let sig = sign(SECRET.as_bytes(), b.as_bytes());
        sent_ms.push(github_standin::unix_now_ms());
        let req = client
            .post(&url)
            .insert_header(("X-GitHub-Event", "workflow_job"))
            .insert_header(("X-Hub-Signature-256", sig))
            .insert_header(("Content-Type", "application/json"));
        pending.push(actix_rt::spawn(async move {
            req.send_body(b).await.map(|r| r.status().as_u16())
        }));
    }
    for p in pending {
        let _ = p.await;
    }
    wait_for(|| standin.count("generate_jitconfig") as u64 >= TOTAL).await;
    let latency = paired(&sent_ms, claim_ms(&standin));
    handles.shutdown(Duration::ZERO).await;
    latency
}

/// The stand-in queues `total` jobs, one every `every`, and delivers each (its sender sends
/// many deliveries at once, as GitHub does); stand-in runners take their jobs (100 ms each)
/// and go.
async fn with_standin_runners(every: Duration, total: u64) -> RunnerRun {
    let standin = Standin::start(StandinConfig::default()).unwrap();
    standin.set_behavior(RunnerBehavior {
        job_ms: 100,
        ..RunnerBehavior::default()
    });
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(
        &standin.url(),
        &dir.path().join("state"),
        "[runner]\nmax_concurrent = 2000\n",
        env!("CARGO_BIN_EXE_ephemer-actors"),
        "[\"standin-runner\"]",
    );
    let handles = system::start(&cfg, Metrics::new(), Clock::real(), Default::default()).unwrap();
    let url = serve_intake(&handles);
    standin.send_webhooks_to(&url, SECRET);
    let mut tick = tokio::time::interval(every);
    for _ in 0..total {
        tick.tick().await;
        standin.queue_jobs("app", &["self-hosted", "linux"], 1);
    }
    wait_for(|| standin.jobs_in("completed") as u64 >= total).await;
    let jobs = standin.jobs();
    let mut sent_ms: Vec<u128> = jobs.iter().map(|j| j.queued_at_ms).collect();
    sent_ms.sort_unstable();
    let picked: Vec<u128> = jobs.iter().filter_map(|j| j.picked_at_ms).collect();
    let to_claim = paired(&sent_ms, claim_ms(&standin));
    let to_pick = paired(&sent_ms, picked);
    // Per job, not paired: its own runner's first ask, and the job taken.
    let per_job = |f: &dyn Fn(&github_standin::Job) -> Option<f64>| {
        percentiles(jobs.iter().filter_map(f).collect())
    };
    let to_up = per_job(&|j| {
        j.runner_up_at_ms
            .map(|up| up.saturating_sub(j.queued_at_ms) as f64)
    });
    let runner_wait = per_job(&|j| Some(j.picked_at_ms?.saturating_sub(j.runner_up_at_ms?) as f64));
    let startup = &handles.metrics.job_startup;
    let startup_mean = startup.get_sample_sum() * 1000.0 / startup.get_sample_count().max(1) as f64;
    handles.shutdown(Duration::from_secs(30)).await;
    RunnerRun {
        to_claim,
        to_pick,
        to_up,
        runner_wait,
        startup_mean,
    }
}
