//! `doctor`'s checks of the webhook GitHub posts to, of each pool's host, and of this host:
//! the state directory and the listeners' ports.

use ephemer_actors_core::{
    config::Config,
    github::GithubClient,
    provision::{
        Finding,
        build::{backend, pool_settings},
    },
};

use super::{Check, github::message};

/// Deliveries looked at per hook.
const RECENT_DELIVERIES: usize = 30;
/// Free space in `state.dir` under which doctor warns.
const LOW_DISK: u64 = 1024 * 1024 * 1024;

/// The hooks that send `workflow_job` (to the org, or each repo), and how they are set up.
pub async fn webhook_checks(client: &GithubClient, config: &Config) -> Vec<Check> {
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
                "401: the secrets differ; 413: raise webhook.max_body; 0 or 5xx: the daemon was unreachable (the reconcile catches those jobs)",
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

/// Each enabled pool's own host check, and what `doctor` adds for its kind.
pub async fn pool_checks(config: &Config) -> Vec<Check> {
    let install_id = std::fs::read_to_string(config.state.dir.join("install-id"))
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "doctor".into());
    let mut out = Vec::new();
    for pool in config.providers.enabled() {
        let name = format!("pool.{}", pool.name);
        let settings = pool_settings(config, pool, &install_id, None, std::env::temp_dir());
        let backend = match backend(settings) {
            Ok(b) => b,
            Err(e) => {
                out.push(Check::fail(&name, e, "fix the pool's settings"));
                continue;
            }
        };
        match backend.probe().await {
            Ok(()) => out.push(Check::ok(
                &name,
                format!("{} host check passes", pool.kind()),
            )),
            Err(e) => out.push(Check::fail(
                &name,
                e.to_string(),
                "see the cause; docs/providers.md lists what each pool needs",
            )),
        }
        for finding in backend.doctor_checks().await {
            out.push(match finding {
                Finding::Ok(d) => Check::ok(&name, d),
                Finding::Warn(d) => Check::warn(&name, d, "see docs/providers.md"),
                Finding::Fail(d) => Check::fail(&name, d, "see the message"),
            });
        }
    }
    out
}

/// The state directory (writable, with room) and the listeners' ports.
pub fn host_checks(config: &Config) -> Vec<Check> {
    let mut out = listener_checks(config);
    let dir = &config.state.dir;
    let probe = dir.join(".doctor-probe");
    if !dir.exists() {
        let parent = dir.parent().filter(|p| p.exists());
        out.push(match parent {
            Some(p) => Check::warn(
                "state.dir",
                format!("{} does not exist yet", dir.display()),
                format!(
                    "serve creates it (in {}); the unit's StateDirectory does too",
                    p.display()
                ),
            ),
            None => Check::fail(
                "state.dir",
                format!("neither {} nor its parent exists", dir.display()),
                "create it, owned by the daemon's user",
            ),
        });
        return out;
    }
    let writable = std::fs::write(&probe, b"probe").and_then(|()| std::fs::remove_file(&probe));
    match writable {
        Err(e) => out.push(Check::fail(
            "state.dir",
            format!("{} is not writable: {e}", dir.display()),
            "create it, owned by the daemon's user (the unit's StateDirectory does)",
        )),
        Ok(()) => match nix::sys::statvfs::statvfs(dir) {
            Ok(s) => {
                // u64 on Linux, narrower elsewhere.
                #[allow(clippy::unnecessary_cast)]
                let free = s.blocks_available() as u64 * s.fragment_size() as u64;
                let gib = free as f64 / (1024.0 * 1024.0 * 1024.0);
                if free < LOW_DISK {
                    out.push(Check::warn(
                        "state.dir",
                        format!("{}: only {gib:.2} GiB free", dir.display()),
                        "logs, work copies and the store live here: free some space",
                    ));
                } else {
                    out.push(Check::ok(
                        "state.dir",
                        format!("{}: writable, {gib:.1} GiB free", dir.display()),
                    ));
                }
            }
            Err(e) => out.push(Check::warn(
                "state.dir",
                format!("cannot read free space: {e}"),
                "none needed",
            )),
        },
    }
    out
}

/// Whether the listeners' ports are free (in use is fine while the daemon runs).
fn listener_checks(config: &Config) -> Vec<Check> {
    let mut out = Vec::new();
    let mut listeners = vec![("webhook.listen", config.webhook.listen)];
    listeners.extend(config.metrics.listen.map(|a| ("metrics.listen", a)));
    listeners.extend(config.admin.listen.tcp().map(|a| ("admin.listen", a)));
    for (key, addr) in listeners {
        match std::net::TcpListener::bind(addr) {
            Ok(_) => out.push(Check::ok(key, format!("{addr} is free"))),
            Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => out.push(Check::warn(
                key,
                format!("{addr} is in use"),
                "fine if the daemon is running; otherwise another program holds the port",
            )),
            Err(e) => out.push(Check::fail(
                key,
                format!("cannot bind {addr}: {e}"),
                "choose another address",
            )),
        }
    }
    out
}
