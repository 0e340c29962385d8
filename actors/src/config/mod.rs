//! The daemon's configuration: typed, validated, and loadable from the TOML of CONTRACT.md.
//!
//! Loading runs in two stages. [`raw`] lets serde read the file into all-optional structs and
//! collects every unknown key; [`validate`] then applies defaults, parses durations, addresses
//! and secrets, and reports *every* problem with its key path in one [`ConfigErrors`]. An
//! embedding application may skip TOML entirely and build a [`Config`] in code.
//!
//! This module never logs and never prints a secret: secrets live in [`Secret`].

pub mod net;
mod raw;
mod secret;
mod validate;

use std::{
    fmt,
    net::SocketAddr,
    path::{Path, PathBuf},
    time::Duration,
};

pub use secret::Secret;

pub use crate::vocab::{PoolName, ProviderKind};

/// Default values, shared by validation, the example config and the docs.
pub mod defaults {
    use std::time::Duration;

    /// `github.api_url`
    pub const API_URL: &str = "https://api.github.com";
    /// `github.runner_group_id`
    pub const RUNNER_GROUP_ID: u64 = 1;
    /// `github.max_claims_per_minute`
    pub const MAX_CLAIMS_PER_MINUTE: u32 = 150;
    /// `webhook.listen`
    pub const WEBHOOK_LISTEN: &str = "0.0.0.0:8080";
    /// `webhook.path`
    pub const WEBHOOK_PATH: &str = "/webhook/github";
    /// `providers.linux.memory`.
    pub const CONTAINER_MEMORY: u64 = 4 * 1024 * 1024 * 1024;
    /// `providers.linux.pids_limit`.
    pub const CONTAINER_PIDS: i64 = 4096;
    /// `providers.linux.cap_add`: what an image that starts as root needs to set itself up and
    /// drop to its runner user (chown its files, switch user, signal its children).
    pub const CONTAINER_CAPS: [&str; 6] = [
        "CHOWN",
        "DAC_OVERRIDE",
        "FOWNER",
        "SETGID",
        "SETUID",
        "KILL",
    ];
    /// `webhook.max_body`: `workflow_job` payloads are a few KB.
    pub const WEBHOOK_MAX_BODY: usize = 1024 * 1024;
    /// `webhook.reconcile_interval`
    pub const RECONCILE_INTERVAL: Duration = Duration::from_secs(30 * 60);
    /// `runner.max_concurrent`
    pub const MAX_CONCURRENT: usize = 4;
    /// `runner.job_timeout`
    pub const JOB_TIMEOUT: Duration = Duration::from_secs(2 * 3600);
    /// `runner.shutdown_timeout`
    pub const SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(5 * 60);
    /// `runner.name_prefix`
    pub const NAME_PREFIX: &str = "ephemer";
    /// `runner.claim_retry.schedule`
    pub const RETRY_SCHEDULE: [Duration; 5] = [
        Duration::from_secs(30),
        Duration::from_secs(60),
        Duration::from_secs(120),
        Duration::from_secs(300),
        Duration::from_secs(600),
    ];
    /// `runner.claim_retry.max_age`
    pub const RETRY_MAX_AGE: Duration = Duration::from_secs(90 * 60);
    /// `runner.claim_retry.jitter`
    pub const RETRY_JITTER: f64 = 0.2;
    /// `runner.claim_retry.rate_reset_jitter`
    pub const RATE_RESET_JITTER: (Duration, Duration) =
        (Duration::from_secs(5), Duration::from_secs(25));
    /// `runner.orphan_sweep.grace`
    pub const ORPHAN_GRACE: Duration = Duration::from_secs(10 * 60);
    /// `state.dir`
    pub const STATE_DIR: &str = "/var/lib/ephemer-actors";
    /// `admin.listen`
    pub const ADMIN_LISTEN: &str = "127.0.0.1:9091";
    /// `providers.*.restart.max_restarts`
    pub const RESTART_MAX: u32 = 5;
    /// `providers.*.restart.within`
    pub const RESTART_WITHIN: Duration = Duration::from_secs(60);
    /// `providers.*.restart.backoff`
    pub const RESTART_BACKOFF: Duration = Duration::from_secs(1);
    /// `providers.linux.socket`
    pub const LINUX_SOCKET: &str = "unix:///run/podman/podman.sock";
    /// `providers.linux.image`
    pub const LINUX_IMAGE: &str = "ghcr.io/actions/actions-runner:latest";
    /// `providers.linux.command`: the runner script of the default image.
    pub const LINUX_COMMAND: &str = "/home/runner/run.sh";
    /// `providers.vm_macos.base_image`
    pub const MACOS_BASE_IMAGE: &str = "ghcr.io/cirruslabs/macos-sequoia-xcode:latest";
    /// `providers.vm_macos.boot_timeout`
    pub const MACOS_BOOT_TIMEOUT: Duration = Duration::from_secs(180);
    /// Apple's licence allows two macOS guests per host.
    pub const MACOS_MAX_VMS: usize = 2;
}

/// The whole, validated configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// `[github]`: where and as whom to call GitHub.
    pub github: GithubConfig,
    /// `[webhook]`: the intake listener.
    pub webhook: WebhookConfig,
    /// `[runner]`: limits, timeouts and the retry ladder.
    pub runner: RunnerConfig,
    /// `[state]`: durable state and work directories.
    pub state: StateConfig,
    /// `[metrics]`: where `/metrics` is served.
    pub metrics: MetricsConfig,
    /// `[admin]`: the admin API listener.
    pub admin: AdminConfig,
    /// `[log]`: level and format.
    pub log: LogConfig,
    /// `[providers.*]`: the four provisioners.
    pub providers: ProvidersConfig,
}

/// `[github]`
#[derive(Debug, Clone)]
pub struct GithubConfig {
    /// REST base URL, without a trailing slash (`https://HOST/api/v3` on GHES).
    pub api_url: String,
    /// The org or user that owns the repos.
    pub owner: String,
    /// Empty: org-level runners. Otherwise repo-level runners for these repos.
    pub repos: Vec<String>,
    /// How the daemon authenticates.
    pub auth: GithubAuth,
    /// Runner group for org-level JIT runners.
    pub runner_group_id: u64,
    /// Claims (generate-jitconfig calls) allowed per minute.
    pub max_claims_per_minute: u32,
    /// `github.ca_file`: a PEM bundle trusted in addition to the system's roots (a GHES
    /// behind a private CA). Runners get it too.
    pub ca_file: Option<PathBuf>,
    /// The HTTPS proxy GitHub calls go through (`github.proxy`, else `HTTPS_PROXY`), with the
    /// hosts that bypass it (`NO_PROXY`). Runners get the same.
    pub proxy: Option<ProxyConfig>,
}

/// An HTTP proxy that tunnels HTTPS with `CONNECT`.
#[derive(Debug, Clone)]
pub struct ProxyConfig {
    /// `http://[user:password@]host:port`; a secret, because it may carry credentials.
    pub url: Secret,
    /// `NO_PROXY` entries: `host`, `.domain`, `domain` (and its subdomains), `IP`, `*`.
    pub no_proxy: Vec<String>,
}

/// GitHub credentials. A GitHub App wins over a token when both are configured.
#[derive(Debug, Clone)]
pub enum GithubAuth {
    /// A personal access token (or any bearer token).
    Token(Secret),
    /// A GitHub App installation.
    App(AppAuth),
}

/// GitHub App credentials.
#[derive(Debug, Clone)]
pub struct AppAuth {
    /// The App's id (the JWT `iss`).
    pub app_id: u64,
    /// The installation whose token the daemon mints.
    pub installation_id: u64,
    /// The App's RSA private key, PEM text.
    pub private_key: Secret,
}

/// `[webhook]`
#[derive(Debug, Clone)]
pub struct WebhookConfig {
    /// Address the webhook listener binds.
    pub listen: SocketAddr,
    /// Path GitHub posts deliveries to.
    pub path: String,
    /// HMAC key shared with GitHub.
    pub secret: Secret,
    /// Backstop poll for lost deliveries; `None` when disabled with `"0s"`.
    pub reconcile_interval: Option<Duration>,
    /// Deliveries larger than this many bytes are answered 413 (`webhook.max_body`).
    pub max_body: usize,
}

/// `[runner]`
#[derive(Debug, Clone)]
pub struct RunnerConfig {
    /// Runners alive at once, across all providers.
    pub max_concurrent: usize,
    /// A runner alive longer than this is killed; `None` when set to `"0s"`.
    pub job_timeout: Option<Duration>,
    /// How long a drain waits for running jobs before tearing them down.
    pub shutdown_timeout: Duration,
    /// Runner names are `<name_prefix>-<provider>-<random>`.
    pub name_prefix: String,
    /// `[runner.claim_retry]`
    pub claim_retry: ClaimRetryConfig,
    /// `[runner.orphan_sweep]`
    pub orphan_sweep: OrphanSweepConfig,
}

/// `[runner.claim_retry]`: the ladder a failed claim climbs.
#[derive(Debug, Clone, PartialEq)]
pub struct ClaimRetryConfig {
    /// Off: a failed claim is given up at once.
    pub enabled: bool,
    /// Delays before each retry; the last rung repeats. Non-empty, non-decreasing.
    pub schedule: Vec<Duration>,
    /// Give up once the first failure is older than this.
    pub max_age: Duration,
    /// Uniform jitter as a fraction of the rung, in `[0, 1]`.
    pub jitter: f64,
    /// After a rate-limit error with a fresh reading: reset + uniform `[lo, hi)`.
    pub rate_reset_jitter: (Duration, Duration),
}

impl Default for ClaimRetryConfig {
    fn default() -> Self {
        ClaimRetryConfig {
            enabled: true,
            schedule: defaults::RETRY_SCHEDULE.to_vec(),
            max_age: defaults::RETRY_MAX_AGE,
            jitter: defaults::RETRY_JITTER,
            rate_reset_jitter: defaults::RATE_RESET_JITTER,
        }
    }
}

/// `[runner.orphan_sweep]`
#[derive(Debug, Clone, PartialEq)]
pub struct OrphanSweepConfig {
    /// Off: unbound runners live until their process exits or `job_timeout`.
    pub enabled: bool,
    /// An unbound runner older than this is torn down and deleted on GitHub.
    pub grace: Duration,
}

/// `[state]`
#[derive(Debug, Clone)]
pub struct StateConfig {
    /// Absolute directory for the durable store and per-job work directories.
    pub dir: PathBuf,
}

/// `[metrics]`
#[derive(Debug, Clone)]
pub struct MetricsConfig {
    /// Own listener for `/metrics`; `None` serves it on the webhook listener.
    pub listen: Option<SocketAddr>,
}

/// `[admin]`
#[derive(Debug, Clone)]
pub struct AdminConfig {
    /// Where the admin API listens (loopback by default).
    pub listen: AdminListen,
}

/// Where the admin API listens: an address, or a unix socket (`unix:PATH`, mode 0600).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AdminListen {
    /// `IP:PORT`.
    Tcp(SocketAddr),
    /// `unix:PATH`.
    Unix(PathBuf),
}

impl AdminListen {
    /// The address, when it is one.
    pub fn tcp(&self) -> Option<SocketAddr> {
        match self {
            AdminListen::Tcp(a) => Some(*a),
            AdminListen::Unix(_) => None,
        }
    }

    /// `IP:PORT` or `unix:PATH`, as written in the config.
    pub fn parse(text: &str) -> Result<AdminListen, String> {
        match text.strip_prefix("unix:") {
            Some(path) if Path::new(path).is_absolute() => Ok(AdminListen::Unix(path.into())),
            Some(path) => Err(format!("{path:?} must be an absolute path")),
            None => text
                .parse()
                .map(AdminListen::Tcp)
                .map_err(|_| format!("{text:?} must be IP:PORT or unix:/absolute/path")),
        }
    }
}

impl Config {
    /// What is valid but worth a second look: check-config prints these, serve logs them.
    pub fn warnings(&self) -> Vec<String> {
        let mut w = Vec::new();
        if let Some(addr) = self.admin.listen.tcp()
            && !addr.ip().is_loopback()
        {
            w.push(format!(
                "admin.listen {addr} is reachable from other hosts: every call needs the admin \
                 token there, but keep it on loopback or a unix: socket unless you need it"
            ));
        }
        for pool in self.providers.enabled() {
            let key = format!("providers.{}", pool.name);
            if let Some(p) = pool.process()
                && p.run_as.len() == 1
                && pool.common.max_concurrent > 1
            {
                w.push(format!(
                    "{key}.run_as: the {} concurrent runners share the user {}, so a job can read \
                     a sibling's environment (its JIT config) and take its job; list one user \
                     per runner in run_as where that matters",
                    pool.common.max_concurrent, p.run_as[0]
                ));
            }
            if let Some(l) = pool.linux()
                && l.mounts.docker_access
            {
                w.push(format!(
                    "{key}.docker_access: every job gets the engine's socket, and with it every \
                     other container on this host (and root on it with a rootful engine); a \
                     Docker-in-Docker sidecar or a rootless engine keeps jobs apart \
                     (docs/providers.md)"
                ));
            }
        }
        w
    }
}

impl fmt::Display for AdminListen {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AdminListen::Tcp(a) => write!(f, "{a}"),
            AdminListen::Unix(p) => write!(f, "unix:{}", p.display()),
        }
    }
}

/// `[log]`
#[derive(Debug, Clone)]
pub struct LogConfig {
    /// `trace`, `debug`, `info`, `warn` or `error`.
    pub level: String,
    /// Human text or one JSON object per line.
    pub format: LogFormat,
}

/// `log.format`
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// `[providers.*]`: the named pools, sorted by name.
#[derive(Debug, Clone, Default)]
pub struct ProvidersConfig {
    /// Every pool table, enabled or not.
    pub pools: Vec<PoolConfig>,
}

impl ProvidersConfig {
    /// The enabled pools, in routing tie-break order (by name).
    pub fn enabled(&self) -> Vec<&PoolConfig> {
        self.pools.iter().filter(|p| p.common.enabled).collect()
    }

    /// The pool of this name.
    pub fn get(&self, name: &str) -> Option<&PoolConfig> {
        self.pools.iter().find(|p| p.name == name)
    }
}

/// One `[providers.NAME]` table.
#[derive(Debug, Clone)]
pub struct PoolConfig {
    /// `NAME`.
    pub name: PoolName,
    /// The keys every pool takes.
    pub common: ProviderCommon,
    /// The kind's own keys.
    pub spec: PoolSpec,
}

impl PoolConfig {
    /// Which provisioner serves this pool.
    pub fn kind(&self) -> ProviderKind {
        match self.spec {
            PoolSpec::Local(_) => ProviderKind::Local,
            PoolSpec::Linux(_) => ProviderKind::Linux,
            PoolSpec::VmMacos(_) => ProviderKind::VmMacos,
            PoolSpec::NativeMacos(_) => ProviderKind::NativeMacos,
        }
    }

    /// The process settings of a `local` or `native_macos` pool.
    pub fn process(&self) -> Option<&ProcessPoolConfig> {
        match &self.spec {
            PoolSpec::Local(p) | PoolSpec::NativeMacos(p) => Some(p),
            _ => None,
        }
    }

    /// The container settings of a `linux` pool.
    pub fn linux(&self) -> Option<&LinuxConfig> {
        match &self.spec {
            PoolSpec::Linux(l) => Some(l),
            _ => None,
        }
    }
}

/// A pool's kind and the keys only that kind takes.
#[derive(Debug, Clone)]
pub enum PoolSpec {
    /// `kind = "local"`
    Local(ProcessPoolConfig),
    /// `kind = "linux"`
    Linux(LinuxConfig),
    /// `kind = "vm_macos"`
    VmMacos(VmMacosConfig),
    /// `kind = "native_macos"`
    NativeMacos(ProcessPoolConfig),
}

/// Keys every provider table takes.
#[derive(Debug, Clone)]
pub struct ProviderCommon {
    /// Whether jobs are routed to this provider.
    pub enabled: bool,
    /// Labels the runner registers with; a job is routed here only if these cover its labels.
    pub labels: Vec<String>,
    /// Runners of this provider alive at once.
    pub max_concurrent: usize,
    /// How the provisioner actor is restarted when it dies.
    pub restart: RestartConfig,
    /// `env`: extra variables for the runner, `${NAME}` references already expanded from the
    /// daemon's environment (so values are secrets: they never reach a log).
    pub env: Vec<(String, Secret)>,
}

/// When a dead provisioner is re-created (kameo's vocabulary).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RestartPolicy {
    /// Always restart, within the budget.
    Permanent,
    /// Restart only after an abnormal exit (a panic), within the budget.
    Transient,
    /// Never restart; the provider stays down and its jobs go elsewhere or wait.
    Never,
}

impl RestartPolicy {
    /// The config spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            RestartPolicy::Permanent => "permanent",
            RestartPolicy::Transient => "transient",
            RestartPolicy::Never => "never",
        }
    }
}

/// `providers.*.restart`
#[derive(Debug, Clone, PartialEq)]
pub struct RestartConfig {
    /// When to restart.
    pub policy: RestartPolicy,
    /// At most this many restarts ...
    pub max_restarts: u32,
    /// ... within this window; one more and the provider stays down.
    pub within: Duration,
    /// Wait before re-creating the provisioner.
    pub backoff: Duration,
}

impl Default for RestartConfig {
    fn default() -> Self {
        RestartConfig {
            policy: RestartPolicy::Permanent,
            max_restarts: defaults::RESTART_MAX,
            within: defaults::RESTART_WITHIN,
            backoff: defaults::RESTART_BACKOFF,
        }
    }
}

/// What a process pool runs for each job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RunnerProgram {
    /// `runner_dir`: an actions/runner install. Each job runs `run.sh` from its own private
    /// copy of it, because the runner writes its identity and `_work` beside its own binaries.
    Install(PathBuf),
    /// `command`: an executable that keeps no state beside itself, run in the job's directory.
    Command(PathBuf),
}

impl RunnerProgram {
    /// The file that is started: `run.sh` of the install, or the command.
    pub fn executable(&self) -> PathBuf {
        match self {
            RunnerProgram::Install(dir) => dir.join("run.sh"),
            RunnerProgram::Command(path) => path.clone(),
        }
    }
}

/// `[providers.local]` and `[providers.native_macos]`: the runner as a process on this host.
#[derive(Debug, Clone)]
pub struct ProcessPoolConfig {
    /// `runner_dir` or `command` (exactly one is set).
    pub program: RunnerProgram,
    /// Arguments passed to it (never the JIT config).
    pub args: Vec<String>,
    /// Parent of the per-job directories.
    pub work_root: PathBuf,
    /// Run each runner as one of these users (via `sudo -u`); empty: as the daemon's user.
    /// With several, concurrent runners never share one (a job cannot read a sibling's
    /// environment, which holds its JIT config).
    pub run_as: Vec<String>,
    /// Run it as root (the daemon's user) without `run_as`: an explicit choice.
    pub allow_root: bool,
}

/// `[providers.local]`
pub type LocalConfig = ProcessPoolConfig;

/// `[providers.linux]`
#[derive(Debug, Clone)]
pub struct LinuxConfig {
    /// Docker or Podman API socket, `unix:///path` or `tcp://host:port`.
    pub socket: String,
    /// Runner image.
    pub image: String,
    /// Command the container runs (empty: the image's own).
    pub command: Vec<String>,
    /// Container network mode (`bridge`, `host`, `none` or a named network); `None` = engine default.
    pub network: Option<String>,
    /// What each container may use and do.
    pub limits: ContainerLimits,
    /// When the image is pulled.
    pub pull: PullPolicy,
    /// What is mounted into each container besides its own filesystem.
    pub mounts: ContainerMounts,
    /// `extra_hosts`: `host:ip` lines for the container's `/etc/hosts`.
    pub extra_hosts: Vec<String>,
    /// `dns`: name servers instead of the engine's.
    pub dns: Vec<String>,
}

/// `providers.<linux pool>.pull`: when the runner image is pulled.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PullPolicy {
    /// Pull only an image the engine does not have (before the first job that needs it).
    #[default]
    Missing,
    /// Pull before every job (a moving tag is then always fresh).
    Always,
    /// Never pull: a missing image fails the job at once.
    Never,
}

impl PullPolicy {
    /// The config spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            PullPolicy::Missing => "missing",
            PullPolicy::Always => "always",
            PullPolicy::Never => "never",
        }
    }
}

/// What a container gets mounted (`volumes`, `tmpfs`, `shm_size`, `devices`, `docker_access`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ContainerMounts {
    /// `volumes`: `name:/path[:ro]` (a named volume, created if absent, kept between jobs:
    /// a cache) or `/host/path:/path[:ro]` (a bind mount).
    pub volumes: Vec<String>,
    /// `tmpfs`: paths that get a fresh in-memory filesystem (gone with the container).
    pub tmpfs: Vec<String>,
    /// `shm_size`: bytes of `/dev/shm`; `None`: the engine's default.
    pub shm_size: Option<u64>,
    /// `devices`: host device paths (`/dev/nvidia0`) or CDI names (`nvidia.com/gpu=all`).
    pub devices: Vec<String>,
    /// `docker_access`: the engine's own socket is mounted at `/var/run/docker.sock`, which
    /// gives every job the host's engine (root on the host with rootful engines). Off by
    /// default; docs/providers.md shows a sidecar or rootless engine instead.
    pub docker_access: bool,
}

/// What one runner container may use and do (`providers.linux.memory`, `pids_limit`, `cpus`,
/// `read_only_root`); every container also runs with no new privileges and only the
/// capabilities in `cap_add`.
#[derive(Debug, Clone, PartialEq)]
pub struct ContainerLimits {
    /// Memory (and memory + swap) in bytes.
    pub memory: u64,
    /// Processes at most.
    pub pids_limit: i64,
    /// CPUs (fractional); `None`: no limit.
    pub cpus: Option<f64>,
    /// A read-only root filesystem (the image must allow it).
    pub read_only_root: bool,
    /// Capabilities kept (all others dropped).
    pub cap_add: Vec<String>,
}

impl Default for ContainerLimits {
    fn default() -> Self {
        ContainerLimits {
            memory: defaults::CONTAINER_MEMORY,
            pids_limit: defaults::CONTAINER_PIDS,
            cpus: None,
            read_only_root: false,
            cap_add: defaults::CONTAINER_CAPS
                .iter()
                .map(|c| c.to_string())
                .collect(),
        }
    }
}

/// `[providers.vm_macos]`
#[derive(Debug, Clone)]
pub struct VmMacosConfig {
    /// The VM or OCI image each job's VM is cloned from.
    pub base_image: String,
    /// User the runner is started as over ssh.
    pub ssh_user: String,
    /// The runner start script inside the guest.
    pub runner_command: String,
    /// The `tart` executable.
    pub tart_path: PathBuf,
    /// The `ssh` executable.
    pub ssh_path: PathBuf,
    /// How long a cloned VM may take to get an IP address.
    pub boot_timeout: Duration,
}

/// `[providers.native_macos]`
pub type NativeMacosConfig = ProcessPoolConfig;

/// Secret values the environment may supply instead of the file.
#[derive(Debug, Clone, Default)]
pub struct Environment {
    /// `GITHUB_TOKEN`
    pub github_token: Option<Secret>,
    /// `EPHEMER_WEBHOOK_SECRET`
    pub webhook_secret: Option<Secret>,
    /// `EPHEMER_APP_PRIVATE_KEY` (PEM text)
    pub app_private_key: Option<Secret>,
    /// The daemon runs as root: a process pool then needs `run_as` or `allow_root`.
    pub as_root: bool,
    /// `HTTPS_PROXY` (or `https_proxy`): the proxy when `github.proxy` is not set.
    pub https_proxy: Option<Secret>,
    /// `NO_PROXY` (or `no_proxy`).
    pub no_proxy: Option<String>,
    /// The daemon's environment, which pools' `env` values reference as `${NAME}`.
    pub vars: std::collections::BTreeMap<String, Secret>,
}

impl Environment {
    /// Reads the three variables from this process; an empty variable counts as unset.
    pub fn from_process() -> Self {
        let var = |name: &str| {
            std::env::var(name)
                .ok()
                .filter(|v| !v.is_empty())
                .map(Secret::new)
        };
        Environment {
            github_token: var("GITHUB_TOKEN"),
            webhook_secret: var("EPHEMER_WEBHOOK_SECRET"),
            app_private_key: var("EPHEMER_APP_PRIVATE_KEY"),
            as_root: nix::unistd::geteuid().is_root(),
            https_proxy: var("HTTPS_PROXY").or_else(|| var("https_proxy")),
            no_proxy: std::env::var("NO_PROXY")
                .or_else(|_| std::env::var("no_proxy"))
                .ok()
                .filter(|v| !v.is_empty()),
            vars: std::env::vars_os()
                .filter_map(|(k, v)| {
                    Some((k.into_string().ok()?, Secret::new(v.into_string().ok()?)))
                })
                .collect(),
        }
    }
}

/// One configuration problem: the key path and what is wrong with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    /// Dotted key path, e.g. `runner.claim_retry.schedule[2]`.
    pub key: String,
    /// Lowercase reason, never containing a secret value.
    pub reason: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.key, self.reason)
    }
}

/// Every problem found in one load, in file order as far as possible.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct ConfigErrors(pub Vec<ConfigError>);

impl fmt::Display for ConfigErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.0.len();
        write!(f, "{n} config problem{}", if n == 1 { "" } else { "s" })?;
        for e in &self.0 {
            write!(f, "\n  {e}")?;
        }
        Ok(())
    }
}

impl Config {
    /// Reads and validates a config file. Relative paths inside it (`private_key_path`) are
    /// resolved against the file's directory.
    pub fn load(path: &Path, env: &Environment) -> Result<Config, ConfigErrors> {
        let text = std::fs::read_to_string(path).map_err(|e| {
            ConfigErrors(vec![ConfigError {
                key: "<file>".into(),
                reason: format!("cannot read {}: {e}", path.display()),
            }])
        })?;
        Config::from_toml_str(&text, path.parent(), env)
    }

    /// Parses and validates TOML text. `base_dir` resolves relative paths.
    pub fn from_toml_str(
        text: &str,
        base_dir: Option<&Path>,
        env: &Environment,
    ) -> Result<Config, ConfigErrors> {
        validate::load(text, base_dir, env)
    }
}
