//! The shorter fleet protocol against a real PostgreSQL (docs/fleet.md, "What the ledger
//! promises"): a host's lazy changes (job starts and ends, registrations made and gone) ride
//! along a round trip it makes anyway; and what a survivor does with each state a host killed
//! before writing them can leave.

use std::time::Duration;

use ephemer_actors_core::{
    cluster::{Acquire, Ledger, RunnerIdentity},
    config::PoolName,
    durable::{Op, RunnerRow},
    job::{JobAction, JobInfo, JobKey},
};

use crate::{
    cluster::{GPU, LINUX, extra, pool, route_to},
    cluster_figures::ledger_config,
    support::{
        self,
        daemon::Daemon,
        fleet::{logs, wait_no_registration_left},
        postgres::Postgres,
    },
};

async fn connect(pg: &Postgres, host: &str) -> Ledger {
    let mut config = ledger_config(pg, host);
    let cluster = config.cluster.as_mut().unwrap();
    cluster.lease = Duration::from_secs(1);
    let cluster = cluster.clone();
    Ledger::connect(&cluster, &config, Duration::from_secs(10))
        .await
        .unwrap()
}

fn info(id: u64) -> JobInfo {
    JobInfo {
        key: JobKey::new("acme", id),
        repo: "app".into(),
        labels: ["self-hosted".to_string(), "linux".to_string()].into(),
        ..JobInfo::default()
    }
}

fn runner(name: &str, id: u64, job: u64) -> RunnerRow {
    RunnerRow {
        name: name.into(),
        id,
        provider: PoolName::from("local"),
        repo: None,
        intent: JobKey::new("acme", job),
        bound: None,
        created_unix: 0,
    }
}

fn identity(host: &str) -> RunnerIdentity {
    RunnerIdentity {
        name_prefix: format!("ephemer-{host}-"),
        install_id: format!("{host}-install"),
    }
}

async fn phase(ledger: &Ledger, id: u64) -> (String, Option<String>) {
    let h = ledger
        .job(&JobKey::new("acme", id))
        .await
        .unwrap()
        .expect("the job is in the ledger");
    (h.phase, h.holder)
}

/// A job's start, queued lazily, reaches the ledger with the host's next `queued` record:
/// one round trip for both.
#[actix_rt::test]
async fn a_job_start_rides_along_the_next_record_in_one_round_trip() {
    let Some(pg) = Postgres::start() else { return };
    let a = connect(&pg, "a").await;
    a.heartbeat(&serde_json::json!([]), 0, 4, &identity("a"))
        .await
        .unwrap();
    assert!(a.record(JobAction::Queued, &info(1)).await.unwrap());
    assert_eq!(a.acquire(&info(1)).await.unwrap(), Acquire::Granted);
    a.queue_ops(&[Op::PutRunner(runner("ephemer-a-1", 11, 1))], false);
    assert!(a.record_later(JobAction::InProgress, &info(1)));
    assert_eq!(
        phase(&a, 1).await.0,
        "held",
        "not written before a round trip"
    );

    let before = a.round_trips();
    assert!(a.record(JobAction::Queued, &info(2)).await.unwrap());
    assert_eq!(a.round_trips() - before, 1, "the start rode along");
    // The record answers once its own statement is in; the ride lands just after it (no
    // mirror task runs here, so nothing else writes it).
    let deadline = tokio::time::Instant::now() + Duration::from_secs(2);
    while phase(&a, 1).await.0 != "running" {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the start never landed"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(phase(&a, 1).await, ("running".into(), Some("a".into())));
    let registered = pg.query("SELECT name FROM ephemer_registrations WHERE gone_at IS NULL");
    assert_eq!(registered, ["ephemer-a-1"]);
    // Nothing is left to write on its own.
    let before = a.round_trips();
    assert!(!a.write_pending().await.unwrap());
    assert_eq!(a.round_trips(), before);
}

/// A host killed with changes not yet written leaves these states; the survivor's reap
/// handles each: a job whose start was lost is given back (its new runner is a spare, which
/// takes another job or is swept); a started job stays GitHub's; a registration whose end
/// was lost is deleted (GitHub answers it is gone, or deletes it); a registration never
/// written is found by the dead host's runner-name shape.
#[actix_rt::test]
async fn what_a_survivor_does_with_each_state_a_killed_host_leaves() {
    let Some(pg) = Postgres::start() else { return };
    let (a, b) = (connect(&pg, "a").await, connect(&pg, "b").await);
    for (l, host) in [(&a, "a"), (&b, "b")] {
        l.heartbeat(&serde_json::json!([]), 0, 4, &identity(host))
            .await
            .unwrap();
    }
    for id in 1..=4 {
        assert!(a.record(JobAction::Queued, &info(id)).await.unwrap());
        assert_eq!(a.acquire(&info(id)).await.unwrap(), Acquire::Granted);
    }
    // Written: job 2 started on ephemer-a-2, job 3 ran on ephemer-a-3 and completed.
    a.queue_ops(
        &[
            Op::PutRunner(runner("ephemer-a-2", 12, 2)),
            Op::PutRunner(runner("ephemer-a-3", 13, 3)),
        ],
        false,
    );
    a.record_later(JobAction::InProgress, &info(2));
    a.record_later(JobAction::Completed, &info(3));
    assert!(!a.write_pending().await.unwrap());
    // Not written when `a` dies: job 1's start on a runner never mirrored, ephemer-a-3's end.
    a.queue_ops(
        &[
            Op::DeleteRunner("ephemer-a-3".into()),
            Op::PutRunner(runner("ephemer-a-1", 11, 1)),
        ],
        false,
    );
    a.record_later(JobAction::InProgress, &info(1));
    drop(a);

    let live =
        pg.query("SELECT name FROM ephemer_registrations WHERE gone_at IS NULL ORDER BY name");
    assert_eq!(
        live,
        ["ephemer-a-2", "ephemer-a-3"],
        "a-3's end and a-1 were never written"
    );

    tokio::time::sleep(Duration::from_millis(1_500)).await;
    b.heartbeat(&serde_json::json!([]), 0, 4, &identity("b"))
        .await
        .unwrap();
    let mut to_delete: Vec<String> = b
        .reap()
        .await
        .unwrap()
        .into_iter()
        .map(|r| r.name)
        .collect();
    to_delete.sort();
    // ephemer-a-2 runs job 2 (GitHub refuses to delete it until the job ends); ephemer-a-3's
    // end was lost (GitHub answers it is gone). ephemer-a-1 was never written.
    assert_eq!(to_delete, ["ephemer-a-2", "ephemer-a-3"]);
    assert_eq!(
        phase(&b, 1).await,
        ("queued".into(), None),
        "its start was lost"
    );
    assert_eq!(phase(&b, 2).await, ("running".into(), Some("a".into())));
    assert_eq!(phase(&b, 3).await.0, "completed");
    assert_eq!(phase(&b, 4).await, ("queued".into(), None), "never started");
    // The runner never written is looked for by the dead host's name shape.
    let sweep = b.dead_hosts_to_sweep().await.unwrap();
    assert_eq!(sweep.len(), 1);
    assert_eq!(sweep[0].0, "a");
    assert_eq!(sweep[0].1, identity("a"));
}

/// The case the ledger's promise leaves to the holder: a host killed with *another* host's
/// job starts and ends not yet written. Here h1 hears every delivery and h2 runs every job;
/// h1 is killed within the second its lazy changes wait, so h2 never hears that its jobs
/// started. Its runners exit cleanly with no event naming them: each job is looked at on
/// GitHub before it is dispatched again, and found completed, so no runner is made for a job
/// that ran (before, one was made for each, and stayed registered for the orphan grace, ten
/// minutes).
#[actix_rt::test]
async fn starts_lost_with_the_host_that_heard_them_leave_no_runner_behind() {
    let Some(pg) = Postgres::start() else { return };
    let standin = support::standin(150);
    let h1 = Daemon::start(&standin, &extra(&pg, "h1", "3s", ""), &pool("gpu", GPU, 4)).await;
    let h2 = Daemon::start(
        &standin,
        &extra(&pg, "h2", "3s", ""),
        &pool("cpu", LINUX, 4),
    )
    .await;
    route_to(&standin, std::slice::from_ref(&h1), 0.0);
    standin.queue_jobs("app", LINUX, 4);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while standin.jobs_in("completed") < 4 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the jobs did not run\n{}",
            logs(&[h1, h2])
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // The last `completed` reaches h1 a moment later; it is killed well within the second
    // its lazy changes wait for a ride.
    tokio::time::sleep(Duration::from_millis(150)).await;
    let h1_logs = h1.logs();
    let _left = h1.kill9().await;
    let lost = pg.query("SELECT job_id FROM ephemer_jobs WHERE phase = 'held'");
    assert!(
        !lost.is_empty(),
        "h1 wrote every start before it died: nothing was lost, nothing tried\n{h1_logs}"
    );
    route_to(&standin, std::slice::from_ref(&h2), 0.0);

    // h2's heal grace (2 s) passes, and whatever it does then (a look, a claim) is done.
    tokio::time::sleep(Duration::from_secs(6)).await;
    let hosts = [h2];
    wait_no_registration_left(&standin, Duration::from_secs(75), &hosts).await;
    let claims = standin.count("generate_jitconfig");
    // Each quiet exit had its job looked at first: GitHub said completed, so nothing was
    // claimed again.
    assert_eq!(
        claims,
        4,
        "registrations for 4 jobs (starts lost: {lost:?})\n{h1_logs}\n{}",
        logs(&hosts)
    );
    for job in standin.jobs() {
        assert_eq!(job.status, "completed", "job {}", job.id);
    }
    eprintln!("starts lost with h1: {lost:?}; {claims} registrations for 4 jobs");
    let [h2] = hosts;
    h2.stop(Duration::from_secs(30)).await;
}

/// A host killed after its jobs ran leaves its survivors nothing to delete for them: a runner
/// an event named with a job is gone from GitHub after it (and one whose deletion GitHub
/// answered is gone), so the host forgets its registration in the ledger instead of marking it
/// gone. Before, a survivor was handed every registration the dead host had ended in its last
/// ten minutes, and asked GitHub to delete each (answered 404).
#[actix_rt::test]
async fn a_killed_host_s_finished_runners_cost_its_survivors_no_deletion() {
    let Some(pg) = Postgres::start() else { return };
    let standin = support::standin(100);
    let h1 = Daemon::start(
        &standin,
        &extra(&pg, "h1", "3s", ""),
        &pool("cpu", LINUX, 4),
    )
    .await;
    // h2 covers none of the jobs: it is only the survivor.
    let h2 = Daemon::start(&standin, &extra(&pg, "h2", "3s", ""), &pool("gpu", GPU, 4)).await;
    route_to(&standin, std::slice::from_ref(&h1), 0.0);
    standin.queue_jobs("app", LINUX, 4);
    let hosts = [h1, h2];
    crate::support::fleet::wait_completed(&standin, 4, Duration::from_secs(60), &hosts).await;
    wait_no_registration_left(&standin, Duration::from_secs(30), &hosts).await;
    // Every runner's end reached the ledger (it rides along within a second).
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while pg
        .query("SELECT count(*) FROM ephemer_registrations WHERE host = 'h1' AND gone_at IS NULL")
        != ["0"]
    {
        assert!(tokio::time::Instant::now() < deadline, "{}", logs(&hosts));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let rows = pg.query("SELECT name FROM ephemer_registrations WHERE host = 'h1'");
    let [h1, h2] = hosts;
    let deletions = standin.count("delete_runner");
    let _left = h1.kill9().await;

    // The survivor reaps h1 once its lease (3 s) expires, sweeps its name shape, and
    // forgets it.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while pg.query("SELECT count(*) FROM ephemer_hosts WHERE host = 'h1'") != ["0"] {
        assert!(
            tokio::time::Instant::now() < deadline,
            "h1 never forgotten\n{}",
            h2.logs()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        standin.count("delete_runner") - deletions,
        0,
        "deletions asked by the survivor (h1's rows at its death: {rows:?})\n{}",
        h2.logs()
    );
    assert!(rows.is_empty(), "left in the ledger: {rows:?}");
    h2.stop(Duration::from_secs(30)).await;
}
