//! The durable store's cost per job: how many `queued` jobs per second the intake can make
//! durable (each acknowledged only after its commit), with 1, 16 and 256 deliveries in flight.
//! Group commit lets concurrent deliveries share one fsync. Run with
//! `cargo bench -p ephemer-actors-core --bench store`.

use std::time::Instant;

use ephemer_actors_core::{
    job::{JobInfo, JobKey},
    store::{JobRow, Op, Store},
};

fn row(id: u64) -> JobRow {
    JobRow {
        info: JobInfo {
            key: JobKey::new("acme", id),
            repo: "app".into(),
            run_id: id / 10,
            run_attempt: 1,
            labels: vec!["self-hosted".into(), "linux".into(), "x64".into()].into(),
            ..JobInfo::default()
        },
        received_unix: 1_800_000_000,
        started_unix: None,
    }
}

fn main() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    println!("| deliveries in flight | jobs made durable per second | per job |");
    println!("|---|---|---|");
    for inflight in [1usize, 16, 256] {
        let dir = tempfile::tempdir().unwrap();
        let (store, _) = Store::open(dir.path()).unwrap();
        let jobs = if inflight == 1 { 300 } else { 4000 };
        let started = Instant::now();
        rt.block_on(async {
            let local = tokio::task::LocalSet::new();
            local
                .run_until(async {
                    let mut next = 0u64;
                    let mut running = Vec::new();
                    while next < jobs as u64 || !running.is_empty() {
                        while running.len() < inflight && next < jobs as u64 {
                            let s = store.clone();
                            let id = next;
                            running.push(tokio::task::spawn_local(async move {
                                s.write(vec![Op::AddJob(row(id))]).await
                            }));
                            next += 1;
                        }
                        let first = running.remove(0);
                        first.await.unwrap().unwrap();
                    }
                })
                .await;
        });
        let secs = started.elapsed().as_secs_f64();
        println!(
            "| {inflight} | {:.0} | {:.0} µs |",
            jobs as f64 / secs,
            secs * 1e6 / jobs as f64
        );
    }
}
