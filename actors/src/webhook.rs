//! Webhook intake (the design's `WebhookActor`): an actix-web resource a host app can mount.
//!
//! Order for every delivery: signature over the raw body (constant time, fail closed), event
//! type, JSON shape, `X-GitHub-Delivery` replay check, then a `try_send` to the scheduler. It
//! never provisions, never calls GitHub and never waits on the scheduler, so it answers in
//! milliseconds; a full scheduler mailbox is a 503 that GitHub may redeliver. A refused
//! delivery changes no state: the delivery id is only remembered once the event is handed on.

use std::{
    collections::{HashMap, VecDeque},
    sync::Mutex,
    time::Duration,
};

use actix::{Recipient, prelude::SendError};
use actix_web::{HttpRequest, HttpResponse, Resource, web};
use serde_json::json;
use tokio::time::Instant;

use crate::{
    config::Secret,
    github::{
        event::{PayloadError, parse_workflow_job},
        signature::{SignatureError, verify},
    },
    metrics::Metrics,
    scheduler::messages::{EventSource, JobEvent},
    store::{JobRow, Op, Store},
};

/// GitHub caps payloads at 25 MB; actix-web's default limit is 256 KiB.
pub const MAX_BODY: usize = 25 * 1024 * 1024;
/// How long a delivery id is remembered.
pub const DELIVERY_WINDOW: Duration = Duration::from_secs(60 * 60);
/// At most this many delivery ids are remembered (oldest forgotten first).
pub const DELIVERY_CAPACITY: usize = 65_536;

/// Remembers recent delivery ids, bounded in time and count. Pure: `now` is passed in.
#[derive(Debug)]
pub struct DeliveryDedup {
    window: Duration,
    capacity: usize,
    seen: HashMap<String, Instant>,
    order: VecDeque<(Instant, String)>,
}

impl DeliveryDedup {
    /// Remembers ids for `window`, at most `capacity` of them.
    pub fn new(window: Duration, capacity: usize) -> Self {
        DeliveryDedup {
            window,
            capacity,
            seen: HashMap::new(),
            order: VecDeque::new(),
        }
    }

    /// True if `id` was recorded within the window.
    pub fn contains(&mut self, id: &str, now: Instant) -> bool {
        self.expire(now);
        self.seen.contains_key(id)
    }

    /// Records `id`. Returns false if it was already there.
    pub fn insert(&mut self, id: &str, now: Instant) -> bool {
        self.expire(now);
        if self.seen.contains_key(id) {
            return false;
        }
        while self.seen.len() >= self.capacity {
            match self.order.pop_front() {
                Some((_, old)) => {
                    self.seen.remove(&old);
                }
                None => break,
            }
        }
        self.seen.insert(id.to_string(), now);
        self.order.push_back((now, id.to_string()));
        true
    }

    /// Forgets `id` (its event could not be handed on, so a redelivery must get through).
    pub fn remove(&mut self, id: &str) {
        self.seen.remove(id);
    }

    /// Ids remembered now.
    pub fn len(&self) -> usize {
        self.seen.len()
    }

    /// True when nothing is remembered.
    pub fn is_empty(&self) -> bool {
        self.seen.is_empty()
    }

    fn expire(&mut self, now: Instant) {
        while let Some((at, _)) = self.order.front() {
            if now.saturating_duration_since(*at) < self.window {
                break;
            }
            if let Some((at, id)) = self.order.pop_front()
                && self.seen.get(&id) == Some(&at)
            {
                self.seen.remove(&id);
            }
        }
    }
}

/// What the intake decided about one delivery.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// A `workflow_job` handed to the scheduler (202).
    Accepted,
    /// A `workflow_job` with an action the daemon does not act on (202, nothing forwarded).
    IgnoredAction,
    /// `ping` or another event (200).
    OtherEvent,
    /// A delivery id seen within the window (200, nothing forwarded).
    Replayed,
    /// Bad or missing signature (401).
    Unauthorized(SignatureError),
    /// Not JSON (400).
    Malformed(String),
    /// JSON of the wrong shape (422).
    WrongShape(String),
    /// The scheduler's mailbox is full or closed (503).
    Busy,
}

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

/// The webhook intake: shared by every actix-web worker.
#[derive(Debug)]
pub struct WebhookIntake {
    secret: Secret,
    scheduler: Recipient<JobEvent>,
    deliveries: Mutex<DeliveryDedup>,
    metrics: Metrics,
    store: Option<Store>,
}

impl WebhookIntake {
    /// Records every accepted `queued` job in `store` before answering: a job GitHub handed
    /// over survives a crash.
    pub fn with_store(mut self, store: Store) -> Self {
        self.store = Some(store);
        self
    }

    /// An intake forwarding to `scheduler`. Refuses an empty secret.
    pub fn new(
        secret: Secret,
        scheduler: Recipient<JobEvent>,
        metrics: Metrics,
    ) -> Result<Self, IntakeError> {
        if secret.is_empty() {
            return Err(IntakeError::NoSecret);
        }
        Ok(WebhookIntake {
            secret,
            scheduler,
            deliveries: Mutex::new(DeliveryDedup::new(DELIVERY_WINDOW, DELIVERY_CAPACITY)),
            metrics,
            store: None,
        })
    }

    /// The `POST path` resource, with the 25 MiB body limit on this route only.
    pub fn resource(intake: web::Data<WebhookIntake>, path: &str) -> Resource {
        web::resource(path)
            .app_data(intake)
            .app_data(web::PayloadConfig::new(MAX_BODY))
            .route(web::post().to(receive))
    }

    /// Decides about one delivery and, if accepted, hands it to the scheduler.
    pub fn decide(&self, req: &HttpRequest, body: &[u8], now: Instant) -> Verdict {
        match self.check(req, body, now) {
            Ok(event) => self.forward(event),
            Err(verdict) => verdict,
        }
    }

    /// Records a `queued` job durably (when there is a store) before it is acknowledged.
    async fn record(&self, event: &JobEvent) -> Result<(), crate::store::StoreError> {
        let Some(store) = &self.store else {
            return Ok(());
        };
        if event.action != crate::job::JobAction::Queued {
            return Ok(());
        }
        store
            .write(vec![Op::AddJob(JobRow {
                info: event.job.clone(),
                received_unix: crate::clock::unix_now(),
                started_unix: None,
            })])
            .await
    }

    fn forward(&self, event: JobEvent) -> Verdict {
        let action = event.action;
        let delivery_id = event.delivery_id.clone();
        match self.scheduler.try_send(event) {
            Ok(()) => {
                self.metrics
                    .webhook_events
                    .with_label_values(&[action.as_str()])
                    .inc();
                Verdict::Accepted
            }
            Err(SendError::Full(_) | SendError::Closed(_)) => {
                self.forget(delivery_id.as_deref());
                Verdict::Busy
            }
        }
    }

    fn forget(&self, delivery_id: Option<&str>) {
        if let Some(id) = delivery_id {
            self.lock().remove(id);
        }
    }

    /// Everything short of handing over: signature, event, shape, replay.
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
        let delivery = match parse_workflow_job(body) {
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
        if let Some(id) = &delivery_id
            && !self.lock().insert(id, now)
        {
            return Err(Verdict::Replayed);
        }
        Ok(JobEvent {
            delivery_id,
            action,
            job: delivery.job,
            received: now,
            source: EventSource::Webhook,
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, DeliveryDedup> {
        // A poisoned lock only means another worker panicked mid-insert; the map is still sound.
        self.deliveries.lock().unwrap_or_else(|p| p.into_inner())
    }
}

async fn receive(
    req: HttpRequest,
    body: web::Bytes,
    intake: web::Data<WebhookIntake>,
) -> HttpResponse {
    let verdict = match intake.check(&req, &body, Instant::now()) {
        Err(verdict) => verdict,
        Ok(event) => match intake.record(&event).await {
            Ok(()) => intake.forward(event),
            Err(e) => {
                tracing::error!(error = %e, "cannot record the job durably; answering 503 so GitHub may redeliver");
                intake.forget(event.delivery_id.as_deref());
                Verdict::Busy
            }
        },
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
            "scheduler mailbox full; answered 503"
        ),
        refused => {
            tracing::warn!(delivery_id = delivery, verdict = ?refused, "webhook delivery refused")
        }
    }
    verdict.into_response()
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex as StdMutex};

    use actix::{Actor, ActorContext, AsyncContext, Context, Handler, Message};
    use actix_web::{App, test as web_test};

    use super::*;
    use crate::{github::signature::sign, job::JobAction};

    const SECRET: &str = "It's a Secret to Everybody";

    /// Records every event it is handed; `Stall` makes it stop reading its mailbox.
    struct Recorder {
        seen: Arc<StdMutex<Vec<JobEvent>>>,
        capacity: usize,
    }

    impl Actor for Recorder {
        type Context = Context<Self>;
        fn started(&mut self, ctx: &mut Context<Self>) {
            ctx.set_mailbox_capacity(self.capacity);
        }
    }

    impl Handler<JobEvent> for Recorder {
        type Result = ();
        fn handle(&mut self, m: JobEvent, _: &mut Context<Self>) {
            self.seen.lock().unwrap().push(m);
        }
    }

    #[derive(Message)]
    #[rtype(result = "()")]
    struct Stall;

    impl Handler<Stall> for Recorder {
        type Result = ();
        fn handle(&mut self, _: Stall, ctx: &mut Context<Self>) {
            ctx.wait(actix::fut::wrap_future(
                futures_util::future::pending::<()>(),
            ));
        }
    }

    #[derive(Message)]
    #[rtype(result = "()")]
    struct Stop;

    impl Handler<Stop> for Recorder {
        type Result = ();
        fn handle(&mut self, _: Stop, ctx: &mut Context<Self>) {
            ctx.stop();
        }
    }

    fn recorder(capacity: usize) -> (actix::Addr<Recorder>, Arc<StdMutex<Vec<JobEvent>>>) {
        let seen = Arc::new(StdMutex::new(Vec::new()));
        let addr = Recorder {
            seen: seen.clone(),
            capacity,
        }
        .start();
        (addr, seen)
    }

    fn queued_body(job_id: u64, action: &str) -> String {
        format!(
            r#"{{"action":"{action}","workflow_job":{{"id":{job_id},"run_id":5,"run_attempt":1,"labels":["self-hosted","linux"],"runner_id":null,"runner_name":null}},"repository":{{"name":"app","full_name":"acme/app","owner":{{"login":"acme"}}}}}}"#
        )
    }

    fn delivery(
        event: &str,
        id: &str,
        body: &str,
        signature: Option<String>,
    ) -> web_test::TestRequest {
        let mut r = web_test::TestRequest::post()
            .uri("/webhook/github")
            .insert_header(("X-GitHub-Event", event))
            .insert_header(("X-GitHub-Delivery", id))
            .insert_header(("Content-Type", "application/json"))
            .set_payload(body.to_string());
        if let Some(sig) = signature {
            r = r.insert_header(("X-Hub-Signature-256", sig));
        }
        r
    }

    fn signed(event: &str, id: &str, body: &str) -> web_test::TestRequest {
        delivery(
            event,
            id,
            body,
            Some(sign(SECRET.as_bytes(), body.as_bytes())),
        )
    }

    macro_rules! app {
        ($addr:expr) => {{
            let intake = web::Data::new(
                WebhookIntake::new(
                    Secret::new(SECRET),
                    $addr.clone().recipient(),
                    Metrics::new(),
                )
                .unwrap(),
            );
            (
                web_test::init_service(
                    App::new().service(WebhookIntake::resource(intake.clone(), "/webhook/github")),
                )
                .await,
                intake,
            )
        }};
    }

    #[actix_web::test]
    async fn every_http_answer_of_the_contract() {
        let (addr, seen) = recorder(64);
        let (app, intake) = app!(addr);
        let status = |r: actix_web::dev::ServiceResponse| r.status().as_u16();

        let body = queued_body(1, "queued");
        assert_eq!(
            status(
                web_test::call_service(&app, signed("workflow_job", "d1", &body).to_request())
                    .await
            ),
            202
        );
        assert_eq!(
            status(
                web_test::call_service(&app, signed("ping", "d2", r#"{"zen":"hi"}"#).to_request())
                    .await
            ),
            200
        );
        assert_eq!(
            status(web_test::call_service(&app, signed("push", "d3", "{}").to_request()).await),
            200
        );
        assert_eq!(
            status(
                web_test::call_service(
                    &app,
                    delivery("workflow_job", "d4", &body, None).to_request()
                )
                .await
            ),
            401
        );
        let bad = Some(sign(b"wrong secret", body.as_bytes()));
        assert_eq!(
            status(
                web_test::call_service(
                    &app,
                    delivery("workflow_job", "d5", &body, bad).to_request()
                )
                .await
            ),
            401
        );
        let sha1 = Some("sha1=0123456789abcdef0123456789abcdef01234567".to_string());
        assert_eq!(
            status(
                web_test::call_service(
                    &app,
                    delivery("workflow_job", "d6", &body, sha1).to_request()
                )
                .await
            ),
            401
        );
        assert_eq!(
            status(
                web_test::call_service(
                    &app,
                    signed("workflow_job", "d7", "{\"action\":").to_request()
                )
                .await
            ),
            400
        );
        assert_eq!(
            status(
                web_test::call_service(
                    &app,
                    signed("workflow_job", "d8", r#"{"action":"queued"}"#).to_request()
                )
                .await
            ),
            422
        );
        let unknown = queued_body(2, "requested");
        assert_eq!(
            status(
                web_test::call_service(&app, signed("workflow_job", "d9", &unknown).to_request())
                    .await
            ),
            202
        );
        let huge = "x".repeat(MAX_BODY + 1);
        assert_eq!(
            status(
                web_test::call_service(&app, signed("workflow_job", "d10", &huge).to_request())
                    .await
            ),
            413
        );

        addr.send(Stop).await.ok();
        let events = seen.lock().unwrap().clone();
        assert_eq!(events.len(), 1, "only the queued delivery is forwarded");
        assert_eq!(events[0].action, JobAction::Queued);
        assert_eq!(events[0].delivery_id.as_deref(), Some("d1"));
        assert_eq!(
            intake.lock().len(),
            1,
            "refused deliveries leave no delivery id behind"
        );
    }

    #[actix_web::test]
    async fn a_replayed_delivery_is_forwarded_once() {
        let (addr, seen) = recorder(64);
        let (app, _) = app!(addr);
        let body = queued_body(7, "queued");
        for _ in 0..3 {
            let r =
                web_test::call_service(&app, signed("workflow_job", "same-id", &body).to_request())
                    .await;
            assert!(r.status().is_success());
        }
        let other =
            web_test::call_service(&app, signed("workflow_job", "other-id", &body).to_request())
                .await;
        assert_eq!(
            other.status(),
            202,
            "a new delivery id of the same job reaches the scheduler"
        );
        addr.send(Stop).await.ok();
        let ids: Vec<_> = seen
            .lock()
            .unwrap()
            .iter()
            .map(|e| e.delivery_id.clone().unwrap())
            .collect();
        assert_eq!(ids, vec!["same-id", "other-id"]);
    }

    #[actix_web::test]
    async fn a_full_scheduler_mailbox_is_503_and_the_redelivery_gets_through() {
        let (addr, seen) = recorder(1);
        addr.send(Stall).await.unwrap();
        let (app, intake) = app!(addr);
        let mut statuses = Vec::new();
        for i in 0..4 {
            let body = queued_body(100 + i, "queued");
            let r = web_test::call_service(
                &app,
                signed("workflow_job", &format!("s{i}"), &body).to_request(),
            )
            .await;
            statuses.push(r.status().as_u16());
        }
        assert!(statuses.contains(&503), "{statuses:?}");
        let refused = statuses.iter().filter(|s| **s == 503).count();
        assert_eq!(
            intake.lock().len(),
            4 - refused,
            "a 503 leaves its delivery id unrecorded"
        );
        assert!(seen.lock().unwrap().is_empty());

        // The same delivery id, redelivered once the scheduler has room, is accepted.
        let (addr2, seen2) = recorder(64);
        let (app2, _) = app!(addr2);
        let body = queued_body(103, "queued");
        let r =
            web_test::call_service(&app2, signed("workflow_job", "s3", &body).to_request()).await;
        assert_eq!(r.status(), 202);
        addr2.send(Stop).await.ok();
        assert_eq!(seen2.lock().unwrap().len(), 1);
    }

    #[test]
    fn an_empty_secret_is_refused() {
        let sys = actix::System::new();
        sys.block_on(async {
            let (addr, _) = recorder(4);
            let err = WebhookIntake::new(Secret::default(), addr.recipient(), Metrics::new())
                .unwrap_err();
            assert_eq!(err, IntakeError::NoSecret);
        });
    }

    /// Random bodies with random signatures never panic, are always 401, and change nothing;
    /// random bodies *correctly* signed never panic either.
    #[test]
    fn fuzzed_deliveries_never_panic_or_change_state() {
        use proptest::prelude::*;
        use proptest::test_runner::{Config, TestRunner};

        actix::System::new().block_on(async {
            let (addr, seen) = recorder(100_000);
            let intake = WebhookIntake::new(
                Secret::new(SECRET),
                addr.clone().recipient(),
                Metrics::new(),
            )
            .unwrap();
            let mut runner = TestRunner::new(Config {
                cases: 2000,
                ..Config::default()
            });
            let strategy = (
                proptest::collection::vec(any::<u8>(), 0..512),
                proptest::option::of(proptest::collection::vec(any::<u8>(), 0..80)),
                any::<bool>(),
            );
            runner
                .run(&strategy, |(body, sig, prefixed)| {
                    let mut sig = sig.unwrap_or_default();
                    if prefixed {
                        sig.splice(0..0, b"sha256=".iter().copied());
                    }
                    let mut req = web_test::TestRequest::post()
                        .insert_header(("X-GitHub-Event", "workflow_job"));
                    if let Ok(v) = actix_web::http::header::HeaderValue::from_bytes(&sig) {
                        req = req.insert_header(("X-Hub-Signature-256", v));
                    }
                    let verdict = intake.decide(&req.to_http_request(), &body, Instant::now());
                    prop_assert!(matches!(verdict, Verdict::Unauthorized(_)), "{verdict:?}");
                    Ok(())
                })
                .unwrap();
            assert!(intake.lock().is_empty());

            let json_ish = prop_oneof![
                proptest::collection::vec(any::<u8>(), 0..256),
                "[{}\\[\\]\":,a-z0-9 ]{0,200}".prop_map(String::into_bytes),
                (0u64..5, "[a-z_]{0,12}")
                    .prop_map(|(id, action)| queued_body(id, &action).into_bytes()),
            ];
            runner
                .run(&json_ish, |body| {
                    let sig = sign(SECRET.as_bytes(), &body);
                    let req = web_test::TestRequest::post()
                        .insert_header(("X-GitHub-Event", "workflow_job"))
                        .insert_header(("X-Hub-Signature-256", sig))
                        .to_http_request();
                    let verdict = intake.decide(&req, &body, Instant::now());
                    prop_assert!(
                        !matches!(verdict, Verdict::Unauthorized(_) | Verdict::Busy),
                        "{verdict:?}"
                    );
                    Ok(())
                })
                .unwrap();
            addr.send(Stop).await.ok();
            for e in seen.lock().unwrap().iter() {
                assert!(
                    e.job.key.job_id < 5,
                    "only well-formed payloads are forwarded"
                );
            }
        });
    }

    #[test]
    fn delivery_ids_expire_and_stay_bounded() {
        let t0 = Instant::now();
        let mut d = DeliveryDedup::new(Duration::from_secs(60), 3);
        assert!(d.insert("a", t0));
        assert!(!d.insert("a", t0 + Duration::from_secs(10)));
        assert!(d.insert("b", t0));
        assert!(d.insert("c", t0));
        assert!(d.insert("d", t0), "capacity evicts the oldest");
        assert_eq!(d.len(), 3);
        assert!(!d.contains("a", t0));
        assert!(
            !d.contains("b", t0 + Duration::from_secs(61)),
            "window passed"
        );
        assert!(d.is_empty());
    }
}
