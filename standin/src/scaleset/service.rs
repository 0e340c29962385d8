//! The Actions service's HTTP side on the stand-in: which request is which, and the answers
//! (the admin connection, scale sets, sessions, `acquirejobs`, `generatejitconfig`, message
//! deletion, and the long-polled message queue).

use std::{
    collections::{BTreeMap, VecDeque},
    time::Duration,
};

use actix_web::{HttpRequest, HttpResponse, web};
use base64::{Engine as _, engine::general_purpose::URL_SAFE_NO_PAD};
use serde_json::{Value, json};

use super::{RequestState, SERVICE, ScaleSet, Session, job_message, offer, offer_waiting};
use crate::{
    routes::{Shared, bearer, error, random},
    state::{Call, State, unix_now, unix_now_ms},
};

/// Names an Actions-service request (`None`: not one).
pub(crate) fn endpoint(method: &str, segs: &[&str]) -> Option<&'static str> {
    match (method, segs) {
        ("POST", ["actions", "runner-registration"]) => return Some("actions_admin_connection"),
        ("DELETE", ["_services", "queue", _, _, _]) => return Some("actions_delete_message"),
        (
            "DELETE",
            [
                "_services",
                "pipelines",
                "_apis",
                "distributedtask",
                "pools",
                _,
                "agents",
                _,
            ],
        ) => return Some("actions_delete_runner"),
        _ => {}
    }
    let api = segs.strip_prefix(&["_services", "pipelines", "_apis", "runtime"][..])?;
    Some(match (method, api) {
        ("GET", ["runnergroups"]) => "actions_get_runner_group",
        ("GET", ["runnerscalesets"]) => "actions_get_scale_set",
        ("POST", ["runnerscalesets"]) => "actions_create_scale_set",
        ("GET", ["runnerscalesets", _]) => "actions_get_scale_set_by_id",
        ("PATCH", ["runnerscalesets", _]) => "actions_update_scale_set",
        ("DELETE", ["runnerscalesets", _]) => "actions_delete_scale_set",
        ("POST", ["runnerscalesets", _, "sessions"]) => "actions_create_session",
        ("PATCH", ["runnerscalesets", _, "sessions", _]) => "actions_refresh_session",
        ("DELETE", ["runnerscalesets", _, "sessions", _]) => "actions_delete_session",
        ("POST", ["runnerscalesets", _, "acquirejobs"]) => "actions_acquire_jobs",
        ("POST", ["runnerscalesets", _, "generatejitconfig"]) => "actions_generate_jitconfig",
        _ => return None,
    })
}

/// `POST /orgs/{org}/actions/runners/registration-token` (GitHub REST; 201).
pub(crate) fn registration_token(s: &mut State) -> (u16, HttpResponse) {
    let token = format!("AREG{}", random(28));
    let expires = unix_now() + 3600;
    s.scalesets
        .registration_tokens
        .insert(token.clone(), expires);
    let at =
        humantime::format_rfc3339_seconds(std::time::UNIX_EPOCH + Duration::from_secs(expires))
            .to_string();
    (
        201,
        HttpResponse::Created().json(json!({ "token": token, "expires_at": at })),
    )
}

/// A JWT-shaped admin token with `exp` (the client reads it unverified to refresh in time).
fn admin_token(exp: u64) -> String {
    let part = |v: Value| URL_SAFE_NO_PAD.encode(v.to_string());
    format!(
        "{}.{}.{}",
        part(json!({ "alg": "RS256", "typ": "JWT" })),
        part(json!({ "exp": exp, "iss": "stand-in actions service", "jti": random(8) })),
        random(16)
    )
}

/// An error as the Actions service words it: `{typeName, message}`, the type assembly
/// qualified (ARC#4285's log), so clients match it by a part of the name.
fn service_error(status: u16, kind: &str, message: &str) -> (u16, HttpResponse) {
    let body = json!({
        "typeName": format!("GitHub.Actions.Runtime.WebApi.{kind}, GitHub.Actions.Runtime.WebApi"),
        "message": message,
    });
    let code = actix_web::http::StatusCode::from_u16(status)
        .unwrap_or(actix_web::http::StatusCode::INTERNAL_SERVER_ERROR);
    (status, HttpResponse::build(code).json(body))
}

fn seg_id(segs: &[&str], i: usize) -> u64 {
    segs.get(i).and_then(|x| x.parse().ok()).unwrap_or(0)
}

fn set_json(set: &ScaleSet, stats: Option<Value>) -> Value {
    json!({
        "id": set.id,
        "name": set.name,
        "runnerGroupId": set.group_id,
        "runnerGroupName": if set.group_id == 1 { "Default".to_string() } else { format!("group-{}", set.group_id) },
        "labels": set.labels.iter().map(|l| json!({ "type": "System", "name": l })).collect::<Vec<_>>(),
        "RunnerSetting": { "disableUpdate": false },
        "runnerJitConfigUrl": format!("/{SERVICE}/_apis/runtime/runnerscalesets/{}/generatejitconfig", set.id),
        "statistics": stats,
    })
}

fn session_json(s: &State, set: &ScaleSet, session: &Session) -> Value {
    json!({
        "sessionId": session.id,
        "ownerName": session.owner,
        "runnerScaleSet": set_json(set, None),
        "messageQueueUrl": format!("{}/_services/queue/{}/{}", super::service_base(s), set.id, session.id),
        "messageQueueAccessToken": session.token,
        "statistics": s.scalesets.statistics(set.id, &s.runners),
    })
}

fn new_session(owner: &str, ttl: Duration) -> Session {
    let hex = random(32).to_ascii_lowercase();
    Session {
        id: format!(
            "{}-{}-{}-{}-{}",
            &hex[0..8],
            &hex[8..12],
            &hex[12..16],
            &hex[16..20],
            &hex[20..32]
        ),
        owner: owner.to_string(),
        token: format!("MQ{}", random(24)),
        token_expires: unix_now() + ttl.as_secs(),
        last_seen_ms: unix_now_ms(),
    }
}

/// Answers an Actions-service request (everything but the message poll).
pub(crate) fn answer(
    s: &mut State,
    req: &HttpRequest,
    endpoint: &'static str,
    segs: &[&str],
    body: &[u8],
) -> (u16, HttpResponse) {
    let now = unix_now();
    if endpoint == "actions_admin_connection" {
        let remote = req
            .headers()
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("RemoteAuth "));
        let known = remote.is_some_and(|t| {
            s.scalesets
                .registration_tokens
                .get(t)
                .is_some_and(|exp| *exp > now)
        });
        if !known {
            return error(401, "Bad credentials");
        }
        let asked: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
        let url = asked["url"]
            .as_str()
            .unwrap_or_default()
            .trim_end_matches('/');
        let owner = url.rsplit('/').next().unwrap_or_default();
        if !owner.eq_ignore_ascii_case(&s.owner) || asked["runner_event"] != "register" {
            return error(404, "Not Found");
        }
        let exp = now + s.scalesets.admin_token_ttl.as_secs();
        let token = admin_token(exp);
        s.scalesets.admin_tokens.insert(token.clone(), exp);
        return (
            200,
            HttpResponse::Ok().json(
                json!({ "url": format!("{}/{SERVICE}/", super::service_base(s)), "token": token }),
            ),
        );
    }
    let Some(token) = bearer(req).map(str::to_string) else {
        return error(401, "Requires authentication");
    };
    let admin = s
        .scalesets
        .admin_tokens
        .get(&token)
        .is_some_and(|exp| *exp > now);
    // The message queue's calls take the session's token; the rest the admin token.
    let queue_call = matches!(endpoint, "actions_delete_message" | "actions_acquire_jobs");
    let session_token = s.scalesets.sets.values().any(|set| {
        set.session
            .as_ref()
            .is_some_and(|x| x.token == token && x.token_expires > now)
    });
    if !(admin || queue_call && session_token) {
        return error(401, "Bad credentials");
    }
    let query: BTreeMap<String, String> =
        serde_urlencoded::from_str(req.query_string()).unwrap_or_default();
    let idle_ms = s.scalesets.session_idle.as_millis();
    match endpoint {
        "actions_get_runner_group" => {
            let name = query.get("groupName").cloned().unwrap_or_default();
            let groups: Vec<Value> = s
                .runner_groups
                .iter()
                .filter(|(_, n)| n.eq_ignore_ascii_case(&name))
                .map(
                    |(id, n)| json!({ "id": id, "name": n, "size": 0, "isDefaultGroup": *id == 1 }),
                )
                .collect();
            (
                200,
                HttpResponse::Ok().json(json!({ "count": groups.len(), "value": groups })),
            )
        }
        "actions_get_scale_set" => {
            let group: u64 = query
                .get("runnerGroupId")
                .and_then(|g| g.parse().ok())
                .unwrap_or(1);
            let name = query.get("name").cloned().unwrap_or_default();
            let found: Vec<Value> = s
                .scalesets
                .sets
                .values()
                .filter(|x| x.group_id == group && x.name == name)
                .map(|x| set_json(x, Some(s.scalesets.statistics(x.id, &s.runners))))
                .collect();
            (
                200,
                HttpResponse::Ok().json(json!({ "count": found.len(), "value": found })),
            )
        }
        "actions_get_scale_set_by_id" => match s.scalesets.sets.get(&seg_id(segs, 5)) {
            Some(x) => (
                200,
                HttpResponse::Ok()
                    .json(set_json(x, Some(s.scalesets.statistics(x.id, &s.runners)))),
            ),
            None => error(404, "Not Found"),
        },
        "actions_create_scale_set" | "actions_update_scale_set" => {
            let Ok(asked) = serde_json::from_slice::<Value>(body) else {
                return error(400, "Bad Request");
            };
            let labels: Vec<String> = asked["labels"]
                .as_array()
                .map(|l| {
                    l.iter()
                        .filter_map(|x| x["name"].as_str().map(str::to_string))
                        .collect()
                })
                .unwrap_or_default();
            let name = asked["name"].as_str().unwrap_or_default().to_string();
            let group = asked["runnerGroupId"].as_u64().unwrap_or(1);
            // A GHES without custom scale-set labels keeps the name alone, silently (the
            // actions/scaleset README).
            let custom = s.scalesets.custom_labels;
            let echo = s.scalesets.answer_dropped_labels;
            let keep = |labels: Vec<String>, name: &str| {
                if custom {
                    labels
                } else {
                    vec![name.to_string()]
                }
            };
            if endpoint == "actions_update_scale_set" {
                let Some(set) = s.scalesets.sets.get_mut(&seg_id(segs, 5)) else {
                    return service_error(404, "RunnerScaleSetNotFoundException", "Not Found");
                };
                let mut answer = set.clone();
                if !labels.is_empty() {
                    set.labels = keep(labels.clone(), &set.name.clone());
                    answer.labels = if echo { labels } else { set.labels.clone() };
                }
                return (200, HttpResponse::Ok().json(set_json(&answer, None)));
            }
            if name.is_empty() || labels.is_empty() {
                return error(
                    400,
                    "a runner scale set needs a name and at least one label",
                );
            }
            if !s.runner_groups.iter().any(|(id, _)| *id == group) {
                return error(404, "Not Found");
            }
            if s.scalesets
                .sets
                .values()
                .any(|x| x.group_id == group && x.name == name)
            {
                return error(409, "a runner scale set with this name already exists");
            }
            let id = s.scalesets.next_set_id;
            s.scalesets.next_set_id += 1;
            let asked = labels.clone();
            let labels = keep(labels, &name);
            let set = ScaleSet {
                id,
                name,
                group_id: group,
                labels,
                session: None,
                queue: VecDeque::new(),
                next_message_id: 1,
                sessions_opened: Vec::new(),
                capacity: None,
            };
            let answer = if echo {
                set_json(
                    &ScaleSet {
                        labels: asked,
                        ..set.clone()
                    },
                    None,
                )
            } else {
                set_json(&set, None)
            };
            s.scalesets.sets.insert(id, set);
            // Jobs queued while no scale set covered them are offered to the new one.
            let waiting: Vec<u64> = s
                .jobs
                .values()
                .filter(|j| j.status == "queued")
                .map(|j| j.id)
                .collect();
            for job_id in waiting {
                offer(s, job_id);
            }
            (200, HttpResponse::Ok().json(answer))
        }
        "actions_delete_scale_set" => {
            let id = seg_id(segs, 5);
            if !s.scalesets.sets.contains_key(&id) {
                return error(404, "Not Found");
            }
            s.scalesets.delete_set(id);
            (204, HttpResponse::NoContent().finish())
        }
        "actions_create_session" => {
            let id = seg_id(segs, 5);
            let owner = serde_json::from_slice::<Value>(body)
                .ok()
                .and_then(|v| v["ownerName"].as_str().map(str::to_string))
                .unwrap_or_default();
            let ttl = s.scalesets.queue_token_ttl;
            let Some(set) = s.scalesets.sets.get_mut(&id) else {
                return service_error(
                    404,
                    "RunnerScaleSetNotFoundException",
                    "The runner scale set was not found.",
                );
            };
            if let Some(held) = &set.session
                && unix_now_ms() < held.last_seen_ms + idle_ms
            {
                return service_error(
                    409,
                    "RunnerScaleSetSessionConflictException",
                    &format!(
                        "The actions runner scale set {} already has an active session for owner {}.",
                        set.name, held.owner
                    ),
                );
            }
            // A session not polled for the idle time lapsed: its id is expired now.
            let lapsed = set.session.take().map(|x| x.id);
            let session = new_session(&owner, ttl);
            set.sessions_opened.push((session.id.clone(), owner));
            set.session = Some(session.clone());
            let set = set.clone();
            s.scalesets.expired_sessions.extend(lapsed);
            (
                200,
                HttpResponse::Ok().json(session_json(s, &set, &session)),
            )
        }
        "actions_refresh_session" | "actions_delete_session" => {
            let (id, sid) = (seg_id(segs, 5), segs.get(7).copied().unwrap_or_default());
            let ttl = s.scalesets.queue_token_ttl;
            let Some(set) = s.scalesets.sets.get_mut(&id) else {
                return error(404, "Not Found");
            };
            if set.session.as_ref().is_none_or(|x| x.id != sid) {
                if endpoint == "actions_delete_session"
                    && s.scalesets.expired_sessions.contains(sid)
                {
                    return service_error(
                        400,
                        "RunnerScaleSetSessionExpiredException",
                        &format!("The session identifier {sid} is not valid."),
                    );
                }
                return service_error(
                    404,
                    "RunnerAdminException",
                    "The session ID that doesn't exist in redis",
                );
            }
            if endpoint == "actions_delete_session" {
                set.session = None;
                s.scalesets.notify.notify_waiters();
                return (204, HttpResponse::NoContent().finish());
            }
            if let Some(session) = set.session.as_mut() {
                session.token = format!("MQ{}", random(24));
                session.token_expires = unix_now() + ttl.as_secs();
                session.last_seen_ms = unix_now_ms();
            }
            let set = set.clone();
            let Some(session) = set.session.clone() else {
                return error(404, "the message session was not found");
            };
            (
                200,
                HttpResponse::Ok().json(session_json(s, &set, &session)),
            )
        }
        "actions_acquire_jobs" => {
            if s.scalesets.no_acquire {
                return error(404, "Not Found");
            }
            let id = seg_id(segs, 5);
            let ids: Vec<u64> = serde_json::from_slice(body).unwrap_or_default();
            let mut acquired = Vec::new();
            let owner = s.owner.clone();
            for rid in ids {
                let Some(r) = s.scalesets.requests.get_mut(&rid) else {
                    continue;
                };
                if r.set_id != id || r.state != RequestState::Available {
                    continue;
                }
                r.enter(RequestState::Assigned, unix_now_ms());
                r.assigned_at_ms = unix_now_ms();
                let r = r.clone();
                acquired.push(rid);
                if s.scalesets.swallow_assigned > 0 {
                    s.scalesets.swallow_assigned -= 1;
                    continue;
                }
                if let Some(job) = s.jobs.get(&r.job_id).cloned() {
                    let item = job_message(s.scalesets.shape, "JobAssigned", &r, &job, &owner);
                    s.scalesets.push(id, item);
                }
            }
            (
                200,
                HttpResponse::Ok().json(json!({ "count": acquired.len(), "value": acquired })),
            )
        }
        "actions_generate_jitconfig" => {
            let id = seg_id(segs, 5);
            let Some(set) = s.scalesets.sets.get(&id).cloned() else {
                return error(404, "Not Found");
            };
            let asked: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
            let name = asked["name"].as_str().unwrap_or_default().to_string();
            if name.is_empty() {
                return error(400, "a runner needs a name");
            }
            if s.runners.values().any(|r| r.name == name) {
                return error(
                    409,
                    &format!("A runner with the name {name} already exists."),
                );
            }
            let work = asked["workFolder"].as_str().unwrap_or("_work").to_string();
            let (runner, encoded) = crate::routes::mint_runner(
                s,
                crate::routes::Mint {
                    name,
                    labels: set.labels.clone(),
                    repo: None,
                    group_id: set.group_id,
                    enterprise: false,
                    work,
                    scale_set: Some(id),
                },
            );
            (
                200,
                HttpResponse::Ok().json(json!({
                    "runner": { "id": runner.id, "name": runner.name, "runnerScaleSetId": id },
                    "encodedJITConfig": encoded,
                })),
            )
        }
        // `DELETE .../agents/{id}` with the admin token; a busy runner is refused with 400
        // `JobStillRunningException` (actions-runner-controller's
        // ephemeralrunnerset_controller.go skips such a runner).
        "actions_delete_runner" => {
            let id = seg_id(segs, 7);
            match s.runners.get(&id) {
                None => error(404, "Not Found"),
                Some(r) if r.busy => service_error(
                    400,
                    "JobStillRunningException",
                    "The runner is still running a job.",
                ),
                Some(_) => {
                    s.runners.remove(&id);
                    (204, HttpResponse::NoContent().finish())
                }
            }
        }
        "actions_delete_message" => {
            let (id, sid, mid) = (seg_id(segs, 2), segs[3], seg_id(segs, 4));
            let Some(set) = s.scalesets.sets.get_mut(&id) else {
                return error(404, "Not Found");
            };
            if set
                .session
                .as_ref()
                .is_none_or(|x| x.id != sid || x.token != token)
            {
                return error(401, "the message queue token is not valid");
            }
            set.queue.retain(|m| m.id != mid);
            (204, HttpResponse::NoContent().finish())
        }
        _ => error(404, "Not Found"),
    }
}

/// `GET /_services/queue/{set}/{session}?lastMessageId=N`: the oldest undeleted message after
/// `N` (200), or 202 after `long_poll` with none; 401 when the queue token expired, 404 when
/// the session is gone.
pub(crate) async fn poll(
    req: HttpRequest,
    path: web::Path<(u64, String)>,
    shared: web::Data<Shared>,
) -> HttpResponse {
    let (set_id, sid) = path.into_inner();
    let query: BTreeMap<String, String> =
        serde_urlencoded::from_str(req.query_string()).unwrap_or_default();
    let last: u64 = query
        .get("lastMessageId")
        .and_then(|x| x.parse().ok())
        .unwrap_or(0);
    let token = bearer(&req).unwrap_or_default().to_string();
    let capacity: Option<u64> = req
        .headers()
        .get("x-scalesetmaxcapacity")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok());
    let deadline = tokio::time::Instant::now();
    let record = |s: &mut State, status: u16| {
        s.calls.push(Call {
            endpoint: "actions_get_message".into(),
            method: "GET".into(),
            path: format!("{}?{}", req.path(), req.query_string()),
            status,
            at_ms: unix_now_ms(),
            api_version: None,
            accept: req
                .headers()
                .get("accept")
                .and_then(|v| v.to_str().ok())
                .map(str::to_string),
            bearer: !token.is_empty(),
        });
    };
    let mut first = true;
    loop {
        let notify = {
            let mut s = shared.state.lock().unwrap_or_else(|p| p.into_inner());
            if first {
                first = false;
                if let Some(fault) = s.take_fault("actions_get_message") {
                    record(&mut s, 0);
                    drop(s);
                    return crate::routes::play(fault).1;
                }
                if let Some(c) = capacity {
                    s.scalesets.capacities.push((set_id, c));
                    if let Some(set) = s.scalesets.sets.get_mut(&set_id) {
                        set.capacity = Some(c);
                    }
                    offer_waiting(&mut s);
                }
            }
            let now = unix_now();
            let long_poll = s.scalesets.long_poll;
            let statistics = s.scalesets.statistics(set_id, &s.runners);
            let Some(set) = s.scalesets.sets.get_mut(&set_id) else {
                record(&mut s, 404);
                return crate::routes::error(404, "the runner scale set was not found").1;
            };
            let Some(session) = set.session.as_mut().filter(|x| x.id == sid) else {
                record(&mut s, 404);
                return crate::routes::error(404, "the message session was not found").1;
            };
            if session.token != token || session.token_expires <= now {
                record(&mut s, 401);
                return crate::routes::error(401, "the message queue token expired").1;
            }
            session.last_seen_ms = unix_now_ms();
            if let Some(m) = set.queue.iter_mut().find(|m| m.id > last) {
                m.sent = true;
                let (kind, body) = match &m.other {
                    Some((kind, body)) => (kind.clone(), body.clone()),
                    None => (
                        "RunnerScaleSetJobMessages".to_string(),
                        Value::Array(m.items.clone()).to_string(),
                    ),
                };
                let body = json!({
                    "messageId": m.id,
                    "messageType": kind,
                    "body": body,
                    "statistics": statistics,
                });
                record(&mut s, 200);
                return HttpResponse::Ok().json(body);
            }
            if deadline.elapsed() >= long_poll {
                record(&mut s, 202);
                return HttpResponse::Accepted().finish();
            }
            (s.scalesets.notify.clone(), long_poll)
        };
        let (notify, long_poll) = notify;
        let wake = notify.notified();
        let left = long_poll.saturating_sub(deadline.elapsed());
        // A message pushed between the unlock and here is caught by the short cap.
        let _ = tokio::time::timeout(left.min(Duration::from_millis(250)), wake).await;
    }
}
