//! The stand-in's HTTP layer: one catch-all handler that names the endpoint, plays a scripted
//! fault if there is one, checks credentials, spends the rate budget, and answers like GitHub.

use std::{
    io,
    sync::{Arc, Mutex},
};

use actix_web::{HttpRequest, HttpResponse, http::Method, web};
use base64::{Engine, engine::general_purpose::STANDARD as B64};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::state::{Call, Fault, Job, Runner, State, unix_now};

pub(crate) struct Shared {
    pub state: Arc<Mutex<State>>,
    pub app_public_key: Option<String>,
}

/// The reason phrase GitHub puts in `message` for a bare status.
pub(crate) fn reason(status: u16) -> &'static str {
    match status {
        400 => "Bad Request",
        401 => "Bad credentials",
        403 => "Forbidden",
        404 => "Not Found",
        409 => "Conflict",
        422 => "Validation Failed",
        429 => "Too Many Requests",
        500 => "Internal Server Error",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        504 => "Gateway Timeout",
        _ => "Error",
    }
}

/// Names the endpoint of a request, in the daemon client's vocabulary.
fn endpoint(method: &Method, segs: &[&str]) -> &'static str {
    let m = method.as_str();
    match (m, segs) {
        ("POST", ["orgs", _, "actions", "runners", "generate-jitconfig"])
        | ("POST", ["repos", _, _, "actions", "runners", "generate-jitconfig"]) => {
            "generate_jitconfig"
        }
        ("POST", ["enterprises", _, "actions", "runners", "generate-jitconfig"]) => {
            "generate_jitconfig"
        }
        ("GET", ["orgs", _, "actions", "runners"])
        | ("GET", ["enterprises", _, "actions", "runners"])
        | ("GET", ["repos", _, _, "actions", "runners"]) => "list_runners",
        ("GET", ["orgs", _, "actions", "runners", id])
        | ("GET", ["enterprises", _, "actions", "runners", id])
        | ("GET", ["repos", _, _, "actions", "runners", id])
            if id.parse::<u64>().is_ok() =>
        {
            "get_runner"
        }
        ("DELETE", ["orgs", _, "actions", "runners", _])
        | ("DELETE", ["enterprises", _, "actions", "runners", _])
        | ("DELETE", ["repos", _, _, "actions", "runners", _]) => "delete_runner",
        ("GET", ["enterprises", _, "actions", "runner-groups"]) => "list_runner_groups",
        ("GET", ["enterprises", _, "actions", "runner-groups", _]) => "get_runner_group",
        ("GET", ["repos", _, _, "actions", "runs"]) => "list_runs",
        ("GET", ["repos", _, _, "actions", "runs", _, "jobs"]) => "list_jobs",
        ("GET", ["repos", _, _, "actions", "jobs", _]) => "get_job",
        ("POST", ["app", "installations", _, "access_tokens"]) => "access_tokens",
        ("GET", ["installation", "repositories"]) => "installation_repos",
        ("GET", ["orgs", _, "repos"]) => "org_repos",
        ("GET", ["rate_limit"]) => "rate_limit",
        ("GET", ["app", "hook", "deliveries"]) => "list_app_hook_deliveries",
        ("POST", ["app", "hook", "deliveries", _, "attempts"]) => "redeliver_app_hook_delivery",
        ("POST", ["orgs", _, "actions", "runners", "registration-token"])
        | ("POST", ["repos", _, _, "actions", "runners", "registration-token"])
        | ("POST", ["enterprises", _, "actions", "runners", "registration-token"]) => {
            "registration_token"
        }
        ("POST", ["_runner", "acquire"]) => "runner_acquire",
        ("POST", ["_runner", "complete"]) => "runner_complete",
        ("POST", ["_runner", "renew"]) => "runner_renew",
        _ => crate::scaleset::endpoint(m, segs)
            .or_else(|| crate::org::endpoint(m, segs))
            .unwrap_or("unknown"),
    }
}

pub(crate) async fn dispatch(
    req: HttpRequest,
    body: web::Bytes,
    shared: web::Data<Shared>,
) -> HttpResponse {
    let path = req.path().to_string();
    let segs: Vec<&str> = path.trim_matches('/').split('/').collect();
    let mut s = shared.state.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(endpoint) = crate::releases::endpoint(req.method().as_str(), &segs) {
        // github.com's releases API, not the GHES's REST budget.
        let info = req.connection_info();
        let base = format!("{}://{}", info.scheme(), info.host());
        return crate::releases::answer(&mut s.releases, &base, &req, endpoint, &segs);
    }
    let endpoint = endpoint(req.method(), &segs);
    let now = unix_now();
    if endpoint.starts_with("runner_") {
        // The runner protocol is not GitHub's REST API: no budget, no record.
        return crate::runner_protocol::answer(&mut s, &req, endpoint, &body).1;
    }
    let full_path = match req.query_string() {
        "" => path.clone(),
        q => format!("{path}?{q}"),
    };
    let (status, response) = if endpoint.starts_with("actions_") {
        // The Actions service: its own tokens, no REST budget.
        match s.take_fault(endpoint) {
            Some(fault) => play(fault),
            None => crate::scaleset::answer(&mut s, &req, endpoint, &segs, &body),
        }
    } else {
        answer(&mut s, &shared, &req, endpoint, &segs, &body, now)
    };
    s.calls.push(Call {
        endpoint: endpoint.to_string(),
        method: req.method().to_string(),
        path: full_path,
        status,
        at_ms: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis())
            .unwrap_or(0),
        api_version: header(&req, "x-github-api-version"),
        accept: header(&req, "accept"),
        bearer: bearer(&req).is_some(),
    });
    response
}

fn header(req: &HttpRequest, name: &str) -> Option<String> {
    req.headers().get(name)?.to_str().ok().map(str::to_string)
}

pub(crate) fn bearer(req: &HttpRequest) -> Option<&str> {
    req.headers()
        .get("authorization")?
        .to_str()
        .ok()?
        .strip_prefix("Bearer ")
}

pub(crate) fn error(status: u16, message: &str) -> (u16, HttpResponse) {
    let body = json!({
        "message": message,
        "documentation_url": "https://docs.github.com/rest",
        "status": status.to_string(),
    });
    let code = actix_web::http::StatusCode::from_u16(status)
        .unwrap_or(actix_web::http::StatusCode::INTERNAL_SERVER_ERROR);
    (status, HttpResponse::build(code).json(body))
}

fn set_header(r: &mut HttpResponse, name: &'static str, value: &str) {
    if let Ok(v) = actix_web::http::header::HeaderValue::from_str(value) {
        r.headers_mut()
            .insert(actix_web::http::header::HeaderName::from_static(name), v);
    }
}

fn with_rate(mut r: HttpResponse, s: &mut State, bucket: &'static str) -> HttpResponse {
    let h = r.headers_mut();
    let b = s.budget_mut(bucket);
    let pairs = [
        ("x-ratelimit-limit", b.limit.to_string()),
        ("x-ratelimit-remaining", b.remaining.to_string()),
        ("x-ratelimit-reset", b.reset.to_string()),
        (
            "x-ratelimit-used",
            (b.limit.saturating_sub(b.remaining)).to_string(),
        ),
        ("x-ratelimit-resource", bucket.to_string()),
    ];
    for (k, v) in pairs {
        if let Ok(v) = actix_web::http::header::HeaderValue::from_str(&v) {
            h.insert(actix_web::http::header::HeaderName::from_static(k), v);
        }
    }
    r
}

#[allow(clippy::too_many_arguments)]
fn answer(
    s: &mut State,
    shared: &Shared,
    req: &HttpRequest,
    endpoint: &'static str,
    segs: &[&str],
    body: &[u8],
    now: u64,
) -> (u16, HttpResponse) {
    s.budget.roll(now);
    s.registration.roll(now);
    let bucket = crate::state::bucket_of(endpoint);
    if let Some(fault) = s.take_fault(endpoint) {
        let with_headers = matches!(
            fault,
            Fault::Status {
                rate_headers: true,
                ..
            }
        );
        let (status, r) = play(fault);
        if !with_headers {
            return (status, r);
        }
        let b = s.budget_mut(bucket);
        b.remaining = b.remaining.saturating_sub(1);
        return (status, with_rate(r, s, bucket));
    }
    match endpoint {
        "access_tokens" => return crate::app::access_token(s, shared, req, segs, now),
        "list_app_hook_deliveries" | "redeliver_app_hook_delivery" => {
            return crate::app::hook(s, shared, req, endpoint, segs, now);
        }
        "unknown" => return error(404, "Not Found"),
        _ => {}
    }
    let Some(token) = bearer(req) else {
        return error(401, "Requires authentication");
    };
    if !s.authorized(token, now) {
        return error(401, "Bad credentials");
    }
    // A classic PAT says its scopes on every answer, and is refused where it lacks one.
    let scopes = (token == s.token).then(|| s.token_scopes.clone()).flatten();
    if let Some(scopes) = &scopes {
        let repo_level = matches!(segs, ["repos", ..]);
        // Enterprise runner endpoints need `manage_runners:enterprise` (docs.github.com REST,
        // "Self-hosted runners" at the enterprise level).
        let needed = if matches!(segs, ["enterprises", ..]) {
            Some("manage_runners:enterprise")
        } else {
            crate::org::scope_needed(endpoint, repo_level)
        };
        if let Some(needed) = needed
            && !scopes.iter().any(|have| have == needed)
        {
            let (status, mut r) = error(403, "Resource not accessible by personal access token");
            set_header(&mut r, "x-oauth-scopes", &scopes.join(", "));
            set_header(&mut r, "x-accepted-oauth-scopes", needed);
            return (status, r);
        }
    }
    if endpoint == "rate_limit" {
        let shape = |b: &crate::state::Budget| json!({ "limit": b.limit, "remaining": b.remaining, "reset": b.reset, "used": b.limit - b.remaining });
        let (core, registration) = (shape(&s.budget), shape(&s.registration));
        return (
            200,
            HttpResponse::Ok().json(json!({
                "resources": { "core": core, "actions_runner_registration": registration },
                "rate": core,
            })),
        );
    }
    if s.budget_mut(bucket).remaining == 0 {
        let (status, r) = error(403, "API rate limit exceeded for installation.");
        return (status, with_rate(r, s, bucket));
    }
    s.budget_mut(bucket).remaining -= 1;
    if let ["repos", _, repo, ..] = segs
        && let Some((status, left)) = s.repo_faults.get_mut(*repo)
        && *left > 0
    {
        *left -= 1;
        let (status, r) = error(*status, reason(*status));
        return (status, with_rate(r, s, bucket));
    }
    let installation = s.installation_tokens.contains_key(token);
    let (status, mut r) = route(s, req, endpoint, segs, body, installation);
    if let Some(scopes) = &scopes {
        set_header(&mut r, "x-oauth-scopes", &scopes.join(", "));
    }
    if status == 304 {
        // "Making a conditional request and receiving a 304 response does not count against
        // your primary rate limit if the request is authorized correctly with an
        // Authorization header" (docs.github.com, REST API best practices: use conditional
        // requests if appropriate).
        s.budget_mut(bucket).remaining += 1;
    }
    (status, with_rate(r, s, bucket))
}

fn route(
    s: &mut State,
    req: &HttpRequest,
    endpoint: &'static str,
    segs: &[&str],
    body: &[u8],
    installation: bool,
) -> (u16, HttpResponse) {
    // `repo` is Some for repo-level paths; the owner must match either way.
    let (owner, repo) = match segs {
        ["orgs", owner, ..] => (Some(*owner), None),
        ["repos", owner, repo, ..] => (Some(*owner), Some(*repo)),
        _ => (None, None),
    };
    let foreign_owner = owner.is_some_and(|o| !o.eq_ignore_ascii_case(&s.owner));
    if foreign_owner || repo.is_some_and(|r| !s.repos.iter().any(|x| x == r)) {
        return error(404, "Not Found");
    }
    // Enterprise-level runners: only under the enterprise the org belongs to.
    let enterprise = match segs {
        ["enterprises", slug, ..] if s.enterprise.as_deref() == Some(*slug) => true,
        ["enterprises", ..] => return error(404, "Not Found"),
        _ => false,
    };
    let mine = |r: &Runner| r.repo.as_deref() == repo && r.enterprise == enterprise;
    let query = web::Query::<Paging>::from_query(req.query_string())
        .map(|q| q.into_inner())
        .unwrap_or_default();
    match endpoint {
        "get_org"
        | "get_repo"
        | "get_runner_group"
        | "list_runner_groups"
        | "list_hooks"
        | "list_hook_deliveries"
        | "redeliver_hook_delivery" => crate::org::answer(s, req, endpoint, segs, repo),
        "generate_jitconfig" => generate_jitconfig(s, repo, enterprise, body),
        "registration_token" => crate::scaleset::registration_token(s),
        "list_runners" => {
            let runners: Vec<Value> = s
                .runners
                .values()
                .filter(|r| mine(r))
                .map(runner_json)
                .collect();
            let total = runners.len();
            let (page, next) = query.page(runners);
            paged(
                req,
                json!({ "total_count": total, "runners": page }),
                next,
                &query,
            )
        }
        "get_runner" => {
            let id: u64 = segs.last().and_then(|x| x.parse().ok()).unwrap_or(0);
            match s.runners.get(&id).filter(|r| mine(r)) {
                Some(r) => (200, HttpResponse::Ok().json(runner_json(r))),
                None => error(404, "Not Found"),
            }
        }
        "delete_runner" => {
            let id: u64 = segs.last().and_then(|x| x.parse().ok()).unwrap_or(0);
            match s.runners.get(&id) {
                Some(r) if !mine(r) => error(404, "Not Found"),
                Some(r) if r.busy => error(
                    422,
                    "Bad request - Runner \"busy\" is still running a job\"",
                ),
                Some(_) => {
                    s.runners.remove(&id);
                    (204, HttpResponse::NoContent().finish())
                }
                None => error(404, "Not Found"),
            }
        }
        "list_runs" => {
            let repo = repo.unwrap_or_default();
            let runs: Vec<Value> = s
                .runs_of(repo)
                .into_iter()
                .filter(|(_, st)| query.status.as_deref().is_none_or(|want| want == *st))
                .map(|(id, st)| json!({ "id": id, "status": st, "run_attempt": 1, "name": "ci" }))
                .collect();
            let total = runs.len();
            let (page, next) = query.page(runs);
            paged(
                req,
                json!({ "total_count": total, "workflow_runs": page }),
                next,
                &query,
            )
        }
        "list_jobs" => {
            let run_id: u64 = segs.get(5).and_then(|x| x.parse().ok()).unwrap_or(0);
            let jobs: Vec<Value> = s
                .jobs
                .values()
                .filter(|j| j.run_id == run_id)
                .map(job_json)
                .collect();
            let total = jobs.len();
            let (page, next) = query.page(jobs);
            paged(
                req,
                json!({ "total_count": total, "jobs": page }),
                next,
                &query,
            )
        }
        "get_job" => {
            let id: u64 = segs.last().and_then(|x| x.parse().ok()).unwrap_or(0);
            match s.jobs.get(&id) {
                Some(j) => (200, HttpResponse::Ok().json(job_json(j))),
                None => error(404, "Not Found"),
            }
        }
        "installation_repos" if installation => {
            let repos = repos_json(s);
            let total = repos.len();
            let (page, next) = query.page(repos);
            paged(
                req,
                json!({ "total_count": total, "repositories": page }),
                next,
                &query,
            )
        }
        "installation_repos" => error(403, "This endpoint requires an installation token"),
        "org_repos" => {
            let repos = repos_json(s);
            let (page, next) = query.page(repos);
            paged(req, Value::Array(page), next, &query)
        }
        _ => error(404, "Not Found"),
    }
}

#[derive(Debug, Default, Deserialize)]
struct Paging {
    per_page: Option<usize>,
    page: Option<usize>,
    status: Option<String>,
}

impl Paging {
    fn page(&self, items: Vec<Value>) -> (Vec<Value>, bool) {
        let per = self.per_page.unwrap_or(30).clamp(1, 100);
        let page = self.page.unwrap_or(1).max(1);
        let start = (page - 1) * per;
        let next = items.len() > start + per;
        (items.into_iter().skip(start).take(per).collect(), next)
    }
}

/// A listing page, with an `ETag` as GitHub sends one for every listing; a request whose
/// `If-None-Match` names the current one is answered 304 without a body.
fn paged(req: &HttpRequest, body: Value, next: bool, q: &Paging) -> (u16, HttpResponse) {
    use std::hash::{Hash, Hasher};
    let mut link = None;
    if next {
        let per = q.per_page.unwrap_or(30).clamp(1, 100);
        let page = q.page.unwrap_or(1).max(1) + 1;
        let mut url = format!("{}?per_page={per}&page={page}", req.path());
        if let Some(status) = &q.status {
            url.push_str(&format!("&status={status}"));
        }
        link = Some(format!("<{url}>; rel=\"next\""));
    }
    let text = body.to_string();
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    (&text, &link).hash(&mut hasher);
    let etag = format!("W/\"{:016x}\"", hasher.finish());
    if header(req, "if-none-match").is_some_and(|v| v == etag) {
        return (
            304,
            HttpResponse::NotModified()
                .insert_header(("ETag", etag))
                .finish(),
        );
    }
    let mut r = HttpResponse::Ok();
    r.insert_header(("ETag", etag));
    if let Some(link) = link {
        r.insert_header(("Link", link));
    }
    (200, r.content_type("application/json").body(text))
}

fn repos_json(s: &State) -> Vec<Value> {
    let full = |r: &String| format!("{}/{r}", s.owner);
    s.repos
        .iter()
        .map(|r| {
            let archived = s.archived.contains(r);
            json!({ "name": r, "full_name": full(r), "archived": archived, "disabled": false })
        })
        .collect()
}

fn runner_json(r: &Runner) -> Value {
    json!({
        "id": r.id,
        "name": r.name,
        "os": "Linux",
        "status": r.status,
        "busy": r.busy,
        "ephemeral": true,
        "runner_group_id": 1,
        "labels": r.labels.iter().map(|l| json!({ "name": l, "type": "custom" })).collect::<Vec<_>>(),
    })
}

fn job_json(j: &Job) -> Value {
    let (created, started) = j.github_times();
    json!({
        "id": j.id,
        "run_id": j.run_id,
        "run_attempt": 1,
        "status": j.status,
        "conclusion": j.conclusion,
        "labels": j.labels,
        "runner_id": j.runner_id,
        "runner_name": j.runner_name,
        "name": j.about.as_ref().map_or_else(|| format!("job-{}", j.id), |a| a.name.clone()),
        "workflow_name": j.about.as_ref().map_or("ci", |a| a.workflow.as_str()),
        "head_branch": j.about.as_ref().map_or("main", |a| a.branch.as_str()),
        "created_at": created.map(ephemer_actors_core::clock::rfc3339),
        "started_at": started.map(ephemer_actors_core::clock::rfc3339),
    })
}

#[derive(Deserialize)]
struct JitRequest {
    name: String,
    #[serde(default)]
    runner_group_id: Option<u64>,
    #[serde(default)]
    labels: Vec<String>,
    #[serde(default)]
    work_folder: Option<String>,
}

fn generate_jitconfig(
    s: &mut State,
    repo: Option<&str>,
    enterprise: bool,
    body: &[u8],
) -> (u16, HttpResponse) {
    let Ok(req) = serde_json::from_slice::<JitRequest>(body) else {
        return error(422, "Validation Failed: invalid request body");
    };
    if req.name.is_empty()
        || req.labels.is_empty()
        || req.labels.len() > 100
        || req.runner_group_id.is_none()
    {
        return error(
            422,
            "Validation Failed: name, runner_group_id and 1-100 labels are required",
        );
    }
    // A group the org does not have ("Create configuration for a just-in-time runner":
    // `runner_group_id` must name one of the org's groups).
    let group_id = req.runner_group_id.unwrap_or(0);
    if !s.runner_groups.iter().any(|(id, _)| *id == group_id) {
        return error(404, "Not Found");
    }
    if s.runners.values().any(|r| r.name == req.name) {
        return error(
            409,
            &format!(
                "Already exists - A runner with the name {} already exists.",
                req.name
            ),
        );
    }
    // A hostile server (or a TLS-intercepting proxy) may register it under another name.
    let mut req = req;
    if let Some(name) = s.rename_next_runner.take() {
        req.name = name;
    }
    let (runner, encoded) = mint_runner(
        s,
        Mint {
            name: req.name,
            labels: req.labels,
            repo: repo.map(str::to_string),
            group_id,
            enterprise,
            work: req.work_folder.unwrap_or_else(|| "_work".into()),
            scale_set: None,
        },
    );
    let body = json!({ "runner": runner_json(&runner), "encoded_jit_config": encoded });
    (201, HttpResponse::Created().json(body))
}

/// A scripted fault's answer (status 0: the connection dropped), rate headers not added.
pub(crate) fn play(fault: Fault) -> (u16, HttpResponse) {
    match fault {
        Fault::Drop => {
            let broken = futures_util::stream::once(async {
                Err::<web::Bytes, io::Error>(io::Error::new(
                    io::ErrorKind::ConnectionReset,
                    "dropped by the stand-in",
                ))
            });
            (0, HttpResponse::Ok().streaming(broken))
        }
        Fault::Status {
            status,
            message,
            retry_after,
            ..
        } => {
            let (status, mut r) = error(status, &message);
            if let Some(secs) = retry_after
                && let Ok(v) = actix_web::http::header::HeaderValue::from_str(&secs.to_string())
            {
                r.headers_mut()
                    .insert(actix_web::http::header::RETRY_AFTER, v);
            }
            (status, r)
        }
    }
}

/// What a new runner registration is made of.
pub(crate) struct Mint {
    pub(crate) name: String,
    pub(crate) labels: Vec<String>,
    pub(crate) repo: Option<String>,
    pub(crate) group_id: u64,
    pub(crate) enterprise: bool,
    pub(crate) work: String,
    pub(crate) scale_set: Option<u64>,
}

/// Registers a JIT runner and mints its encoded config, as both the REST call and a scale
/// set's `generatejitconfig` do.
pub(crate) fn mint_runner(s: &mut State, m: Mint) -> (Runner, String) {
    let id = s.next_runner_id;
    s.next_runner_id += 1;
    let token = format!("runner-token-{id}-{}", random(12));
    let runner_file = json!({
        "AgentId": id,
        "AgentName": m.name,
        "PoolId": 1,
        "PoolName": "Default",
        "ServerUrl": s.runner_url.as_deref().unwrap_or(&s.base_url),
        "GitHubUrl": format!("{}/{}{}", s.runner_url.as_deref().unwrap_or(&s.base_url), s.owner, m.repo.as_deref().map(|r| format!("/{r}")).unwrap_or_default()),
        "WorkFolder": m.work,
        "Ephemeral": true,
        // As GitHub mints it: the REST call has no way to turn the runner's own updates off,
        // so a JIT runner behind the latest release updates itself unless its settings are
        // changed before it starts.
        "UseV2Flow": true,
    });
    let credentials = json!({ "Scheme": "OAuthAccessToken", "Data": { "token": token } });
    let files = json!({
        ".runner": B64.encode(runner_file.to_string()),
        ".credentials": B64.encode(credentials.to_string()),
        ".credentials_rsaparams": B64.encode("{}"),
    });
    s.registrations.push((m.name.clone(), m.group_id));
    let runner = Runner {
        id,
        name: m.name,
        labels: m.labels,
        repo: m.repo,
        status: "offline".into(),
        busy: false,
        job_id: None,
        token,
        group_id: m.group_id,
        enterprise: m.enterprise,
        connected_at_ms: None,
        scale_set: m.scale_set,
    };
    s.runners.insert(id, runner.clone());
    let encoded = B64.encode(files.to_string());
    s.secrets_issued.push(runner.token.clone());
    s.secrets_issued.push(encoded.clone());
    (runner, encoded)
}

pub(crate) fn random(n: usize) -> String {
    use rand::RngExt as _;
    const A: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    let mut rng = rand::rng();
    (0..n)
        .map(|_| A[rng.random_range(0..A.len())] as char)
        .collect()
}
