//! Several GitHub targets in one scheduler: slots shared in proportion to weight, pacing and
//! rate readings kept per target, pools restricted to targets.

use crate::{github::JitRunner, job::JobAction};
use std::collections::VecDeque;
use std::time::Duration;

use crate::clock::Instant;

use super::tests::at;
use super::*;
use crate::job::JobInfo;
use crate::vocab::RateBucket;
use crate::{
    config::{ClaimRetryConfig, Secret},
    provision::{ExitReason, RunnerEventKind},
    scheduler::fixtures::job,
};

const LABELS: &[&str] = &["self-hosted", "linux"];

fn targets(weights: [u32; 2]) -> Vec<TargetSpec> {
    ["acme", "beta"]
        .into_iter()
        .zip(weights)
        .map(|(owner, weight)| TargetSpec {
            weight,
            claims_per_minute: 1000,
            ..TargetSpec::new(owner)
        })
        .collect()
}

fn two_targets(slots: usize, weights: [u32; 2], pools: Vec<ProviderSpec>) -> (Scheduler, Instant) {
    let t0 = Instant::now();
    let mut settings = super::tests::settings();
    settings.max_concurrent = slots;
    settings.targets = targets(weights);
    settings.providers = pools;
    let backoff = Backoff::try_new(&ClaimRetryConfig::default()).unwrap();
    let mut s = Scheduler::new(settings.clone(), backoff, 1);
    for p in &settings.providers {
        s.on_provider_status(p.name.clone(), true, None, at(t0, 0));
    }
    (s, t0)
}

fn pool(name: &str, slots: usize, targets: Option<Vec<usize>>) -> ProviderSpec {
    ProviderSpec {
        name: PoolName::from(name),
        kind: crate::config::ProviderKind::Local,
        labels: vec!["self-hosted".into(), "linux".into()],
        max_concurrent: slots,
        targets,
        warm: None,
        accel: None,
    }
}

fn queue(s: &mut Scheduler, owner: &str, id: u64, now: Now) -> Vec<Effect> {
    let info = JobInfo {
        key: JobKey::new(owner, id),
        ..job(id, LABELS)
    };
    s.on_job_event(JobAction::Queued, info, Some("d"), now.mono, now)
}

fn claimed_keys(fx: &[Effect]) -> Vec<JobKey> {
    fx.iter()
        .filter_map(|e| match e {
            Effect::Claim { key, .. } => Some(key.clone()),
            _ => None,
        })
        .collect()
}

/// Runs one claimed job to its end: the claim answered, the runner up, the job taken and
/// completed, the runner gone. Returns what the freed slot led to.
fn run_to_end(s: &mut Scheduler, key: &JobKey, runner_id: u64, now: Now) -> Vec<Effect> {
    let name = format!("ephemer-local-{runner_id}");
    let runner = JitRunner {
        id: runner_id,
        name: name.clone(),
        encoded_jit_config: Secret::new("jit"),
    };
    let mut fx = s.on_claim_result(key.clone(), PoolName::from("local"), Ok(runner), now);
    fx.extend(s.on_runner_event(&name, RunnerEventKind::Started { warm: false }, now));
    let ran = JobInfo {
        key: key.clone(),
        runner_name: Some(name.clone()),
        runner_id: Some(runner_id),
        ..job(key.job_id, LABELS)
    };
    fx.extend(s.on_job_event(JobAction::InProgress, ran.clone(), None, now.mono, now));
    fx.extend(s.on_job_event(JobAction::Completed, ran, None, now.mono, now));
    let gone = RunnerEventKind::Exited {
        code: Some(0),
        reason: ExitReason::Exited,
        detail: None,
    };
    fx.extend(s.on_runner_event(&name, gone, now));
    fx
}

/// The case: 2 slots, a burst of 20 jobs from A, then 2 from B (weights 1:1): B's
/// first job is claimed as soon as a slot frees, before A's third, and the slots then
/// alternate; within each target, the oldest job goes first.
#[test]
fn a_burst_from_one_target_does_not_starve_another() {
    let (mut s, t0) = two_targets(2, [1, 1], vec![pool("local", 2, None)]);
    let mut started = Vec::new();
    for id in 1..=20 {
        started.extend(claimed_keys(&queue(&mut s, "acme", id, at(t0, 0))));
    }
    for id in 101..=102 {
        started.extend(claimed_keys(&queue(&mut s, "beta", id, at(t0, 1))));
    }
    assert_eq!(
        started,
        vec![JobKey::new("acme", 1), JobKey::new("acme", 2)]
    );
    let mut in_flight: VecDeque<JobKey> = started.iter().cloned().collect();
    let mut runner_id = 1;
    while started.len() < 8 {
        let key = in_flight.pop_front().unwrap();
        runner_id += 1;
        let next = claimed_keys(&run_to_end(&mut s, &key, runner_id, at(t0, 2 + runner_id)));
        in_flight.extend(next.iter().cloned());
        started.extend(next);
    }
    let order: Vec<String> = started.iter().map(|k| k.to_string()).collect();
    assert_eq!(
        order,
        [
            "acme/1", "acme/2", "beta/101", "acme/3", "beta/102", "acme/4", "acme/5", "acme/6"
        ]
    );
}

/// Weights 3:1: while both have work, A gets three slots for each of B's.
#[test]
fn slots_follow_the_weights() {
    let (mut s, t0) = two_targets(4, [3, 1], vec![pool("local", 4, None)]);
    let mut started = Vec::new();
    for id in 1..=10 {
        started.extend(claimed_keys(&queue(&mut s, "beta", id, at(t0, 0))));
    }
    assert_eq!(started.len(), 4, "B alone takes every slot");
    for id in 1..=10 {
        assert!(queue(&mut s, "acme", id, at(t0, 1)).is_empty());
    }
    // Each freed slot goes to whoever holds fewest per weight: A until it holds 3 to B's 1.
    let mut in_flight: VecDeque<JobKey> = started.iter().cloned().collect();
    let mut next_started = Vec::new();
    for n in 0..4 {
        let key = in_flight.pop_front().unwrap();
        let next = claimed_keys(&run_to_end(&mut s, &key, 10 + n, at(t0, 2 + n)));
        next_started.extend(next);
    }
    let owners: Vec<&str> = next_started.iter().map(|k| &*k.owner).collect();
    assert_eq!(owners, ["acme", "acme", "acme", "beta"]);
}

/// A's registration budget proven empty pauses A's claims only; B's go on.
#[test]
fn an_empty_budget_pauses_only_its_target() {
    let (mut s, t0) = two_targets(8, [1, 1], vec![pool("local", 8, None)]);
    let now = at(t0, 0);
    // The rate actor's book holds acme's empty registration budget; beta's credential is
    // another.
    let book = crate::rate::RateBook::default();
    let headers = crate::vocab::RateHeaders {
        remaining: Some(0),
        limit: Some(10),
        reset: Some(now.unix + 600),
        used: None,
        resource: RateBucket::ActionsRunnerRegistration,
    };
    let bucket = RateBucket::ActionsRunnerRegistration;
    book.observe("acme-token", bucket, Some(headers), None, now.unix);
    s.read_rates(book, vec!["acme-token".into(), "beta-token".into()]);
    let fx_a = queue(&mut s, "acme", 1, now);
    let fx_b = queue(&mut s, "beta", 2, now);
    assert!(claimed_keys(&fx_a).is_empty(), "{fx_a:?}");
    assert!(
        fx_a.iter()
            .any(|e| matches!(e, Effect::ArmTimer { at: Some(at) } if *at >= now.mono + Duration::from_secs(600))),
        "A waits for its reset: {fx_a:?}"
    );
    assert_eq!(claimed_keys(&fx_b), vec![JobKey::new("beta", 2)]);
    assert!(s.take_observations().iter().any(|o| matches!(
        o,
        Observation::ClaimsPaused { target, .. } if target == "acme"
    )));
}

/// Each target has its own claim window: A at its max_claims_per_minute waits, B does not.
#[test]
fn claim_pacing_is_per_target() {
    let (mut s, t0) = {
        let t0 = Instant::now();
        let mut settings = super::tests::settings();
        settings.max_concurrent = 10;
        settings.providers = vec![pool("local", 10, None)];
        settings.targets = targets([1, 1]);
        settings.targets[0].claims_per_minute = 1;
        let backoff = Backoff::try_new(&ClaimRetryConfig::default()).unwrap();
        let mut s = Scheduler::new(settings, backoff, 1);
        s.on_provider_status(PoolName::from("local"), true, None, at(t0, 0));
        (s, t0)
    };
    let now = at(t0, 0);
    assert_eq!(claimed_keys(&queue(&mut s, "acme", 1, now)).len(), 1);
    assert!(claimed_keys(&queue(&mut s, "acme", 2, now)).is_empty());
    assert_eq!(claimed_keys(&queue(&mut s, "beta", 3, now)).len(), 1);
    assert_eq!(claimed_keys(&queue(&mut s, "beta", 4, now)).len(), 1);
}

/// A pool with `targets` takes only those targets' jobs; another target's job waits for a
/// pool that serves it, and is unroutable when none does.
#[test]
fn a_pool_restricted_to_a_target_serves_only_it() {
    let (mut s, t0) = two_targets(4, [1, 1], vec![pool("local", 4, Some(vec![1]))]);
    let now = at(t0, 0);
    assert_eq!(claimed_keys(&queue(&mut s, "beta", 1, now)).len(), 1);
    assert!(queue(&mut s, "acme", 2, now).is_empty());
    assert_eq!(
        *s.view().job(&JobKey::new("acme", 2)).unwrap().phase(),
        Phase::Unroutable
    );
}

/// A delivery's owner picks its target; the installation is that target's.
#[test]
fn each_owner_is_its_target() {
    let (s, _) = two_targets(2, [1, 1], vec![pool("local", 2, None)]);
    assert_eq!(s.setup().target_of("acme"), Some(0));
    assert_eq!(s.setup().target_of("BETA"), Some(1));
    assert_eq!(s.setup().target_of("gamma"), None);
}
