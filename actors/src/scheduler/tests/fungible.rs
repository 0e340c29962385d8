//! Fungible runners: stranded jobs, swapped runners, spares, orphans, late `in_progress`.

use crate::config::PoolName;
use std::time::Duration;

#[allow(unused_imports)]
use super::*;

fn runner_of(st: &SchedulerState, job_id: u64) -> String {
    st.runners
        .iter()
        .find(|r| r.intent.job_id == job_id)
        .map(|r| r.name.clone())
        .expect("runner for job")
}

async fn exited(h: &Harness, name: &str) {
    exited_with(h, name, 0).await
}

async fn exited_with(h: &Harness, name: &str, code: i32) {
    let kind = RunnerEventKind::Exited {
        code: Some(code),
        reason: ExitReason::Exited,
    };
    h.sched
        .send(RunnerEvent {
            provider: PoolName::from("local"),
            name: name.into(),
            kind,
        })
        .await
        .unwrap();
}

/// Runner a (made for job 1) takes sibling job 2 (whose own runner b crashed): job 1 needs a
/// runner again, and gets one claimed at once, not when a exits (its sibling may run for an
/// hour). The swap is no failure: nothing counts toward job 1's cap, and a's exit after job 2
/// claims nothing more.
#[actix_rt::test]
async fn a_job_whose_runner_takes_a_sibling_is_dispatched_again_at_once() {
    let h = harness(Setup::default()).await;
    h.queued(1, LINUX).await;
    h.queued(2, LINUX).await;
    h.run_for(Duration::from_secs(1)).await;
    let st = h.state().await;
    let (a, b) = (runner_of(&st, 1), runner_of(&st, 2));
    // Runner b (made for job 2) crashes at boot; runner a takes job 2.
    exited_with(&h, &b, 1).await;
    h.send(
        JobAction::InProgress,
        JobInfo {
            runner_name: Some(a.clone()),
            ..job(2, LINUX)
        },
    )
    .await;
    h.run_for(Duration::from_secs(1)).await;
    let st = h.state().await;
    let new = st
        .runners
        .iter()
        .find(|r| r.intent.job_id == 1 && r.name != a)
        .unwrap_or_else(|| {
            panic!(
                "job 1 has a new runner while a runs job 2: {:?}",
                st.runners
            )
        });
    let timeline = st
        .jobs
        .iter()
        .find(|j| j.key.job_id == 1)
        .unwrap()
        .timeline
        .clone();
    assert!(
        timeline
            .iter()
            .any(|e| matches!(&e.note, Note::Requeued { why } if why.contains("sibling"))),
        "{timeline:#?}"
    );
    let claims = h.claims();
    h.send(
        JobAction::Completed,
        JobInfo {
            runner_name: Some(a.clone()),
            conclusion: Some("success".into()),
            ..job(2, LINUX)
        },
    )
    .await;
    exited(&h, &a).await;
    h.run_for(Duration::from_secs(1)).await;
    assert_eq!(h.claims(), claims, "a's exit after job 2 claims nothing");
    let st = h.state().await;
    assert!(st.runners.iter().any(|r| r.name == new.name));
    let j1 = st.jobs.iter().find(|j| j.key.job_id == 1).unwrap();
    assert_eq!(j1.idle_reaps, 0);
}

/// Two same-label jobs whose runners swapped: no re-dispatch, and completing one job tears down
/// only the runner that ran it, never the other job's live runner.
#[actix_rt::test]
async fn same_label_jobs_that_swap_runners_are_left_alone() {
    let h = harness(Setup::default()).await;
    h.queued(1, LINUX).await;
    h.queued(2, LINUX).await;
    h.run_for(Duration::from_secs(1)).await;
    let st = h.state().await;
    let (a, b) = (runner_of(&st, 1), runner_of(&st, 2));
    h.send(
        JobAction::InProgress,
        JobInfo {
            runner_name: Some(b.clone()),
            ..job(1, LINUX)
        },
    )
    .await;
    h.send(
        JobAction::InProgress,
        JobInfo {
            runner_name: Some(a.clone()),
            ..job(2, LINUX)
        },
    )
    .await;
    h.send(
        JobAction::Completed,
        JobInfo {
            runner_name: Some(b.clone()),
            conclusion: Some("success".into()),
            ..job(1, LINUX)
        },
    )
    .await;
    h.run_for(Duration::from_secs(1)).await;
    let st = h.state().await;
    assert_eq!(
        st.runners
            .iter()
            .map(|r| r.name.clone())
            .collect::<Vec<_>>(),
        vec![a.clone()],
        "only b (which ran job 1) went"
    );
    exited(&h, &a).await;
    h.run_for(Duration::from_secs(1)).await;
    assert_eq!(h.claims(), 2, "no re-dispatch");
}

/// Spares: a runner whose own job ran elsewhere covers a queued job its labels cover (here the
/// job whose runner went to a sibling); a spare nothing needs is reaped at the next sweep (after
/// any `completed`) and deleted on GitHub.
#[actix_rt::test]
async fn spare_runners_cover_demand_and_the_surplus_is_reaped() {
    let h = harness(Setup::default()).await;
    for id in 1..=4 {
        h.queued(id, LINUX).await;
    }
    h.run_for(Duration::from_secs(1)).await;
    let st = h.state().await;
    let (a, b, c, d) = (
        runner_of(&st, 1),
        runner_of(&st, 2),
        runner_of(&st, 3),
        runner_of(&st, 4),
    );
    // a takes job 2: b (made for job 2) is a spare, but job 1 still needs a runner.
    h.send(
        JobAction::InProgress,
        JobInfo {
            runner_name: Some(a.clone()),
            ..job(2, LINUX)
        },
    )
    .await;
    // Job 4 runs on a peer's runner: d is a spare nothing needs.
    h.send(
        JobAction::InProgress,
        JobInfo {
            runner_name: Some("peer-runner".into()),
            ..job(4, LINUX)
        },
    )
    .await;
    // A completed anywhere triggers the sweep.
    h.send(
        JobAction::InProgress,
        JobInfo {
            runner_name: Some(c.clone()),
            ..job(3, LINUX)
        },
    )
    .await;
    h.send(
        JobAction::Completed,
        JobInfo {
            runner_name: Some(c.clone()),
            conclusion: Some("success".into()),
            ..job(3, LINUX)
        },
    )
    .await;
    h.run_for(Duration::from_secs(1)).await;
    let st = h.state().await;
    let names: Vec<String> = st.runners.iter().map(|r| r.name.clone()).collect();
    assert!(
        names.contains(&a) && names.contains(&b),
        "b covers job 1: {names:?}"
    );
    assert!(
        !names.contains(&d),
        "the surplus spare d is reaped: {names:?}"
    );
    assert!(!names.contains(&c), "c ran its job and went");
    let d_id = h.gh.lock().unwrap().claims.len();
    assert_eq!(d_id, 4, "no new claim");
    assert_eq!(
        h.gh.lock().unwrap().deletes.len(),
        1,
        "the reaped spare is deleted on GitHub"
    );
}

/// A runner nobody takes is reaped after the grace and deleted on GitHub (its job, never seen
/// running, is dispatched again, counting toward the zombie cap); a job cancelled before any
/// runner took it has its runner torn down at once.
#[actix_rt::test]
async fn orphans_are_reaped_after_the_grace_and_cancelled_jobs_at_once() {
    let h = harness(Setup::default()).await;
    h.queued(1, LINUX).await;
    h.queued(2, LINUX).await;
    h.run_for(Duration::from_secs(1)).await;
    let first = runner_of(&h.state().await, 1);
    h.send(
        JobAction::Completed,
        JobInfo {
            conclusion: Some("cancelled".into()),
            ..job(2, LINUX)
        },
    )
    .await;
    h.run_for(Duration::from_secs(1)).await;
    assert_eq!(
        h.state().await.runners.len(),
        1,
        "the cancelled job's runner went at once"
    );
    assert_eq!(h.gh.lock().unwrap().deletes.len(), 1);
    h.run_for(Duration::from_secs(630)).await;
    let st = h.state().await;
    assert!(
        st.runners.iter().all(|r| r.name != first),
        "the orphan went after the grace"
    );
    assert_eq!(
        h.gh.lock().unwrap().deletes.len(),
        2,
        "and was deleted on GitHub"
    );
    let j1 = st.jobs.iter().find(|j| j.key.job_id == 1).unwrap();
    assert_eq!(j1.admissions, 2, "job 1 dispatched again once");
    assert_eq!(j1.idle_reaps, 1, "an idle reap is the zombie signal");
}

/// A spare whose `in_progress` is late (GitHub says busy) is not reaped, nor asked about again:
/// the job it runs ends it (an ephemeral runner exits after one job).
#[actix_rt::test]
async fn a_busy_spare_is_not_reaped() {
    let h = harness(Setup::default()).await;
    h.queued(1, LINUX).await;
    h.queued(2, LINUX).await;
    h.run_for(Duration::from_secs(1)).await;
    let st = h.state().await;
    let b = st
        .runners
        .iter()
        .find(|r| r.intent.job_id == 2)
        .unwrap()
        .clone();
    h.gh.lock().unwrap().busy.push(b.id);
    // Job 2 ran on a peer: b is a spare with no demand, but GitHub says it is busy.
    h.send(
        JobAction::InProgress,
        JobInfo {
            runner_name: Some("peer".into()),
            ..job(2, LINUX)
        },
    )
    .await;
    h.send(
        JobAction::Completed,
        JobInfo {
            runner_name: Some("peer".into()),
            conclusion: Some("success".into()),
            ..job(2, LINUX)
        },
    )
    .await;
    h.run_for(Duration::from_secs(1)).await;
    assert!(
        h.state().await.runners.iter().any(|r| r.name == b.name),
        "busy spare kept"
    );
    assert_eq!(h.gh.lock().unwrap().gets, 1);
    for id in 10..30 {
        h.send(JobAction::Completed, job(id, LINUX)).await;
    }
    h.run_for(Duration::from_secs(120)).await;
    assert!(h.state().await.runners.iter().any(|r| r.name == b.name));
    assert_eq!(h.gh.lock().unwrap().gets, 1, "a busy runner is asked once");
}

/// A spare handed a job a moment ago (GitHub would still list it idle) is not torn down: the
/// sweep deletes its registration first, which GitHub refuses for a runner that runs a job
/// (the teardown after an idle look killed such jobs; pytorch/test-infra#6473 is the same race
/// in another autoscaler).
#[actix_rt::test]
async fn a_spare_handed_a_job_after_it_looked_idle_is_not_killed() {
    let h = harness(Setup::default()).await;
    h.queued(1, LINUX).await;
    h.queued(2, LINUX).await;
    h.run_for(Duration::from_secs(1)).await;
    let b = runner_of(&h.state().await, 2);
    let b_id = h
        .state()
        .await
        .runners
        .iter()
        .find(|r| r.name == b)
        .unwrap()
        .id;
    h.gh.lock().unwrap().busy_since_looked.push(b_id);
    for action in [JobAction::InProgress, JobAction::Completed] {
        h.send(
            action,
            JobInfo {
                runner_name: Some("peer".into()),
                conclusion: (action == JobAction::Completed).then(|| "success".into()),
                ..job(2, LINUX)
            },
        )
        .await;
    }
    h.run_for(Duration::from_secs(1)).await;
    assert!(
        h.state().await.runners.iter().any(|r| r.name == b),
        "the spare running a job was torn down"
    );
    assert!(!h.gh.lock().unwrap().deletes.contains(&b_id));
}

/// A runner that exits by itself before its `in_progress` arrives ran a job: GitHub removed
/// it, so no deletion is spent on it. One that failed (a non-zero exit, nothing named it) is
/// deleted once the wait for a late event is over.
#[actix_rt::test]
async fn late_in_progress_spares_a_needless_deletion() {
    let h = harness(Setup::default()).await;
    h.queued(1, LINUX).await;
    h.queued(2, LINUX).await;
    h.run_for(Duration::from_secs(1)).await;
    let st = h.state().await;
    let (a, b) = (runner_of(&st, 1), runner_of(&st, 2));
    exited(&h, &a).await;
    exited_with(&h, &b, 1).await;
    h.send(
        JobAction::InProgress,
        JobInfo {
            runner_name: Some(a.clone()),
            ..job(1, LINUX)
        },
    )
    .await;
    h.send(
        JobAction::Completed,
        JobInfo {
            runner_name: Some(a.clone()),
            conclusion: Some("success".into()),
            ..job(1, LINUX)
        },
    )
    .await;
    let id = |name: &str| st.runners.iter().find(|r| r.name == name).unwrap().id;
    let (a_id, b_id) = (id(&a), id(&b));
    h.run_for(Duration::from_secs(5)).await;
    assert!(
        !h.gh.lock().unwrap().deletes.contains(&b_id),
        "nothing deleted before the wait is over"
    );
    h.run_for(Duration::from_secs(40)).await;
    let deletes = h.gh.lock().unwrap().deletes.clone();
    assert!(
        deletes.contains(&b_id),
        "the runner that ran nothing is deleted: {deletes:?}"
    );
    assert!(
        !deletes.contains(&a_id),
        "the runner that ran job 1 is not: {deletes:?}"
    );
    assert_eq!(
        h.metrics
            .jobs_total
            .with_label_values(&["local", "success"])
            .get(),
        1
    );
}
