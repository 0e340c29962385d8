//! Redelivery of failed deliveries: the daemon is down while jobs are queued, so the stand-in
//! (as GitHub) logs those deliveries as failed and never sends them again by itself; after the
//! restart the daemon lists the hook's deliveries and asks for each failed one once, and the
//! jobs run with no reconcile poll at all. For an org hook found by its public URL, and for a
//! GitHub App's own hook read with the App's JWT.

use std::time::Duration;

use github_standin::{Standin, org::Hook};

use crate::support::{
    daemon::{Daemon, local_provider},
    provision::eventually,
};

const LABELS: &[&str] = &["self-hosted", "linux"];
/// The URL GitHub posts to: a proxy in front of the daemon's loopback listener.
const PUBLIC_URL: &str = "https://ci.example.com/webhook/github";

pub(crate) fn org_hook(id: u64, url: &str) -> Hook {
    Hook {
        id,
        url: url.into(),
        content_type: "json".into(),
        events: vec!["workflow_job".into()],
        active: true,
        secret: true,
        deliveries: Vec::new(),
        repo: None,
    }
}

/// Queues `n` jobs while the daemon is down and waits until the stand-in logged each of their
/// deliveries as failed (no answer). Only first deliveries count: in a fleet whose hook points
/// nowhere, a pass may redeliver (and fail) the first few before the last one is sent.
async fn queue_while_down(standin: &Standin, n: usize) {
    let failed = || {
        standin
            .deliveries()
            .iter()
            .filter(|d| d.status == 0 && !d.redelivery)
            .count()
    };
    let before = failed();
    standin.queue_jobs("app", LABELS, n);
    eventually("the deliveries fail", Duration::from_secs(30), || {
        failed() >= before + n
    })
    .await;
}

fn metric(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
        .unwrap_or(0.0)
}

#[actix_rt::test]
async fn deliveries_failed_while_down_are_redelivered_once_after_a_restart() {
    let standin = crate::support::standin(100);
    standin.add_hook(org_hook(7, PUBLIC_URL));
    standin.add_hook(org_hook(8, "https://elsewhere.example.com/hook"));
    standin.set_public_url(PUBLIC_URL);
    let webhook =
        format!("[webhook]\npublic_url = \"{PUBLIC_URL}\"\nredeliver_interval = \"10s\"\n");
    let daemon = Daemon::start(&standin, &webhook, &local_provider(4)).await;
    standin.queue_jobs("app", LABELS, 2);
    daemon
        .wait_completed(&standin, 2, Duration::from_secs(30))
        .await;
    // Every delivery so far answered (queued, in_progress, completed of each), before the kill.
    eventually(
        "the first jobs' deliveries",
        Duration::from_secs(10),
        || {
            let d = standin.deliveries();
            d.len() == 6 && d.iter().all(|d| d.status == 202)
        },
    )
    .await;
    let left = daemon.kill9().await;

    queue_while_down(&standin, 10).await;
    let lists_before = standin.count("list_hook_deliveries");
    let daemon = Daemon::resume(&standin, left).await;
    daemon
        .wait_completed(&standin, 12, Duration::from_secs(30))
        .await;
    // Every call went to hook 7 (the one whose URL is the public URL), none to hook 8.
    assert!(
        standin
            .calls()
            .iter()
            .filter(|c| c.endpoint.contains("hook_deliver"))
            .all(|c| c.path.starts_with("/orgs/acme/hooks/7/")),
        "{:?}",
        standin.calls_to("list_hook_deliveries")
    );
    assert_eq!(standin.count("redeliver_hook_delivery"), 10);
    assert_eq!(
        standin.count("list_hook_deliveries") - lists_before,
        1,
        "one list call found all ten"
    );
    // No reconcile was needed (it is off): no run was ever listed.
    assert_eq!(standin.count("list_runs"), 0);
    let redelivered: Vec<_> = standin
        .deliveries()
        .into_iter()
        .filter(|d| d.redelivery)
        .collect();
    assert_eq!(redelivered.len(), 10);
    assert!(
        redelivered.iter().all(|d| d.status == 202),
        "{redelivered:?}"
    );

    // The next pass finds nothing to ask for.
    let lists = standin.count("list_hook_deliveries");
    eventually("a second pass", Duration::from_secs(25), || {
        standin.count("list_hook_deliveries") > lists
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(standin.count("redeliver_hook_delivery"), 10);
    let text = daemon.metrics().await;
    assert_eq!(
        metric(
            &text,
            "ephemerd_webhook_redeliveries_total{outcome=\"requested\"}"
        ),
        10.0
    );
    assert_eq!(
        metric(
            &text,
            "ephemerd_webhook_redeliveries_total{outcome=\"recovered\"}"
        ),
        10.0
    );
    daemon.wait_no_runner_left(&standin).await;
    assert_eq!(daemon.stop(Duration::from_secs(30)).await.0, Some(0));
}

/// A repository hook named by `webhook.hook_id` (no public URL needed): found among the
/// configured repo's hooks, and its failed deliveries redelivered.
#[actix_rt::test]
async fn a_repo_hook_named_by_its_id_is_watched() {
    let standin = crate::support::standin(100);
    let mut hook = org_hook(31, "https://ci.example.com/anything");
    hook.repo = Some("app".into());
    standin.add_hook(hook);
    standin.set_public_url("https://ci.example.com/anything");
    let daemon = Daemon::start(&standin, "[webhook]\nhook_id = 31\n", &local_provider(4)).await;
    let left = daemon.kill9().await;
    queue_while_down(&standin, 3).await;
    let daemon = Daemon::resume(&standin, left).await;
    daemon
        .wait_completed(&standin, 3, Duration::from_secs(30))
        .await;
    let asked = standin.calls_to("redeliver_hook_delivery");
    assert_eq!(asked.len(), 3);
    assert!(
        asked
            .iter()
            .all(|c| c.path.starts_with("/repos/acme/app/hooks/31/deliveries/")),
        "{asked:?}"
    );
    assert_eq!(daemon.stop(Duration::from_secs(30)).await.0, Some(0));
}

#[actix_rt::test]
async fn a_github_app_s_own_hook_is_read_with_its_jwt_and_redelivers() {
    let fixtures = crate::support::repo_root().join("tests/fixtures");
    let public = std::fs::read_to_string(fixtures.join("app-key.pub.pem")).unwrap();
    let standin = Standin::start(github_standin::StandinConfig {
        app_public_key: Some(public),
        ..github_standin::StandinConfig::default()
    })
    .unwrap();
    let github = format!(
        "app_id = 4242\ninstallation_id = 77\nprivate_key_path = \"{}\"\n",
        fixtures.join("app-key.pem").display()
    );
    let daemon = Daemon::start_with_github(&standin, &github, "", &local_provider(4)).await;
    let url = format!("http://{}/webhook/github", daemon.addr);
    standin.set_app_hook(&url, crate::support::daemon::SECRET);
    let left = daemon.kill9().await;

    queue_while_down(&standin, 5).await;
    let daemon = Daemon::resume(&standin, left).await;
    standin.set_app_hook(&url, crate::support::daemon::SECRET);
    daemon
        .wait_completed(&standin, 5, Duration::from_secs(30))
        .await;
    assert_eq!(standin.count("redeliver_app_hook_delivery"), 5);
    // The stand-in answers /app/hook only to a valid App JWT: every call was answered.
    let app_calls: Vec<_> = standin
        .calls()
        .into_iter()
        .filter(|c| c.endpoint.contains("app_hook"))
        .collect();
    assert!(
        app_calls
            .iter()
            .filter(|c| c.endpoint == "redeliver_app_hook_delivery")
            .all(|c| c.status == 202),
        "{app_calls:?}"
    );
    assert!(
        app_calls
            .iter()
            .any(|c| c.endpoint == "list_app_hook_deliveries" && c.status == 200)
    );
    assert_eq!(standin.count("list_runs"), 0);
    daemon.wait_no_runner_left(&standin).await;
    assert_eq!(daemon.stop(Duration::from_secs(30)).await.0, Some(0));
}

/// A fleet of two hosts watching the same hook asks GitHub once per failed delivery, not once
/// per host: the ledger decides which host asks. The hook points nowhere throughout, so every
/// attempt, redeliveries included, fails and both hosts' passes keep seeing only failures.
#[actix_rt::test]
async fn a_fleet_asks_once_per_failed_delivery() {
    use crate::cluster::{extra, pool};
    let Some(pg) = crate::support::postgres::Postgres::start() else {
        return;
    };
    let standin = crate::support::standin(100);
    standin.add_hook(org_hook(7, PUBLIC_URL));
    standin.set_public_url(PUBLIC_URL);
    let more = format!("[webhook]\npublic_url = \"{PUBLIC_URL}\"\nredeliver_interval = \"10s\"\n");
    let linux = &["self-hosted", "linux", "x64"];
    let mut hosts = Vec::new();
    for host in ["h1", "h2"] {
        let config = extra(&pg, host, "30s", &more);
        hosts.push(Daemon::start(&standin, &config, &pool("cpu", linux, 4)).await);
    }
    standin.send_webhooks_to(
        "http://127.0.0.1:9/webhook/github",
        crate::support::daemon::SECRET,
    );
    queue_while_down(&standin, 6).await;
    // Two more passes of each host after the failures.
    let lists = standin.count("list_hook_deliveries");
    eventually("two passes of each host", Duration::from_secs(40), || {
        standin.count("list_hook_deliveries") >= lists + 4
    })
    .await;
    assert_eq!(standin.count("redeliver_hook_delivery"), 6);
    assert_eq!(pg.query("SELECT count(*) FROM ephemer_redeliveries"), ["6"]);
    let redelivered = standin.deliveries().iter().filter(|d| d.redelivery).count();
    assert_eq!(redelivered, 6);
    for h in hosts {
        h.stop(Duration::from_secs(30)).await;
    }
}
