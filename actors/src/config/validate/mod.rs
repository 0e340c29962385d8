//! Stage two of config loading: raw values in, a typed [`Config`] or every problem out.
//!
//! Each check pushes onto one [`Problems`] list and carries on with a placeholder value, so a
//! single run reports all problems with their key paths. Defaults are applied here and only
//! here. No problem message ever quotes a secret.

use std::{net::SocketAddr, path::Path, time::Duration};

use super::{
    AdminConfig, AdminListen, AppAuth, ClaimRetryConfig, Config, ConfigError, ConfigErrors,
    ContainerLimits, ContainerMounts, EgressConfig, Environment, GithubAuth, GithubConfig,
    HostKeys, LinuxConfig, LogConfig, LogFormat, MetricsConfig, OrphanSweepConfig, PoolConfig,
    PoolName, PoolSpec, ProcessPoolConfig, ProviderCommon, ProviderKind, ProvidersConfig,
    ProxyConfig, PullPolicy, RestartConfig, RestartPolicy, RunnerConfig, RunnerProgram,
    RunnerUpdateConfig, Secret, StateConfig, VmMacosConfig, WebhookConfig, defaults,
    raw::{RawCommand, RawConfig, RawEgress, RawPool, RawProviders, RawRestart, RawUsers},
};

mod cluster;
#[cfg(test)]
mod cluster_tests;
mod containers;
mod egress;
#[cfg(test)]
mod egress_tests;
mod github;
pub(crate) mod host_paths;
#[cfg(test)]
mod host_tests;
mod linux_vm;
mod network;
#[cfg(test)]
mod pool_tests;
mod providers;
mod runner;
pub(crate) mod runner_env;
mod targets;
#[cfg(test)]
mod targets_tests;
mod telemetry;
#[cfg(test)]
mod tests;
mod warm;
mod webhook;
#[cfg(test)]
mod webhook_tests;

use github::build_github;
use providers::build_providers;
use runner::{build_log, build_runner, build_state};
use webhook::build_webhook;

/// Collects problems as validation walks the raw config.
#[derive(Debug, Default)]
struct Problems(Vec<ConfigError>);

impl Problems {
    fn push(&mut self, key: impl Into<String>, reason: impl std::fmt::Display) {
        self.0.push(ConfigError {
            key: key.into(),
            reason: reason.to_string(),
        });
    }
}

pub(super) fn load(
    text: &str,
    base_dir: Option<&Path>,
    env: &Environment,
) -> Result<Config, ConfigErrors> {
    let mut problems = Problems::default();
    let raw = parse(text, &mut problems);
    let config = raw.map(|raw| build(raw, base_dir, env, &mut problems));
    match config {
        Some(config) if problems.0.is_empty() => Ok(config),
        _ => Err(ConfigErrors(problems.0)),
    }
}

/// Stage one: serde into [`RawConfig`], recording every unknown key.
fn parse(text: &str, problems: &mut Problems) -> Option<RawConfig> {
    let de = match toml::Deserializer::parse(text) {
        Ok(de) => de,
        Err(e) => {
            problems.push(
                "<file>",
                format!("not valid TOML{}: {}", at_line(text, &e), e.message()),
            );
            return None;
        }
    };
    let mut unknown = Vec::new();
    let mut record = |path: serde_ignored::Path<'_>| unknown.push(key_path(&path));
    let ignoring = serde_ignored::Deserializer::new(de, &mut record);
    let result: Result<RawConfig, _> = serde_path_to_error::deserialize(ignoring);
    for key in unknown {
        problems.push(key, "unknown key");
    }
    match result {
        Ok(raw) => Some(raw),
        Err(e) => {
            let key = e.path().to_string();
            let inner = e.into_inner();
            problems.push(key, format!("{}{}", inner.message(), at_line(text, &inner)));
            None
        }
    }
}

fn at_line(text: &str, e: &toml::de::Error) -> String {
    match e.span() {
        Some(span) => format!(
            " (line {})",
            text[..span.start.min(text.len())].lines().count().max(1)
        ),
        None => String::new(),
    }
}

/// `serde_ignored`'s own `Display` shows `?` for options; operators want plain dotted keys.
fn key_path(path: &serde_ignored::Path<'_>) -> String {
    use serde_ignored::Path as P;
    match path {
        P::Root => String::new(),
        P::Seq { parent, index } => format!("{}[{index}]", key_path(parent)),
        P::Map { parent, key } => {
            let parent = key_path(parent);
            if parent.is_empty() {
                key.clone()
            } else {
                format!("{parent}.{key}")
            }
        }
        P::Some { parent } | P::NewtypeStruct { parent } | P::NewtypeVariant { parent } => {
            key_path(parent)
        }
    }
}

/// Parses a duration such as `"30s"`, `"1m"`, `"90m"`, `"2h"` or `"0s"`.
pub(crate) fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    if s.is_empty() {
        return Err("empty duration (use e.g. \"30s\", \"1m\", \"2h\")".into());
    }
    if s == "0" {
        return Ok(Duration::ZERO);
    }
    humantime::parse_duration(s)
        .map_err(|e| format!("bad duration {s:?}: {e} (use e.g. \"30s\", \"1m\", \"2h\")"))
}

fn duration(key: &str, raw: Option<String>, default: Duration, p: &mut Problems) -> Duration {
    match raw {
        None => default,
        Some(s) => parse_duration(&s).unwrap_or_else(|reason| {
            p.push(key, reason);
            default
        }),
    }
}

/// A duration where `"0s"` means "off".
fn optional_duration(
    key: &str,
    raw: Option<String>,
    default: Duration,
    p: &mut Problems,
) -> Option<Duration> {
    Some(duration(key, raw, default, p)).filter(|d| !d.is_zero())
}

fn positive_duration(
    key: &str,
    raw: Option<String>,
    default: Duration,
    p: &mut Problems,
) -> Duration {
    let d = duration(key, raw, default, p);
    if d.is_zero() {
        p.push(key, "must be greater than zero");
        return default;
    }
    d
}

fn socket_addr(key: &str, raw: &str, p: &mut Problems) -> SocketAddr {
    raw.parse().unwrap_or_else(|_| {
        p.push(
            key,
            format!("{raw:?} is not an address of the form IP:PORT (e.g. \"127.0.0.1:9090\")"),
        );
        SocketAddr::from(([127, 0, 0, 1], 0))
    })
}

fn count(key: &str, raw: Option<i64>, default: usize, min: i64, p: &mut Problems) -> usize {
    match raw {
        None => default,
        Some(n) if n < min => {
            p.push(key, format!("must be at least {min}, got {n}"));
            default
        }
        Some(n) => usize::try_from(n).unwrap_or(default),
    }
}

fn non_empty(key: &str, raw: Option<String>, default: &str, p: &mut Problems) -> String {
    let v = raw.unwrap_or_else(|| default.to_string());
    if v.trim().is_empty() {
        p.push(key, "must not be empty");
    }
    v
}

fn build(raw: RawConfig, base_dir: Option<&Path>, env: &Environment, p: &mut Problems) -> Config {
    let state = build_state(raw.state, p);
    let secrets = targets::secret_references(&raw.github);
    let insecure = raw.github.allow_insecure.unwrap_or(false);
    let providers = build_providers(raw.providers, &state.dir, env, &secrets, p);
    // `[github]`'s problems are listed before `[webhook]`'s, as in the file.
    let mut webhook_problems = Problems::default();
    let webhook = build_webhook(
        raw.webhook,
        raw.github.targets.is_some(),
        env,
        &mut webhook_problems,
    );
    let (github, targets) = targets::build_targets(raw.github, &webhook, base_dir, env, p);
    p.0.extend(webhook_problems.0);
    targets::check_pool_targets(&providers, &targets, p);
    let mut providers = providers;
    egress::for_ghes(&mut providers, &github, &targets);
    let config = Config {
        github,
        targets,
        webhook,
        runner: build_runner(raw.runner, insecure, p),
        metrics: MetricsConfig {
            listen: raw
                .metrics
                .listen
                .map(|l| socket_addr("metrics.listen", &l, p)),
        },
        admin: AdminConfig {
            listen: AdminListen::parse(
                raw.admin
                    .listen
                    .as_deref()
                    .unwrap_or(defaults::ADMIN_LISTEN),
            )
            .unwrap_or_else(|e| {
                p.push("admin.listen", e);
                AdminListen::Tcp(SocketAddr::from(([127, 0, 0, 1], 9091)))
            }),
        },
        log: build_log(raw.log, p),
        state,
        providers,
        cluster: cluster::build_cluster(raw.cluster, env, p),
        telemetry: telemetry::build_telemetry(raw.telemetry, p),
    };
    check_listeners(&config, p);
    check_scaleset(&config, p);
    check_managed_installs(&config, p);
    warm::check_registered(&config, p);
    targets::check_with_webhook(&config, p);
    config
}

/// A process pool with neither `runner_dir` nor `command` runs a daemon-managed install, which
/// needs `runner.auto_update`.
fn check_managed_installs(c: &Config, p: &mut Problems) {
    if c.runner.update.auto_update {
        return;
    }
    for pool in c.providers.enabled() {
        if let Some(proc) = pool.process()
            && proc.program == RunnerProgram::Managed
        {
            p.push(
                format!("providers.{}.runner_dir", pool.name),
                "an enabled process provider needs runner_dir (an actions/runner install) or \
                 command (an executable that keeps no state beside itself), or \
                 runner.auto_update = true for an install the daemon downloads and keeps current",
            );
        }
    }
}

/// Scale-set mode registers each pool's scale set at the org (or enterprise): a repo list
/// would restrict nothing there, and would silently ignore jobs GitHub assigned.
fn check_scaleset(c: &Config, p: &mut Problems) {
    if !c.webhook.scaleset() {
        return;
    }
    for (i, t) in c.targets().iter().enumerate() {
        if !t.github.repos.is_empty() {
            let key = if c.targets.is_empty() {
                "github.repos".to_string()
            } else {
                format!("github.targets[{i}].repos")
            };
            p.push(
                key,
                "not used with webhook.mode = \"scaleset\": scale sets are registered at the org; \
                 limit the repos with the runner group's repository access instead",
            );
        }
    }
}

/// Two listeners on one address would fail at bind time with a less helpful message.
fn check_listeners(c: &Config, p: &mut Problems) {
    let webhook = c.webhook.listen;
    let clash = |a: SocketAddr| a.port() != 0 && a == webhook;
    if c.metrics.listen.is_some_and(clash) {
        p.push(
            "metrics.listen",
            "same address as webhook.listen (omit metrics.listen to share it)",
        );
    }
    if let Some(admin) = c.admin.listen.tcp()
        && (clash(admin) || (c.metrics.listen == Some(admin) && admin.port() != 0))
    {
        p.push(
            "admin.listen",
            "must differ from webhook.listen and metrics.listen",
        );
    }
}

/// Whether the host of `authority[/path]` (after the scheme) is this machine.
pub(super) fn loopback(authority: &str) -> bool {
    let authority = authority.split('/').next().unwrap_or("");
    let host = match authority.strip_prefix('[') {
        Some(v6) => v6.split(']').next().unwrap_or(""),
        None => authority.rsplit_once(':').map_or(authority, |(h, _)| h),
    };
    host.eq_ignore_ascii_case("localhost")
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// `"1MiB"`, `"512KiB"`, `"2MB"`, `"4096"`: bytes.
fn parse_size(text: &str) -> Option<usize> {
    let t = text.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (number, unit) = t.split_at(split);
    let n: usize = number.parse().ok()?;
    let unit = match unit.trim() {
        "" | "B" => 1,
        "KiB" => 1024,
        "MiB" => 1024 * 1024,
        "KB" | "kB" => 1000,
        "MB" => 1000 * 1000,
        "GiB" => 1024 * 1024 * 1024,
        "GB" => 1000 * 1000 * 1000,
        _ => return None,
    };
    n.checked_mul(unit)
}
