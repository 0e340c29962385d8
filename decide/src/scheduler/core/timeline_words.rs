//! One note of every kind, each end reason and each error class among them: what the page, the
//! CLI and the tests render to prove that a person reads words, never Rust (`None`, `Some(`, an
//! enum's CamelCase name). Test data: compiled for tests and the shells' tests only (the
//! `fixtures` feature), never into the daemon.

use std::{sync::Arc, time::Duration};

use super::{Abandon, DeliveryId, Note, ParkReason};
use crate::{
    config::PoolName, github::ErrorClass, job::JobAction, provision::ExitReason, retry::DelayReason,
};

/// Every [`Note`] kind, with every end reason ([`ExitReason`], [`Abandon`]), park reason and
/// error class, with and without their optional parts.
pub fn every_kind() -> Vec<Note> {
    let runner: Arc<str> = "ephemer-linux-1".into();
    let pool = PoolName::new("linux");
    let mut notes = vec![
        Note::Queued {
            delivery: Some(DeliveryId::new("72d3162e-cc78-11e3-81ab-4c9367dc0958")),
        },
        Note::Queued { delivery: None },
        Note::AwaitingApproval,
        Note::Unroutable {
            labels: vec!["self-hosted".to_string(), "gpu".to_string()].into(),
        },
        Note::OutOfScope { reason: "repo" },
        Note::CordonedNotAdmitted,
        Note::Readmitted { reason: "parked" },
        Note::LookedAt {
            status: "completed",
        },
        Note::SpareHandedOver {
            runner: runner.clone(),
            from: 7,
        },
        Note::Admitted,
        Note::Claiming {
            provider: pool.clone(),
        },
        Note::Claimed {
            runner: runner.clone(),
            runner_id: 12,
            provider: pool,
        },
        Note::RetryDue { attempt: 2 },
        Note::RanElsewhere,
        Note::HeldElsewhere { host: "b".into() },
        Note::FleetPaced {
            why: "the fleet's claim window",
            wait_ms: 1500,
        },
        Note::Released {
            by: "b".into(),
            attempts: 1,
        },
        Note::Observed {
            action: JobAction::InProgress,
            runner: Some(runner.clone()),
        },
        Note::Observed {
            action: JobAction::Completed,
            runner: None,
        },
        Note::RunnerTookOther {
            runner: runner.clone(),
            job_id: 8,
        },
        Note::Completed {
            conclusion: "success".into(),
        },
        Note::TearingDown {
            runner: runner.clone(),
            reason: "job completed",
        },
        Note::RunnerStarted {
            runner: runner.clone(),
            after: Duration::from_millis(800),
            warm: true,
        },
        Note::RunnerStarted {
            runner: runner.clone(),
            after: Duration::from_millis(800),
            warm: false,
        },
        Note::EnvironmentFailed {
            runner: runner.clone(),
            error: "image not found".into(),
        },
        Note::Requeued { why: "stranded" },
        Note::Reaped {
            runner: runner.clone(),
            reason: "idle",
        },
        Note::Egress {
            runner: runner.clone(),
            seen: {
                let mut seen = crate::egress::seen::Seen::default();
                seen.add(crate::egress::seen::Kind::Dns, "pastebin.com", false);
                seen.add(crate::egress::seen::Kind::Connect, "198.51.100.7", true);
                std::sync::Arc::new(seen)
            },
        },
        Note::Restored,
        Note::Recorded("a sentence read back".into()),
    ];
    for reason in [
        ParkReason::Zombie,
        ParkReason::GaveUp,
        ParkReason::NotRetryable,
    ] {
        notes.push(Note::Parked {
            reason,
            look_unix: 1_796_259_723,
        });
    }
    for class in ErrorClass::ALL {
        notes.push(Note::ClaimFailed {
            class,
            error: "HTTP 502".into(),
        });
        notes.push(Note::Abandoned(Abandon::NotRetryable(class)));
        notes.push(Note::Abandoned(Abandon::GaveUp {
            attempts: 6,
            age_secs: 5400,
            class,
        }));
    }
    for reason in [
        DelayReason::Ladder { rung: 0 },
        DelayReason::RetryAfter,
        DelayReason::RateReset {
            reset: 1_796_259_723,
        },
    ] {
        notes.push(Note::RetryScheduled {
            attempt: 1,
            due_unix: 1_796_259_723,
            delay: Duration::from_secs(30),
            reason,
            class: ErrorClass::ServerSide,
        });
    }
    for why in [
        Abandon::CordonedWhileWaiting,
        Abandon::CordonedDuringClaim,
        Abandon::StartedDuringClaim,
        Abandon::CordonedNoRetry,
        Abandon::CordonedRetryDropped,
        Abandon::RetryDisabled,
        Abandon::NoProviderAnyMore,
    ] {
        notes.push(Note::Abandoned(why));
    }
    for reason in [
        ExitReason::Exited,
        ExitReason::TornDown,
        ExitReason::TimedOut,
        ExitReason::ProvisionerDied,
        ExitReason::Lost,
    ] {
        for (code, detail) in [
            (None, None),
            (Some(1), Some("the guest powered off".into())),
        ] {
            notes.push(Note::RunnerGone {
                runner: runner.clone(),
                reason,
                code,
                detail,
            });
        }
    }
    notes
}

/// Where `text` reads as code, not words: `None`, `Some(`, `Ok(`, `Err(`, a Debug list's
/// quotes, or a CamelCase word (an enum's name). `None` when it reads as words.
pub fn reads_as_code(text: &str) -> Option<String> {
    for tell in ["None", "Some(", "Ok(", "Err(", "[\"", "{ "] {
        if text.contains(tell) {
            return Some(tell.to_string());
        }
    }
    text.split(|c: char| !c.is_ascii_alphanumeric())
        .filter(|word| !PROPER_NAMES.contains(word))
        .find(|word| {
            let b = word.as_bytes();
            b.first().is_some_and(u8::is_ascii_uppercase)
                && b.iter().skip(1).any(u8::is_ascii_lowercase)
                && b.iter().skip(1).any(u8::is_ascii_uppercase)
        })
        .map(str::to_string)
}

/// Names spelt in CamelCase by their owners, not by the code.
const PROPER_NAMES: [&str; 4] = ["GitHub", "PostgreSQL", "macOS", "JavaScript"];

/// The kind's name, for a failure message: the first word of its Debug form.
pub fn kind_of(note: &Note) -> String {
    format!("{note:?}")
        .split(|c: char| !c.is_alphanumeric())
        .next()
        .unwrap_or_default()
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A new kind of note must be added to [`every_kind`]: this match has no catch-all.
    #[test]
    fn every_kind_covers_every_kind() {
        let mut seen = std::collections::BTreeSet::new();
        for note in every_kind() {
            let kind = match note {
                Note::Queued { .. } => 0,
                Note::AwaitingApproval => 1,
                Note::Unroutable { .. } => 2,
                Note::OutOfScope { .. } => 3,
                Note::CordonedNotAdmitted => 4,
                Note::Parked { .. } => 5,
                Note::Readmitted { .. } => 6,
                Note::LookedAt { .. } => 7,
                Note::SpareHandedOver { .. } => 8,
                Note::Admitted => 9,
                Note::Claiming { .. } => 10,
                Note::ClaimFailed { .. } => 11,
                Note::Claimed { .. } => 12,
                Note::RetryScheduled { .. } => 13,
                Note::RetryDue { .. } => 14,
                Note::Abandoned(_) => 15,
                Note::RanElsewhere => 16,
                Note::HeldElsewhere { .. } => 17,
                Note::FleetPaced { .. } => 18,
                Note::Released { .. } => 19,
                Note::Observed { .. } => 20,
                Note::RunnerTookOther { .. } => 21,
                Note::Completed { .. } => 22,
                Note::TearingDown { .. } => 23,
                Note::RunnerStarted { .. } => 24,
                Note::RunnerGone { .. } => 25,
                Note::EnvironmentFailed { .. } => 26,
                Note::Requeued { .. } => 27,
                Note::Reaped { .. } => 28,
                Note::Restored => 29,
                Note::Recorded(_) => 30,
                Note::Egress { .. } => 31,
            };
            seen.insert(kind);
        }
        assert_eq!(seen.len(), 32);
    }

    #[test]
    fn every_note_reads_in_words() {
        for note in every_kind() {
            let text = note.to_string();
            assert_eq!(
                reads_as_code(&text),
                None,
                "{} reads as code: {text}",
                kind_of(&note)
            );
        }
    }

    #[test]
    fn the_check_catches_what_it_is_for() {
        assert_eq!(
            reads_as_code("gone (TornDown, exit code None)").as_deref(),
            Some("None")
        );
        assert_eq!(
            reads_as_code("gone (TornDown)").as_deref(),
            Some("TornDown")
        );
        assert_eq!(reads_as_code("labels [\"a\"]").as_deref(), Some("[\""));
        assert_eq!(reads_as_code("Some(3)").as_deref(), Some("Some("));
        assert_eq!(
            reads_as_code("Claimed runner ephemer-linux-1 on GitHub"),
            None
        );
    }
}
