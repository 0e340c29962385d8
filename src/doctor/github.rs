//! What `doctor` asks GitHub: does the credential work, may it manage runners, do the owner,
//! repos and runner group exist, is GitHub's clock ours, and does a webhook send this daemon
//! `workflow_job` events the way it accepts them.

use ephemer_actors_core::{
    config::{Config, GithubAuth},
    github::{GithubClient, client::Inspection},
    metrics::Metrics,
};

use super::Check;

/// Skew beyond which an App's JWTs are refused (GitHub allows 60 s of clock drift).
const SKEW_FAIL_SECS: u64 = 60;
/// Skew worth a warning with any credential (TLS and rate resets are read against it).
const SKEW_WARN_SECS: u64 = 10;

pub async fn checks(config: &Config) -> Vec<Check> {
    let client = GithubClient::new(&config.github, Metrics::new(), None);
    let owner = &config.github.owner;
    let repo_level = !config.github.repos.is_empty();
    let mut out = Vec::new();

    // The credential, and the owner it acts for.
    let first = match client.inspect(&format!("/orgs/{owner}")).await {
        Ok(i) if i.status == 404 => client.inspect(&format!("/users/{owner}")).await,
        other => other,
    };
    let first = match first {
        Ok(i) => i,
        Err(e) => {
            out.push(Check::fail(
                "github.credential",
                format!("no answer from {}: {e}", config.github.api_url),
                "check github.api_url, the network path (github.proxy, github.ca_file) and, with App auth, the App id, installation id and key",
            ));
            return out;
        }
    };
    match first.status {
        200 => out.push(Check::ok("github.credential", "accepted")),
        401 => {
            out.push(Check::fail(
                "github.credential",
                "GitHub refused the credential (401): wrong, expired or revoked",
                "set github.token (or GITHUB_TOKEN) to a valid token, or fix the App credentials",
            ));
            return out;
        }
        404 => out.push(Check::fail(
            "github.owner",
            format!("{owner} is not an org or user this credential can see (404)"),
            "check github.owner",
        )),
        code => out.push(Check::fail(
            "github.credential",
            format!("GET /orgs/{owner} answered {code}: {}", message(&first)),
            "see GitHub's status page and the message",
        )),
    }
    out.push(clock(&first, &config.github.auth));
    if let Some(scopes) = &first.scopes {
        out.push(scope_check(
            scopes,
            repo_level,
            config.github.enterprise.is_some(),
        ));
    }

    // The repos, and the right to manage their (or the org's) runners.
    for repo in &config.github.repos {
        match client.inspect(&format!("/repos/{owner}/{repo}")).await {
            Ok(i) if i.status == 200 && i.body["archived"] == true => out.push(Check::warn(
                format!("github.repos.{repo}"),
                "archived: its jobs never run",
                "remove it from github.repos",
            )),
            Ok(i) if i.status == 200 => {
                out.push(Check::ok(format!("github.repos.{repo}"), "exists"))
            }
            Ok(i) => out.push(Check::fail(
                format!("github.repos.{repo}"),
                format!("GET /repos/{owner}/{repo} answered {}", i.status),
                "check the name in github.repos, and that the credential can see the repo",
            )),
            Err(e) => out.push(Check::fail(
                format!("github.repos.{repo}"),
                e.to_string(),
                "retry",
            )),
        }
    }
    // Where runners register: a repo, the org, or the enterprise.
    let level = client.runners_level(config.github.repos.first().map(String::as_str));
    let runners_path = format!("{level}/actions/runners?per_page=1");
    match client.inspect(&runners_path).await {
        Ok(i) if i.status == 200 => out.push(Check::ok(
            "github.permission",
            "may list and register self-hosted runners",
        )),
        Ok(i) => out.push(Check::fail(
            "github.permission",
            format!("listing runners answered {}: {}", i.status, message(&i)),
            if repo_level {
                "a classic token needs the repo scope; a fine-grained token or an App needs \"Administration: read and write\" on the repos"
            } else if config.github.enterprise.is_some() {
                "enterprise runners need a classic token with the manage_runners:enterprise scope"
            } else {
                "a classic token needs the admin:org scope; a fine-grained token or an App needs \"Self-hosted runners: read and write\" on the org"
            },
        )),
        Err(e) => out.push(Check::fail("github.permission", e.to_string(), "retry")),
    }
    if let Some(name) = &config.github.runner_group {
        match client.runner_group_id().await {
            Ok(id) => out.push(Check::ok(
                "github.runner_group",
                format!("group {name:?} is id {id}"),
            )),
            Err(e) => out.push(Check::fail(
                "github.runner_group",
                e.to_string(),
                "create the group (org settings > Actions > Runner groups) or fix github.runner_group",
            )),
        }
    } else if !repo_level {
        let id = config.github.runner_group_id;
        match client
            .inspect(&format!("{level}/actions/runner-groups/{id}"))
            .await
        {
            Ok(i) if i.status == 200 && i.body["visibility"] == "selected" => out.push(Check::warn(
                "github.runner_group",
                format!("group {id} ({}) is limited to selected repositories", i.body["name"]),
                "jobs of other repos cannot use its runners: add them to the group, or use another group",
            )),
            Ok(i) if i.status == 200 => out.push(Check::ok(
                "github.runner_group",
                format!("group {id} ({}) exists", i.body["name"].as_str().unwrap_or("?")),
            )),
            Ok(i) => out.push(Check::fail(
                "github.runner_group",
                format!("runner group {id} answered {}", i.status),
                "set github.runner_group_id to an existing group (1 is Default)",
            )),
            Err(e) => out.push(Check::fail("github.runner_group", e.to_string(), "retry")),
        }
    }
    out.extend(super::webhook::webhook_checks(&client, config).await);
    out
}

/// GitHub's `message`, or the status.
pub fn message(i: &Inspection) -> String {
    i.body["message"]
        .as_str()
        .map_or_else(|| format!("status {}", i.status), str::to_string)
}

/// A classic token's scopes against what runner registration needs.
fn scope_check(scopes: &str, repo_level: bool, enterprise: bool) -> Check {
    let have: Vec<&str> = scopes.split(',').map(str::trim).collect();
    let needed: &[&str] = if repo_level {
        &["repo"]
    } else if enterprise {
        &["manage_runners:enterprise"]
    } else {
        &["admin:org", "manage_runners:org"]
    };
    if needed.iter().any(|n| have.contains(n)) {
        Check::ok("github.scopes", format!("classic token scopes: {scopes}"))
    } else {
        Check::fail(
            "github.scopes",
            format!(
                "the classic token has scopes [{scopes}], none of {}",
                needed.join(" or ")
            ),
            format!("create a token with {} (or use a GitHub App)", needed[0]),
        )
    }
}

/// GitHub's `Date` against this host's clock.
fn clock(first: &Inspection, auth: &GithubAuth) -> Check {
    let Some(theirs) = first
        .date
        .as_deref()
        .and_then(|d| httpdate::parse_http_date(d).ok())
    else {
        return Check::warn("clock", "GitHub's answer had no Date header", "none needed");
    };
    let ours = std::time::SystemTime::now();
    let skew = ours
        .duration_since(theirs)
        .or_else(|_| theirs.duration_since(ours))
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let app = matches!(auth, GithubAuth::App(_));
    if skew > SKEW_FAIL_SECS && app {
        Check::fail(
            "clock",
            format!("this host's clock is {skew} s off GitHub's: App JWTs will be refused"),
            "run NTP (systemd-timesyncd, chrony)",
        )
    } else if skew > SKEW_WARN_SECS {
        Check::warn(
            "clock",
            format!("this host's clock is {skew} s off GitHub's"),
            "run NTP (systemd-timesyncd, chrony)",
        )
    } else {
        Check::ok("clock", format!("within {skew} s of GitHub's"))
    }
}
