//! One trace per job, built once at its end from what its timeline already holds (every span's
//! start and end to the millisecond), for the OpenTelemetry exporter the shell runs.
//!
//! The trace id comes from the job's key, and each span's id from the trace id and the span's
//! place, so a job that spans a restart is traced once, by the daemon that sees its end, under
//! the id it would have had anyway; its root span starts at its first delivery (the store keeps
//! that time) and carries a `restarted` event.

use super::{Setup, State};
use std::sync::Arc;

use super::{Note, Scheduler, TimelineEntry, hour::pool_of};
use crate::{
    clock::{Now, rfc3339},
    config::PoolName,
    job::{JobAction, JobInfo, JobKey},
};

/// A finished job's trace: `spans[0]` is the root, from the queued delivery to the teardown.
#[derive(Debug, Clone, PartialEq)]
pub struct JobTrace {
    /// The trace id (never all zeros).
    pub trace_id: [u8; 16],
    /// The root first, then its children in time order.
    pub spans: Vec<TraceSpan>,
}

/// One span of a [`JobTrace`].
#[derive(Debug, Clone, PartialEq)]
pub struct TraceSpan {
    /// Its id (never all zeros).
    pub id: [u8; 8],
    /// The root's id for a child, `None` for the root.
    pub parent: Option<[u8; 8]>,
    /// What it covers (low-cardinality: the job's own words are attributes).
    pub name: &'static str,
    /// Unix milliseconds.
    pub start_ms: u64,
    /// Unix milliseconds, at or after the start.
    pub end_ms: u64,
    /// Why it failed (the span's status), if it did.
    pub error: Option<String>,
    /// Its attributes.
    pub attributes: Vec<(&'static str, TraceValue)>,
    /// What happened within it.
    pub events: Vec<TraceEvent>,
}

/// An attribute's value.
#[derive(Debug, Clone, PartialEq)]
pub enum TraceValue {
    /// Text.
    Text(Arc<str>),
    /// A whole number.
    Int(i64),
    /// Yes or no.
    Bool(bool),
}

/// A point in a span: a failed claim, a retry put on the ladder, a restart.
#[derive(Debug, Clone, PartialEq)]
pub struct TraceEvent {
    /// What happened.
    pub name: &'static str,
    /// Unix milliseconds.
    pub at_ms: u64,
    /// Its attributes.
    pub attributes: Vec<(&'static str, TraceValue)>,
}

/// The runner that ran (or was made for) the job: its name, when it was claimed, and the notes
/// about it, which sit on the timeline of the job it was made for (a runner may take any
/// queued job with its labels).
#[derive(Debug, Clone, Copy)]
pub(super) struct RunnerPart<'a> {
    pub name: &'a str,
    /// Unix milliseconds of its claim, where its own note of it is gone (a restart).
    pub claimed_ms: Option<u64>,
    pub notes: &'a [TimelineEntry],
}

/// The runner of ours a job ran on (live, or just gone), as [`State::trace_job`] is told.
#[derive(Debug, Clone)]
pub(super) struct RanOn {
    pub name: Arc<str>,
    pub intent: JobKey,
    pub provider: PoolName,
    pub claimed_ms: Option<u64>,
}

/// What a trace is built from.
#[derive(Debug, Clone, Copy)]
pub(super) struct TraceInput<'a> {
    pub info: &'a JobInfo,
    /// The pool of its runner, or of its last claim.
    pub pool: Option<&'a PoolName>,
    /// The target (GitHub owner's name in the config) it came from.
    pub target: &'a str,
    /// Unix milliseconds of its first queued delivery here (kept over a restart).
    pub received_ms: u64,
    pub own: &'a [TimelineEntry],
    pub runner: Option<RunnerPart<'a>>,
}

/// A stable 64-bit FNV-1a over `parts`, from `seed`.
fn fnv(seed: u64, parts: &[&[u8]]) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325 ^ seed;
    for p in parts {
        for b in *p {
            h ^= u64::from(*b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
        h ^= 0xff;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// The trace id of `owner`'s job `job_id`: the same in every run of the daemon.
pub fn trace_id(owner: &str, job_id: u64) -> [u8; 16] {
    let owner = owner.to_ascii_lowercase();
    let parts: [&[u8]; 2] = [owner.as_bytes(), &job_id.to_be_bytes()];
    let hi = fnv(1, &parts);
    let lo = fnv(2, &parts) | 1;
    let mut id = [0; 16];
    id[..8].copy_from_slice(&hi.to_be_bytes());
    id[8..].copy_from_slice(&lo.to_be_bytes());
    id
}

fn span_id(trace: &[u8; 16], name: &str, ordinal: usize) -> [u8; 8] {
    (fnv(3, &[trace, name.as_bytes(), &ordinal.to_be_bytes()]) | 1).to_be_bytes()
}

fn text(s: impl Into<Arc<str>>) -> TraceValue {
    TraceValue::Text(s.into())
}

fn int(n: impl TryInto<i64>) -> TraceValue {
    TraceValue::Int(n.try_into().unwrap_or(i64::MAX))
}

fn span(name: &'static str, start_ms: u64, end_ms: u64) -> TraceSpan {
    TraceSpan {
        id: [0; 8],
        parent: None,
        name,
        start_ms,
        end_ms: end_ms.max(start_ms),
        error: None,
        attributes: Vec::new(),
        events: Vec::new(),
    }
}

/// The first note matching `f`, and when.
fn first<'a, T>(notes: &'a [TimelineEntry], f: impl Fn(&'a Note) -> Option<T>) -> Option<(u64, T)> {
    notes.iter().find_map(|e| f(&e.note).map(|t| (e.at_ms, t)))
}

fn observed(notes: &[TimelineEntry], want: JobAction) -> Option<u64> {
    first(notes, |n| match n {
        Note::Observed { action, .. } if *action == want => Some(()),
        _ => None,
    })
    .map(|(at, ())| at)
}

/// The job's claims: one span per attempt, from its `Claiming` to its answer, and the retries
/// put on the ladder as events of the root.
fn claims(own: &[TimelineEntry], spans: &mut Vec<TraceSpan>, root_events: &mut Vec<TraceEvent>) {
    let mut open: Option<TraceSpan> = None;
    let mut attempt = 0u32;
    for e in own {
        match &e.note {
            Note::Claiming { provider } => {
                if let Some(mut s) = open.take() {
                    s.end_ms = e.at_ms.max(s.start_ms);
                    s.error = Some("no answer before the next claim".into());
                    spans.push(s);
                }
                attempt += 1;
                let mut s = span("claim", e.at_ms, e.at_ms);
                s.attributes.push(("ephemer.pool", text(provider.as_str())));
                s.attributes.push(("ephemer.claim.attempt", int(attempt)));
                open = Some(s);
            }
            Note::Claimed { runner, .. } => {
                if let Some(mut s) = open.take() {
                    s.end_ms = e.at_ms.max(s.start_ms);
                    s.attributes.push(("ephemer.runner", text(runner.clone())));
                    spans.push(s);
                }
            }
            Note::ClaimFailed { class, error } => {
                let attributes = vec![
                    ("ephemer.error.class", text(class.as_str())),
                    ("ephemer.error", text(error.as_str())),
                ];
                match open.take() {
                    Some(mut s) => {
                        s.end_ms = e.at_ms.max(s.start_ms);
                        s.error = Some(format!("{}: {error}", class.as_str()));
                        s.events.push(TraceEvent {
                            name: "claim failed",
                            at_ms: e.at_ms,
                            attributes,
                        });
                        spans.push(s);
                    }
                    None => root_events.push(TraceEvent {
                        name: "claim failed",
                        at_ms: e.at_ms,
                        attributes,
                    }),
                }
            }
            Note::RetryScheduled {
                attempt,
                delay,
                reason,
                class,
                ..
            } => root_events.push(TraceEvent {
                name: "retry scheduled",
                at_ms: e.at_ms,
                attributes: vec![
                    ("ephemer.error.class", text(class.as_str())),
                    ("ephemer.retry.attempt", int(*attempt)),
                    ("ephemer.retry.delay_ms", int(delay.as_millis())),
                    (
                        "ephemer.retry.reason",
                        text(super::timeline::describe(reason)),
                    ),
                ],
            }),
            Note::Restored => root_events.push(TraceEvent {
                name: "restarted",
                at_ms: e.at_ms,
                attributes: Vec::new(),
            }),
            _ => {}
        }
    }
    if let Some(s) = open {
        spans.push(s);
    }
}

/// The runner's part: its environment's boot, its registration to the job's start, the job,
/// and the teardown.
fn runner_spans(
    input: &TraceInput<'_>,
    r: RunnerPart<'_>,
    spans: &mut Vec<TraceSpan>,
    root_events: &mut Vec<TraceEvent>,
) {
    let about = |n: &Note| match n {
        Note::Claimed { runner, .. }
        | Note::RunnerStarted { runner, .. }
        | Note::TearingDown { runner, .. }
        | Note::RunnerGone { runner, .. }
        | Note::Egress { runner, .. } => &**runner == r.name,
        _ => false,
    };
    let mine: Vec<&TimelineEntry> = r.notes.iter().filter(|e| about(&e.note)).collect();
    let claimed = mine
        .iter()
        .find(|e| matches!(e.note, Note::Claimed { .. }))
        .map(|e| e.at_ms)
        .or(r.claimed_ms);
    let started = mine.iter().find_map(|e| match e.note {
        Note::RunnerStarted { warm, .. } => Some((e.at_ms, warm)),
        _ => None,
    });
    let job_start = observed(input.own, JobAction::InProgress);
    let job_end = observed(input.own, JobAction::Completed);
    if started.is_none()
        && let Some(at_ms) = claimed
    {
        // Its boot was before a restart, which kept only the claim's time (the ledger's).
        root_events.push(TraceEvent {
            name: "runner claimed",
            at_ms,
            attributes: vec![("ephemer.runner", text(r.name))],
        });
    }
    if let Some((at, warm)) = started {
        if let Some(claimed) = claimed {
            let mut s = span("environment boot", claimed.min(at), at);
            s.attributes.push(("ephemer.runner", text(r.name)));
            s.attributes.push(("ephemer.warm", TraceValue::Bool(warm)));
            spans.push(s);
        }
        if let Some(job_start) = job_start {
            spans.push(span("registration to job start", at, job_start));
        }
    }
    if let (Some(start), Some(end)) = (job_start.or(job_end), job_end) {
        let mut s = span("job", start, end);
        if let Some(c) = &input.info.conclusion {
            s.attributes.push(("github.conclusion", text(c.clone())));
        }
        spans.push(s);
    }
    for e in &mine {
        if let Note::Egress { seen, .. } = &e.note {
            let count = |audited: bool| seen.rows().iter().filter(|r| r.audited == audited).count();
            let first = seen
                .rows()
                .first()
                .map(|r| format!("{} {}", r.kind.as_str(), r.what));
            let mut attributes = vec![
                ("ephemer.runner", text(r.name)),
                ("ephemer.egress.refused", int(count(false))),
                ("ephemer.egress.audited", int(count(true))),
            ];
            attributes.extend(first.map(|f| ("ephemer.egress.first", text(f))));
            root_events.push(TraceEvent {
                name: "egress refused",
                at_ms: e.at_ms,
                attributes,
            });
        }
    }
    let gone = mine.iter().find_map(|e| match &e.note {
        Note::RunnerGone { reason, code, .. } => Some((e.at_ms, *reason, *code)),
        _ => None,
    });
    if let Some((gone_ms, reason, code)) = gone {
        let from = mine
            .iter()
            .find_map(|e| match &e.note {
                Note::TearingDown { reason, .. } => Some((e.at_ms, *reason)),
                _ => None,
            })
            .or_else(|| job_end.map(|at| (at, "the job completed")));
        let (start, why) = from.unwrap_or((gone_ms, "it exited"));
        let mut s = span("teardown", start.min(gone_ms), gone_ms);
        s.attributes.push(("ephemer.teardown.reason", text(why)));
        s.attributes
            .push(("ephemer.runner.end", text(reason.words())));
        if let Some(code) = code {
            s.attributes.push(("ephemer.runner.exit_code", int(code)));
        }
        spans.push(s);
    }
}

/// The job's trace, or `None` when nothing was done for it here (no claim and no runner of
/// this daemon's: a job restored only to be recognised, or seen only to be completed).
pub(super) fn build(input: &TraceInput<'_>) -> Option<JobTrace> {
    let info = input.info;
    let trace_id = trace_id(&info.key.owner, info.key.job_id);
    let mut children = Vec::new();
    let mut root_events = Vec::new();
    claims(input.own, &mut children, &mut root_events);
    if children.is_empty() && input.runner.is_none() {
        return None;
    }
    let first_claim = children.first().map(|s| s.start_ms);
    if let Some(r) = input.runner {
        runner_spans(input, r, &mut children, &mut root_events);
    }
    let first_note = input.own.first().map_or(u64::MAX, |e| e.at_ms);
    let first_event = root_events
        .iter()
        .map(|e| e.at_ms)
        .min()
        .unwrap_or(u64::MAX);
    let start = input.received_ms.min(first_note).min(first_event);
    if let Some(claim) = first_claim {
        let admitted = first(input.own, |n| matches!(n, Note::Admitted).then_some(()))
            .map_or(start, |(at, ())| at);
        children.push(span("waiting for a slot", admitted.min(claim), claim));
    }
    let start = children.iter().map(|s| s.start_ms).fold(start, u64::min);
    let last_note = input.own.last().map_or(start, |e| e.at_ms);
    let end = children.iter().map(|s| s.end_ms).fold(last_note, u64::max);
    let mut root = span("workflow job", start, end);
    root.events = root_events;
    let a = &mut root.attributes;
    a.push(("github.job.id", int(info.key.job_id)));
    a.push(("github.run.id", int(info.run_id)));
    a.push(("github.run.attempt", int(info.run_attempt)));
    a.push((
        "github.repository",
        text(format!("{}/{}", info.key.owner, info.repo)),
    ));
    a.push(("github.labels", text(info.labels.join(","))));
    if let Some(pool) = input.pool {
        a.push(("ephemer.pool", text(pool.as_str())));
    }
    a.push(("ephemer.target", text(input.target)));
    if let Some(about) = &info.about {
        a.push(("github.workflow", text(about.workflow.as_str())));
        a.push(("github.job.name", text(about.name.as_str())));
        a.push(("github.branch", text(about.branch.as_str())));
        a.push(("github.sender", text(about.sender.as_str())));
    }
    if let Some(c) = &info.conclusion {
        a.push(("github.conclusion", text(c.clone())));
    }
    if let Some(created) = info.github_created_unix {
        a.push(("github.created_at", text(rfc3339(created.into()))));
        if let Some(w) = info.github_wait_secs {
            let started = u64::from(created) + u64::from(w);
            a.push(("github.started_at", text(rfc3339(started))));
        }
    }
    if let Some(w) = info.github_wait_secs {
        a.push(("github.queued_to_started_s", int(w)));
    }
    if let Some(r) = input.runner {
        a.push(("ephemer.runner", text(r.name)));
    }
    children.sort_by_key(|s| (s.start_ms, s.end_ms));
    root.id = span_id(&trace_id, root.name, 0);
    let mut spans = vec![root];
    for (i, mut s) in children.into_iter().enumerate() {
        s.id = span_id(&trace_id, s.name, i + 1);
        s.parent = Some(spans[0].id);
        spans.push(s);
    }
    Some(JobTrace { trace_id, spans })
}

impl Scheduler {
    /// The finished jobs' traces built since the last call (the shell exports them).
    pub fn take_traces(&mut self) -> Vec<JobTrace> {
        std::mem::take(&mut self.state.traces)
    }
}

impl State {
    /// Builds `key`'s trace, once, when traces are on: at its completion when no runner of
    /// ours still runs it, else when that runner is gone (its teardown is the trace's end).
    pub(super) fn trace_job(
        &mut self,
        setup: &Setup,
        key: &JobKey,
        ran_on: Option<RanOn>,
        now: Now,
    ) {
        if !setup.settings.traces {
            return;
        }
        let trace = {
            let Some(rec) = self.jobs.get(key).filter(|r| !r.traced()) else {
                return;
            };
            let since = now.mono.saturating_duration_since(rec.received_at());
            let mut received_ms = now
                .unix_ms
                .saturating_sub(u64::try_from(since.as_millis()).unwrap_or(u64::MAX));
            if rec
                .timeline()
                .iter()
                .any(|e| matches!(e.note, Note::Restored))
            {
                // The store keeps its delivery's time to the second.
                received_ms -= received_ms % 1000;
            }
            let intent_notes = ran_on.as_ref().map_or(&[][..], |r| {
                if r.intent == *key {
                    rec.timeline()
                } else {
                    self.jobs.get(&r.intent).map_or(&[][..], |i| i.timeline())
                }
            });
            let target = setup.target_name(&key.owner);
            build(&TraceInput {
                info: rec.info(),
                pool: ran_on
                    .as_ref()
                    .map(|r| &r.provider)
                    .or_else(|| pool_of(rec)),
                target,
                received_ms,
                own: rec.timeline(),
                runner: ran_on.as_ref().map(|r| RunnerPart {
                    name: &r.name,
                    claimed_ms: r.claimed_ms,
                    notes: intent_notes,
                }),
            })
        };
        self.jobs.traced(key);
        self.traces.extend(trace);
    }

    /// At `key`'s completion: traced now unless a runner of ours still runs it (`live`),
    /// which is traced when it is gone. `runner` is the runner the completion names.
    pub(super) fn trace_on_completion(
        &mut self,
        setup: &Setup,
        key: &JobKey,
        runner: Option<&str>,
        live: bool,
        now: Now,
    ) {
        if live || !setup.settings.traces {
            return;
        }
        let ran_on = runner.and_then(|n| {
            let g = self.book.recent().get(n)?;
            Some(RanOn {
                name: self.runner_handle(n),
                intent: g.intent.clone(),
                provider: g.provider.clone(),
                claimed_ms: None,
            })
        });
        self.trace_job(setup, key, ran_on, now);
    }

    /// Runner `r` (named `handle`) is gone: the job it ran (else the one it was made for) is
    /// traced if it completed.
    pub(super) fn trace_on_runner_gone(
        &mut self,
        setup: &Setup,
        handle: Arc<str>,
        r: &super::RunnerRecord,
        now: Now,
    ) {
        if !setup.settings.traces {
            return;
        }
        let job = r.bound.clone().unwrap_or_else(|| r.intent.clone());
        let completed = self
            .jobs
            .get(&job)
            .is_some_and(|rec| rec.info().conclusion.is_some() && !rec.info().withdrawn);
        if completed {
            let ran_on = RanOn {
                name: handle,
                intent: r.intent.clone(),
                provider: r.provider.clone(),
                claimed_ms: Some(r.created_unix.saturating_mul(1000)),
            };
            self.trace_job(setup, &job, Some(ran_on), now);
        }
    }
}

#[cfg(test)]
#[path = "trace_tests.rs"]
mod tests;
