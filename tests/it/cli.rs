//! The CLI contract: `check-config` exit codes and messages, `--version`, and `serve`'s
//! lifecycle on the minimal config (healthz, SIGTERM, exit 0).

use std::time::Duration;

use crate::support::{self, config_file, daemon, output};

#[tokio::test]
async fn example_config_is_valid() {
    let mut cmd = daemon();
    cmd.args(["check-config", "--config"])
        .arg(config_file("ephemer-actors.example.toml"));
    let (code, stdout, stderr) = output(cmd).await;
    assert_eq!(code, 0, "stdout: {stdout}\nstderr: {stderr}");
    assert!(stdout.contains("ok"), "{stdout}");
}

#[tokio::test]
async fn minimal_config_is_valid_with_secrets_from_the_environment() {
    let mut cmd = daemon();
    cmd.args(["check-config"])
        .env("EPHEMER_CONFIG", config_file("minimal.toml"))
        .env("GITHUB_TOKEN", "ghp_from_env")
        .env("EPHEMER_WEBHOOK_SECRET", "from-env");
    let (code, stdout, stderr) = output(cmd).await;
    assert_eq!(code, 0, "stdout: {stdout}\nstderr: {stderr}");

    // systemd's LoadCredential=: one file per secret, named like its variable.
    let creds = tempfile::tempdir().unwrap();
    std::fs::write(creds.path().join("GITHUB_TOKEN"), "ghp_from_credential\n").unwrap();
    std::fs::write(
        creds.path().join("EPHEMER_WEBHOOK_SECRET"),
        "from-credential",
    )
    .unwrap();
    let mut cmd = daemon();
    cmd.args(["check-config", "-c"])
        .arg(config_file("minimal.toml"))
        .env("CREDENTIALS_DIRECTORY", creds.path());
    let (code, stdout, stderr) = output(cmd).await;
    assert_eq!(code, 0, "stdout: {stdout}\nstderr: {stderr}");

    let mut without = daemon();
    without
        .args(["check-config", "--config"])
        .arg(config_file("minimal.toml"));
    let (code, _, stderr) = output(without).await;
    assert_eq!(code, 2);
    assert!(
        stderr.contains("github.token") && stderr.contains("webhook.secret"),
        "{stderr}"
    );
}

#[tokio::test]
async fn bad_config_names_every_problem_and_exits_2() {
    let dir = tempfile::tempdir().unwrap();
    let path = support::write_file(
        dir.path(),
        "bad.toml",
        r#"
[github]
token = "ghp_NEVER_PRINT_ME"
favourite_colour = "blue"

[webhook]
secret = "ALSO_NEVER_PRINTED"
reconcile_interval = "half an hour"

[providers.local]
command = "/bin/true"
allow_root = true
"#,
    );
    let mut cmd = daemon();
    cmd.args(["check-config", "--config"]).arg(&path);
    let (code, stdout, stderr) = output(cmd).await;
    assert_eq!(code, 2, "stdout: {stdout}\nstderr: {stderr}");
    for key in [
        "github.favourite_colour",
        "webhook.reconcile_interval",
        "github.owner",
    ] {
        assert!(stderr.contains(key), "{key} not named in:\n{stderr}");
    }
    assert!(stderr.contains("3 problems"), "{stderr}");
    assert!(!stderr.contains("NEVER_PRINT") && !stdout.contains("NEVER_PRINT"));
}

/// As root, a process pool without `run_as` would run every job as root, with the daemon's
/// credential in reach: check-config refuses it (exit 2) unless `allow_root = true` says so.
#[tokio::test]
async fn a_process_pool_as_root_needs_run_as_or_allow_root() {
    if !nix::unistd::geteuid().is_root() {
        support::skip("run-as-root", "the tests do not run as root here");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let config = |extra: &str| {
        format!(
            "[github]\nowner = \"acme\"\ntoken = \"t\"\n[webhook]\nsecret = \"s\"\n\
             [providers.local]\ncommand = \"/bin/true\"\n{extra}\n"
        )
    };
    for (extra, want) in [
        ("", 2),
        ("allow_root = true", 0),
        ("run_as = \"nobody\"", 0),
    ] {
        let path = support::write_file(dir.path(), "c.toml", &config(extra));
        let mut cmd = daemon();
        cmd.args(["check-config", "--config"]).arg(&path);
        let (code, _, stderr) = output(cmd).await;
        assert_eq!(code, want, "{extra}: {stderr}");
        if want == 2 {
            assert!(
                stderr.contains("providers.local.run_as") && stderr.contains("allow_root"),
                "{stderr}"
            );
        }
    }
}

#[tokio::test]
async fn missing_file_and_usage_errors_exit_2() {
    let mut cmd = daemon();
    cmd.args(["check-config", "--config", "/nonexistent/ephemer.toml"]);
    let (code, _, stderr) = output(cmd).await;
    assert_eq!(code, 2);
    assert!(stderr.contains("cannot read"), "{stderr}");

    let mut cmd = daemon();
    cmd.args(["serve"]);
    assert_eq!(
        output(cmd).await.0,
        2,
        "serve without --config or EPHEMER_CONFIG is a usage error"
    );
}

#[tokio::test]
async fn version_and_help() {
    let mut cmd = daemon();
    cmd.arg("--version");
    let (code, stdout, _) = output(cmd).await;
    assert_eq!(code, 0);
    assert!(stdout.starts_with("ephemer-actors "), "{stdout}");
    let mut cmd = daemon();
    cmd.arg("--help");
    let (code, stdout, _) = output(cmd).await;
    assert_eq!(code, 0);
    assert!(
        stdout.contains("serve") && stdout.contains("check-config"),
        "{stdout}"
    );
}

/// `--version` names the commit; `completions bash` prints a script that completes the
/// commands; `man` prints a roff page; no help text carries markdown.
#[actix_rt::test]
async fn version_completions_man_and_plain_help() {
    let mut cmd = daemon();
    cmd.arg("--version");
    let (_, version, _) = output(cmd).await;
    let commit = version
        .trim()
        .rsplit_once('(')
        .map(|(_, c)| c.trim_end_matches(')'));
    assert!(
        commit.is_some_and(|c| !c.is_empty() && c.chars().all(|c| c.is_ascii_alphanumeric())),
        "{version}"
    );
    let mut cmd = daemon();
    cmd.args(["completions", "bash"]);
    let (code, script, _) = output(cmd).await;
    assert_eq!(code, 0);
    assert!(
        script.contains("complete -F") && script.contains("drain") && script.contains("doctor"),
        "{script}"
    );
    let mut cmd = daemon();
    cmd.arg("man");
    let (code, page, _) = output(cmd).await;
    assert_eq!(code, 0);
    assert!(page.contains(".TH ephemer-actors 1"), "{page}");
    for sub in [
        "",
        "serve",
        "check-config",
        "doctor",
        "status",
        "jobs",
        "cordon",
        "drain",
        "completions",
    ] {
        let mut cmd = daemon();
        if !sub.is_empty() {
            cmd.arg(sub);
        }
        cmd.arg("--help");
        let (code, help, _) = output(cmd).await;
        assert_eq!(code, 0, "{sub} --help");
        assert!(
            !help.contains('`') && !help.contains("**"),
            "markdown in {sub} --help:\n{help}"
        );
    }
}

/// `serve` with config/minimal.toml as written: healthz answers 200, and SIGTERM ends the
/// process with exit 0 within 2 s. The minimal config listens on its default 0.0.0.0:8080.
#[actix_rt::test]
async fn serve_minimal_answers_healthz_and_exits_0_on_sigterm() {
    let mut cmd = daemon();
    cmd.args(["serve", "--config"])
        .arg(config_file("minimal.toml"))
        .env("GITHUB_TOKEN", "ghp_from_env")
        .env("EPHEMER_WEBHOOK_SECRET", "from-env")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped());
    let mut child = cmd.spawn().expect("start serve");
    let answer =
        support::wait_for_http("127.0.0.1:8080", "/healthz", Duration::from_secs(20)).await;
    let (status, body) = answer.expect("serve answers /healthz on 127.0.0.1:8080");
    assert_eq!(status, 200);
    assert!(body.contains("\"status\":\"ok\""), "{body}");
    let (status, _) = support::http_get("127.0.0.1:8080", "/readyz")
        .await
        .unwrap();
    assert_eq!(status, 200);
    let (status, metrics) = support::http_get("127.0.0.1:8080", "/metrics")
        .await
        .unwrap();
    assert_eq!(status, 200);
    assert!(
        metrics.contains("ephemerd_concurrent_capacity 4"),
        "{metrics}"
    );

    support::sigterm(&child);
    let exit = tokio::time::timeout(Duration::from_secs(2), child.wait())
        .await
        .expect("serve exits within 2 s of SIGTERM")
        .unwrap();
    assert_eq!(exit.code(), Some(0));
}

/// The README's first command, smaller: every job runs, nothing is left, exit 0.
#[tokio::test]
async fn demo_runs_every_job_and_exits_0() {
    let mut cmd = daemon();
    cmd.args(["demo", "--jobs", "12", "--seed", "1"]);
    let (code, stdout, stderr) = output(cmd).await;
    assert_eq!(code, 0, "stdout:\n{stdout}\nstderr:\n{stderr}");
    assert!(
        stdout.contains("jobs run                     12 / 12"),
        "{stdout}"
    );
    assert!(
        stdout.contains("runners left registered      0"),
        "{stdout}"
    );
}

/// A listener that cannot bind stops `serve` with exit 1 and the reason, and nothing panics on
/// the way out (the actors stop inside the runtime).
#[actix_rt::test]
async fn serve_on_a_taken_port_exits_1_with_the_reason() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    let dir = tempfile::tempdir().unwrap();
    let text = format!(
        "[github]\nowner = \"acme\"\ntoken = \"t\"\n[webhook]\nlisten = \"127.0.0.1:{port}\"\n\
         secret = \"s\"\nreconcile_interval = \"0s\"\n[state]\ndir = \"{}\"\n[admin]\n\
         listen = \"127.0.0.1:{}\"\n[providers.local]\ncommand = \"/bin/true\"\nallow_root = true\n",
        dir.path().join("state").display(),
        support::daemon::free_port()
    );
    let config = support::write_file(dir.path(), "c.toml", &text);
    let mut cmd = daemon();
    cmd.args(["serve", "--config"]).arg(&config);
    let (code, _, stderr) = output(cmd).await;
    assert_eq!(code, 1, "{stderr}");
    assert!(stderr.contains("cannot bind webhook.listen"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}
