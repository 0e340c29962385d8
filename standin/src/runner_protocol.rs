//! The stand-in runner's own protocol (not GitHub's REST API: no budget, no record): the
//! runner asks for a job and reports it done, as the real runner does over its session.

use actix_web::{HttpRequest, HttpResponse};
use serde_json::{Value, json};

use crate::{
    routes::{bearer, error},
    state::State,
};

/// The stand-in runner's side: `acquire` hands out the oldest queued job the runner's labels
/// cover (whichever job that is) within the runner's scope: a repo-level runner (registered
/// through `/repos/{owner}/{repo}/actions/runners/...`) only takes that repo's jobs, as on
/// GitHub ("Adding self-hosted runners": a repository runner is dedicated to that repository).
/// `complete` finishes the job and removes the ephemeral runner.
pub(crate) fn answer(
    s: &mut State,
    req: &HttpRequest,
    endpoint: &str,
    body: &[u8],
) -> (u16, HttpResponse) {
    let Some(token) = bearer(req) else {
        return error(401, "runner token required");
    };
    let Some(runner_id) = s.runners.values().find(|r| r.token == token).map(|r| r.id) else {
        return error(404, "runner not registered");
    };
    let body: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
    match endpoint {
        "runner_acquire" => {
            let name = s.runners[&runner_id].name.clone();
            if let Some(pid) = body["pid"].as_u64() {
                s.runner_pids.insert(name.clone(), pid as u32);
            }
            let now_ms = crate::state::unix_now_ms();
            let boot_ms = u128::from(s.behavior.boot_ms);
            let mut booting = false;
            let mut up_at = now_ms;
            if let Some(r) = s.runners.get_mut(&runner_id) {
                r.status = "online".into();
                up_at = *r.connected_at_ms.get_or_insert(now_ms);
                booting = now_ms < up_at + boot_ms;
            }
            if s.behavior.hold || booting {
                return (204, HttpResponse::NoContent().finish());
            }
            // A runner behind the latest release that may update itself is told to, as GitHub
            // does; it downloads the release and restarts before it takes a job.
            let latest = s.releases.published.last().map(|r| r.version.clone());
            if let (Some(latest), Some(mine)) = (latest, body["version"].as_str())
                && body["disable_update"] != Value::Bool(true)
                && older(mine, &latest)
            {
                return (
                    200,
                    HttpResponse::Ok()
                        .json(json!({ "action": "update", "version": latest, "ms": 500 })),
                );
            }
            if s.behavior.crash_next > 0 {
                s.behavior.crash_next -= 1;
                return (
                    200,
                    HttpResponse::Ok().json(json!({ "job_id": 0, "action": "crash" })),
                );
            }
            let offered: Vec<String> = s.runners[&runner_id]
                .labels
                .iter()
                .map(|l| l.to_ascii_lowercase())
                .collect();
            let scope = s.runners[&runner_id].repo.clone();
            let scale_set = s.runners[&runner_id].scale_set;
            let pick = s
                .jobs
                .values()
                .filter(|j| j.status == "queued")
                .filter(|j| crate::scaleset::may_take(s, scale_set, j.id))
                .filter(|j| {
                    scope
                        .as_ref()
                        .is_none_or(|repo| repo.eq_ignore_ascii_case(&j.repo))
                })
                .filter(|j| {
                    // A scale set's runner takes what was assigned to its scale set.
                    scale_set.is_some()
                        || j.labels
                            .iter()
                            .all(|l| offered.contains(&l.to_ascii_lowercase()))
                })
                .min_by_key(|j| (j.queued_at_ms, j.id))
                .map(|j| j.id);
            let Some(job_id) = pick else {
                return (204, HttpResponse::NoContent().finish());
            };
            if let Some(j) = s.jobs.get_mut(&job_id) {
                j.status = "in_progress".into();
                j.picked_at_ms = Some(
                    std::time::SystemTime::now()
                        .duration_since(std::time::UNIX_EPOCH)
                        .map(|d| d.as_millis())
                        .unwrap_or(0),
                );
                j.runner_up_at_ms = Some(up_at);
                j.runner_name = Some(name);
                j.runner_id = Some(runner_id);
            }
            if let Some(r) = s.runners.get_mut(&runner_id) {
                r.busy = true;
                r.job_id = Some(job_id);
            }
            s.emit("in_progress", job_id);
            let action = if s.behavior.hang { "hang" } else { "run" };
            (
                200,
                HttpResponse::Ok().json(
                    json!({ "job_id": job_id, "duration_ms": s.behavior.job_ms, "action": action }),
                ),
            )
        }
        _ => {
            let job_id = body["job_id"].as_u64().unwrap_or(0);
            let conclusion = body["conclusion"].as_str().unwrap_or("success").to_string();
            if let Some(j) = s.jobs.get_mut(&job_id) {
                j.status = "completed".into();
                j.conclusion = Some(conclusion);
            }
            s.emit("completed", job_id);
            // A JIT runner is ephemeral: GitHub removes it once its job is done.
            s.runners.remove(&runner_id);
            (200, HttpResponse::Ok().json(json!({ "ok": true })))
        }
    }
}

/// Whether dotted version `a` is older than `b` (`2.330.0` < `2.331.0`).
fn older(a: &str, b: &str) -> bool {
    let parts = |v: &str| -> Vec<u64> { v.split('.').map(|p| p.parse().unwrap_or(0)).collect() };
    parts(a) < parts(b)
}
