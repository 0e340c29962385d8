//! The real `ephemer-actors serve` against a stand-in GitHub: config written to a temp dir,
//! the process started, readiness awaited, SIGTERM on request, logs kept for failure messages.

use std::{path::PathBuf, process::Stdio, time::Duration};

use github_standin::Standin;
use tokio::process::Child;

use super::{daemon, sigterm, wait_for_http};

/// The webhook secret the e2e daemons and stand-ins share.
pub const SECRET: &str = "e2e-webhook-secret";
/// The stand-in's token.
pub const TOKEN: &str = "ghp_standin_token";

/// A free loopback port, handed out once across every test process on this host.
///
/// Ports come from below the kernel's ephemeral range (32768 and up here), so no `bind(0)` of a
/// stand-in and no outgoing connection takes one between its release here and the daemon's
/// bind, nor while a daemon restarts on it. Processes that run beside each other (`.ci/run`'s
/// long-run lanes) share a registry file under the temp dir, locked while read and written: a CI
/// run failed when two lanes were handed the same port. Entries older than two hours are dropped.
pub fn free_port() -> u16 {
    use std::{
        hash::{BuildHasher, RandomState},
        io::{Read, Seek, Write},
    };
    const RANGE: std::ops::Range<u16> = 20_000..32_000;
    const KEEP_SECS: u64 = 2 * 3600;
    let path = std::env::temp_dir().join("ephemer-test-ports");
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .unwrap_or_else(|e| panic!("port registry {}: {e}", path.display()));
    file.lock().expect("lock the port registry");
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let mut text = String::new();
    file.read_to_string(&mut text)
        .expect("read the port registry");
    let mut given: Vec<(u16, u64)> = text
        .lines()
        .filter_map(|line| {
            let (port, at) = line.split_once(' ')?;
            Some((port.parse().ok()?, at.parse().ok()?))
        })
        .filter(|&(_, at): &(u16, u64)| now.saturating_sub(at) < KEEP_SECS)
        .collect();
    let random = RandomState::new();
    let span = u64::from(RANGE.end - RANGE.start);
    let port = (0u64..)
        .map(|n| RANGE.start + (random.hash_one(n) % span) as u16)
        .take(100_000)
        .find(|port| {
            !given.iter().any(|(p, _)| p == port)
                && std::net::TcpListener::bind(("127.0.0.1", *port)).is_ok()
        })
        .expect("a free port below the ephemeral range");
    given.push((port, now));
    let text: String = given.iter().map(|(p, at)| format!("{p} {at}\n")).collect();
    file.set_len(0).expect("truncate the port registry");
    file.rewind().expect("rewind the port registry");
    file.write_all(text.as_bytes())
        .expect("write the port registry");
    port
}

/// The config of an e2e daemon: `providers` is TOML for the `[providers.*]` tables.
pub fn config(
    standin: &Standin,
    port: u16,
    state: &std::path::Path,
    reconcile: &str,
    extra: &str,
    providers: &str,
) -> String {
    config_with_github(standin, port, state, reconcile, "", extra, providers)
}

/// Like [`config`], with more keys in `[github]` (App credentials, say).
pub fn config_with_github(
    standin: &Standin,
    port: u16,
    state: &std::path::Path,
    reconcile: &str,
    github: &str,
    extra: &str,
    providers: &str,
) -> String {
    // Keys of a `[webhook]` table in `extra` join the one written here.
    let (webhook, extra) = split_table(extra, "[webhook]");
    let (admin, extra) = split_table(&extra, "[admin]");
    let admin = if admin.trim().is_empty() {
        format!("listen = \"127.0.0.1:{}\"", free_port())
    } else {
        admin
    };
    // The runner's releases come from the stand-in too, through the same host as its API when
    // a test names one (through a proxy, say).
    let releases = github
        .lines()
        .find_map(|l| l.trim().strip_prefix("api_url = \""))
        .and_then(|rest| rest.split('"').next())
        .map(|api| format!("{api}/repos/actions/runner/releases"))
        .unwrap_or_else(|| releases_url(standin));
    // `[github]` keys given replace the defaults written here.
    let repos = if github.contains("repos =") {
        ""
    } else {
        "repos = [\"app\"]"
    };
    format!(
        r#"
[github]
{api}
owner = "acme"
{repos}
token = "{TOKEN}"
{github}

[webhook]
listen = "127.0.0.1:{port}"
secret = "{SECRET}"
reconcile_interval = "{reconcile}"
{webhook}

[state]
dir = "{state}"

[admin]
{admin}

[log]
level = "debug"

{runner}

{extra}

{providers}
"#,
        // A test that names its own API URL (through a proxy, over TLS) keeps it.
        api = if github.contains("api_url") {
            String::new()
        } else {
            format!("api_url = \"{}\"", standin.url())
        },
        state = state.display(),
        // The runner's releases come from the stand-in (github.com is out of reach here).
        runner = if extra.contains("[runner]\n") {
            String::new()
        } else {
            format!(
                "[runner]\nname_prefix = \"{}\"\nreleases_url = \"{releases}\"",
                prefix(port),
            )
        },
        // A test that sets its own name_prefix (the default, say) keeps it.
        extra = {
            let mut extra = extra.clone();
            if !extra.contains("releases_url") {
                extra = extra.replace(
                    "[runner]\n",
                    &format!("[runner]\nreleases_url = \"{releases}\"\n"),
                );
            }
            if !extra.contains("name_prefix") {
                extra = extra.replace(
                    "[runner]\n",
                    &format!("[runner]\nname_prefix = \"{}\"\n", prefix(port)),
                );
            }
            extra
        },
    )
}

/// The stand-in's releases API of `actions/runner`.
pub fn releases_url(standin: &Standin) -> String {
    format!("{}/repos/actions/runner/releases", standin.url())
}

/// The keys of table `header` in `toml` (up to the next table), and `toml` without that table.
fn split_table(toml: &str, header: &str) -> (String, String) {
    let (mut inside, mut keys, mut rest) = (false, Vec::new(), Vec::new());
    for line in toml.lines() {
        if line.trim_start().starts_with('[') {
            inside = line.trim() == header;
            if inside {
                continue;
            }
        }
        if inside { &mut keys } else { &mut rest }.push(line);
    }
    (keys.join("\n"), rest.join("\n"))
}

/// The runner-name prefix of the daemon on `port`: unique per test daemon, so daemons running
/// side by side never reap each other's environments (they share one Podman storage).
pub fn prefix(port: u16) -> String {
    format!("t{port}")
}

/// The local provider running the stand-in runner.
pub fn local_provider(max_concurrent: usize) -> String {
    format!(
        r#"
[providers.local]
command = "{bin}"
args = ["standin-runner"]
labels = ["self-hosted", "linux", "x64"]
max_concurrent = {max_concurrent}
# The stand-in runner runs as whoever runs the tests (root in CI).
allow_root = true
"#,
        bin = env!("CARGO_BIN_EXE_ephemer-actors")
    )
}

/// A container pool on the engine at `socket`, running `image` (`extra`: more keys).
pub fn linux_provider(socket: &str, image: &str, max_concurrent: usize, extra: &str) -> String {
    format!(
        r#"
[providers.linux]
socket = "{socket}"
image = "{image}"
labels = ["self-hosted", "linux", "x64"]
max_concurrent = {max_concurrent}
{extra}
"#
    )
}

/// What makes a debug build of the daemon play the next release: one more field in its store's
/// job rows, one more ledger migration (`ephemer_actors_core::next_build`).
pub const NEXT_BUILD: (&str, &str) = ("EPHEMER_TEST_NEXT_BUILD", "1");

/// A running daemon.
pub struct Daemon {
    child: Child,
    /// `127.0.0.1:port` of its webhook listener.
    pub addr: String,
    /// Its config file.
    pub config: PathBuf,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

impl Daemon {
    /// Writes the config, starts `serve`, waits for `/readyz`, and points the stand-in's
    /// webhooks at it.
    pub async fn start(standin: &Standin, extra: &str, providers: &str) -> Daemon {
        Self::start_reconciling(standin, "0s", extra, providers).await
    }

    /// Like `start`, with a reconcile interval.
    pub async fn start_reconciling(
        standin: &Standin,
        reconcile: &str,
        extra: &str,
        providers: &str,
    ) -> Daemon {
        Self::start_full(standin, reconcile, "", extra, providers).await
    }

    /// Like `start`, with more keys in `[github]`.
    pub async fn start_with_github(
        standin: &Standin,
        github: &str,
        extra: &str,
        providers: &str,
    ) -> Daemon {
        Self::start_full(standin, "0s", github, extra, providers).await
    }

    /// Like `start_with_github`, with variables in the daemon's environment.
    pub async fn start_with_env(
        standin: &Standin,
        github: &str,
        providers: &str,
        env: &[(&str, &str)],
    ) -> Daemon {
        let dir = Self::write_config(standin, "0s", github, "", providers);
        Self::launch_with(standin, dir.0, dir.1, env).await
    }

    fn write_config(
        standin: &Standin,
        reconcile: &str,
        github: &str,
        extra: &str,
        providers: &str,
    ) -> (tempfile::TempDir, u16) {
        let dir = tempfile::tempdir().unwrap();
        let port = free_port();
        let cfg = dir.path().join("ephemer.toml");
        std::fs::write(
            &cfg,
            config_with_github(
                standin,
                port,
                &dir.path().join("state"),
                reconcile,
                github,
                extra,
                providers,
            ),
        )
        .unwrap();
        (dir, port)
    }

    /// Like `start_with_github`, with the reconcile every `reconcile` (`"0s"`: never).
    pub async fn start_full(
        standin: &Standin,
        reconcile: &str,
        github: &str,
        extra: &str,
        providers: &str,
    ) -> Daemon {
        let (dir, port) = Self::write_config(standin, reconcile, github, extra, providers);
        Self::launch(standin, dir, port).await
    }

    /// Starts `serve` on the config already in `dir` (a restart keeps the state and the port).
    async fn launch(standin: &Standin, dir: tempfile::TempDir, port: u16) -> Daemon {
        Self::launch_with(standin, dir, port, &[]).await
    }

    async fn launch_with(
        standin: &Standin,
        dir: tempfile::TempDir,
        port: u16,
        env: &[(&str, &str)],
    ) -> Daemon {
        let d = Self::spawn(dir, port, env).await;
        standin.send_webhooks_to(&format!("http://{}/webhook/github", d.addr), SECRET);
        d
    }

    /// Starts `serve` on the config `text(port, state dir)` writes (its webhook listener on
    /// `127.0.0.1:port`, an `[admin]` listener of its own), with `env` in its environment,
    /// and waits until it is ready. No stand-in is pointed at it: the test does that.
    pub async fn start_config(
        text: impl FnOnce(u16, &std::path::Path) -> String,
        env: &[(&str, &str)],
    ) -> Daemon {
        let dir = tempfile::tempdir().unwrap();
        let port = free_port();
        let text = text(port, &dir.path().join("state"));
        std::fs::write(dir.path().join("ephemer.toml"), text).unwrap();
        Self::spawn(dir, port, env).await
    }

    async fn spawn(dir: tempfile::TempDir, port: u16, env: &[(&str, &str)]) -> Daemon {
        Self::spawn_cmd(daemon(), dir, port, env).await
    }

    async fn spawn_cmd(
        mut cmd: tokio::process::Command,
        dir: tempfile::TempDir,
        port: u16,
        env: &[(&str, &str)],
    ) -> Daemon {
        let cfg = dir.path().join("ephemer.toml");
        let log = dir.path().join("daemon.log");
        cmd.envs(env.iter().copied());
        cmd.args(["serve", "--config"])
            .arg(&cfg)
            .stdout(Stdio::null())
            .stderr(
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(&log)
                    .unwrap(),
            );
        let child = cmd.spawn().expect("start serve");
        let addr = format!("127.0.0.1:{port}");
        let d = Daemon {
            child,
            addr,
            config: cfg,
            log,
            _dir: dir,
        };
        let ready = wait_for_http(&d.addr, "/readyz", Duration::from_secs(30)).await;
        assert_eq!(
            ready.map(|r| r.0),
            Some(200),
            "daemon not ready:\n{}",
            d.logs()
        );
        d
    }

    /// `kill -9`: no drain, no cleanup. The state directory and config stay for `resume`.
    pub async fn kill9(mut self) -> (tempfile::TempDir, u16) {
        let _ = self.child.start_kill();
        let _ = self.child.wait().await;
        let port = self.addr.rsplit(':').next().unwrap().parse().unwrap();
        (self._dir, port)
    }

    /// Starts a daemon again on what `kill9` left.
    pub async fn resume(standin: &Standin, left: (tempfile::TempDir, u16)) -> Daemon {
        Self::launch(standin, left.0, left.1).await
    }

    /// Like `start`, with the daemon playing the next release (its `next_build` module).
    pub async fn start_next(standin: &Standin, extra: &str, providers: &str) -> Daemon {
        let (dir, port) = Self::write_config(standin, "0s", "", extra, providers);
        Self::resume_next(standin, (dir, port)).await
    }

    /// Starts the daemon playing the next release on what `kill9` or `stop_keeping` left:
    /// the binary-swap tests' other build, the same executable told by its environment.
    pub async fn resume_next(standin: &Standin, left: (tempfile::TempDir, u16)) -> Daemon {
        Self::launch_with(standin, left.0, left.1, &[NEXT_BUILD]).await
    }

    /// SIGTERM (the drain), then the exit code and logs, keeping the state directory and
    /// config for `resume` or `resume_next`.
    pub async fn stop_keeping(
        mut self,
        within: Duration,
    ) -> ((tempfile::TempDir, u16), Option<i32>, String) {
        sigterm(&self.child);
        let status = tokio::time::timeout(within, self.child.wait())
            .await
            .unwrap_or_else(|_| panic!("daemon did not exit within {within:?}:\n{}", self.logs()))
            .unwrap();
        let logs = self.logs();
        let port = self.addr.rsplit(':').next().unwrap().parse().unwrap();
        ((self._dir, port), status.code(), logs)
    }

    /// Waits until `n` jobs completed at the stand-in, failing with the daemon's log.
    pub async fn wait_completed(&self, standin: &Standin, n: usize, within: Duration) {
        super::fleet::wait_completed(standin, n, within, std::slice::from_ref(self)).await;
    }

    /// Waits until the stand-in holds no runner registration, failing with the daemon's log.
    pub async fn wait_no_runner_left(&self, standin: &Standin) {
        super::fleet::wait_no_registration_left(
            standin,
            Duration::from_secs(30),
            std::slice::from_ref(self),
        )
        .await;
    }

    /// Its runner-name prefix.
    pub fn prefix(&self) -> String {
        prefix(self.addr.rsplit(':').next().unwrap().parse().unwrap())
    }

    /// Its admin listener's `IP:PORT`.
    pub fn admin_addr(&self) -> String {
        let text = std::fs::read_to_string(&self.config).unwrap();
        let table: toml::Table = toml::from_str(&text).unwrap();
        table["admin"]["listen"].as_str().unwrap().to_string()
    }

    /// SIGTERM, without waiting: the drain begins.
    pub fn begin_drain(&self) {
        sigterm(&self.child);
    }

    /// Whether it exited (a crash, an abort), without waiting.
    pub fn has_exited(&mut self) -> bool {
        !matches!(self.child.try_wait(), Ok(None))
    }

    /// Its process id.
    pub fn pid(&self) -> u32 {
        self.child.id().expect("the daemon is running")
    }

    /// Its `state.dir`.
    pub fn state_dir(&self) -> PathBuf {
        self._dir.path().join("state")
    }

    /// Where its runners' directories go (`<state.dir>-work`).
    pub fn runner_dir(&self) -> PathBuf {
        ephemer_actors_core::config::StateConfig::at(self.state_dir()).runner_dir()
    }

    /// What the daemon logged so far.
    pub fn logs(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// SIGTERM, then the exit code (within `within`).
    pub async fn stop(self, within: Duration) -> (Option<i32>, String) {
        sigterm(&self.child);
        self.wait_exit(within).await
    }

    /// Waits for the daemon to exit by itself (after `begin_drain`: a second SIGTERM would
    /// tear its jobs down at once); its exit code and logs.
    pub async fn wait_exit(mut self, within: Duration) -> (Option<i32>, String) {
        let status = tokio::time::timeout(within, self.child.wait())
            .await
            .unwrap_or_else(|_| panic!("daemon did not exit within {within:?}:\n{}", self.logs()))
            .unwrap();
        (status.code(), self.logs())
    }

    /// Asserts one claim per job, plus at most one per stranded-job heal the log shows: under
    /// load a runner can exit before its job's `in_progress` arrives, and the self-heal then
    /// dispatches that job again by design (fungible runners). Returns (claims, heals).
    pub fn assert_claims_per_job(&self, standin: &Standin, jobs: usize) -> (usize, usize) {
        let logs = self.logs();
        let heals = logs.matches("dispatching the job again").count();
        let claims = standin.count("generate_jitconfig");
        assert!(
            (jobs..=jobs + heals).contains(&claims),
            "{claims} claims for {jobs} jobs with {heals} heals: beyond one per job, only heals may claim:\n{logs}"
        );
        (claims, heals)
    }

    /// Runs `ephemer-actors ARGS --config <its config>` against it: (exit code, stdout, stderr).
    pub async fn ctl(&self, args: &[&str]) -> (i32, String, String) {
        self.ctl_with_env(args, &[]).await
    }

    /// Like [`Daemon::ctl`], with these environment variables.
    pub async fn ctl_with_env(&self, args: &[&str], env: &[(&str, &str)]) -> (i32, String, String) {
        let mut cmd = super::daemon();
        cmd.args(args).arg("--config").arg(&self.config);
        cmd.envs(env.iter().copied());
        super::output(cmd).await
    }

    /// `ephemer-actors <args> --json` against this daemon, parsed.
    pub async fn ctl_json(&self, args: &[&str]) -> serde_json::Value {
        let args: Vec<&str> = args.iter().copied().chain(["--json"]).collect();
        let (code, out, err) = self.ctl(&args).await;
        // `status` answers with exit 1 when a pool is down or the daemon drains; its JSON is
        // printed all the same.
        assert!(code == 0 || (code == 1 && !out.is_empty()), "{err}");
        serde_json::from_str(&out).unwrap()
    }

    /// `/metrics` text.
    pub async fn metrics(&self) -> String {
        super::http_get(&self.addr, "/metrics")
            .await
            .map(|r| r.1)
            .unwrap_or_default()
    }
}
