//! The service's clock: an assigned job no runner took within its window is withdrawn, and a
//! withdrawn one assigned again after the delay ([`ScaleSets::assign_windows`]).

use std::time::Duration;

use serde_json::{Value, json};

use super::{
    ASSIGNMENTS, MessageShape, RequestState, SERVICE, job_message, offer_waiting, service_base,
};
use crate::state::{State, unix_now_ms};

/// The service's clock: withdraws assigned jobs no runner took within the window (at most
/// [`ASSIGNMENTS`] assignments, then the job is cancelled) and assigns withdrawn jobs again
/// after the delay, with the same ids.
pub(crate) fn tick(s: &mut State) {
    let windows = s.scalesets.assign_windows.clone();
    if windows.is_empty() || s.scalesets.clock_paused_since.is_some() {
        return;
    }
    let window = |withdrawals: u32| {
        let i = (withdrawals as usize).min(windows.len() - 1);
        windows[i].as_millis()
    };
    let now = unix_now_ms();
    let delay = s.scalesets.reassign_delay.as_millis();
    let shape = s.scalesets.shape;
    let owner = s.owner.clone();
    let due: Vec<u64> = s
        .scalesets
        .requests
        .values()
        .filter(|r| match r.state {
            RequestState::Assigned => now >= r.assigned_at_ms + window(r.withdrawals),
            RequestState::Withdrawn => now >= r.assigned_at_ms + delay,
            _ => false,
        })
        .map(|r| r.id)
        .collect();
    let mut freed = false;
    for id in due {
        let Some(r) = s.scalesets.requests.get(&id).cloned() else {
            continue;
        };
        let Some(job) = s.jobs.get(&r.job_id).cloned() else {
            continue;
        };
        let mut r = r;
        if r.state == RequestState::Assigned {
            let mut item = job_message(shape, "JobCompleted", &r, &job, &owner);
            item["result"] = json!("canceled");
            item["runnerAssignTime"] = if s.scalesets.withdrawal_assign_time {
                item["scaleSetAssignTime"].clone()
            } else {
                Value::Null
            };
            r.withdrawals += 1;
            r.assigned_at_ms = now;
            if r.withdrawals >= ASSIGNMENTS {
                // Given up: the job is cancelled for good.
                r.enter(RequestState::Done, now);
                if let Some(j) = s.jobs.get_mut(&r.job_id) {
                    j.status = "completed".into();
                    j.conclusion = Some("cancelled".into());
                }
                freed = true;
            } else {
                r.enter(RequestState::Withdrawn, now);
            }
            s.scalesets.push(r.set_id, item);
        } else {
            r.assigned_at_ms = now;
            let item = match shape {
                MessageShape::Dotcom => {
                    r.enter(RequestState::Assigned, now);
                    job_message(shape, "JobAssigned", &r, &job, &owner)
                }
                // A GHES offers it again, to be acquired again (the harsher reading: a GHES
                // offers before it assigns, actions/scaleset#75 and PR #90).
                MessageShape::Ghes => {
                    r.enter(RequestState::Available, now);
                    let mut item = job_message(shape, "JobAvailable", &r, &job, &owner);
                    item["acquireJobUrl"] = json!(format!(
                        "{}/{SERVICE}/_apis/runtime/runnerscalesets/{}/acquirejobs",
                        service_base(s),
                        r.set_id
                    ));
                    item
                }
            };
            s.scalesets.push(r.set_id, item);
        }
        s.scalesets.requests.insert(id, r);
    }
    if freed {
        offer_waiting(s);
    }
}

/// The service's clock, every 100 ms while the stand-in lives: see [`tick`].
pub(crate) async fn ticker(state: std::sync::Weak<std::sync::Mutex<State>>) {
    loop {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let Some(state) = state.upgrade() else { return };
        let mut s = state.lock().unwrap_or_else(|p| p.into_inner());
        tick(&mut s);
    }
}
