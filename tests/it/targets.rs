//! Several GitHub owners in one daemon (`[[github.targets]]`), each behind its own stand-in
//! GitHub with its own credential, budget and webhook secret: both owners' jobs run; one
//! owner's empty registration budget holds back only that owner's claims; a delivery signed
//! with one owner's secret cannot speak for another; and a burst from one owner does not
//! starve the other of slots.

use std::time::Duration;

use github_standin::{Standin, StandinConfig};

use crate::support::daemon::{Daemon, free_port};

const LABELS: &[&str] = &["self-hosted", "linux"];

/// A stand-in GitHub for `owner`, accepting `token`, whose runners take `job_ms` per job.
pub(crate) fn owner(owner: &str, token: &str, job_ms: u64) -> Standin {
    let s = Standin::start(StandinConfig {
        owner: owner.into(),
        token: token.into(),
        ..StandinConfig::default()
    })
    .unwrap();
    s.set_behavior(github_standin::RunnerBehavior {
        job_ms,
        ..github_standin::RunnerBehavior::default()
    });
    s
}

/// Two targets, `acme` on `a` and `beta` on `b`, sharing `slots` local slots; A's token and
/// secret come from the environment (`${NAME}` references). `more`: more tables.
pub(crate) fn config(
    a: &Standin,
    b: &Standin,
    slots: usize,
    more: &str,
    port: u16,
    state: &std::path::Path,
) -> String {
    format!(
        r#"
[[github.targets]]
owner = "acme"
api_url = "{a}"
token = "${{ACME_TOKEN}}"
webhook_secret = "${{ACME_SECRET}}"

[[github.targets]]
name = "beta-org"
owner = "beta"
api_url = "{b}"
token = "tok-b"
webhook_secret = "secret-b"

[webhook]
listen = "127.0.0.1:{port}"
reconcile_interval = "0s"
redeliver = false

[runner]
max_concurrent = {slots}
name_prefix = "t{port}"

[runner.claim_retry]
rate_reset_jitter = ["1s", "2s"]

[state]
dir = "{state}"

[admin]
listen = "127.0.0.1:{admin}"

[log]
level = "debug"

[providers.local]
command = "{bin}"
args = ["standin-runner"]
labels = ["self-hosted", "linux", "x64"]
max_concurrent = {slots}
allow_root = true

{more}
"#,
        a = a.url(),
        b = b.url(),
        state = state.display(),
        admin = free_port(),
        bin = env!("CARGO_BIN_EXE_ephemer-actors"),
    )
}

pub(crate) const ENV: &[(&str, &str)] = &[("ACME_TOKEN", "tok-a"), ("ACME_SECRET", "secret-a")];

async fn start(a: &Standin, b: &Standin, slots: usize) -> Daemon {
    let daemon =
        Daemon::start_config(|port, state| config(a, b, slots, "", port, state), ENV).await;
    let url = format!("http://{}/webhook/github", daemon.addr);
    a.send_webhooks_to(&url, "secret-a");
    b.send_webhooks_to(&url, "secret-b");
    daemon
}

pub(crate) async fn wait_for(
    what: &str,
    daemon: &Daemon,
    within: Duration,
    done: impl Fn() -> bool,
) {
    let deadline = tokio::time::Instant::now() + within;
    while !done() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what} did not happen within {within:?}\n{}",
            daemon.logs()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[actix_rt::test]
async fn two_owners_run_side_by_side_and_an_empty_budget_holds_back_only_its_own() {
    let a = owner("acme", "tok-a", 100);
    let b = owner("beta", "tok-b", 100);
    let daemon = start(&a, &b, 4).await;
    a.queue_jobs("app", LABELS, 3);
    b.queue_jobs("app", LABELS, 3);
    daemon.wait_completed(&a, 3, Duration::from_secs(30)).await;
    daemon.wait_completed(&b, 3, Duration::from_secs(30)).await;

    // A's registration budget runs dry for 8 s (GitHub's budgets are per credential: B's
    // is untouched).
    let reset = a.exhaust_bucket_for("actions_runner_registration", Duration::from_secs(8));
    a.queue_jobs("app", LABELS, 3);
    b.queue_jobs("app", LABELS, 3);
    daemon.wait_completed(&b, 6, Duration::from_secs(15)).await;
    assert_eq!(
        a.jobs_in("completed"),
        3,
        "A's jobs wait for A's reset while B's ran: A {:?}\nB {:?}\nreset {reset}\n{}",
        a.calls(),
        b.calls(),
        daemon.logs()
    );
    // A's first refused claim told the daemon the budget is empty; no more were spent on it.
    let refused = a
        .calls_to("generate_jitconfig")
        .into_iter()
        .filter(|c| c.status == 403)
        .count();
    assert!((1..=3).contains(&refused), "{refused} refused claims at A");
    assert!(
        b.calls_to("generate_jitconfig")
            .iter()
            .all(|c| c.status == 201),
        "every claim at B succeeded"
    );
    daemon.wait_completed(&a, 6, Duration::from_secs(40)).await;
    let last_claim_ms = a
        .calls_to("generate_jitconfig")
        .into_iter()
        .filter(|c| c.status == 201)
        .map(|c| c.at_ms)
        .max()
        .unwrap();
    assert!(
        last_claim_ms >= u128::from(reset) * 1000,
        "A's claims waited for its reset"
    );
    daemon.wait_no_runner_left(&a).await;
    daemon.wait_no_runner_left(&b).await;

    // Each target's budget is read and shown on its own.
    let metrics = daemon.metrics().await;
    for target in ["acme", "beta-org"] {
        assert!(
            metrics.contains(&format!(
                "ephemerd_github_api_rate_remaining{{resource=\"actions_runner_registration\",target=\"{target}\"}}"
            )),
            "{target}:\n{metrics}"
        );
    }
    let status = daemon.ctl_json(&["status"]).await;
    let targets = status["targets"].as_array().expect("targets in status");
    let names: Vec<&str> = targets.iter().filter_map(|t| t["name"].as_str()).collect();
    assert_eq!(names, ["acme", "beta-org"], "{status:#}");
    assert_eq!(
        targets[0]["rate"]["actions_runner_registration"]["limit"], 5000,
        "{status:#}"
    );
    assert_eq!(daemon.stop(Duration::from_secs(30)).await.0, Some(0));
}

#[actix_rt::test]
async fn a_delivery_signed_with_one_owners_secret_cannot_speak_for_another() {
    let a = owner("acme", "tok-a", 100);
    let b = owner("beta", "tok-b", 100);
    let daemon = start(&a, &b, 2).await;
    // A's hook posts a job that names owner beta: signed with A's secret, it is refused.
    let forged = a.deliver_foreign_job("beta", "app", None, LABELS);
    // One naming an owner no target has (and no hook or App a target has) is claimed by no
    // target: refused without a hash, whatever its signature.
    let stray = a.deliver_foreign_job("gamma", "app", None, LABELS);
    let status_of = |id: u64| {
        a.deliveries()
            .into_iter()
            .find(|d| d.job_id == id)
            .map(|d| d.status)
    };
    wait_for(
        "both deliveries answered",
        &daemon,
        Duration::from_secs(10),
        || status_of(forged).is_some() && status_of(stray).is_some(),
    )
    .await;
    assert_eq!(status_of(forged), Some(401));
    assert_eq!(status_of(stray), Some(401));
    let metrics = daemon.metrics().await;
    assert!(
        metrics.contains("ephemerd_webhook_refused_total{reason=\"bad_signature\"} 2"),
        "{metrics}"
    );
    // Nothing changed: no job recorded, no call at either GitHub (beyond the listing of
    // leftover runners each target gets at start).
    let (code, out, err) = daemon.ctl(&["jobs", &forged.to_string()]).await;
    assert_ne!(code, 0, "no job {forged} is known: {out}{err}");
    for standin in [&a, &b] {
        let calls: Vec<_> = standin
            .calls()
            .into_iter()
            .filter(|c| c.endpoint != "list_runners")
            .collect();
        assert!(calls.is_empty(), "{calls:?}");
    }
    // B's own deliveries, signed with B's secret, run.
    b.queue_jobs("app", LABELS, 2);
    daemon.wait_completed(&b, 2, Duration::from_secs(30)).await;
    assert_eq!(daemon.stop(Duration::from_secs(30)).await.0, Some(0));
}

#[actix_rt::test]
async fn a_burst_from_one_owner_does_not_starve_the_other() {
    let a = owner("acme", "tok-a", 400);
    let b = owner("beta", "tok-b", 400);
    let daemon = start(&a, &b, 2).await;
    a.queue_jobs("app", LABELS, 20);
    wait_for("A's burst taken", &daemon, Duration::from_secs(10), || {
        a.deliveries().iter().filter(|d| d.status == 202).count() >= 20
    })
    .await;
    b.queue_jobs("app", LABELS, 2);
    daemon.wait_completed(&b, 2, Duration::from_secs(60)).await;
    daemon.wait_completed(&a, 20, Duration::from_secs(60)).await;
    let picked = |s: &Standin| {
        let mut at: Vec<u128> = s.jobs().iter().filter_map(|j| j.picked_at_ms).collect();
        at.sort_unstable();
        at
    };
    let (a_picked, b_picked) = (picked(&a), picked(&b));
    assert_eq!(a_picked.len(), 20, "{a_picked:?}");
    assert!(
        b_picked[0] < a_picked[4],
        "B's first job started at {} ms, after A's fifth at {} ms",
        b_picked[0],
        a_picked[4]
    );
    assert_eq!(daemon.stop(Duration::from_secs(30)).await.0, Some(0));
}
