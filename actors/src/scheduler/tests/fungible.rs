//! Fungible runners through the shell: the sweep deletes before it tears down (a spare handed
//! a job after it looked idle is never killed), and a late `in_progress` spares a deletion and
//! still counts the job in the metrics. The decisions themselves (swaps, spares, orphans, busy
//! runners) are tested at the core (`core/fungible_tests.rs`).

use crate::config::PoolName;
use std::time::Duration;

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
        detail: None,
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
