//! Registered warm runners at the core, each effect carried out by the test driver: the count
//! kept, a job served by a warm runner without a claim of its own, rotation after
//! `warm_max_age` (the old registration deleted before the new claim), cordon and drain,
//! runners that die at boot, and a time window.

use std::time::Duration;

use super::{SchedulerSettings, driver::Driver, tests::settings};
use crate::{
    config::{WarmConfig, WarmMode, warm::WarmWindow},
    job::{JobAction, JobInfo},
    scheduler::fixtures::job,
};

const LABELS: &[&str] = &["self-hosted", "linux"];

/// One pool (`local`, 4 slots) keeping `warm` registered runners, at most an hour old.
fn registered(warm: WarmConfig) -> SchedulerSettings {
    let mut s = settings();
    s.providers[0].warm = Some(WarmConfig {
        mode: WarmMode::Registered,
        max_age: Duration::from_secs(3600),
        ..warm
    });
    s
}

fn count(n: usize) -> SchedulerSettings {
    registered(WarmConfig {
        min: n,
        ..WarmConfig::default()
    })
}

/// The spares: runners registered and idle, no job waiting for them.
fn idle(d: &Driver) -> Vec<String> {
    d.s.view()
        .runners()
        .filter(|r| d.s.state.jobs.is_spare(r))
        .map(|r| r.name.clone())
        .collect()
}

fn on(runner: &str, id: u64) -> JobInfo {
    JobInfo {
        runner_name: Some(runner.into()),
        ..job(id, LABELS)
    }
}

/// The pool is kept at its count from the start; a job that comes is handed a warm runner
/// (no claim is made for it), and the count is made up again with one claim.
#[test]
fn a_job_takes_a_warm_runner_without_a_claim_and_the_count_is_made_up() {
    let mut d = Driver::with(count(2));
    assert_eq!(d.claims.len(), 2, "two warm runners claimed at once");
    assert!(d.claims.iter().all(|(k, _)| k.is_warm()));
    assert_eq!(idle(&d).len(), 2);
    d.queued(1, LABELS);
    assert!(d.claim_times(1).is_empty(), "the job's runner was warm");
    assert_eq!(d.claims.len(), 3, "one claim to make the count up");
    assert_eq!(idle(&d).len(), 2);
    // The runner handed to job 1 takes it: nothing more.
    let taken = d.runner_of(1);
    d.send(JobAction::InProgress, on(&taken, 1));
    assert_eq!(d.claims.len(), 3);
    // GitHub gives a job straight to an idle runner, before its `queued` arrives: the same.
    let other = idle(&d)[0].clone();
    d.send(JobAction::InProgress, on(&other, 2));
    assert!(d.claim_times(2).is_empty());
    assert_eq!(d.claims.len(), 4);
    assert_eq!(idle(&d).len(), 2);
    let view = d.state();
    let warm = view.status.providers[0]
        .warm
        .expect("the pool shows its warm runners");
    assert_eq!((warm.available, warm.target), (2, 2));
}

/// A warm runner older than `warm_max_age` is deleted on GitHub before its replacement is
/// claimed; the count stays.
#[test]
fn an_old_warm_runner_is_deleted_before_its_replacement_is_claimed() {
    let mut d = Driver::with(count(1));
    assert_eq!(d.calls, ["claim 1"]);
    d.advance(3599);
    assert_eq!(d.calls, ["claim 1"], "not old yet");
    // The sweep (every 30 s) or the next decision notices it.
    d.advance(30);
    assert_eq!(d.calls, ["claim 1", "delete 1", "claim 2"]);
    assert_eq!(idle(&d).len(), 1);
}

/// A cordon deletes every warm runner and claims none; lifting it refills. A drain leaves
/// no registration.
#[test]
fn a_cordon_or_a_drain_deletes_every_warm_runner() {
    let mut d = Driver::with(count(2));
    d.cordon(true);
    assert_eq!(d.deletes.len(), 2);
    assert!(d.s.view().runners().next().is_none(), "{:?}", idle(&d));
    d.advance(120);
    assert_eq!(d.claims.len(), 2, "no claim while cordoned");
    d.cordon(false);
    assert_eq!(d.claims.len(), 4);
    let fx = d.s.begin_shutdown(d.state_now());
    assert!(
        fx.iter()
            .any(|e| matches!(e, super::Effect::CheckIdle { .. }))
    );
}

/// A warm runner that dies at boot is not replaced at once: the pool's warm claims wait, longer
/// each time in a row, so a broken pool does not spend a registration as fast as the pacing
/// allows.
#[test]
fn a_warm_runner_dying_at_boot_holds_the_pools_warm_claims() {
    let mut d = Driver::with(count(1));
    let name = idle(&d)[0].clone();
    d.exited(&name, 1);
    assert_eq!(d.claims.len(), 1);
    d.advance(4);
    assert_eq!(d.claims.len(), 1);
    d.advance(2);
    assert_eq!(d.claims.len(), 2, "claimed again after 5 s");
    // Dying again: 10 s, then 20 s.
    let name = idle(&d)[0].clone();
    d.exited(&name, 1);
    d.advance(9);
    assert_eq!(d.claims.len(), 2);
    d.advance(2);
    assert_eq!(d.claims.len(), 3, "then after 10 s");
}

/// A window raises the count while it is open and lowers it after (the surplus deleted).
#[test]
fn a_window_raises_and_lowers_the_registered_count() {
    // UNIX0 is a Friday, 08:00 UTC.
    let mut d = Driver::with(registered(WarmConfig {
        min: 1,
        windows: vec![WarmWindow {
            days: [false, false, false, false, true, false, false],
            from: 8 * 60 + 10,
            to: 8 * 60 + 20,
            min: 3,
        }],
        time_zone: Some("UTC".into()),
        ..WarmConfig::default()
    }));
    assert_eq!(idle(&d).len(), 1);
    d.advance(10 * 60);
    assert_eq!(idle(&d).len(), 3, "the window opened");
    d.advance(10 * 60);
    assert_eq!(idle(&d).len(), 1, "the window closed");
    assert_eq!(d.deletes.len(), 2);
}

/// A warm claim that GitHub answers with a secondary rate limit holds the target's job
/// claims too: the limit is the credential's, and a job's claim made in its wait would be
/// refused the same way (and spend a rung of its ladder).
#[test]
fn a_rate_limited_warm_claim_holds_the_target_s_job_claims() {
    let mut d = Driver::with(count(1));
    d.script.push_back(crate::github::GithubError::Http(
        crate::github::error::HttpFailure {
            endpoint: "generate_jitconfig",
            status: 403,
            message: "You have exceeded a secondary rate limit".into(),
            documentation_url: None,
            rate_remaining: None,
            rate_bucket: None,
            rate_reset: None,
            retry_after: Some(Duration::from_secs(120)),
        },
    ));
    // Job 1 takes the warm runner; the claim that makes the count up is refused.
    d.queued(1, LABELS);
    assert_eq!(d.claims.len(), 2);
    d.queued(2, LABELS);
    assert!(
        d.claim_times(2).is_empty(),
        "claimed inside the limit's wait"
    );
    d.advance(115);
    assert!(
        d.claim_times(2).is_empty(),
        "claimed inside the limit's wait"
    );
    d.advance(10);
    assert_eq!(d.claim_times(2).len(), 1, "claimed once the wait is over");
}

/// A book of warm runners of pool `local`, each created `ago` seconds before `now` (`up`: its
/// environment came up), and one of pool `other`.
fn book_of(
    now: crate::clock::Instant,
    runners: &[(&str, u64, bool)],
) -> (super::runner_book::RunnerBook, super::job_table::JobTable) {
    use crate::{config::PoolName, durable::RunnerRow, job::JobKey};
    let mut book = super::runner_book::RunnerBook::default();
    let mut all = runners.to_vec();
    all.push(("o1", 1, true));
    for (i, (name, ago, up)) in all.iter().enumerate() {
        let row = RunnerRow {
            name: (*name).into(),
            id: i as u64,
            provider: PoolName::from(if name.starts_with('o') {
                "other"
            } else {
                "local"
            }),
            repo: None,
            intent: JobKey::warm("acme", i as u64),
            bound: None,
            created_unix: 0,
        };
        let created = now - Duration::from_secs(*ago);
        book.insert(
            std::sync::Arc::from(*name),
            super::RunnerRecord::new(row, created),
        );
        if *up {
            book.came_up(name, created, true);
        }
    }
    (book, super::job_table::JobTable::default())
}

#[test]
fn a_pool_keeps_its_newest_spares_up_to_its_count_and_rotates_the_old_ones() {
    let now = crate::clock::Instant::now() + Duration::from_secs(10_000);
    let (book, jobs) = book_of(
        now,
        &[
            ("w1", 100, true),
            ("w2", 50, false),
            ("w3", 10, true),
            ("w4", 4000, true),
        ],
    );
    let max_age = Duration::from_secs(3600);
    let pool = crate::config::PoolName::from("local");
    let plan = super::warm::spares(&pool, max_age, 2, &book, &jobs, now);
    let names = |v: &[std::sync::Arc<str>]| v.iter().map(|n| n.to_string()).collect::<Vec<_>>();
    assert_eq!(
        names(&plan.kept),
        ["w3", "w2"],
        "the newest two, another pool's not among them"
    );
    assert_eq!(names(&plan.old), ["w4"], "past warm_max_age: rotated");
    assert_eq!(names(&plan.surplus), ["w1"]);
    assert_eq!(plan.up, 1, "of the kept, w3 is up");
    assert_eq!(
        plan.rotate_at,
        Some(now - Duration::from_secs(50) + max_age),
        "the oldest kept is rotated on time"
    );
    let night = super::warm::spares(&pool, max_age, 0, &book, &jobs, now);
    assert!(night.kept.is_empty() && night.rotate_at.is_none());
    assert_eq!(
        names(&night.surplus),
        ["w3", "w2", "w1"],
        "a count of 0 keeps none"
    );
}
