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
    pub max_claims_per_minute: Option<i64>,
    pub allow_insecure: Option<bool>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(crate) struct RawWebhook {
    pub listen: Option<String>,
    pub path: Option<String>,
    pub secret: Option<String>,
    pub reconcile_interval: Option<String>,
    pub max_body: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(crate) struct RawRunner {
    pub max_concurrent: Option<i64>,
    pub job_timeout: Option<String>,
    pub shutdown_timeout: Option<String>,
    pub name_prefix: Option<String>,
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

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(crate) struct RawProviders {
    pub local: Option<RawProcess>,
    pub linux: Option<RawLinux>,
    pub vm_macos: Option<RawVmMacos>,
    pub native_macos: Option<RawProcess>,
}

/// The keys every provider table shares.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(crate) struct RawRestart {
    pub policy: Option<String>,
    pub max_restarts: Option<i64>,
    pub within: Option<String>,
    pub backoff: Option<String>,
}

/// `[providers.local]` and `[providers.native_macos]`: the runner as a process on this host.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(crate) struct RawProcess {
    pub enabled: Option<bool>,
    pub labels: Option<Vec<String>>,
    pub max_concurrent: Option<i64>,
    pub restart: Option<RawRestart>,
    pub runner_dir: Option<String>,
    pub command: Option<String>,
    pub args: Option<Vec<String>>,
    pub work_root: Option<String>,
    pub run_as: Option<RawUsers>,
    pub allow_root: Option<bool>,
}

/// `run_as`: one user, or one per concurrent runner.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub(crate) enum RawUsers {
    One(String),
    Many(Vec<String>),
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(crate) struct RawLinux {
    pub enabled: Option<bool>,
    pub labels: Option<Vec<String>>,
    pub max_concurrent: Option<i64>,
    pub restart: Option<RawRestart>,
    pub socket: Option<String>,
    pub image: Option<String>,
    pub command: Option<Vec<String>>,
    pub network: Option<String>,
    pub allow_insecure: Option<bool>,
    pub memory: Option<String>,
    pub pids_limit: Option<i64>,
    pub cpus: Option<f64>,
    pub read_only_root: Option<bool>,
    pub cap_add: Option<Vec<String>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(crate) struct RawVmMacos {
    pub enabled: Option<bool>,
    pub labels: Option<Vec<String>>,
    pub max_concurrent: Option<i64>,
    pub restart: Option<RawRestart>,
    pub base_image: Option<String>,
    pub ssh_user: Option<String>,
    pub runner_command: Option<String>,
    pub tart_path: Option<String>,
    pub ssh_path: Option<String>,
    pub boot_timeout: Option<String>,
}
