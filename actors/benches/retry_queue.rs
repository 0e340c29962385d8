//! Retry-queue cost per job: add (record a failure) and fire (pop due + re-record), at 1k, 10k
//! and 100k parked jobs. Run with `cargo bench -p ephemer-actors-core --bench retry_queue`.
//! Prints one Markdown table row per size; docs/benchmarks.md keeps the latest figures.

use std::time::{Duration, Instant as StdInstant};

use ephemer_actors_core::{
    config::ClaimRetryConfig,
    github::ErrorClass,
    job::{JobInfo, JobKey},
    retry::{Backoff, Failure, RetryQueue},
};
use rand::{SeedableRng, rngs::SmallRng};
use tokio::time::Instant;

fn job(id: u64) -> JobInfo {
    JobInfo {
        key: JobKey::new("acme", id),
        repo: "app".into(),
        run_id: id / 10,
        run_attempt: 1,
        labels: vec!["self-hosted".into(), "linux".into(), "x64".into()],
        runner_name: None,
        runner_id: None,
        conclusion: None,
        installation_id: None,
    }
}

fn main() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let _guard = rt.enter();
    let failure = Failure {
        class: ErrorClass::ServerSide,
        retry_after: None,
        message: "502".into(),
    };
    println!("| parked jobs | add per job | fire + re-add per job |");
    println!("|---|---|---|");
    for n in [1_000u64, 10_000, 100_000] {
        let backoff = Backoff::try_new(&ClaimRetryConfig::default()).unwrap();
        let mut q = RetryQueue::new(backoff);
        let mut rng = SmallRng::seed_from_u64(1);
        let jobs: Vec<JobInfo> = (0..n).map(job).collect();
        let t0 = Instant::now();
        let started = StdInstant::now();
        for j in &jobs {
            q.record_failure(j.clone(), &failure, t0, 0, None, &mut rng);
        }
        let add = started.elapsed();
        let later = t0 + Duration::from_secs(3600);
        let started = StdInstant::now();
        let due = q.pop_due(later);
        for (j, _) in due {
            q.record_failure(j, &failure, later, 0, None, &mut rng);
        }
        let fire = started.elapsed();
        assert_eq!(q.len() as u64, n);
        println!(
            "| {n} | {:.2} µs | {:.2} µs |",
            add.as_secs_f64() * 1e6 / n as f64,
            fire.as_secs_f64() * 1e6 / n as f64
        );
    }
}
