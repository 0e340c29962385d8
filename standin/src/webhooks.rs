//! The stand-in's webhook sender: delivers queued `workflow_job` bodies to the daemon, signed,
//! with a fresh delivery id each (plus the scripted copies and replays), one after another.

use std::sync::{Arc, Mutex};

use ephemer_actors_core::github::signature::sign;
use tokio::sync::mpsc::UnboundedReceiver;

use crate::state::{Delivery, State};

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

pub(crate) async fn sender(
    state: Arc<Mutex<State>>,
    mut inbox: UnboundedReceiver<(String, u64, String)>,
) {
    let client = awc::Client::builder()
        .timeout(std::time::Duration::from_secs(10))
        .finish();
    while let Some((action, job_id, body)) = inbox.recv().await {
        let (target, copies, replays) = {
            let s = state.lock().unwrap_or_else(|p| p.into_inner());
            (
                s.webhook.clone(),
                s.faults_webhook.extra_copies,
                s.faults_webhook.replays,
            )
        };
        let Some(target) = target else { continue };
        let (content_type, body) = if target.form {
            let form =
                serde_urlencoded::to_string([("payload", body.as_str())]).unwrap_or_default();
            ("application/x-www-form-urlencoded", form)
        } else {
            ("application/json", body)
        };
        let signature = sign(target.secret.as_bytes(), body.as_bytes());
        let first = delivery_id();
        let mut sends: Vec<(String, String)> = vec![(first.clone(), pick(&target))];
        sends.extend(std::iter::repeat_n((first, pick(&target)), replays));
        sends.extend((0..copies).map(|_| (delivery_id(), pick(&target))));
        if !target.fleet.is_empty() && rand::random_bool(target.duplicate_share.clamp(0.0, 1.0)) {
            sends.extend(target.fleet.iter().map(|url| (delivery_id(), url.clone())));
        }
        for (id, url) in sends {
            let status = client
                .post(&url)
                .insert_header(("X-GitHub-Event", "workflow_job"))
                .insert_header(("X-GitHub-Delivery", id.as_str()))
                .insert_header(("X-Hub-Signature-256", signature.as_str()))
                .insert_header(("Content-Type", content_type))
                .insert_header(("User-Agent", "GitHub-Hookshot/standin"))
                .send_body(body.clone())
                .await
                .map(|r| r.status().as_u16())
                .unwrap_or(0);
            let mut s = state.lock().unwrap_or_else(|p| p.into_inner());
            s.deliveries.push(Delivery {
                id,
                action: action.clone(),
                job_id,
                status,
            });
        }
    }
}
