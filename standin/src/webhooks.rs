//! The stand-in's webhook sender: delivers queued `workflow_job` bodies to the daemon, signed,
//! with a fresh delivery id each (plus the scripted copies and replays).
//!
//! As GitHub does, it sends many deliveries at once ([`IN_FLIGHT`] at most): one slow answer
//! does not hold back every later delivery. A job's own deliveries still go in the order they
//! were made (each waits for the answer to the one before), as the tests that script a job's
//! `queued`, `in_progress` and `completed` expect.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
};

use ephemer_actors_core::github::signature::sign;
use tokio::sync::mpsc::UnboundedReceiver;

use crate::state::{Delivery, Outgoing, State};

/// Deliveries in flight at once.
pub const IN_FLIGHT: usize = 64;

fn delivery_id() -> String {
    use rand::RngExt as _;
    let mut rng = rand::rng();
    let hex = |n: usize, rng: &mut rand::rngs::ThreadRng| -> String {
        (0..n)
            .map(|_| char::from_digit(rng.random_range(0..16), 16).unwrap_or('0'))
            .collect()
    };
    format!(
        "{}-{}-{}-{}-{}",
        hex(8, &mut rng),
        hex(4, &mut rng),
        hex(4, &mut rng),
        hex(4, &mut rng),
        hex(12, &mut rng)
    )
}

/// Where one delivery goes: the target, or a fleet member at random.
fn pick(target: &crate::state::WebhookTarget) -> String {
    use rand::seq::IndexedRandom as _;
    target
        .fleet
        .choose(&mut rand::rng())
        .cloned()
        .unwrap_or_else(|| target.url.clone())
}

pub(crate) async fn sender(state: Arc<Mutex<State>>, mut inbox: UnboundedReceiver<Outgoing>) {
    let client = awc::Client::builder()
        .timeout(std::time::Duration::from_secs(10))
        .finish();
    let post = {
        let state = state.clone();
        move |url: String, id: String, sent: (String, String, String), redelivery: bool| {
            let client = client.clone();
            let state = state.clone();
            async move {
                let (content_type, signature, body) = &sent;
                let status = client
                    .post(&url)
                    .insert_header(("X-GitHub-Event", "workflow_job"))
                    .insert_header(("X-GitHub-Delivery", id.as_str()))
                    .insert_header(("X-Hub-Signature-256", signature.as_str()))
                    .insert_header(("Content-Type", content_type.as_str()))
                    .insert_header(("User-Agent", "GitHub-Hookshot/standin"))
                    .send_body(body.clone())
                    .await
                    .map(|r| r.status().as_u16())
                    .unwrap_or(0);
                (url, id, sent, redelivery, status, state)
            }
        }
    };
    let slots = Arc::new(tokio::sync::Semaphore::new(IN_FLIGHT));
    // Per job, the end of its last delivery: the next one waits for it.
    let mut last: HashMap<u64, tokio::sync::oneshot::Receiver<()>> = HashMap::new();
    while let Some(out) = inbox.recv().await {
        let (action, job_id, sends, sent, redelivery) = match out {
            Outgoing::Again(seq) => {
                let s = state.lock().unwrap_or_else(|p| p.into_inner());
                let Some(d) = s.deliveries.iter().find(|d| d.seq == seq).cloned() else {
                    continue;
                };
                // GitHub redelivers to the hook's URL as it is now.
                let to = s.webhook.as_ref().map_or(d.posted_to, pick);
                (d.action, d.job_id, vec![(d.id, to)], d.sent, true)
            }
            Outgoing::New(action, job_id, body) => {
                let (target, copies, replays) = {
                    use rand::RngExt as _;
                    let mut s = state.lock().unwrap_or_else(|p| p.into_inner());
                    let share = s.faults_webhook.duplicate_share.clamp(0.0, 1.0);
                    let duplicate = share > 0.0 && s.rng.random_bool(share);
                    (
                        s.webhook.clone(),
                        s.faults_webhook.extra_copies + usize::from(duplicate),
                        s.faults_webhook.replays,
                    )
                };
                let Some(target) = target else { continue };
                let (content_type, body) = if target.form {
                    let form = serde_urlencoded::to_string([("payload", body.as_str())])
                        .unwrap_or_default();
                    ("application/x-www-form-urlencoded", form)
                } else {
                    ("application/json", body)
                };
                let signature = sign(target.secret.as_bytes(), body.as_bytes());
                let first = delivery_id();
                let mut sends: Vec<(String, String)> = vec![(first.clone(), pick(&target))];
                sends.extend(std::iter::repeat_n((first, pick(&target)), replays));
                sends.extend((0..copies).map(|_| (delivery_id(), pick(&target))));
                if !target.fleet.is_empty()
                    && rand::random_bool(target.duplicate_share.clamp(0.0, 1.0))
                {
                    sends.extend(target.fleet.iter().map(|url| (delivery_id(), url.clone())));
                }
                let sent = (content_type.to_string(), signature, body);
                (action, job_id, sends, sent, false)
            }
        };
        let Ok(slot) = slots.clone().acquire_owned().await else {
            return;
        };
        let (done, next) = tokio::sync::oneshot::channel();
        let before = last.insert(job_id, next);
        if last.len() > 4 * IN_FLIGHT {
            // Jobs whose last delivery was answered need no one to wait for them.
            last.retain(|_, rx| {
                matches!(
                    rx.try_recv(),
                    Err(tokio::sync::oneshot::error::TryRecvError::Empty)
                )
            });
        }
        let post = post.clone();
        actix_rt::spawn(async move {
            if let Some(before) = before {
                let _ = before.await;
            }
            for (id, url) in sends {
                let (posted_to, id, sent, redelivery, status, state) =
                    post(url, id, sent.clone(), redelivery).await;
                record(
                    &state, posted_to, id, sent, redelivery, status, &action, job_id,
                );
            }
            drop(slot);
            let _ = done.send(());
        });
    }
}

/// Logs one delivery's attempt (as GitHub's hook delivery log shows it).
#[allow(clippy::too_many_arguments)]
fn record(
    state: &Mutex<State>,
    posted_to: String,
    id: String,
    sent: (String, String, String),
    redelivery: bool,
    status: u16,
    action: &str,
    job_id: u64,
) {
    let mut s = state.lock().unwrap_or_else(|p| p.into_inner());
    let url = match (&s.public_url, redelivery) {
        // A redelivery is logged under the hook its first attempt was.
        (_, true) => s
            .deliveries
            .iter()
            .find(|d| d.id == id)
            .map_or_else(|| posted_to.clone(), |d| d.url.clone()),
        (Some(public), false) => public.clone(),
        (None, false) => posted_to.clone(),
    };
    let seq = s.deliveries.len() as u64 + 1;
    s.deliveries.push(Delivery {
        id,
        action: action.to_string(),
        job_id,
        status,
        seq,
        redelivery,
        at_unix: crate::state::unix_now(),
        url,
        posted_to,
        sent,
    });
}
