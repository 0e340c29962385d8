//! Stage one of config loading: the TOML file as serde reads it.
//!
//! Every field is optional and every duration is still a string, so that a missing key or a bad
//! value becomes a validation problem (reported together with all the others) instead of
//! stopping serde at the first one. Unknown keys are collected by `serde_ignored` while these
//! structs are filled; they are errors, exactly as `deny_unknown_fields` would make them, but
//! all of them are reported in one run. Nothing here applies defaults: that is `validate`'s job.

use serde::Deserialize;

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(crate) struct RawConfig {
    pub github: RawGithub,
    pub webhook: RawWebhook,
    pub runner: RawRunner,
    pub state: RawState,
    pub metrics: RawMetrics,
    pub admin: RawAdmin,
    pub log: RawLog,
    pub providers: RawProviders,
    pub cluster: Option<RawCluster>,
    pub telemetry: RawTelemetry,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(crate) struct RawTelemetry {
    pub otlp_endpoint: Option<String>,
    pub service_name: Option<String>,
    pub allow_insecure: Option<bool>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(crate) struct RawCluster {
    pub url: Option<String>,
    pub host: Option<String>,
    pub lease: Option<String>,
    pub pool_size: Option<i64>,
    pub allow_insecure: Option<bool>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(crate) struct RawGithub {
    pub api_url: Option<String>,
    pub owner: Option<String>,
    pub repos: Option<Vec<String>>,
    pub token: Option<String>,
    pub app_id: Option<i64>,
    pub installation_id: Option<i64>,
    pub private_key_path: Option<String>,
    pub runner_group_id: Option<i64>,
    pub runner_group: Option<String>,
    pub enterprise: Option<String>,
    pub max_claims_per_minute: Option<i64>,
    pub allow_insecure: Option<bool>,
    pub ca_file: Option<String>,
    pub proxy: Option<String>,
    pub no_proxy: Option<Vec<String>>,
    pub targets: Option<Vec<RawTarget>>,
}

/// `[[github.targets]]`: one owner and its credential.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(crate) struct RawTarget {
    pub name: Option<String>,
    pub owner: Option<String>,
    pub repos: Option<Vec<String>>,
    pub enterprise: Option<String>,
    pub token: Option<String>,
    pub app_id: Option<i64>,
    pub installation_id: Option<i64>,
    pub private_key_path: Option<String>,
    pub webhook_secret: Option<String>,
    pub runner_group: Option<String>,
    pub runner_group_id: Option<i64>,
    pub max_claims_per_minute: Option<i64>,
    pub weight: Option<i64>,
    pub api_url: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(crate) struct RawWebhook {
    pub listen: Option<String>,
    pub path: Option<String>,
    pub secret: Option<String>,
    pub reconcile_interval: Option<String>,
    pub max_body: Option<String>,
    pub mode: Option<String>,
    pub poll_interval: Option<String>,
    pub poll_idle_interval: Option<String>,
    pub poll_budget: Option<RawShare>,
    pub redeliver: Option<bool>,
    pub redeliver_interval: Option<String>,
    pub hook_id: Option<i64>,
    pub public_url: Option<String>,
}

/// A share written as a fraction (`0.2`) or a percentage (`"20%"`).
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub(crate) enum RawShare {
    Fraction(f64),
    Text(String),
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(crate) struct RawRunner {
    pub max_concurrent: Option<i64>,
    pub job_timeout: Option<String>,
    pub shutdown_timeout: Option<String>,
    pub name_prefix: Option<String>,
    pub auto_update: Option<bool>,
    pub runner_version: Option<String>,
    pub releases_url: Option<String>,
    pub release_check_interval: Option<String>,
    pub min_version: Option<String>,
    pub claim_retry: RawClaimRetry,
    pub orphan_sweep: RawOrphanSweep,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(crate) struct RawClaimRetry {
    pub enabled: Option<bool>,
    pub schedule: Option<Vec<String>>,
    pub max_age: Option<String>,
    pub jitter: Option<f64>,
    pub rate_reset_jitter: Option<Vec<String>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(crate) struct RawOrphanSweep {
    pub enabled: Option<bool>,
    pub grace: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(crate) struct RawState {
    pub dir: Option<String>,
    pub retention: Option<String>,
    pub usage_retention: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(crate) struct RawMetrics {
    pub listen: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(crate) struct RawAdmin {
    pub listen: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(crate) struct RawLog {
    pub level: Option<String>,
    pub format: Option<String>,
}

/// `[providers.NAME]` tables, by name (sorted, so routing's tie-break order is stable).
pub(crate) type RawProviders = std::collections::BTreeMap<String, RawPool>;

/// `providers.NAME.restart`
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(crate) struct RawRestart {
    pub policy: Option<String>,
    pub max_restarts: Option<i64>,
    pub within: Option<String>,
    pub backoff: Option<String>,
}

/// `warm`: a count, or a table with windows.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub(crate) enum RawWarm {
    Count(i64),
    Table(RawWarmTable),
}

#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub(crate) struct RawWarmTable {
    pub min: Option<i64>,
    pub windows: Option<Vec<RawWarmWindow>>,
    pub time_zone: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub(crate) struct RawWarmWindow {
    pub days: Option<String>,
    pub hours: Option<String>,
    pub min: Option<i64>,
}

/// One pool table: the union of every kind's keys, so serde reads any table and validation
/// says which keys the pool's kind does not take (with their paths).
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(crate) struct RawPool {
    // Every kind.
    pub kind: Option<String>,
    pub enabled: Option<bool>,
    pub labels: Option<Vec<String>>,
    pub max_concurrent: Option<i64>,
    pub restart: Option<RawRestart>,
    pub env: Option<std::collections::BTreeMap<String, String>>,
    pub targets: Option<Vec<String>>,
    pub warm: Option<RawWarm>,
    pub warm_max_age: Option<String>,
    pub warm_mode: Option<String>,
    pub egress: Option<RawEgress>,
    // Process kinds (`local`, `native_macos`); `command` is also the container's.
    pub runner_dir: Option<String>,
    pub command: Option<RawCommand>,
    pub args: Option<Vec<String>>,
    pub work_root: Option<String>,
    pub run_as: Option<RawUsers>,
    pub allow_root: Option<bool>,
    /// Accept jobs as the daemon's own (non-root) user.
    pub allow_same_user: Option<bool>,
    /// Let a container pool bind host paths that reach the engine or the daemon.
    pub allow_host_paths: Option<bool>,
    // `linux`.
    pub socket: Option<String>,
    pub image: Option<String>,
    pub network: Option<String>,
    pub allow_insecure: Option<bool>,
    pub memory: Option<String>,
    pub pids_limit: Option<i64>,
    pub cpus: Option<f64>,
    pub read_only_root: Option<bool>,
    pub cap_add: Option<Vec<String>>,
    pub pull: Option<String>,
    pub volumes: Option<Vec<String>>,
    pub tmpfs: Option<Vec<String>>,
    pub shm_size: Option<String>,
    pub devices: Option<Vec<String>>,
    pub extra_hosts: Option<Vec<String>>,
    pub dns: Option<Vec<String>>,
    pub docker_access: Option<bool>,
    // `vm_macos`.
    pub base_image: Option<String>,
    pub ssh_user: Option<String>,
    pub runner_command: Option<String>,
    pub tart_path: Option<String>,
    pub ssh_path: Option<String>,
    pub boot_timeout: Option<String>,
    pub host_keys: Option<String>,
    pub run_args: Option<Vec<String>>,
    // `linux_vm` (with `image`, `network`, `memory`, `cpus`, `boot_timeout`, `runner_command`).
    pub kernel: Option<String>,
    pub initrd: Option<String>,
    pub disk: Option<String>,
    pub accel: Option<String>,
    pub qemu_path: Option<String>,
    pub qemu_img_path: Option<String>,
}

impl RawPool {
    /// The kind-specific keys this table sets, by kind that takes them, for "not a key of
    /// this kind" problems.
    pub(super) fn kind_keys(&self) -> Vec<(&'static str, &'static [&'static str])> {
        const PROCESS: &[&str] = &["local", "native_macos"];
        const LINUX: &[&str] = &["linux"];
        const VM: &[&str] = &["vm_macos"];
        const PROCESS_OR_LINUX: &[&str] = &["local", "native_macos", "linux"];
        const LINUX_OR_LINUX_VM: &[&str] = &["linux", "linux_vm"];
        const MACOS_OR_LINUX_VM: &[&str] = &["vm_macos", "linux_vm"];
        const LINUX_VM: &[&str] = &["linux_vm"];
        let keys: [(&'static str, bool, &'static [&'static str]); 39] = [
            ("runner_dir", self.runner_dir.is_some(), PROCESS),
            ("command", self.command.is_some(), PROCESS_OR_LINUX),
            ("args", self.args.is_some(), PROCESS),
            ("work_root", self.work_root.is_some(), PROCESS),
            ("run_as", self.run_as.is_some(), PROCESS),
            ("allow_root", self.allow_root.is_some(), PROCESS),
            ("allow_same_user", self.allow_same_user.is_some(), PROCESS),
            ("socket", self.socket.is_some(), LINUX),
            ("image", self.image.is_some(), LINUX_OR_LINUX_VM),
            ("network", self.network.is_some(), LINUX_OR_LINUX_VM),
            ("allow_insecure", self.allow_insecure.is_some(), LINUX),
            ("memory", self.memory.is_some(), LINUX_OR_LINUX_VM),
            ("pids_limit", self.pids_limit.is_some(), LINUX),
            ("cpus", self.cpus.is_some(), LINUX_OR_LINUX_VM),
            ("read_only_root", self.read_only_root.is_some(), LINUX),
            ("cap_add", self.cap_add.is_some(), LINUX),
            ("pull", self.pull.is_some(), LINUX),
            ("volumes", self.volumes.is_some(), LINUX),
            ("allow_host_paths", self.allow_host_paths.is_some(), LINUX),
            ("tmpfs", self.tmpfs.is_some(), LINUX),
            ("shm_size", self.shm_size.is_some(), LINUX),
            ("devices", self.devices.is_some(), LINUX),
            ("extra_hosts", self.extra_hosts.is_some(), LINUX),
            ("dns", self.dns.is_some(), LINUX),
            ("docker_access", self.docker_access.is_some(), LINUX),
            ("base_image", self.base_image.is_some(), VM),
            ("ssh_user", self.ssh_user.is_some(), VM),
            (
                "runner_command",
                self.runner_command.is_some(),
                MACOS_OR_LINUX_VM,
            ),
            ("tart_path", self.tart_path.is_some(), VM),
            ("ssh_path", self.ssh_path.is_some(), VM),
            (
                "boot_timeout",
                self.boot_timeout.is_some(),
                MACOS_OR_LINUX_VM,
            ),
            ("host_keys", self.host_keys.is_some(), VM),
            ("run_args", self.run_args.is_some(), VM),
            ("kernel", self.kernel.is_some(), LINUX_VM),
            ("initrd", self.initrd.is_some(), LINUX_VM),
            ("disk", self.disk.is_some(), LINUX_VM),
            ("accel", self.accel.is_some(), LINUX_VM),
            ("qemu_path", self.qemu_path.is_some(), LINUX_VM),
            ("qemu_img_path", self.qemu_img_path.is_some(), LINUX_VM),
        ];
        keys.into_iter()
            .filter(|(_, set, _)| *set)
            .map(|(key, _, kinds)| (key, kinds))
            .collect()
    }
}

/// `egress`: a pool's allow-list and mode.
#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub(crate) struct RawEgress {
    pub mode: Option<String>,
    pub allow: Option<Vec<String>>,
    pub allow_private: Option<Vec<String>>,
}

/// `command`: a path (process pools) or an argv (containers).
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub(crate) enum RawCommand {
    One(String),
    Many(Vec<String>),
}

/// `run_as`: one user, or one per concurrent runner.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub(crate) enum RawUsers {
    One(String),
    Many(Vec<String>),
}
