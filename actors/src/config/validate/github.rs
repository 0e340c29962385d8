//! `[github]`: API URL, owner and repos, PAT or App credentials.

use std::path::{Path, PathBuf};

use super::{
    AppAuth, Environment, GithubAuth, GithubConfig, Problems, ProxyConfig, Secret, defaults,
    loopback,
};

/// `[github]` (`k` = `github`), or one `[[github.targets]]` entry (`k` =
/// `github.targets[i]`): problems are keyed under `k`. Only the `[github]` table falls back on
/// `GITHUB_TOKEN` and `EPHEMER_APP_PRIVATE_KEY`; a target names its secrets itself.
pub(super) fn build_github(
    raw: crate::config::raw::RawGithub,
    k: &str,
    base_dir: Option<&Path>,
    env: &Environment,
    p: &mut Problems,
) -> GithubConfig {
    let fallback = k == "github";
    let api_url = build_api_url(k, raw.api_url, raw.allow_insecure.unwrap_or(false), p);
    let owner = match raw.owner {
        Some(o) if !o.trim().is_empty() => o,
        _ => {
            p.push(
                format!("{k}.owner"),
                "required: the org or user that owns the repos",
            );
            String::new()
        }
    };
    let repos = raw.repos.unwrap_or_default();
    for (i, r) in repos.iter().enumerate() {
        if r.trim().is_empty() || r.contains('/') {
            p.push(
                format!("{k}.repos[{i}]"),
                format!("{r:?} must be a bare repository name owned by github.owner"),
            );
        }
    }
    let enterprise = build_enterprise(k, raw.enterprise, &repos, p);
    let (runner_group, runner_group_id) =
        build_runner_group(k, raw.runner_group, raw.runner_group_id, &repos, p);
    let max_claims_per_minute = match raw.max_claims_per_minute {
        None => defaults::MAX_CLAIMS_PER_MINUTE,
        Some(n) if (1..=10_000).contains(&n) => n as u32,
        Some(n) => {
            p.push(
                format!("{k}.max_claims_per_minute"),
                format!("must be between 1 and 10000, got {n}"),
            );
            defaults::MAX_CLAIMS_PER_MINUTE
        }
    };
    let auth = build_auth(
        k,
        fallback,
        &raw.token,
        raw.app_id,
        raw.installation_id,
        raw.private_key_path,
        base_dir,
        env,
        p,
    );
    let (ca_file, proxy) = build_network(raw.ca_file, raw.proxy, raw.no_proxy, base_dir, env, p);
    GithubConfig {
        api_url: api_url.trim_end_matches('/').to_string(),
        owner,
        repos,
        auth,
        runner_group_id,
        runner_group,
        enterprise,
        max_claims_per_minute,
        ca_file,
        proxy,
    }
}

/// `api_url`: http(s), and plain http only on loopback unless `allow_insecure`.
fn build_api_url(
    k: &str,
    api_url: Option<String>,
    allow_insecure: bool,
    p: &mut Problems,
) -> String {
    let api_url = api_url.unwrap_or_else(|| defaults::API_URL.into());
    if !(api_url.starts_with("https://") || api_url.starts_with("http://")) {
        p.push(
            format!("{k}.api_url"),
            format!("{api_url:?} must start with https:// (or http://)"),
        );
    }
    if !allow_insecure
        && let Some(rest) = api_url.strip_prefix("http://")
        && !loopback(rest)
    {
        p.push(
            format!("{k}.api_url"),
            format!(
                "{api_url:?} is plain http to another host: every claim's JIT config (a runner's \
                 credential) and the token would cross the network in clear; use https://, or \
                 set github.allow_insecure = true"
            ),
        );
    }
    api_url
}

/// `enterprise`: a slug, for enterprise-level runners (no repos then).
fn build_enterprise(
    k: &str,
    enterprise: Option<String>,
    repos: &[String],
    p: &mut Problems,
) -> Option<String> {
    let enterprise = enterprise.filter(|e| !e.trim().is_empty());
    if let Some(slug) = &enterprise {
        if slug.contains(['/', ' ']) {
            p.push(
                format!("{k}.enterprise"),
                format!(
                    "{slug:?} must be the enterprise's slug (as in github.com/enterprises/SLUG)"
                ),
            );
        }
        if !repos.is_empty() {
            p.push(
                format!("{k}.enterprise"),
                "enterprise runners are not repo-level: leave github.repos empty",
            );
        }
    }
    enterprise
}

/// `runner_group` (a name) or `runner_group_id`, for org-level runners.
fn build_runner_group(
    k: &str,
    runner_group: Option<String>,
    runner_group_id: Option<i64>,
    repos: &[String],
    p: &mut Problems,
) -> (Option<String>, u64) {
    let runner_group = runner_group.filter(|g| !g.trim().is_empty());
    if runner_group.is_some() && runner_group_id.is_some() {
        p.push(
            format!("{k}.runner_group"),
            "set runner_group (a name) or runner_group_id, not both",
        );
    }
    if runner_group.is_some() && !repos.is_empty() {
        p.push(
            format!("{k}.runner_group"),
            "runner groups hold org-level (or enterprise) runners; with github.repos each runner registers in its repo (remove runner_group, or empty repos)",
        );
    }
    let id = match runner_group_id {
        None => defaults::RUNNER_GROUP_ID,
        Some(n) if n >= 1 => n as u64,
        Some(n) => {
            p.push(
                format!("{k}.runner_group_id"),
                format!("must be at least 1, got {n}"),
            );
            defaults::RUNNER_GROUP_ID
        }
    };
    (runner_group, id)
}

/// `github.ca_file`, `github.proxy` and `github.no_proxy`: the host's path to GitHub, which
/// every target shares.
pub(super) fn build_network(
    ca_file: Option<String>,
    proxy: Option<String>,
    no_proxy: Option<Vec<String>>,
    base_dir: Option<&Path>,
    env: &Environment,
    p: &mut Problems,
) -> (Option<PathBuf>, Option<ProxyConfig>) {
    let ca_file = ca_file.filter(|f| !f.is_empty()).map(|f| {
        let path = match base_dir {
            Some(dir) => dir.join(&f),
            None => PathBuf::from(&f),
        };
        if let Err(reason) = super::network::check_ca_file(&path) {
            p.push("github.ca_file", reason.to_string());
        }
        path
    });
    (
        ca_file,
        super::network::build_proxy(proxy, no_proxy, env, p),
    )
}

#[allow(clippy::too_many_arguments)]
fn build_auth(
    k: &str,
    fallback: bool,
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
        .or_else(|| env.github_token.clone().filter(|_| fallback));
    let env_key = env.app_private_key.as_ref().filter(|_| fallback);
    let app_configured = app_id.is_some()
        || installation_id.is_some()
        || private_key_path.is_some()
        || (env_key.is_some() && token.is_none());
    if !app_configured {
        return match token {
            Some(t) => GithubAuth::Token(t),
            None => {
                p.push(
                    format!("{k}.token"),
                    if fallback {
                        "no GitHub credentials: set github.token (or GITHUB_TOKEN), or github.app_id, \
                         github.installation_id and github.private_key_path (or EPHEMER_APP_PRIVATE_KEY)"
                    } else {
                        "no GitHub credentials: set token (a literal or \"${NAME}\"), or app_id, \
                         installation_id and private_key_path"
                    },
                );
                GithubAuth::Token(Secret::default())
            }
        };
    }
    let mut id = |key: String, v: Option<i64>| match v {
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
    let app_id = id(format!("{k}.app_id"), app_id);
    let installation_id = id(format!("{k}.installation_id"), installation_id);
    let private_key = app_private_key(k, private_key_path, env_key, base_dir, p);
    GithubAuth::App(AppAuth {
        app_id,
        installation_id,
        private_key,
    })
}

/// The App's private key: from `private_key_path` (relative to the config's folder), else
/// from `EPHEMER_APP_PRIVATE_KEY` where it may stand in; checked to parse, never quoted.
fn app_private_key(
    k: &str,
    private_key_path: Option<String>,
    env_key: Option<&Secret>,
    base_dir: Option<&Path>,
    p: &mut Problems,
) -> Secret {
    match (private_key_path, env_key) {
        (Some(path), _) => {
            let path = resolve(base_dir, &path);
            match std::fs::read_to_string(&path) {
                Ok(pem) => check_pem(format!("{k}.private_key_path"), Secret::new(pem), p),
                Err(e) => {
                    p.push(
                        format!("{k}.private_key_path"),
                        format!("cannot read private key {}: {e}", path.display()),
                    );
                    Secret::default()
                }
            }
        }
        (None, Some(pem)) => check_pem("EPHEMER_APP_PRIVATE_KEY".into(), pem.clone(), p),
        (None, None) => {
            p.push(
                format!("{k}.private_key_path"),
                "required when GitHub App auth is configured (or set EPHEMER_APP_PRIVATE_KEY)",
            );
            Secret::default()
        }
    }
}

/// Checks that a key parses as an RSA private key (PKCS#1 or PKCS#8 PEM) without quoting it.
fn check_pem(key: String, pem: Secret, p: &mut Problems) -> Secret {
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
