//! Upgrades keep every job: a burst of jobs through one state directory while the daemon is
//! swapped mid-burst for the next release, whose job record carries one field more (the same
//! executable playing it: `ephemer_actors_core::next_build`, `EPHEMER_TEST_NEXT_BUILD=1` in
//! a debug build), and back again:
//! the current build stopped (the drain), the next one started on its store; the next one
//! killed (`kill -9`) with jobs it recorded still open, the current one started on its store
//! (a rollback). The reconcile is off, so only the store can bring back what was queued.
//! docs/operations.md, "Upgrading", says what an operator does.

use std::{path::Path, time::Duration};

use github_standin::{RunnerBehavior, Standin};

use crate::support::{
    self,
    daemon::{Daemon, local_provider},
};

const LABELS: &[&str] = &["self-hosted", "linux", "x64"];

fn unreadable(logs: &str) -> Vec<&str> {
    logs.lines()
        .filter(|l| l.contains("unreadable state row") || l.contains("moved aside"))
        .collect()
}

async fn wait_done(standin: &Standin, n: usize, daemon: &Daemon) {
    let deadline = std::time::Instant::now() + Duration::from_secs(90);
    while standin.jobs_in("completed") < n {
        assert!(
            std::time::Instant::now() < deadline,
            "{} of {n} jobs done:\n{}",
            standin.jobs_in("completed"),
            daemon.logs()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn store_holds(dir: &Path, needle: &str) -> bool {
    let bytes = std::fs::read(dir.join("state").join("ephemer-actors.redb")).unwrap();
    bytes.windows(needle.len()).any(|w| w == needle.as_bytes())
}

#[actix_rt::test]
async fn a_binary_swap_mid_burst_loses_no_job_either_way() {
    let standin = support::standin(400);
    standin.set_behavior(RunnerBehavior {
        job_ms: 400,
        boot_ms: 300,
        ..RunnerBehavior::default()
    });
    let current = Daemon::start(&standin, "", &local_provider(3)).await;
    standin.queue_jobs("app", LABELS, 12);
    wait_done(&standin, 3, &current).await;

    // Upgrade: the drain stops the current build; the next one opens its store.
    let (left, code, logs) = current.stop_keeping(Duration::from_secs(60)).await;
    assert_eq!(code, Some(0), "{logs}");
    let next_daemon = Daemon::resume_next(&standin, left).await;
    standin.queue_jobs("app", LABELS, 12);
    wait_done(&standin, 15, &next_daemon).await;
    let next_logs = next_daemon.logs();
    assert!(unreadable(&next_logs).is_empty(), "{next_logs}");

    // Rollback, abruptly: the next build killed with jobs it recorded still open.
    let left = next_daemon.kill9().await;
    assert!(
        store_holds(left.0.path(), "\"accepted_by\""),
        "the next build wrote no record of its own: nothing would be tested"
    );
    let open_at_swap = 24 - standin.jobs_in("completed");
    assert!(open_at_swap > 0, "the burst was over before the swap");
    let back = Daemon::resume(&standin, left).await;
    wait_done(&standin, 24, &back).await;
    back.wait_no_runner_left(&standin).await;
    let (work, prefix) = (back.runner_dir(), back.prefix());
    let (code, logs) = back.stop(Duration::from_secs(60)).await;
    assert_eq!(code, Some(0), "{logs}");
    assert!(unreadable(&logs).is_empty(), "{logs}");
    let environments = std::fs::read_dir(work).map_or(0, |d| {
        d.flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with(&prefix))
            .count()
    });
    assert_eq!(environments, 0, "runner environments left");
    println!(
        "upgrade: 24 jobs, {open_at_swap} open at the rollback, {} claims",
        standin.count("generate_jitconfig")
    );
}

/// Two builds on one PostgreSQL: a host of this build keeps working, and starts again, after
/// a host of the next build migrated the ledger forward (an additive migration); a schema
/// that needs a newer binary is refused at start with the version it needs, and the jobs go
/// on through the other host.
#[actix_rt::test]
async fn a_fleet_upgraded_one_host_at_a_time_keeps_working_and_loses_no_job() {
    use crate::{
        cluster::{LINUX, extra, pool, route_to},
        support::{fleet::wait_completed, postgres::Postgres},
    };
    let Some(pg) = Postgres::start() else { return };
    let standin = support::standin(200);
    let old = Daemon::start(
        &standin,
        &extra(&pg, "h1", "5s", ""),
        &pool("cpu", LINUX, 3),
    )
    .await;
    let new = Daemon::start_next(
        &standin,
        &extra(&pg, "h2", "5s", ""),
        &pool("cpu", LINUX, 3),
    )
    .await;
    assert!(
        new.logs().contains("ledger schema migrated"),
        "{}",
        new.logs()
    );
    let versions = pg.query("SELECT max(version) FROM ephemer_schema");
    let mut hosts = vec![old, new];
    route_to(&standin, &hosts, 0.3);
    standin.queue_jobs("app", LINUX, 12);
    wait_completed(&standin, 12, Duration::from_secs(90), &hosts).await;

    // The old host restarts (a crash, a reboot) while the fleet is half upgraded: it starts.
    let old = hosts.remove(0);
    let (left, code, logs) = old.stop_keeping(Duration::from_secs(60)).await;
    assert_eq!(code, Some(0), "{logs}");
    let old = Daemon::resume(&standin, left).await;
    assert!(old.logs().contains("readable by it"), "{}", old.logs());
    hosts.insert(0, old);
    route_to(&standin, &hosts, 0.3);
    standin.queue_jobs("app", LINUX, 12);
    wait_completed(&standin, 24, Duration::from_secs(90), &hosts).await;
    let claims_old = hosts[0].logs().matches("runner claimed").count();

    // A schema the old build would misread: it refuses to start and says what it needs; the
    // jobs queued meanwhile run on the upgraded host.
    let old = hosts.remove(0);
    let (left, _, _) = old.stop_keeping(Duration::from_secs(60)).await;
    pg.query("INSERT INTO ephemer_schema (version, readable_from) VALUES (99, 99)");
    let mut serve = support::daemon();
    serve
        .arg("serve")
        .arg("--config")
        .arg(left.0.path().join("ephemer.toml"));
    let (code, out, err) = support::output(serve).await;
    assert_eq!(code, 1, "{out}{err}");
    assert!(
        err.contains("needs a binary that knows version 99"),
        "{err}"
    );
    route_to(&standin, &hosts, 0.0);
    standin.queue_jobs("app", LINUX, 6);
    wait_completed(&standin, 30, Duration::from_secs(90), &hosts).await;
    wait_no_registration_left(&standin, &hosts).await;
    println!(
        "fleet upgrade: schema {versions:?} after the next build; 30 jobs done; the old host's \
         log names {claims_old} claims"
    );
    for h in hosts {
        let (code, logs) = h.stop(Duration::from_secs(60)).await;
        assert_eq!(code, Some(0), "{logs}");
    }
}

async fn wait_no_registration_left(standin: &Standin, hosts: &[Daemon]) {
    crate::support::fleet::wait_no_registration_left(standin, Duration::from_secs(30), hosts).await;
}

/// A store an earlier build wrote (tests/data) runs: its queued job (101, whose runner is gone)
/// and its job on the ladder (103) are claimed and run, its started job (102) is not claimed
/// again, and its runner's registration (7) is deleted. The reconcile is off: only the store
/// names these jobs.
#[actix_rt::test]
async fn a_store_an_earlier_build_wrote_runs_its_jobs_and_tears_down_its_runner() {
    let standin = support::standin(100);
    standin.state().next_job_id = 100;
    let ids = standin.add_jobs("app", &["self-hosted"], 3);
    assert_eq!(ids, vec![101, 102, 103]);
    standin.cancel_job(102);
    let golden = support::repo_root().join("tests/data/store-format1-7fe5e2c.redb");
    let bin = env!("CARGO_BIN_EXE_ephemer-actors");
    let daemon = Daemon::start_config(
        |port, state| {
            std::fs::create_dir_all(state).unwrap();
            std::fs::copy(&golden, state.join("ephemer-actors.redb")).unwrap();
            format!(
                r#"
[github]
api_url = "{api}"
owner = "acme"
repos = ["app"]
token = "{token}"

[webhook]
listen = "127.0.0.1:{port}"
secret = "{secret}"
reconcile_interval = "0s"

[runner.claim_retry]
schedule = ["1s", "2s"]
# The golden store's retry failed first in 2023: a max_age that reaches back to it keeps it
# on the ladder (the default would give it up, and the reconcile would find it).
max_age = "2000d"

[state]
dir = "{state}"

[providers.local]
command = "{bin}"
args = ["standin-runner"]
labels = ["self-hosted", "linux", "x64"]
allow_root = true
"#,
                api = standin.url(),
                token = support::daemon::TOKEN,
                secret = support::daemon::SECRET,
                state = state.display(),
            )
        },
        &[],
    )
    .await;
    standin.send_webhooks_to(
        &format!("http://{}/webhook/github", daemon.addr),
        support::daemon::SECRET,
    );
    wait_done(&standin, 3, &daemon).await;
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !standin
        .calls_to("delete_runner")
        .iter()
        .any(|c| c.path.ends_with("/runners/7"))
    {
        assert!(
            std::time::Instant::now() < deadline,
            "the golden runner's registration was never deleted:\n{}",
            daemon.logs()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let claimed: Vec<u64> = standin
        .jobs()
        .iter()
        .filter(|j| j.runner_name.is_some())
        .map(|j| j.id)
        .collect();
    assert_eq!(claimed, vec![101, 103], "{}", daemon.logs());
    let (code, logs) = daemon.stop(Duration::from_secs(60)).await;
    assert_eq!(code, Some(0), "{logs}");
    assert!(unreadable(&logs).is_empty(), "{logs}");
}
