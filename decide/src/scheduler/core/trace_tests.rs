use std::time::Duration;

use super::*;
use crate::{
    config::Secret,
    github::{ErrorClass, JitRunner},
    provision::{ExitReason, RunnerEventKind},
    retry::DelayReason,
    scheduler::{
        core::{
            SchedulerSettings,
            tests::{at, bad_gateway, core_with, settings},
        },
        fixtures::job,
    },
};

const LABELS: &[&str] = &["self-hosted", "linux"];

fn e(at_ms: u64, note: Note) -> TimelineEntry {
    TimelineEntry { at_ms, note }
}

fn r(name: &str) -> Arc<str> {
    Arc::from(name)
}

/// The job seen `action` on `runner` at `at_ms`.
fn seen(at_ms: u64, action: JobAction, runner: &str) -> TimelineEntry {
    let runner = Some(r(runner));
    e(at_ms, Note::Observed { action, runner })
}

fn names(t: &JobTrace) -> Vec<&'static str> {
    t.spans.iter().map(|s| s.name).collect()
}

fn the<'a>(t: &'a JobTrace, name: &str) -> &'a TraceSpan {
    t.spans.iter().find(|s| s.name == name).unwrap()
}

fn attr<'a>(s: &'a TraceSpan, key: &str) -> Option<&'a TraceValue> {
    s.attributes.iter().find(|(k, _)| *k == key).map(|(_, v)| v)
}

/// A job's own notes from its queued delivery (at 1,000 ms) to its completion on `runner`.
fn a_job_run(runner: &str) -> Vec<TimelineEntry> {
    let local = PoolName::from("local");
    vec![
        e(1_000, Note::Queued { delivery: None }),
        e(1_000, Note::Admitted),
        e(
            1_200,
            Note::Claiming {
                provider: local.clone(),
            },
        ),
        e(
            1_500,
            Note::ClaimFailed {
                class: ErrorClass::ServerSide,
                error: "502".into(),
            },
        ),
        e(
            1_500,
            Note::RetryScheduled {
                attempt: 1,
                due_unix: 3,
                delay: Duration::from_millis(1_500),
                reason: DelayReason::Ladder { rung: 0 },
                class: ErrorClass::ServerSide,
            },
        ),
        e(3_000, Note::RetryDue { attempt: 1 }),
        e(
            3_000,
            Note::Claiming {
                provider: local.clone(),
            },
        ),
        e(
            3_400,
            Note::Claimed {
                runner: r(runner),
                runner_id: 7,
                provider: local,
            },
        ),
        e(
            5_000,
            Note::RunnerStarted {
                runner: r(runner),
                after: Duration::from_millis(1_600),
                warm: false,
            },
        ),
        seen(6_000, JobAction::InProgress, runner),
        seen(9_000, JobAction::Completed, runner),
        e(
            9_000,
            Note::Completed {
                conclusion: "success".into(),
            },
        ),
        e(
            9_000,
            Note::TearingDown {
                runner: r(runner),
                reason: "job completed",
            },
        ),
        e(
            9_700,
            Note::RunnerGone {
                runner: r(runner),
                reason: ExitReason::TornDown,
                code: None,
                detail: None,
            },
        ),
    ]
}

fn input<'a>(
    info: &'a JobInfo,
    own: &'a [TimelineEntry],
    runner: Option<RunnerPart<'a>>,
) -> TraceInput<'a> {
    TraceInput {
        info,
        pool: None,
        target: "acme",
        received_ms: 1_000,
        own,
        runner,
    }
}

#[test]
fn a_job_s_trace_has_the_root_and_a_span_for_each_stage_with_retries_as_events() {
    let mut info = job(5, LABELS);
    info.conclusion = Some("success".into());
    let own = a_job_run("ephemer-local-a");
    let runner = RunnerPart {
        name: "ephemer-local-a",
        claimed_ms: None,
        notes: &own,
    };
    let t = build(&input(&info, &own, Some(runner))).unwrap();
    assert_eq!(t.trace_id, trace_id("acme", 5));
    assert_eq!(
        names(&t),
        [
            "workflow job",
            "waiting for a slot",
            "claim",
            "claim",
            "environment boot",
            "registration to job start",
            "job",
            "teardown"
        ]
    );
    let root = &t.spans[0];
    assert_eq!(
        (root.start_ms, root.end_ms, root.parent),
        (1_000, 9_700, None)
    );
    assert!(t.spans[1..].iter().all(|s| s.parent == Some(root.id)));
    let mut ids: Vec<_> = t.spans.iter().map(|s| s.id).collect();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), t.spans.len(), "span ids are unique");
    assert!(ids.iter().all(|id| *id != [0; 8]));

    let (failed, ok) = (&t.spans[2], &t.spans[3]);
    assert_eq!((failed.start_ms, failed.end_ms), (1_200, 1_500));
    assert_eq!(failed.error.as_deref(), Some("server_side: 502"));
    assert_eq!(failed.events[0].name, "claim failed");
    assert_eq!(
        (ok.start_ms, ok.end_ms, ok.error.as_ref()),
        (3_000, 3_400, None)
    );
    assert_eq!(attr(ok, "ephemer.claim.attempt"), Some(&TraceValue::Int(2)));
    let retry = &root.events[0];
    assert_eq!(retry.name, "retry scheduled");
    assert!(retry.attributes.contains(&(
        "ephemer.error.class",
        TraceValue::Text("server_side".into())
    )));

    let span = |n| {
        let s = the(&t, n);
        (s.start_ms, s.end_ms)
    };
    assert_eq!(span("waiting for a slot"), (1_000, 1_200));
    assert_eq!(span("environment boot"), (3_400, 5_000));
    assert_eq!(span("registration to job start"), (5_000, 6_000));
    assert_eq!(span("job"), (6_000, 9_000));
    assert_eq!(span("teardown"), (9_000, 9_700));
    assert_eq!(attr(root, "github.job.id"), Some(&TraceValue::Int(5)));
    assert_eq!(
        attr(root, "github.repository"),
        Some(&TraceValue::Text("acme/app".into()))
    );
    assert_eq!(
        attr(root, "github.conclusion"),
        Some(&TraceValue::Text("success".into()))
    );
}

#[test]
fn a_job_run_by_a_runner_made_for_another_takes_that_runner_s_boot_from_the_other_s_notes() {
    let info = job(6, LABELS);
    let other = a_job_run("ephemer-local-a");
    // Job 6's own notes: its claim made runner b (which took yet another job), and it ran on a.
    let local = PoolName::from("local");
    let own = vec![
        e(1_000, Note::Queued { delivery: None }),
        e(
            1_100,
            Note::Claiming {
                provider: local.clone(),
            },
        ),
        e(
            1_300,
            Note::Claimed {
                runner: r("ephemer-local-b"),
                runner_id: 8,
                provider: local,
            },
        ),
        seen(6_000, JobAction::InProgress, "ephemer-local-a"),
        seen(9_000, JobAction::Completed, "ephemer-local-a"),
    ];
    let runner = RunnerPart {
        name: "ephemer-local-a",
        claimed_ms: None,
        notes: &other,
    };
    let t = build(&input(&info, &own, Some(runner))).unwrap();
    assert_eq!(
        (
            the(&t, "environment boot").start_ms,
            the(&t, "environment boot").end_ms
        ),
        (3_400, 5_000)
    );
    assert_eq!(
        (the(&t, "job").start_ms, the(&t, "job").end_ms),
        (6_000, 9_000)
    );
    assert_eq!(the(&t, "teardown").end_ms, 9_700);
    assert_eq!(t.spans.iter().filter(|s| s.name == "claim").count(), 1);
}

#[test]
fn a_job_restored_after_a_restart_is_traced_from_its_first_delivery_with_the_restart_marked() {
    let info = job(7, LABELS);
    let runner_notes = vec![
        e(20_000, Note::Restored),
        seen(21_000, JobAction::InProgress, "ephemer-local-c"),
        seen(25_000, JobAction::Completed, "ephemer-local-c"),
        e(
            25_500,
            Note::RunnerGone {
                runner: r("ephemer-local-c"),
                reason: ExitReason::Exited,
                code: Some(0),
                detail: None,
            },
        ),
    ];
    let runner = RunnerPart {
        name: "ephemer-local-c",
        claimed_ms: Some(2_000),
        notes: &runner_notes,
    };
    let t = build(&input(&info, &runner_notes, Some(runner))).unwrap();
    let root = &t.spans[0];
    assert_eq!(
        (root.start_ms, root.end_ms),
        (1_000, 25_500),
        "from the delivery before the restart"
    );
    let events: Vec<_> = root.events.iter().map(|e| (e.name, e.at_ms)).collect();
    assert_eq!(events, [("restarted", 20_000), ("runner claimed", 2_000)]);
    assert!(
        !names(&t).contains(&"environment boot"),
        "its boot is not known"
    );
    assert_eq!(the(&t, "teardown").start_ms, 25_000, "from the completion");
    assert_eq!(
        attr(the(&t, "teardown"), "ephemer.runner.exit_code"),
        Some(&TraceValue::Int(0))
    );
}

#[test]
fn nothing_is_traced_for_a_job_nothing_was_done_for_here() {
    let info = job(8, LABELS);
    let own = vec![
        e(1_000, Note::Restored),
        e(
            2_000,
            Note::Observed {
                action: JobAction::Completed,
                runner: None,
            },
        ),
    ];
    assert_eq!(build(&input(&info, &own, None)), None);
}

#[test]
fn a_trace_id_is_the_job_s_in_every_run_and_another_job_s_differs() {
    assert_eq!(trace_id("acme", 5), trace_id("ACME", 5));
    assert_ne!(trace_id("acme", 5), trace_id("acme", 6));
    assert_ne!(trace_id("acme", 5), trace_id("other", 5));
    assert_ne!(trace_id("acme", 0), [0; 16]);
    // Fixed: a trace id must not change between releases (a job spans an upgrade).
    assert_eq!(trace_id("acme", 5), trace_id("acme", 5));
}

fn jit(name: &str) -> JitRunner {
    JitRunner {
        id: 7,
        name: name.into(),
        encoded_jit_config: Secret::new("jit"),
    }
}

fn on(action: JobAction, id: u64, runner: &str) -> JobInfo {
    let mut j = job(id, LABELS);
    j.runner_name = Some(runner.into());
    j.runner_id = Some(7);
    if action == JobAction::Completed {
        j.conclusion = Some("success".into());
    }
    j
}

/// GitHub says `action` about `info` at `now`.
fn deliver(s: &mut Scheduler, action: JobAction, info: JobInfo, now: crate::clock::Now) {
    s.on_job_event(action, info, None, now.mono, now);
}

fn traced_core() -> (Scheduler, crate::clock::Instant) {
    let (s, t0, _) = core_with(SchedulerSettings {
        traces: true,
        ..settings()
    });
    (s, t0)
}

#[test]
fn the_core_traces_a_job_once_at_its_runner_s_end_through_a_retry_and_a_repeated_completion() {
    let (mut s, t0) = traced_core();
    let key = JobKey::new("acme", 1);
    let local = PoolName::from("local");
    // GitHub's own times: `created_at` from the queued delivery on, `started_at` from the
    // job's start (34 s after its creation, by GitHub's clock).
    let created = Some(1_800_000_000);
    let queued = JobInfo {
        github_created_unix: created,
        ..job(1, LABELS)
    };
    deliver(&mut s, JobAction::Queued, queued, at(t0, 0));
    s.on_claim_result(key.clone(), local.clone(), Err(bad_gateway()), at(t0, 1));
    s.on_timer(at(t0, 31));
    s.on_claim_result(key.clone(), local, Ok(jit("ephemer-local-a")), at(t0, 32));
    s.on_runner_event(
        "ephemer-local-a",
        RunnerEventKind::Started { warm: false },
        at(t0, 33),
    );
    for (action, t) in [(JobAction::InProgress, 34), (JobAction::Completed, 40)] {
        let info = JobInfo {
            github_created_unix: created,
            github_wait_secs: Some(34),
            ..on(action, 1, "ephemer-local-a")
        };
        deliver(&mut s, action, info, at(t0, t));
    }
    assert_eq!(
        s.take_traces(),
        vec![],
        "its runner is still being torn down"
    );
    s.on_runner_event(
        "ephemer-local-a",
        RunnerEventKind::gone(ExitReason::TornDown),
        at(t0, 41),
    );
    let traces = s.take_traces();
    assert_eq!(traces.len(), 1);
    let t = &traces[0];
    assert_eq!(t.trace_id, trace_id("acme", 1));
    assert_eq!(t.spans.iter().filter(|s| s.name == "claim").count(), 2);
    assert!(
        t.spans[0]
            .events
            .iter()
            .any(|e| e.name == "retry scheduled")
    );
    assert_eq!(t.spans[0].end_ms, at(t0, 41).unix_ms);
    assert_eq!(
        attr(&t.spans[0], "ephemer.pool"),
        Some(&TraceValue::Text("local".into()))
    );
    for (key, value) in [
        ("github.created_at", "2027-01-15T08:00:00Z"),
        ("github.started_at", "2027-01-15T08:00:34Z"),
    ] {
        assert_eq!(
            attr(&t.spans[0], key),
            Some(&TraceValue::Text(value.into())),
            "{key}"
        );
    }
    assert_eq!(
        attr(&t.spans[0], "github.queued_to_started_s"),
        Some(&TraceValue::Int(34))
    );
    // GitHub says it again: nothing more.
    deliver(
        &mut s,
        JobAction::Completed,
        on(JobAction::Completed, 1, "ephemer-local-a"),
        at(t0, 50),
    );
    assert_eq!(s.take_traces(), vec![]);
}

#[test]
fn a_runner_gone_before_github_says_completed_is_traced_at_the_completion_and_off_means_none() {
    for on_ in [true, false] {
        let (mut s, t0, _) = core_with(SchedulerSettings {
            traces: on_,
            ..settings()
        });
        let key = JobKey::new("acme", 1);
        deliver(&mut s, JobAction::Queued, job(1, LABELS), at(t0, 0));
        s.on_claim_result(
            key,
            PoolName::from("local"),
            Ok(jit("ephemer-local-a")),
            at(t0, 1),
        );
        s.on_runner_event(
            "ephemer-local-a",
            RunnerEventKind::Started { warm: true },
            at(t0, 2),
        );
        deliver(
            &mut s,
            JobAction::InProgress,
            on(JobAction::InProgress, 1, "ephemer-local-a"),
            at(t0, 3),
        );
        s.on_runner_event(
            "ephemer-local-a",
            RunnerEventKind::Exited {
                code: Some(0),
                reason: ExitReason::Exited,
                detail: None,
            },
            at(t0, 9),
        );
        assert_eq!(s.take_traces(), vec![], "not completed yet");
        deliver(
            &mut s,
            JobAction::Completed,
            on(JobAction::Completed, 1, "ephemer-local-a"),
            at(t0, 10),
        );
        let traces = s.take_traces();
        if !on_ {
            assert_eq!(traces, vec![]);
            continue;
        }
        assert_eq!(traces.len(), 1);
        let t = &traces[0];
        assert_eq!(
            attr(the(t, "environment boot"), "ephemer.warm"),
            Some(&TraceValue::Bool(true))
        );
        assert_eq!(the(t, "teardown").end_ms, at(t0, 9).unix_ms);
        assert_eq!(t.spans[0].end_ms, at(t0, 10).unix_ms);
    }
}

#[test]
fn what_a_job_s_egress_met_is_an_event_on_its_trace_and_a_line_of_its_timeline() {
    use crate::egress::seen::{Kind, Seen};
    let mut seen = Seen::default();
    seen.add(Kind::Dns, "pastebin.com", false);
    seen.add(Kind::Dns, "pastebin.com", false);
    seen.add(Kind::Connect, "198.51.100.7", false);
    // Through the core: the provisioner's report lands on the runner's job's timeline.
    let mut d = crate::scheduler::core::driver::Driver::new();
    d.queued(1, LABELS);
    let name = d.runner_of(1);
    let kind = RunnerEventKind::Egress { seen: seen.clone() };
    let fx = d.s.on_runner_event(&name, kind, d.state_now());
    assert!(fx.is_empty(), "a report changes nothing else: {fx:?}");
    let line =
        d.s.view()
            .job(&crate::job::JobKey::new("acme", 1))
            .unwrap()
            .timeline()
            .iter()
            .map(|e| e.note.to_string())
            .find(|t| t.starts_with("egress of runner"))
            .unwrap();
    assert_eq!(
        line,
        format!(
            "egress of runner {name}: refused dns pastebin.com (2 times), connect 198.51.100.7"
        )
    );
    // On the trace: an event with the counts and the first refusal.
    let mut info = job(5, LABELS);
    info.conclusion = Some("success".into());
    let mut own = a_job_run("ephemer-local-a");
    own.insert(
        own.len() - 1,
        e(
            9_600,
            Note::Egress {
                runner: r("ephemer-local-a"),
                seen: Arc::new(seen),
            },
        ),
    );
    let runner = RunnerPart {
        name: "ephemer-local-a",
        claimed_ms: None,
        notes: &own,
    };
    let t = build(&input(&info, &own, Some(runner))).unwrap();
    let ev = t.spans[0]
        .events
        .iter()
        .find(|e| e.name == "egress refused")
        .unwrap();
    assert_eq!(ev.at_ms, 9_600);
    let get = |k: &str| {
        ev.attributes
            .iter()
            .find(|(n, _)| *n == k)
            .map(|(_, v)| v.clone())
    };
    assert_eq!(get("ephemer.egress.refused"), Some(TraceValue::Int(2)));
    assert_eq!(
        get("ephemer.egress.first"),
        Some(TraceValue::Text("dns pastebin.com".into()))
    );
}
