//! Webhook intake: the HTTP edge of the design's `WebhookActor` ([`actor::WebhookActor`]), an
//! actix-web resource a host app can mount.
//!
//! Order for every delivery: before any of the body is read, a well-formed
//! `X-Hub-Signature-256` (401 without one: an unsigned 25 MB body costs nothing), the event
//! (anything but `workflow_job` and `ping` is answered 200 unread), a sane delivery id, the
//! declared length (413 over `webhook.max_body`), and the [`gate::Gate`] (429: the peer has
//! too many deliveries being read, or sent bad signatures just now); then the body, within the
//! limit, [`BODY_TIMEOUT`] and the budget of unverified bytes; then the signature over the raw
//! body (constant time, fail closed; with several targets, only the key of the owner the
//! payload names is tried), the
//! JSON (for a form delivery, the `payload` field's) and its shape and bounds; all on the worker
//! thread. Then the
//! actor decides: replay check, durable record of a `queued` job, hand-over to the scheduler
//! with `try_send` (503 when its mailbox is full). The edge never provisions, never calls GitHub
//! and never waits on the scheduler. A delivery refused for any reason changes no state.

pub(crate) mod actor;
pub(crate) mod dedup;
pub(crate) mod gate;
pub(crate) mod handoff;
pub(crate) mod keys;
pub(crate) mod pull;
pub(crate) mod redeliver;

use crate::clock::Instant;
use actix::Addr;
use actix_web::{HttpRequest, HttpResponse, Resource, web};
use serde_json::json;

pub use actor::{
    Close, DELIVERY_CAPACITY, DELIVERY_WINDOW, Deliver, IntakeCensus, RememberedDeliveries,
    Verdict, WebhookActor,
};
pub use dedup::DeliveryDedup;
pub use keys::{HookIds, TargetKey};

use crate::{
    config::Secret,
    github::{
        event::{PayloadError, parse_workflow_job},
        signature::{SignatureError, verify, well_formed},
    },
    metrics::Metrics,
    scheduler::messages::{EventSource, JobEvent},
};

/// The headers a delivery is read by, named once: a lookup by `&str` parses the name each time.
mod names {
    use actix_web::http::header::HeaderName;
    pub(super) const SIGNATURE: HeaderName = HeaderName::from_static("x-hub-signature-256");
    pub(super) const EVENT: HeaderName = HeaderName::from_static("x-github-event");
    pub(super) const DELIVERY: HeaderName = HeaderName::from_static("x-github-delivery");
    pub(super) const HOOK_ID: HeaderName = HeaderName::from_static("x-github-hook-id");
    pub(super) const TARGET_TYPE: HeaderName =
        HeaderName::from_static("x-github-hook-installation-target-type");
    pub(super) const TARGET_ID: HeaderName =
        HeaderName::from_static("x-github-hook-installation-target-id");
    pub(super) use actix_web::http::header::{CONTENT_LENGTH, CONTENT_TYPE};
}

/// The default body limit (`webhook.max_body`): `workflow_job` payloads are a few KB.
pub const MAX_BODY: usize = crate::config::defaults::WEBHOOK_MAX_BODY;
/// How long a delivery's body may take to arrive once its headers have.
pub const BODY_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);
/// A delivery id GitHub sends is a GUID: at most this long, of `[A-Za-z0-9-]`.
pub const MAX_DELIVERY_ID: usize = 64;
/// At most this many labels on a job, each at most [`MAX_LABEL`] bytes, are accepted.
pub const MAX_LABELS: usize = 64;
/// See [`MAX_LABELS`].
pub const MAX_LABEL: usize = 256;

impl Verdict {
    /// The `reason` label of `ephemerd_webhook_refused_total`, for a refusal.
    fn refusal(&self) -> Option<&'static str> {
        Some(match self {
            Verdict::Unauthorized(_) => "bad_signature",
            Verdict::Malformed(_) => "bad_payload",
            Verdict::WrongShape(_) => "wrong_shape",
            Verdict::TooLarge(_) => "too_large",
            Verdict::SlowBody => "slow_body",
            Verdict::Busy => "mailbox_full",
            Verdict::LedgerDown => "ledger_down",
            Verdict::Overloaded => "overloaded",
            _ => return None,
        })
    }

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
            Verdict::LedgerDown => HttpResponse::ServiceUnavailable()
                .insert_header(("Retry-After", "5"))
                .json(json!({ "error": "the cluster ledger is unreachable, redeliver later" })),
            Verdict::TooLarge(limit) => HttpResponse::PayloadTooLarge()
                .json(json!({ "error": format!("body over webhook.max_body ({limit} bytes)") })),
            Verdict::SlowBody => HttpResponse::RequestTimeout()
                .json(json!({ "error": "the body did not arrive in time" })),
            Verdict::Overloaded => HttpResponse::TooManyRequests()
                .insert_header(("Retry-After", "10"))
                .json(json!({ "error": "too many unverified deliveries; redeliver later" })),
        }
    }
}

/// The verdict in words, for the logs.
impl std::fmt::Display for Verdict {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Verdict::Accepted => f.write_str("accepted"),
            Verdict::IgnoredAction => f.write_str("accepted; an action the daemon does not act on"),
            Verdict::OtherEvent => f.write_str("another event; ignored"),
            Verdict::Replayed => f.write_str("a delivery id seen before; ignored"),
            Verdict::Unauthorized(e) => write!(f, "bad signature: {e}"),
            Verdict::Malformed(e) => write!(f, "not JSON: {e}"),
            Verdict::WrongShape(e) => write!(f, "JSON of the wrong shape: {e}"),
            Verdict::Busy => f.write_str("the scheduler is busy or stopped"),
            Verdict::LedgerDown => f.write_str("the cluster ledger is unreachable"),
            Verdict::TooLarge(limit) => write!(f, "body over webhook.max_body ({limit} bytes)"),
            Verdict::SlowBody => f.write_str("the body did not arrive in time"),
            Verdict::Overloaded => f.write_str("too many unverified deliveries"),
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
    /// More targets than one intake tells apart.
    #[error("webhook intake takes at most {MAX_TARGETS} targets")]
    TooManyTargets,
}

/// The most targets one intake verifies deliveries for (a bit each).
pub use crate::config::defaults::MAX_TARGETS;

/// The HTTP edge of the intake: shared by every actix-web worker; holds no state of its own.
#[derive(Debug)]
pub struct WebhookIntake {
    keys: Vec<TargetKey>,
    actor: Addr<WebhookActor>,
    metrics: Metrics,
    max_body: usize,
    gate: gate::Gate,
    /// Bodies over [`gate::SMALL`] are verified one at a time (across every worker): a flood
    /// of large unverified bodies gets one core's worth of hashing at most, and GitHub's few-KB
    /// deliveries are hashed at once beside it.
    large: tokio::sync::Semaphore,
    /// The actor's shared half: deliveries that need no record are decided on the worker.
    /// `None`: every delivery is asked of the actor.
    handoff: Option<std::sync::Arc<handoff::Handoff>>,
    /// HMACs computed, for tests and benchmarks.
    hmacs: std::sync::atomic::AtomicU64,
}

impl WebhookIntake {
    /// An edge verifying with `secret` and asking `actor`. Refuses an empty secret.
    pub fn new(
        secret: Secret,
        actor: Addr<WebhookActor>,
        metrics: Metrics,
    ) -> Result<Self, IntakeError> {
        Self::with_keys(vec![TargetKey::new(None, secret)], actor, metrics)
    }

    /// An edge for several GitHub targets, each `(owner, secret)`: a delivery must be signed
    /// with the secret of the target its job's owner names (a delivery signed with A's secret
    /// that names B's owner is refused 401, so no target can speak for another). Refuses an
    /// empty secret. [`WebhookIntake::for_target_keys`] also tells hooks and Apps apart.
    pub fn for_targets(
        targets: impl IntoIterator<Item = (String, Secret)>,
        actor: Addr<WebhookActor>,
        metrics: Metrics,
    ) -> Result<Self, IntakeError> {
        let keys = targets
            .into_iter()
            .map(|(owner, secret)| TargetKey::new(Some(owner), secret))
            .collect();
        Self::with_keys(keys, actor, metrics)
    }

    /// An edge for several GitHub targets, each with its hooks and App ([`keys`]): every
    /// delivery is checked with one target's secret at most, the one its hook, App or owner
    /// names; a delivery none of them claims is refused without a hash.
    pub fn for_target_keys(
        keys: Vec<TargetKey>,
        actor: Addr<WebhookActor>,
        metrics: Metrics,
    ) -> Result<Self, IntakeError> {
        Self::with_keys(keys, actor, metrics)
    }

    /// How many HMACs the edge computed (an unverified body costs one at most).
    pub fn hmacs(&self) -> u64 {
        self.hmacs.load(std::sync::atomic::Ordering::Relaxed)
    }

    fn with_keys(
        keys: Vec<TargetKey>,
        actor: Addr<WebhookActor>,
        metrics: Metrics,
    ) -> Result<Self, IntakeError> {
        if keys.is_empty() || keys.iter().any(|k| k.secret.is_empty()) {
            return Err(IntakeError::NoSecret);
        }
        if keys.len() > MAX_TARGETS {
            return Err(IntakeError::TooManyTargets);
        }
        Ok(WebhookIntake {
            keys,
            actor,
            metrics,
            max_body: MAX_BODY,
            gate: gate::Gate::new(MAX_BODY),
            large: tokio::sync::Semaphore::new(1),
            handoff: None,
            hmacs: std::sync::atomic::AtomicU64::new(0),
        })
    }

    /// Which key `body` is signed with (its index), or why none: the one key the delivery's
    /// hook, App or owner picks ([`keys::pick`]), a single HMAC; none picked, none computed.
    fn verified_key(
        &self,
        req: &HttpRequest,
        body: &[u8],
        json: &[u8],
        signature: Option<&[u8]>,
    ) -> Result<usize, Verdict> {
        let number = |name: &actix_web::http::header::HeaderName| {
            req.headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.trim().parse::<u64>().ok())
        };
        let integration = req
            .headers()
            .get(&names::TARGET_TYPE)
            .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"integration"));
        let claimed = keys::Claimed {
            hook_id: number(&names::HOOK_ID),
            app_id: number(&names::TARGET_ID).filter(|_| integration),
            owner: (self.keys.len() > 1).then(|| owner_named(json)).flatten(),
        };
        let Some(i) = keys::pick(&self.keys, &claimed) else {
            return Err(Verdict::Unauthorized(SignatureError::Mismatch));
        };
        self.hmacs
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        verify(self.keys[i].secret.expose().as_bytes(), body, signature)
            .map(|()| i)
            .map_err(Verdict::Unauthorized)
    }

    /// A verified delivery naming `owner` must be signed with that owner's key, if a key is
    /// the owner's.
    fn check_owner(&self, owner: &str, verified: usize) -> Result<(), Verdict> {
        let owners_key = self.keys.iter().position(|k| {
            k.owner
                .as_deref()
                .is_some_and(|o| o.eq_ignore_ascii_case(owner))
        });
        match owners_key {
            Some(i) if i != verified => Err(Verdict::Unauthorized(SignatureError::Mismatch)),
            _ => Ok(()),
        }
    }

    /// Deliveries larger than `bytes` are answered 413.
    pub fn with_max_body(mut self, bytes: usize) -> Self {
        self.max_body = bytes;
        self.gate = gate::Gate::new(bytes);
        self
    }

    /// Decide deliveries that need no record on the worker, through the actor's shared half
    /// ([`WebhookActor::handoff`]).
    pub fn with_handoff(mut self, handoff: std::sync::Arc<handoff::Handoff>) -> Self {
        self.handoff = Some(handoff);
        self
    }

    /// Answers `event`: on this worker when it needs no record, else by the actor.
    async fn deliver(&self, event: JobEvent) -> Verdict {
        let event = match &self.handoff {
            None => event,
            Some(handoff) => match handoff.decide(event) {
                Ok(decided) => {
                    if decided.wake {
                        self.actor.do_send(handoff::Flush);
                    }
                    return decided.verdict;
                }
                Err(event) => *event,
            },
        };
        // A stopped actor (an instance shut down) is a 503, never a 202.
        self.actor
            .send(Deliver(event))
            .await
            .unwrap_or(Verdict::Busy)
    }

    /// The actor behind this edge.
    pub fn actor(&self) -> &Addr<WebhookActor> {
        &self.actor
    }

    /// The `POST path` resource.
    pub fn resource(intake: web::Data<WebhookIntake>, path: &str) -> Resource {
        web::resource(path)
            .app_data(intake)
            .route(web::post().to(receive))
    }

    /// What the headers alone decide, before any of the body is read.
    fn before_body(&self, req: &HttpRequest) -> Option<Verdict> {
        let header = |name: &actix_web::http::header::HeaderName| {
            req.headers().get(name).map(|v| v.as_bytes())
        };
        if let Err(e) = well_formed(header(&names::SIGNATURE)) {
            return Some(Verdict::Unauthorized(e));
        }
        let event = header(&names::EVENT);
        if event != Some(b"workflow_job".as_slice()) && event != Some(b"ping".as_slice()) {
            return Some(Verdict::OtherEvent);
        }
        if let Some(id) = header(&names::DELIVERY)
            && (id.len() > MAX_DELIVERY_ID
                || !id.iter().all(|b| b.is_ascii_alphanumeric() || *b == b'-'))
        {
            return Some(Verdict::Malformed(format!(
                "X-GitHub-Delivery must be at most {MAX_DELIVERY_ID} letters, digits or dashes"
            )));
        }
        let declared = header(&names::CONTENT_LENGTH)
            .and_then(|v| std::str::from_utf8(v).ok())
            .and_then(|v| v.trim().parse::<usize>().ok());
        if declared.is_some_and(|n| n > self.max_body) {
            return Some(Verdict::TooLarge(self.max_body));
        }
        None
    }

    /// Everything the worker thread checks: signature, event, shape.
    fn check(&self, req: &HttpRequest, body: &[u8], now: Instant) -> Result<JobEvent, Verdict> {
        let header = |name: &actix_web::http::header::HeaderName| {
            req.headers().get(name).map(|v| v.as_bytes())
        };
        // A hook's content type is `json` or `form` (`payload=<url-encoded JSON>`); the
        // signature covers the raw body either way. Nothing decoded is trusted before it is
        // verified (the owner only picks the key to try).
        let form;
        let json = if is_form(header(&names::CONTENT_TYPE)) {
            match form_payload(body) {
                Ok(f) => {
                    form = f;
                    form.as_bytes()
                }
                Err(e) => {
                    self.verified_key(req, body, b"", header(&names::SIGNATURE))?;
                    return Err(e);
                }
            }
        } else {
            body
        };
        let verified = self.verified_key(req, body, json, header(&names::SIGNATURE))?;
        if header(&names::EVENT) != Some(b"workflow_job".as_slice()) {
            return Err(Verdict::OtherEvent);
        }
        let delivery = match parse_workflow_job(json) {
            Ok(d) => d,
            Err(PayloadError::Malformed(e)) => return Err(Verdict::Malformed(e)),
            Err(PayloadError::WrongShape(e)) => return Err(Verdict::WrongShape(e)),
        };
        self.check_owner(&delivery.job.key.owner, verified)?;
        let labels = &delivery.job.labels;
        if labels.len() > MAX_LABELS || labels.iter().any(|l| l.len() > MAX_LABEL) {
            return Err(Verdict::WrongShape(format!(
                "a job has at most {MAX_LABELS} labels of at most {MAX_LABEL} bytes"
            )));
        }
        let Some(action) = delivery.action else {
            self.metrics
                .webhook_events
                .with_label_values(&["other"])
                .inc();
            return Err(Verdict::IgnoredAction);
        };
        let delivery_id = header(&names::DELIVERY)
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

/// The owner login a payload names (`repository.owner.login`, or an org hook's ping's
/// `organization.login`), to pick the key to try.
fn owner_named(json: &[u8]) -> Option<String> {
    #[derive(serde::Deserialize)]
    struct Payload {
        repository: Option<Repository>,
        organization: Option<Owner>,
    }
    #[derive(serde::Deserialize)]
    struct Repository {
        owner: Owner,
    }
    #[derive(serde::Deserialize)]
    struct Owner {
        login: String,
    }
    serde_json::from_slice::<Payload>(json)
        .ok()
        .and_then(|p| p.repository.map(|r| r.owner).or(p.organization))
        .map(|o| o.login)
}

/// A body's chunks. One that comes in one chunk (GitHub's few-KB deliveries, mostly) is kept
/// as it came, without a copy; one of several is gathered.
#[derive(Debug, Default)]
struct Gather {
    first: Option<web::Bytes>,
    gathered: Option<web::BytesMut>,
    len: usize,
}

impl Gather {
    fn push(&mut self, chunk: web::Bytes) {
        self.len += chunk.len();
        match (&mut self.gathered, self.first.take()) {
            (Some(body), _) => body.extend_from_slice(&chunk),
            (None, None) => self.first = Some(chunk),
            (None, Some(earlier)) => {
                let mut body = web::BytesMut::with_capacity(self.len * 2);
                body.extend_from_slice(&earlier);
                body.extend_from_slice(&chunk);
                self.gathered = Some(body);
            }
        }
    }

    fn finish(self) -> web::Bytes {
        match self.gathered {
            Some(body) => body.freeze(),
            None => self.first.unwrap_or_default(),
        }
    }
}

/// The body, up to `limit` bytes, within [`BODY_TIMEOUT`] and the gate's budget.
async fn read_body(
    payload: &mut web::Payload,
    limit: usize,
    pass: &mut gate::Pass<'_>,
) -> Result<web::Bytes, Verdict> {
    use futures_util::{FutureExt as _, StreamExt as _};
    let mut body = Gather::default();
    let mut take = |body: &mut Gather, chunk: Result<web::Bytes, _>| {
        let chunk: web::Bytes =
            chunk.map_err(|e| Verdict::Malformed(format!("reading the body: {e}")))?;
        if body.len + chunk.len() > limit {
            return Err(Verdict::TooLarge(limit));
        }
        if !pass.hold(chunk.len()) {
            return Err(Verdict::Overloaded);
        }
        body.push(chunk);
        Ok(())
    };
    // What came with the headers is taken without a timer: a delivery's few KB usually did.
    loop {
        match payload.next().now_or_never() {
            Some(Some(chunk)) => take(&mut body, chunk)?,
            Some(None) => return Ok(body.finish()),
            None => break,
        }
    }
    let rest = async {
        while let Some(chunk) = payload.next().await {
            take(&mut body, chunk)?;
        }
        Ok(())
    };
    match tokio::time::timeout(BODY_TIMEOUT, rest).await {
        Ok(Ok(())) => Ok(body.finish()),
        Ok(Err(verdict)) => Err(verdict),
        Err(_) => Err(Verdict::SlowBody),
    }
}

async fn receive(
    req: HttpRequest,
    mut payload: web::Payload,
    intake: web::Data<WebhookIntake>,
) -> HttpResponse {
    let peer = req.peer_addr().map(|a| a.ip());
    let checked = match intake.before_body(&req) {
        Some(verdict) => Err(verdict),
        None => match intake.gate.enter(peer, std::time::Instant::now()) {
            Err(_) => Err(Verdict::Overloaded),
            Ok(mut pass) => match read_body(&mut payload, intake.max_body, &mut pass).await {
                Ok(body) => {
                    let _turn = if body.len() > gate::SMALL {
                        intake.large.acquire().await.ok()
                    } else {
                        None
                    };
                    let checked = intake.check(&req, &body, crate::clock::mono_now());
                    if matches!(checked, Err(Verdict::Unauthorized(_))) {
                        intake.gate.strike(peer, std::time::Instant::now());
                    }
                    checked
                }
                Err(verdict) => Err(verdict),
            },
        },
    };
    let verdict = match checked {
        // Refused for the load it brings: answered after a pause, which costs a sleeping
        // connection here and the flood most of its rate.
        Err(Verdict::Overloaded) => {
            tokio::time::sleep(gate::TARPIT).await;
            Verdict::Overloaded
        }
        Err(verdict) => verdict,
        Ok(event) => intake.deliver(event).await,
    };
    let delivery = req
        .headers()
        .get(&names::DELIVERY)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    match &verdict {
        Verdict::Accepted | Verdict::Replayed | Verdict::IgnoredAction | Verdict::OtherEvent => {
            tracing::debug!(delivery_id = delivery, verdict = %verdict, "webhook delivery");
        }
        Verdict::Busy => tracing::warn!(
            delivery_id = delivery,
            "delivery not accepted (scheduler busy or instance stopped); answered 503"
        ),
        // A flood must not become a flood of log lines: the metric counts these.
        Verdict::Overloaded => {
            tracing::debug!(delivery_id = delivery, peer = %peer.map_or_else(|| "unknown".to_string(), |p| p.to_string()), "delivery refused unread: too many unverified deliveries")
        }
        refused => {
            tracing::warn!(delivery_id = delivery, verdict = %refused, "webhook delivery refused")
        }
    }
    if let Some(reason) = verdict.refusal() {
        intake
            .metrics
            .webhook_refused
            .with_label_values(&[reason])
            .inc();
    }
    verdict.into_response()
}

#[cfg(test)]
mod tests;
