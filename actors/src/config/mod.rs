//! The daemon's configuration: typed, validated, and loadable from the TOML that docs/configuration.md describes.
//!
//! Loading runs in two stages. [`raw`] lets serde read the file into all-optional structs and
//! collects every unknown key; [`validate`] then applies defaults, parses durations, addresses
//! and secrets, and reports *every* problem with its key path in one [`ConfigErrors`]. An
//! embedding application may skip TOML entirely and build a [`Config`] in code.
//!
//! This module never logs and never prints a secret: secrets live in [`Secret`].

pub(crate) mod cluster;
mod egress;
mod environment;
pub mod linux_vm;
pub(crate) mod net;
mod pools;
mod raw;
mod validate;
pub(crate) use validate::host_paths;
/// A host path no container bind may reach (the container backend's settings carry them).
#[doc(hidden)]
pub use validate::host_paths::Guarded;
mod warnings;

use std::{
    fmt,
    net::SocketAddr,
    path::{Path, PathBuf},
    time::Duration,
};

pub use cluster::ClusterConfig;
pub use egress::EgressConfig;
pub use environment::{Environment, UserDb};
pub use ephemer_decide::config::{
    ClaimRetryConfig, HostOs, Secret, WarmConfig, WarmMode, scaleset_pin, warm,
};
pub use pools::*;

pub use crate::vocab::{PoolName, ProviderKind};

/// Default values, shared by validation, the example config and the docs.
pub mod defaults {
    use std::time::Duration;

    /// `github.api_url`
    pub const API_URL: &str = "https://api.github.com";
    /// `github.runner_group_id`
    pub const RUNNER_GROUP_ID: u64 = 1;
    /// `[[github.targets]]`: the most one daemon serves (its intake tells them apart with a
    /// bit each).
    pub const MAX_TARGETS: usize = 128;
    /// `webhook.listen`
    pub const WEBHOOK_LISTEN: &str = "0.0.0.0:8080";
    /// `webhook.path`
    pub const WEBHOOK_PATH: &str = "/webhook/github";
    /// `cluster.lease`
    pub const CLUSTER_LEASE: Duration = Duration::from_secs(30);
    /// `cluster.pool_size`
    pub const CLUSTER_POOL_SIZE: usize = 4;
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
    /// `webhook.poll_interval`
    pub const POLL_INTERVAL: Duration = Duration::from_secs(5);
    /// `webhook.poll_idle_interval`
    pub const POLL_IDLE_INTERVAL: Duration = Duration::from_secs(30);
    /// `webhook.poll_budget`
    pub const POLL_BUDGET: f64 = 0.2;
    /// `webhook.redeliver_interval`
    pub const REDELIVER_INTERVAL: Duration = Duration::from_secs(120);
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
    /// `runner.releases_url`: github.com's releases of actions/runner.
    pub const RELEASES_URL: &str = "https://api.github.com/repos/actions/runner/releases";
    /// `runner.release_check_interval`
    pub const RELEASE_CHECK_INTERVAL: Duration = Duration::from_secs(3600);
    pub use ephemer_decide::config::defaults::{
        MAX_CLAIMS_PER_MINUTE, RATE_RESET_JITTER, RETRY_JITTER, RETRY_MAX_AGE, RETRY_SCHEDULE,
    };
    /// `runner.orphan_sweep.grace`
    pub const ORPHAN_GRACE: Duration = Duration::from_secs(10 * 60);
    /// `state.dir`: `/var/lib` on Linux, `/usr/local/var/lib` on a Mac.
    pub const STATE_DIR: &str = if cfg!(target_os = "macos") {
        "/usr/local/var/lib/ephemer-actors"
    } else {
        "/var/lib/ephemer-actors"
    };
    /// `state.retention`.
    pub const RETENTION: Duration = Duration::from_secs(60 * 60);
    /// The shortest `state.retention`: copies of one delivery, seconds apart, are still
    /// recognised.
    pub const MIN_RETENTION: Duration = Duration::from_secs(30);
    /// `state.usage_retention`: a quarter and then some, for "last month" and "last quarter".
    pub const USAGE_RETENTION: Duration = Duration::from_secs(100 * 86_400);
    /// The shortest `state.usage_retention`: rows are pruned a quarter of it after they pass
    /// it, so a minute is pruned every 15 s (tests and soaks compress time with it).
    pub const MIN_USAGE_RETENTION: Duration = Duration::from_secs(60);
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
    /// `providers.linux_vm.image`
    pub const LINUX_VM_IMAGE: &str = "/var/lib/ephemer-actors-images/runner.img";
    /// `providers.linux_vm.boot_timeout`: from QEMU's start to the guest agent's hello.
    pub const LINUX_VM_BOOT_TIMEOUT: Duration = Duration::from_secs(60);
    /// `providers.linux_vm.runner_command`: where `image build` puts the runner.
    pub const LINUX_VM_RUNNER: &str = "/opt/actions-runner/run.sh";
}

/// The whole, validated configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// `[github]`: where and as whom to call GitHub. With `[[github.targets]]`, the first
    /// target's (what host-wide settings such as `ca_file` and `proxy` are read from).
    pub github: GithubConfig,
    /// Every GitHub target: `[[github.targets]]`, or the one `[github]` + `webhook.secret`
    /// make. Empty in a config built in code: [`Config::targets`] then makes that one.
    pub targets: Vec<Target>,
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
    /// `[cluster]`: `None` is one host with its embedded store (the default).
    pub cluster: Option<ClusterConfig>,
    /// `[telemetry]`: one OpenTelemetry trace per job, off by default.
    pub telemetry: TelemetryConfig,
}

/// `[telemetry]`
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TelemetryConfig {
    /// `otlp_endpoint`: the OTLP/HTTP collector's base URL (`http://host:4318`); each
    /// finished job's trace is sent to its `/v1/traces`. `None`: no traces (the default).
    pub otlp_endpoint: Option<String>,
    /// `service_name` (default `ephemer-actors`): the traces' `service.name`.
    pub service_name: String,
}

impl TelemetryConfig {
    /// Where traces are posted: the endpoint's `/v1/traces` (as OTLP/HTTP's
    /// `OTEL_EXPORTER_OTLP_ENDPOINT` is read), or the endpoint itself when it already ends so.
    pub fn traces_url(&self) -> Option<String> {
        let base = self.otlp_endpoint.as_deref()?.trim_end_matches('/');
        Some(if base.ends_with("/v1/traces") {
            base.to_string()
        } else {
            format!("{base}/v1/traces")
        })
    }
}

/// One GitHub target: an owner, the credential and scope its runners are registered with,
/// the secret its deliveries are signed with, and its share of the slots.
#[derive(Debug, Clone)]
pub struct Target {
    /// `name` (default: the owner): the `target` label of metrics, pools' `targets`.
    pub name: String,
    /// Owner, scope, credential, runner group, pacing, API URL.
    pub github: GithubConfig,
    /// `webhook_secret` (default `webhook.secret`): deliveries for this owner are verified
    /// with it.
    pub webhook_secret: Secret,
    /// `weight` (default 1): its share of scarce slots against the other targets'.
    pub weight: u32,
}

impl Config {
    /// Every target ([`Config::targets`], or the one `[github]` and `webhook.secret` make).
    pub fn targets(&self) -> Vec<Target> {
        if !self.targets.is_empty() {
            return self.targets.clone();
        }
        vec![Target {
            name: self.github.owner.clone(),
            github: self.github.clone(),
            webhook_secret: self.webhook.secret.clone(),
            weight: 1,
        }]
    }

    /// Whether several targets are configured (metrics then carry a `target` label).
    pub fn multi_target(&self) -> bool {
        self.targets.len() > 1
    }
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
    /// `github.runner_group`: the group by name, resolved to its id at start (org-level
    /// runners only); wins over `runner_group_id`, which it replaces once resolved.
    pub runner_group: Option<String>,
    /// `github.enterprise`: register enterprise runners (`/enterprises/{slug}/actions/...`),
    /// for the jobs of `owner`, instead of the org's.
    pub enterprise: Option<String>,
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
    /// Push (GitHub posts to the listener) or pull (the daemon polls for queued jobs).
    pub mode: WebhookMode,
    /// Pull mode: the poll interval while jobs are queued or running.
    pub poll_interval: Duration,
    /// Pull mode: the interval the polls back off to while nothing changes.
    pub poll_idle_interval: Duration,
    /// Pull mode: the share of the `core` rate limit the polls may spend, in `(0, 1]`.
    pub poll_budget: f64,
    /// Ask GitHub to redeliver failed `workflow_job` deliveries: `None` (the default) when the
    /// credential can read the hook's deliveries (quietly off when it cannot), `Some(true)`
    /// insisted on (a hook that cannot be read is an error in the log), `Some(false)` off.
    pub redeliver: Option<bool>,
    /// How often the hook's deliveries are listed.
    pub redeliver_interval: Duration,
    /// The hook to watch; `None`: the one whose `config.url` is `public_url`, or the App's.
    pub hook_id: Option<u64>,
    /// The URL GitHub posts to (behind a proxy it differs from `listen`).
    pub public_url: Option<String>,
}

/// `webhook.mode`
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum WebhookMode {
    /// GitHub posts deliveries to `webhook.listen`.
    #[default]
    Push,
    /// No delivery comes in: queued jobs are found by conditional polls.
    Pull,
    /// No delivery comes in: each pool is a runner scale set, and GitHub's message queue says
    /// which jobs are assigned to it.
    ScaleSet,
}

impl WebhookMode {
    /// The config's spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            WebhookMode::Push => "push",
            WebhookMode::Pull => "pull",
            WebhookMode::ScaleSet => "scaleset",
        }
    }
}

impl WebhookConfig {
    /// True in pull mode.
    pub fn pull(&self) -> bool {
        self.mode == WebhookMode::Pull
    }

    /// True in push mode: GitHub posts deliveries, so the webhook listener takes them.
    pub fn push(&self) -> bool {
        self.mode == WebhookMode::Push
    }

    /// True in scale-set mode.
    pub fn scaleset(&self) -> bool {
        self.mode == WebhookMode::ScaleSet
    }
}

impl Config {
    /// The labels jobs are routed to `pool` by: its own, or in scale-set mode its pin alone.
    pub fn routing_labels(&self, pool: &PoolConfig) -> Vec<String> {
        if self.webhook.scaleset() {
            vec![scaleset_pin(&pool.name)]
        } else {
            pool.common.labels.clone()
        }
    }
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
    /// `auto_update`, `runner_version` and where releases are read.
    pub update: RunnerUpdateConfig,
}

/// How the runner is kept current (`[runner]`'s `auto_update`, `runner_version`,
/// `releases_url`, `release_check_interval`, `min_version`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunnerUpdateConfig {
    /// Keep daemon-managed installs at the wanted release (process pools without `runner_dir`
    /// or `command`).
    pub auto_update: bool,
    /// `"latest"` (`None`) or a pinned version.
    pub version: Option<String>,
    /// The releases API of `actions/runner` (github.com's, or a mirror's).
    pub releases_url: String,
    /// How often the latest release is looked up (conditional requests); `None`: never.
    pub check_interval: Option<Duration>,
    /// Runners older than this fail `doctor` (GitHub refuses registrations below its minimum).
    pub min_version: Option<String>,
}

impl Default for RunnerUpdateConfig {
    fn default() -> Self {
        RunnerUpdateConfig {
            auto_update: true,
            version: None,
            releases_url: defaults::RELEASES_URL.into(),
            check_interval: Some(defaults::RELEASE_CHECK_INTERVAL),
            min_version: None,
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
    /// Absolute directory for the durable store, the admin token and the logs: the daemon's
    /// alone (the unit makes it 0700).
    pub dir: PathBuf,
    /// `state.retention`: how long a finished job is remembered (its record and timeline
    /// for the page and `jobs`, its delivery ids for dedup, its runner's record).
    pub retention: Duration,
    /// `state.usage_retention`: how long what each finished job used (`usage`) is kept.
    pub usage_retention: Duration,
}

impl StateConfig {
    /// `[state]` at `dir`, with the default retention.
    pub fn at(dir: impl Into<PathBuf>) -> Self {
        StateConfig {
            dir: dir.into(),
            retention: defaults::RETENTION,
            usage_retention: defaults::USAGE_RETENTION,
        }
    }

    /// What runners must reach, beside the daemon's private state: `<dir>-work`
    /// (`/var/lib/ephemer-actors-work` by default), made `0711` by the daemon whatever its
    /// umask, so a `run_as` user can pass through to its own job directory (`0700`, its own)
    /// but nobody can list it. The default work root of the `local` pools, and where the CA
    /// bundle for runners goes.
    pub fn runner_dir(&self) -> PathBuf {
        let name = self
            .dir
            .file_name()
            .map_or_else(|| "ephemer-actors".into(), |n| n.to_string_lossy());
        self.dir.with_file_name(format!("{name}-work"))
    }
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
    pub fn parse(text: &str) -> Result<AdminListen, AdminListenError> {
        match text.strip_prefix("unix:") {
            Some(path) if Path::new(path).is_absolute() => Ok(AdminListen::Unix(path.into())),
            Some(path) => Err(AdminListenError::Relative(path.to_string())),
            None => text
                .parse()
                .map(AdminListen::Tcp)
                .map_err(|_| AdminListenError::Shape(text.to_string())),
        }
    }
}

/// Why an `admin.listen` cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AdminListenError {
    /// A socket path that is not absolute.
    #[error("{0:?} must be an absolute path")]
    Relative(String),
    /// Neither `IP:PORT` nor `unix:PATH`.
    #[error("{0:?} must be IP:PORT or unix:/absolute/path")]
    Shape(String),
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
