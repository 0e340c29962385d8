//! Fungible runners at the core, each effect carried out by the test driver: stranded jobs,
//! swapped runners, spares, orphans, busy runners, late `in_progress`.

use super::{Note, driver::Driver};
use crate::{
    job::{JobAction, JobInfo, JobKey},
    scheduler::fixtures::job,
};

const LABELS: &[&str] = &["self-hosted", "linux"];

fn on(runner: &str, id: u64) -> JobInfo {
    JobInfo {
        runner_name: Some(runner.into()),
        ..job(id, LABELS)
    }
}

fn done_on(runner: &str, id: u64) -> JobInfo {
    JobInfo {
        conclusion: Some("success".into()),
        ..on(runner, id)
    }
}

/// Runner a (made for job 1) takes sibling job 2 (whose own runner b crashed): job 1 needs a
/// runner again, and gets one claimed at once, not when a exits (its sibling may run for an
/// hour). The swap is no failure: nothing counts toward job 1's cap, and a's exit after job 2
/// claims nothing more.
#[test]
fn a_job_whose_runner_takes_a_sibling_is_dispatched_again_at_once() {
    let mut d = Driver::new();
    d.queued(1, LABELS);
    d.queued(2, LABELS);
    let (a, b) = (d.runner_of(1), d.runner_of(2));
    d.exited(&b, 1);
    d.send(JobAction::InProgress, on(&a, 2));
    let new =
        d.s.view()
            .runners()
            .find(|r| r.intent.job_id == 1 && *r.name != *a)
            .map(|r| r.name.clone())
            .expect("job 1 has a new runner while a runs job 2");
    let timeline = &d.s.view().job(&job(1, LABELS).key).unwrap().timeline();
    assert!(
        timeline
            .iter()
            .any(|e| matches!(&e.note, Note::Requeued { why } if why.contains("sibling"))),
        "{timeline:#?}"
    );
    let claims = d.claims.len();
    d.send(JobAction::Completed, done_on(&a, 2));
    d.exited(&a, 0);
    d.advance(1);
    assert_eq!(
        d.claims.len(),
        claims,
        "a's exit after job 2 claims nothing"
    );
    assert!(d.has_runner(&new));
    assert_eq!(d.s.view().job(&job(1, LABELS).key).unwrap().idle_reaps(), 0);
}

/// Two same-label jobs whose runners swapped: no re-dispatch, and completing one job tears
/// down only the runner that ran it, never the other job's live runner.
#[test]
fn same_label_jobs_that_swap_runners_are_left_alone() {
    let mut d = Driver::new();
    d.queued(1, LABELS);
    d.queued(2, LABELS);
    let (a, b) = (d.runner_of(1), d.runner_of(2));
    d.send(JobAction::InProgress, on(&b, 1));
    d.send(JobAction::InProgress, on(&a, 2));
    d.send(JobAction::Completed, done_on(&b, 1));
    let left: Vec<String> = d.s.view().runners().map(|r| r.name.clone()).collect();
    assert_eq!(left, vec![a.clone()], "only b (which ran job 1) went");
    d.exited(&a, 0);
    d.advance(1);
    assert_eq!(d.claims.len(), 2, "no re-dispatch");
}

/// Spares: a runner whose own job ran elsewhere covers a queued job its labels cover (here
/// the job whose runner went to a sibling); a spare nothing needs is reaped at the next sweep
/// (after any `completed`) and deleted on GitHub.
#[test]
fn spare_runners_cover_demand_and_the_surplus_is_reaped() {
    let mut d = Driver::new();
    for id in 1..=4 {
        d.queued(id, LABELS);
    }
    let (a, b, c, spare) = (
        d.runner_of(1),
        d.runner_of(2),
        d.runner_of(3),
        d.runner_of(4),
    );
    // a takes job 2: b (made for job 2) is a spare, but job 1 still needs a runner.
    d.send(JobAction::InProgress, on(&a, 2));
    // Job 4 runs on a peer's runner: its runner is a spare nothing needs.
    d.send(JobAction::InProgress, on("peer-runner", 4));
    // A completed anywhere triggers the sweep.
    d.send(JobAction::InProgress, on(&c, 3));
    d.send(JobAction::Completed, done_on(&c, 3));
    assert!(d.has_runner(&a) && d.has_runner(&b), "b covers job 1");
    assert!(!d.has_runner(&spare), "the surplus spare is reaped");
    assert!(!d.has_runner(&c), "c ran its job and went");
    assert_eq!(d.claims.len(), 4, "no new claim");
    assert_eq!(d.deletes.len(), 1, "the reaped spare is deleted on GitHub");
}

/// A runner nobody takes is reaped after the grace and deleted on GitHub (its job, never seen
/// running, is dispatched again, counting toward the zombie cap); a job cancelled before any
/// runner took it has its runner torn down at once.
#[test]
fn orphans_are_reaped_after_the_grace_and_cancelled_jobs_at_once() {
    let mut d = Driver::new();
    d.queued(1, LABELS);
    d.queued(2, LABELS);
    let first = d.runner_of(1);
    let cancelled = JobInfo {
        conclusion: Some("cancelled".into()),
        ..job(2, LABELS)
    };
    d.send(JobAction::Completed, cancelled);
    d.advance(1);
    assert_eq!(
        d.s.view().runner_count(),
        1,
        "the cancelled job's runner went at once"
    );
    assert_eq!(d.deletes.len(), 1);
    d.advance(630);
    assert!(!d.has_runner(&first), "the orphan went after the grace");
    assert_eq!(d.deletes.len(), 2, "and was deleted on GitHub");
    let j1 = d.s.view().job(&job(1, LABELS).key).unwrap();
    assert_eq!(j1.admissions(), 2, "job 1 dispatched again once");
    assert_eq!(j1.idle_reaps(), 1, "an idle reap is the zombie signal");
}

/// A job cancelled before any runner took it, whose runner took another job a moment ago (its
/// `in_progress` still on the way): GitHub refuses to delete the runner, so it is kept, not
/// stopped mid-job; the late `in_progress` binds it and its own `completed` ends it. (Torn down
/// at once, as before, the other job hung `in_progress` on a runner that was gone: the soak's
/// stuck job.)
#[test]
fn a_cancelled_jobs_runner_busy_with_another_job_is_not_stopped() {
    let mut d = Driver::new();
    d.queued(1, LABELS);
    let a = d.runner_of(1);
    // Job 2 comes in; runner a takes it at GitHub before the daemon hears of that.
    d.queued(2, LABELS);
    let b = d.runner_of(2);
    let b_id = d.id_of(&b);
    d.busy.push(d.id_of(&a));
    d.send(
        JobAction::Completed,
        JobInfo {
            conclusion: Some("cancelled".into()),
            ..job(1, LABELS)
        },
    );
    d.advance(1);
    assert!(d.has_runner(&a), "a runs job 2: not stopped");
    assert!(d.deletes.is_empty(), "GitHub refused the deletion");
    d.send(JobAction::InProgress, on(&a, 2));
    d.send(JobAction::Completed, done_on(&a, 2));
    d.exited(&a, 0);
    d.advance(1);
    assert!(!d.has_runner(&a), "a ran job 2 and went");
    // b, made for job 2, is a spare nothing needs: deleted (idle) and torn down.
    d.advance(1);
    assert!(!d.has_runner(&b), "the spare went");
    assert_eq!(d.deletes, vec![b_id], "only the spare was deleted");
    assert_eq!(d.claims.len(), 2, "no claim more");
}

/// A spare whose `in_progress` is late (GitHub refuses to delete it: it runs a job) is not
/// reaped, nor asked about again: the job it runs ends it (a JIT runner exits after one job).
#[test]
fn a_busy_spare_is_not_reaped_and_asked_once() {
    let mut d = Driver::new();
    d.queued(1, LABELS);
    d.queued(2, LABELS);
    let b = d.runner_of(2);
    d.busy.push(d.id_of(&b));
    // Job 2 ran on a peer: b is a spare with no demand, but GitHub says it is busy.
    d.send(JobAction::InProgress, on("peer", 2));
    d.send(JobAction::Completed, done_on("peer", 2));
    assert!(d.has_runner(&b), "busy spare kept");
    assert_eq!(d.asks, 1);
    for id in 10..30 {
        d.send(JobAction::Completed, job(id, LABELS));
    }
    d.advance(120);
    assert!(d.has_runner(&b));
    assert_eq!(d.asks, 1, "a busy runner is asked once");
}

/// A runner that exits by itself before its `in_progress` arrives ran a job: GitHub removed
/// it, so no deletion is spent on it. One that failed (a non-zero exit, nothing named it) is
/// deleted once the wait for a late event is over.
#[test]
fn late_in_progress_spares_a_needless_deletion() {
    let mut d = Driver::new();
    d.queued(1, LABELS);
    d.queued(2, LABELS);
    let (a, b) = (d.runner_of(1), d.runner_of(2));
    let (a_id, b_id) = (d.id_of(&a), d.id_of(&b));
    d.exited(&a, 0);
    d.exited(&b, 1);
    d.send(JobAction::InProgress, on(&a, 1));
    d.send(JobAction::Completed, done_on(&a, 1));
    d.advance(5);
    assert!(
        !d.deletes.contains(&b_id),
        "nothing deleted before the wait is over"
    );
    d.advance(40);
    assert!(
        d.deletes.contains(&b_id),
        "the runner that ran nothing is deleted"
    );
    assert!(
        !d.deletes.contains(&a_id),
        "the runner that ran job 1 is not"
    );
}

/// The whole exchange leaves nothing behind: every runner made went, every registration that
/// ran no job was deleted, and the status shows no job waiting.
#[test]
fn a_swap_chain_ends_with_every_job_run_and_nothing_left() {
    let mut d = Driver::new();
    for id in 1..=3 {
        d.queued(id, LABELS);
    }
    // Each runner takes the next job: 1's runs 2, 2's runs 3, 3's runs 1.
    let runners: Vec<String> = (1..=3).map(|id| d.runner_of(id)).collect();
    for (i, runner) in runners.iter().enumerate() {
        let ran = (i as u64 + 1) % 3 + 1;
        d.send(JobAction::InProgress, on(runner, ran));
    }
    for (i, runner) in runners.iter().enumerate() {
        let ran = (i as u64 + 1) % 3 + 1;
        d.send(JobAction::Completed, done_on(runner, ran));
        d.exited(runner, 0);
    }
    d.advance(60);
    assert_eq!(d.s.view().runner_count(), 0);
    assert_eq!(d.claims.len(), 3, "a swap costs no claim");
    assert!(d.deletes.is_empty(), "every runner ran a job");
    assert!(
        d.state().jobs.iter().all(|j| !j.pending),
        "{:?}",
        d.elapsed()
    );
}

/// A scale set's placeholder (an assigned job the daemon never heard of) claims a runner like
/// a job; when that runner takes the real job, the placeholder is done and claims nothing
/// more, and the demand counts the real job as running. A placeholder withdrawn while its
/// runner waits takes the runner with it.
#[test]
fn a_placeholder_ends_when_its_runner_takes_an_assigned_job_and_a_withdrawn_one_leaves_nothing() {
    let placeholder = |n| JobKey::reckoned("acme", n).job_id;
    let mut d = Driver::new();
    let first = placeholder(1);
    d.queued(first, LABELS);
    let a = d.runner_of(first);
    let owner = job(1, LABELS).key.owner.to_string();
    let demand = d.s.view().pool_demand(&owner, "linux");
    assert_eq!(demand.waiting.len(), 1, "the placeholder waits: {demand:?}");
    d.send(JobAction::InProgress, on(&a, 77));
    assert_eq!(d.phase(first), super::Phase::Done);
    let demand = d.s.view().pool_demand(&owner, "linux");
    assert_eq!((demand.waiting.len(), demand.running), (0, 1));
    d.advance(1);
    assert_eq!(d.claims.len(), 1, "the placeholder claims nothing more");
    let timeline = &d.s.view().job(&job(first, LABELS).key).unwrap().timeline();
    assert!(
        timeline
            .iter()
            .any(|e| e.note.to_string().contains("took a job assigned")),
        "{timeline:#?}"
    );

    let second = placeholder(2);
    d.queued(second, LABELS);
    let b = d.runner_of(second);
    d.send(
        JobAction::Completed,
        JobInfo {
            conclusion: Some("cancelled".into()),
            ..job(second, LABELS)
        },
    );
    d.advance(1);
    assert!(!d.has_runner(&b), "the withdrawn placeholder's runner went");
    assert!(d.has_runner(&a), "the runner on job 77 stays");
    let demand = d.s.view().pool_demand(&owner, "linux");
    assert_eq!((demand.waiting.len(), demand.running), (0, 1));
}

/// A job whose `in_progress` and `completed` were lost (delivered while the daemon was down)
/// keeps a runner waiting for it; GitHub's queued listing no longer has it. A complete
/// reconcile pass looks at it (only once it is a minute old), and GitHub's "completed" makes
/// its runner a spare the sweep deletes: no runner is left for a job that will never come.
#[test]
fn a_job_finished_unseen_releases_the_runner_kept_for_it() {
    let mut d = Driver::new();
    d.queued(1, LABELS);
    d.queued(2, LABELS);
    let runner = d.runner_of(1);
    let id = d.id_of(&runner);
    assert!(d.reconcile(vec![]).is_empty(), "too young to look at");
    d.advance(61);
    // Job 2 is still listed queued: only job 1 is looked at.
    assert_eq!(d.reconcile(vec![job(2, LABELS)]), vec![1]);
    d.looked(1, "queued");
    assert!(d.has_runner(&runner), "still queued: its runner stays");
    d.looked(1, "completed");
    assert!(
        !d.has_runner(&runner),
        "its runner is deleted and torn down"
    );
    assert!(d.deletes.contains(&id));
    let timeline = &d.s.view().job(&job(1, LABELS).key).unwrap().timeline();
    assert!(
        timeline.iter().any(|e| matches!(
            e.note,
            Note::LookedAt {
                status: "completed"
            }
        )),
        "{timeline:#?}"
    );
}

/// A runner up and idle for its job, whose `in_progress` and `completed` never came (they were
/// delivered to a fleet host killed before it wrote them): 30 s after it came up its job is
/// looked at, and GitHub's "completed" makes it a spare the sweep deletes at once, not after
/// the orphan grace (600 s). A job still queued keeps its runner, looked at again after 60 s,
/// then 120 s: a job GitHub is slow to hand out costs a few looks, not one per sweep.
#[test]
fn a_runner_idle_for_a_job_that_ran_unseen_is_deleted_after_one_look() {
    let mut d = Driver::new();
    d.queued(1, LABELS);
    let runner = d.runner_of(1);
    let id = d.id_of(&runner);
    d.advance(29);
    assert_eq!(d.looks, vec![], "not before 30 s");
    d.advance(1);
    assert_eq!(d.looks, vec![(1, 30)]);
    d.looked(1, "queued");
    assert!(d.has_runner(&runner), "still queued: its runner stays");
    d.advance(200);
    assert_eq!(
        d.looks,
        vec![(1, 30), (1, 90), (1, 210)],
        "30 s, then doubling"
    );
    d.looked(1, "completed");
    assert!(
        !d.has_runner(&runner),
        "its runner is deleted and torn down"
    );
    assert!(d.deletes.contains(&id));
    assert_eq!(
        d.claims.len(),
        1,
        "nothing claimed again for a job that ran"
    );

    // A runner bound by its job's `in_progress` is never looked about.
    let mut d = Driver::new();
    d.queued(1, LABELS);
    let runner = d.runner_of(1);
    d.send(JobAction::InProgress, on(&runner, 1));
    d.advance(300);
    assert_eq!(d.looks, vec![]);
}

/// A pool of a scale set (routed by its pin alone).
fn scaleset_driver() -> Driver {
    let mut settings = super::tests::settings();
    settings.providers[0].labels = vec!["scaleset:local".into()];
    Driver::with(settings)
}

/// A scale set's job that the service withdrew before any runner took it (`completed`,
/// cancelled, no runner) comes back a moment later as a new assignment: the runner made for
/// the first is kept as a spare and serves the second, with no second claim. (Torn down at
/// once, as a cancelled REST job's runner is, the new claim came up after the service's window
/// again, and every job was given up.)
#[test]
fn a_withdrawn_scale_set_job_s_runner_serves_its_next_assignment() {
    const PIN: &[&str] = &["scaleset:local"];
    let mut d = scaleset_driver();
    d.queued(1, PIN);
    let a = d.runner_of(1);
    d.send(
        JobAction::Completed,
        JobInfo {
            conclusion: Some("cancelled".into()),
            withdrawn: true,
            ..job(1, PIN)
        },
    );
    assert!(d.has_runner(&a), "kept for the next assignment");
    d.advance(1);
    d.queued(2, PIN);
    assert_eq!(d.claims.len(), 1, "the kept runner serves it: no new claim");
    assert_eq!(d.runner_of(2), a);
    // A job withdrawn for good: its runner goes once the grace is over, not before.
    d.send(
        JobAction::Completed,
        JobInfo {
            conclusion: Some("cancelled".into()),
            withdrawn: true,
            ..job(2, PIN)
        },
    );
    d.advance(super::sweep::REASSIGN_GRACE.as_secs() - 5);
    assert!(d.has_runner(&a), "within the grace");
    d.advance(40);
    assert!(!d.has_runner(&a), "reaped after the grace");
    assert_eq!(d.deletes.len(), 1);
    // Cancelled, not withdrawn (the reckoning's withdrawal of a job of a deleted scale set,
    // whose runner can never get it): torn down at once.
    d.queued(3, PIN);
    let b = d.runner_of(3);
    d.send(
        JobAction::Completed,
        JobInfo {
            conclusion: Some("cancelled".into()),
            ..job(3, PIN)
        },
    );
    assert!(!d.has_runner(&b));
}
