//! Fleet-mode figures for docs/benchmarks.md (ignored by default; it measures, it does not
//! assert times): run with
//! `cargo test --release --test it cluster_figures -- --ignored --nocapture`.
//!
//! - claim decisions per second across three hosts: three `Ledger` handles (three host
//!   names) deciding 2,000 recorded jobs at once against one PostgreSQL;
//! - database round trips per job: the statements the daemons sent (`pg_stat_statements`),
//!   on the happy path (40 jobs, each delivered to one host, the idle fleet's own taken out,
//!   with the statements by kind) and over a 300-job burst of three `serve` processes with a
//!   third of the deliveries sent to every host (heartbeats included);
//! - the webhook -> claim latency the ledger adds: per job, the stand-in's queueing (which
//!   sends the delivery) to the claim's arrival, p50 and p90 (and the mean from the hosts'
//!   metrics: `ephemerd_job_queue_wait_seconds` minus `ephemerd_job_startup_seconds`), for one
//!   host without `[cluster]` and for a three-host fleet, same jobs, paced so no job waits for
//!   a slot.

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

pub(crate) fn ledger_config(pg: &Postgres, host: &str) -> Config {
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

/// Statements the daemons sent to the ledger so far (`pg_stat_statements`, the test's own
/// queries left out). Each is a round trip, or less: a mirror batch sends several in one.
/// (`pg_stat_database.xact_commit` is no measure at this scale: PostgreSQL 15 flushes it
/// lazily, and every `psql` call adds its own.)
fn statement_calls(pg: &Postgres) -> u64 {
    pg.query(
        "SELECT coalesce(sum(calls), 0) FROM pg_stat_statements
         WHERE dbid = (SELECT oid FROM pg_database WHERE datname = 'ephemer')
           AND query NOT LIKE '%pg_stat%'",
    )[0]
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

/// Webhook -> claim over `jobs` jobs delivered 250 ms apart: (mean from the hosts' metrics,
/// the per-job p50 and p90 from the stand-in: each job's queueing, which sends its delivery,
/// against its claim's arrival, in order, as no two are in flight at once).
async fn webhook_to_claim_ms(
    standin: &github_standin::Standin,
    hosts: &[Daemon],
    jobs: usize,
) -> (f64, f64, f64) {
    let done = standin.jobs_in("completed");
    let claims_before = claim_times(standin).len();
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
    let mean_ms = (mean(&texts, "ephemerd_job_queue_wait_seconds")
        - mean(&texts, "ephemerd_job_startup_seconds"))
        * 1000.0;
    let mut queued: Vec<u128> = standin.jobs().iter().map(|j| j.queued_at_ms).collect();
    queued.sort_unstable();
    let claims = claim_times(standin);
    let mut waits: Vec<u128> = queued[claims_before..]
        .iter()
        .zip(&claims[claims_before..])
        .map(|(q, c)| c.saturating_sub(*q))
        .collect();
    waits.sort_unstable();
    let at = |p: f64| waits[((waits.len() as f64 * p) as usize).min(waits.len() - 1)] as f64;
    (mean_ms, at(0.5), at(0.9))
}

/// Round trips the hosts made to the ledger so far (`ephemerd_ledger_round_trips_total`,
/// summed; the metric is brought up to date every 250 ms).
async fn round_trips(hosts: &[Daemon]) -> f64 {
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut sum = 0.0;
    for d in hosts {
        sum += crate::support::series(&d.metrics().await, "ephemerd_ledger_round_trips_total");
    }
    sum
}

/// When each successful generate-jitconfig call arrived, in order.
fn claim_times(standin: &github_standin::Standin) -> Vec<u128> {
    let mut at: Vec<u128> = standin
        .calls_to("generate_jitconfig")
        .iter()
        .filter(|c| c.status == 201)
        .map(|c| c.at_ms)
        .collect();
    at.sort_unstable();
    at
}

/// The statements the daemons sent since the last reset, most called first (first 70
/// characters of each, whitespace folded).
fn statements(pg: &Postgres) -> Vec<String> {
    pg.query(
        "SELECT calls || ' | ' || left(regexp_replace(query, '\\s+', ' ', 'g'), 70)
         FROM pg_stat_statements
         WHERE dbid = (SELECT oid FROM pg_database WHERE datname = 'ephemer')
           AND query NOT LIKE '%pg_stat_%'
         ORDER BY calls DESC LIMIT 14",
    )
}

#[actix_rt::test]
#[ignore = "measures; run by hand for docs/benchmarks.md"]
async fn cluster_figures() {
    let Some(pg) = Postgres::start() else { return };
    let pg = pg.with_statement_stats();
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
    let (alone, alone_p50, alone_p90) =
        webhook_to_claim_ms(&standin, std::slice::from_ref(&single), 40).await;
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
    // The fleet's idle cost (heartbeats, backstop reads) over 12 s, to take out of the per-job
    // figure below.
    let idle_before = statement_calls(&pg);
    let idle_trips_before = round_trips(&hosts).await;
    tokio::time::sleep(Duration::from_secs(12)).await;
    let idle_per_second = (statement_calls(&pg) - idle_before) as f64 / 12.0;
    let idle_trips = (round_trips(&hosts).await - idle_trips_before) / 12.0;
    // The happy path: each delivery to one host, jobs 250 ms apart (no slot contention).
    pg.query("SELECT pg_stat_statements_reset()");
    let before = statement_calls(&pg);
    let trips_before = round_trips(&hosts).await;
    let started = Instant::now();
    let (fleet, fleet_p50, fleet_p90) = webhook_to_claim_ms(&standin, &hosts, 40).await;
    // The last lazy changes go within a second.
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let happy =
        (statement_calls(&pg) - before) as f64 - idle_per_second * started.elapsed().as_secs_f64();
    let trips =
        round_trips(&hosts).await - trips_before - idle_trips * started.elapsed().as_secs_f64();
    println!(
        "| happy path: 40 jobs, one delivery each | {:.1} statements per job (idle fleet: {idle_per_second:.1}/s, taken out) | {:.2} round trips per job (idle fleet: {idle_trips:.1}/s, taken out) |",
        happy / 40.0,
        trips / 40.0
    );
    println!("statements over the happy path (calls | statement):");
    for line in statements(&pg) {
        println!("    {line}");
    }

    // Statements per job over a 300-job burst (a third of the deliveries to every host).
    route_to(&standin, &hosts, 1.0 / 3.0);
    let before = statement_calls(&pg);
    let started = Instant::now();
    let done = standin.jobs_in("completed");
    standin.queue_jobs("app", LINUX, 300);
    while standin.jobs_in("completed") < done + 300 {
        assert!(started.elapsed() < Duration::from_secs(600));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let elapsed = started.elapsed().as_secs_f64();
    let per_job = (statement_calls(&pg) - before) as f64 / 300.0;
    println!(
        "| webhook -> claim, mean | one host, no ledger: {alone:.1} ms | three hosts: {fleet:.1} ms | added: {:.1} ms |",
        fleet - alone
    );
    println!(
        "| webhook -> claim, p50 / p90 | one host: {alone_p50:.0} / {alone_p90:.0} ms | three hosts: {fleet_p50:.0} / {fleet_p90:.0} ms | added at p50: {:.0} ms |",
        fleet_p50 - alone_p50
    );
    println!(
        "| 300-job burst, 3 hosts x 4 slots | {elapsed:.1} s | {:.1} jobs/s | {per_job:.1} statements per job (idle ones included) |",
        300.0 / elapsed
    );
    for d in hosts {
        d.stop(Duration::from_secs(30)).await;
    }
}
