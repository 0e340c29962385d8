//! Corporate networks: a GHES behind a private CA (`github.ca_file`), an HTTPS proxy
//! (`github.proxy`, `HTTPS_PROXY`, `NO_PROXY`), and what a runner gets of both, with a pool's
//! `env`, and nothing else from the daemon's environment.

use std::{path::Path, time::Duration};

use github_standin::{Standin, StandinConfig};

use crate::support::{check_runner_env, daemon::Daemon, proxy::ConnectProxy, tls::test_ca};

const LABELS: &[&str] = &["self-hosted", "linux", "x64"];

/// A local pool whose runner writes its environment to `dump/<pid>.env`, then runs the
/// stand-in runner.
fn env_dumping_pool(dir: &Path, env: &str) -> String {
    let dump = dir.join("dump");
    std::fs::create_dir_all(&dump).unwrap();
    let script = crate::support::write_file(
        dir,
        "runner.sh",
        &format!(
            "#!/bin/sh\nenv > {}/$$.env\nexec {} standin-runner\n",
            dump.display(),
            env!("CARGO_BIN_EXE_ephemer-actors")
        ),
    );
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    format!(
        "[providers.local]\ncommand = \"{}\"\nallow_root = true\nlabels = [\"self-hosted\", \"linux\", \"x64\"]\nenv = {env}\n",
        script.display()
    )
}

/// Every environment the runners wrote, as `NAME=value` lines.
fn dumped(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir.join("dump"))
        .unwrap()
        .map(|e| std::fs::read_to_string(e.unwrap().path()).unwrap())
        .collect()
}

/// Every GitHub call goes through the proxy (the API host resolves only there), with its
/// credentials, which never reach the log; the runners get the proxy, the CA bundle and the
/// pool's `env` with `${NAME}` expanded, and no other variable of the daemon.
#[actix_rt::test]
async fn github_calls_tunnel_through_the_proxy_and_runners_get_the_network_settings() {
    let standin = crate::support::standin(100);
    let proxy = ConnectProxy::start(Some("ci:pr0xy-s3cret"), &[("github.test", "127.0.0.1")]);
    let dir = tempfile::tempdir().unwrap();
    let ca = dir.path().join("corp-ca.pem");
    std::fs::write(&ca, test_ca().ca_pem).unwrap();
    let api = format!("http://github.test:{}", standin.addr().port());
    let github = format!(
        "api_url = \"{api}\"\nallow_insecure = true\nproxy = \"http://ci:pr0xy-s3cret@{}\"\nca_file = \"{}\"\n",
        proxy.addr,
        ca.display()
    );
    let pool = env_dumping_pool(
        dir.path(),
        "{ TEAM_TOKEN = \"${TEST_TEAM_TOKEN}\", ACTIONS_RUNNER_HOOK_JOB_STARTED = \"/opt/hooks/started.sh\" }",
    );
    let daemon = Daemon::start_with_env(
        &standin,
        &github,
        &pool,
        &[
            ("TEST_TEAM_TOKEN", "team-7f3a"),
            ("CANARY_NOT_FOR_RUNNERS", "leak"),
        ],
    )
    .await;
    standin.queue_jobs("app", LABELS, 2);
    daemon
        .wait_completed(&standin, 2, Duration::from_secs(60))
        .await;

    let tunnels = proxy.tunnels();
    assert!(!tunnels.is_empty(), "no tunnel:\n{}", daemon.logs());
    let target = format!("github.test:{}", standin.addr().port());
    assert!(tunnels.iter().all(|t| *t == target), "{tunnels:?}");
    assert_eq!(proxy.refused(), 0, "every CONNECT carried the credentials");

    let bundle = daemon.runner_dir().join("ca-bundle.pem");
    let bundle_text = std::fs::read_to_string(&bundle).unwrap();
    assert!(
        bundle_text.contains(&test_ca_marker(&ca)),
        "the bundle holds the CA file"
    );
    let proxy_url = format!("http://ci:pr0xy-s3cret@{}", proxy.addr);
    let envs = dumped(dir.path());
    assert_eq!(envs.len(), 2, "one environment per runner");
    for text in &envs {
        check_runner_env(
            text,
            &[],
            &[
                &format!("HTTPS_PROXY={proxy_url}"),
                &format!("https_proxy={proxy_url}"),
                &format!("SSL_CERT_FILE={}", bundle.display()),
                &format!("NODE_EXTRA_CA_CERTS={}", bundle.display()),
                "TEAM_TOKEN=team-7f3a",
                "ACTIONS_RUNNER_HOOK_JOB_STARTED=/opt/hooks/started.sh",
            ],
        );
        assert!(!text.contains("leak"), "{text}");
    }
    let logs = daemon.logs();
    assert!(
        logs.contains("claiming a runner"),
        "the log is the daemon's"
    );
    assert!(
        !logs.contains("pr0xy-s3cret"),
        "the proxy password reached the log"
    );
    assert_eq!(daemon.stop(Duration::from_secs(30)).await.0, Some(0));
}

/// The last line of a PEM file's base64 body, to find it in a bundle.
fn test_ca_marker(pem: &Path) -> String {
    let text = std::fs::read_to_string(pem).unwrap();
    text.lines()
        .rev()
        .find(|l| !l.starts_with("-----") && !l.is_empty())
        .unwrap()
        .to_string()
}

/// `HTTPS_PROXY` from the daemon's environment, with the API host in `NO_PROXY`: no tunnel.
#[actix_rt::test]
async fn no_proxy_hosts_are_called_directly() {
    let standin = crate::support::standin(100);
    let proxy = ConnectProxy::start(None, &[]);
    let daemon = Daemon::start_with_env(
        &standin,
        "",
        &crate::support::daemon::local_provider(2),
        &[
            ("HTTPS_PROXY", &format!("http://{}", proxy.addr)),
            ("NO_PROXY", "localhost,127.0.0.1"),
        ],
    )
    .await;
    standin.queue_jobs("app", LABELS, 2);
    daemon
        .wait_completed(&standin, 2, Duration::from_secs(60))
        .await;
    assert_eq!(proxy.tunnels(), Vec::<String>::new());
    assert_eq!(daemon.stop(Duration::from_secs(30)).await.0, Some(0));
}

/// A GitHub served with a certificate from a private CA: without `ca_file` every call fails
/// TLS and no job is claimed; with it, jobs run, and the runners (which verify like OpenSSL,
/// through `SSL_CERT_FILE`) reach it too.
#[actix_rt::test]
async fn a_private_ca_is_trusted_only_with_ca_file() {
    let ca = test_ca();
    let standin = Standin::start(StandinConfig {
        tls: Some(ca.server.clone()),
        ..StandinConfig::default()
    })
    .unwrap();
    standin.set_behavior(github_standin::RunnerBehavior {
        job_ms: 100,
        ..github_standin::RunnerBehavior::default()
    });
    assert!(standin.url().starts_with("https://"));
    let dir = tempfile::tempdir().unwrap();
    let ca_file = dir.path().join("ca.pem");
    std::fs::write(&ca_file, &ca.ca_pem).unwrap();
    let pool = crate::support::daemon::local_provider(2);

    let untrusting = Daemon::start(&standin, "", &pool).await;
    standin.queue_jobs("app", LABELS, 1);
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        standin.count("generate_jitconfig"),
        0,
        "no call got through"
    );
    assert!(
        untrusting
            .logs()
            .to_ascii_lowercase()
            .contains("certificate"),
        "the failure names the certificate:\n{}",
        untrusting.logs()
    );
    assert_eq!(untrusting.stop(Duration::from_secs(30)).await.0, Some(0));

    let github = format!("ca_file = \"{}\"\n", ca_file.display());
    let trusting = Daemon::start_with_github(&standin, &github, "", &pool).await;
    standin.queue_jobs("app", LABELS, 1);
    // The first job's delivery went to the first daemon, which could not claim it.
    trusting
        .wait_completed(&standin, 1, Duration::from_secs(60))
        .await;
    trusting.wait_no_runner_left(&standin).await;
    assert_eq!(trusting.stop(Duration::from_secs(30)).await.0, Some(0));
}

/// Scale-set mode on the corporate network, with a GitHub App: the registration token comes
/// from the App's installation token, and every call (the REST API's and the Actions
/// service's, whose URL GitHub hands out) tunnels through the proxy with its credentials and
/// trusts the private CA of `ca_file`. GitHub's host resolves only at the proxy, so a call
/// that went around it would fail. Jobs run on the scale set's runners.
#[actix_rt::test]
async fn scale_set_mode_with_an_app_goes_through_the_proxy_and_trusts_the_private_ca() {
    let fixtures = crate::support::repo_root().join("tests/fixtures");
    let ca = test_ca();
    let standin = Standin::start(StandinConfig {
        tls: Some(ca.server.clone()),
        app_public_key: Some(std::fs::read_to_string(fixtures.join("app-key.pub.pem")).unwrap()),
        ..StandinConfig::default()
    })
    .unwrap();
    standin.set_behavior(github_standin::RunnerBehavior {
        job_ms: 100,
        ..github_standin::RunnerBehavior::default()
    });
    standin.set_scaleset_timings(github_standin::scaleset::ServiceTimings {
        long_poll: Duration::from_secs(3),
        session_idle: Duration::from_secs(20),
        queue_token_ttl: Duration::from_secs(3600),
        admin_token_ttl: Duration::from_secs(3600),
    });
    let port = standin.addr().port();
    // GitHub (its API and the Actions service URL it hands out) lives at a name only the
    // proxy resolves. (The stand-in runner, which knows no proxy, keeps the plain address.)
    standin.state().scalesets.service_base = Some(format!("https://github.test:{port}"));
    let proxy = ConnectProxy::start(Some("ci:pr0xy-s3cret"), &[("github.test", "127.0.0.1")]);
    let dir = tempfile::tempdir().unwrap();
    let ca_file = dir.path().join("corp-ca.pem");
    std::fs::write(&ca_file, &ca.ca_pem).unwrap();
    let github = format!(
        "api_url = \"https://github.test:{port}\"\nrepos = []\nproxy = \"http://ci:pr0xy-s3cret@{}\"\nca_file = \"{}\"\napp_id = 4242\ninstallation_id = 77\nprivate_key_path = \"{}\"\n",
        proxy.addr,
        ca_file.display(),
        fixtures.join("app-key.pem").display()
    );
    let daemon = Daemon::start_with_github(
        &standin,
        &github,
        "[webhook]\nmode = \"scaleset\"\n",
        &crate::support::daemon::local_provider(2),
    )
    .await;
    standin.state().webhook = None;
    standin.queue_jobs("app", LABELS, 3);
    daemon
        .wait_completed(&standin, 3, Duration::from_secs(60))
        .await;
    daemon.wait_no_runner_left(&standin).await;
    assert!(
        standin.count("actions_generate_jitconfig") >= 3,
        "the runners were registered in the scale set"
    );
    assert_eq!(standin.count("generate_jitconfig"), 0, "none over REST");
    assert!(
        standin.count("access_tokens") >= 1,
        "the App's installation token was fetched"
    );
    let tunnels = proxy.tunnels();
    let target = format!("github.test:{port}");
    assert!(
        !tunnels.is_empty() && tunnels.iter().all(|t| *t == target),
        "{tunnels:?}"
    );
    let logs = daemon.logs();
    assert!(
        logs.contains("scale set: listening"),
        "the Actions service was reached: {logs}"
    );
    assert_eq!(proxy.refused(), 0, "every CONNECT carried the credentials");
    assert!(!logs.contains("pr0xy-s3cret"));
    assert_eq!(daemon.stop(Duration::from_secs(30)).await.0, Some(0));
}
