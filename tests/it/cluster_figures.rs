//! Fleet-mode figures for docs/benchmarks.md (ignored by default; it measures, it does not
//! assert times): run with
//! `cargo test --release --test it cluster_figures -- --ignored --nocapture`.
//!
//! - claim decisions per second across three hosts: three `Ledger` handles (three host
//!   names) deciding 2,000 recorded jobs at once against one PostgreSQL;
//! - database round trips per job: PostgreSQL's own count of committed transactions
//!   (`pg_stat_database.xact_commit`) over a 300-job run of three `serve` processes, divided
//!   by the jobs (heartbeats and event reads included);
//! - the webhook -> claim latency the ledger adds: the mean of `ephemerd_job_queue_wait_seconds`
//!   (webhook to runner started) minus `ephemerd_job_startup_seconds` (claim to runner
//!   started), for one host without `[cluster]` and for a three-host fleet, same jobs, paced
//!   so no job waits for a slot.

use std::time::{Duration, Instant};

use ephemer_actors_core::{
    cluster::{Acquire, Ledger},
    config::{Config, Environment},
    job::{JobAction, JobInfo, JobKey},
};

use crate::{
    cluster::{pool, route_to},
    support::{self, daemon::Daemon, postgres::Postgres},
};

const LINUX: &[&str] = &["self-hosted", "linux", "x64"];
/// Claims are not paced in these runs (the stand-in has no secondary limit): the figures are
/// the daemon's and the ledger's, not the window's.
const UNPACED: &str = "max_claims_per_minute = 10000";

fn ledger_config(pg: &Postgres, host: &str) -> Config {
    let text = format!(
        r#"
[github]
api_url = "http://127.0.0.1:9"
owner = "acme"
token = "ghp_bench"
max_claims_per_minute = 10000
[webhook]
secret = "s"
[state]
dir = "/tmp/ephemer-bench-{host}"
[providers.local]
command = "/bin/true"
allow_root = true
[cluster]
url = "{url}"
host = "{host}"
"#,
        url = pg.url()
    );
    Config::from_toml_str(&text, None, &Environment::default()).expect("bench config")
}

async fn claims_per_second(pg: &Postgres) -> (f64, u64) {
    let mut ledgers = Vec::new();
    for host in ["b1", "b2", "b3"] {
        let config = ledger_config(pg, host);
        let cluster = config.cluster.clone().unwrap();
        let ledger = Ledger::connect(&cluster, &config, Duration::from_secs(10))
            .await
            .unwrap();
        ledger
            .heartbeat(&serde_json::json!([]), 0, 4, &Default::default())
            .await
            .unwrap();
        ledgers.push(ledger);
    }
    const JOBS: u64 = 2000;
    let info = |id: u64| JobInfo {
        key: JobKey::new("acme", 900_000 + id),
        repo: "app".into(),
        labels: LINUX.iter().map(|l| l.to_string()).collect(),
        ..JobInfo::default()
    };
    for id in 0..JOBS {
        ledgers[(id % 3) as usize]
            .record(JobAction::Queued, &info(id))
            .await
            .unwrap();
    }
    let trips_before: u64 = ledgers.iter().map(Ledger::round_trips).sum();
    let started = Instant::now();
    let tasks: Vec<_> = ledgers
        .iter()
        .cloned()
        .enumerate()
        .map(|(i, ledger)| {
            actix_rt::spawn(async move {
                let mut granted = 0u64;
                // Each host walks the jobs from its own offset, as hosts hearing the same
                // events in a different order would.
                for n in 0..JOBS {
                    let id = (n + i as u64 * JOBS / 3) % JOBS;
                    if ledger.acquire(&info(id)).await.unwrap() == Acquire::Granted {
                        granted += 1;
                    }
                }
                granted
            })
        })
        .collect();
    let mut granted = 0;
    for t in tasks {
        granted += t.await.unwrap();
    }
    let elapsed = started.elapsed().as_secs_f64();
    assert_eq!(granted, JOBS, "each job granted once");
    let trips: u64 = ledgers.iter().map(Ledger::round_trips).sum::<u64>() - trips_before;
    (JOBS as f64 / elapsed, trips / 3)
}

fn xact_commits(pg: &Postgres) -> u64 {
    pg.query("SELECT xact_commit FROM pg_stat_database WHERE datname = 'ephemer'")[0]
        .parse()
        .unwrap()
}

/// Mean seconds of a histogram (`_sum / _count`) summed over `texts`.
fn mean(texts: &[String], name: &str) -> f64 {
    let value = |suffix: &str| -> f64 {
        texts
            .iter()
            .flat_map(|t| t.lines())
            .filter(|l| l.starts_with(&format!("{name}_{suffix} ")))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    };
    value("sum") / value("count").max(1.0)
}

/// Mean webhook -> claim milliseconds over `jobs` jobs delivered 250 ms apart.
async fn webhook_to_claim_ms(
    standin: &github_standin::Standin,
    hosts: &[Daemon],
    jobs: usize,
) -> f64 {
    let done = standin.jobs_in("completed");
    for _ in 0..jobs {
        standin.queue_jobs("app", LINUX, 1);
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let deadline = Instant::now() + Duration::from_secs(120);
    while standin.jobs_in("completed") < done + jobs && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut texts = Vec::new();
    for d in hosts {
        texts.push(d.metrics().await);
    }
    (mean(&texts, "ephemerd_job_queue_wait_seconds") - mean(&texts, "ephemerd_job_startup_seconds"))
        * 1000.0
}

#[actix_rt::test]
#[ignore = "measures; run by hand for docs/benchmarks.md"]
async fn cluster_figures() {
    let Some(pg) = Postgres::start() else { return };
    let (per_second, trips) = claims_per_second(&pg).await;
    println!(
        "claim decisions across 3 hosts: {per_second:.0}/s ({trips} round trips for 2000 decisions per host)"
    );

    // One host alone, no ledger.
    let standin = support::standin(50);
    let single = Daemon::start_with_github(
        &standin,
        UNPACED,
        "[runner]\nmax_concurrent = 4\nshutdown_timeout = \"10s\"",
        &pool("cpu", LINUX, 4),
    )
    .await;
    let alone = webhook_to_claim_ms(&standin, std::slice::from_ref(&single), 40).await;
    single.stop(Duration::from_secs(30)).await;

    // Three hosts on the ledger, deliveries to a random one.
    let standin = support::standin(50);
    let mut hosts = Vec::new();
    for host in ["h1", "h2", "h3"] {
        let extra = format!(
            "[runner]\nmax_concurrent = 4\nshutdown_timeout = \"10s\"\n\n[cluster]\nurl = \"{}\"\nhost = \"{host}\"\n",
            pg.url()
        );
        hosts.push(
            Daemon::start_with_github(&standin, UNPACED, &extra, &pool("cpu", LINUX, 4)).await,
        );
    }
    route_to(&standin, &hosts, 0.0);
    let fleet = webhook_to_claim_ms(&standin, &hosts, 40).await;

    // Round trips per job over a 300-job burst (a third of the deliveries to every host).
    route_to(&standin, &hosts, 1.0 / 3.0);
    let before = xact_commits(&pg);
    let started = Instant::now();
    let done = standin.jobs_in("completed");
    standin.queue_jobs("app", LINUX, 300);
    while standin.jobs_in("completed") < done + 300 {
        assert!(started.elapsed() < Duration::from_secs(600));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let elapsed = started.elapsed().as_secs_f64();
    let per_job = (xact_commits(&pg) - before) as f64 / 300.0;
    println!(
        "| webhook -> claim, mean | one host, no ledger: {alone:.1} ms | three hosts: {fleet:.1} ms | added: {:.1} ms |",
        fleet - alone
    );
    println!(
        "| 300-job burst, 3 hosts x 4 slots | {elapsed:.1} s | {:.1} jobs/s | {per_job:.1} transactions per job |",
        300.0 / elapsed
    );
    for d in hosts {
        d.stop(Duration::from_secs(30)).await;
    }
}
