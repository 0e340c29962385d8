//! A job's timeline as a bar: the spans it spent in each state (waiting for a slot, a claim
//! in flight, a ladder wait and whether it snapped to a rate reset, parked, its runner
//! booting, up, the job running) and the moments between them (a failed claim, a swap of
//! runners, the end), read from its timeline's notes. Pure: the page draws it.

use crate::scheduler::core::timeline::Note;
use crate::{job::JobAction, retry::DelayReason, scheduler::core::TimelineEntry};

/// What a span of the bar was.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Span {
    /// Admitted, waiting for a slot or a claim token.
    Waiting,
    /// generate-jitconfig in flight.
    Claiming,
    /// On the retry ladder (`snapped`: the wait ends at a rate-limit reset).
    Ladder {
        /// Snapped to the reset.
        snapped: bool,
    },
    /// Parked until its next look.
    Parked,
    /// Its runner's environment is starting.
    Booting,
    /// Its runner is up, waiting for GitHub to hand it the job.
    RunnerUp,
    /// The job runs.
    Running,
}

impl Span {
    /// The CSS class and the legend's word.
    pub(super) fn class(self) -> (&'static str, &'static str) {
        match self {
            Span::Waiting => ("s-wait", "waiting for a slot"),
            Span::Claiming => ("s-claim", "claim in flight"),
            Span::Ladder { snapped: false } => ("s-ladder", "retry ladder"),
            Span::Ladder { snapped: true } => ("s-snap", "waiting for the rate reset"),
            Span::Parked => ("s-park", "parked"),
            Span::Booting => ("s-boot", "runner booting"),
            Span::RunnerUp => ("s-up", "runner up"),
            Span::Running => ("s-run", "job running"),
        }
    }
}

/// A moment on the bar.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Mark {
    /// A claim GitHub refused.
    ClaimFailed,
    /// Runners swapped (a spare handed over, or its runner took another job).
    Swap,
    /// It ended (completed, or its dispatch stopped).
    End,
}

/// The bar of one job, in unix milliseconds (a job's first seconds are often a few hundred of
/// them: a claim, a boot).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Bar {
    /// Its first note.
    pub from: u64,
    /// Its end, or now.
    pub to: u64,
    /// Spans, in order, each `(state, from, to)`.
    pub spans: Vec<(Span, u64, u64)>,
    /// Moments, each `(what, at)`.
    pub marks: Vec<(Mark, u64)>,
}

/// The bar of `timeline`, drawn up to `now_ms` unless it ended.
pub(super) fn bar(timeline: &[TimelineEntry], now_ms: u64) -> Option<Bar> {
    let first = timeline.first()?.at_ms;
    let mut spans = Vec::new();
    let mut marks = Vec::new();
    let mut state: Option<(Span, u64)> = None;
    let mut ended: Option<u64> = None;
    let mut go = |state: &mut Option<(Span, u64)>, next: Option<Span>, at: u64| {
        if let Some((span, since)) = *state {
            if Some(span) == next {
                return;
            }
            spans.push((span, since, at));
        }
        *state = next.map(|s| (s, at));
    };
    for e in timeline {
        let at = e.at_ms;
        let next = match &e.note {
            Note::Queued { .. }
            | Note::Admitted
            | Note::Readmitted { .. }
            | Note::Released { .. }
            | Note::RetryDue { .. }
            | Note::Requeued { .. } => Some(Span::Waiting),
            Note::Claiming { .. } => Some(Span::Claiming),
            Note::ClaimFailed { .. } => {
                marks.push((Mark::ClaimFailed, at));
                continue;
            }
            Note::RetryScheduled { reason, .. } => Some(Span::Ladder {
                snapped: matches!(reason, DelayReason::RateReset { .. }),
            }),
            Note::Parked { .. } => Some(Span::Parked),
            Note::Claimed { .. } => Some(Span::Booting),
            Note::RunnerStarted { .. } => Some(Span::RunnerUp),
            Note::SpareHandedOver { .. } => {
                marks.push((Mark::Swap, at));
                Some(Span::RunnerUp)
            }
            Note::RunnerTookOther { .. } => {
                marks.push((Mark::Swap, at));
                continue;
            }
            Note::Observed {
                action: JobAction::InProgress,
                ..
            }
            | Note::RanElsewhere => Some(Span::Running),
            Note::Completed { .. }
            | Note::Observed {
                action: JobAction::Completed,
                ..
            }
            | Note::Abandoned(_)
            | Note::LookedAt { .. } => {
                go(&mut state, None, at);
                if ended.is_none() {
                    marks.push((Mark::End, at));
                }
                ended = Some(at);
                continue;
            }
            _ => continue,
        };
        if ended.is_some() && !matches!(next, Some(Span::Running)) {
            // A late note after the end (a redelivery, a swap's echo) draws nothing.
            continue;
        }
        go(&mut state, next, at);
    }
    let to = ended.unwrap_or(now_ms).max(first);
    go(&mut state, None, to);
    Some(Bar {
        from: first,
        to,
        spans,
        marks,
    })
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::{config::PoolName, github::ErrorClass};

    /// A note at second `at` (its milliseconds are `at * 1000`).
    fn at(at: u64, note: Note) -> TimelineEntry {
        TimelineEntry {
            at_ms: at * 1000,
            note,
        }
    }

    #[test]
    fn a_job_that_climbed_the_ladder_and_snapped_to_the_reset() {
        let pool = PoolName::from("local");
        let t = [
            at(100, Note::Queued { delivery: None }),
            at(100, Note::Admitted),
            at(
                101,
                Note::Claiming {
                    provider: pool.clone(),
                },
            ),
            at(
                101,
                Note::ClaimFailed {
                    class: ErrorClass::RateLimit,
                    error: "403".into(),
                },
            ),
            at(
                101,
                Note::RetryScheduled {
                    attempt: 1,
                    due_unix: 160,
                    delay: Duration::from_secs(59),
                    reason: DelayReason::RateReset { reset: 160 },
                    class: ErrorClass::RateLimit,
                },
            ),
            at(160, Note::RetryDue { attempt: 1 }),
            at(
                160,
                Note::Claiming {
                    provider: pool.clone(),
                },
            ),
            at(
                161,
                Note::Claimed {
                    runner: "r1".into(),
                    runner_id: 1,
                    provider: pool,
                },
            ),
            at(
                163,
                Note::RunnerStarted {
                    runner: "r1".into(),
                    after: Duration::from_secs(2),
                    warm: false,
                },
            ),
            at(
                164,
                Note::Observed {
                    action: JobAction::InProgress,
                    runner: Some("r1".into()),
                },
            ),
            at(
                170,
                Note::Completed {
                    conclusion: "success".into(),
                },
            ),
        ];
        let b = bar(&t, 999_000).unwrap();
        assert_eq!(
            (b.from, b.to),
            (100_000, 170_000),
            "ended at its completion, not now"
        );
        let kinds: Vec<Span> = b.spans.iter().map(|s| s.0).collect();
        assert_eq!(
            kinds,
            [
                Span::Waiting,
                Span::Claiming,
                Span::Ladder { snapped: true },
                Span::Waiting,
                Span::Claiming,
                Span::Booting,
                Span::RunnerUp,
                Span::Running,
            ]
        );
        assert_eq!(
            b.spans[2],
            (Span::Ladder { snapped: true }, 101_000, 160_000)
        );
        assert_eq!(
            b.marks,
            [(Mark::ClaimFailed, 101_000), (Mark::End, 170_000)]
        );
    }

    /// A job picked up within a second is drawn by its milliseconds, not as one instant.
    #[test]
    fn a_sub_second_pickup_keeps_its_spans() {
        let pool = PoolName::from("local");
        let ms = |at_ms: u64, note: Note| TimelineEntry { at_ms, note };
        let t = [
            ms(5_000_010, Note::Admitted),
            ms(
                5_000_040,
                Note::Claiming {
                    provider: pool.clone(),
                },
            ),
            ms(
                5_000_310,
                Note::Claimed {
                    runner: "r1".into(),
                    runner_id: 1,
                    provider: pool,
                },
            ),
            ms(
                5_000_720,
                Note::RunnerStarted {
                    runner: "r1".into(),
                    after: Duration::from_millis(410),
                    warm: false,
                },
            ),
        ];
        let b = bar(&t, 5_000_900).unwrap();
        assert_eq!(
            b.spans,
            [
                (Span::Waiting, 5_000_010, 5_000_040),
                (Span::Claiming, 5_000_040, 5_000_310),
                (Span::Booting, 5_000_310, 5_000_720),
                (Span::RunnerUp, 5_000_720, 5_000_900),
            ]
        );
    }

    #[test]
    fn a_job_still_waiting_is_drawn_up_to_now() {
        let b = bar(&[at(10, Note::Admitted)], 40_000).unwrap();
        assert_eq!(b.spans, [(Span::Waiting, 10_000, 40_000)]);
        assert!(bar(&[], 40_000).is_none());
    }
}
