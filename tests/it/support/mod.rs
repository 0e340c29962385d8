//! Helpers shared by the integration tests: paths, the daemon binary, a child-process guard.

pub mod cdp;
pub mod daemon;
pub mod engine;
pub mod fleet;
#[cfg(target_os = "linux")]
pub mod netns;
pub mod otlp;
pub mod plot;
pub mod podman;
pub mod postgres;
pub mod provision;
pub mod proxy;
pub mod registry;
pub mod tls;
#[cfg(target_os = "linux")]
pub mod vm;

use std::{
    path::{Path, PathBuf},
    process::Stdio,
    time::Duration,
};

use tokio::process::{Child, Command};

/// A stand-in GitHub whose runners take `job_ms` per job.
pub fn standin(job_ms: u64) -> github_standin::Standin {
    let s = github_standin::Standin::start(github_standin::StandinConfig::default()).unwrap();
    s.set_behavior(github_standin::RunnerBehavior {
        job_ms,
        ..github_standin::RunnerBehavior::default()
    });
    s
}

/// The repository root.
pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// A path under `config/`.
pub fn config_file(name: &str) -> PathBuf {
    repo_root().join("config").join(name)
}

/// The daemon binary, as a command with a clean environment for secrets and config.
pub fn daemon() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_ephemer-actors"));
    for var in [
        "GITHUB_TOKEN",
        "EPHEMER_WEBHOOK_SECRET",
        "EPHEMER_APP_PRIVATE_KEY",
        "EPHEMER_CONFIG",
        "CREDENTIALS_DIRECTORY",
        "NOTIFY_SOCKET",
        "RUST_LOG",
        // Only the binary-swap tests say so, for one daemon (`daemon::NEXT_BUILD`).
        "EPHEMER_TEST_NEXT_BUILD",
        // A proxy of the machine running the tests would carry the stand-in's calls.
        "HTTPS_PROXY",
        "https_proxy",
        "HTTP_PROXY",
        "http_proxy",
        "NO_PROXY",
        "no_proxy",
    ] {
        cmd.env_remove(var);
    }
    cmd.kill_on_drop(true).stdin(Stdio::null());
    cmd
}

/// Runs a command to completion and returns (exit code, stdout, stderr).
pub async fn output(mut cmd: Command) -> (i32, String, String) {
    let out = cmd.output().await.expect("run the daemon binary");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `GET path` on a local listener through awc: (status, body). `None` if it is not up.
pub async fn http_get(addr: &str, path: &str) -> Option<(u16, String)> {
    let mut answer = awc::Client::builder()
        .timeout(Duration::from_secs(10))
        .finish()
        .get(format!("http://{addr}{path}"))
        .send()
        .await
        .ok()?;
    let body = answer.body().limit(64 * 1024 * 1024).await.ok()?;
    Some((
        answer.status().as_u16(),
        String::from_utf8_lossy(&body).into_owned(),
    ))
}

/// Polls `GET path` until it answers or `within` passes.
pub async fn wait_for_http(addr: &str, path: &str, within: Duration) -> Option<(u16, String)> {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        if let Some(answer) = http_get(addr, path).await {
            return Some(answer);
        }
        if tokio::time::Instant::now() > deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Sends SIGTERM to a child.
pub fn sigterm(child: &Child) {
    let pid = child.id().expect("child still running") as i32;
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGTERM,
    )
    .expect("send SIGTERM");
}

/// Writes `text` to `name` inside `dir` and returns the path.
pub fn write_file(dir: &Path, name: &str, text: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, text).expect("write test file");
    path
}

/// Says loudly that a test cannot run here and skips it, or fails it where every tool is
/// required (`EPHEMER_REQUIRE_ENGINES`, which `.ci/run` sets after installing them).
pub fn skip(what: &str, why: &str) {
    if std::env::var_os("EPHEMER_REQUIRE_ENGINES").is_some_and(|v| !v.is_empty() && v != "0") {
        panic!("EPHEMER_REQUIRE_ENGINES is set, but the {what} test cannot run: {why}");
    }
    eprintln!("\n!!!!!!!!\n!!! SKIPPING {what} test: {why}\n!!!!!!!!\n");
}

/// Makes the system user `user` (no home, no login) if it is missing; whether it exists now.
/// Tests that run jobs as another user give each test a user of its own: a teardown ends
/// everything its run_as user runs.
pub fn ensure_user(user: &str) -> bool {
    if nix::unistd::User::from_name(user).unwrap().is_some() {
        return true;
    }
    std::process::Command::new("useradd")
        .args([
            "--system",
            "--no-create-home",
            "--shell",
            "/usr/sbin/nologin",
            user,
        ])
        .status()
        .is_ok_and(|s| s.success())
}

/// A temp directory jobs of other users can reach (0755), with `results/` in it (1777) and
/// root's files `names` there, 0666, that jobs append to (root's: the teardown clears what a
/// job's uid leaves in the shared temp directories, a file of its own included).
pub fn shared_results(names: &[&str]) -> (tempfile::TempDir, PathBuf) {
    use std::os::unix::fs::PermissionsExt;
    let open = |p: &Path, mode| std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode));
    let tmp = tempfile::tempdir().unwrap();
    open(tmp.path(), 0o755).unwrap();
    let results = tmp.path().join("results");
    std::fs::create_dir(&results).unwrap();
    open(&results, 0o1777).unwrap();
    for name in names {
        std::fs::write(results.join(name), "").unwrap();
        open(&results.join(name), 0o666).unwrap();
    }
    (tmp, results)
}

/// `tool` on `PATH`.
pub fn which(tool: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")?
        .to_str()?
        .split(':')
        .map(|d| Path::new(d).join(tool))
        .find(|p| p.exists())
}

/// What a runner may see: what the provisioner sets, the few variables it inherits, the
/// proxy and CA variables, the pool's `env`, and what `sh` adds itself.
pub const ALLOWED: &[&str] = &[
    "PATH",
    "USER",
    "LANG",
    "LC_ALL",
    "TZ",
    "HOME",
    "TMPDIR",
    "ACTIONS_RUNNER_INPUT_JITCONFIG",
    "RUNNER_MANUALLY_TRAP_SIG",
    "RUNNER_ALLOW_RUNASROOT",
    "ACTIONS_RUNNER_RETURN_VERSION_DEPRECATED_EXIT_CODE",
    "https_proxy",
    "HTTPS_PROXY",
    "http_proxy",
    "HTTP_PROXY",
    "no_proxy",
    "NO_PROXY",
    "SSL_CERT_FILE",
    "NODE_EXTRA_CA_CERTS",
    "EPHEMER_CA_FILE",
    "TEAM_TOKEN",
    "ACTIONS_RUNNER_HOOK_JOB_STARTED",
    "PWD",
    "SHLVL",
    "_",
    "OLDPWD",
];

/// Checks one runner's environment (`env` output): every name in [`ALLOWED`] or `also`, and
/// the `NAME=value` lines the test configured.
pub fn check_runner_env(text: &str, also: &[&str], wanted: &[&str]) {
    for line in text.lines() {
        let Some((name, _)) = line.split_once('=') else {
            continue; // the continuation of a multi-line value
        };
        assert!(
            ALLOWED.contains(&name) || also.contains(&name),
            "the runner saw {name}:\n{text}"
        );
    }
    for w in wanted {
        assert!(text.lines().any(|l| l == *w), "{w} missing:\n{text}");
    }
}

/// The value of the metric series `line` starts with, in a `/metrics` text (`0` when absent).
pub fn series(metrics: &str, line: &str) -> f64 {
    metrics
        .lines()
        .find(|l| l.starts_with(line))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
        .unwrap_or(0.0)
}
