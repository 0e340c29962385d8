//! The intake through its one path (the HTTP resource and the `WebhookActor` behind it):
//! every answer of the contract, replays, a full scheduler mailbox, the store, a closed
//! intake, and fuzzed deliveries.
use std::{
    sync::{Arc, Mutex as StdMutex},
    time::Duration,
};

use actix::{Actor, ActorContext, AsyncContext, Context, Handler, Message};
use actix_web::{App, test as web_test};

use super::*;
use crate::{github::signature::sign, job::JobAction, store::Store};

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

fn delivery(event: &str, id: &str, body: &str, signature: Option<String>) -> web_test::TestRequest {
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
    ($addr:expr) => {{ app!($addr, None) }};
    ($addr:expr, $store:expr) => {{
        let actor = WebhookActor::new($addr.clone().recipient(), $store, Metrics::new());
        let handoff = actor.handoff();
        let actor = actor.start();
        let intake = web::Data::new(
            WebhookIntake::new(Secret::new(SECRET), actor.clone(), Metrics::new())
                .unwrap()
                .with_handoff(handoff),
        );
        (
            web_test::init_service(
                App::new().service(WebhookIntake::resource(intake.clone(), "/webhook/github")),
            )
            .await,
            actor,
        )
    }};
}

/// The job ids the store under `dir` holds, once whoever held it let go.
async fn stored_job_ids(dir: &std::path::Path) -> Vec<u64> {
    let snapshot = loop {
        match Store::open(dir) {
            Ok((_, snapshot)) => break snapshot,
            Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    };
    snapshot.jobs.iter().map(|r| r.info.key.job_id).collect()
}

/// The job ids a recorder was handed, in order.
fn job_ids(seen: &StdMutex<Vec<JobEvent>>) -> Vec<u64> {
    seen.lock()
        .unwrap()
        .iter()
        .map(|e| e.job.key.job_id)
        .collect()
}

/// Waits until the outbox was passed to the scheduler (the flush comes a millisecond after
/// the first event into it).
async fn passed_on(actor: &actix::Addr<WebhookActor>) {
    tokio::time::sleep(super::handoff::FLUSH_AFTER * 20).await;
    let _ = actor.send(RememberedDeliveries).await;
}

async fn remembered(actor: &actix::Addr<WebhookActor>) -> usize {
    actor.send(RememberedDeliveries).await.unwrap()
}

#[actix_web::test]
async fn every_http_answer_of_the_contract() {
    let (addr, seen) = recorder(64);
    let (app, actor) = app!(addr);
    let status = |r: actix_web::dev::ServiceResponse| r.status().as_u16();

    let body = queued_body(1, "queued");
    assert_eq!(
        status(
            web_test::call_service(&app, signed("workflow_job", "d1", &body).to_request()).await
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
            web_test::call_service(&app, signed("workflow_job", "d9", &unknown).to_request()).await
        ),
        202
    );
    let huge = "x".repeat(MAX_BODY + 1);
    assert_eq!(
        status(
            web_test::call_service(&app, signed("workflow_job", "d10", &huge).to_request()).await
        ),
        413
    );

    passed_on(&actor).await;
    addr.send(Stop).await.ok();
    let events = seen.lock().unwrap().clone();
    assert_eq!(events.len(), 1, "only the queued delivery is forwarded");
    assert_eq!(events[0].action, JobAction::Queued);
    assert_eq!(events[0].delivery_id.as_deref(), Some("d1"));
    assert_eq!(
        remembered(&actor).await,
        1,
        "refused deliveries leave no delivery id behind"
    );
}

#[actix_web::test]
async fn a_replayed_delivery_is_forwarded_once() {
    let (addr, seen) = recorder(64);
    let (app, actor) = app!(addr);
    let body = queued_body(7, "queued");
    for _ in 0..3 {
        let r = web_test::call_service(&app, signed("workflow_job", "same-id", &body).to_request())
            .await;
        assert!(r.status().is_success());
    }
    let other =
        web_test::call_service(&app, signed("workflow_job", "other-id", &body).to_request()).await;
    assert_eq!(
        other.status(),
        202,
        "a new delivery id of the same job reaches the scheduler"
    );
    passed_on(&actor).await;
    addr.send(Stop).await.ok();
    let ids: Vec<_> = seen
        .lock()
        .unwrap()
        .iter()
        .map(|e| e.delivery_id.clone().unwrap())
        .collect();
    assert_eq!(ids, vec!["same-id", "other-id"]);
}

#[test]
fn an_empty_secret_is_refused() {
    let sys = actix::System::new();
    sys.block_on(async {
        let (addr, _) = recorder(4);
        let actor = WebhookActor::new(addr.recipient(), None, Metrics::new()).start();
        let err = WebhookIntake::new(Secret::default(), actor, Metrics::new()).unwrap_err();
        assert_eq!(err, IntakeError::NoSecret);
    });
}

/// Random bodies with random signatures never panic, are always 401, and change nothing;
/// random bodies *correctly* signed never panic either. Through the one intake path.
#[actix_web::test]
async fn fuzzed_deliveries_never_panic_or_change_state() {
    use proptest::{
        prelude::*,
        strategy::ValueTree,
        test_runner::{Config, TestRunner},
    };

    let (addr, seen) = recorder(100_000);
    let (app, actor) = app!(addr);
    let mut runner = TestRunner::new(Config::default());
    let strategy = (
        proptest::collection::vec(any::<u8>(), 0..512),
        proptest::option::of(proptest::collection::vec(any::<u8>(), 0..80)),
        any::<bool>(),
    );
    for _ in 0..2000 {
        let (body, sig, prefixed) = strategy.new_tree(&mut runner).unwrap().current();
        let mut sig = sig.unwrap_or_default();
        if prefixed {
            sig.splice(0..0, b"sha256=".iter().copied());
        }
        let mut req = web_test::TestRequest::post()
            .uri("/webhook/github")
            .insert_header(("X-GitHub-Event", "workflow_job"))
            .set_payload(body);
        if let Ok(v) = actix_web::http::header::HeaderValue::from_bytes(&sig) {
            req = req.insert_header(("X-Hub-Signature-256", v));
        }
        let r = web_test::call_service(&app, req.to_request()).await;
        assert_eq!(r.status(), 401);
    }
    assert_eq!(remembered(&actor).await, 0);
    assert!(seen.lock().unwrap().is_empty());

    let json_ish = prop_oneof![
        proptest::collection::vec(any::<u8>(), 0..256),
        "[{}\\[\\]\":,a-z0-9 ]{0,200}".prop_map(String::into_bytes),
        (0u64..5, "[a-z_]{0,12}").prop_map(|(id, action)| queued_body(id, &action).into_bytes()),
    ];
    for i in 0..2000 {
        let body = json_ish.new_tree(&mut runner).unwrap().current();
        let sig = sign(SECRET.as_bytes(), &body);
        let req = web_test::TestRequest::post()
            .uri("/webhook/github")
            .insert_header(("X-GitHub-Event", "workflow_job"))
            .insert_header(("X-GitHub-Delivery", format!("f{i}")))
            .insert_header(("X-Hub-Signature-256", sig))
            .set_payload(body);
        let r = web_test::call_service(&app, req.to_request()).await;
        assert!(
            matches!(r.status().as_u16(), 200 | 202 | 400 | 422),
            "{}",
            r.status()
        );
    }
    passed_on(&actor).await;
    addr.send(Stop).await.ok();
    for e in seen.lock().unwrap().iter() {
        assert!(
            e.job.key.job_id < 5,
            "only well-formed payloads are forwarded"
        );
    }
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

/// A form-encoded delivery (`payload=<url-encoded JSON>`, signed over the raw body) is accepted
/// like a JSON one; with a bad signature it is refused 401 before anything is decoded; one
/// without a `payload` field is 400.
#[actix_web::test]
async fn form_encoded_deliveries_are_verified_then_decoded() {
    let (addr, seen) = recorder(64);
    let (app, actor) = app!(addr);
    let form = |body: &str| serde_urlencoded::to_string([("payload", body)]).unwrap();
    let post = |id: &str, body: String, signature: String| {
        web_test::TestRequest::post()
            .uri("/webhook/github")
            .insert_header(("X-GitHub-Event", "workflow_job"))
            .insert_header(("X-GitHub-Delivery", id.to_string()))
            .insert_header((
                "Content-Type",
                "application/x-www-form-urlencoded; charset=utf-8",
            ))
            .insert_header(("X-Hub-Signature-256", signature))
            .set_payload(body)
            .to_request()
    };
    let body = form(&queued_body(21, "queued"));
    let good = sign(SECRET.as_bytes(), body.as_bytes());
    let r = web_test::call_service(&app, post("form-1", body.clone(), good)).await;
    assert_eq!(r.status(), 202);
    let bad = sign(b"another secret", body.as_bytes());
    let r = web_test::call_service(&app, post("form-2", body, bad)).await;
    assert_eq!(r.status(), 401);
    let empty = "other=1".to_string();
    let signed_empty = sign(SECRET.as_bytes(), empty.as_bytes());
    let r = web_test::call_service(&app, post("form-3", empty, signed_empty)).await;
    assert_eq!(r.status(), 400);
    passed_on(&actor).await;
    addr.send(Stop).await.ok();
    let events = seen.lock().unwrap().clone();
    assert_eq!(events.len(), 1);
    assert_eq!(events[0].job.key.job_id, 21);
    assert_eq!(remembered(&actor).await, 1);
}

/// What a payload may carry is bounded: a delivery id is a GUID-like token, a job has at most
/// 64 labels of at most 256 bytes, and a body over the limit is refused even when its length is
/// not declared up front. Each refusal changes nothing.
#[actix_web::test]
async fn oversized_ids_labels_and_bodies_are_refused_and_change_nothing() {
    let (addr, seen) = recorder(64);
    let (app, actor) = app!(addr);
    let call = |req: web_test::TestRequest| {
        let app = &app;
        async move {
            web_test::call_service(app, req.to_request())
                .await
                .status()
                .as_u16()
        }
    };
    let body = queued_body(1, "queued");
    let long_id = "a".repeat(1024);
    assert_eq!(call(signed("workflow_job", &long_id, &body)).await, 400);
    assert_eq!(call(signed("workflow_job", "d/../x", &body)).await, 400);
    let labels: Vec<String> = (0..70).map(|i| format!("\"l{i}\"")).collect();
    let many = body.replace(
        r#"["self-hosted","linux"]"#,
        &format!("[{}]", labels.join(",")),
    );
    assert_eq!(call(signed("workflow_job", "d2", &many)).await, 422);
    let long_label = body.replace("\"linux\"", &format!("\"{}\"", "x".repeat(300)));
    assert_eq!(call(signed("workflow_job", "d3", &long_label)).await, 422);
    // An event the daemon does not handle is answered unread, signed or not.
    assert_eq!(
        call(delivery(
            "push",
            "d4",
            "{}",
            Some(format!("sha256={}", "0".repeat(64)))
        ))
        .await,
        200
    );
    assert_eq!(call(delivery("push", "d5", "{}", None)).await, 401);
    passed_on(&actor).await;
    addr.send(Stop).await.ok();
    assert!(seen.lock().unwrap().is_empty());
    assert_eq!(remembered(&actor).await, 0);
}

/// The redelivery asks the intake which failed guids it never took, and is told which of those
/// it asked for came back (counted as recovered).
#[actix_web::test]
async fn the_intake_names_the_guids_it_never_took_and_counts_redeliveries_recovered() {
    use super::actor::{ExpectRedelivery, Unprocessed};
    let (addr, _) = recorder(64);
    let metrics = Metrics::new();
    let actor = WebhookActor::new(addr.clone().recipient(), None, metrics.clone()).start();
    let intake = web::Data::new(
        WebhookIntake::new(Secret::new(SECRET), actor.clone(), metrics.clone()).unwrap(),
    );
    let app = web_test::init_service(
        App::new().service(WebhookIntake::resource(intake, "/webhook/github")),
    )
    .await;
    let post =
        |id: &'static str| signed("workflow_job", id, &queued_body(7, "queued")).to_request();
    assert_eq!(
        web_test::call_service(&app, post("taken")).await.status(),
        202
    );
    let open = actor
        .send(Unprocessed(vec!["taken".into(), "lost".into()]))
        .await
        .unwrap();
    assert_eq!(open, vec!["lost".to_string()]);
    actor
        .send(ExpectRedelivery(vec!["lost".into(), "never".into()]))
        .await
        .unwrap();
    assert_eq!(
        web_test::call_service(&app, post("lost")).await.status(),
        202
    );
    let recovered = || {
        metrics
            .webhook_redeliveries
            .with_label_values(&["recovered"])
            .get()
    };
    assert_eq!(recovered(), 1);
    // A replay of it is not counted again.
    web_test::call_service(&app, post("lost")).await;
    assert_eq!(recovered(), 1);
}

/// A `queued` job no pool of this host covers is accepted and handed over, but never made
/// durable: it could not be claimed here, so a crash loses nothing with it.
#[actix_web::test]
async fn a_job_no_pool_covers_is_accepted_without_a_durable_record() {
    let dir = tempfile::tempdir().unwrap();
    let (store, _) = Store::open(dir.path()).unwrap();
    let (addr, seen) = recorder(64);
    let actor = WebhookActor::new(
        addr.clone().recipient(),
        Some(store.clone()),
        Metrics::new(),
    )
    .with_coverage([crate::vocab::LabelSet::new(&[
        "self-hosted".to_string(),
        "linux".to_string(),
    ])])
    .start();
    let intake = web::Data::new(
        WebhookIntake::new(Secret::new(SECRET), actor.clone(), Metrics::new()).unwrap(),
    );
    let app = web_test::init_service(
        App::new().service(WebhookIntake::resource(intake.clone(), "/webhook/github")),
    )
    .await;
    let covered = queued_body(300, "queued");
    let uncovered = queued_body(301, "queued").replace("\"linux\"", "\"gpu\"");
    for (i, body) in [covered, uncovered].iter().enumerate() {
        let r = web_test::call_service(
            &app,
            signed("workflow_job", &format!("c{i}"), body).to_request(),
        )
        .await;
        assert_eq!(r.status(), 202);
    }
    assert_eq!(
        seen.lock().unwrap().len(),
        2,
        "both handed to the scheduler"
    );
    actor.send(Close).await.unwrap();
    drop((store, app, intake));
    let ids = stored_job_ids(dir.path()).await;
    assert_eq!(ids, vec![300], "only the covered job has a row");
}

/// Several targets: a delivery is verified with the secret of the owner it names. A's secret
/// naming B is a 401 that hands nothing over; B's own is accepted; a body naming an owner no
/// target has is refused without a hash (no target claims it: issue 52, item 7).
#[actix_web::test]
async fn a_targets_secret_speaks_only_for_its_owner() {
    let (addr, seen) = recorder(64);
    let actor = WebhookActor::new(addr.clone().recipient(), None, Metrics::new()).start();
    let keys = [
        ("acme".to_string(), Secret::new("secret-a")),
        ("Beta".to_string(), Secret::new("secret-b")),
    ];
    let intake =
        web::Data::new(WebhookIntake::for_targets(keys, actor.clone(), Metrics::new()).unwrap());
    let app = web_test::init_service(
        App::new().service(WebhookIntake::resource(intake.clone(), "/webhook/github")),
    )
    .await;
    let naming = |owner: &str, id: u64| queued_body(id, "queued").replace("acme", owner);
    let send = |secret: &'static str, body: String, id: &'static str| {
        let sig = sign(secret.as_bytes(), body.as_bytes());
        delivery("workflow_job", id, &body, Some(sig)).to_request()
    };
    let cases = [
        ("secret-a", naming("beta", 1), "f1", 401),
        ("secret-b", naming("beta", 2), "f2", 202),
        ("secret-a", naming("acme", 3), "f3", 202),
        ("secret-b", naming("gamma", 4), "f4", 401),
        ("secret-c", naming("gamma", 5), "f5", 401),
    ];
    for (secret, body, id, want) in cases {
        let r = web_test::call_service(&app, send(secret, body, id)).await;
        assert_eq!(r.status().as_u16(), want, "{id}");
    }
    let ids = job_ids(&seen);
    assert_eq!(ids, vec![2, 3]);
    assert_eq!(
        remembered(&actor).await,
        2,
        "a refused delivery leaves no id"
    );
    assert_eq!(
        intake.hmacs(),
        3,
        "one per body its owner names, none for gamma's"
    );
}

/// A body read in one chunk is kept as it came; one of several is gathered in order.
#[test]
fn a_body_s_chunks_are_gathered_in_order() {
    let mut one = super::Gather::default();
    one.push(web::Bytes::from_static(b"whole"));
    assert_eq!(&one.finish()[..], b"whole");
    let mut many = super::Gather::default();
    for part in [&b"a"[..], b"bc", b"", b"def"] {
        many.push(web::Bytes::copy_from_slice(part));
    }
    assert_eq!(&many.finish()[..], b"abcdef");
    assert!(super::Gather::default().finish().is_empty());
}

mod handoff;
mod one_key;
