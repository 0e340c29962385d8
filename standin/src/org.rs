//! What `doctor` reads of GitHub: the owner and its repos, runner groups, webhooks and their
//! recent deliveries, and a classic token's scopes (`X-OAuth-Scopes` on every answer, and a
//! 403 naming `X-Accepted-OAuth-Scopes` where the token lacks one, as GitHub answers).

use actix_web::HttpResponse;
use serde_json::{Value, json};

use crate::routes::error;
use crate::state::State;

/// A repository or organization webhook, as `GET .../hooks` shows it.
#[derive(Debug, Clone)]
pub struct Hook {
    /// Its id.
    pub id: u64,
    /// `config.url`: where it delivers.
    pub url: String,
    /// `config.content_type`: `json` or `form`.
    pub content_type: String,
    /// Events it sends (`workflow_job`, or `*`).
    pub events: Vec<String>,
    /// Whether it is active.
    pub active: bool,
    /// Whether a secret is set (GitHub shows `********`).
    pub secret: bool,
    /// `(status_code, status)` of its recent deliveries, newest first.
    pub deliveries: Vec<(u16, String)>,
    /// Its repo, for a repository hook; `None` for the org's.
    pub repo: Option<String>,
}

/// The endpoint names this file answers.
pub(crate) fn endpoint(method: &str, segs: &[&str]) -> Option<&'static str> {
    Some(match (method, segs) {
        ("GET", ["orgs", _]) => "get_org",
        ("GET", ["repos", _, _]) => "get_repo",
        ("GET", ["orgs", _, "actions", "runner-groups", _]) => "get_runner_group",
        ("GET", ["orgs", _, "actions", "runner-groups"]) => "list_runner_groups",
        ("GET", ["orgs", _, "hooks"]) | ("GET", ["repos", _, _, "hooks"]) => "list_hooks",
        ("GET", ["orgs", _, "hooks", _, "deliveries"])
        | ("GET", ["repos", _, _, "hooks", _, "deliveries"]) => "list_hook_deliveries",
        ("POST", ["orgs", _, "hooks", _, "deliveries", _, "attempts"])
        | ("POST", ["repos", _, _, "hooks", _, "deliveries", _, "attempts"]) => {
            "redeliver_hook_delivery"
        }
        _ => return None,
    })
}

/// The classic-token scope an endpoint needs (docs.github.com REST: self-hosted runners need
/// `admin:org` at the org, `repo` at a repo; org webhooks `admin:org_hook`, repo webhooks
/// `admin:repo_hook`), `None` when any token will do.
pub(crate) fn scope_needed(endpoint: &str, repo_level: bool) -> Option<&'static str> {
    let runners = matches!(
        endpoint,
        "generate_jitconfig"
            | "list_runners"
            | "get_runner"
            | "delete_runner"
            | "get_runner_group"
            | "list_runner_groups"
    );
    let hooks = matches!(
        endpoint,
        "list_hooks" | "list_hook_deliveries" | "redeliver_hook_delivery"
    );
    match (runners, hooks, repo_level) {
        (true, _, false) => Some("admin:org"),
        (true, _, true) => Some("repo"),
        (_, true, false) => Some("admin:org_hook"),
        (_, true, true) => Some("admin:repo_hook"),
        _ => None,
    }
}

/// Answers this file's endpoints (the owner and repo already checked).
pub(crate) fn answer(
    s: &mut State,
    req: &actix_web::HttpRequest,
    endpoint: &str,
    segs: &[&str],
    repo: Option<&str>,
) -> (u16, HttpResponse) {
    match endpoint {
        "get_org" => (
            200,
            HttpResponse::Ok().json(json!({ "login": s.owner, "id": 1, "type": "Organization" })),
        ),
        "get_repo" => {
            let name = repo.unwrap_or_default();
            (
                200,
                HttpResponse::Ok().json(json!({
                    "name": name,
                    "full_name": format!("{}/{name}", s.owner),
                    "archived": s.archived.iter().any(|a| a == name),
                })),
            )
        }
        "get_runner_group" => {
            let id = segs.last().and_then(|id| id.parse::<u64>().ok());
            match s.runner_groups.iter().find(|(g, _)| Some(*g) == id) {
                Some(g) => (200, HttpResponse::Ok().json(group_json(g))),
                None => error(404, "Not Found"),
            }
        }
        "list_runner_groups" => {
            let groups: Vec<Value> = s.runner_groups.iter().map(group_json).collect();
            (
                200,
                HttpResponse::Ok()
                    .json(json!({ "total_count": groups.len(), "runner_groups": groups })),
            )
        }
        "list_hooks" => {
            let hooks: Vec<Value> = s
                .hooks
                .iter()
                .filter(|h| h.repo.as_deref() == repo)
                .map(hook_json)
                .collect();
            (200, HttpResponse::Ok().json(hooks))
        }
        "list_hook_deliveries" | "redeliver_hook_delivery" => {
            let at = if endpoint == "list_hook_deliveries" {
                1
            } else {
                3
            };
            let id: u64 = segs
                .iter()
                .rev()
                .nth(at)
                .and_then(|x| x.parse().ok())
                .unwrap_or(0);
            let hook = s
                .hooks
                .iter()
                .find(|h| h.id == id && h.repo.as_deref() == repo)
                .cloned();
            // A hook the stand-in delivered to has a real log; one set up by hand (doctor's
            // tests) lists the deliveries it was given.
            match hook {
                Some(h)
                    if endpoint != "list_hook_deliveries"
                        || crate::hook_log::has_log(s, &h.url) =>
                {
                    crate::hook_log::answer(
                        s,
                        req,
                        endpoint,
                        segs,
                        &h.url,
                        crate::state::unix_now(),
                    )
                }
                Some(h) => {
                    let list: Vec<Value> = h
                        .deliveries
                        .iter()
                        .enumerate()
                        .map(|(i, (code, status))| {
                            json!({
                                "id": i + 1,
                                "event": "workflow_job",
                                "action": "queued",
                                "status_code": code,
                                "status": status,
                                "redelivery": false,
                            })
                        })
                        .collect();
                    (200, HttpResponse::Ok().json(list))
                }
                None => error(404, "Not Found"),
            }
        }
        _ => error(404, "Not Found"),
    }
}

fn group_json((id, name): &(u64, String)) -> Value {
    json!({ "id": id, "name": name, "visibility": "all", "default": *id == 1 })
}

fn hook_json(h: &Hook) -> Value {
    let mut config = json!({
        "url": h.url,
        "content_type": h.content_type,
        "insecure_ssl": "0",
    });
    if h.secret {
        config["secret"] = json!("********");
    }
    json!({
        "id": h.id,
        "type": if h.repo.is_some() { "Repository" } else { "Organization" },
        "name": "web",
        "active": h.active,
        "events": h.events,
        "config": config,
    })
}
