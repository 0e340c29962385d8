//! The pure core driven directly: hand-made times in, the exact effects out. No actix, no
//! timers; the actor-level tests (`scheduler/tests/`) cover the wiring.

use crate::config::PoolName;
use crate::{
    github::{GithubError, JitRunner},
    job::JobAction,
    provision::RunnerEventKind,
};
use std::time::Duration;

use crate::clock::Instant;

use super::*;
use crate::{
    config::{ClaimRetryConfig, ProviderKind, Secret},
    github::error::HttpFailure,
    scheduler::fixtures::job,
};

pub(super) use crate::scheduler::fixtures::UNIX0;
const LABELS: &[&str] = &["self-hosted", "linux"];

pub(super) fn settings() -> SchedulerSettings {
    SchedulerSettings {
        providers: vec![ProviderSpec {
            name: PoolName::from("local"),
            kind: ProviderKind::Local,
            labels: vec!["self-hosted".into(), "linux".into(), "x64".into()],
            max_concurrent: 4,
            targets: None,
            warm: None,
            accel: None,
        }],
        max_concurrent: 4,
        name_prefix: "ephemer".into(),
        install_id: String::new(),
        targets: vec![TargetSpec {
            installation_id: Some(77),
            ..TargetSpec::new("acme")
        }],
        retry_enabled: true,
        seen_ttl: SEEN_TTL,
        started_ttl: Duration::from_secs(7200),
        retention: Duration::from_secs(3600),
        usage_retention: Duration::from_secs(86_400),
        zombie_cap: ZOMBIE_CAP,
        heal_grace: Duration::ZERO,
        orphan_grace: Some(Duration::from_secs(600)),
        reconcile_interval: None,
        fleet: false,
        scaleset: false,
        traces: false,
    }
}

/// A scheduler whose one provider is up, at `t0`.
pub(super) fn core() -> (Scheduler, Instant) {
    let (s, t0, fx) = core_with(settings());
    assert_eq!(fx, vec![]);
    (s, t0)
}

/// A scheduler with `settings` whose first provider is up, at `t0`, and what that brought.
pub(super) fn core_with(settings: SchedulerSettings) -> (Scheduler, Instant, Vec<Effect>) {
    let t0 = Instant::now();
    let backoff = Backoff::try_new(&ClaimRetryConfig {
        schedule: vec![Duration::from_secs(30), Duration::from_secs(60)],
        jitter: 0.0,
        ..ClaimRetryConfig::default()
    })
    .unwrap();
    let mut s = Scheduler::new(settings, backoff, 1);
    let pool = s.setup.settings.providers[0].name.clone();
    let fx = s.on_provider_status(pool, true, None, at(t0, 0));
    (s, t0, fx)
}

pub(super) fn at(t0: Instant, secs: u64) -> Now {
    Now::whole_seconds(t0 + Duration::from_secs(secs), UNIX0 + secs)
}

fn queued(s: &mut Scheduler, id: u64, labels: &[&str], now: Now) -> Vec<Effect> {
    s.on_job_event(JobAction::Queued, job(id, labels), Some("d"), now.mono, now)
}

fn claim(id: u64) -> Effect {
    Effect::Claim {
        key: JobKey::new("acme", id),
        provider: PoolName::from("local"),
        request: ClaimRequest {
            repo: None,
            name_base: "ephemer-local-".into(),
            labels: vec!["self-hosted".into(), "linux".into(), "x64".into()],
        },
    }
}

pub(super) fn bad_gateway() -> GithubError {
    GithubError::Http(HttpFailure {
        endpoint: "generate_jitconfig",
        status: 502,
        message: "bad gateway".into(),
        documentation_url: None,
        rate_remaining: None,
        rate_bucket: None,
        rate_reset: None,
        retry_after: None,
    })
}

fn phase(s: &Scheduler, id: u64) -> Phase {
    s.view()
        .job(&JobKey::new("acme", id))
        .unwrap()
        .phase()
        .clone()
}

#[test]
fn a_queued_job_is_claimed_for_the_covering_provider() {
    let (mut s, t0) = core();
    assert_eq!(queued(&mut s, 1, LABELS, at(t0, 0)), vec![claim(1)]);
    assert_eq!(
        phase(&s, 1),
        Phase::Claiming {
            provider: PoolName::from("local")
        }
    );
    assert!(s.take_observations().contains(&Observation::Claiming {
        job_id: 1,
        provider: PoolName::from("local")
    }));
}

#[test]
fn a_duplicate_costs_nothing() {
    let (mut s, t0) = core();
    queued(&mut s, 1, LABELS, at(t0, 0));
    s.take_observations();
    assert_eq!(queued(&mut s, 1, LABELS, at(t0, 1)), vec![]);
    assert_eq!(
        s.take_observations(),
        vec![Observation::Duplicate {
            job_id: 1,
            delivery: Some("d".into())
        }]
    );
    assert_eq!(s.view().stats().duplicates, 1);
    // Not even a look-up of its strings: a copy the shared table does not hold stays out of it.
    let shared = |s: &Scheduler| {
        let c = s.view().census();
        c.iter()
            .filter(|(n, _)| n.starts_with("scheduler.shared"))
            .map(|(_, v)| v)
            .sum::<usize>()
    };
    let before = shared(&s);
    let redelivered = JobInfo {
        repo: "another-spelling".into(),
        ..job(1, &["self-hosted", "linux", "x64", "unheard-of"])
    };
    s.on_job_event(JobAction::Queued, redelivered, Some("d2"), t0, at(t0, 2));
    assert_eq!(s.view().stats().duplicates, 2);
    assert_eq!(shared(&s), before);
}

#[test]
fn a_job_no_provider_covers_is_not_claimed_and_its_redelivery_is_free() {
    let (mut s, t0) = core();
    assert_eq!(
        queued(&mut s, 1, &["self-hosted", "gpu"], at(t0, 0)),
        vec![]
    );
    assert_eq!(phase(&s, 1), Phase::Unroutable);
    assert_eq!(
        queued(&mut s, 1, &["self-hosted", "gpu"], at(t0, 5)),
        vec![]
    );
    assert_eq!(
        s.view().stats().duplicates,
        1,
        "the dedup gate before the label check"
    );
    let timeline = &s.view().job(&JobKey::new("acme", 1)).unwrap().timeline();
    assert!(matches!(timeline[1].note, Note::Unroutable { .. }));
}

#[test]
fn a_failed_claim_goes_on_the_ladder_and_arms_the_timer() {
    let (mut s, t0) = core();
    queued(&mut s, 1, LABELS, at(t0, 0));
    let fx = s.on_claim_result(
        JobKey::new("acme", 1),
        PoolName::from("local"),
        Err(bad_gateway()),
        at(t0, 1),
    );
    assert_eq!(
        fx,
        vec![Effect::ArmTimer {
            at: Some(t0 + Duration::from_secs(31))
        }]
    );
    assert_eq!(phase(&s, 1), Phase::Retrying);
    assert_eq!(s.view().ladder_depth(), 1);
    assert!(matches!(s.take_ops().last(), Some(Op::PutRetry(row)) if row.attempts == 1));
}

#[test]
fn a_due_retry_claims_again_and_a_second_failure_keeps_the_first_failure() {
    let (mut s, t0) = core();
    queued(&mut s, 1, LABELS, at(t0, 0));
    let key = JobKey::new("acme", 1);
    s.on_claim_result(
        key.clone(),
        PoolName::from("local"),
        Err(bad_gateway()),
        at(t0, 0),
    );
    assert_eq!(
        s.on_timer(at(t0, 29)),
        vec![Effect::ArmTimer {
            at: Some(t0 + Duration::from_secs(30))
        }],
        "an early fire is re-armed for the same item"
    );
    assert_eq!(s.on_timer(at(t0, 30)), vec![claim(1)]);
    let fx = s.on_claim_result(key, PoolName::from("local"), Err(bad_gateway()), at(t0, 31));
    assert_eq!(
        fx,
        vec![Effect::ArmTimer {
            at: Some(t0 + Duration::from_secs(91))
        }],
        "the second rung, 60 s"
    );
    let view = s.view().retry_queue(at(t0, 31));
    assert_eq!(view.items[0].attempts, 2);
    assert_eq!(view.items[0].first_failure_secs_ago, 31.0);
}

#[test]
fn in_progress_while_retrying_leaves_the_ladder_and_disarms_the_timer() {
    let (mut s, t0) = core();
    queued(&mut s, 1, LABELS, at(t0, 0));
    s.on_claim_result(
        JobKey::new("acme", 1),
        PoolName::from("local"),
        Err(bad_gateway()),
        at(t0, 0),
    );
    let started = JobInfo {
        runner_name: Some("someone-elses-runner".into()),
        ..job(1, LABELS)
    };
    let fx = s.on_job_event(JobAction::InProgress, started, Some("d2"), t0, at(t0, 5));
    assert_eq!(fx, vec![Effect::ArmTimer { at: None }]);
    assert_eq!(phase(&s, 1), Phase::Done);
    assert_eq!(s.view().ladder_depth(), 0);
    assert_eq!(s.on_timer(at(t0, 60)), vec![], "no claim once it ran");
}

#[test]
fn a_claimed_runner_is_handed_to_its_provisioner() {
    let (mut s, t0) = core();
    queued(&mut s, 1, LABELS, at(t0, 0));
    let runner = JitRunner {
        id: 7,
        name: "ephemer-local-abc".into(),
        encoded_jit_config: Secret::new("jit"),
    };
    let fx = s.on_claim_result(
        JobKey::new("acme", 1),
        PoolName::from("local"),
        Ok(runner),
        at(t0, 1),
    );
    assert_eq!(
        fx,
        vec![Effect::Provision {
            provider: PoolName::from("local"),
            spec: RunnerSpec {
                name: "ephemer-local-abc".into(),
                runner_id: 7,
                jit_config: Secret::new("jit"),
                intent: JobKey::new("acme", 1),
                labels: vec!["self-hosted".into(), "linux".into(), "x64".into()],
            },
        }]
    );
}

#[test]
fn a_pool_that_is_down_claims_nothing_until_it_comes_up() {
    let t0 = Instant::now();
    let backoff = Backoff::try_new(&ClaimRetryConfig::default()).unwrap();
    let mut s = Scheduler::new(settings(), backoff, 1);
    assert_eq!(queued(&mut s, 1, LABELS, at(t0, 0)), vec![], "not up yet");
    assert_eq!(phase(&s, 1), Phase::Pending);
    let fx = s.on_provider_status(PoolName::from("local"), true, None, at(t0, 1));
    assert_eq!(fx, vec![claim(1)]);
}

/// A runner that was claimed and handed over, for the provisioning-failure tests.
fn claimed(s: &mut Scheduler, t0: Instant) -> String {
    queued(s, 1, LABELS, at(t0, 0));
    let runner = JitRunner {
        id: 7,
        name: "ephemer-local-abc".into(),
        encoded_jit_config: Secret::new("jit"),
    };
    s.on_claim_result(
        JobKey::new("acme", 1),
        PoolName::from("local"),
        Ok(runner),
        at(t0, 1),
    );
    "ephemer-local-abc".into()
}

#[test]
fn an_environment_that_failed_once_climbs_the_ladder() {
    let (mut s, t0) = core();
    let name = claimed(&mut s, t0);
    let error = crate::provision::ProvisionError::EnvironmentFailed("vm did not boot".into());
    assert!(error.is_retryable());
    let fx = s.on_runner_event(&name, RunnerEventKind::Failed { error }, at(t0, 2));
    assert_eq!(
        fx,
        vec![
            Effect::DeleteRunner(Deletion {
                owner: "acme".into(),
                repo: None,
                runner_id: 7,
                name: name.clone(),
                attempt: 0,
            }),
            Effect::ArmTimer {
                at: Some(t0 + Duration::from_secs(32))
            },
        ]
    );
    assert_eq!(phase(&s, 1), Phase::Retrying);
    assert_eq!(
        s.view().retry_queue(at(t0, 2)).items[0].class,
        ErrorClass::UnknownRetryable
    );
}

#[test]
fn a_pool_that_cannot_run_jobs_sends_the_job_back_to_wait_without_a_rung() {
    let (mut s, t0) = core();
    let name = claimed(&mut s, t0);
    // The supervisor reports the pool down before it relays the failure.
    let cause = "the host cannot make runner environments: no engine";
    let down = s.on_provider_status(
        PoolName::from("local"),
        false,
        Some(cause.into()),
        at(t0, 2),
    );
    assert_eq!(down, vec![]);
    let error = crate::provision::ProvisionError::HostUnavailable("no engine".into());
    assert!(!error.is_retryable());
    let fx = s.on_runner_event(&name, RunnerEventKind::Failed { error }, at(t0, 2));
    assert_eq!(
        fx,
        vec![Effect::DeleteRunner(Deletion {
            owner: "acme".into(),
            repo: None,
            runner_id: 7,
            name,
            attempt: 0,
        })]
    );
    assert_eq!(phase(&s, 1), Phase::Pending, "waits for the pool");
    assert_eq!(s.view().ladder_depth(), 0, "no rung spent");
    let up = s.on_provider_status(PoolName::from("local"), true, None, at(t0, 40));
    assert_eq!(up, vec![claim(1)], "claimed again once the pool is back");
}

/// Jobs of another owner, of a repo outside `github.repos`, or delivered for another App
/// installation cost nothing: no effect, remembered as ignored with the reason, counted.
#[test]
fn jobs_outside_the_owner_repos_or_installation_are_ignored() {
    let t0 = Instant::now();
    let backoff = Backoff::try_new(&ClaimRetryConfig::default()).unwrap();
    let mut settings = settings();
    settings.targets[0].repos = vec!["app".into()];
    let mut s = Scheduler::new(settings, backoff, 1);
    s.on_provider_status(PoolName::from("local"), true, None, at(t0, 0));
    s.take_observations();
    let other_owner = JobInfo {
        key: JobKey::new("evil", 1),
        ..job(1, LABELS)
    };
    let other_repo = JobInfo {
        repo: "fork-prs".into(),
        ..job(2, LABELS)
    };
    let other_installation = JobInfo {
        installation_id: Some(99),
        ..job(3, LABELS)
    };
    for (j, reason) in [(other_owner, "owner"), (other_repo, "repo")] {
        let id = j.key.job_id;
        let key = j.key.clone();
        let fx = s.on_job_event(JobAction::Queued, j, Some("d"), t0, at(t0, 1));
        assert_eq!(fx, vec![], "{reason}");
        assert_eq!(*s.view().job(&key).unwrap().phase(), Phase::Ignored);
        assert_eq!(
            s.take_observations(),
            vec![Observation::Ignored { job_id: id, reason }]
        );
    }
    // Another installation: said with both ids and counted, never remembered, so the
    // reconcile (listing with the daemon's own installation) admits the owner's job.
    let key = other_installation.key.clone();
    let fx = s.on_job_event(
        JobAction::Queued,
        other_installation.clone(),
        Some("d"),
        t0,
        at(t0, 1),
    );
    assert_eq!(fx, vec![]);
    assert!(s.view().job(&key).is_none(), "not remembered");
    assert_eq!(
        s.take_observations(),
        vec![
            Observation::Ignored {
                job_id: 3,
                reason: "installation"
            },
            Observation::OtherInstallation {
                job_id: 3,
                repo: other_installation.repo.to_string(),
                installation: 99,
                ours: 77,
            }
        ]
    );
    let listed = JobInfo {
        installation_id: None,
        ..other_installation
    };
    let fx = s.on_reconcile(0, vec![listed], at(t0, 2));
    assert!(
        fx.iter().any(|e| matches!(e, Effect::Claim { .. })),
        "the reconcile admits it: {fx:?}"
    );
    // The owner compares case-insensitively; the configured installation is in scope.
    let ours = JobInfo {
        key: JobKey::new("ACME", 4),
        installation_id: Some(77),
        ..job(4, LABELS)
    };
    let fx = s.on_job_event(JobAction::Queued, ours, Some("d"), t0, at(t0, 1));
    assert!(matches!(fx.as_slice(), [Effect::Claim { .. }]), "{fx:?}");
}

/// An event binds (and a completion tears down) a runner of ours only when its name *and* id
/// match: another's runner of the same name is not ours.
#[test]
fn runners_are_matched_by_name_and_id() {
    let (mut s, t0) = core();
    let name = claimed(&mut s, t0);
    let completed_on = |runner_id: u64| JobInfo {
        runner_name: Some(name.clone()),
        runner_id: Some(runner_id),
        conclusion: Some("success".into()),
        ..job(1, LABELS)
    };
    let impostor = completed_on(8);
    let fx = s.on_job_event(JobAction::Completed, impostor, Some("d"), t0, at(t0, 3));
    assert!(
        !fx.iter().any(|e| matches!(e, Effect::Teardown { .. })),
        "{fx:?}"
    );
    let ours = completed_on(7);
    let fx = s.on_job_event(JobAction::Completed, ours, Some("d"), t0, at(t0, 4));
    assert!(
        fx.contains(&Effect::Teardown {
            provider: PoolName::from("local"),
            name,
            reason: "job completed"
        }),
        "{fx:?}"
    );
}

/// The sweep runs on every `completed` in the org. One unbound runner (its `in_progress` lost)
/// past the grace is asked about once; GitHub says busy, and 100 more `completed` events for
/// other jobs ask nothing more. Without an answer the question is not repeated within a minute.
#[test]
fn one_busy_unbound_runner_costs_one_check_not_one_per_completed_job() {
    let checks = |fx: &[Effect]| {
        fx.iter()
            .filter(|e| matches!(e, Effect::CheckIdle { .. }))
            .count()
    };
    let completed = |s: &mut Scheduler, id: u64, now: Now| {
        s.on_job_event(
            JobAction::Completed,
            job(id, LABELS),
            Some("d"),
            now.mono,
            now,
        )
    };
    let (mut s, t0) = core();
    let name = claimed(&mut s, t0);
    s.on_runner_event(&name, RunnerEventKind::Started { warm: false }, at(t0, 2));
    let past_grace = 700;
    let mut asked = checks(&completed(&mut s, 1000, at(t0, past_grace)));
    assert_eq!(asked, 1, "the orphan is checked before it is reaped");
    // Answers may take a while: the question is not asked twice meanwhile, nor within a minute.
    for (i, id) in (1001..1050).enumerate() {
        asked += checks(&completed(&mut s, id, at(t0, past_grace + i as u64 / 10)));
    }
    assert_eq!(asked, 1);
    let fx = s.on_idle_checked(&name, Ok(true), "orphan", at(t0, past_grace + 5));
    assert_eq!(fx, vec![], "a busy runner is kept");
    for (i, id) in (1050..1150).enumerate() {
        asked += checks(&completed(&mut s, id, at(t0, past_grace + 10 + i as u64)));
    }
    assert_eq!(
        asked, 1,
        "a runner GitHub says is busy is not asked about again"
    );

    // An unanswered question (an error) is asked again by a timer of its own, 10 s later:
    // not on every event before that, not a minute later as for an answer.
    let (mut s, t0) = core();
    let name = claimed(&mut s, t0);
    s.on_runner_event(&name, RunnerEventKind::Started { warm: false }, at(t0, 2));
    let mut asked = checks(&completed(&mut s, 1000, at(t0, past_grace)));
    let fx = s.on_idle_checked(&name, Err(bad_gateway()), "orphan", at(t0, past_grace + 1));
    let retry_at = at(t0, past_grace + 1).mono + sweep::IDLE_RETRY_AFTER_ERROR;
    assert!(
        fx.contains(&Effect::ArmTimer { at: Some(retry_at) }),
        "the failed check arms the timer for its retry: {fx:?}"
    );
    for (i, id) in (1001..1009).enumerate() {
        asked += checks(&completed(&mut s, id, at(t0, past_grace + 2 + i as u64)));
    }
    assert_eq!(asked, 1, "no event before the retry time asks again");
    asked += checks(&s.on_timer(at(t0, past_grace + 11)));
    assert_eq!(asked, 2, "the timer asks again");
    for (i, id) in (1009..1109).enumerate() {
        asked += checks(&completed(&mut s, id, at(t0, past_grace + 12 + i as u64)));
    }
    assert_eq!(asked, 2, "never while an answer is outstanding");
}

/// The sweep takes a registration for this install's only by the whole name's shape: a pool
/// removed from the config still counts, another host's pool whose name ends like our id not.
#[test]
fn runner_names_of_this_install_are_told_from_other_hosts() {
    let backoff = Backoff::try_new(&ClaimRetryConfig::default()).unwrap();
    let mut settings = settings();
    settings.install_id = "abc123".into();
    let s = Scheduler::new(settings, backoff, 1);
    assert!(s.setup().is_ours("ephemer-local-abc123k3j4h5g6"));
    assert!(
        s.setup().is_ours("ephemer-linux-gpu-abc123k3j4h5g6"),
        "a pool no longer configured"
    );
    assert!(
        !s.setup().is_ours("ephemer-local-zzz999k3j4h5g6"),
        "another host's id"
    );
    assert!(
        !s.setup().is_ours("ephemer-x-abc123zzz999k3j4h5g6"),
        "another host's pool named x-abc123"
    );
    assert!(
        !s.setup().is_ours("other-local-abc123k3j4h5g6"),
        "another name_prefix"
    );
}
