//! The stand-in runner's own protocol (not GitHub's REST API: no budget, no record): the
//! runner asks for a job, renews the job's lock while it runs it and reports it done, as the
//! real runner does over its session.
//!
//! The lock is the service's only sign that a runner still runs its job: the real listener
//! renews it every 60 s (actions/runner `src/Runner.Listener/JobDispatcher.cs`,
//! `RenewJobRequestAsync`), and a job whose lock lapses is failed by the service with "The
//! self-hosted runner: NAME lost communication with the server" (actions/runner#2040, #3539:
//! a runner killed or starved mid-job). [`lock_ticker`] plays that part: a job whose runner
//! was stopped mid-job ends failed, as on GitHub, instead of staying `in_progress` for ever.

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
            // GitHub refuses a runner that is too old before anything else (its session).
            if let (Some(floor), Some(mine)) = (
                s.behavior.deprecated_below.clone(),
                body["version"].as_str(),
            ) && older(mine, &floor)
            {
                return (
                    403,
                    HttpResponse::Forbidden().json(json!({
                        "errorCode": 1,
                        "message": format!(
                            "Runner version v{mine} is deprecated and cannot receive messages."
                        ),
                    })),
                );
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
            let lock_ms = s.job_lock.as_millis();
            if let Some(j) = s.jobs.get_mut(&job_id) {
                j.locked_until_ms = Some(now_ms + lock_ms);
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
            // Ten renewals a lock, as the real runner's 60 s in GitHub's 10 minutes.
            let renew_ms = (lock_ms / 10).max(50);
            (
                200,
                HttpResponse::Ok().json(json!({
                    "job_id": job_id,
                    "duration_ms": s.behavior.job_ms,
                    "action": action,
                    "renew_ms": renew_ms,
                })),
            )
        }
        "runner_renew" => {
            let job_id = body["job_id"].as_u64().unwrap_or(0);
            let until = crate::state::unix_now_ms() + s.job_lock.as_millis();
            match s.jobs.get_mut(&job_id) {
                Some(j) if j.status == "in_progress" && j.runner_id == Some(runner_id) => {
                    j.locked_until_ms = Some(until);
                    (
                        200,
                        HttpResponse::Ok().json(json!({ "locked_until_ms": until })),
                    )
                }
                // The job is no longer this runner's to run: it stops renewing.
                _ => error(404, "job not found"),
            }
        }
        _ => {
            let job_id = body["job_id"].as_u64().unwrap_or(0);
            let conclusion = body["conclusion"].as_str().unwrap_or("success").to_string();
            // A job the service already ended (its lock lapsed) keeps its end.
            let open = match s.jobs.get_mut(&job_id) {
                Some(j) if j.status != "completed" => {
                    j.status = "completed".into();
                    j.conclusion = Some(conclusion);
                    true
                }
                _ => false,
            };
            if open {
                s.emit("completed", job_id);
            }
            // A JIT runner is ephemeral: GitHub removes it once its job is done.
            s.runners.remove(&runner_id);
            (200, HttpResponse::Ok().json(json!({ "ok": true })))
        }
    }
}

/// Fails every `in_progress` job whose lock lapsed (its runner stopped renewing it), as the
/// service does: `completed` with `failure`, its `completed` delivery naming the runner, which
/// is left registered and offline (a registration the daemon must still clean up).
pub(crate) fn abandon_lapsed(s: &mut State, now_ms: u128) {
    let lapsed: Vec<u64> = s
        .jobs
        .values()
        .filter(|j| j.status == "in_progress" && j.locked_until_ms.is_some_and(|t| t < now_ms))
        .map(|j| j.id)
        .collect();
    for id in lapsed {
        let mut runner = None;
        if let Some(j) = s.jobs.get_mut(&id) {
            j.status = "completed".into();
            j.conclusion = Some("failure".into());
            j.abandoned = true;
            runner = j.runner_id;
        }
        if let Some(r) = runner.and_then(|r| s.runners.get_mut(&r)) {
            r.status = "offline".into();
            r.busy = false;
            r.job_id = None;
        }
        s.emit("completed", id);
    }
}

/// Looks for lapsed job locks a few times a second while the stand-in lives.
pub(crate) async fn lock_ticker(state: std::sync::Weak<std::sync::Mutex<State>>) {
    loop {
        tokio::time::sleep(std::time::Duration::from_millis(250)).await;
        let Some(state) = state.upgrade() else { return };
        let mut s = state.lock().unwrap_or_else(|p| p.into_inner());
        abandon_lapsed(&mut s, crate::state::unix_now_ms());
    }
}

/// Whether dotted version `a` is older than `b` (`2.330.0` < `2.331.0`).
fn older(a: &str, b: &str) -> bool {
    let parts = |v: &str| -> Vec<u64> { v.split('.').map(|p| p.parse().unwrap_or(0)).collect() };
    parts(a) < parts(b)
}
