//! Fleet mode in the core: the ledger's refusals and another host's releases.

use crate::job::JobAction;
use std::time::Duration;

use super::{
    fleet::{OFFER_STEP_FOR_ELSEWHERE, OFFER_STEP_FOR_LOAD, OFFER_STEP_PER_EXTRA_LABEL},
    tests::{at, core},
    *,
};
use crate::{
    cluster::{Acquire, PACED_WINDOW, Released},
    scheduler::fixtures::job,
};

const LABELS: &[&str] = &["self-hosted", "linux"];

fn released(id: u64, attempts: i32, next_attempt: i64) -> Released {
    Released {
        info: job(id, LABELS),
        attempts,
        first_failure: Some(1_800_000_000),
        next_attempt: Some(next_attempt),
        class: Some("server_side".into()),
        last_error: Some("502".into()),
    }
}

#[test]
fn a_job_another_host_holds_gives_its_slot_back_and_is_left_alone() {
    let (mut s, t0) = core();
    let fx = s.on_job_event(JobAction::Queued, job(1, LABELS), None, t0, at(t0, 0));
    assert!(matches!(fx[..], [Effect::Claim { .. }]));
    let fx = s.on_acquire_refused(
        JobKey::new("acme", 1),
        PoolName::from("local"),
        Acquire::HeldBy("h2".into()),
        at(t0, 1),
    );
    assert_eq!(fx, vec![]);
    let rec = s.view().job(&JobKey::new("acme", 1)).unwrap();
    assert_eq!(*rec.phase(), Phase::Seen);
    assert!(
        rec.timeline()
            .iter()
            .any(|e| e.note == Note::HeldElsewhere { host: "h2".into() })
    );
    assert_eq!(s.view().status(at(t0, 1)).runners, 0, "no slot is held");
}

#[test]
fn a_paced_claim_waits_at_the_front_and_wakes_when_the_fleet_allows() {
    let (mut s, t0) = core();
    s.on_job_event(JobAction::Queued, job(1, LABELS), None, t0, at(t0, 0));
    let fx = s.on_acquire_refused(
        JobKey::new("acme", 1),
        PoolName::from("local"),
        Acquire::Paced {
            wait: Duration::from_secs(20),
            why: PACED_WINDOW,
        },
        at(t0, 1),
    );
    assert_eq!(
        fx,
        vec![Effect::ArmTimer {
            at: Some(t0 + Duration::from_secs(21))
        }]
    );
    assert_eq!(
        *s.view().job(&JobKey::new("acme", 1)).unwrap().phase(),
        Phase::Pending
    );
    let fx = s.on_timer(at(t0, 21));
    assert!(matches!(fx[..], [Effect::Claim { .. }]), "{fx:?}");
}

#[test]
fn a_released_job_comes_back_with_its_ladder() {
    let (mut s, t0) = core();
    // Its next attempt is 5 s away: it waits for it, with its attempts and first failure.
    let fx = s.readmit(released(1, 2, 1_800_000_005), "h2".into(), at(t0, 0));
    assert_eq!(
        fx,
        vec![Effect::ArmTimer {
            at: Some(t0 + Duration::from_secs(5))
        }]
    );
    let rec = s.view().job(&JobKey::new("acme", 1)).unwrap();
    assert_eq!(*rec.phase(), Phase::Retrying);
    assert_eq!(rec.ladder_left(), None, "its count is on the ladder");
    let q = s.view().retry_queue(at(t0, 0));
    assert_eq!((q.depth, q.items[0].attempts), (1, 2));
    assert!(rec.timeline().iter().any(|e| e.note
        == Note::Released {
            by: "h2".into(),
            attempts: 2
        }));
    let fx = s.on_timer(at(t0, 5));
    assert!(matches!(fx[0], Effect::Claim { .. }), "{fx:?}");
}

#[test]
fn a_release_without_failures_is_a_fresh_admission_and_repeats_are_free() {
    let (mut s, t0) = core();
    let fx = s.readmit(released(1, 0, 0), "h2".into(), at(t0, 0));
    assert!(matches!(fx[..], [Effect::Claim { .. }]), "{fx:?}");
    // The same release heard again while the claim is out changes nothing.
    assert_eq!(s.readmit(released(1, 0, 0), "h3".into(), at(t0, 1)), vec![]);
    // A job no pool here covers is not admitted.
    assert_eq!(
        s.readmit(
            Released {
                info: job(2, &["gpu"]),
                ..released(2, 0, 0)
            },
            "h2".into(),
            at(t0, 1)
        ),
        vec![]
    );
}

#[test]
fn a_job_delivered_to_another_host_is_offered_to_it_first() {
    let (mut s, t0) = core();
    let local = PoolName::from("local");
    s.on_job_event(JobAction::Queued, job(1, LABELS), None, t0, at(t0, 0));
    s.on_fleet_job_event(JobAction::Queued, job(2, LABELS), at(t0, 0));
    let here = s
        .state
        .offer_delay(&s.setup, &JobKey::new("acme", 1), &local);
    let there = s
        .state
        .offer_delay(&s.setup, &JobKey::new("acme", 2), &local);
    assert_eq!(there - here, OFFER_STEP_FOR_ELSEWHERE);
    assert!(
        OFFER_STEP_FOR_ELSEWHERE > OFFER_STEP_FOR_LOAD,
        "even a busy receiver asks first"
    );
}

#[test]
fn a_grant_heard_from_another_host_stops_this_one_asking() {
    let (mut s, t0) = core();
    // A claim waiting out its offer delay: the notice is kept for it, once.
    let fx = s.on_fleet_job_event(JobAction::Queued, job(1, LABELS), at(t0, 0));
    assert!(matches!(fx[..], [Effect::Claim { .. }]), "{fx:?}");
    let key = JobKey::new("acme", 1);
    assert_eq!(
        s.on_held_elsewhere(key.clone(), "h2".into(), at(t0, 0)),
        vec![]
    );
    assert_eq!(s.state.take_held_notice(&key), Some("h2".into()));
    assert_eq!(s.state.take_held_notice(&key), None);
    // A job waiting for a slot is left alone, as when the ledger answers "held".
    let mut id = 2;
    while !s
        .on_fleet_job_event(JobAction::Queued, job(id, LABELS), at(t0, 0))
        .is_empty()
    {
        id += 1;
    }
    let waiting = JobKey::new("acme", id);
    assert_eq!(*s.view().job(&waiting).unwrap().phase(), Phase::Pending);
    s.on_held_elsewhere(waiting.clone(), "h3".into(), at(t0, 1));
    let rec = s.view().job(&waiting).unwrap();
    assert_eq!(*rec.phase(), Phase::Seen);
    assert!(
        rec.timeline()
            .iter()
            .any(|e| e.note == Note::HeldElsewhere { host: "h3".into() })
    );
    assert_eq!(s.state.take_held_notice(&waiting), None);
}

/// Fleet mode: the offer delay is the core's to wait out, on its one timer; a host heard to
/// hold the job meanwhile means this one never asks the ledger.
#[test]
fn a_fleet_claim_waits_out_its_offer_delay_on_the_one_timer() {
    let mut settings = super::tests::settings();
    settings.fleet = true;
    let (mut s, t0, _) = super::tests::core_with(settings);
    let when = |at: crate::clock::Instant| Now::whole_seconds(at, super::tests::UNIX0);
    let claims = |fx: &[Effect]| {
        fx.iter()
            .filter(|e| matches!(e, Effect::Claim { .. }))
            .count()
    };
    // The pool has a label over the job's and a slot in use once the claim starts: the
    // delay is a label step and a load step.
    let fx = s.on_job_event(JobAction::Queued, job(1, LABELS), None, t0, at(t0, 0));
    assert_eq!(claims(&fx), 0, "claimed before the offer delay: {fx:?}");
    let due = t0 + OFFER_STEP_PER_EXTRA_LABEL + OFFER_STEP_FOR_LOAD.mul_f64(0.25);
    assert!(
        fx.contains(&Effect::ArmTimer { at: Some(due) }),
        "the one timer is armed for the offer: {fx:?}"
    );
    assert_eq!(claims(&s.on_timer(at(t0, 0))), 0, "not due yet");
    assert_eq!(claims(&s.on_timer(when(due))), 1, "due: the claim goes out");

    // A second job, heard held by another host while its offer waits: never claimed here.
    let fx = s.on_job_event(JobAction::Queued, job(2, LABELS), None, due, when(due));
    assert_eq!(claims(&fx), 0);
    let fx = s.on_held_elsewhere(JobKey::new("acme", 2), "h2".into(), when(due));
    assert_eq!(fx, vec![]);
    let later = due + Duration::from_secs(1);
    assert_eq!(claims(&s.on_timer(when(later))), 0);
    let rec = s.view().job(&JobKey::new("acme", 2)).unwrap();
    assert_eq!(*rec.phase(), Phase::Seen);
    assert!(
        rec.timeline()
            .iter()
            .any(|e| e.note == Note::HeldElsewhere { host: "h2".into() })
    );
}
