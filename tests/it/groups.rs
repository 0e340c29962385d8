//! Where runners register: `github.runner_group`, a runner group named in the config, is
//! resolved to its id at start, and every runner registers in it; a name the org does not have
//! stops `serve` before it accepts anything (and `doctor` fails on it). `github.enterprise`
//! registers, lists and deletes enterprise runners at the enterprise's endpoints.

use std::time::Duration;

use crate::support::daemon::{Daemon, config_with_github, free_port, local_provider};

const LABELS: &[&str] = &["self-hosted", "linux"];

#[actix_rt::test]
async fn runners_register_in_the_runner_group_named_in_the_config() {
    let standin = crate::support::standin(100);
    standin.add_runner_group("Default-but-not");
    let group = standin.add_runner_group("ci-linux");
    let github = "repos = []\nrunner_group = \"ci-linux\"\n";
    let daemon = Daemon::start_with_github(&standin, github, "", &local_provider(2)).await;
    assert!(
        daemon
            .logs()
            .contains("runners register in this runner group")
    );
    standin.queue_jobs("app", LABELS, 3);
    daemon
        .wait_completed(&standin, 3, Duration::from_secs(30))
        .await;
    let registrations = standin.state().registrations.clone();
    assert!(registrations.len() >= 3);
    assert!(
        registrations.iter().all(|(_, g)| *g == group),
        "{registrations:?}"
    );
    // Looked up once, at start.
    assert_eq!(standin.count("list_runner_groups"), 1);
    assert_eq!(daemon.stop(Duration::from_secs(30)).await.0, Some(0));
}

#[actix_rt::test]
async fn a_runner_group_the_org_lacks_stops_serve_before_it_accepts_anything() {
    let standin = crate::support::standin(100);
    let dir = tempfile::tempdir().unwrap();
    let text = config_with_github(
        &standin,
        free_port(),
        &dir.path().join("state"),
        "0s",
        "repos = []\nrunner_group = \"gpu-pool\"\n",
        "",
        &local_provider(2),
    );
    let path = dir.path().join("config.toml");
    std::fs::write(&path, text).unwrap();
    let mut cmd = crate::support::daemon();
    cmd.args(["serve", "--config"]).arg(&path);
    let (code, _, err) = tokio::time::timeout(Duration::from_secs(30), crate::support::output(cmd))
        .await
        .expect("serve exits");
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("no runner group named \"gpu-pool\"") && err.contains("Default"),
        "{err}"
    );
    assert_eq!(standin.count("generate_jitconfig"), 0);
}

#[actix_rt::test]
async fn enterprise_runners_register_list_and_go_at_the_enterprise_endpoints() {
    let standin = crate::support::standin(100);
    standin.set_enterprise("acme-corp");
    // A classic token that may manage the enterprise's runners and nothing of the org's: an
    // org-level runner call would be refused 403.
    standin.set_token_scopes(&["manage_runners:enterprise"]);
    let group = standin.add_runner_group("enterprise-linux");
    let github = "repos = []\nenterprise = \"acme-corp\"\nrunner_group = \"enterprise-linux\"\n";
    let daemon = Daemon::start_with_github(&standin, github, "", &local_provider(2)).await;
    standin.queue_jobs("app", LABELS, 4);
    daemon
        .wait_completed(&standin, 4, Duration::from_secs(30))
        .await;
    daemon.wait_no_runner_left(&standin).await;
    let runner_calls: Vec<_> = standin
        .calls()
        .into_iter()
        .filter(|c| c.endpoint.contains("runner") || c.endpoint == "generate_jitconfig")
        .collect();
    assert!(
        runner_calls
            .iter()
            .any(|c| c.endpoint == "generate_jitconfig")
    );
    assert!(runner_calls.iter().any(|c| c.endpoint == "list_runners"));
    assert!(
        runner_calls
            .iter()
            .all(|c| c.path.starts_with("/enterprises/acme-corp/actions/") && c.status < 400),
        "{runner_calls:#?}"
    );
    let registrations = standin.state().registrations.clone();
    assert!(
        registrations.iter().all(|(_, g)| *g == group),
        "{registrations:?}"
    );
    assert_eq!(daemon.stop(Duration::from_secs(30)).await.0, Some(0));
}
