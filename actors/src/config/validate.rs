//! Stage two of config loading: raw values in, a typed [`Config`] or every problem out.
//!
//! Each check pushes onto one [`Problems`] list and carries on with a placeholder value, so a
//! single run reports all problems with their key paths. Defaults are applied here and only
//! here. No problem message ever quotes a secret.

use std::{
    net::SocketAddr,
    path::{Path, PathBuf},
    time::Duration,
};

use super::{
    AdminConfig, AppAuth, ClaimRetryConfig, Config, ConfigError, ConfigErrors, Environment,
    GithubAuth, GithubConfig, LinuxConfig, LocalConfig, LogConfig, LogFormat, MetricsConfig,
    NativeMacosConfig, OrphanSweepConfig, ProviderCommon, ProviderKind, ProvidersConfig,
    RestartConfig, RestartPolicy, RunnerConfig, Secret, StateConfig, VmMacosConfig, WebhookConfig,
    defaults,
    raw::{RawConfig, RawRestart},
};

/// Collects problems as validation walks the raw config.
#[derive(Debug, Default)]
struct Problems(Vec<ConfigError>);

impl Problems {
    fn push(&mut self, key: impl Into<String>, reason: impl Into<String>) {
        self.0.push(ConfigError {
            key: key.into(),
            reason: reason.into(),
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
    let state = build_state(raw.state.dir, p);
    let providers = build_providers(raw.providers, &state.dir, p);
    let config = Config {
        github: build_github(raw.github, base_dir, env, p),
        webhook: build_webhook(raw.webhook, env, p),
        runner: build_runner(raw.runner, p),
        metrics: MetricsConfig {
            listen: raw
                .metrics
                .listen
                .map(|l| socket_addr("metrics.listen", &l, p)),
        },
        admin: AdminConfig {
            listen: socket_addr(
                "admin.listen",
                raw.admin
                    .listen
                    .as_deref()
                    .unwrap_or(defaults::ADMIN_LISTEN),
                p,
            ),
        },
        log: build_log(raw.log, p),
        state,
        providers,
    };
    check_listeners(&config, p);
    config
}

fn build_github(
    raw: super::raw::RawGithub,
    base_dir: Option<&Path>,
    env: &Environment,
    p: &mut Problems,
) -> GithubConfig {
    let api_url = raw.api_url.unwrap_or_else(|| defaults::API_URL.into());
    if !(api_url.starts_with("https://") || api_url.starts_with("http://")) {
        p.push(
            "github.api_url",
            format!("{api_url:?} must start with https:// (or http://)"),
        );
    }
    let owner = match raw.owner {
        Some(o) if !o.trim().is_empty() => o,
        _ => {
            p.push(
                "github.owner",
                "required: the org or user that owns the repos",
            );
            String::new()
        }
    };
    let repos = raw.repos.unwrap_or_default();
    for (i, r) in repos.iter().enumerate() {
        if r.trim().is_empty() || r.contains('/') {
            p.push(
                format!("github.repos[{i}]"),
                format!("{r:?} must be a bare repository name owned by github.owner"),
            );
        }
    }
    let runner_group_id = match raw.runner_group_id {
        None => defaults::RUNNER_GROUP_ID,
        Some(n) if n >= 1 => n as u64,
        Some(n) => {
            p.push(
                "github.runner_group_id",
                format!("must be at least 1, got {n}"),
            );
            defaults::RUNNER_GROUP_ID
        }
    };
    let max_claims_per_minute = match raw.max_claims_per_minute {
        None => defaults::MAX_CLAIMS_PER_MINUTE,
        Some(n) if (1..=10_000).contains(&n) => n as u32,
        Some(n) => {
            p.push(
                "github.max_claims_per_minute",
                format!("must be between 1 and 10000, got {n}"),
            );
            defaults::MAX_CLAIMS_PER_MINUTE
        }
    };
    let auth = build_auth(
        &raw.token,
        raw.app_id,
        raw.installation_id,
        raw.private_key_path,
        base_dir,
        env,
        p,
    );
    GithubConfig {
        api_url: api_url.trim_end_matches('/').to_string(),
        owner,
        repos,
        auth,
        runner_group_id,
        max_claims_per_minute,
    }
}

fn build_auth(
    token: &Option<String>,
    app_id: Option<i64>,
    installation_id: Option<i64>,
    private_key_path: Option<String>,
    base_dir: Option<&Path>,
    env: &Environment,
    p: &mut Problems,
) -> GithubAuth {
    let token = token
        .as_deref()
        .filter(|t| !t.is_empty())
        .map(Secret::new)
        .or_else(|| env.github_token.clone());
    let app_configured = app_id.is_some()
        || installation_id.is_some()
        || private_key_path.is_some()
        || (env.app_private_key.is_some() && token.is_none());
    if !app_configured {
        return match token {
            Some(t) => GithubAuth::Token(t),
            None => {
                p.push(
                    "github.token",
                    "no GitHub credentials: set github.token (or GITHUB_TOKEN), or github.app_id, \
                     github.installation_id and github.private_key_path (or EPHEMER_APP_PRIVATE_KEY)",
                );
                GithubAuth::Token(Secret::default())
            }
        };
    }
    let mut id = |key: &str, v: Option<i64>| match v {
        Some(n) if n >= 1 => n as u64,
        Some(n) => {
            p.push(key, format!("must be a positive integer, got {n}"));
            0
        }
        None => {
            p.push(key, "required when GitHub App auth is configured");
            0
        }
    };
    let app_id = id("github.app_id", app_id);
    let installation_id = id("github.installation_id", installation_id);
    let private_key = match (private_key_path, &env.app_private_key) {
        (Some(path), _) => {
            let path = resolve(base_dir, &path);
            match std::fs::read_to_string(&path) {
                Ok(pem) => check_pem("github.private_key_path", Secret::new(pem), p),
                Err(e) => {
                    p.push(
                        "github.private_key_path",
                        format!("cannot read private key {}: {e}", path.display()),
                    );
                    Secret::default()
                }
            }
        }
        (None, Some(pem)) => check_pem("EPHEMER_APP_PRIVATE_KEY", pem.clone(), p),
        (None, None) => {
            p.push(
                "github.private_key_path",
                "required when GitHub App auth is configured (or set EPHEMER_APP_PRIVATE_KEY)",
            );
            Secret::default()
        }
    };
    GithubAuth::App(AppAuth {
        app_id,
        installation_id,
        private_key,
    })
}

/// Checks that a key parses as an RSA private key (PKCS#1 or PKCS#8 PEM) without quoting it.
fn check_pem(key: &str, pem: Secret, p: &mut Problems) -> Secret {
    if jsonwebtoken::EncodingKey::from_rsa_pem(pem.expose().as_bytes()).is_err() {
        p.push(key, "not an RSA private key in PEM form (PKCS#1 or PKCS#8)");
    }
    pem
}

fn resolve(base_dir: Option<&Path>, path: &str) -> PathBuf {
    let path = Path::new(path);
    match base_dir {
        Some(base) if path.is_relative() => base.join(path),
        _ => path.to_path_buf(),
    }
}

fn build_webhook(
    raw: super::raw::RawWebhook,
    env: &Environment,
    p: &mut Problems,
) -> WebhookConfig {
    let listen = socket_addr(
        "webhook.listen",
        raw.listen.as_deref().unwrap_or(defaults::WEBHOOK_LISTEN),
        p,
    );
    let path = raw.path.unwrap_or_else(|| defaults::WEBHOOK_PATH.into());
    if !path.starts_with('/') || path.contains(char::is_whitespace) {
        p.push(
            "webhook.path",
            format!("{path:?} must be a URL path starting with /"),
        );
    }
    if matches!(path.as_str(), "/healthz" | "/readyz" | "/metrics") {
        p.push(
            "webhook.path",
            format!("{path:?} collides with a built-in endpoint"),
        );
    }
    let secret = raw
        .secret
        .filter(|s| !s.is_empty())
        .map(Secret::new)
        .or_else(|| env.webhook_secret.clone())
        .unwrap_or_else(|| {
            p.push(
                "webhook.secret",
                "required: the daemon refuses unsigned webhooks (set it or EPHEMER_WEBHOOK_SECRET)",
            );
            Secret::default()
        });
    WebhookConfig {
        listen,
        path,
        secret,
        reconcile_interval: optional_duration(
            "webhook.reconcile_interval",
            raw.reconcile_interval,
            defaults::RECONCILE_INTERVAL,
            p,
        ),
    }
}

fn build_runner(raw: super::raw::RawRunner, p: &mut Problems) -> RunnerConfig {
    let name_prefix = raw
        .name_prefix
        .unwrap_or_else(|| defaults::NAME_PREFIX.into());
    let prefix_ok = !name_prefix.is_empty()
        && name_prefix.len() <= 32
        && name_prefix
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
    if !prefix_ok {
        p.push(
            "runner.name_prefix",
            format!("{name_prefix:?} must be 1-32 characters of letters, digits, - and _"),
        );
    }
    RunnerConfig {
        max_concurrent: count(
            "runner.max_concurrent",
            raw.max_concurrent,
            defaults::MAX_CONCURRENT,
            1,
            p,
        ),
        job_timeout: optional_duration(
            "runner.job_timeout",
            raw.job_timeout,
            defaults::JOB_TIMEOUT,
            p,
        ),
        shutdown_timeout: duration(
            "runner.shutdown_timeout",
            raw.shutdown_timeout,
            defaults::SHUTDOWN_TIMEOUT,
            p,
        ),
        name_prefix,
        claim_retry: build_claim_retry(raw.claim_retry, p),
        orphan_sweep: OrphanSweepConfig {
            enabled: raw.orphan_sweep.enabled.unwrap_or(true),
            grace: positive_duration(
                "runner.orphan_sweep.grace",
                raw.orphan_sweep.grace,
                defaults::ORPHAN_GRACE,
                p,
            ),
        },
    }
}

fn build_claim_retry(raw: super::raw::RawClaimRetry, p: &mut Problems) -> ClaimRetryConfig {
    let defaults = ClaimRetryConfig::default();
    const KEY: &str = "runner.claim_retry";
    let schedule = match raw.schedule {
        None => defaults.schedule.clone(),
        Some(rungs) if rungs.is_empty() => {
            p.push(format!("{KEY}.schedule"), "must list at least one delay");
            defaults.schedule.clone()
        }
        Some(rungs) => {
            let mut out = Vec::with_capacity(rungs.len());
            for (i, rung) in rungs.iter().enumerate() {
                let key = format!("{KEY}.schedule[{i}]");
                match parse_duration(rung) {
                    Ok(d) if d.is_zero() => p.push(key, "a retry delay must be greater than zero"),
                    Ok(d) => {
                        if let Some(prev) = out.last().copied().filter(|prev| d < *prev) {
                            p.push(
                                key,
                                format!(
                                    "{rung:?} is shorter than the rung before it ({}); the ladder must not decrease",
                                    humantime::format_duration(prev)
                                ),
                            );
                        }
                        out.push(d);
                    }
                    Err(reason) => p.push(key, reason),
                }
            }
            out
        }
    };
    let jitter = match raw.jitter {
        None => defaults.jitter,
        Some(j) if (0.0..=1.0).contains(&j) => j,
        Some(j) => {
            p.push(
                format!("{KEY}.jitter"),
                format!("must be within [0, 1], got {j}"),
            );
            defaults.jitter
        }
    };
    let rate_reset_jitter = match raw.rate_reset_jitter {
        None => defaults.rate_reset_jitter,
        Some(pair) if pair.len() != 2 => {
            p.push(
                format!("{KEY}.rate_reset_jitter"),
                format!("must be two durations [lo, hi], got {} entries", pair.len()),
            );
            defaults.rate_reset_jitter
        }
        Some(pair) => {
            let lo = duration(
                &format!("{KEY}.rate_reset_jitter[0]"),
                Some(pair[0].clone()),
                defaults.rate_reset_jitter.0,
                p,
            );
            let hi = duration(
                &format!("{KEY}.rate_reset_jitter[1]"),
                Some(pair[1].clone()),
                defaults.rate_reset_jitter.1,
                p,
            );
            if lo >= hi {
                p.push(
                    format!("{KEY}.rate_reset_jitter"),
                    format!("lo ({}) must be below hi ({})", pair[0], pair[1]),
                );
            }
            (lo, hi)
        }
    };
    ClaimRetryConfig {
        enabled: raw.enabled.unwrap_or(true),
        schedule,
        max_age: positive_duration(&format!("{KEY}.max_age"), raw.max_age, defaults.max_age, p),
        jitter,
        rate_reset_jitter,
    }
}

fn build_state(dir: Option<String>, p: &mut Problems) -> StateConfig {
    let dir = PathBuf::from(dir.unwrap_or_else(|| defaults::STATE_DIR.into()));
    if !dir.is_absolute() {
        p.push(
            "state.dir",
            format!("{} must be an absolute path", dir.display()),
        );
    }
    StateConfig { dir }
}

fn build_log(raw: super::raw::RawLog, p: &mut Problems) -> LogConfig {
    let level = raw
        .level
        .unwrap_or_else(|| "info".into())
        .to_ascii_lowercase();
    if !matches!(
        level.as_str(),
        "trace" | "debug" | "info" | "warn" | "error"
    ) {
        p.push(
            "log.level",
            format!("{level:?} must be one of trace, debug, info, warn, error"),
        );
    }
    let format = match raw.format.as_deref() {
        None | Some("text") => LogFormat::Text,
        Some("json") => LogFormat::Json,
        Some(other) => {
            p.push(
                "log.format",
                format!("{other:?} must be \"text\" or \"json\""),
            );
            LogFormat::Text
        }
    };
    LogConfig { level, format }
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
    if clash(c.admin.listen)
        || (c.metrics.listen == Some(c.admin.listen) && c.admin.listen.port() != 0)
    {
        p.push(
            "admin.listen",
            "must differ from webhook.listen and metrics.listen",
        );
    }
}

struct CommonDefaults {
    enabled: bool,
    labels: &'static [&'static str],
    max_concurrent: usize,
}

#[allow(clippy::too_many_arguments)]
fn build_common(
    kind: ProviderKind,
    enabled: Option<bool>,
    labels: Option<Vec<String>>,
    max_concurrent: Option<i64>,
    restart: Option<RawRestart>,
    d: CommonDefaults,
    present: bool,
    p: &mut Problems,
) -> ProviderCommon {
    let key = format!("providers.{kind}");
    // A table that is written down is meant to be used: `enabled` defaults to true there.
    let enabled = enabled.unwrap_or(if present { true } else { d.enabled });
    let labels = labels.unwrap_or_else(|| d.labels.iter().map(|s| s.to_string()).collect());
    if enabled {
        if labels.is_empty() {
            p.push(
                format!("{key}.labels"),
                "an enabled provider needs at least one label",
            );
        }
        for (i, l) in labels.iter().enumerate() {
            if l.trim().is_empty() {
                p.push(format!("{key}.labels[{i}]"), "a label must not be empty");
            }
        }
    }
    let max_concurrent = count(
        &format!("{key}.max_concurrent"),
        max_concurrent,
        d.max_concurrent,
        1,
        p,
    );
    ProviderCommon {
        enabled,
        labels,
        max_concurrent,
        restart: build_restart(&format!("{key}.restart"), restart, p),
    }
}

fn build_restart(key: &str, raw: Option<RawRestart>, p: &mut Problems) -> RestartConfig {
    let d = RestartConfig::default();
    let Some(raw) = raw else { return d };
    let policy = match raw.policy.as_deref() {
        None | Some("permanent") => RestartPolicy::Permanent,
        Some("transient") => RestartPolicy::Transient,
        Some("never") => RestartPolicy::Never,
        Some(other) => {
            p.push(
                format!("{key}.policy"),
                format!("{other:?} must be \"permanent\", \"transient\" or \"never\""),
            );
            d.policy
        }
    };
    let max_restarts = match raw.max_restarts {
        None => d.max_restarts,
        Some(n) if (0..=i64::from(u32::MAX)).contains(&n) => n as u32,
        Some(n) => {
            p.push(
                format!("{key}.max_restarts"),
                format!("must be 0 or more, got {n}"),
            );
            d.max_restarts
        }
    };
    RestartConfig {
        policy,
        max_restarts,
        within: positive_duration(&format!("{key}.within"), raw.within, d.within, p),
        backoff: duration(&format!("{key}.backoff"), raw.backoff, d.backoff, p),
    }
}

fn absolute_or_default(
    key: &str,
    raw: Option<String>,
    default: PathBuf,
    p: &mut Problems,
) -> PathBuf {
    match raw.filter(|s| !s.is_empty()) {
        None => default,
        Some(s) => {
            let path = PathBuf::from(s);
            if !path.is_absolute() {
                p.push(key, format!("{} must be an absolute path", path.display()));
            }
            path
        }
    }
}

fn build_providers(
    raw: super::raw::RawProviders,
    state_dir: &Path,
    p: &mut Problems,
) -> ProvidersConfig {
    let local_present = raw.local.is_some();
    let l = raw.local.unwrap_or_default();
    let local_common = build_common(
        ProviderKind::Local,
        l.enabled,
        l.labels,
        l.max_concurrent,
        l.restart,
        CommonDefaults {
            enabled: false,
            labels: &["self-hosted", "linux", "x64"],
            max_concurrent: 2,
        },
        local_present,
        p,
    );
    let local = LocalConfig {
        command: PathBuf::from(if local_common.enabled {
            non_empty("providers.local.command", l.command, "", p)
        } else {
            l.command.unwrap_or_default()
        }),
        args: l.args.unwrap_or_default(),
        work_root: absolute_or_default(
            "providers.local.work_root",
            l.work_root,
            state_dir.join("work"),
            p,
        ),
        common: local_common,
    };

    let linux_present = raw.linux.is_some();
    let x = raw.linux.unwrap_or_default();
    let linux_common = build_common(
        ProviderKind::Linux,
        x.enabled,
        x.labels,
        x.max_concurrent,
        x.restart,
        CommonDefaults {
            enabled: false,
            labels: &["self-hosted", "linux", "x64"],
            max_concurrent: 4,
        },
        linux_present,
        p,
    );
    let socket = x.socket.unwrap_or_else(|| defaults::LINUX_SOCKET.into());
    if linux_common.enabled && !valid_socket(&socket) {
        p.push(
            "providers.linux.socket",
            format!("{socket:?} must be unix:///path/to.sock, tcp://host:port or http://host:port"),
        );
    }
    let linux = LinuxConfig {
        socket,
        image: if linux_common.enabled {
            non_empty("providers.linux.image", x.image, defaults::LINUX_IMAGE, p)
        } else {
            x.image.unwrap_or_else(|| defaults::LINUX_IMAGE.into())
        },
        command: x
            .command
            .unwrap_or_else(|| vec![defaults::LINUX_COMMAND.to_string()]),
        network: x.network.filter(|n| !n.is_empty()),
        common: linux_common,
    };

    let vm_present = raw.vm_macos.is_some();
    let v = raw.vm_macos.unwrap_or_default();
    let vm_common = build_common(
        ProviderKind::VmMacos,
        v.enabled,
        v.labels,
        v.max_concurrent,
        v.restart,
        CommonDefaults {
            enabled: false,
            labels: &["self-hosted", "macos", "arm64"],
            max_concurrent: defaults::MACOS_MAX_VMS,
        },
        vm_present,
        p,
    );
    if vm_common.enabled && vm_common.max_concurrent > defaults::MACOS_MAX_VMS {
        p.push(
            "providers.vm_macos.max_concurrent",
            format!(
                "{} exceeds {}: Apple's licence and Virtualization.framework allow two macOS guests per host",
                vm_common.max_concurrent,
                defaults::MACOS_MAX_VMS
            ),
        );
    }
    let vm_macos = VmMacosConfig {
        base_image: non_empty(
            "providers.vm_macos.base_image",
            v.base_image,
            defaults::MACOS_BASE_IMAGE,
            p,
        ),
        ssh_user: non_empty("providers.vm_macos.ssh_user", v.ssh_user, "admin", p),
        runner_command: non_empty(
            "providers.vm_macos.runner_command",
            v.runner_command,
            "~/actions-runner/run.sh",
            p,
        ),
        tart_path: PathBuf::from(v.tart_path.unwrap_or_else(|| "tart".into())),
        ssh_path: PathBuf::from(v.ssh_path.unwrap_or_else(|| "ssh".into())),
        boot_timeout: positive_duration(
            "providers.vm_macos.boot_timeout",
            v.boot_timeout,
            defaults::MACOS_BOOT_TIMEOUT,
            p,
        ),
        common: vm_common,
    };

    let native_present = raw.native_macos.is_some();
    let n = raw.native_macos.unwrap_or_default();
    let native_common = build_common(
        ProviderKind::NativeMacos,
        n.enabled,
        n.labels,
        n.max_concurrent,
        n.restart,
        CommonDefaults {
            enabled: false,
            labels: &["self-hosted", "macos", "arm64", "native"],
            max_concurrent: 1,
        },
        native_present,
        p,
    );
    let native_macos = NativeMacosConfig {
        command: PathBuf::from(if native_common.enabled {
            non_empty("providers.native_macos.command", n.command, "", p)
        } else {
            n.command.unwrap_or_default()
        }),
        args: n.args.unwrap_or_default(),
        work_root: absolute_or_default(
            "providers.native_macos.work_root",
            n.work_root,
            state_dir.join("native-work"),
            p,
        ),
        run_as: n.run_as.filter(|u| !u.is_empty()),
        common: native_common,
    };

    let providers = ProvidersConfig {
        local,
        linux,
        vm_macos,
        native_macos,
    };
    if providers.enabled().is_empty() {
        p.push(
            "providers",
            "no provider is enabled: enable at least one of providers.local, providers.linux, \
             providers.vm_macos, providers.native_macos",
        );
    }
    providers
}

fn valid_socket(s: &str) -> bool {
    if let Some(path) = s.strip_prefix("unix://") {
        return path.starts_with('/');
    }
    ["tcp://", "http://"]
        .iter()
        .filter_map(|scheme| s.strip_prefix(scheme))
        .any(|rest| !rest.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env() -> Environment {
        Environment::default()
    }

    const MINIMAL: &str = r#"
        [github]
        owner = "acme"
        token = "ghp_filetoken"
        [webhook]
        secret = "hooksecret"
        [providers.local]
        command = "/opt/actions-runner/run.sh"
    "#;

    fn problems(text: &str) -> Vec<ConfigError> {
        match Config::from_toml_str(text, None, &env()) {
            Ok(_) => Vec::new(),
            Err(e) => e.0,
        }
    }

    fn keys(text: &str) -> Vec<String> {
        problems(text).into_iter().map(|e| e.key).collect()
    }

    #[test]
    fn minimal_config_gets_the_contract_defaults() {
        let c = Config::from_toml_str(MINIMAL, None, &env()).unwrap();
        assert_eq!(c.github.api_url, "https://api.github.com");
        assert_eq!(c.github.max_claims_per_minute, 150);
        assert_eq!(c.webhook.listen.to_string(), "0.0.0.0:8080");
        assert_eq!(c.webhook.path, "/webhook/github");
        assert_eq!(
            c.webhook.reconcile_interval,
            Some(Duration::from_secs(1800))
        );
        assert_eq!(c.runner.max_concurrent, 4);
        assert_eq!(c.runner.job_timeout, Some(Duration::from_secs(7200)));
        assert_eq!(c.runner.claim_retry, ClaimRetryConfig::default());
        assert_eq!(c.runner.claim_retry.schedule.len(), 5);
        assert_eq!(c.admin.listen.to_string(), "127.0.0.1:9091");
        assert_eq!(c.metrics.listen, None);
        assert!(c.providers.local.common.enabled);
        assert!(!c.providers.linux.common.enabled);
        assert_eq!(
            c.providers.local.work_root,
            PathBuf::from("/var/lib/ephemer-actors/work")
        );
        assert_eq!(c.providers.local.common.restart, RestartConfig::default());
    }

    #[test]
    fn unknown_key_bad_duration_and_missing_owner_are_reported_together() {
        let text = r#"
            [github]
            token = "t"
            colour = "blue"
            [webhook]
            secret = "s"
            reconcile_interval = "soon"
            [providers.local]
            command = "/bin/true"
            [providers.local.restart]
            policy = "never"
            extra = 1
        "#;
        let keys = keys(text);
        assert!(keys.contains(&"github.colour".to_string()), "{keys:?}");
        assert!(
            keys.contains(&"providers.local.restart.extra".to_string()),
            "{keys:?}"
        );
        assert!(
            keys.contains(&"webhook.reconcile_interval".to_string()),
            "{keys:?}"
        );
        assert!(keys.contains(&"github.owner".to_string()), "{keys:?}");
    }

    #[test]
    fn ladder_jitter_and_reset_window_are_checked() {
        let text = format!(
            "{MINIMAL}\n[runner.claim_retry]\nschedule = [\"1m\", \"30s\", \"0s\", \"x\"]\njitter = 1.5\nrate_reset_jitter = [\"25s\", \"5s\"]\n"
        );
        let keys = keys(&text);
        for k in [
            "runner.claim_retry.schedule[1]",
            "runner.claim_retry.schedule[2]",
            "runner.claim_retry.schedule[3]",
            "runner.claim_retry.jitter",
            "runner.claim_retry.rate_reset_jitter",
        ] {
            assert!(keys.contains(&k.to_string()), "missing {k} in {keys:?}");
        }
        let empty = format!("{MINIMAL}\n[runner.claim_retry]\nschedule = []\n");
        assert_eq!(keys_of(&empty), vec!["runner.claim_retry.schedule"]);
    }

    fn keys_of(text: &str) -> Vec<String> {
        keys(text)
    }

    #[test]
    fn equal_rungs_and_zero_jitter_are_fine() {
        let text = format!(
            "{MINIMAL}\n[runner.claim_retry]\nschedule = [\"1s\", \"1s\", \"2s\"]\njitter = 0.0\n"
        );
        let c = Config::from_toml_str(&text, None, &env()).unwrap();
        assert_eq!(c.runner.claim_retry.jitter, 0.0);
        assert_eq!(c.runner.claim_retry.schedule[2], Duration::from_secs(2));
    }

    #[test]
    fn addresses_providers_and_state_dir_are_checked() {
        let text = r#"
            [github]
            owner = "acme"
            token = "t"
            [webhook]
            secret = "s"
            listen = "everywhere"
            [metrics]
            listen = "127.0.0.1"
            [state]
            dir = "relative/dir"
            [providers.local]
            enabled = false
            [providers.linux]
            enabled = true
            labels = []
            max_concurrent = 0
            socket = "/run/podman.sock"
            [providers.vm_macos]
            max_concurrent = 3
        "#;
        let keys = keys(text);
        for k in [
            "webhook.listen",
            "metrics.listen",
            "state.dir",
            "providers.linux.labels",
            "providers.linux.max_concurrent",
            "providers.linux.socket",
            "providers.vm_macos.max_concurrent",
        ] {
            assert!(keys.contains(&k.to_string()), "missing {k} in {keys:?}");
        }
        let none = r#"
            [github]
            owner = "acme"
            token = "t"
            [webhook]
            secret = "s"
        "#;
        assert_eq!(keys_of(none), vec!["providers"]);
    }

    #[test]
    fn secrets_may_come_from_the_environment() {
        let text = r#"
            [github]
            owner = "acme"
            [providers.local]
            command = "/bin/true"
        "#;
        assert_eq!(keys(text), vec!["github.token", "webhook.secret"]);
        let env = Environment {
            github_token: Some(Secret::new("from-env")),
            webhook_secret: Some(Secret::new("hook-env")),
            app_private_key: None,
        };
        let c = Config::from_toml_str(text, None, &env).unwrap();
        assert!(matches!(&c.github.auth, GithubAuth::Token(t) if t.expose() == "from-env"));
        assert_eq!(c.webhook.secret.expose(), "hook-env");
    }

    #[test]
    fn half_configured_app_auth_names_each_missing_key() {
        let text = r#"
            [github]
            owner = "acme"
            app_id = 12
            [webhook]
            secret = "s"
            [providers.local]
            command = "/bin/true"
        "#;
        assert_eq!(
            keys(text),
            vec!["github.installation_id", "github.private_key_path"]
        );
        let unreadable = r#"
            [github]
            owner = "acme"
            app_id = 12
            installation_id = 34
            private_key_path = "/nonexistent/app.pem"
            [webhook]
            secret = "s"
            [providers.local]
            command = "/bin/true"
        "#;
        assert_eq!(keys(unreadable), vec!["github.private_key_path"]);
    }

    #[test]
    fn no_problem_message_quotes_a_secret() {
        let dir = tempfile::tempdir().unwrap();
        let pem = dir.path().join("bad.pem");
        std::fs::write(
            &pem,
            "-----BEGIN RSA PRIVATE KEY-----\nTOPSECRETKEYDATA\n-----END RSA PRIVATE KEY-----\n",
        )
        .unwrap();
        let text = format!(
            r#"
            [github]
            owner = "acme"
            token = "ghp_TOPSECRETTOKEN"
            app_id = 1
            installation_id = 2
            private_key_path = "{}"
            [webhook]
            secret = "TOPSECRETHOOK"
            reconcile_interval = "nope"
            [providers.local]
            command = "/bin/true"
            "#,
            pem.display()
        );
        let err = Config::from_toml_str(&text, None, &env()).unwrap_err();
        assert!(!err.0.is_empty());
        let shown = format!("{err}\n{err:?}");
        assert!(!shown.contains("TOPSECRET"), "{shown}");
    }

    #[test]
    fn debug_of_a_whole_config_shows_no_secret() {
        let env = Environment {
            github_token: None,
            webhook_secret: None,
            app_private_key: None,
        };
        let text = MINIMAL
            .replace("ghp_filetoken", "ghp_TOPSECRETTOKEN")
            .replace("hooksecret", "TOPSECRETHOOK");
        let c = Config::from_toml_str(&text, None, &env).unwrap();
        let shown = format!("{c:?} {c:#?}");
        assert!(shown.contains("Secret(***)"));
        assert!(!shown.contains("TOPSECRET"), "{shown}");
    }

    #[test]
    fn a_type_error_names_its_key() {
        let text = format!("{MINIMAL}\n[runner]\nmax_concurrent = \"four\"\n");
        assert_eq!(keys(&text), vec!["runner.max_concurrent"]);
        let broken = "[github\nowner = 1";
        assert_eq!(keys(broken), vec!["<file>"]);
    }

    #[test]
    fn durations_accept_the_contract_spellings() {
        for (s, secs) in [
            ("30s", 30),
            ("1m", 60),
            ("90m", 5400),
            ("2h", 7200),
            ("0s", 0),
        ] {
            assert_eq!(parse_duration(s).unwrap(), Duration::from_secs(secs));
        }
        assert!(parse_duration("10").is_err());
        assert!(parse_duration("-1s").is_err());
    }
}
