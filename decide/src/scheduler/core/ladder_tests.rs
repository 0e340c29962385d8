//! The claim retry ladder at the core, each effect carried out by the test driver: a retry
//! that fails again keeps its item, rate readings snap a retry to the reset (fresh ones only),
//! `Retry-After` is obeyed, a job seen running leaves the ladder, refusals are not retried.

use super::{ParkReason, Phase, driver::Driver};
use crate::{
    github::GithubError,
    job::{JobAction, JobInfo, JobKey},
    scheduler::fixtures::{http, job, limited},
};

const LABELS: &[&str] = &["self-hosted", "linux"];

/// The claim times of one job queued at 0, answered `script` first, after `secs`.
fn claim_times(script: Vec<GithubError>, reading: Option<(u64, u64, u64)>, secs: u64) -> Vec<u64> {
    let mut d = Driver::new();
    d.script = script.into();
    if let Some((remaining, reset_in, age)) = reading {
        d.read_rates(remaining, reset_in, age);
    }
    d.queued(1, LABELS);
    d.advance(secs);
    d.claim_times(1)
}

#[test]
fn a_retry_that_fails_again_stays_and_a_success_drops_it() {
    let mut d = Driver::new();
    d.script = vec![http(502, None, None), http(503, None, None)].into();
    d.queued(1, LABELS);
    d.advance(45);
    let q = d.s.view().retry_queue(d.state_now());
    assert_eq!(
        (q.depth, q.items[0].attempts),
        (1, 2),
        "the failed retry is back"
    );
    d.advance(600);
    assert_eq!(d.claim_times(1), vec![0, 30, 90]);
    assert!(matches!(d.phase(1), Phase::Active { .. }));
    let q = d.s.view().retry_queue(d.state_now());
    assert_eq!(
        (q.depth, q.items.len(), q.items[0].attempts),
        (0, 1, 2),
        "a claimed runner holds the item (in flight) until the job is seen running"
    );
    d.send(JobAction::InProgress, job(1, LABELS));
    let q = d.s.view().retry_queue(d.state_now());
    assert_eq!((q.depth, q.items.len()), (0, 0), "a started job drops it");
    let rec = d.s.view().job(&JobKey::new("acme", 1)).unwrap();
    assert_eq!(
        rec.ladder_left().map(|(n, _)| n),
        Some(2),
        "its history stays"
    );
}

#[test]
fn an_empty_budget_snaps_the_retry_to_the_reset() {
    let times = claim_times(vec![limited(403, 90)], None, 200);
    assert_eq!(times.len(), 2, "{times:?}");
    assert!(
        (95..115).contains(&times[1]),
        "reset + [5s, 25s): {times:?}"
    );
}

/// A budget a fresh reading in the rate book proves empty is not spent: a job queued meanwhile
/// waits for the reset before its first claim.
#[test]
fn no_claim_is_sent_into_a_budget_the_book_proves_empty() {
    assert_eq!(claim_times(Vec::new(), Some((0, 90, 0)), 200), vec![91]);
}

#[test]
fn a_stale_reading_falls_back_to_the_ladder() {
    let times = claim_times(vec![http(403, Some(0), None)], Some((0, 90, 600)), 200);
    assert_eq!(times, vec![0, 30]);
}

#[test]
fn retry_after_is_obeyed() {
    assert_eq!(
        claim_times(vec![http(429, Some(10), Some(7))], None, 200),
        vec![0, 7]
    );
}

/// A failed answer's own reading holds the next claims before the rate actor's book has it:
/// a second job queued right after waits for the reset too.
#[test]
fn the_failed_answer_s_own_reading_holds_the_other_claims() {
    let mut d = Driver::new();
    d.script = vec![limited(403, 60)].into();
    d.queued(1, LABELS);
    d.advance(1);
    d.queued(2, LABELS);
    d.advance(30);
    assert!(d.claim_times(2).is_empty(), "job 2 waits for the reset");
    d.advance(60);
    assert_eq!(d.claim_times(2), vec![61]);
}

#[test]
fn in_progress_or_completed_while_retrying_stops_the_retries() {
    let mut d = Driver::new();
    d.script = std::iter::repeat_with(|| http(502, None, None))
        .take(50)
        .collect();
    d.queued(1, LABELS);
    d.queued(2, LABELS);
    d.advance(5);
    assert_eq!(d.claims.len(), 2);
    let elsewhere = JobInfo {
        runner_name: Some("someone-else".into()),
        ..job(1, LABELS)
    };
    d.send(JobAction::InProgress, elsewhere);
    let cancelled = JobInfo {
        conclusion: Some("cancelled".into()),
        ..job(2, LABELS)
    };
    d.send(JobAction::Completed, cancelled);
    d.advance(3600);
    assert_eq!(
        d.claims.len(),
        2,
        "no claim after the job was seen elsewhere"
    );
    let q = d.s.view().retry_queue(d.state_now());
    assert_eq!((q.depth, q.items.len()), (0, 0));
    assert_eq!((d.phase(1), d.phase(2)), (Phase::Done, Phase::Done));
}

#[test]
fn not_found_and_validation_failures_are_not_retried() {
    let mut d = Driver::new();
    d.script = vec![http(404, Some(10), None), http(422, Some(10), None)].into();
    d.queued(1, LABELS);
    d.advance(1);
    d.queued(2, LABELS);
    d.advance(300);
    assert_eq!(d.claims.len(), 2);
    assert!(d.s.view().retry_queue(d.state_now()).items.is_empty());
    for id in [1, 2] {
        assert!(
            matches!(
                d.phase(id),
                Phase::Parked {
                    reason: ParkReason::NotRetryable,
                    ..
                }
            ),
            "{:?}",
            d.phase(id)
        );
    }
}

#[test]
fn a_label_mismatched_job_delivered_ten_times_costs_nothing() {
    let mut d = Driver::new();
    for _ in 0..10 {
        d.queued(9, &["self-hosted", "gpu"]);
    }
    assert!(d.claims.is_empty() && d.deletes.is_empty());
    let st = d.state();
    let j = &st.jobs[0];
    assert!(j.seen && !j.pending, "{j:?}");
    assert_eq!(j.phase, Phase::Unroutable);
    assert_eq!(st.status.stats.duplicates, 9);
}

/// A runner GitHub refuses as too old exits 7: its job is no failure (no ladder item, nothing
/// counted against the pool) and is claimed again after 15 s, then 30 s for a second refusal
/// (the install is being updated meanwhile); an ordinary failure still climbs the ladder.
#[test]
fn a_runner_refused_as_too_old_is_claimed_again_after_a_wait_and_never_climbs_the_ladder() {
    let mut d = Driver::new();
    d.queued(1, LABELS);
    let first = d.runner_of(1);
    d.exited(&first, 7);
    let q = d.s.view().retry_queue(d.state_now());
    assert_eq!(q.depth, 0, "not on the ladder");
    let timeline = &d.s.view().job(&job(1, LABELS).key).unwrap().timeline();
    assert!(
        !timeline
            .iter()
            .any(|e| format!("{:?}", e.note).contains("EnvironmentFailed")),
        "{timeline:#?}"
    );
    d.advance(14);
    assert_eq!(d.claim_times(1), vec![0], "waits for the update");
    d.advance(2);
    assert_eq!(d.claim_times(1), vec![0, 15]);
    let second = d.runner_of(1);
    d.exited(&second, 7);
    d.advance(29);
    assert_eq!(d.claim_times(1), vec![0, 15], "the wait doubles");
    d.advance(2);
    assert_eq!(d.claim_times(1), vec![0, 15, 46]);
    assert_eq!(d.s.view().retry_queue(d.state_now()).depth, 0);
    // An ordinary failure before the job started still climbs.
    let third = d.runner_of(1);
    d.exited(&third, 1);
    assert_eq!(d.s.view().retry_queue(d.state_now()).depth, 1);
}
