//! End to end: the real `ephemer-actors serve` binary, the stand-in GitHub sending signed
//! webhooks, and stand-in runners started by the local provisioner (and by Podman). Timing
//! bounds are generous; exact ladder timing is pinned by the paused-time unit tests.

use std::time::Duration;

use github_standin::{DeliveryFaults, Standin};

use crate::support::{
    daemon::{Daemon, linux_provider, local_provider},
    podman::{IMAGE, Podman},
    provision::eventually,
};

const LABELS: &[&str] = &["self-hosted", "linux"];

#[actix_rt::test]
async fn twenty_jobs_twenty_claims_nothing_left() {
    let standin = crate::support::standin(200);
    let daemon = Daemon::start(&standin, "", &local_provider(6)).await;
    standin.queue_jobs("app", LABELS, 20);
    daemon
        .wait_completed(&standin, 20, Duration::from_secs(90))
        .await;
    daemon.wait_no_runner_left(&standin).await;
    let (_, heals) = daemon.assert_claims_per_job(&standin, 20);
    // The one call that is not per job: the start-up listing of registrations no ledger names.
    // When no runner raced its job (no heal), that is the whole bill.
    let calls: Vec<_> = standin
        .calls()
        .into_iter()
        .filter(|c| c.endpoint != "list_runners")
        .collect();
    if heals == 0 {
        assert_eq!(
            calls.len(),
            20,
            "one API call per job on the happy path: {calls:?}"
        );
    }
    assert_eq!(standin.count("list_runners"), 1);
    let metrics = daemon.metrics().await;
    assert!(
        metrics.contains("ephemerd_github_webhook_events_total{action=\"queued\"} 20"),
        "{metrics}"
    );
    let (code, logs) = daemon.stop(Duration::from_secs(30)).await;
    assert_eq!(code, Some(0), "{logs}");
    assert!(
        !logs.contains(crate::support::daemon::SECRET)
            && !logs.contains(crate::support::daemon::TOKEN),
        "no secret in the logs"
    );
}

#[actix_rt::test]
async fn each_job_delivered_three_times_is_claimed_once() {
    let standin = crate::support::standin(200);
    standin.set_delivery_faults(DeliveryFaults {
        extra_copies: 1,
        replays: 1,
        ..DeliveryFaults::default()
    });
    let daemon = Daemon::start(&standin, "", &local_provider(4)).await;
    standin.queue_jobs("app", LABELS, 8);
    daemon
        .wait_completed(&standin, 8, Duration::from_secs(60))
        .await;
    daemon.wait_no_runner_left(&standin).await;
    let queued: Vec<_> = standin
        .deliveries()
        .into_iter()
        .filter(|d| d.action == "queued")
        .collect();
    assert_eq!(queued.len(), 24, "three deliveries per job");
    // One claim per job: a duplicate or replayed delivery never claims (a heal may).
    daemon.assert_claims_per_job(&standin, 8);
    assert_eq!(daemon.stop(Duration::from_secs(30)).await.0, Some(0));
}

#[actix_rt::test]
async fn a_transient_502_heals_through_the_ladder() {
    let standin = crate::support::standin(100);
    let ladder = "[runner.claim_retry]\nschedule = [\"1s\", \"2s\", \"4s\"]\njitter = 0.0\n";
    let daemon = Daemon::start(&standin, ladder, &local_provider(2)).await;
    standin.fail_status("generate_jitconfig", 502, 2);
    standin.queue_jobs("app", LABELS, 1);
    daemon
        .wait_completed(&standin, 1, Duration::from_secs(30))
        .await;
    let claims: Vec<_> = standin.calls_to("generate_jitconfig");
    assert_eq!(
        claims.iter().map(|c| c.status).collect::<Vec<_>>(),
        vec![502, 502, 201]
    );
    let gap = |a: usize, b: usize| (claims[b].at_ms - claims[a].at_ms) as f64 / 1000.0;
    assert!(
        (0.8..2.5).contains(&gap(0, 1)) && (1.8..4.0).contains(&gap(1, 2)),
        "ladder gaps {} {}",
        gap(0, 1),
        gap(1, 2)
    );
    assert!(
        daemon
            .metrics()
            .await
            .contains("ephemerd_claim_retry_attempts_total{class=\"server_side\"} 2")
    );
    assert_eq!(daemon.stop(Duration::from_secs(30)).await.0, Some(0));
}

#[actix_rt::test]
async fn a_rate_limit_window_is_waited_out_until_the_reset() {
    let standin = crate::support::standin(100);
    let extra = "[runner.claim_retry]\nschedule = [\"1s\"]\nrate_reset_jitter = [\"1s\", \"2s\"]\n";
    let daemon = Daemon::start(&standin, extra, &local_provider(2)).await;
    let reset = standin.exhaust_for(Duration::from_secs(4));
    standin.queue_jobs("app", LABELS, 2);
    daemon
        .wait_completed(&standin, 2, Duration::from_secs(40))
        .await;
    let claims: Vec<_> = standin.calls_to("generate_jitconfig");
    let ok: Vec<_> = claims.iter().filter(|c| c.status == 201).collect();
    assert_eq!(ok.len(), 2);
    for c in &ok {
        assert!(
            c.at_ms / 1000 >= u128::from(reset),
            "claimed before the reset: {c:?}"
        );
    }
    // Waiting for the reset, not hammering: one failed attempt per job, then the snap.
    let failed = claims.iter().filter(|c| c.status == 403).count();
    assert!(failed <= 4, "{failed} failed claims during the window");
    assert_eq!(daemon.stop(Duration::from_secs(30)).await.0, Some(0));
}

#[actix_rt::test]
async fn sigterm_with_a_running_job_drains_it_and_exits_0() {
    let standin = crate::support::standin(3000);
    let daemon = Daemon::start(&standin, "", &local_provider(2)).await;
    standin.queue_jobs("app", LABELS, 1);
    eventually("the job to start", Duration::from_secs(20), || {
        standin.jobs_in("in_progress") == 1
    })
    .await;
    let (code, logs) = daemon.stop(Duration::from_secs(30)).await;
    assert_eq!(code, Some(0), "{logs}");
    assert_eq!(
        standin.jobs_in("completed"),
        1,
        "the running job finished before exit:\n{logs}"
    );
    assert!(standin.runners().is_empty());
}

#[actix_rt::test]
async fn jobs_run_in_podman_containers_through_the_daemon() {
    let Some(podman) = Podman::start().await else {
        return;
    };
    let standin = crate::support::standin(200);
    let providers = linux_provider(
        &podman.socket,
        IMAGE,
        3,
        "command = [\"/usr/local/bin/ephemer-actors\", \"standin-runner\"]\nnetwork = \"host\"",
    );
    let daemon = Daemon::start(&standin, "", &providers).await;
    standin.queue_jobs("app", LABELS, 4);
    daemon
        .wait_completed(&standin, 4, Duration::from_secs(120))
        .await;
    daemon.wait_no_runner_left(&standin).await;
    daemon.assert_claims_per_job(&standin, 4);
    let ours = format!("{}-linux-", daemon.prefix());
    assert_eq!(daemon.stop(Duration::from_secs(30)).await.0, Some(0));
    let names = podman.container_names().await;
    assert!(!names.contains(&ours), "containers left: {names}");
}

/// A hook created with content type `form` delivers `payload=<JSON>`: its jobs run like any.
#[actix_rt::test]
async fn form_encoded_deliveries_run_their_jobs() {
    let standin = crate::support::standin(100);
    let daemon = Daemon::start(&standin, "", &local_provider(2)).await;
    standin.send_form_webhooks_to(
        &format!("http://{}/webhook/github", daemon.addr),
        crate::support::daemon::SECRET,
    );
    standin.queue_jobs("app", LABELS, 2);
    daemon
        .wait_completed(&standin, 2, Duration::from_secs(30))
        .await;
    assert!(
        standin
            .deliveries()
            .iter()
            .filter(|d| d.action == "queued")
            .all(|d| d.status == 202)
    );
    daemon.assert_claims_per_job(&standin, 2);
    assert_eq!(daemon.stop(Duration::from_secs(30)).await.0, Some(0));
}

/// A GitHub App whose installation-token exchange fails once with a 502: the claim climbs one
/// rung of the ladder and runs, instead of being dropped as non-retryable until a reconcile.
#[actix_rt::test]
async fn a_failed_app_token_exchange_delays_a_claim_by_one_rung() {
    let fixtures = crate::support::repo_root().join("tests/fixtures");
    let public = std::fs::read_to_string(fixtures.join("app-key.pub.pem")).unwrap();
    // Tokens that live 4 minutes are inside the refresh margin: every call exchanges anew.
    let standin = Standin::start(github_standin::StandinConfig {
        app_public_key: Some(public),
        installation_token_ttl: Duration::from_secs(240),
        ..github_standin::StandinConfig::default()
    })
    .unwrap();
    let github = format!(
        "app_id = 4242\ninstallation_id = 77\nprivate_key_path = \"{}\"\n",
        fixtures.join("app-key.pem").display()
    );
    let ladder = "[runner.claim_retry]\nschedule = [\"1s\"]\njitter = 0.0\n";
    let daemon = Daemon::start_with_github(&standin, &github, ladder, &local_provider(2)).await;
    // The start-up cleanup lists runners (with an exchange of its own) first: fail the claim's.
    eventually(
        "the start-up runner listing",
        Duration::from_secs(10),
        || standin.count("list_runners") >= 1,
    )
    .await;
    standin.fail_status("access_tokens", 502, 1);
    standin.queue_jobs("app", LABELS, 1);
    daemon
        .wait_completed(&standin, 1, Duration::from_secs(30))
        .await;
    let exchanges = standin.calls_to("access_tokens");
    let failed = exchanges.iter().position(|c| c.status == 502).unwrap();
    let next = &exchanges[failed + 1];
    let gap = (next.at_ms - exchanges[failed].at_ms) as f64 / 1000.0;
    assert!((0.8..3.0).contains(&gap), "retried after {gap} s");
    assert_eq!(standin.calls_to("generate_jitconfig").len(), 1);
    assert!(
        daemon
            .metrics()
            .await
            .contains("ephemerd_claim_retry_attempts_total{class=\"server_side\"} 1")
    );
    // A job delivered for another installation of the App (installed org-wide elsewhere) is
    // none of ours: ignored, no claim.
    standin.deliver_foreign_job("acme", "app", Some(999), LABELS);
    let ignored = "ephemerd_webhook_ignored_total{reason=\"installation\"} 1";
    crate::support::provision::eventually_async(
        "the other installation's job ignored",
        Duration::from_secs(10),
        || async { daemon.metrics().await.contains(ignored) },
    )
    .await;
    assert_eq!(standin.calls_to("generate_jitconfig").len(), 1);
    assert_eq!(daemon.stop(Duration::from_secs(30)).await.0, Some(0));
}

/// GitHub sent deliveries naming another App's installation in June 2026 (runs-on#509): one
/// for a job of the daemon's own owner is said with its ids and counted, not acted on and not
/// remembered, and the next reconcile pass (listing with the daemon's own installation) runs
/// the job.
#[actix_rt::test]
async fn a_delivery_naming_an_unknown_installation_is_counted_and_its_job_found_by_the_reconcile() {
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
    let daemon = Daemon::start_full(&standin, "3s", &github, "", &local_provider(2)).await;
    let id = standin.queue_job_mislabelled("app", LABELS, 31_337);
    daemon
        .wait_completed(&standin, 1, Duration::from_secs(60))
        .await;
    let metrics = daemon.metrics().await;
    assert!(
        metrics.contains("ephemerd_webhook_unknown_installation_total 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains("ephemerd_reconcile_readmitted_total{reason=\"unknown\"} 1"),
        "found by the reconcile: {metrics}"
    );
    let logs = daemon.logs();
    let said = logs
        .lines()
        .find(|l| l.contains("an App installation this daemon does not know"))
        .unwrap_or_else(|| panic!("not said:\n{logs}"));
    assert!(
        said.contains(&format!("job_id={id}"))
            && said.contains("installation=31337")
            && said.contains("ours=77"),
        "{said}"
    );
    assert_eq!(daemon.stop(Duration::from_secs(30)).await.0, Some(0));
}

/// An org webhook also delivers jobs of repos this daemon does not serve (a public repo taking
/// fork PRs, say), and of other accounts: with `repos = ["app"]` they are answered 202, cost no
/// API call, are counted by reason, and `jobs ID` says why; the served repo's job runs. (The
/// daemon here uses a token, so a delivery's installation id is not checked; the core tests
/// cover the installation with App auth.)
#[actix_rt::test]
async fn jobs_outside_the_configured_repos_cost_nothing() {
    let standin = crate::support::standin(100);
    let daemon = Daemon::start(&standin, "", &local_provider(2)).await;
    let mut foreign = standin.queue_jobs("fork-prs", LABELS, 2);
    foreign.push(standin.deliver_foreign_job("someone-else", "app", None, LABELS));
    standin.queue_jobs("app", LABELS, 1);
    daemon
        .wait_completed(&standin, 1, Duration::from_secs(30))
        .await;
    let metrics = daemon.metrics().await;
    for (reason, n) in [("repo", 2), ("owner", 1)] {
        assert!(
            metrics.contains(&format!(
                "ephemerd_webhook_ignored_total{{reason=\"{reason}\"}} {n}"
            )),
            "{metrics}"
        );
    }
    assert_eq!(standin.count("generate_jitconfig"), 1);
    assert!(
        standin
            .deliveries()
            .iter()
            .filter(|d| foreign.contains(&d.job_id))
            .all(|d| d.status == 202)
    );
    let (code, out, err) = daemon.ctl(&["jobs", &foreign[0].to_string()]).await;
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("state ignored") && out.contains("outside this daemon's repo"),
        "{out}"
    );
    assert_eq!(daemon.stop(Duration::from_secs(30)).await.0, Some(0));
}

/// GitHub keeps the runner-registration budget apart from `core`: with only
/// `actions_runner_registration` spent until its reset, no claim succeeds before the reset and
/// the jobs run after it, while `core` calls (the reconcile's listings) go on answering 200.
/// The gauges show both buckets.
#[actix_rt::test]
async fn an_empty_registration_bucket_is_waited_out_while_core_calls_go_on() {
    let standin = crate::support::standin(100);
    let extra = "[runner.claim_retry]\nschedule = [\"1s\"]\nrate_reset_jitter = [\"1s\", \"2s\"]\n";
    let daemon = Daemon::start_reconciling(&standin, "1s", extra, &local_provider(2)).await;
    let reset = standin.exhaust_bucket_for("actions_runner_registration", Duration::from_secs(4));
    standin.queue_jobs("app", LABELS, 2);
    daemon
        .wait_completed(&standin, 2, Duration::from_secs(40))
        .await;
    let claims = standin.calls_to("generate_jitconfig");
    let ok: Vec<_> = claims.iter().filter(|c| c.status == 201).collect();
    assert!(ok.len() >= 2, "{claims:?}");
    // At most one refused claim per job (two only when both were sent before the first answer):
    // the 403 proved the bucket empty, so every later claim waited for its reset instead of
    // climbing the ladder into it.
    let refused = claims.iter().filter(|c| c.status == 403).count();
    assert!((1..=2).contains(&refused), "{claims:?}");
    for c in &ok {
        assert!(
            c.at_ms / 1000 >= u128::from(reset),
            "claimed before the reset: {c:?}"
        );
    }
    let during: Vec<u16> = standin
        .calls()
        .into_iter()
        .filter(|c| c.endpoint.starts_with("list_") && c.at_ms / 1000 < u128::from(reset))
        .map(|c| c.status)
        .collect();
    assert!(
        !during.is_empty() && during.iter().all(|s| *s == 200 || *s == 304),
        "core calls during the window: {during:?}"
    );
    let metrics = daemon.metrics().await;
    for bucket in ["core", "actions_runner_registration"] {
        assert!(
            metrics.contains(&format!(
                "ephemerd_github_api_rate_limit{{resource=\"{bucket}\"}} 5000"
            )),
            "{metrics}"
        );
    }
    assert_eq!(daemon.stop(Duration::from_secs(30)).await.0, Some(0));
}
