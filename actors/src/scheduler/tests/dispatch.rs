//! Dedup, routing, slots, cordon, pacing, and a dead provider's jobs.

use crate::config::PoolName;
use std::time::Duration;

use super::*;

#[actix_rt::test]
async fn routing_picks_the_most_specific_covering_provider_then_a_free_one() {
    let h = harness(Setup {
        providers: vec![
            (
                ProviderKind::Local,
                vec!["self-hosted", "linux", "x64", "big"],
                1,
            ),
            (ProviderKind::Linux, vec!["self-hosted", "linux", "x64"], 1),
            (
                ProviderKind::NativeMacos,
                vec!["self-hosted", "linux", "x64"],
                1,
            ),
        ],
        ..Setup::default()
    })
    .await;
    for id in 1..=3 {
        h.queued(id, &["Self-Hosted", "LINUX"]).await;
    }
    h.run_for(Duration::from_secs(1)).await;
    let bases: Vec<String> =
        h.gh.lock()
            .unwrap()
            .claims
            .iter()
            .map(|(_, c)| c.name_base.clone())
            .collect();
    assert_eq!(
        bases,
        vec!["ephemer-linux-", "ephemer-native-macos-"],
        "fewest extra labels first, then a free slot"
    );
    let st = h.state().await;
    assert_eq!(
        st.status.pending, 1,
        "the third waits for a most-specific slot"
    );
    h.queued(4, &["big"]).await;
    h.run_for(Duration::from_secs(1)).await;
    assert_eq!(
        h.gh.lock().unwrap().claims.last().unwrap().1.name_base,
        "ephemer-local-"
    );
}

#[actix_rt::test]
async fn slots_are_held_until_the_runner_goes_and_released_before_a_retry_wait() {
    let h = harness(Setup {
        max_concurrent: 1,
        script: vec![Err(http(502, None, None))],
        ..Setup::default()
    })
    .await;
    h.queued(1, LINUX).await;
    h.queued(2, LINUX).await;
    h.run_for(Duration::from_secs(1)).await;
    // Job 1 failed and waits 30 s on the ladder without its slot: job 2 got it.
    assert_eq!(h.claims(), 2);
    let st = h.state().await;
    assert_eq!(st.status.capacity.used, 1);
    h.run_for(Duration::from_secs(60)).await;
    assert_eq!(h.claims(), 2, "job 1's retry waits for job 2's runner");
    let runner = h.state().await.runners[0].name.clone();
    h.send(
        JobAction::Completed,
        JobInfo {
            runner_name: Some(runner),
            conclusion: Some("success".into()),
            ..job(2, LINUX)
        },
    )
    .await;
    h.run_for(Duration::from_secs(1)).await;
    assert_eq!(h.claims(), 3);
    assert_eq!(
        h.metrics
            .jobs_total
            .with_label_values(&["local", "success"])
            .get(),
        1
    );
}

#[actix_rt::test]
async fn a_parked_dispatch_claims_nothing_after_a_cordon() {
    let h = harness(Setup {
        max_concurrent: 1,
        ..Setup::default()
    })
    .await;
    h.queued(1, LINUX).await;
    h.queued(2, LINUX).await;
    h.run_for(Duration::from_secs(1)).await;
    assert_eq!(h.claims(), 1);
    h.sched.send(SetCordon(true)).await.unwrap().unwrap();
    let runner = h.state().await.runners[0].name.clone();
    h.send(
        JobAction::Completed,
        JobInfo {
            runner_name: Some(runner),
            ..job(1, LINUX)
        },
    )
    .await;
    h.run_for(Duration::from_secs(60)).await;
    assert_eq!(h.claims(), 1);
    let st = h.state().await;
    assert_eq!(
        (st.status.capacity.used, st.status.pending),
        (0, 0),
        "slot released, nothing pending"
    );
    assert_eq!(h.metrics.draining.get(), 1);
}

#[actix_rt::test]
async fn a_burst_is_paced_by_the_claim_budget() {
    let h = harness(Setup {
        claims_per_minute: 60,
        ..Setup::wide(1000)
    })
    .await;
    h.queued_many(0..100).await;
    assert_eq!(h.claims(), 60, "the whole minute's budget at once");
    h.run_for(Duration::from_secs(58)).await;
    assert_eq!(h.claims(), 60, "nothing more inside the window");
    h.run_for(Duration::from_secs(2)).await;
    assert_eq!(
        h.claims(),
        100,
        "the rest as the first claims leave the window"
    );
}

/// A provider whose provisioner died and stays down: the unstarted job it held is re-queued and
/// runs on the other covering provider; new jobs go there too. Nothing is lost.
#[actix_rt::test]
async fn jobs_of_a_dead_provider_move_to_another_covering_provider() {
    let h = harness(Setup {
        providers: vec![
            (ProviderKind::Local, vec!["self-hosted", "linux"], 2),
            (ProviderKind::Linux, vec!["self-hosted", "linux", "x64"], 2),
        ],
        ..Setup::default()
    })
    .await;
    h.queued(1, LINUX).await;
    h.run_for(Duration::from_secs(1)).await;
    let runner = h.state().await.runners[0].clone();
    assert_eq!(
        runner.provider,
        PoolName::from("local"),
        "the most specific provider first"
    );

    h.sched
        .send(crate::provision::ProviderStatus {
            provider: PoolName::from("local"),
            up: false,
            cause: Some("restart policy is never".into()),
        })
        .await
        .unwrap();
    let died = RunnerEventKind::Exited {
        code: None,
        reason: ExitReason::ProvisionerDied,
        detail: None,
    };
    h.sched
        .send(RunnerEvent {
            provider: PoolName::from("local"),
            name: runner.name.clone(),
            kind: died,
        })
        .await
        .unwrap();
    h.queued(2, LINUX).await;
    h.run_for(Duration::from_secs(1)).await;

    let st = h.state().await;
    let providers: Vec<_> = st
        .runners
        .iter()
        .map(|r| (r.intent.job_id, r.provider.clone()))
        .collect();
    assert!(
        providers.contains(&(1, PoolName::from("linux"))),
        "{providers:?}"
    );
    assert!(
        providers.contains(&(2, PoolName::from("linux"))),
        "{providers:?}"
    );
    assert_eq!(
        h.gh.lock().unwrap().deletes,
        vec![runner.id],
        "the dead runner's registration is deleted"
    );
}

/// Under the default budget (150 a minute) a burst of 100 is claimed at once, and a burst of
/// 1,000 never puts more than 150 claims in any 60 s window.
#[actix_rt::test]
async fn claims_follow_a_sliding_window_of_the_budget() {
    let h = harness(Setup::wide(2000)).await;
    h.queued_many(0..100).await;
    assert_eq!(h.claims(), 100, "the burst at once");
    h.queued_many(100..1100).await;
    h.run_for(Duration::from_secs(500)).await;
    assert_eq!(h.claims(), 1100);
    let at: Vec<Instant> =
        h.gh.lock()
            .unwrap()
            .claims
            .iter()
            .map(|(t, _)| *t)
            .collect();
    for (i, start) in at.iter().enumerate() {
        let in_window = at[i..]
            .iter()
            .take_while(|t| **t < *start + Duration::from_secs(60))
            .count();
        assert!(in_window <= 150, "{in_window} claims in one minute");
    }
}

/// A secondary-limit answer is the credential's: every queued claim waits for its
/// `Retry-After`, not only the job that got it.
#[actix_rt::test]
async fn a_secondary_limit_pauses_every_claim() {
    let h = harness(Setup {
        script: vec![Err(http(429, Some(40), Some(30)))],
        ..Setup::default()
    })
    .await;
    h.queued(1, LINUX).await;
    h.run_for(Duration::from_secs(1)).await;
    for id in 2..5 {
        h.queued(id, LINUX).await;
    }
    h.run_for(Duration::from_secs(20)).await;
    assert_eq!(h.claims(), 1, "held back by the pause");
    h.run_for(Duration::from_secs(20)).await;
    assert_eq!(h.claim_offsets(), vec![0, 30, 30, 30, 30]);
}
