//! Scale-set mode: no webhook at all; each pool is a runner scale set on the stand-in's
//! Actions service, and the daemon long-polls its message queue.

use std::time::Duration;

use github_standin::{Standin, StandinConfig, scaleset::ServiceTimings};

use crate::support::{daemon::Daemon, provision::eventually};

pub(crate) const ALPHA: &[&str] = &["self-hosted", "linux", "alpha"];
pub(crate) const BETA: &[&str] = &["self-hosted", "linux", "beta"];
/// Scale sets are registered at the org: no `github.repos`.
pub(crate) const ORG_LEVEL: &str = "repos = []\n";

pub(crate) fn standin() -> Standin {
    let standin = Standin::start(StandinConfig::default()).unwrap();
    standin.set_behavior(github_standin::RunnerBehavior {
        job_ms: 200,
        ..github_standin::RunnerBehavior::default()
    });
    standin.set_scaleset_timings(ServiceTimings {
        long_poll: Duration::from_secs(5),
        session_idle: Duration::from_secs(20),
        queue_token_ttl: Duration::from_secs(3600),
        admin_token_ttl: Duration::from_secs(3600),
    });
    standin
}

/// Two pools of the stand-in runner, `alpha` and `beta`.
fn two_pools(slots: usize) -> String {
    two_pools_with(slots, "")
}

/// Two pools of the stand-in runner, `alpha` and `beta`, each with the lines `extra`.
pub(crate) fn two_pools_with(slots: usize, extra: &str) -> String {
    let bin = env!("CARGO_BIN_EXE_ephemer-actors");
    ["alpha", "beta"]
        .iter()
        .map(|pool| {
            format!(
                r#"
[providers.{pool}]
kind = "local"
command = "{bin}"
args = ["standin-runner"]
labels = ["self-hosted", "linux", "{pool}"]
max_concurrent = {slots}
allow_root = true
{extra}
"#
            )
        })
        .collect()
}

pub(crate) async fn start(standin: &Standin, slots: usize) -> Daemon {
    start_with(standin, slots, "").await
}

/// [`start`], each pool with the lines `extra`.
pub(crate) async fn start_with(standin: &Standin, slots: usize, extra: &str) -> Daemon {
    let daemon = Daemon::start_with_github(
        standin,
        ORG_LEVEL,
        &format!(
            "[webhook]\nmode = \"scaleset\"\n[runner]\nmax_concurrent = {}\n",
            slots * 2
        ),
        &two_pools_with(slots, extra),
    )
    .await;
    // No webhook at all: GitHub has no URL for this daemon.
    standin.state().webhook = None;
    wait_listening(standin, 2).await;
    daemon
}

/// Waits until `n` scale sets have a session open.
pub(crate) async fn wait_listening(standin: &Standin, n: usize) {
    eventually(
        "the scale sets' sessions are open",
        Duration::from_secs(30),
        || {
            standin
                .scale_sets()
                .iter()
                .filter(|(_, _, _, owner)| owner.is_some())
                .count()
                >= n
        },
    )
    .await;
}

/// Each completed job ran on a runner of the pool its labels name.
pub(crate) fn assert_each_job_on_its_pool(standin: &Standin) {
    for job in standin.jobs() {
        let runner = job.runner_name.clone().unwrap_or_default();
        let pool = if job.labels.iter().any(|l| l == "alpha") {
            "alpha"
        } else {
            "beta"
        };
        assert!(
            runner.contains(&format!("-{pool}-")),
            "job {} ({:?}) ran on {runner:?}",
            job.id,
            job.labels
        );
    }
}

#[actix_rt::test]
async fn a_hundred_jobs_over_two_pools_run_each_on_its_own_pool_with_no_webhook() {
    let standin = standin();
    let daemon = start(&standin, 4).await;
    let sets = standin.scale_sets();
    let mut names: Vec<_> = sets
        .iter()
        .map(|(_, name, labels, _)| (name.clone(), labels.clone()))
        .collect();
    names.sort();
    assert_eq!(
        names,
        [
            (
                "alpha".to_string(),
                vec!["alpha".into(), "self-hosted".into(), "linux".into()]
            ),
            (
                "beta".to_string(),
                vec!["beta".into(), "self-hosted".into(), "linux".into()]
            ),
        ],
        "one scale set per pool, its name first among its labels (as ARC registers it)"
    );
    for i in 0..50 {
        standin.queue_jobs("app", ALPHA, 1);
        standin.queue_jobs("app", BETA, 1);
        if i % 10 == 0 {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    daemon
        .wait_completed(&standin, 100, Duration::from_secs(180))
        .await;
    assert!(standin.deliveries().is_empty(), "no webhook was sent");
    assert_each_job_on_its_pool(&standin);
    daemon.wait_no_runner_left(&standin).await;
    // One runner registered per job, in its pool's scale set.
    let registered = standin.count("actions_generate_jitconfig");
    assert!(
        (100..=110).contains(&registered),
        "{registered} registrations for 100 jobs"
    );
    assert_eq!(
        standin.count("generate_jitconfig"),
        0,
        "no REST registration"
    );
    let metrics = daemon.metrics().await;
    assert!(
        metrics
            .contains("ephemerd_scaleset_messages_total{pool=\"alpha\",type=\"JobAssigned\"} 50"),
        "{}",
        metrics
            .lines()
            .filter(|l| l.contains("scaleset"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    assert!(metrics.contains("ephemerd_scaleset_session{pool=\"beta\",state=\"listening\"} 1"));
    // Every job came with its message: the reckoning of the statistics found nothing to amend.
    for pool in ["alpha", "beta"] {
        for action in ["fill", "withdraw"] {
            let line = format!(
                "ephemerd_scaleset_reckoned_total{{action=\"{action}\",pool=\"{pool}\"}} 0"
            );
            assert!(metrics.contains(&line), "{line}\n{}", daemon.logs());
        }
    }
    // Every message was acknowledged.
    eventually("the queues are empty", Duration::from_secs(10), || {
        standin
            .state()
            .scalesets
            .sets
            .values()
            .all(|s| s.queue.is_empty())
    })
    .await;
    let (code, logs) = daemon.stop(Duration::from_secs(30)).await;
    assert_eq!(code, Some(0), "{logs}");
    // The stop closed the sessions; the scale sets stay (only `scaleset delete` removes one).
    let sets = standin.scale_sets();
    assert_eq!(sets.len(), 2);
    assert!(
        sets.iter().all(|(_, _, _, owner)| owner.is_none()),
        "{sets:?}"
    );
}

/// A daemon with two slots per pool whose runners never get a job, and one alpha job assigned
/// with a runner registered for it, waiting: (the daemon, the job's id).
pub(crate) async fn one_job_waiting(standin: &Standin) -> (Daemon, u64) {
    standin.set_behavior(github_standin::RunnerBehavior {
        hold: true,
        ..github_standin::RunnerBehavior::default()
    });
    let daemon = start(standin, 2).await;
    let id = standin.queue_jobs("app", ALPHA, 1)[0];
    eventually(
        "a runner is registered for it",
        Duration::from_secs(20),
        || standin.count("actions_generate_jitconfig") >= 1 && !standin.runners().is_empty(),
    )
    .await;
    (daemon, id)
}

#[actix_rt::test]
async fn a_job_cancelled_after_its_assignment_leaves_nothing_behind() {
    let standin = standin();
    // Runners that never get a job: the assigned job waits until it is cancelled.
    let (daemon, id) = one_job_waiting(&standin).await;
    standin.cancel_job(id);
    daemon.wait_no_runner_left(&standin).await;
    let json = daemon.ctl_json(&["status"]).await;
    assert_eq!(json["runners"], 0, "{json}");
    standin.set_behavior(github_standin::RunnerBehavior::default());
    // The pool still works.
    standin.queue_jobs("app", ALPHA, 1);
    daemon
        .wait_completed(&standin, 2, Duration::from_secs(30))
        .await;
    daemon.wait_no_runner_left(&standin).await;
}

#[actix_rt::test]
async fn a_daemon_killed_mid_stream_resumes_from_its_last_message_and_loses_nothing() {
    let standin = standin();
    standin.set_behavior(github_standin::RunnerBehavior {
        job_ms: 1_000,
        ..github_standin::RunnerBehavior::default()
    });
    let daemon = start(&standin, 3).await;
    for _ in 0..20 {
        standin.queue_jobs("app", ALPHA, 1);
        standin.queue_jobs("app", BETA, 1);
    }
    eventually("some jobs ran", Duration::from_secs(30), || {
        standin.jobs_in("completed") >= 4
    })
    .await;
    let left = daemon.kill9().await;
    // Jobs keep coming while no one listens.
    for _ in 0..10 {
        standin.queue_jobs("app", ALPHA, 1);
        standin.queue_jobs("app", BETA, 1);
    }
    let daemon = Daemon::resume(&standin, left).await;
    standin.state().webhook = None;
    daemon
        .wait_completed(&standin, 60, Duration::from_secs(240))
        .await;
    assert_each_job_on_its_pool(&standin);
    daemon.wait_no_runner_left(&standin).await;
    // The restarted daemon closed its own stale session instead of waiting it out, and polled
    // on from the message id it kept, not from the start.
    let logs = daemon.logs();
    assert!(logs.contains("closed this host's session"), "{logs}");
    let resumed = standin
        .calls_to("actions_get_message")
        .iter()
        .filter(|c| c.path.contains("lastMessageId="))
        .count();
    assert!(resumed > 0);
    let registered = standin.count("actions_generate_jitconfig");
    assert!(registered <= 70, "{registered} registrations for 60 jobs");
}

#[actix_rt::test]
async fn a_second_daemon_for_the_same_scale_sets_gets_409_and_waits_without_looping() {
    let standin = standin();
    let first = start(&standin, 2).await;
    let opened_before = standin.count("actions_create_session");
    let second = Daemon::start_with_github(
        &standin,
        ORG_LEVEL,
        "[webhook]\nmode = \"scaleset\"\n",
        &two_pools(2),
    )
    .await;
    standin.state().webhook = None;
    tokio::time::sleep(Duration::from_secs(12)).await;
    let refused = standin
        .calls_to("actions_create_session")
        .iter()
        .filter(|c| c.status == 409)
        .count();
    // Two pools, backing off from 5 s: a few asks each, never a hot loop.
    assert!(
        (2..=8).contains(&refused),
        "{refused} refused session asks in 12 s"
    );
    assert_eq!(
        standin.count("actions_create_session") - opened_before,
        refused
    );
    let metrics = second.metrics().await;
    assert!(
        metrics.contains("ephemerd_scaleset_session{pool=\"alpha\",state=\"held_elsewhere\"} 1"),
        "{metrics}"
    );
    let json = second.ctl_json(&["status"]).await;
    let why = json["scalesets"][0]["why"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(why.contains("already has an active session"), "{json}");
    // Jobs run through the first daemon meanwhile.
    standin.queue_jobs("app", ALPHA, 3);
    first
        .wait_completed(&standin, 3, Duration::from_secs(30))
        .await;
    // The first stops (closing its sessions): the second takes over.
    let (code, _) = first.stop(Duration::from_secs(30)).await;
    assert_eq!(code, Some(0));
    standin.state().webhook = None;
    eventually("the second daemon listens", Duration::from_secs(90), || {
        standin
            .scale_sets()
            .iter()
            .all(|(_, _, _, owner)| owner.is_some())
    })
    .await;
    standin.queue_jobs("app", BETA, 3);
    second
        .wait_completed(&standin, 6, Duration::from_secs(60))
        .await;
    second.wait_no_runner_left(&standin).await;
}

#[actix_rt::test]
async fn the_listener_rides_out_expiry_eviction_deletion_dropped_polls_and_bad_messages() {
    let standin = standin();
    standin.set_scaleset_timings(ServiceTimings {
        long_poll: Duration::from_secs(2),
        session_idle: Duration::from_secs(20),
        // Queue tokens expire every 3 s (a 401, then a refresh); admin tokens are fetched
        // again once they are within a minute of expiry, so every ~5 s here.
        queue_token_ttl: Duration::from_secs(3),
        admin_token_ttl: Duration::from_secs(65),
    });
    let daemon = start(&standin, 2).await;
    let id_of = |name: &str| {
        standin
            .scale_sets()
            .iter()
            .find(|(_, n, _, _)| n == name)
            .map(|(id, ..)| *id)
            .unwrap()
    };
    let mut done = 0;
    let mut round = |labels: &'static [&'static str]| {
        done += 2;
        standin.queue_jobs("app", labels, 2);
        done
    };

    // Expired queue tokens: refreshed, jobs run.
    tokio::time::sleep(Duration::from_secs(7)).await;
    let n = round(ALPHA);
    daemon
        .wait_completed(&standin, n, Duration::from_secs(30))
        .await;
    assert!(standin.count("actions_refresh_session") >= 1);
    assert!(
        standin.count("actions_admin_connection") >= 2,
        "the admin token was refreshed"
    );

    // A stale message about a runner request nobody knows, and one of an unknown kind: both
    // acknowledged, neither blocks the queue.
    let alpha = id_of("alpha");
    standin.state().scalesets.inject(
        alpha,
        serde_json::json!({ "messageType": "JobStarted", "runnerRequestId": 999_999, "runnerName": "gone", "runnerId": 4242 }),
    );
    standin.state().scalesets.inject(
        alpha,
        serde_json::json!({ "messageType": "JobSomethingNew", "runnerRequestId": 1 }),
    );
    let n = round(ALPHA);
    daemon
        .wait_completed(&standin, n, Duration::from_secs(30))
        .await;

    // A proxy that drops the long poll twice: polled again.
    standin.fail_next("actions_get_message", 2, github_standin::Fault::Drop);
    let n = round(BETA);
    daemon
        .wait_completed(&standin, n, Duration::from_secs(30))
        .await;

    // The session evicted: a new one, the place in the queue kept.
    let beta = id_of("beta");
    standin.state().scalesets.evict_session(beta);
    let n = round(BETA);
    daemon
        .wait_completed(&standin, n, Duration::from_secs(40))
        .await;

    // The scale set deleted on GitHub: made again, and its jobs run.
    standin.state().scalesets.delete_set(alpha);
    eventually(
        "alpha's scale set is made again",
        Duration::from_secs(60),
        || {
            standin
                .scale_sets()
                .iter()
                .any(|(id, n, _, owner)| n == "alpha" && *id != alpha && owner.is_some())
        },
    )
    .await;
    let n = round(ALPHA);
    daemon
        .wait_completed(&standin, n, Duration::from_secs(40))
        .await;

    daemon.wait_no_runner_left(&standin).await;
    assert_each_job_on_its_pool(&standin);
    let metrics = daemon.metrics().await;
    assert!(
        metrics.contains("ephemerd_scaleset_messages_total{pool=\"alpha\",type=\"unreadable\"} 1"),
        "{}",
        metrics
            .lines()
            .filter(|l| l.contains("scaleset_messages"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    let logs = daemon.logs();
    assert!(
        logs.contains("the message session is gone; opening another"),
        "{logs}"
    );
    assert!(
        logs.contains("it is gone (deleted on GitHub); making it again"),
        "{logs}"
    );
}

/// p50, p90 and max of `v` (sorted here).
fn spread(mut v: Vec<u128>) -> (u128, u128, u128) {
    v.sort_unstable();
    (v[v.len() / 2], v[v.len() * 9 / 10], v[v.len() - 1])
}

/// Pickup in one run: queued -> claim (the n-th successful registration against the n-th job
/// queued) and queued -> running (when its runner took each job), p50 / p90 / max in ms.
fn pickup(standin: &Standin, claim: &str) -> [(u128, u128, u128); 2] {
    let jobs = standin.jobs();
    let mut queued: Vec<u128> = jobs.iter().map(|j| j.queued_at_ms).collect();
    queued.sort_unstable();
    let claims: Vec<u128> = standin
        .calls_to(claim)
        .iter()
        .filter(|c| c.status == 200 || c.status == 201)
        .map(|c| c.at_ms)
        .collect();
    let to_claim = queued
        .iter()
        .zip(claims)
        .map(|(q, c)| c.saturating_sub(*q))
        .collect();
    let to_running = jobs
        .iter()
        .filter_map(|j| Some(j.picked_at_ms?.saturating_sub(j.queued_at_ms)))
        .collect();
    [spread(to_claim), spread(to_running)]
}

/// Figures for docs/benchmarks.md: pickup at 200 jobs a minute (100 jobs queued 0.3 s apart,
/// runners of 0.2 s jobs, 4 slots) in push mode, then in scale-set mode in each message shape
/// with the stand-in holding its assignments against the capacity the listener says.
#[actix_rt::test]
#[ignore = "a measurement, run by hand"]
async fn scaleset_figures() {
    const JOBS: usize = 100;
    let mut rows = Vec::new();
    {
        let standin = standin();
        let daemon = Daemon::start(&standin, "", &crate::support::daemon::local_provider(4)).await;
        for _ in 0..JOBS {
            standin.queue_jobs("app", &["self-hosted", "linux", "x64"], 1);
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
        daemon
            .wait_completed(&standin, JOBS, Duration::from_secs(180))
            .await;
        rows.push(("push (webhooks)", pickup(&standin, "generate_jitconfig"), 0));
        daemon.stop(Duration::from_secs(30)).await;
    }
    for (name, shape) in [
        (
            "scale set, github.com's messages",
            github_standin::scaleset::MessageShape::Dotcom,
        ),
        (
            "scale set, a GHES's messages",
            github_standin::scaleset::MessageShape::Ghes,
        ),
    ] {
        let standin = standin();
        standin.state().scalesets.shape = shape;
        let daemon = start(&standin, 4).await;
        let budget = standin.state().budget.remaining;
        for _ in 0..JOBS {
            standin.queue_jobs("app", ALPHA, 1);
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
        daemon
            .wait_completed(&standin, JOBS, Duration::from_secs(180))
            .await;
        assert!(
            standin
                .state()
                .scalesets
                .capacities
                .iter()
                .all(|(_, c)| *c == 4)
        );
        let core_spent = budget - standin.state().budget.remaining;
        rows.push((
            name,
            pickup(&standin, "actions_generate_jitconfig"),
            core_spent,
        ));
        daemon.stop(Duration::from_secs(30)).await;
    }
    println!(
        "| mode | queued -> claim p50 / p90 / max | queued -> running p50 / p90 / max | `core` spent |"
    );
    for (name, [claim, run], core) in rows {
        println!(
            "| {name} | {} / {} / {} ms | {} / {} / {} ms | {core} |",
            claim.0, claim.1, claim.2, run.0, run.1, run.2
        );
    }
}

/// A fleet of three hosts serving one scale set: one listens (it holds the ledger's lease), all
/// claim; the listener killed -9, another host takes the lease within the lease time, closes the
/// dead host's session and resumes from its last message: every job runs once.
#[actix_rt::test]
async fn a_fleet_s_listening_host_killed_hands_the_scale_set_to_another_within_the_lease() {
    let Some(pg) = crate::support::postgres::Postgres::start() else {
        return;
    };
    let standin = standin();
    // GitHub's own lapse of a dead session is slow (two minutes here): the lease must beat it.
    standin.set_scaleset_timings(ServiceTimings {
        long_poll: Duration::from_secs(5),
        session_idle: Duration::from_secs(120),
        queue_token_ttl: Duration::from_secs(3600),
        admin_token_ttl: Duration::from_secs(3600),
    });
    standin.set_behavior(github_standin::RunnerBehavior {
        job_ms: 500,
        ..github_standin::RunnerBehavior::default()
    });
    const CPU: &[&str] = &["self-hosted", "linux", "x64"];
    let mut hosts = Vec::new();
    for name in ["h1", "h2", "h3"] {
        let extra = crate::cluster::extra(&pg, name, "6s", "[webhook]\nmode = \"scaleset\"\n");
        let pools = crate::cluster::pool("cpu", CPU, 3);
        hosts.push(Daemon::start_with_github(&standin, ORG_LEVEL, &extra, &pools).await);
    }
    standin.state().webhook = None;
    wait_listening(&standin, 1).await;
    standin.queue_jobs("app", CPU, 60);
    eventually("20 jobs ran", Duration::from_secs(120), || {
        standin.jobs_in("completed") >= 20
    })
    .await;
    let listening = pg.query("SELECT host FROM ephemer_listeners");
    assert_eq!(listening.len(), 1, "one listener: {listening:?}");
    let i = ["h1", "h2", "h3"]
        .iter()
        .position(|h| *h == listening[0])
        .unwrap();
    let session_before = standin.scale_sets()[0].3.clone();
    let dead = hosts.remove(i);
    let _left = dead.kill9().await;
    let killed = std::time::Instant::now();
    standin.queue_jobs("app", CPU, 30);
    eventually(
        "another host holds the session",
        Duration::from_secs(60),
        || {
            let owner = standin.scale_sets()[0].3.clone();
            owner.is_some() && owner != session_before
        },
    )
    .await;
    let took = killed.elapsed();
    println!("a new listener within {took:?} of the kill (lease 6 s)");
    assert!(took < Duration::from_secs(20), "took {took:?}");
    let new_holder = pg.query("SELECT host FROM ephemer_listeners");
    assert_ne!(new_holder, listening);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(180);
    while standin.jobs_in("completed") < 90 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{} of 90 completed\n{}",
            standin.jobs_in("completed"),
            hosts
                .iter()
                .map(|h| h.logs())
                .collect::<Vec<_>>()
                .join("\n=====\n")
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Every job once: no job granted to two hosts except those the dead host held and the
    // fleet released.
    let twice = pg.query(
        "SELECT job_id FROM ephemer_claims GROUP BY owner, job_id HAVING count(DISTINCT host) > 1",
    );
    let released = pg.query("SELECT DISTINCT job_id FROM ephemer_events WHERE action = 'released'");
    let twice: Vec<_> = twice
        .into_iter()
        .filter(|j| !released.contains(j))
        .collect();
    assert!(twice.is_empty(), "{twice:?}");
    for job in standin.jobs() {
        assert_eq!(job.status, "completed");
        assert!(job.runner_name.unwrap_or_default().contains("-cpu-"));
    }
    let logs: String = hosts.iter().map(|h| h.logs()).collect();
    assert!(
        logs.contains("took the listener lease; closed the previous holder's session"),
        "{logs}"
    );
    for h in hosts {
        h.stop(Duration::from_secs(30)).await;
    }
}

/// `demo --scaleset`: the offline demo in scale-set mode (a 502 burst, a 429 with Retry-After
/// and an evicted session on the way): every job runs, nothing is left, exit 0.
#[tokio::test]
async fn the_demo_runs_in_scale_set_mode() {
    let mut cmd = crate::support::daemon();
    cmd.args(["demo", "--scaleset", "--jobs", "12", "--seed", "1"]);
    let (code, stdout, stderr) = crate::support::output(cmd).await;
    assert_eq!(code, 0, "stdout:\n{stdout}\nstderr:\n{stderr}");
    assert!(
        stdout.contains("jobs run                     12 / 12"),
        "{stdout}"
    );
    assert!(stdout.contains("message polls (scale set)"), "{stdout}");
    assert!(
        stdout.contains("runners left registered      0"),
        "{stdout}"
    );
}
