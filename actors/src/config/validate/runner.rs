//! `[runner]` (with its claim retry ladder and orphan sweep), `[state]` and `[log]`.

use std::path::PathBuf;

use super::{
    ClaimRetryConfig, LogConfig, LogFormat, OrphanSweepConfig, Problems, RunnerConfig,
    RunnerUpdateConfig, StateConfig, count, defaults, duration, optional_duration, parse_duration,
    positive_duration,
};

pub(super) fn build_runner(
    raw: crate::config::raw::RawRunner,
    allow_insecure: bool,
    p: &mut Problems,
) -> RunnerConfig {
    let update = build_update(&raw, allow_insecure, p);
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
        update,
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

/// `auto_update`, `runner_version`, `releases_url`, `release_check_interval`, `min_version`.
fn build_update(
    raw: &crate::config::raw::RawRunner,
    allow_insecure: bool,
    p: &mut Problems,
) -> RunnerUpdateConfig {
    let version = |key: &str, v: &Option<String>, p: &mut Problems| -> Option<String> {
        let v = v.as_deref().map(str::trim).filter(|v| !v.is_empty())?;
        let v = v.strip_prefix('v').unwrap_or(v);
        let ok = v.split('.').count() == 3
            && v.split('.')
                .all(|n| !n.is_empty() && n.chars().all(|c| c.is_ascii_digit()));
        if !ok {
            p.push(key, format!("{v:?} must be a version such as \"2.330.0\""));
        }
        Some(v.to_string())
    };
    let pinned = match raw.runner_version.as_deref().map(str::trim) {
        None | Some("") | Some("latest") => None,
        Some(_) => version("runner.runner_version", &raw.runner_version, p),
    };
    if let Some(why) = pinned
        .as_deref()
        .and_then(ephemer_decide::release::Version::parse)
        .and_then(|v| ephemer_decide::release::refused_by_github(&v))
    {
        p.push(
            "runner.runner_version",
            format!("{why}: pin 2.329.0 or later, or \"latest\""),
        );
    }
    let releases_url = raw
        .releases_url
        .clone()
        .unwrap_or_else(|| defaults::RELEASES_URL.into())
        .trim_end_matches('/')
        .to_string();
    if !releases_url.starts_with("https://") && !releases_url.starts_with("http://") {
        p.push(
            "runner.releases_url",
            format!("{releases_url:?} must be an http(s) URL"),
        );
    } else if let Some(rest) = releases_url.strip_prefix("http://")
        && !allow_insecure
        && !super::loopback(rest)
    {
        // The release's checksum comes in the same answer as its archive: whoever is on a
        // plain-http path plants the runner every job runs (issue 52, item 6).
        p.push(
            "runner.releases_url",
            format!(
                "{releases_url:?} is plain http to another host: whoever is on the path could \
                 plant the runner every job runs (the checksum comes in the same answer); use \
                 https://, or github.allow_insecure = true to accept that"
            ),
        );
    }
    RunnerUpdateConfig {
        auto_update: raw.auto_update.unwrap_or(true),
        version: pinned,
        releases_url,
        check_interval: optional_duration(
            "runner.release_check_interval",
            raw.release_check_interval.clone(),
            defaults::RELEASE_CHECK_INTERVAL,
            p,
        ),
        min_version: version("runner.min_version", &raw.min_version, p),
    }
}

fn build_claim_retry(raw: crate::config::raw::RawClaimRetry, p: &mut Problems) -> ClaimRetryConfig {
    let defaults = ClaimRetryConfig::default();
    const KEY: &str = "runner.claim_retry";
    let schedule = retry_schedule(KEY, raw.schedule, &defaults.schedule, p);
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

/// The ladder's rungs: at least one, each above zero, none shorter than the one before.
fn retry_schedule(
    key: &str,
    raw: Option<Vec<String>>,
    defaults: &[std::time::Duration],
    p: &mut Problems,
) -> Vec<std::time::Duration> {
    match raw {
        None => defaults.to_vec(),
        Some(rungs) if rungs.is_empty() => {
            p.push(format!("{key}.schedule"), "must list at least one delay");
            defaults.to_vec()
        }
        Some(rungs) => {
            let mut out = Vec::with_capacity(rungs.len());
            for (i, rung) in rungs.iter().enumerate() {
                let key = format!("{key}.schedule[{i}]");
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
    }
}

pub(super) fn build_state(raw: crate::config::raw::RawState, p: &mut Problems) -> StateConfig {
    let dir = PathBuf::from(raw.dir.unwrap_or_else(|| defaults::STATE_DIR.into()));
    if !dir.is_absolute() {
        p.push(
            "state.dir",
            format!("{} must be an absolute path", dir.display()),
        );
    }
    let retention = duration("state.retention", raw.retention, defaults::RETENTION, p);
    if retention < defaults::MIN_RETENTION {
        p.push(
            "state.retention",
            format!(
                "{} is shorter than the least, {}: copies of one delivery must still be recognised",
                humantime::format_duration(retention),
                humantime::format_duration(defaults::MIN_RETENTION)
            ),
        );
    }
    let usage_retention = duration(
        "state.usage_retention",
        raw.usage_retention,
        defaults::USAGE_RETENTION,
        p,
    );
    if usage_retention < defaults::MIN_USAGE_RETENTION {
        p.push(
            "state.usage_retention",
            format!(
                "{} is shorter than the least, {}",
                humantime::format_duration(usage_retention),
                humantime::format_duration(defaults::MIN_USAGE_RETENTION)
            ),
        );
    }
    StateConfig {
        dir,
        retention,
        usage_retention,
    }
}

pub(super) fn build_log(raw: crate::config::raw::RawLog, p: &mut Problems) -> LogConfig {
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
