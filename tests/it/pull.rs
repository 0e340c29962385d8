//! Pull mode: no webhook at all; the daemon finds queued jobs with conditional polls of each
//! repo's runs and their jobs, and learns `in_progress` and `completed` the same way.

use std::time::Duration;

use github_standin::{Standin, StandinConfig};

use crate::support::{
    daemon::{Daemon, local_provider},
    provision::eventually,
};

const LABELS: &[&str] = &["self-hosted", "linux"];
const REPOS: [&str; 5] = ["web", "api", "cli", "docs", "infra"];

fn standin(config: StandinConfig) -> Standin {
    let standin = Standin::start(StandinConfig {
        repos: REPOS.iter().map(|r| r.to_string()).collect(),
        ..config
    })
    .unwrap();
    standin.set_behavior(github_standin::RunnerBehavior {
        job_ms: 200,
        ..github_standin::RunnerBehavior::default()
    });
    standin
}

fn repos_line() -> String {
    let list: Vec<String> = REPOS.iter().map(|r| format!("\"{r}\"")).collect();
    format!("repos = [{}]\n", list.join(", "))
}

async fn start_pull(standin: &Standin, webhook: &str, slots: usize) -> Daemon {
    let extra = format!("[webhook]\nmode = \"pull\"\n{webhook}");
    let daemon =
        Daemon::start_with_github(standin, &repos_line(), &extra, &local_provider(slots)).await;
    // No webhook at all.
    standin.state().webhook = None;
    daemon
}

/// Milliseconds from each job's queueing to its claim: the claims, in order, against the
/// jobs in the order they were queued (each job queued alone, claims in discovery order).
pub fn queued_to_claim_ms(standin: &Standin) -> Vec<u128> {
    let mut queued: Vec<u128> = standin.jobs().iter().map(|j| j.queued_at_ms).collect();
    queued.sort_unstable();
    let claims: Vec<u128> = standin
        .calls_to("generate_jitconfig")
        .iter()
        .filter(|c| c.status == 201)
        .map(|c| c.at_ms)
        .collect();
    queued
        .iter()
        .zip(claims)
        .map(|(q, c)| c.saturating_sub(*q))
        .collect()
}

#[actix_rt::test]
async fn fifty_jobs_across_five_repos_run_without_a_webhook_and_idle_polls_are_free() {
    let standin = standin(StandinConfig::default());
    let daemon = start_pull(
        &standin,
        "poll_interval = \"1s\"\npoll_idle_interval = \"4s\"\n",
        6,
    )
    .await;
    for i in 0..50 {
        standin.add_jobs(REPOS[i % REPOS.len()], LABELS, 1);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    daemon
        .wait_completed(&standin, 50, Duration::from_secs(120))
        .await;
    daemon.assert_claims_per_job(&standin, 50);
    assert!(standin.deliveries().is_empty(), "no webhook was sent");
    let mut waits = queued_to_claim_ms(&standin);
    waits.sort_unstable();
    println!(
        "pull mode, poll_interval 1s: queued -> claim p50 {} ms, max {} ms",
        waits[waits.len() / 2],
        waits[waits.len() - 1]
    );
    daemon.wait_no_runner_left(&standin).await;
    // A runner that ran its job and left (GitHub removed it) is not deleted again, though
    // the polls may never have shown it bound to its job.
    let gone_already: Vec<_> = standin
        .calls_to("delete_runner")
        .into_iter()
        .filter(|c| c.status == 404)
        .collect();
    assert!(gone_already.is_empty(), "{gone_already:?}");

    // Once every job is done and seen done, an idle minute costs only 304s.
    eventually(
        "the polls see every job done",
        Duration::from_secs(30),
        || {
            let calls = standin.calls();
            let n = calls.len();
            n > 10 && calls[n - 10..].iter().all(|c| c.status == 304)
        },
    )
    .await;
    let before = standin.calls().len();
    let budget = standin.state().budget.remaining;
    tokio::time::sleep(Duration::from_secs(60)).await;
    let idle: Vec<_> = standin.calls()[before..].to_vec();
    assert!(
        idle.len() >= 20,
        "the polls go on while idle: {}",
        idle.len()
    );
    assert!(
        idle.iter().all(|c| c.status == 304),
        "{:?}",
        idle.iter().filter(|c| c.status != 304).collect::<Vec<_>>()
    );
    assert_eq!(
        standin.state().budget.remaining,
        budget,
        "an idle minute spent nothing"
    );
    let text = daemon.metrics().await;
    assert!(text.contains("ephemerd_pull_polls_total{result=\"unchanged\"}"));
    assert_eq!(daemon.stop(Duration::from_secs(30)).await.0, Some(0));
}

/// A `core` limit of 200 a 20 s window and a 20 % share: the polls may spend 40 requests a
/// window. They slow down to stay near that (so the rate limit is never hit), and every job
/// still runs.
#[actix_rt::test]
async fn a_pull_daemon_at_its_budget_polls_slower_and_still_claims_every_job() {
    let standin = standin(StandinConfig {
        rate_limit: 200,
        rate_window: Duration::from_secs(20),
        ..StandinConfig::default()
    });
    let daemon = start_pull(
        &standin,
        "poll_interval = \"1s\"\npoll_idle_interval = \"2s\"\n",
        4,
    )
    .await;
    let started = std::time::Instant::now();
    for i in 0..8 {
        standin.add_jobs(REPOS[i % 2], LABELS, 1);
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    daemon
        .wait_completed(&standin, 8, Duration::from_secs(150))
        .await;
    let calls = standin.calls();
    let spent = calls
        .iter()
        .filter(|c| matches!(c.endpoint.as_str(), "list_runs" | "list_jobs") && c.status == 200)
        .count();
    // At most the share of every window begun, plus what one pass may spend past it (a pass is
    // not cut short): 10 list calls.
    let windows = started.elapsed().as_secs() / 20 + 2;
    println!("the polls spent {spent} requests over {windows} windows begun");
    assert!(
        spent as u64 <= windows * 40 + 10,
        "{spent} requests in {windows} windows"
    );
    assert!(
        calls.iter().all(|c| c.status != 403),
        "the rate limit was hit"
    );
    assert!(
        daemon.logs().contains("reached their share"),
        "the polls never slowed"
    );
    daemon.wait_no_runner_left(&standin).await;
    assert_eq!(daemon.stop(Duration::from_secs(30)).await.0, Some(0));
}

/// Figures for docs/benchmarks.md: median queued -> claim of 50 jobs queued 100 ms apart over
/// five repos, pushed (webhooks) and pulled (the default `poll_interval`, 5 s, and 1 s).
/// `cargo test --release --test it pull_figures -- --ignored --nocapture`
#[actix_rt::test]
#[ignore = "figures for docs/benchmarks.md"]
async fn pull_figures() {
    for mode in ["push", "pull 5s", "pull 1s"] {
        let standin = standin(StandinConfig::default());
        let daemon = match mode {
            "push" => {
                Daemon::start_with_github(&standin, &repos_line(), "", &local_provider(6)).await
            }
            "pull 5s" => start_pull(&standin, "", 6).await,
            _ => start_pull(&standin, "poll_interval = \"1s\"\n", 6).await,
        };
        for i in 0..50 {
            // Delivered in push mode; in pull mode no webhook target is set.
            standin.queue_jobs(REPOS[i % REPOS.len()], LABELS, 1);
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        daemon
            .wait_completed(&standin, 50, Duration::from_secs(180))
            .await;
        let mut waits = queued_to_claim_ms(&standin);
        waits.sort_unstable();
        let spent = standin
            .calls()
            .iter()
            .filter(|c| matches!(c.endpoint.as_str(), "list_runs" | "list_jobs"))
            .map(|c| c.status)
            .fold((0, 0), |(n, free), s| (n + 1, free + usize::from(s == 304)));
        println!(
            "{mode}: queued -> claim p50 {} ms, p90 {} ms, max {} ms; poll requests {} ({} free 304s)",
            waits[waits.len() / 2],
            waits[waits.len() * 9 / 10],
            waits[waits.len() - 1],
            spent.0,
            spent.1
        );
        daemon.stop(Duration::from_secs(30)).await;
    }
}
