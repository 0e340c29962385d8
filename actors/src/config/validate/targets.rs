//! `[[github.targets]]`: several owners, each with its own credential, scope, webhook secret,
//! pacing and weight; or the one target `[github]` and `webhook.secret` make.

use std::path::{Path, PathBuf};

use super::{
    Config, Environment, GithubConfig, Problems, ProvidersConfig, ProxyConfig, Secret,
    WebhookConfig, build_github, defaults,
};

use crate::config::{
    Target,
    raw::{RawGithub, RawTarget},
};

/// The `[github]` keys that belong to a target: with `[[github.targets]]` each target sets its
/// own, and the table's would be ambiguous.
const PER_TARGET: [&str; 10] = [
    "owner",
    "repos",
    "enterprise",
    "token",
    "app_id",
    "installation_id",
    "private_key_path",
    "runner_group",
    "runner_group_id",
    "max_claims_per_minute",
];

/// The targets, and the `GithubConfig` of the first (host-wide keys such as `ca_file` and
/// `proxy` are `[github]`'s and shared by every target).
pub(super) fn build_targets(
    mut raw: RawGithub,
    webhook: &WebhookConfig,
    base_dir: Option<&Path>,
    env: &Environment,
    p: &mut Problems,
) -> (GithubConfig, Vec<Target>) {
    let Some(list) = raw.targets.take() else {
        let github = build_github(raw, "github", base_dir, env, p);
        let target = Target {
            name: github.owner.clone(),
            github: github.clone(),
            webhook_secret: webhook.secret.clone(),
            weight: 1,
        };
        return (github, vec![target]);
    };
    for key in set_per_target_keys(&raw) {
        p.push(
            format!("github.{key}"),
            "set per target when [[github.targets]] is used (each target has its own)",
        );
    }
    if list.is_empty() {
        p.push("github.targets", "needs at least one target");
    }
    if list.len() > defaults::MAX_TARGETS {
        p.push(
            "github.targets",
            format!(
                "at most {} targets, got {}",
                defaults::MAX_TARGETS,
                list.len()
            ),
        );
    }
    let network = super::github::build_network(
        raw.ca_file.take(),
        raw.proxy.take(),
        raw.no_proxy.take(),
        base_dir,
        env,
        p,
    );
    let mut targets: Vec<Target> = Vec::with_capacity(list.len());
    for (i, t) in list.into_iter().enumerate() {
        let k = format!("github.targets[{i}]");
        let target = build_target(t, &k, &raw, &network, webhook, base_dir, env, p);
        let clash = targets.iter().find(|o| {
            o.name == target.name || o.github.owner.eq_ignore_ascii_case(&target.github.owner)
        });
        if let Some(other) = clash {
            let what = if other.name == target.name {
                format!("the name {:?} is already another target's", target.name)
            } else {
                format!(
                    "owner {:?} is already target {:?}'s: a delivery must name exactly one target",
                    target.github.owner, other.name
                )
            };
            p.push(k, what);
        }
        targets.push(target);
    }
    let github = match targets.first() {
        Some(t) => t.github.clone(),
        // No target at all (already a problem): a placeholder, its problems not repeated.
        None => build_github(
            placeholder(&raw),
            "github",
            base_dir,
            env,
            &mut Problems::default(),
        ),
    };
    (github, targets)
}

/// Which per-target keys the `[github]` table itself sets.
fn set_per_target_keys(raw: &RawGithub) -> Vec<&'static str> {
    let set = [
        raw.owner.is_some(),
        raw.repos.is_some(),
        raw.enterprise.is_some(),
        raw.token.is_some(),
        raw.app_id.is_some(),
        raw.installation_id.is_some(),
        raw.private_key_path.is_some(),
        raw.runner_group.is_some(),
        raw.runner_group_id.is_some(),
        raw.max_claims_per_minute.is_some(),
    ];
    PER_TARGET
        .iter()
        .zip(set)
        .filter(|(_, set)| *set)
        .map(|(k, _)| *k)
        .collect()
}

/// A `[github]` with a placeholder owner and credential, for a config without any target.
fn placeholder(raw: &RawGithub) -> RawGithub {
    RawGithub {
        api_url: raw.api_url.clone(),
        owner: Some("-".into()),
        token: Some("-".into()),
        ..RawGithub::default()
    }
}

#[allow(clippy::too_many_arguments)]
fn build_target(
    t: RawTarget,
    k: &str,
    table: &RawGithub,
    network: &(Option<PathBuf>, Option<ProxyConfig>),
    webhook: &WebhookConfig,
    base_dir: Option<&Path>,
    env: &Environment,
    p: &mut Problems,
) -> Target {
    let mut reference = |key: &str, value: Option<String>| {
        value.and_then(|v| match env_reference(&v, env) {
            Ok(v) => Some(v),
            Err(reason) => {
                p.push(format!("{k}.{key}"), reason);
                None
            }
        })
    };
    let token = reference("token", t.token);
    let private_key_path = reference("private_key_path", t.private_key_path);
    let secret = reference("webhook_secret", t.webhook_secret)
        .filter(|s| !s.is_empty())
        .map(Secret::new);
    let raw = RawGithub {
        api_url: t.api_url.or_else(|| table.api_url.clone()),
        owner: t.owner,
        repos: t.repos,
        token,
        app_id: t.app_id,
        installation_id: t.installation_id,
        private_key_path,
        runner_group_id: t.runner_group_id,
        runner_group: t.runner_group,
        enterprise: t.enterprise,
        max_claims_per_minute: t.max_claims_per_minute,
        allow_insecure: table.allow_insecure,
        ..RawGithub::default()
    };
    let mut github = build_github(raw, k, base_dir, env, p);
    (github.ca_file, github.proxy) = network.clone();
    let name = match t.name {
        Some(n) if n.trim().is_empty() || !n.chars().all(name_char) => {
            p.push(
                format!("{k}.name"),
                format!("{n:?} must be letters, digits, '-', '_' or '.' (it is a metric label)"),
            );
            n
        }
        Some(n) => n,
        None => github.owner.clone(),
    };
    let webhook_secret = secret.unwrap_or_else(|| webhook.secret.clone());
    if webhook_secret.is_empty() && webhook.push() {
        p.push(
            format!("{k}.webhook_secret"),
            "required (or webhook.secret as every target's default): the daemon refuses \
             unsigned webhooks",
        );
    }
    let weight = match t.weight {
        None => 1,
        Some(w) if (1..=1000).contains(&w) => w as u32,
        Some(w) => {
            p.push(
                format!("{k}.weight"),
                format!("must be between 1 and 1000, got {w}"),
            );
            1
        }
    };
    Target {
        name,
        github,
        webhook_secret,
        weight,
    }
}

fn name_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')
}

/// The variables a target's secret references (`token = "${ORG_B_TOKEN}"`, its webhook secret,
/// its App key's path): the daemon's own, which no pool's `env` may hand a runner.
pub(super) fn secret_references(github: &RawGithub) -> std::collections::BTreeSet<String> {
    let named = |value: &Option<String>| {
        value
            .as_deref()
            .and_then(|v| v.strip_prefix("${").and_then(|v| v.strip_suffix('}')))
            .map(str::to_string)
    };
    github
        .targets
        .iter()
        .flatten()
        .flat_map(|t| {
            [
                named(&t.token),
                named(&t.webhook_secret),
                named(&t.private_key_path),
            ]
        })
        .flatten()
        .collect()
}

/// A secret written as `"${NAME}"` is the daemon's `NAME`; anything else is the value itself.
fn env_reference(value: &str, env: &Environment) -> Result<String, String> {
    let Some(name) = value.strip_prefix("${").and_then(|v| v.strip_suffix('}')) else {
        return Ok(value.to_string());
    };
    env.vars
        .get(name)
        .map(|v| v.expose().to_string())
        .filter(|v| !v.is_empty())
        .ok_or_else(|| {
            format!("references ${{{name}}}, which the daemon's environment does not set")
        })
}

/// A pool's `targets` must name configured targets.
pub(super) fn check_pool_targets(
    providers: &ProvidersConfig,
    targets: &[Target],
    p: &mut Problems,
) {
    for pool in &providers.pools {
        let Some(names) = &pool.common.targets else {
            continue;
        };
        if names.is_empty() {
            p.push(
                format!("providers.{}.targets", pool.name),
                "an empty list takes no job: leave targets out to serve every target",
            );
        }
        for (i, name) in names.iter().enumerate() {
            if !targets.iter().any(|t| t.name == *name) {
                let known: Vec<&str> = targets.iter().map(|t| t.name.as_str()).collect();
                p.push(
                    format!("providers.{}.targets[{i}]", pool.name),
                    format!("{name:?} is not a target (the targets are {known:?})"),
                );
            }
        }
    }
}

/// What one hook id cannot mean for several targets.
pub(super) fn check_with_webhook(c: &Config, p: &mut Problems) {
    if c.targets.len() > 1 && c.webhook.hook_id.is_some() {
        p.push(
            "webhook.hook_id",
            "names one hook, but there are several targets (each with its own hook): leave it \
             out, and each target's hook is found by webhook.public_url (or an App's own hook)",
        );
    }
}
