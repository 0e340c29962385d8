//! `[webhook]`: the listener and its secret, push or pull mode, and the redelivery of failed
//! deliveries.

use std::time::Duration;

use super::{
    Environment, Problems, Secret, WebhookConfig, defaults, optional_duration, parse_size,
    positive_duration, socket_addr,
};

use crate::config::{
    WebhookMode,
    raw::{RawShare, RawWebhook},
};

/// `targets`: `[[github.targets]]` is used, so each target's `webhook_secret` is checked there
/// and `webhook.secret` is only their default.
pub(super) fn build_webhook(
    raw: RawWebhook,
    targets: bool,
    env: &Environment,
    p: &mut Problems,
) -> WebhookConfig {
    let pull = build_pull(&raw, p);
    let listen = socket_addr(
        "webhook.listen",
        raw.listen.as_deref().unwrap_or(defaults::WEBHOOK_LISTEN),
        p,
    );
    let path = build_path(raw.path, p);
    let mode = build_mode(raw.mode.as_deref(), p);
    let secret = raw
        .secret
        .filter(|s| !s.is_empty())
        .map(Secret::new)
        .or_else(|| env.webhook_secret.clone())
        .unwrap_or_else(|| {
            // Pull and scale-set modes take no delivery, so they need no secret.
            if mode == WebhookMode::Push && !targets {
                p.push(
                    "webhook.secret",
                    "required: the daemon refuses unsigned webhooks (set it or EPHEMER_WEBHOOK_SECRET)",
                );
            }
            Secret::default()
        });
    let max_body = build_max_body(raw.max_body.as_deref(), p);
    let redeliver_interval = positive_duration(
        "webhook.redeliver_interval",
        raw.redeliver_interval,
        defaults::REDELIVER_INTERVAL,
        p,
    );
    if redeliver_interval < Duration::from_secs(10) {
        p.push(
            "webhook.redeliver_interval",
            "must be at least 10s (each pass lists the hook's deliveries)",
        );
    }
    let (hook_id, public_url) = build_hook(raw.hook_id, raw.public_url, p);
    WebhookConfig {
        max_body,
        listen,
        path,
        secret,
        reconcile_interval: optional_duration(
            "webhook.reconcile_interval",
            raw.reconcile_interval,
            defaults::RECONCILE_INTERVAL,
            p,
        ),
        mode,
        poll_interval: pull.0,
        poll_idle_interval: pull.1,
        poll_budget: pull.2,
        redeliver: raw.redeliver,
        redeliver_interval,
        hook_id,
        public_url,
    }
}

/// `webhook.path`: a URL path of its own.
fn build_path(path: Option<String>, p: &mut Problems) -> String {
    let path = path.unwrap_or_else(|| defaults::WEBHOOK_PATH.into());
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
    path
}

/// `webhook.mode`.
fn build_mode(mode: Option<&str>, p: &mut Problems) -> WebhookMode {
    match mode {
        None | Some("push") => WebhookMode::Push,
        Some("pull") => WebhookMode::Pull,
        Some("scaleset") => WebhookMode::ScaleSet,
        Some(other) => {
            p.push(
                "webhook.mode",
                format!("{other:?} must be \"push\" (GitHub posts to webhook.listen), \"pull\" (no inbound port: the daemon polls) or \"scaleset\" (no inbound port: GitHub's runner scale-set message queue)"),
            );
            WebhookMode::Push
        }
    }
}

/// `webhook.max_body`: between 1 KiB and GitHub's 25 MB.
fn build_max_body(text: Option<&str>, p: &mut Problems) -> usize {
    match text {
        None => defaults::WEBHOOK_MAX_BODY,
        Some(text) => {
            match parse_size(text) {
                Some(n) if (1024..=25 * 1024 * 1024).contains(&n) => n,
                Some(_) => {
                    p.push(
                    "webhook.max_body",
                    format!("{text:?} must be between 1KiB and 25MiB (GitHub caps payloads at 25 MB)"),
                );
                    defaults::WEBHOOK_MAX_BODY
                }
                None => {
                    p.push(
                        "webhook.max_body",
                        format!(
                            "{text:?} is not a size: a number of bytes, or with KiB, MiB, KB or MB"
                        ),
                    );
                    defaults::WEBHOOK_MAX_BODY
                }
            }
        }
    }
}

/// `webhook.hook_id` and `webhook.public_url`: which hook delivers to this daemon.
fn build_hook(
    hook_id: Option<i64>,
    public_url: Option<String>,
    p: &mut Problems,
) -> (Option<u64>, Option<String>) {
    let hook_id = match hook_id {
        None | Some(0) => None,
        Some(n) if n < 0 => {
            p.push(
                "webhook.hook_id",
                format!("must be a hook id or 0, got {n}"),
            );
            None
        }
        Some(n) => u64::try_from(n).ok(),
    };
    let public_url = public_url.filter(|u| !u.trim().is_empty());
    if let Some(url) = &public_url
        && !(url.starts_with("https://") || url.starts_with("http://"))
    {
        p.push(
            "webhook.public_url",
            format!("{url:?} must be the http(s) URL GitHub posts to"),
        );
    }
    (hook_id, public_url)
}

/// `poll_interval`, `poll_idle_interval` and `poll_budget`.
fn build_pull(raw: &RawWebhook, p: &mut Problems) -> (Duration, Duration, f64) {
    let active = positive_duration(
        "webhook.poll_interval",
        raw.poll_interval.clone(),
        defaults::POLL_INTERVAL,
        p,
    );
    if active < Duration::from_secs(1) {
        p.push("webhook.poll_interval", "must be at least 1s");
    }
    let idle = positive_duration(
        "webhook.poll_idle_interval",
        raw.poll_idle_interval.clone(),
        defaults::POLL_IDLE_INTERVAL.max(active),
        p,
    );
    if idle < active {
        p.push(
            "webhook.poll_idle_interval",
            format!(
                "must be at least webhook.poll_interval ({})",
                humantime::format_duration(active)
            ),
        );
    }
    let share = match &raw.poll_budget {
        None => Some(defaults::POLL_BUDGET),
        Some(RawShare::Fraction(f)) => Some(*f),
        Some(RawShare::Text(t)) => t
            .trim()
            .strip_suffix('%')
            .and_then(|n| n.trim().parse::<f64>().ok())
            .map(|n| n / 100.0),
    };
    let budget = match share {
        Some(f) if f > 0.0 && f <= 1.0 => f,
        _ => {
            p.push(
                "webhook.poll_budget",
                "must be a share of the core rate limit above 0 and at most 1: a fraction (0.2) or a percentage (\"20%\")",
            );
            defaults::POLL_BUDGET
        }
    };
    (active, idle, budget)
}
