//! Fleet mode end to end: `serve` processes sharing one throwaway PostgreSQL cluster and one
//! stand-in org, pools split so some labels are covered by one host only, deliveries sent to a
//! random host (and a share of them to every host, as separate hooks per host do).

use std::time::Duration;

use github_standin::Standin;

use crate::support::{
    self,
    daemon::{Daemon, SECRET},
    fleet::{logs, wait_completed, wait_no_registration_left},
    postgres::Postgres,
};

pub(crate) const LINUX: &[&str] = &["self-hosted", "linux", "x64"];
pub(crate) const GPU: &[&str] = &["self-hosted", "linux", "gpu"];

/// A local pool of stand-in runners named `name` with `labels`.
pub(crate) fn pool(name: &str, labels: &[&str], max: usize) -> String {
    let labels: Vec<String> = labels.iter().map(|l| format!("{l:?}")).collect();
    format!(
        r#"
[providers.{name}]
kind = "local"
command = "{bin}"
args = ["standin-runner"]
labels = [{labels}]
max_concurrent = {max}
allow_root = true
"#,
        bin = env!("CARGO_BIN_EXE_ephemer-actors"),
        labels = labels.join(", ")
    )
}

/// `[runner]` and `[cluster]` for host `host`.
pub(crate) fn extra(pg: &Postgres, host: &str, lease: &str, more: &str) -> String {
    format!(
        "[runner]\nmax_concurrent = 4\nshutdown_timeout = \"10s\"\n\n[runner.claim_retry]\nschedule = [\"1s\", \"2s\"]\n\n{more}\n\n[cluster]\nurl = \"{url}\"\nhost = \"{host}\"\nlease = \"{lease}\"\n",
        url = pg.url()
    )
}

/// One host with a 30 s lease and `pools`.
async fn host(pg: &Postgres, standin: &Standin, name: &str, pools: &str) -> Daemon {
    Daemon::start(standin, &extra(pg, name, "30s", ""), pools).await
}

/// Three hosts: two cover the linux labels, one covers the gpu labels alone.
async fn three_hosts(pg: &Postgres, standin: &Standin, lease: &str, more: &str) -> Vec<Daemon> {
    three_hosts_with(pg, standin, "", lease, more).await
}

/// Like `three_hosts`, with more keys in `[github]`.
async fn three_hosts_with(
    pg: &Postgres,
    standin: &Standin,
    github: &str,
    lease: &str,
    more: &str,
) -> Vec<Daemon> {
    let mut hosts = Vec::new();
    for (host, pools) in [
        ("h1", pool("cpu", LINUX, 4)),
        ("h2", pool("cpu", LINUX, 4)),
        ("h3", pool("gpu", GPU, 4)),
    ] {
        let config = extra(pg, host, lease, more);
        hosts.push(Daemon::start_with_github(standin, github, &config, &pools).await);
    }
    route_to(standin, &hosts, 1.0 / 3.0);
    hosts
}

/// Sends the stand-in's deliveries to `hosts` at random, `share` of them to all.
pub(crate) fn route_to(standin: &Standin, hosts: &[Daemon], share: f64) {
    let urls: Vec<String> = hosts
        .iter()
        .map(|d| format!("http://{}/webhook/github", d.addr))
        .collect();
    standin.send_webhooks_to_fleet(&urls, SECRET, share);
}

async fn stop_all(hosts: impl IntoIterator<Item = Daemon>) {
    for d in hosts {
        d.stop(Duration::from_secs(30)).await;
    }
}

/// Jobs two hosts were granted (the ledger writes every grant beside the claim decision).
fn jobs_granted_to_two_hosts(pg: &Postgres) -> Vec<String> {
    pg.query(
        "SELECT job_id FROM ephemer_claims GROUP BY owner, job_id HAVING count(DISTINCT host) > 1",
    )
}

#[actix_rt::test]
async fn three_hosts_run_every_job_exactly_once() {
    let Some(pg) = Postgres::start() else { return };
    let standin = support::standin(150);
    let hosts = three_hosts(&pg, &standin, "30s", "").await;

    let mut ids = standin.queue_jobs("app", LINUX, 200);
    ids.extend(standin.queue_jobs("app", GPU, 100));
    wait_completed(&standin, 300, Duration::from_secs(300), &hosts).await;
    wait_no_registration_left(&standin, Duration::from_secs(30), &hosts).await;

    every_job_ran_once(&standin, &pg, &hosts, &[]);
    let dups = standin
        .deliveries()
        .iter()
        .filter(|d| d.action == "queued")
        .count();
    assert!(
        dups > 300 + 50,
        "a third of the queued deliveries went to every host: {dups}"
    );

    // `status` shows the fleet.
    let status = hosts[0].ctl_json(&["status"]).await;
    let fleet = status["fleet"]["hosts"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let names: Vec<&str> = fleet.iter().filter_map(|h| h["host"].as_str()).collect();
    assert_eq!(names, ["h1", "h2", "h3"], "{status}");
    let id = ids[0].to_string();
    let job = hosts[0].ctl_json(&["jobs", &id]).await;
    assert_eq!(job["ledger"]["phase"], "completed", "{job}");
    let (_, table, _) = hosts[1].ctl(&["status"]).await;
    assert!(
        table.contains("HOST") && table.contains("h3") && table.contains("live"),
        "{table}"
    );
    let (_, doctor, _) = hosts[2].ctl(&["doctor"]).await;
    assert!(doctor.contains("connected; schema version 4"), "{doctor}");
    stop_all(hosts).await;
}

/// Every job ran once, on a runner of a pool that covers it; no job was granted to two hosts
/// (but those in `released`, given back when their holder died); registrations at most one
/// per job, plus the fungibility heals the single-host tests allow, plus one per release.
fn every_job_ran_once(standin: &Standin, pg: &Postgres, hosts: &[Daemon], released: &[String]) {
    let jobs = standin.jobs();
    for job in &jobs {
        let runner = job.runner_name.clone().unwrap_or_default();
        let pool = if job.labels.iter().any(|l| l == "gpu") {
            "-gpu-"
        } else {
            "-cpu-"
        };
        assert_eq!(job.status, "completed", "job {}", job.id);
        assert!(runner.contains(pool), "job {} ran on {runner}", job.id);
    }
    let twice: Vec<String> = jobs_granted_to_two_hosts(pg)
        .into_iter()
        .filter(|id| !released.contains(id))
        .collect();
    assert_eq!(twice, Vec::<String>::new(), "{}", logs(hosts));
    let heals: usize = hosts
        .iter()
        .map(|d| d.logs().matches("dispatching the job again").count())
        .sum();
    let claims = standin.count("generate_jitconfig");
    let most = jobs.len() + heals + released.len();
    assert!(
        (jobs.len()..=most).contains(&claims),
        "{claims} registrations for {} jobs with {heals} heals and {} releases\n{}",
        jobs.len(),
        released.len(),
        logs(hosts)
    );
}

#[actix_rt::test]
async fn a_host_killed_a_third_of_the_way_in_loses_nothing() {
    let Some(pg) = Postgres::start() else { return };
    let standin = support::standin(150);
    // This measures the lease, not the claim window (150 a minute by default, spent before
    // the kill at the stand-in's pace; `the_fleet_shares_one_claim_window` tests the window).
    let mut hosts = three_hosts_with(&pg, &standin, "max_claims_per_minute = 1000", "6s", "").await;
    standin.queue_jobs("app", LINUX, 200);
    standin.queue_jobs("app", GPU, 100);
    wait_completed(&standin, 100, Duration::from_secs(300), &hosts).await;

    // kill -9 of h1 (a cpu host; h2 covers the same labels). Its runner processes live on,
    // as they do when only the daemon dies, and finish the jobs they took.
    let h1 = hosts.remove(0);
    let h1_logs = h1.logs();
    let held = pg.query("SELECT job_id FROM ephemer_jobs WHERE holder = 'h1' AND phase = 'held'");
    let _left = h1.kill9().await;
    let killed = github_standin::unix_now_ms();
    route_to(&standin, &hosts, 1.0 / 3.0);
    wait_completed(&standin, 300, Duration::from_secs(300), &hosts).await;

    // Every job h1 held and had not started was picked within the lease (6 s) plus 5 s.
    for id in &held {
        let id: u64 = id.parse().unwrap();
        let job = standin.jobs().into_iter().find(|j| j.id == id).unwrap();
        let after = job.picked_at_ms.unwrap().saturating_sub(killed);
        assert!(
            job.picked_at_ms.unwrap() < killed || after <= 11_000,
            "job {id}, held by h1, picked {after} ms after the kill\n{h1_logs}\n{}",
            logs(&hosts)
        );
    }
    let released = pg.query("SELECT DISTINCT job_id FROM ephemer_events WHERE action = 'released'");
    assert!(
        held.iter().all(|id| released.contains(id) || {
            let id: u64 = id.parse().unwrap();
            standin
                .jobs()
                .iter()
                .any(|j| j.id == id && j.picked_at_ms.unwrap() < killed + 6_000)
        }),
        "held {held:?}, released {released:?}"
    );
    // The dead host's registrations are deleted by the survivors (its busy runners finish
    // their job first); nothing is left.
    wait_no_registration_left(&standin, Duration::from_secs(90), &hosts).await;
    every_job_ran_once(&standin, &pg, &hosts, &released);
    stop_all(hosts).await;
}

/// Claim decisions (generate-jitconfig calls) the stand-in saw, with their unix ms.
fn claim_times(standin: &Standin) -> Vec<u128> {
    standin
        .calls_to("generate_jitconfig")
        .iter()
        .map(|c| c.at_ms)
        .collect()
}

/// A local pool whose runners die before taking a job (`/bin/false`): the jobs its host holds
/// sit on its ladder.
fn broken_pool() -> String {
    pool_running("command = \"/bin/false\"")
}

/// Pool `cpu` (linux, 4 slots) whose runner is `command` (its `command` and `args` lines).
fn pool_running(command: &str) -> String {
    let with = pool("cpu", LINUX, 4).replace(
        &format!(
            "command = \"{}\"\nargs = [\"standin-runner\"]",
            env!("CARGO_BIN_EXE_ephemer-actors")
        ),
        command,
    );
    assert!(with.contains(command));
    with
}

/// Waits until `host` holds at least `n` jobs with a failure on their ladder; their ids.
async fn wait_held_with_failures(
    pg: &Postgres,
    host: &str,
    n: usize,
    hosts: &[Daemon],
) -> Vec<String> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let held = pg.query(&format!(
            "SELECT job_id FROM ephemer_jobs WHERE holder = '{host}' AND phase = 'held' \
             AND attempts >= 1 ORDER BY job_id"
        ));
        if held.len() >= n {
            return held;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{host} never held {n} failed jobs: {held:?}\n{}",
            logs(hosts)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[actix_rt::test]
async fn a_killed_host_s_unstarted_jobs_run_on_another_with_their_ladder() {
    let Some(pg) = Postgres::start() else { return };
    let standin = support::standin(100);
    let broken = broken_pool();
    let h1 = Daemon::start(&standin, &extra(&pg, "h1", "6s", ""), &broken).await;
    standin.queue_jobs("app", LINUX, 6);
    let held = wait_held_with_failures(&pg, "h1", 3, std::slice::from_ref(&h1)).await;
    // Every job's delivery answered before the kill: one still on its way would fail, and
    // only redelivery (not configured here) or a reconcile would find its job.
    crate::support::provision::eventually(
        "all six deliveries taken",
        Duration::from_secs(20),
        || {
            let d = standin.deliveries();
            d.iter()
                .filter(|d| d.action == "queued" && d.status == 202)
                .count()
                == 6
        },
    )
    .await;
    let h1_logs = h1.logs();
    let _left = h1.kill9().await;
    let killed = github_standin::unix_now_ms();
    let h2 = Daemon::start(
        &standin,
        &extra(&pg, "h2", "6s", ""),
        &pool("cpu", LINUX, 4),
    )
    .await;
    let hosts = [h2];
    wait_completed(&standin, 6, Duration::from_secs(60), &hosts).await;
    for id in &held {
        let id: u64 = id.parse().unwrap();
        let job = standin.jobs().into_iter().find(|j| j.id == id).unwrap();
        let picked = job.picked_at_ms.unwrap();
        // The lease (6 s) plus 5 s, and the rung the job's ladder was on (1-2 s).
        assert!(
            picked.saturating_sub(killed) <= 13_000,
            "job {id} picked {} ms after the kill\n{h1_logs}\n{}",
            picked.saturating_sub(killed),
            logs(&hosts)
        );
        assert!(job.runner_name.as_deref().unwrap_or("").contains("-cpu-"));
        let detail = hosts[0].ctl_json(&["jobs", &id.to_string()]).await;
        let timeline = detail["job"]["timeline"].to_string();
        assert!(
            timeline.contains("released to the fleet by h2 with")
                && !timeline.contains("with 0 failure"),
            "job {id} came back without its ladder: {detail}\n{}",
            logs(&hosts)
        );
    }
    // The dead host's registrations are deleted by the survivor; nothing is left.
    wait_no_registration_left(&standin, Duration::from_secs(40), &hosts).await;
    assert_eq!(
        pg.query("SELECT count(*) FROM ephemer_registrations WHERE host = 'h1'"),
        ["0"]
    );
    stop_all(hosts).await;
}

#[actix_rt::test]
async fn an_empty_registration_budget_holds_every_host_until_its_reset() {
    let Some(pg) = Postgres::start() else { return };
    let standin = support::standin(100);
    let mut hosts = Vec::new();
    for name in ["h1", "h2"] {
        hosts.push(host(&pg, &standin, name, &pool("cpu", LINUX, 4)).await);
    }
    route_to(&standin, &hosts, 0.0);
    let reset = standin.exhaust_bucket_for("actions_runner_registration", Duration::from_secs(12));
    standin.queue_jobs("app", LINUX, 1);
    // The first claim learns the budget is empty; the fleet hears it from the ledger.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while standin.count("generate_jitconfig") == 0 {
        assert!(tokio::time::Instant::now() < deadline, "{}", logs(&hosts));
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    standin.queue_jobs("app", LINUX, 6);
    wait_completed(&standin, 7, Duration::from_secs(60), &hosts).await;
    let early: Vec<u128> = claim_times(&standin)
        .into_iter()
        .filter(|at| *at < u128::from(reset) * 1000)
        .collect();
    assert_eq!(
        early.len(),
        1,
        "claims before the reset: {early:?}\n{}",
        logs(&hosts)
    );
    stop_all(hosts).await;
}

#[actix_rt::test]
async fn the_fleet_shares_one_claim_window() {
    let Some(pg) = Postgres::start() else { return };
    let standin = support::standin(100);
    let mut hosts = Vec::new();
    for host in ["h1", "h2", "h3"] {
        hosts.push(
            Daemon::start_with_github(
                &standin,
                "max_claims_per_minute = 4",
                &extra(&pg, host, "30s", ""),
                &pool("cpu", LINUX, 4),
            )
            .await,
        );
    }
    route_to(&standin, &hosts, 1.0 / 3.0);
    standin.queue_jobs("app", LINUX, 8);
    wait_completed(&standin, 8, Duration::from_secs(150), &hosts).await;
    let times = claim_times(&standin);
    // A claim a job, plus the heals of a runner that took another host's job (as ever).
    let heals: usize = hosts
        .iter()
        .map(|d| d.logs().matches("dispatching the job again").count())
        .sum();
    assert!(
        (8..=8 + heals).contains(&times.len()),
        "{} claims for 8 jobs with {heals} heals\n{}",
        times.len(),
        logs(&hosts)
    );
    for (i, at) in times.iter().enumerate() {
        let in_window = times[i..].iter().filter(|t| **t < at + 60_000).count();
        assert!(
            in_window <= 4,
            "{in_window} claims in the 60 s from {at}: {times:?}"
        );
    }
    stop_all(hosts).await;
}

#[actix_rt::test]
async fn deliveries_get_503_while_the_database_is_down_and_nothing_is_lost() {
    let Some(pg) = Postgres::start() else { return };
    let standin = support::standin(1500);
    let mut hosts = Vec::new();
    for host in ["h1", "h2"] {
        hosts.push(
            Daemon::start_reconciling(
                &standin,
                "3s",
                &extra(&pg, host, "30s", "[runner.orphan_sweep]\ngrace = \"15s\""),
                &pool("cpu", LINUX, 4),
            )
            .await,
        );
    }
    route_to(&standin, &hosts, 0.0);
    standin.queue_jobs("app", LINUX, 6);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while standin.jobs_in("in_progress") < 3 {
        assert!(tokio::time::Instant::now() < deadline, "{}", logs(&hosts));
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    pg.stop_server();
    let stopped = tokio::time::Instant::now();
    standin.queue_jobs("app", LINUX, 6);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let ready = support::http_get(&hosts[0].addr, "/readyz")
        .await
        .map(|r| r.0);
    tokio::time::sleep(Duration::from_secs(5).saturating_sub(stopped.elapsed())).await;
    pg.start_server();
    wait_completed(&standin, 12, Duration::from_secs(90), &hosts).await;
    let server_log = pg.log();
    assert!(
        server_log.contains("database system is ready"),
        "{server_log}"
    );
    assert_eq!(ready, Some(503), "/readyz while the ledger is down");
    let refused = standin
        .deliveries()
        .iter()
        .filter(|d| d.status == 503)
        .count();
    assert!(
        refused > 0,
        "no delivery was refused while the database was down"
    );
    let mut counted = 0.0;
    for d in &hosts {
        let metrics = d.metrics().await;
        counted += metrics
            .lines()
            .find(|l| l.starts_with("ephemerd_webhook_refused_total{reason=\"ledger_down\"}"))
            .and_then(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .unwrap_or(0.0);
    }
    assert!(
        counted >= refused as f64,
        "{refused} deliveries refused, {counted} counted"
    );
    // In-progress deliveries refused during the outage leave runners whose job was never seen
    // running: they are re-dispatched (the single-host heal), and the spares are reaped by the
    // orphan sweep (every 30 s) once their grace is over, as on one host.
    // Each such runner is deleted once its grace is over, and its job may be dispatched again
    // (up to the zombie cap) before the host gives up on it: minutes on a loaded machine.
    wait_no_registration_left(&standin, Duration::from_secs(240), &hosts).await;
    stop_all(hosts).await;
}

#[actix_rt::test]
async fn a_cordoned_host_gives_its_unstarted_jobs_to_the_fleet_at_once() {
    let Some(pg) = Postgres::start() else { return };
    let standin = support::standin(100);
    let broken = broken_pool();
    let h1 = host(&pg, &standin, "h1", &broken).await;
    standin.queue_jobs("app", LINUX, 3);
    let held = wait_held_with_failures(&pg, "h1", 3, std::slice::from_ref(&h1)).await;
    // h2 comes up while h1 holds them: it may not take them while h1's lease is current.
    let h2 = host(&pg, &standin, "h2", &pool("cpu", LINUX, 4)).await;
    let hosts = [h1, h2];
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(standin.jobs_in("completed"), 0, "{}", logs(&hosts));
    let (code, out, err) = hosts[0].ctl(&["cordon"]).await;
    assert_eq!(code, 0, "{out}{err}");
    // Well inside h1's 30 s lease: the jobs went back at the cordon, not at a lease expiry.
    wait_completed(&standin, 3, Duration::from_secs(20), &hosts).await;
    for id in held {
        let detail = hosts[1].ctl_json(&["jobs", &id]).await;
        assert!(
            detail["job"]["timeline"]
                .to_string()
                .contains("released to the fleet by h1"),
            "{detail}"
        );
    }
    stop_all(hosts).await;
}

/// A cordon that finds each job with a runner still booting releases none of them at once;
/// when those runners fail, the cordoned host may not keep the jobs it will never claim again
/// (its lease stays current, so no other host would take them): they go to the fleet too.
#[actix_rt::test]
async fn a_job_whose_runner_fails_after_the_cordon_goes_to_the_fleet() {
    let Some(pg) = Postgres::start() else { return };
    let standin = support::standin(100);
    let slow_to_fail = pool_running("command = \"/bin/sh\"\nargs = [\"-c\", \"sleep 4; exit 1\"]");
    let h1 = host(&pg, &standin, "h1", &slow_to_fail).await;
    standin.queue_jobs("app", LINUX, 3);
    crate::support::provision::eventually(
        "h1 has a runner booting for each job",
        Duration::from_secs(30),
        || {
            pg.query("SELECT name FROM ephemer_registrations WHERE host = 'h1' AND gone_at IS NULL")
                .len()
                >= 3
        },
    )
    .await;
    let h2 = host(&pg, &standin, "h2", &pool("cpu", LINUX, 4)).await;
    let hosts = [h1, h2];
    let (code, out, err) = hosts[0].ctl(&["cordon"]).await;
    assert_eq!(code, 0, "{out}{err}");
    // Well inside h1's 30 s lease, which it keeps renewing while cordoned.
    wait_completed(&standin, 3, Duration::from_secs(25), &hosts).await;
    // A job h1 held may have run on one of h2's runners (a runner takes the oldest queued job
    // with its labels) before h1's own runner for it failed: h1 then heard it start and kept
    // it, done. What h1 may not keep is a job not started; the ends of the jobs reach the
    // ledger within a second or so.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let held =
            pg.query("SELECT job_id FROM ephemer_jobs WHERE holder = 'h1' AND phase = 'held'");
        if held.is_empty() {
            break;
        }
        let all = pg.query(
            "SELECT job_id || ' ' || phase || ' ' || coalesce(holder, '-') FROM ephemer_jobs",
        );
        assert!(
            tokio::time::Instant::now() < deadline,
            "h1 still holds {held:?} unstarted: {all:?}\n{}",
            logs(&hosts)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    stop_all(hosts).await;
}

#[actix_rt::test]
async fn a_ledger_with_a_newer_schema_is_refused() {
    let Some(pg) = Postgres::start() else { return };
    pg.query(
        "CREATE TABLE ephemer_schema (version integer NOT NULL, \
         applied_at timestamptz NOT NULL DEFAULT now()); \
         INSERT INTO ephemer_schema (version) VALUES (99)",
    );
    let standin = support::standin(100);
    let dir = tempfile::tempdir().unwrap();
    let text = support::daemon::config(
        &standin,
        support::daemon::free_port(),
        &dir.path().join("state"),
        "0s",
        &extra(&pg, "h1", "30s", ""),
        &pool("cpu", LINUX, 1),
    );
    let cfg = support::write_file(dir.path(), "ephemer.toml", &text);
    let mut serve = support::daemon();
    serve.arg("serve").arg("--config").arg(&cfg);
    let (code, out, err) = support::output(serve).await;
    assert_eq!(code, 1, "{out}{err}");
    assert!(
        err.contains("version 99, newer than this binary knows (4)"),
        "{err}"
    );
    // Nothing was written over it.
    assert_eq!(pg.query("SELECT max(version) FROM ephemer_schema"), ["99"]);
}

#[actix_rt::test]
async fn the_ledger_over_tls_trusts_github_ca_file_only() {
    let ca = crate::support::tls::test_ca();
    let Some(pg) = Postgres::start_tls(&ca.server) else {
        return;
    };
    assert!(pg.url().ends_with("sslmode=require"));
    let standin = support::standin(100);
    let dir = tempfile::tempdir().unwrap();
    let ca_file = support::write_file(dir.path(), "ca.pem", &ca.ca_pem);
    let trusting = format!("ca_file = \"{}\"", ca_file.display());
    let d = Daemon::start_with_github(
        &standin,
        &trusting,
        &extra(&pg, "h1", "30s", ""),
        &pool("cpu", LINUX, 2),
    )
    .await;
    standin.queue_jobs("app", LINUX, 2);
    wait_completed(
        &standin,
        2,
        Duration::from_secs(30),
        std::slice::from_ref(&d),
    )
    .await;
    let (_, doctor, _) = d.ctl(&["doctor"]).await;
    assert!(doctor.contains("connected; schema version 4"), "{doctor}");
    stop_all([d]).await;

    // Without the CA the server's certificate is not trusted: doctor says so.
    let text = support::daemon::config(
        &standin,
        support::daemon::free_port(),
        &dir.path().join("state2"),
        "0s",
        &extra(&pg, "h2", "30s", ""),
        &pool("cpu", LINUX, 1),
    );
    let cfg = support::write_file(dir.path(), "untrusting.toml", &text);
    let mut doctor = support::daemon();
    doctor.arg("doctor").arg("--config").arg(&cfg);
    let (_, out, err) = support::output(doctor).await;
    let line = out
        .lines()
        .find(|l| l.contains("cluster.url"))
        .unwrap_or_default();
    assert!(
        line.contains("FAIL") || line.to_lowercase().contains("fail"),
        "{out}{err}"
    );
}

#[actix_rt::test]
async fn the_fleet_s_most_specific_pool_asks_first() {
    let Some(pg) = Postgres::start() else { return };
    let standin = support::standin(100);
    let wider = pool("big", &["self-hosted", "linux", "x64", "big"], 4);
    let h1 = host(&pg, &standin, "h1", &wider).await;
    let h2 = host(&pg, &standin, "h2", &pool("cpu", LINUX, 4)).await;
    let hosts = [h1, h2];
    // Every delivery lands on both hosts; h1's pool has one label more than the jobs need, so
    // h2, with the exact pool, asks first.
    route_to(&standin, &hosts, 1.0);
    for _ in 0..8 {
        standin.queue_jobs("app", LINUX, 1);
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    wait_completed(&standin, 8, Duration::from_secs(30), &hosts).await;
    assert_eq!(
        pg.query("SELECT DISTINCT host FROM ephemer_claims"),
        ["h2"],
        "{}",
        logs(&hosts)
    );
    stop_all(hosts).await;
}
