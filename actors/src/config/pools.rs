//! `[providers.*]`: the named pools, the keys every pool takes, and each kind's own settings.

use std::{path::PathBuf, time::Duration};

use super::{PoolName, ProviderKind, Secret, defaults};

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
            PoolSpec::LinuxVm(_) => ProviderKind::LinuxVm,
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
    /// `kind = "linux_vm"`
    LinuxVm(super::linux_vm::LinuxVmConfig),
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
    /// `targets`: the names of the GitHub targets whose jobs this pool takes; `None`: every
    /// target's (slots are the host's).
    pub targets: Option<Vec<String>>,
    /// `warm` and `warm_max_age`: environments booted ahead of their claims.
    pub warm: super::WarmConfig,
    /// `egress`: what its jobs may reach past the fence.
    pub egress: super::EgressConfig,
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
    /// Neither, with `runner.auto_update`: the daemon downloads, verifies and keeps current an
    /// actions/runner release under `<state.dir>-work/runners/<version>`, copied per job as
    /// `runner_dir` is.
    Managed,
}

impl RunnerProgram {
    /// The file that is started: `run.sh` of the install, or the command.
    pub fn executable(&self) -> PathBuf {
        match self {
            RunnerProgram::Install(dir) => dir.join("run.sh"),
            RunnerProgram::Command(path) => path.clone(),
            RunnerProgram::Managed => PathBuf::from("run.sh"),
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
    /// Run it as the daemon's own user: an explicit choice (`allow_root` implies it).
    pub allow_same_user: bool,
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
    /// `allow_host_paths`: binds of the host's own trees, the daemon's directories or the
    /// engine's socket, and devices off the allow-list, are accepted (docs/security.md).
    pub allow_host_paths: bool,
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
    /// Whose ssh host key a VM must present before it gets a JIT config.
    pub host_keys: HostKeys,
    /// Extra arguments of `tart run` (e.g. `--net-softnet`).
    pub run_args: Vec<String>,
}

/// `host_keys`: how the daemon knows a VM's ssh host key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum HostKeys {
    /// Each clone makes its own keys at boot, and the daemon learns the public one through
    /// `tart exec` (a channel bound to that VM, not the network): no other VM can pose as it.
    #[default]
    PerVm,
    /// The base image's keys, learned from the first VM booted from it and required of every
    /// later one: every clone, and so every job with root in its guest, holds the same key.
    Image,
}

impl HostKeys {
    /// The config spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            HostKeys::PerVm => "per_vm",
            HostKeys::Image => "image",
        }
    }
}

/// `[providers.native_macos]`
pub type NativeMacosConfig = ProcessPoolConfig;
