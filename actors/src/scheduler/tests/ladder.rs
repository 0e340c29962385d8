//! The retry ladder through the real fire path: the `RetryActor`'s timer, readings reaching the
//! core through the rate actor's book, the scheduler's mailbox. The ladder's decisions (rungs,
//! snaps, stale readings, `Retry-After`, what stops retries) are tested at the core
//! (`core/ladder_tests.rs`).

use std::time::Duration;

use super::*;

/// The seed's ladder bug, through the real fire path: 30s, 1m, 2m, 2m, then given up at
/// max_age and parked; the first failure's time is kept across fires. Nothing is claimed
/// until the parked job is looked at (GitHub asked 30 min later): gone, it is done with.
#[actix_rt::test]
async fn ladder_climbs_through_the_fire_path_and_gives_up_at_max_age() {
    let h = harness(Setup {
        max_age: 300,
        otherwise: Some(http(502, None, None)),
        ..Setup::default()
    })
    .await;
    h.queued(1, LINUX).await;
    h.run_for(Duration::from_secs(400)).await;
    let offsets = h.claim_offsets();
    assert_eq!(offsets, vec![0, 30, 90, 210, 330], "gaps 30s, 1m, 2m, 2m");
    assert_eq!(h.metrics.retry_given_up.get(), 1);
    assert_eq!(
        h.metrics
            .retry_attempts
            .with_label_values(&["server_side"])
            .get(),
        4
    );
    assert!(
        matches!(
            h.phase(1).await,
            Phase::Parked {
                reason: ParkReason::GaveUp,
                ..
            }
        ),
        "{:?}",
        h.phase(1).await
    );
    let (q, armed) = h.ladder().await;
    // The ladder is empty; the one timer waits for the parked job's next look.
    assert_eq!((q.depth, q.items.len(), armed), (0, 0, 1));
    let st = h.state().await;
    let timeline: Vec<Note> = st.jobs[0].timeline.iter().map(|e| e.note.clone()).collect();
    assert!(
        timeline.iter().any(|n| matches!(
            n,
            Note::RetryScheduled { attempt: 4, delay, .. } if *delay == Duration::from_secs(120)
        )),
        "{timeline:#?}"
    );
    assert!(
        timeline
            .iter()
            .any(|n| matches!(n, Note::Abandoned(Abandon::GaveUp { attempts: 5, .. }))),
        "{timeline:#?}"
    );
    h.run_for(Duration::from_secs(1500)).await;
    assert_eq!(h.claims(), 5, "nothing after giving up, before the look");
    h.gh.lock().unwrap().job_status = "completed".into();
    h.run_for(Duration::from_secs(3600)).await;
    assert_eq!(h.claims(), 5, "GitHub says it completed: nothing more");
    let st = h.state().await;
    let job = st.jobs.iter().find(|j| j.key.job_id == 1);
    assert!(
        job.is_none_or(|j| j.phase == Phase::Done),
        "done with (and pruned later): {job:?}"
    );
}

/// A budget a fresh reading proves empty is not spent: a job queued meanwhile waits for the
/// reset before its first claim.
#[actix_rt::test]
async fn no_claim_is_sent_into_a_budget_the_reading_proves_empty() {
    let offsets = claim_offsets_for(Vec::new(), Some((0, 90, 0)), 200).await;
    assert_eq!(offsets, vec![91]);
}

#[actix_rt::test]
async fn retry_after_never_spends_a_budget_the_reading_proves_empty() {
    let offsets = claim_offsets_for(
        vec![Err(http(429, Some(0), Some(7)))],
        Some((0, 90, 0)),
        200,
    )
    .await;
    assert!(
        offsets.len() == 2 && (95..115).contains(&offsets[1]),
        "retry at reset + [5s, 25s), not after 7 s: {offsets:?}"
    );
}

#[actix_rt::test]
async fn the_same_job_delivered_five_times_at_once_is_claimed_once() {
    let h = harness(Setup::default()).await;
    for _ in 0..5 {
        h.sched
            .try_send(event(JobAction::Queued, job(3, LINUX)))
            .unwrap();
    }
    h.run_for(Duration::from_secs(1)).await;
    assert_eq!(h.claims(), 1);
    assert_eq!(h.provisioned.lock().unwrap().len(), 1);
}

/// 10,000 parked jobs hold exactly one armed timer, and all fire when due.
#[actix_rt::test]
async fn ten_thousand_parked_jobs_arm_one_timer() {
    let h = harness(Setup {
        max_concurrent: 20_000,
        providers: vec![(ProviderKind::Local, vec!["self-hosted", "linux"], 20_000)],
        claims_per_minute: 1_000_000,
        otherwise: Some(http(502, None, None)),
        ..Setup::default()
    })
    .await;
    for id in 0..10_000u64 {
        h.queued(id, LINUX).await;
    }
    h.run_for(Duration::from_secs(1)).await;
    let (q, armed) = h.ladder().await;
    assert_eq!((q.depth, armed), (10_000, 1));
    let timer = h.retry.send(GetRetryTimer).await.unwrap();
    assert!(
        timer
            .next_due_in_secs
            .is_some_and(|s| (28.0..=30.0).contains(&s)),
        "{timer:?}"
    );
    assert_eq!(h.metrics.retry_queue_depth.get(), 10_000);
    h.run_for(Duration::from_secs(30)).await;
    assert_eq!(h.claims(), 20_000, "every parked job tried again once");
}
