//! The shared vocabulary every layer speaks, with no dependency on any of them: error classes,
//! provider kinds, rate-limit readings, label sets. Everything above (config, GitHub, store,
//! ladder, scheduler) imports it from here, so the module graph has no cycle.

use std::{fmt, sync::Arc, time::Duration};

use serde::{Deserialize, Serialize};

/// How a failure should be treated by the retry ladder.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorClass {
    /// Retrying cannot help (bad credentials, missing permission, not found, validation).
    NonRetryable,
    /// GitHub's primary or secondary rate limit; wait for the reset or `Retry-After`.
    RateLimit,
    /// GitHub answered 5xx.
    ServerSide,
    /// No answer: connect failure, timeout, reset connection.
    Network,
    /// Anything else; retried, because losing a job is worse than one more call.
    UnknownRetryable,
}

impl ErrorClass {
    /// All classes, in the order docs/metrics.md lists them.
    pub const ALL: [ErrorClass; 5] = [
        ErrorClass::NonRetryable,
        ErrorClass::RateLimit,
        ErrorClass::ServerSide,
        ErrorClass::Network,
        ErrorClass::UnknownRetryable,
    ];

    /// The spelling used in logs and the `class` metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorClass::NonRetryable => "non_retryable",
            ErrorClass::RateLimit => "rate_limit",
            ErrorClass::ServerSide => "server_side",
            ErrorClass::Network => "network",
            ErrorClass::UnknownRetryable => "unknown_retryable",
        }
    }

    /// Whether the retry ladder takes a failure of this class.
    pub fn is_retryable(self) -> bool {
        self != ErrorClass::NonRetryable
    }
}

impl fmt::Display for ErrorClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Which provisioner a provider table configures.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum ProviderKind {
    /// A runner process on this host.
    Local,
    /// A container per job on a Docker-compatible engine.
    Linux,
    /// A cloned macOS VM per job, driven by `tart`.
    VmMacos,
    /// A runner process directly on a macOS host.
    NativeMacos,
    /// A QEMU microVM per job: its own kernel, a copy-on-write disk.
    LinuxVm,
}

impl ProviderKind {
    /// All kinds, in routing tie-break order.
    pub const ALL: [ProviderKind; 5] = [
        ProviderKind::Local,
        ProviderKind::Linux,
        ProviderKind::VmMacos,
        ProviderKind::NativeMacos,
        ProviderKind::LinuxVm,
    ];

    /// The name used in config keys, runner names, metrics labels and logs.
    pub fn as_str(self) -> &'static str {
        match self {
            ProviderKind::Local => "local",
            ProviderKind::Linux => "linux",
            ProviderKind::VmMacos => "vm_macos",
            ProviderKind::NativeMacos => "native_macos",
            ProviderKind::LinuxVm => "linux_vm",
        }
    }

    /// The provisioner actor that serves this kind, as the design names it (logs, `status`).
    pub fn provisioner_name(self) -> &'static str {
        match self {
            ProviderKind::Local => "LocalProvisioner",
            ProviderKind::Linux => "LinuxProvisioner",
            ProviderKind::VmMacos => "VmMacosProvisioner",
            ProviderKind::NativeMacos => "NativeMacosProvisioner",
            ProviderKind::LinuxVm => "LinuxVmProvisioner",
        }
    }

    /// A runner-name-safe spelling (GitHub runner names allow `-` and `_`; we keep `-`).
    pub fn name_part(self) -> &'static str {
        match self {
            ProviderKind::Local => "local",
            ProviderKind::Linux => "linux",
            ProviderKind::VmMacos => "vm-macos",
            ProviderKind::NativeMacos => "native-macos",
            ProviderKind::LinuxVm => "linux-vm",
        }
    }
}

impl fmt::Display for ProviderKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A provider pool's name, `NAME` in `[providers.NAME]`: the identity routing, runner names,
/// metrics, `status` and the store use. A table named after a kind is the pool of that name
/// (`local`, `linux`, ...). Cheap to clone.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct PoolName(Arc<str>);

impl PoolName {
    /// A pool name as written in the config.
    pub fn new(name: &str) -> Self {
        PoolName(Arc::from(name))
    }

    /// The name, as in config keys, metrics labels and logs.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The runner-name spelling: `_` becomes `-` (so `vm_macos` is `vm-macos` in names).
    pub fn name_part(&self) -> String {
        self.0.replace('_', "-").to_ascii_lowercase()
    }
}

/// What this install's runner names of `provider` start with: `<name_prefix>-<provider>-`
/// and the install id, which the random part continues (the names keep the contract's shape
/// `<prefix>-<provider>-<short random>`).
pub fn runner_prefix(name_prefix: &str, provider: &PoolName, install_id: &str) -> String {
    format!("{name_prefix}-{}-{install_id}", provider.name_part())
}

impl From<&str> for PoolName {
    fn from(name: &str) -> Self {
        PoolName::new(name)
    }
}

impl From<ProviderKind> for PoolName {
    fn from(kind: ProviderKind) -> Self {
        PoolName::new(kind.as_str())
    }
}

impl fmt::Display for PoolName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for PoolName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

impl PartialEq<str> for PoolName {
    fn eq(&self, other: &str) -> bool {
        &*self.0 == other
    }
}

impl PartialEq<&str> for PoolName {
    fn eq(&self, other: &&str) -> bool {
        &*self.0 == *other
    }
}

/// The variables the daemon sets in every runner's environment, by who reads them: the
/// provisioners set them, and a pool's `env` may not override any of them.
pub mod runner_vars {
    /// The runner's own: `ACTIONS_RUNNER_INPUT_JITCONFIG` is its credential (actions/runner
    /// reads it like `--jitconfig`); `RUNNER_MANUALLY_TRAP_SIG` and `RUNNER_ALLOW_RUNASROOT` are
    /// read by its `run.sh`/`run-helper.sh` (src/Misc/layoutroot); `HOME` and `TMPDIR` are the
    /// job's own directories; [`VERSION_EXIT`] asks for the exit code of a version GitHub
    /// refuses.
    pub const RUNNER: [&str; 6] = [
        "ACTIONS_RUNNER_INPUT_JITCONFIG",
        "RUNNER_MANUALLY_TRAP_SIG",
        "RUNNER_ALLOW_RUNASROOT",
        "HOME",
        "TMPDIR",
        VERSION_EXIT,
    ];
    /// Set to `1` for every runner: a listener GitHub refuses as too old ("Runner version vX
    /// is deprecated and cannot receive messages") then exits with code 7 (the provision
    /// module's `RUNNER_VERSION_DEPRECATED`) instead of 1 (actions/runner PR #4285,
    /// its `run.sh` passes the code on), which the daemon reads as "update the install".
    pub const VERSION_EXIT: &str = "ACTIONS_RUNNER_RETURN_VERSION_DEPRECATED_EXIT_CODE";
    /// The proxy (`github.proxy`), in both spellings: GitHub's docs for self-hosted runners
    /// name the lowercase ones; many tools read the uppercase.
    pub const PROXY: [&str; 4] = ["https_proxy", "HTTPS_PROXY", "http_proxy", "HTTP_PROXY"];
    /// The hosts that bypass it (`github.no_proxy`).
    pub const NO_PROXY: [&str; 2] = ["no_proxy", "NO_PROXY"];
    /// The CA bundle (`github.ca_file`): OpenSSL (the runner's .NET on Linux, git, curl) reads
    /// `SSL_CERT_FILE`; Node (JavaScript actions) ignores the system store and reads
    /// `NODE_EXTRA_CA_CERTS` (GitHub's docs on self-hosted runners and self-signed
    /// certificates); `EPHEMER_CA_FILE` names it for scripts.
    pub const CA: [&str; 3] = ["SSL_CERT_FILE", "NODE_EXTRA_CA_CERTS", "EPHEMER_CA_FILE"];

    /// Whether the daemon sets `name` itself (any `ACTIONS_RUNNER_INPUT_*` counts).
    pub fn set_by_daemon(name: &str) -> bool {
        name.starts_with("ACTIONS_RUNNER_INPUT_")
            || [&RUNNER[..], &PROXY, &NO_PROXY, &CA]
                .iter()
                .any(|names| names.contains(&name))
    }
}

/// A GitHub rate-limit bucket, as `X-RateLimit-Resource` names it: `core` for most REST
/// calls, `actions_runner_registration` for registering self-hosted runners (the JIT and
/// registration-token endpoints); each has its own limit, remaining and reset.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default, Serialize, Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum RateBucket {
    /// `core` (also what an answer without `X-RateLimit-Resource` spends).
    #[default]
    Core,
    /// `actions_runner_registration`.
    ActionsRunnerRegistration,
    /// Any other bucket GitHub names (`search`, `graphql`, ...).
    Other,
}

impl RateBucket {
    /// Every bucket, in the order the gauges list them.
    pub const ALL: [RateBucket; 3] = [
        RateBucket::Core,
        RateBucket::ActionsRunnerRegistration,
        RateBucket::Other,
    ];

    /// The bucket `X-RateLimit-Resource: name` spends.
    pub fn parse(name: &str) -> Self {
        match name.trim() {
            "" | "core" => RateBucket::Core,
            "actions_runner_registration" => RateBucket::ActionsRunnerRegistration,
            _ => RateBucket::Other,
        }
    }

    /// The `resource` label of the rate gauges.
    pub fn as_str(self) -> &'static str {
        match self {
            RateBucket::Core => "core",
            RateBucket::ActionsRunnerRegistration => "actions_runner_registration",
            RateBucket::Other => "other",
        }
    }
}

/// One response's rate-limit headers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
pub struct RateHeaders {
    /// `X-RateLimit-Remaining`
    pub remaining: Option<u64>,
    /// `X-RateLimit-Limit`
    pub limit: Option<u64>,
    /// `X-RateLimit-Reset` (unix seconds)
    pub reset: Option<u64>,
    /// `X-RateLimit-Used`
    pub used: Option<u64>,
    /// `X-RateLimit-Resource`: the bucket this answer spent.
    pub resource: RateBucket,
}

/// What GitHub's headers said about one credential's budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct RateSnapshot {
    /// Requests left in the window.
    pub remaining: Option<u64>,
    /// The window's ceiling.
    pub limit: Option<u64>,
    /// Unix seconds at which the window resets.
    pub reset: Option<u64>,
    /// Requests used in the window.
    pub used: Option<u64>,
    /// Unix seconds of the last reading (0: never read).
    pub updated: u64,
    /// `Retry-After` of the latest answer that carried one.
    pub retry_after: Option<Duration>,
    /// Unix seconds at which that `Retry-After` was received.
    pub retry_after_at: Option<u64>,
}

impl RateSnapshot {
    /// True when the budget is provably empty: remaining 0, the reading younger than
    /// `max_staleness`, and the reset still ahead. Then the reset time is returned.
    pub fn exhausted_until(&self, now_unix: u64, max_staleness: Duration) -> Option<u64> {
        let fresh =
            self.updated != 0 && now_unix.saturating_sub(self.updated) < max_staleness.as_secs();
        match (self.remaining, self.reset) {
            (Some(0), Some(reset)) if fresh && reset > now_unix => Some(reset),
            _ => None,
        }
    }
}

/// A set of runner labels: lowercased, trimmed, without blanks or repeats, sorted.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct LabelSet(Vec<String>);

impl LabelSet {
    /// The set of `labels` (case-insensitive, order and repeats ignored).
    pub fn new(labels: &[String]) -> Self {
        let mut set: Vec<String> = labels
            .iter()
            .map(|l| l.trim().to_ascii_lowercase())
            .filter(|l| !l.is_empty())
            .collect();
        set.sort();
        set.dedup();
        LabelSet(set)
    }

    /// True when this set (a pool's labels) includes every label of `wanted` (a job's).
    pub fn covers(&self, wanted: &LabelSet) -> bool {
        wanted.0.iter().all(|w| self.0.binary_search(w).is_ok())
    }

    /// What `covers(&LabelSet::new(wanted))` answers (each label trimmed, compared in any
    /// ASCII case, empty ones ignored), without building that set: the intake asks it of
    /// every `queued` delivery.
    pub fn covers_labels(&self, wanted: &[String]) -> bool {
        wanted.iter().all(|w| {
            let w = w.trim();
            w.is_empty() || self.0.iter().any(|l| l.eq_ignore_ascii_case(w))
        })
    }

    /// Labels this set has beyond `wanted` (routing prefers the fewest).
    pub fn extra_over(&self, wanted: &LabelSet) -> usize {
        self.0.len().saturating_sub(wanted.0.len())
    }

    /// The labels.
    pub fn as_slice(&self) -> &[String] {
        &self.0
    }
}

/// How many random characters end a runner name (after the install id).
pub const RANDOM_SUFFIX_LEN: usize = 8;

/// Whether `name` is a runner of the install `install_id` under `name_prefix`, of any pool,
/// configured now or not: `<name_prefix>-<pool>-<install_id><random suffix>`. Another
/// install's runners, even of a pool whose name ends in `-<install_id>`, are not.
pub fn names_install_runner(name: &str, name_prefix: &str, install_id: &str) -> bool {
    let Some(rest) = name
        .strip_prefix(name_prefix)
        .and_then(|rest| rest.strip_prefix('-'))
    else {
        return false;
    };
    !install_id.is_empty()
        && rest.rsplit_once('-').is_some_and(|(pool, tail)| {
            !pool.is_empty()
                && tail.len() == install_id.len() + RANDOM_SUFFIX_LEN
                && tail.starts_with(install_id)
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(s: &[&str]) -> LabelSet {
        LabelSet::new(&s.iter().map(|x| x.to_string()).collect::<Vec<_>>())
    }

    #[test]
    fn label_sets_ignore_case_order_and_repeats() {
        assert_eq!(
            set(&["Linux", "self-hosted", "linux", " "]).as_slice(),
            ["linux", "self-hosted"]
        );
        let pool = set(&["self-hosted", "linux", "x64"]);
        assert!(pool.covers(&set(&["Self-Hosted", "LINUX"])));
        assert_eq!(pool.extra_over(&set(&["Self-Hosted", "LINUX"])), 1);
        assert!(!set(&["self-hosted", "linux"]).covers(&set(&["self-hosted", "gpu"])));
        assert!(set(&["self-hosted"]).covers(&set(&[])));
    }

    /// `covers_labels` answers as `covers` of the set built from the same labels, for labels
    /// drawn from a small alphabet of spellings (case, spaces, repeats, empty ones, non-ASCII).
    #[test]
    fn covers_labels_answers_as_the_built_set_does() {
        let words = [
            "linux",
            "Linux",
            " LINUX ",
            "x64",
            "X64",
            "gpu",
            "",
            "  ",
            "self-hosted",
            "ÄRM",
            "ärm",
            "Self-Hosted",
        ];
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = |n: usize| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state % n as u64) as usize
        };
        for _ in 0..5000 {
            let (p, j) = (1 + next(4), next(4));
            let pool: Vec<String> = (0..p).map(|_| words[next(words.len())].into()).collect();
            let job: Vec<String> = (0..j).map(|_| words[next(words.len())].into()).collect();
            let pool = LabelSet::new(&pool);
            assert_eq!(
                pool.covers_labels(&job),
                pool.covers(&LabelSet::new(&job)),
                "{pool:?} {job:?}"
            );
        }
    }
}
