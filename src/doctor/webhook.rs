//! `doctor`'s look at the webhooks GitHub posts to: is there one that sends `workflow_job`,
//! active, signed, in a content type the daemon reads, and did its recent deliveries land.

use ephemer_actors_core::{config::Config, github::GithubClient};

use super::{Check, github::message};

/// Deliveries looked at per hook.
const RECENT_DELIVERIES: usize = 30;

/// The hooks that send `workflow_job` (to the org, or each repo), and how they are set up.
pub async fn webhook_checks(client: &GithubClient, config: &Config) -> Vec<Check> {
    if config.webhook.scaleset() {
        let mut out = vec![Check::ok(
            "webhook",
            "scale-set mode: no hook needed; jobs come from each pool's scale-set message queue",
        )];
        out.extend(super::scaleset::checks(client, config).await);
        return out;
    }
    if config.webhook.pull() {
        return vec![Check::ok(
            "webhook",
            "pull mode: no hook needed; queued jobs are found by conditional polls",
        )];
    }
    let mut out = vec![redeliver_check(client, config).await];
    out.extend(hooks_checks(client, config).await);
    out
}

/// Which hook the redelivery watches (the one named by `hook_id`, or whose URL is
/// `public_url`, or the App's own).
async fn redeliver_check(client: &GithubClient, config: &Config) -> Check {
    let w = &config.webhook;
    if w.redeliver == Some(false) {
        return Check::ok("redeliver", "off (webhook.redeliver = false)");
    }
    let how = "set webhook.public_url to the URL GitHub posts to, or webhook.hook_id";
    match client.find_hooks(w.hook_id, w.public_url.as_deref()).await {
        // Neither key set with a token: off by choice, said plainly, not a warning.
        Ok(hooks) if hooks.is_empty() && w.hook_id.is_none() && w.public_url.is_none() => {
            Check::ok(
                "redeliver",
                format!(
                    "off: no hook to watch, failed deliveries are left to the reconcile poll ({how} to turn it on)"
                ),
            )
        }
        Ok(hooks) if hooks.is_empty() => Check::warn(
            "redeliver",
            format!(
                "no active hook matches (hook_id {:?}, public_url {:?})",
                w.hook_id, w.public_url
            ),
            how,
        ),
        Ok(hooks) => Check::ok(
            "redeliver",
            format!(
                "watching {} for failed deliveries",
                hooks
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        ),
        Err(e) => Check::warn(
            "redeliver",
            format!("cannot read the hooks: {e}"),
            "give the credential hook read access, or set webhook.redeliver = false",
        ),
    }
}

async fn hooks_checks(client: &GithubClient, config: &Config) -> Vec<Check> {
    let owner = &config.github.owner;
    let places: Vec<String> = if config.github.repos.is_empty() {
        vec![format!("/orgs/{owner}")]
    } else {
        config
            .github
            .repos
            .iter()
            .map(|r| format!("/repos/{owner}/{r}"))
            .collect()
    };
    let mut out = Vec::new();
    for place in places {
        let hooks = match client.inspect(&format!("{place}/hooks")).await {
            Ok(i) if i.status == 200 => i.body.as_array().cloned().unwrap_or_default(),
            Ok(i) => {
                out.push(Check::warn(
                    "webhook",
                    format!("cannot read the hooks of {place} ({})", message(&i)),
                    "give the credential hook read access (classic: admin:org_hook / admin:repo_hook; App: \"Webhooks: read\"), or check by hand that a hook sends workflow_job here",
                ));
                continue;
            }
            Err(e) => {
                out.push(Check::warn("webhook", e.to_string(), "retry"));
                continue;
            }
        };
        let ours: Vec<&serde_json::Value> = hooks
            .iter()
            .filter(|h| {
                h["events"]
                    .as_array()
                    .is_some_and(|events| events.iter().any(|e| e == "workflow_job" || e == "*"))
            })
            .collect();
        if ours.is_empty() {
            out.push(Check::fail(
                "webhook",
                format!("no hook of {place} sends workflow_job events"),
                format!(
                    "add a webhook (Settings > Webhooks) to http(s)://THIS-HOST{}, content type application/json, the webhook.secret, event \"Workflow jobs\"",
                    config.webhook.path
                ),
            ));
            continue;
        }
        for hook in ours {
            out.extend(hook_checks(client, &place, hook, config).await);
        }
    }
    out
}

async fn hook_checks(
    client: &GithubClient,
    place: &str,
    hook: &serde_json::Value,
    config: &Config,
) -> Vec<Check> {
    let id = hook["id"].as_u64().unwrap_or(0);
    let name = format!("webhook.{id}");
    let url = hook["config"]["url"].as_str().unwrap_or("?");
    let mut out = Vec::new();
    if hook["active"] != true {
        out.push(Check::fail(
            &name,
            format!("{url} is inactive"),
            "activate it in the hook's settings",
        ));
    }
    if !url.ends_with(&config.webhook.path) {
        out.push(Check::warn(
            &name,
            format!(
                "{url} does not end with webhook.path {}",
                config.webhook.path
            ),
            "point the hook at this daemon's webhook.path",
        ));
    }
    match hook["config"]["content_type"].as_str().unwrap_or("") {
        "json" => {}
        "form" => out.push(Check::warn(
            &name,
            "content type form: accepted, but each delivery is larger (URL-encoded)",
            "set the hook's content type to application/json",
        )),
        other => out.push(Check::fail(
            &name,
            format!(
                "content type {other:?}: the daemon reads application/json (or form) deliveries"
            ),
            "set the hook's content type to application/json",
        )),
    }
    if hook["config"]["secret"].is_null() {
        out.push(Check::fail(
            &name,
            "no secret: its deliveries are unsigned, and the daemon refuses them (401)",
            "set the hook's secret to webhook.secret",
        ));
    }
    let deliveries = client
        .inspect(&format!(
            "{place}/hooks/{id}/deliveries?per_page={RECENT_DELIVERIES}"
        ))
        .await;
    if let Ok(d) = deliveries
        && d.status == 200
    {
        let list = d.body.as_array().cloned().unwrap_or_default();
        let failed: Vec<&serde_json::Value> = list
            .iter()
            .filter(|d| d["status_code"].as_u64().is_none_or(|c| c == 0 || c >= 400))
            .collect();
        if let Some(last) = failed.first() {
            out.push(Check::warn(
                &name,
                format!(
                    "{} of the last {} deliveries failed; the latest: {} {}",
                    failed.len(),
                    list.len(),
                    last["status_code"],
                    last["status"].as_str().unwrap_or("")
                ),
                "401: the secrets differ; 413: raise webhook.max_body; 0 or 5xx: the daemon was unreachable (webhook.redeliver asks GitHub to send them again; the reconcile is the backstop)",
            ));
        }
    }
    if out.is_empty() {
        out.push(Check::ok(
            &name,
            format!("{url}: active, workflow_job, json, signed"),
        ));
    }
    out
}
