//! The three endings of a job's runner, each path at the core: a swap (never counted), a swap
//! chain longer than the cap (never parked), an idle reap repeated to the cap (parked, as the
//! original's zombie guard), a parked job looked at again on the slow lane, the backstop's
//! re-admission of a job held idle, and failed deletions tried again.

use crate::{
    github::{GithubError, JitRunner},
    job::JobAction,
    provision::{ExitReason, RunnerEventKind},
};
use std::time::Duration;

use crate::clock::Instant;

use super::tests::{at, bad_gateway, core};
use super::*;
use crate::job::JobInfo;
use crate::{config::Secret, github::error::HttpFailure, scheduler::fixtures::job};

const LABELS: &[&str] = &["self-hosted", "linux"];

fn key(id: u64) -> JobKey {
    JobKey::new("acme", id)
}

fn queued(s: &mut Scheduler, id: u64, now: Now) -> Vec<Effect> {
    s.on_job_event(JobAction::Queued, job(id, LABELS), Some("d"), now.mono, now)
}

/// Answers job `id`'s claim with runner `rid`; returns its name.
fn grant(s: &mut Scheduler, id: u64, rid: u64, now: Now) -> (String, Vec<Effect>) {
    let name = format!("ephemer-local-{rid}");
    let runner = JitRunner {
        id: rid,
        name: name.clone(),
        encoded_jit_config: Secret::new("jit"),
    };
    let fx = s.on_claim_result(key(id), PoolName::from("local"), Ok(runner), now);
    (name, fx)
}

/// Job `id`'s claim fails (a dropped connection): it goes on its ladder.
fn refuse(s: &mut Scheduler, id: u64, now: Now) -> Vec<Effect> {
    let e = GithubError::Network {
        endpoint: "generate_jitconfig",
        detail: "reset".into(),
    };
    s.on_claim_result(key(id), PoolName::from("local"), Err(e), now)
}

fn claims(fx: &[Effect]) -> Vec<u64> {
    fx.iter()
        .filter_map(|e| match e {
            Effect::Claim { key, .. } => Some(key.job_id),
            _ => None,
        })
        .collect()
}

fn started(s: &mut Scheduler, id: u64, runner: &str, rid: u64, now: Now) -> Vec<Effect> {
    let info = JobInfo {
        runner_name: Some(runner.into()),
        runner_id: Some(rid),
        ..job(id, LABELS)
    };
    s.on_job_event(JobAction::InProgress, info, Some("d"), now.mono, now)
}

fn exited(
    s: &mut Scheduler,
    name: &str,
    code: Option<i32>,
    reason: ExitReason,
    now: Now,
) -> Vec<Effect> {
    s.on_runner_event(
        name,
        RunnerEventKind::Exited {
            code,
            reason,
            detail: None,
        },
        now,
    )
}

fn phase(s: &Scheduler, id: u64) -> Phase {
    s.view().job(&key(id)).unwrap().phase().clone()
}

/// One zombie pass for job 1: claimed, booted, idle through the grace, reaped; returns the
/// effects of the reaped runner's exit.
fn idle_pass(s: &mut Scheduler, t0: Instant, start: u64, rid: u64) -> Vec<Effect> {
    let (name, _) = grant(s, 1, rid, at(t0, start));
    s.on_runner_event(
        &name,
        RunnerEventKind::Started { warm: false },
        at(t0, start + 1),
    );
    let fx = s.sweep(at(t0, start + 601));
    assert!(
        fx.iter().any(
            |e| matches!(e, Effect::CheckIdle { reason, .. } if *reason == sweep::REAP_ORPHAN)
        ),
        "the idle runner is an orphan after the grace: {fx:?}"
    );
    let fx = s.on_idle_checked(&name, Ok(false), sweep::REAP_ORPHAN, at(t0, start + 602));
    assert!(fx.iter().any(|e| matches!(e, Effect::Teardown { .. })));
    exited(s, &name, None, ExitReason::TornDown, at(t0, start + 603))
}

#[test]
fn a_runner_that_takes_a_sibling_leaves_its_job_claiming_again_at_once_and_uncounted() {
    let (mut s, t0) = core();
    assert_eq!(claims(&queued(&mut s, 1, at(t0, 0))), vec![1]);
    assert_eq!(claims(&queued(&mut s, 2, at(t0, 0))), vec![2]);
    let (a, _) = grant(&mut s, 1, 11, at(t0, 1));
    // Job 2's claim failed: it waits on the ladder, and a (made for job 1) takes it.
    refuse(&mut s, 2, at(t0, 1));
    assert_eq!(phase(&s, 2), Phase::Retrying);
    let fx = started(&mut s, 2, &a, 11, at(t0, 3));
    assert_eq!(
        claims(&fx),
        vec![1],
        "job 1 is claimed for again while a runs job 2"
    );
    let j1 = s.view().job(&key(1)).unwrap();
    assert_eq!((j1.idle_reaps(), j1.quiet_exits()), (0, 0));
    assert!(
        s.state.ladder.queue().get(&key(2)).is_none(),
        "job 2 left its ladder"
    );
    // a finishes job 2 and exits cleanly: nothing for job 1, no deletion (GitHub removed it).
    let fx = exited(&mut s, &a, Some(0), ExitReason::Exited, at(t0, 9));
    assert!(
        fx.iter()
            .all(|e| !matches!(e, Effect::Claim { .. } | Effect::DeleteRunner { .. })),
        "{fx:?}"
    );
}

#[test]
fn a_swap_chain_longer_than_the_cap_never_parks_the_job() {
    let (mut s, t0) = core();
    queued(&mut s, 1, at(t0, 0));
    // Eight times over, job 1's runner takes an older sibling first (as GitHub's oldest-first
    // assignment does under a backlog): each time job 1 is claimed for again, never capped.
    for round in 0..8u64 {
        let t = round * 10;
        let (name, _) = grant(&mut s, 1, 100 + round, at(t0, t + 1));
        let sibling = 500 + round;
        assert_eq!(
            claims(&queued(&mut s, sibling, at(t0, t + 1))),
            vec![sibling]
        );
        // The sibling's own claim is still in flight when job 1's runner takes it.
        let fx = started(&mut s, sibling, &name, 100 + round, at(t0, t + 2));
        assert_eq!(claims(&fx), vec![1], "round {round}: {fx:?}");
        let fx = exited(&mut s, &name, Some(0), ExitReason::Exited, at(t0, t + 5));
        assert!(claims(&fx).is_empty());
        // The sibling's claim comes back after it started, and job 1 has a claim in flight:
        // no job waits for this runner, so it is deleted before it boots.
        let (_, fx) = grant(&mut s, sibling, 900 + round, at(t0, t + 6));
        assert!(
            fx.iter()
                .any(|e| matches!(e, Effect::DeleteRunner(d) if d.runner_id == 900 + round)),
            "round {round}: {fx:?}"
        );
    }
    let j1 = s.view().job(&key(1)).unwrap();
    assert!(
        !matches!(j1.phase(), Phase::Parked { .. }),
        "{:?}",
        j1.phase()
    );
    assert_eq!(j1.idle_reaps(), 0);
    assert!(
        j1.timeline()
            .iter()
            .all(|e| !matches!(e.note, Note::Parked { .. })),
        "never parked"
    );
}

#[test]
fn a_job_whose_runners_are_always_reaped_idle_is_parked_after_the_cap_and_looked_at_again() {
    let (mut s, t0) = core();
    assert_eq!(claims(&queued(&mut s, 1, at(t0, 0))), vec![1]);
    let mut t = 0;
    for pass in 1..ZOMBIE_CAP as u64 {
        let fx = idle_pass(&mut s, t0, t, pass);
        assert_eq!(claims(&fx), vec![1], "pass {pass}: dispatched again");
        assert_eq!(
            u32::from(s.view().job(&key(1)).unwrap().idle_reaps()),
            pass as u32
        );
        t += 700;
    }
    // The fifth idle reap parks it: nothing claimed, a look due in 30 minutes.
    let fx = idle_pass(&mut s, t0, t, 99);
    assert!(claims(&fx).is_empty(), "{fx:?}");
    let look_unix = match phase(&s, 1) {
        Phase::Parked {
            reason: ParkReason::Zombie,
            look_unix,
        } => look_unix,
        other => panic!("{other:?}"),
    };
    assert!(s.take_observations().contains(&Observation::Parked {
        job_id: 1,
        reason: ParkReason::Zombie
    }));
    // A reconcile pass before the look leaves it (counted as held idle) ...
    let fx = s.on_reconcile(0, vec![job(1, LABELS)], at(t0, t + 900));
    assert!(claims(&fx).is_empty());
    assert!(
        s.take_observations()
            .contains(&Observation::QueuedIdle { jobs: 1 })
    );
    // ... and the slow lane looks at it at its time: GitHub is asked, not claimed from.
    let due = look_unix - super::tests::UNIX0;
    let fx = s.on_timer(at(t0, due));
    assert_eq!(
        fx.iter()
            .filter(|e| matches!(e, Effect::LookAtJob { key, .. } if key.job_id == 1))
            .count(),
        1,
        "{fx:?}"
    );
    // Still queued: admitted again, one claim.
    let fx = s.on_job_looked(&key(1), Ok("queued".into()), at(t0, due + 1));
    assert_eq!(claims(&fx), vec![1]);
    // Its next idle reap parks it again at once (the cap is reached already).
    let fx = idle_pass(&mut s, t0, due + 2, 200);
    assert!(claims(&fx).is_empty());
    assert!(matches!(phase(&s, 1), Phase::Parked { .. }));
    // A look that finds it completed is the end of it.
    let Phase::Parked { look_unix, .. } = phase(&s, 1) else {
        unreachable!()
    };
    let due = look_unix - super::tests::UNIX0;
    s.on_timer(at(t0, due));
    let fx = s.on_job_looked(&key(1), Ok("completed".into()), at(t0, due + 1));
    assert!(claims(&fx).is_empty());
    assert_eq!(phase(&s, 1), Phase::Done);
}

#[test]
fn a_new_delivery_for_a_parked_job_admits_it_again() {
    let (mut s, t0) = core();
    queued(&mut s, 1, at(t0, 0));
    s.on_claim_result(
        key(1),
        PoolName::from("local"),
        Err(GithubError::Http(HttpFailure {
            endpoint: "generate_jitconfig",
            status: 422,
            message: "runner group not allowed".into(),
            documentation_url: None,
            rate_remaining: None,
            rate_bucket: None,
            rate_reset: None,
            retry_after: None,
        })),
        at(t0, 1),
    );
    assert!(matches!(
        phase(&s, 1),
        Phase::Parked {
            reason: ParkReason::NotRetryable,
            ..
        }
    ));
    // GitHub's redelivery (or a re-run) brings it: claimed again at once.
    assert_eq!(claims(&queued(&mut s, 1, at(t0, 60))), vec![1]);
}

#[test]
fn a_job_held_idle_while_github_lists_it_queued_is_admitted_by_the_next_reconcile() {
    let (mut s, t0) = core();
    // Cordoned when it came: seen, not admitted.
    s.set_cordon(true, at(t0, 0)).unwrap();
    assert!(queued(&mut s, 1, at(t0, 1)).is_empty());
    s.set_cordon(false, at(t0, 2)).unwrap();
    assert_eq!(phase(&s, 1), Phase::Seen);
    // A delivery inside the dedup window is a duplicate ...
    assert!(claims(&queued(&mut s, 1, at(t0, 3))).is_empty());
    // ... but GitHub listing it queued is not: the reconcile admits it.
    let fx = s.on_reconcile(0, vec![job(1, LABELS)], at(t0, 20));
    assert_eq!(claims(&fx), vec![1]);
    assert!(s.take_observations().contains(&Observation::Readmitted {
        job_id: 1,
        reason: "idle"
    }));
    // One the daemon never heard of is admitted too, counted as unknown.
    let fx = s.on_reconcile(0, vec![job(2, LABELS)], at(t0, 21));
    assert_eq!(claims(&fx), vec![2]);
    assert!(s.take_observations().contains(&Observation::Readmitted {
        job_id: 2,
        reason: "unknown"
    }));
}

#[test]
fn a_failed_deletion_is_tried_again_with_a_growing_wait_and_a_clean_exit_is_never_deleted() {
    let (mut s, t0) = core();
    queued(&mut s, 1, at(t0, 0));
    let (a, _) = grant(&mut s, 1, 11, at(t0, 1));
    // Crashed at boot: its registration is deleted after the wait for a late event.
    exited(&mut s, &a, Some(2), ExitReason::Exited, at(t0, 2));
    let fx = s.on_timer(at(t0, 12));
    let delete = fx
        .iter()
        .find(|e| matches!(e, Effect::DeleteRunner(d) if d.attempt == 0))
        .cloned()
        .unwrap_or_else(|| panic!("{fx:?}"));
    let Effect::DeleteRunner(deletion) = delete else {
        unreachable!()
    };
    let fail = || {
        Err(GithubError::Http(HttpFailure {
            endpoint: "delete_runner",
            status: 500,
            message: "oops".into(),
            documentation_url: None,
            rate_remaining: None,
            rate_bucket: None,
            rate_reset: None,
            retry_after: None,
        }))
    };
    let fx = s.on_runner_deleted(
        Deletion {
            attempt: 0,
            ..deletion.clone()
        },
        fail(),
        at(t0, 12),
    );
    assert_eq!(
        fx,
        vec![Effect::ArmTimer {
            at: Some(t0 + Duration::from_secs(17))
        }]
    );
    let fx = s.on_timer(at(t0, 17));
    assert!(
        fx.iter()
            .any(|e| matches!(e, Effect::DeleteRunner(d) if d.attempt == 1)),
        "{fx:?}"
    );
    let fx = s.on_runner_deleted(
        Deletion {
            attempt: 1,
            ..deletion.clone()
        },
        fail(),
        at(t0, 17),
    );
    assert_eq!(
        fx,
        vec![Effect::ArmTimer {
            at: Some(t0 + Duration::from_secs(27))
        }],
        "the wait doubles"
    );
    // A runner that exits 0 by itself ran a job: GitHub removed it; nothing is deleted.
    queued(&mut s, 2, at(t0, 30));
    let (b, _) = grant(&mut s, 2, 12, at(t0, 31));
    let fx = exited(&mut s, &b, Some(0), ExitReason::Exited, at(t0, 40));
    let fx: Vec<Effect> = fx.into_iter().chain(s.on_timer(at(t0, 60))).collect();
    assert!(
        fx.iter()
            .all(|e| !matches!(e, Effect::DeleteRunner(d) if d.runner_id == 12)),
        "{fx:?}"
    );
}

/// The registrations the core tells the ledger are gone from GitHub (`Op::Unregistered`).
fn unregistered(s: &mut Scheduler) -> Vec<String> {
    s.take_ops()
        .into_iter()
        .filter_map(|op| match op {
            crate::durable::Op::Unregistered(name) => Some(name),
            _ => None,
        })
        .collect()
}

/// The cluster ledger keeps a registration past its environment until it is surely gone from
/// GitHub, for a survivor to delete if this host dies: so the core says when it is. Gone: a
/// runner an event named with a job (GitHub removes it after the job), one named only after it
/// went, and a deletion GitHub answered. Not gone: one whose deletion failed, or a clean exit
/// no event explained (a guess: left for a survivor).
#[test]
fn registrations_are_told_gone_only_when_github_surely_has_none() {
    let (mut s, t0) = core();
    queued(&mut s, 1, at(t0, 0));
    let (a, _) = grant(&mut s, 1, 11, at(t0, 1));
    started(&mut s, 1, &a, 11, at(t0, 2));
    unregistered(&mut s);
    exited(&mut s, &a, Some(0), ExitReason::Exited, at(t0, 3));
    assert_eq!(unregistered(&mut s), [a], "bound: removed by GitHub");

    // Crashed at boot: deleted after the wait for a late event; a failed deletion is not gone.
    queued(&mut s, 2, at(t0, 4));
    let (b, _) = grant(&mut s, 2, 12, at(t0, 5));
    exited(&mut s, &b, Some(2), ExitReason::Exited, at(t0, 6));
    let fx = s.on_timer(at(t0, 20));
    let Some(Effect::DeleteRunner(deletion)) = fx
        .iter()
        .find(|e| matches!(e, Effect::DeleteRunner(d) if d.name == b))
        .cloned()
    else {
        panic!("{fx:?}")
    };
    assert_eq!(unregistered(&mut s), Vec::<String>::new());
    s.on_runner_deleted(deletion.clone(), Err(bad_gateway()), at(t0, 20));
    assert_eq!(
        unregistered(&mut s),
        Vec::<String>::new(),
        "a failed deletion"
    );
    s.on_runner_deleted(deletion, Ok(()), at(t0, 30));
    assert_eq!(unregistered(&mut s), [b], "a deletion answered");

    // A runner named by a late event after it went: its deletion is skipped, and it is gone.
    queued(&mut s, 3, at(t0, 40));
    let (c, _) = grant(&mut s, 3, 13, at(t0, 41));
    exited(&mut s, &c, Some(2), ExitReason::Exited, at(t0, 42));
    started(&mut s, 3, &c, 13, at(t0, 43));
    let fx = s.on_timer(at(t0, 60));
    assert!(
        fx.iter()
            .all(|e| !matches!(e, Effect::DeleteRunner(d) if d.name == c)),
        "{fx:?}"
    );
    assert_eq!(unregistered(&mut s), [c], "named late");

    // A clean exit with no event naming it: kept for a survivor.
    queued(&mut s, 4, at(t0, 70));
    let (d, _) = grant(&mut s, 4, 14, at(t0, 71));
    exited(&mut s, &d, Some(0), ExitReason::Exited, at(t0, 72));
    s.on_timer(at(t0, 90));
    assert_eq!(unregistered(&mut s), Vec::<String>::new(), "{d}: a guess");
}

fn looks(fx: &[Effect]) -> Vec<u64> {
    fx.iter()
        .filter_map(|e| match e {
            Effect::LookAtJob { key, .. } => Some(key.job_id),
            _ => None,
        })
        .collect()
}

/// A runner that exits 0 with no event naming it most likely ran a job whose events are late
/// or lost: GitHub is asked first, and the job is dispatched again only if it is still queued
/// there (or GitHub cannot say). After `QUIET_EXITS_FREE` such exits it is a failure.
#[test]
fn clean_exits_with_no_job_seen_climb_the_ladder_once_they_keep_coming() {
    let (mut s, t0) = core();
    queued(&mut s, 1, at(t0, 0));
    for n in 1..=u64::from(QUIET_EXITS_FREE) {
        let (name, _) = grant(&mut s, 1, 10 + n, at(t0, n * 10));
        let fx = exited(
            &mut s,
            &name,
            Some(0),
            ExitReason::Exited,
            at(t0, n * 10 + 1),
        );
        assert_eq!(claims(&fx), Vec::<u64>::new(), "quiet exit {n}: {fx:?}");
        assert_eq!(looks(&fx), vec![1], "quiet exit {n}: looked at first");
        let answer = if n == 1 {
            Ok("queued".to_string())
        } else {
            Err(bad_gateway())
        };
        let fx = s.on_job_looked(&JobKey::new("acme", 1), answer, at(t0, n * 10 + 2));
        assert_eq!(
            claims(&fx),
            vec![1],
            "quiet exit {n}: still queued (or no answer): dispatched again"
        );
    }
    let (name, _) = grant(&mut s, 1, 99, at(t0, 100));
    let fx = exited(&mut s, &name, Some(0), ExitReason::Exited, at(t0, 101));
    assert!(claims(&fx).is_empty(), "{fx:?}");
    assert_eq!(
        phase(&s, 1),
        Phase::Retrying,
        "a runner that keeps exiting is a failure"
    );
}

#[test]
fn a_spare_is_handed_to_a_job_on_the_ladder_instead_of_a_new_claim() {
    let (mut s, t0) = core();
    queued(&mut s, 1, at(t0, 0));
    queued(&mut s, 2, at(t0, 0));
    let (a, _) = grant(&mut s, 1, 11, at(t0, 1));
    refuse(&mut s, 2, at(t0, 1));
    // Job 1 runs on a runner that is not ours: a is a spare, and job 2 waits on its ladder.
    let fx = started(&mut s, 1, "someone-else", 999, at(t0, 2));
    assert!(claims(&fx).is_empty());
    assert_eq!(
        phase(&s, 2),
        Phase::Active {
            provider: PoolName::from("local"),
            runner: Arc::from(a.as_str()),
        }
    );
    assert!(
        s.take_observations()
            .contains(&Observation::SpareHandedOver {
                job_id: 2,
                runner: a.clone(),
                from: 1
            })
    );
    // Its retry does not fire a claim while a serves it.
    let fx = s.on_timer(at(t0, 120));
    assert!(claims(&fx).is_empty(), "{fx:?}");
    // a crashing now climbs job 2's own item.
    exited(&mut s, &a, Some(1), ExitReason::Exited, at(t0, 121));
    assert_eq!(phase(&s, 2), Phase::Retrying);
    assert_eq!(s.state.ladder.queue().get(&key(2)).unwrap().attempts, 2);
}

/// A quiet exit whose job GitHub says ran (its `in_progress` and `completed` lost): nothing is
/// claimed again, the job is done, and no registration is spent on it.
#[test]
fn a_quiet_exit_whose_job_ran_claims_nothing_again() {
    let (mut s, t0) = core();
    queued(&mut s, 1, at(t0, 0));
    let (name, _) = grant(&mut s, 1, 11, at(t0, 1));
    let fx = exited(&mut s, &name, Some(0), ExitReason::Exited, at(t0, 3));
    assert_eq!(looks(&fx), vec![1]);
    let fx = s.on_job_looked(
        &JobKey::new("acme", 1),
        Ok("completed".to_string()),
        at(t0, 4),
    );
    assert_eq!(claims(&fx), Vec::<u64>::new(), "{fx:?}");
    assert_eq!(phase(&s, 1), Phase::Done);
    s.sweep(at(t0, 700));
    assert_eq!(claims(&s.on_timer(at(t0, 701))), Vec::<u64>::new());
}

/// Scale-set mode: GitHub cannot say where a runner request stands, so the core answers a
/// parked job's look itself (`queued`: it stays assigned until its `JobCompleted` comes) and
/// claims for it again, with no call to GitHub.
#[test]
fn a_parked_scale_set_job_is_claimed_for_again_without_asking_github() {
    let mut settings = super::tests::settings();
    settings.scaleset = true;
    let (mut s, t0, _) = super::tests::core_with(settings);
    assert_eq!(claims(&queued(&mut s, 1, at(t0, 0))), vec![1]);
    // A claim the service refuses as invalid: not retryable, parked with a look due.
    let refused = crate::scheduler::fixtures::http(422, None, None);
    s.on_claim_result(key(1), PoolName::from("local"), Err(refused), at(t0, 1));
    let Phase::Parked { look_unix, .. } = phase(&s, 1) else {
        panic!("not parked: {:?}", phase(&s, 1));
    };
    let due = look_unix - super::tests::UNIX0;
    let fx = s.on_timer(at(t0, due));
    assert!(
        !fx.iter().any(|e| matches!(e, Effect::LookAtJob { .. })),
        "GitHub is not asked: {fx:?}"
    );
    assert_eq!(claims(&fx), vec![1], "claimed for again: {fx:?}");
}
