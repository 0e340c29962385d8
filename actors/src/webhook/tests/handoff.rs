//! The hand-over to the scheduler under pressure: a full scheduler's mailbox, what the outbox
//! holds meanwhile, and a closed intake.

use super::*;

/// Deliveries that need no record are answered on the worker and reach the scheduler through
/// the outbox. When the scheduler's mailbox is full, what was answered 202 waits in the outbox
/// (nothing is dropped) and later deliveries are answered 503, their ids unrecorded; the same
/// delivery redelivered once the scheduler has room is accepted.
#[actix_web::test]
async fn a_full_scheduler_mailbox_is_503_and_the_redelivery_gets_through() {
    let (addr, seen) = recorder(1);
    addr.send(Stall).await.unwrap();
    let (app, actor) = app!(addr);
    let send = |i: u64| {
        let body = queued_body(100 + i, "queued");
        signed("workflow_job", &format!("s{i}"), &body).to_request()
    };
    for i in 0..8 {
        let r = web_test::call_service(&app, send(i)).await;
        assert_eq!(r.status(), 202, "before the outbox is flushed");
    }
    // The flush hands what fits to the stalled scheduler's mailbox; the rest stays.
    passed_on(&actor).await;
    for i in 8..10 {
        let r = web_test::call_service(&app, send(i)).await;
        assert_eq!(r.status(), 503, "the scheduler is full");
    }
    assert_eq!(
        remembered(&actor).await,
        8,
        "a 503 leaves its delivery id unrecorded"
    );
    assert!(seen.lock().unwrap().is_empty());

    // The same delivery id, redelivered once the scheduler has room, is accepted.
    let (addr2, seen2) = recorder(64);
    let (app2, actor2) = app!(addr2);
    let (app2, actor2) = (app2, actor2);
    let r = web_test::call_service(&app2, send(9)).await;
    assert_eq!(r.status(), 202);
    passed_on(&actor2).await;
    addr2.send(Stop).await.ok();
    assert_eq!(seen2.lock().unwrap().len(), 1);
}

/// What the outbox holds when the scheduler had no room is passed on, in order, once it has:
/// a delivery answered 202 is never dropped.
#[actix_web::test]
async fn deliveries_held_for_a_full_scheduler_reach_it_in_order() {
    struct Slow {
        seen: Arc<StdMutex<Vec<JobEvent>>>,
    }
    impl Actor for Slow {
        type Context = Context<Self>;
        fn started(&mut self, ctx: &mut Context<Self>) {
            ctx.set_mailbox_capacity(1);
        }
    }
    impl Handler<JobEvent> for Slow {
        type Result = ();
        fn handle(&mut self, m: JobEvent, ctx: &mut Context<Self>) {
            self.seen.lock().unwrap().push(m);
            // A slow scheduler: it reads its next message 20 ms later.
            ctx.wait(actix::fut::wrap_future(tokio::time::sleep(
                Duration::from_millis(20),
            )));
        }
    }
    let seen = Arc::new(StdMutex::new(Vec::new()));
    let addr = Slow { seen: seen.clone() }.start();
    let (app, _) = app!(addr);
    let completed = |i: u64| {
        let body = queued_body(300 + i, "completed");
        signed("workflow_job", &format!("o{i}"), &body).to_request()
    };
    for i in 0..6u64 {
        assert_eq!(
            web_test::call_service(&app, completed(i)).await.status(),
            202
        );
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while seen.lock().unwrap().len() < 6 && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let ids = job_ids(&seen);
    assert_eq!(ids, (300..306).collect::<Vec<_>>());
}

/// With the store on, a delivery refused because the scheduler is full (503) leaves no store
/// row and no remembered delivery id. The one that found it full is accepted: its row is
/// durable and its event waits in the outbox for room, so it is not lost; the ones after it
/// are refused.
#[actix_web::test]
async fn a_503_leaves_no_store_row_and_no_delivery_id() {
    let dir = tempfile::tempdir().unwrap();
    let (store, _) = Store::open(dir.path()).unwrap();
    let (addr, _) = recorder(1);
    addr.send(Stall).await.unwrap();
    let (app, actor) = app!(addr, Some(store.clone()));
    let mut statuses = Vec::new();
    for i in 0..6u64 {
        let body = queued_body(200 + i, "queued");
        let r = web_test::call_service(
            &app,
            signed("workflow_job", &format!("x{i}"), &body).to_request(),
        )
        .await;
        statuses.push(r.status().as_u16());
    }
    let accepted = statuses.iter().take_while(|s| **s == 202).count();
    assert!(
        (1..6).contains(&accepted) && statuses[accepted..].iter().all(|s| *s == 503),
        "accepted until the scheduler was found full, refused after: {statuses:?}"
    );
    assert_eq!(remembered(&actor).await, accepted);

    // Close the intake and let go of the store, then read what it holds.
    actor.send(Close).await.unwrap();
    drop(store);
    drop(app);
    let mut ids = stored_job_ids(dir.path()).await;
    ids.sort_unstable();
    assert_eq!(
        ids,
        (200..200 + accepted as u64).collect::<Vec<_>>(),
        "only the accepted jobs have a row"
    );
}

/// A closed intake (an embedded instance shut down) answers 503 and records nothing.
#[actix_web::test]
async fn a_closed_intake_answers_503_and_records_nothing() {
    let (addr, seen) = recorder(64);
    let (app, actor) = app!(addr);
    actor.send(Close).await.unwrap();
    let body = queued_body(9, "queued");
    let r = web_test::call_service(&app, signed("workflow_job", "c1", &body).to_request()).await;
    assert_eq!(r.status(), 503);
    assert_eq!(remembered(&actor).await, 0);
    assert!(seen.lock().unwrap().is_empty());
}
