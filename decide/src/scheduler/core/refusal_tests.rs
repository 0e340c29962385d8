//! GitHub refusing runners as too old (exit code 7): an old install's jobs wait their own
//! doubling waits; in an outage (the install is the newest release) a pool's refused jobs are
//! held and one probes the service at a time, on a short bounded backoff.

use super::{driver::Driver, refusal::PROBE_WAIT_MAX};
use crate::{
    config::PoolName,
    job::{JobAction, JobInfo},
    scheduler::fixtures::job,
};

const LABELS: &[&str] = &["self-hosted", "linux"];
const NEWEST: Option<&str> = Some("2.330.0");

fn on(runner: &str, id: u64) -> JobInfo {
    JobInfo {
        runner_name: Some(runner.into()),
        ..job(id, LABELS)
    }
}

/// The pool's `status` line about a refusal.
fn refusal(d: &Driver) -> Option<String> {
    let status = d.s.view().status(d.state_now());
    let local = PoolName::from("local");
    let pool = status.providers.iter().find(|p| p.provider == local);
    pool.and_then(|p| p.refusal.clone())
}

/// The job whose claim is the newest, and its runner.
fn last_claimed(d: &Driver) -> (u64, String) {
    let id = d.claims.last().expect("a claim").0.job_id;
    (id, d.runner_of(id))
}

/// Three jobs refused in an outage: one of them at a time is claimed again, 1 s after the
/// refusals, then 2, 4 and 5 s after each refused probe (never longer). When GitHub takes a
/// probe's runner again, every job still held is claimed at once; nothing climbs the ladder.
#[test]
fn an_outage_holds_the_pools_refused_jobs_and_one_of_them_at_a_time_probes() {
    let mut d = Driver::new();
    for id in 1..=3 {
        d.queued(id, LABELS);
    }
    for id in 1..=3 {
        let runner = d.runner_of(id);
        d.refused(&runner, NEWEST);
    }
    assert_eq!(d.claims.len(), 3);
    let line = refusal(&d).expect("a status line");
    assert!(
        line.starts_with("GitHub refuses runner 2.330.0, the newest release: likely an outage"),
        "{line}"
    );
    assert!(line.contains("3 jobs wait"), "{line}");
    let mut probes = Vec::new();
    for _ in 0..5 {
        let before = d.claims.len();
        let start = d.now;
        while d.claims.len() == before {
            d.advance(1);
            assert!(d.now - start <= PROBE_WAIT_MAX.as_secs(), "a probe in time");
        }
        assert_eq!(d.claims.len(), before + 1, "one probe at a time");
        probes.push(d.now - start);
        let (_, runner) = last_claimed(&d);
        d.refused(&runner, NEWEST);
    }
    assert_eq!(probes, [1, 2, 4, 5, 5], "the waits before each probe");
    // The jobs take turns probing.
    let probed: Vec<u64> = d.claims[3..].iter().map(|(k, _)| k.job_id).collect();
    assert_eq!(probed, [1, 2, 3, 1, 2]);
    assert!(refusal(&d).unwrap().contains("5 probes refused"));

    // The service is back: the next probe's runner takes a job.
    d.advance(5);
    assert_eq!(d.claims.len(), 9);
    let (id, runner) = last_claimed(&d);
    let before = d.claims.len();
    d.send(JobAction::InProgress, on(&runner, id));
    let claimed_now: Vec<u64> = d.claims[before..]
        .iter()
        .filter(|(_, at)| *at == d.now)
        .map(|(k, _)| k.job_id)
        .collect();
    assert_eq!(
        claimed_now.len(),
        2,
        "the two held jobs are claimed at once"
    );
    assert!(!claimed_now.contains(&id));
    assert_eq!(refusal(&d), None, "the outage is over");
    assert_eq!(d.s.view().ladder_depth(), 0, "nothing on the ladder");
}

/// A refusal the shell did not call an outage (an old install, updated meanwhile): the job
/// is claimed again after 15 s, then 30 s, never sooner, and no status line is shown.
#[test]
fn an_old_install_s_refused_job_waits_its_own_doubling_wait() {
    let mut d = Driver::new();
    d.queued(1, LABELS);
    let runner = d.runner_of(1);
    d.refused(&runner, None);
    assert_eq!(refusal(&d), None);
    d.advance(14);
    assert_eq!(d.claim_times(1), [0]);
    d.advance(1);
    assert_eq!(d.claim_times(1), [0, 15]);
    let runner = d.runner_of(1);
    d.refused(&runner, None);
    d.advance(30);
    assert_eq!(d.claim_times(1), [0, 15, 45]);
}

/// A job refused before the shell knew of the outage waits with the pool's others: its own
/// 15-s wait ending claims nothing while the probe is out.
#[test]
fn a_job_refused_before_the_outage_was_known_waits_for_the_probes() {
    let mut d = Driver::new();
    d.queued(1, LABELS);
    d.queued(2, LABELS);
    let first = d.runner_of(1);
    d.refused(&first, None);
    d.advance(1);
    let second = d.runner_of(2);
    d.refused(&second, NEWEST);
    d.advance(1);
    assert_eq!(d.claim_times(1), [0, 2], "the oldest held job probes");
    // Its probe's runner is up, neither refused nor seen with a job yet.
    d.advance(20);
    assert_eq!(d.claim_times(1), [0, 2]);
    assert_eq!(d.claim_times(2), [0], "held while the probe is out");
    let (id, runner) = last_claimed(&d);
    d.send(JobAction::InProgress, on(&runner, id));
    assert_eq!(d.claim_times(2), [0, d.now]);
}

/// A pool in an outage whose held jobs are all gone (cancelled on GitHub) forgets the outage at
/// its next probe: no status line, nothing claimed.
#[test]
fn an_outage_with_no_job_left_waiting_is_forgotten() {
    let mut d = Driver::new();
    d.queued(1, LABELS);
    let runner = d.runner_of(1);
    d.refused(&runner, NEWEST);
    assert!(refusal(&d).is_some());
    let cancelled = JobInfo {
        conclusion: Some("cancelled".into()),
        ..job(1, LABELS)
    };
    d.send(JobAction::Completed, cancelled);
    d.advance(PROBE_WAIT_MAX.as_secs());
    assert_eq!(refusal(&d), None);
    assert_eq!(d.claim_times(1), [0]);
}
