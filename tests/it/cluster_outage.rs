//! A ledger outage in a fleet, as operators run it: two hosts on one PostgreSQL, GitHub's
//! redelivery on, the ledger stopped for 8 s while 10 jobs queue (their deliveries answered
//! 503, as designed), under a CPU hog. Every refused job runs within two redelivery intervals
//! of the ledger's return, for each seed (deliveries to one host, or half of them to both).

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use crate::{
    cluster::{LINUX, extra, pool, route_to},
    support::{
        self,
        daemon::Daemon,
        fleet::{logs, wait_no_registration_left},
        postgres::Postgres,
    },
};

const PUBLIC_URL: &str = "https://ci.example.com/webhook/github";
const INTERVAL: Duration = Duration::from_secs(10);

/// Both cores kept busy until dropped.
struct CpuHog(Arc<AtomicBool>);

impl CpuHog {
    fn start() -> CpuHog {
        let stop = Arc::new(AtomicBool::new(false));
        for _ in 0..2 {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut x = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
                    std::hint::black_box(x);
                }
            });
        }
        CpuHog(stop)
    }
}

impl Drop for CpuHog {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

#[actix_rt::test]
async fn jobs_refused_while_the_ledger_is_down_run_within_two_redelivery_intervals() {
    // Each delivery to one host at random, or half of them to both (a balancer's retries).
    for (seed, both) in [(1u64, 0.0), (2, 0.5), (3, 0.5)] {
        // A ledger of its own per seed: the stand-in numbers its jobs from the start again.
        let Some(pg) = Postgres::start() else { return };
        let standin = support::standin(1500);
        standin.seed_faults(seed);
        standin.add_hook(crate::redeliver::org_hook(7, PUBLIC_URL));
        standin.set_public_url(PUBLIC_URL);
        let webhook = format!(
            "[webhook]\npublic_url = \"{PUBLIC_URL}\"\nredeliver_interval = \"{}s\"\n",
            INTERVAL.as_secs()
        );
        let mut hosts = Vec::new();
        for host in [format!("s{seed}a"), format!("s{seed}b")] {
            let more = format!("{webhook}\n[runner.orphan_sweep]\ngrace = \"15s\"");
            hosts.push(
                Daemon::start(
                    &standin,
                    &extra(&pg, &host, "30s", &more),
                    &pool("cpu", LINUX, 4),
                )
                .await,
            );
        }
        route_to(&standin, &hosts, both);
        let hog = CpuHog::start();
        standin.queue_jobs("app", LINUX, 4);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        while standin.jobs_in("in_progress") + standin.jobs_in("completed") < 4 {
            assert!(tokio::time::Instant::now() < deadline, "{}", logs(&hosts));
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        pg.stop_server();
        let stopped = tokio::time::Instant::now();
        standin.queue_jobs("app", LINUX, 10);
        tokio::time::sleep(Duration::from_secs(8).saturating_sub(stopped.elapsed())).await;
        pg.start_server();
        let back = tokio::time::Instant::now();
        let refused = standin
            .deliveries()
            .iter()
            .filter(|d| d.status == 503)
            .count();
        assert!(refused > 0, "seed {seed}: no delivery was refused");
        let within = 2 * INTERVAL + Duration::from_secs(5);
        while standin.jobs_in("completed") < 14 {
            assert!(
                back.elapsed() < within,
                "seed {seed}: {} of 14 jobs done {} s after the ledger came back\n{}",
                standin.jobs_in("completed"),
                back.elapsed().as_secs(),
                logs(&hosts)
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        eprintln!(
            "figures: seed {seed}: 14 jobs done {:.1} s after the ledger came back, {refused} deliveries refused",
            back.elapsed().as_secs_f64()
        );
        drop(hog);
        wait_no_registration_left(&standin, Duration::from_secs(240), &hosts).await;
        for h in hosts {
            let (code, _) = h.stop(Duration::from_secs(30)).await;
            assert_eq!(code, Some(0));
        }
    }
}
