//! Webhook intake: the HTTP edge of the design's `WebhookActor` ([`actor::WebhookActor`]), an
//! actix-web resource a host app can mount.
//!
//! Order for every delivery: body size (413 over `webhook.max_body`), signature over the raw
//! body (constant time, fail closed), event type, then the JSON (for a form delivery, the
//! `payload` field's) and its shape; all on the worker thread. Then the
//! actor decides: replay check, durable record of a `queued` job, hand-over to the scheduler
//! with `try_send` (503 when its mailbox is full). The edge never provisions, never calls GitHub
//! and never waits on the scheduler. A delivery refused for any reason changes no state.

pub mod actor;

use actix::Addr;
use actix_web::{HttpRequest, HttpResponse, Resource, web};
use serde_json::json;
use tokio::time::Instant;

pub use actor::{
    Close, DELIVERY_CAPACITY, DELIVERY_WINDOW, Deliver, DeliveryDedup, RememberedDeliveries,
    Verdict, WebhookActor,
};

use crate::{
    config::Secret,
    github::{
        event::{PayloadError, parse_workflow_job},
        signature::verify,
    },
    metrics::Metrics,
    scheduler::messages::{EventSource, JobEvent},
};

/// GitHub caps payloads at 25 MB; actix-web's default limit is 256 KiB.
pub const MAX_BODY: usize = 25 * 1024 * 1024;

impl Verdict {
    fn into_response(self) -> HttpResponse {
        match self {
            // The hot path answers a fixed body: no serializer per delivery.
            Verdict::Accepted => fixed(HttpResponse::Accepted(), r#"{"status":"accepted"}"#),
            Verdict::IgnoredAction => fixed(HttpResponse::Accepted(), r#"{"status":"ignored"}"#),
            Verdict::OtherEvent => fixed(HttpResponse::Ok(), r#"{"status":"ignored"}"#),
            Verdict::Replayed => fixed(HttpResponse::Ok(), r#"{"status":"duplicate delivery"}"#),
            Verdict::Unauthorized(e) => {
                HttpResponse::Unauthorized().json(json!({ "error": e.to_string() }))
            }
            Verdict::Malformed(e) => HttpResponse::BadRequest().json(json!({ "error": e })),
            Verdict::WrongShape(e) => {
                HttpResponse::UnprocessableEntity().json(json!({ "error": e }))
            }
            Verdict::Busy => HttpResponse::ServiceUnavailable()
                .insert_header(("Retry-After", "5"))
                .json(json!({ "error": "scheduler busy, redeliver later" })),
        }
    }
}

fn fixed(mut builder: actix_web::HttpResponseBuilder, body: &'static str) -> HttpResponse {
    builder.content_type("application/json").body(body)
}

/// Why an intake could not be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IntakeError {
    /// Fail closed: without a secret no delivery could be verified.
    #[error("webhook intake needs a secret; refusing to accept unsigned deliveries")]
    NoSecret,
}

/// The HTTP edge of the intake: shared by every actix-web worker; holds no state of its own.
#[derive(Debug)]
pub struct WebhookIntake {
    secret: Secret,
    actor: Addr<WebhookActor>,
    metrics: Metrics,
    max_body: usize,
}

impl WebhookIntake {
    /// An edge verifying with `secret` and asking `actor`. Refuses an empty secret.
    pub fn new(
        secret: Secret,
        actor: Addr<WebhookActor>,
        metrics: Metrics,
    ) -> Result<Self, IntakeError> {
        if secret.is_empty() {
            return Err(IntakeError::NoSecret);
        }
        Ok(WebhookIntake {
            secret,
            actor,
            metrics,
            max_body: MAX_BODY,
        })
    }

    /// Deliveries larger than `bytes` are answered 413.
    pub fn with_max_body(mut self, bytes: usize) -> Self {
        self.max_body = bytes;
        self
    }

    /// The actor behind this edge.
    pub fn actor(&self) -> &Addr<WebhookActor> {
        &self.actor
    }

    /// The `POST path` resource, with the body limit on this route only.
    pub fn resource(intake: web::Data<WebhookIntake>, path: &str) -> Resource {
        let limit = intake.max_body;
        web::resource(path)
            .app_data(intake)
            .app_data(web::PayloadConfig::new(limit))
            .route(web::post().to(receive))
    }

    /// Everything the worker thread checks: signature, event, shape.
    fn check(&self, req: &HttpRequest, body: &[u8], now: Instant) -> Result<JobEvent, Verdict> {
        let header = |name: &str| req.headers().get(name).map(|v| v.as_bytes());
        if let Err(e) = verify(
            self.secret.expose().as_bytes(),
            body,
            header("x-hub-signature-256"),
        ) {
            return Err(Verdict::Unauthorized(e));
        }
        if header("x-github-event") != Some(b"workflow_job".as_slice()) {
            return Err(Verdict::OtherEvent);
        }
        // A hook's content type is `json` or `form` (`payload=<url-encoded JSON>`); the
        // signature covers the raw body either way, so decode only after verifying it.
        let form;
        let json = if is_form(header("content-type")) {
            form = form_payload(body)?;
            form.as_bytes()
        } else {
            body
        };
        let delivery = match parse_workflow_job(json) {
            Ok(d) => d,
            Err(PayloadError::Malformed(e)) => return Err(Verdict::Malformed(e)),
            Err(PayloadError::WrongShape(e)) => return Err(Verdict::WrongShape(e)),
        };
        let Some(action) = delivery.action else {
            self.metrics
                .webhook_events
                .with_label_values(&["other"])
                .inc();
            return Err(Verdict::IgnoredAction);
        };
        let delivery_id = header("x-github-delivery")
            .and_then(|v| std::str::from_utf8(v).ok())
            .filter(|v| !v.is_empty())
            .map(str::to_string);
        Ok(JobEvent {
            delivery_id,
            action,
            job: delivery.job,
            received: now,
            source: EventSource::Webhook,
        })
    }
}

/// True for `application/x-www-form-urlencoded` (any parameters, any case).
fn is_form(content_type: Option<&[u8]>) -> bool {
    content_type
        .and_then(|v| std::str::from_utf8(v).ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|v| {
            v.trim()
                .eq_ignore_ascii_case("application/x-www-form-urlencoded")
        })
}

/// The JSON in a form delivery's `payload` field.
fn form_payload(body: &[u8]) -> Result<String, Verdict> {
    let fields: Vec<(String, String)> = serde_urlencoded::from_bytes(body)
        .map_err(|e| Verdict::Malformed(format!("form delivery: {e}")))?;
    fields
        .into_iter()
        .find(|(k, _)| k == "payload")
        .map(|(_, v)| v)
        .ok_or_else(|| Verdict::Malformed("form delivery without a payload field".into()))
}

async fn receive(
    req: HttpRequest,
    body: web::Bytes,
    intake: web::Data<WebhookIntake>,
) -> HttpResponse {
    let verdict = match intake.check(&req, &body, Instant::now()) {
        Err(verdict) => verdict,
        // A stopped actor (an instance shut down) is a 503, never a 202.
        Ok(event) => intake
            .actor
            .send(Deliver(event))
            .await
            .unwrap_or(Verdict::Busy),
    };
    let delivery = req
        .headers()
        .get("x-github-delivery")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    match &verdict {
        Verdict::Accepted | Verdict::Replayed | Verdict::IgnoredAction | Verdict::OtherEvent => {
            tracing::debug!(delivery_id = delivery, verdict = ?verdict, "webhook delivery");
        }
        Verdict::Busy => tracing::warn!(
            delivery_id = delivery,
            "delivery not accepted (scheduler busy or instance stopped); answered 503"
        ),
        refused => {
            tracing::warn!(delivery_id = delivery, verdict = ?refused, "webhook delivery refused")
        }
    }
    verdict.into_response()
}

#[cfg(test)]
mod tests;
