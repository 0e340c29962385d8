//! One ladder item per job across every failure path (claim, environment, runner gone before
//! the job started), each failure's own class deciding its delay, and untrusted numbers that
//! cannot break the ladder.

use crate::config::PoolName;
use std::time::Duration;

use super::*;

fn timeline(st: &SchedulerState, id: u64) -> Vec<Note> {
    st.jobs
        .iter()
        .find(|j| j.key.job_id == id)
        .map(|j| j.timeline.iter().map(|e| e.note.clone()).collect())
        .unwrap_or_default()
}

/// An environment that never comes up: one item climbs 30 s, 1 m, 2 m ... through the real
/// fire path, every attempt's registration is deleted, and `max_age` ends it.
#[actix_rt::test]
async fn an_environment_that_always_fails_climbs_one_item_until_max_age() {
    let h = harness(Setup {
        max_age: 300,
        provision_error: Some(ProvisionError::EnvironmentFailed("image broken".into())),
        ..Setup::default()
    })
    .await;
    h.queued(1, LINUX).await;
    // (Inside the seen TTL, so the job and its timeline are still remembered.)
    h.run_for(Duration::from_secs(340)).await;
    // 0, +30, +60, +120; the fifth failure (at 330 s) is past max_age (300 s).
    assert_eq!(h.claim_offsets(), vec![0, 30, 90, 210, 330]);
    assert_eq!(
        h.gh.lock().unwrap().deletes.len(),
        5,
        "each attempt's registration"
    );
    let st = h.state().await;
    let notes = timeline(&st, 1);
    let attempts: Vec<u32> = notes
        .iter()
        .filter_map(|n| match n {
            Note::RetryScheduled { attempt, .. } => Some(*attempt),
            _ => None,
        })
        .collect();
    assert_eq!(attempts, vec![1, 2, 3, 4], "one item: {notes:#?}");
    assert!(
        notes
            .iter()
            .any(|n| matches!(n, Note::Abandoned(Abandon::GaveUp { attempts: 5, .. }))),
        "{notes:#?}"
    );
    assert_eq!(h.metrics.retry_given_up.get(), 1);
    let local = &st.status.providers[0];
    assert_eq!(local.environment_failures, 5);
    assert!(local.up, "the pool itself is fine");
    assert_eq!(
        h.metrics
            .environment_failures
            .with_label_values(&["local"])
            .get(),
        5
    );
    let (q, armed) = h.ladder().await;
    // The ladder is empty; the one timer waits for the parked job's next look.
    assert_eq!((q.items.len(), armed), (0, 1));
}

/// An environment the engine rejects as invalid: one claim, one deletion, given up at once.
#[actix_rt::test]
async fn a_rejected_environment_is_given_up_at_once() {
    let h = harness(Setup {
        provision_error: Some(ProvisionError::Rejected("bad network mode".into())),
        ..Setup::default()
    })
    .await;
    h.queued(1, LINUX).await;
    h.run_for(Duration::from_secs(300)).await;
    assert_eq!(h.claims(), 1);
    assert_eq!(h.gh.lock().unwrap().deletes.len(), 1);
    assert_eq!(h.metrics.retry_given_up.get(), 1);
    assert!(matches!(h.phase(1).await, Phase::Parked { .. }));
    let notes = timeline(&h.state().await, 1);
    assert!(
        notes.iter().any(|n| matches!(
            n,
            Note::Abandoned(Abandon::NotRetryable(
                crate::vocab::ErrorClass::NonRetryable
            ))
        )),
        "{notes:#?}"
    );
}

/// A runner that exits with an error before it was seen with any job: the same item climbs.
#[actix_rt::test]
async fn a_runner_that_crashes_before_its_job_climbs_the_same_item() {
    let h = harness(Setup {
        script: vec![Err(http(502, None, None))],
        ..Setup::default()
    })
    .await;
    h.queued(1, LINUX).await;
    h.run_for(Duration::from_secs(31)).await;
    let st = h.state().await;
    let runner = st.runners[0].name.clone();
    h.sched
        .send(RunnerEvent {
            provider: PoolName::from("local"),
            name: runner,
            kind: RunnerEventKind::Exited {
                code: Some(3),
                reason: ExitReason::Exited,
                detail: None,
            },
        })
        .await
        .unwrap();
    h.run_for(Duration::from_secs(1)).await;
    let (q, _) = h.ladder().await;
    assert_eq!((q.depth, q.items[0].attempts), (1, 2), "{q:?}");
    h.run_for(Duration::from_secs(60)).await;
    assert_eq!(h.claim_offsets(), vec![0, 30, 91]);
}

/// A 502, then a 403 whose bucket is provably empty: the second retry waits for the reset
/// (this failure's class decides, not the first's).
#[actix_rt::test]
async fn a_rate_limit_after_a_502_snaps_to_the_reset() {
    let h = harness(Setup {
        script: vec![Err(http(502, None, None)), Err(limited(403, 120))],
        ..Setup::default()
    })
    .await;
    h.queued(1, LINUX).await;
    h.run_for(Duration::from_secs(300)).await;
    let offsets = h.claim_offsets();
    assert_eq!(offsets.len(), 3, "{offsets:?}");
    assert_eq!(offsets[1], 30, "a 502 climbs the ladder");
    assert!(
        (125..145).contains(&offsets[2]),
        "reset + [5s, 25s): {offsets:?}"
    );
    assert_eq!(
        h.metrics
            .retry_attempts
            .with_label_values(&["rate_limit"])
            .get(),
        1,
        "the attempt is counted under its own class"
    );
}

/// `Retry-After: 0` on a 503 is no reason to skip the ladder's spacing.
#[actix_rt::test]
async fn retry_after_zero_on_a_503_keeps_the_rung() {
    let offsets = claim_offsets_for(vec![Err(http(503, None, Some(0)))], None, 100);
    assert_eq!(offsets.await, vec![0, 30]);
}

/// Absurd numbers from the network: a `Retry-After` of 3,000 years and a reset in the year
/// 9999 neither panic nor park the job past `max_age` by more than a rung.
#[actix_rt::test]
async fn absurd_retry_after_and_reset_stay_within_max_age() {
    let h = harness(Setup {
        max_age: 600,
        script: vec![
            Err(http(503, None, Some(99_999_999_999))),
            Err(http(403, Some(0), None)),
        ],
        ..Setup::default()
    })
    .await;
    h.queued(1, LINUX).await;
    h.run_for(Duration::from_secs(1)).await;
    let notes = timeline(&h.state().await, 1);
    assert!(
        notes
            .iter()
            .any(|n| n.to_string().contains("retry #1 scheduled")
                && n.to_string().contains("in 630.0s")),
        "{notes:#?}"
    );
    let year_9999 = 253_402_300_799 - h.clock.unix();
    h.seed_rate(0, year_9999, 0).await;
    // Parked after giving up; its look finds it completed.
    h.gh.lock().unwrap().job_status = "completed".into();
    h.run_for(Duration::from_secs(5000)).await;
    let offsets = h.claim_offsets();
    // 503: clamped to max_age + rung 1 (630 s); the 403 at 630 is past max_age: given up.
    assert_eq!(offsets, vec![0, 630], "{offsets:?}");
    assert_eq!(h.metrics.retry_given_up.get(), 1);
}

/// `claim_retry.enabled = false`: a failed claim is not retried, and the job says why.
#[actix_rt::test]
async fn with_retries_disabled_a_failed_claim_stays_failed() {
    let h = harness(Setup {
        retry_enabled: false,
        script: vec![Err(http(502, None, None))],
        ..Setup::default()
    })
    .await;
    h.queued(1, LINUX).await;
    h.run_for(Duration::from_secs(300)).await;
    assert_eq!(h.claims(), 1);
    assert_eq!(h.phase(1).await, Phase::Seen);
    let notes = timeline(&h.state().await, 1);
    assert!(
        notes
            .iter()
            .any(|n| matches!(n, Note::Abandoned(Abandon::RetryDisabled))),
        "{notes:#?}"
    );
    let (q, armed) = h.ladder().await;
    assert_eq!((q.items.len(), armed), (0, 0));
}
