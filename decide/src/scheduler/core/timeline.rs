//! A job's timeline: every decision taken about it, as data ([`Note`]), so tests match the
//! decision and `jobs <id>` prints the sentence ([`std::fmt::Display`]).

use std::{fmt, sync::Arc, time::Duration};

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::{
    config::PoolName, github::ErrorClass, job::JobAction, provision::ExitReason, retry::DelayReason,
};

/// Timeline entries kept per job (the first, how it arrived, is always kept).
pub const TIMELINE_CAP: usize = 64;

/// One line of a job's timeline. On the wire it is `{at, at_ms, text}` (unix seconds, and
/// milliseconds for what draws it finer); read back (by the CLI) its note is
/// [`Note::Recorded`], the sentence.
#[derive(Debug, Clone, PartialEq)]
pub struct TimelineEntry {
    /// Unix milliseconds.
    pub at_ms: u64,
    /// What was decided and why.
    pub note: Note,
}

impl TimelineEntry {
    /// Unix seconds.
    pub fn at(&self) -> u64 {
        self.at_ms / 1000
    }
}

impl Serialize for TimelineEntry {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct as _;
        let mut e = s.serialize_struct("TimelineEntry", 3)?;
        e.serialize_field("at", &self.at())?;
        e.serialize_field("at_ms", &self.at_ms)?;
        e.serialize_field("text", &format_args!("{}", self.note))?;
        e.end()
    }
}

impl<'de> Deserialize<'de> for TimelineEntry {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        struct Wire {
            at: u64,
            at_ms: Option<u64>,
            text: String,
        }
        let w = Wire::deserialize(d)?;
        Ok(TimelineEntry {
            at_ms: w.at_ms.unwrap_or(w.at * 1000),
            note: Note::Recorded(w.text),
        })
    }
}

/// Why a job's dispatch stopped with nothing in flight.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Abandon {
    /// Cordoned while it waited for a slot.
    CordonedWhileWaiting,
    /// Cordoned while its claim was in flight.
    CordonedDuringClaim,
    /// Observed running elsewhere while its claim was in flight.
    StartedDuringClaim,
    /// Cordoned: a failure does not climb the ladder.
    CordonedNoRetry,
    /// Cordoned: a due retry is dropped.
    CordonedRetryDropped,
    /// The failure cannot be helped by retrying.
    NotRetryable(ErrorClass),
    /// `runner.claim_retry.enabled = false`.
    RetryDisabled,
    /// The first failure is older than `max_age`.
    GaveUp {
        /// Failures in all.
        attempts: u32,
        /// Seconds since the first failure.
        age_secs: u64,
        /// Class of the first failure.
        class: ErrorClass,
    },
    /// No enabled provider covers its labels any more.
    NoProviderAnyMore,
}

impl fmt::Display for Abandon {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Abandon::CordonedWhileWaiting => f.write_str("cordoned while waiting for a slot"),
            Abandon::CordonedDuringClaim => f.write_str("cordoned during the claim"),
            Abandon::StartedDuringClaim => f.write_str("started elsewhere during the claim"),
            Abandon::CordonedNoRetry => f.write_str("cordoned: no retry"),
            Abandon::CordonedRetryDropped => f.write_str("cordoned: retry dropped"),
            Abandon::NotRetryable(class) => write!(f, "not retryable ({class})"),
            Abandon::RetryDisabled => f.write_str("claim retry disabled"),
            Abandon::GaveUp {
                attempts,
                age_secs,
                class,
            } => write!(
                f,
                "gave up after {attempts} attempts over {age_secs}s ({class})"
            ),
            Abandon::NoProviderAnyMore => f.write_str("no enabled provider covers it any more"),
        }
    }
}

/// A delivery's id as a note keeps it. GitHub's `X-GitHub-Delivery` is a UUID
/// (`72d3162e-cc78-11e3-81ab-4c9367dc0958` in GitHub's "Webhook events and payloads"): held as
/// its 16 bytes, not as 36 characters on the heap. Anything else (`reconcile`, an id spelt
/// otherwise) is kept as it came.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeliveryId {
    /// A lowercase hyphenated UUID.
    Uuid([u8; 16]),
    /// Any other id.
    Other(Box<str>),
}

impl DeliveryId {
    /// The id `s`, compact when it is a lowercase hyphenated UUID (so it prints back the same).
    pub fn new(s: &str) -> Self {
        Self::uuid(s).map_or_else(|| DeliveryId::Other(s.into()), DeliveryId::Uuid)
    }

    fn uuid(s: &str) -> Option<[u8; 16]> {
        let b = s.as_bytes();
        if b.len() != 36 || [8, 13, 18, 23].iter().any(|&i| b[i] != b'-') {
            return None;
        }
        let nibble = |c: u8| match c {
            b'0'..=b'9' => Some(c - b'0'),
            b'a'..=b'f' => Some(c - b'a' + 10),
            _ => None,
        };
        let mut digits = b.iter().filter(|&&c| c != b'-');
        let mut out = [0u8; 16];
        for byte in &mut out {
            let hi = nibble(*digits.next()?)?;
            let lo = nibble(*digits.next()?)?;
            *byte = hi << 4 | lo;
        }
        Some(out)
    }
}

impl fmt::Display for DeliveryId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DeliveryId::Uuid(bytes) => {
                for (i, byte) in bytes.iter().enumerate() {
                    if matches!(i, 4 | 6 | 8 | 10) {
                        f.write_str("-")?;
                    }
                    write!(f, "{byte:02x}")?;
                }
                Ok(())
            }
            DeliveryId::Other(s) => f.write_str(s),
        }
    }
}

/// A decision about a job.
#[derive(Debug, Clone, PartialEq)]
pub enum Note {
    /// A queued event passed the dedup gate.
    Queued {
        /// `X-GitHub-Delivery`, or `reconcile`.
        delivery: Option<DeliveryId>,
    },
    /// `waiting` for an environment approval.
    AwaitingApproval,
    /// No enabled provider covers the labels.
    Unroutable {
        /// The job's labels (the job's own shared set).
        labels: Arc<[String]>,
    },
    /// Outside the configured owner, repos or installation.
    OutOfScope {
        /// `owner`, `repo` or `installation`.
        reason: &'static str,
    },
    /// Cordoned when it arrived.
    CordonedNotAdmitted,
    /// Parked: not claimed for until its next look.
    Parked {
        /// Why.
        reason: crate::scheduler::core::ParkReason,
        /// Unix seconds of the next look.
        look_unix: u64,
    },
    /// Admitted again (a parked job looked at, a job held idle found queued by a reconcile
    /// pass, a delivery for a parked job).
    Readmitted {
        /// `parked`, `idle`, `delivery`.
        reason: &'static str,
    },
    /// A parked job looked at: GitHub says it is no longer queued.
    LookedAt {
        /// `in_progress`, `completed` or `gone`.
        status: &'static str,
    },
    /// A spare runner (made for another job, which no longer needs it) was handed to it.
    SpareHandedOver {
        /// Runner name.
        runner: Arc<str>,
        /// The job it was made for.
        from: u64,
    },
    /// Admitted; waiting for a slot and a claim token.
    Admitted,
    /// Routed to a provider; the claim is in flight.
    Claiming {
        /// The provider.
        provider: PoolName,
    },
    /// The claim failed.
    ClaimFailed {
        /// Its class.
        class: ErrorClass,
        /// What GitHub (or the network) said.
        error: String,
    },
    /// A runner was registered for it.
    Claimed {
        /// Runner name (shared with the ledger's and the other notes' copies).
        runner: Arc<str>,
        /// GitHub's runner id.
        runner_id: u64,
        /// Provider.
        provider: PoolName,
    },
    /// Onto the ladder.
    RetryScheduled {
        /// Failures so far.
        attempt: u32,
        /// Unix seconds of the next attempt.
        due_unix: u64,
        /// Delay from now.
        delay: Duration,
        /// Why this delay.
        reason: DelayReason,
        /// This failure's class.
        class: ErrorClass,
    },
    /// A retry came due.
    RetryDue {
        /// Failures so far.
        attempt: u32,
    },
    /// Dispatch stopped.
    Abandoned(Abandon),
    /// Observed running on some runner before a claim was needed.
    RanElsewhere,
    /// The cluster ledger says another live host holds the job (fleet mode).
    HeldElsewhere {
        /// That host.
        host: String,
    },
    /// The fleet's claim window or the registration budget says not yet (fleet mode).
    FleetPaced {
        /// Why.
        why: &'static str,
        /// For how long, in milliseconds.
        wait_ms: u64,
    },
    /// Another host gave the job back (its lease expired, or it drained) (fleet mode).
    Released {
        /// The host that released it.
        by: String,
        /// Claim failures on its ladder so far.
        attempts: u32,
    },
    /// `in_progress` or `completed` observed.
    Observed {
        /// Which.
        action: JobAction,
        /// On which runner.
        runner: Option<Arc<str>>,
    },
    /// The runner made for this job took another.
    RunnerTookOther {
        /// Runner name.
        runner: Arc<str>,
        /// The job it took.
        job_id: u64,
    },
    /// `completed`, with GitHub's conclusion.
    Completed {
        /// Conclusion (shared).
        conclusion: Arc<str>,
    },
    /// Its runner is being torn down.
    TearingDown {
        /// Runner name.
        runner: Arc<str>,
        /// Why.
        reason: &'static str,
    },
    /// Its runner's environment is up.
    RunnerStarted {
        /// Runner name.
        runner: Arc<str>,
        /// Since the claim.
        after: Duration,
        /// In an environment booted before the claim (a warm one): no boot for this job.
        warm: bool,
    },
    /// Its runner is gone.
    RunnerGone {
        /// Runner name.
        runner: Arc<str>,
        /// Why.
        reason: ExitReason,
        /// Exit code, if any.
        code: Option<i32>,
        /// How its environment ended, where the backend said.
        detail: Option<Arc<str>>,
    },
    /// Its runner's environment could not be made.
    EnvironmentFailed {
        /// Runner name.
        runner: Arc<str>,
        /// What went wrong.
        error: String,
    },
    /// Dispatched again (stranded, or its provisioner died).
    Requeued {
        /// Why.
        why: &'static str,
    },
    /// Its runner was reaped by the sweep.
    Reaped {
        /// Runner name.
        runner: Arc<str>,
        /// Why.
        reason: &'static str,
    },
    /// What its runner's egress met: names and addresses refused (or audited).
    Egress {
        /// Runner name.
        runner: Arc<str>,
        /// The refusals.
        seen: Arc<crate::egress::seen::Seen>,
    },
    /// Restored from the state store after a restart.
    Restored,
    /// A decision read back as its sentence (from the admin API).
    Recorded(String),
}

impl fmt::Display for Note {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Every kind is sorted here (no catch-all: a new kind must be placed).
        match self {
            Note::Queued { .. }
            | Note::AwaitingApproval
            | Note::Unroutable { .. }
            | Note::OutOfScope { .. }
            | Note::CordonedNotAdmitted
            | Note::Parked { .. }
            | Note::Readmitted { .. }
            | Note::LookedAt { .. }
            | Note::SpareHandedOver { .. }
            | Note::Admitted => self.fmt_admission(f),
            Note::Claiming { .. }
            | Note::ClaimFailed { .. }
            | Note::Claimed { .. }
            | Note::RetryScheduled { .. }
            | Note::RetryDue { .. }
            | Note::Abandoned(_)
            | Note::RanElsewhere
            | Note::HeldElsewhere { .. }
            | Note::FleetPaced { .. }
            | Note::Released { .. } => self.fmt_claim(f),
            Note::Observed { .. }
            | Note::RunnerTookOther { .. }
            | Note::Completed { .. }
            | Note::TearingDown { .. }
            | Note::RunnerStarted { .. }
            | Note::RunnerGone { .. }
            | Note::EnvironmentFailed { .. }
            | Note::Requeued { .. }
            | Note::Reaped { .. }
            | Note::Egress { .. }
            | Note::Restored
            | Note::Recorded(_) => self.fmt_runner(f),
        }
    }
}

impl Note {
    /// Before a claim: arrival, scope, admission, parking.
    fn fmt_admission(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Note::Queued { delivery: Some(id) } => {
                write!(f, "queued event received (delivery {id})")
            }
            Note::Queued { delivery: None } => f.write_str("queued event received (delivery -)"),
            Note::AwaitingApproval => f.write_str("waiting for an environment approval"),
            Note::Unroutable { labels } => {
                write!(
                    f,
                    "no enabled provider covers labels {}; not claimed",
                    labels.join(", ")
                )
            }
            Note::OutOfScope { reason } => write!(
                f,
                "outside this daemon's {reason} (github.owner, github.repos, the App installation): ignored, no API call"
            ),
            Note::CordonedNotAdmitted => f.write_str("cordoned: not admitted"),
            Note::Parked { reason, look_unix } => write!(
                f,
                "parked ({}): nothing claimed until it is looked at again at {}, or a delivery \
             or a reconcile pass brings it",
                reason.as_str(),
                crate::clock::rfc3339(*look_unix)
            ),
            Note::Readmitted { reason } => write!(f, "admitted again ({reason})"),
            Note::LookedAt { status } => {
                write!(f, "looked at: GitHub says it is {status}; nothing to claim")
            }
            Note::SpareHandedOver { runner, from } => write!(
                f,
                "spare runner {runner} (made for job {from}, which no longer needs it) handed to it"
            ),
            Note::Admitted => f.write_str("admitted; waiting for a slot"),
            _ => unreachable!("sorted by Display::fmt"),
        }
    }

    /// Claims, the ladder, the fleet.
    fn fmt_claim(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Note::Claiming { provider } => write!(f, "routed to {provider}; claiming a runner"),
            Note::ClaimFailed { class, error } => write!(f, "claim failed ({class}): {error}"),
            Note::Claimed {
                runner,
                runner_id,
                provider,
            } => write!(f, "claimed runner {runner} (id {runner_id}) on {provider}"),
            Note::RetryScheduled {
                attempt,
                due_unix,
                delay,
                reason,
                class,
            } => write!(
                f,
                "retry #{attempt} scheduled for {} (in {:.1}s; {}; {class})",
                crate::clock::rfc3339(*due_unix),
                delay.as_secs_f64(),
                describe(reason)
            ),
            Note::RetryDue { attempt } => write!(f, "retry #{attempt} due; waiting for a slot"),
            Note::Abandoned(why) => write!(f, "dispatch abandoned: {why}"),
            Note::RanElsewhere => {
                f.write_str("dispatch abandoned: observed running elsewhere: nothing to claim")
            }
            Note::HeldElsewhere { host } => {
                write!(
                    f,
                    "not claimed here: host {host} holds it in the cluster ledger"
                )
            }
            Note::FleetPaced { why, wait_ms } => write!(
                f,
                "claim deferred {:.1}s by the fleet: {why}",
                *wait_ms as f64 / 1000.0
            ),
            Note::Released { by, attempts } => write!(
                f,
                "released to the fleet by {by} with {attempts} failure(s) on its ladder; admitted again"
            ),
            _ => unreachable!("sorted by Display::fmt"),
        }
    }

    /// Runners and the job's end.
    fn fmt_runner(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Note::Observed { action, runner } => write!(
                f,
                "{} on {}",
                action.as_str().replace('_', " "),
                runner.as_deref().unwrap_or("no runner")
            ),
            Note::RunnerTookOther { runner, job_id } => {
                write!(f, "its runner {runner} took job {job_id} instead")
            }
            Note::Completed { conclusion } => write!(f, "completed ({conclusion})"),
            Note::TearingDown { runner, reason } => {
                write!(f, "tearing down runner {runner} ({reason})")
            }
            Note::RunnerStarted {
                runner,
                after,
                warm,
            } => write!(
                f,
                "runner {runner} started{} ({:.2}s after the claim)",
                if *warm {
                    " in a warm environment, booted before the claim"
                } else {
                    ""
                },
                after.as_secs_f64()
            ),
            Note::RunnerGone {
                runner,
                reason,
                code,
                detail,
            } => {
                match code {
                    Some(code) => write!(
                        f,
                        "runner {runner} gone: {} (exit code {code})",
                        reason.words()
                    )?,
                    None => write!(f, "runner {runner} gone: {}", reason.words())?,
                }
                match detail {
                    Some(detail) => write!(f, "; {detail}"),
                    None => Ok(()),
                }
            }
            Note::EnvironmentFailed { runner, error } => {
                write!(f, "environment for {runner} failed: {error}")
            }
            Note::Requeued { why } => write!(f, "re-queued: {why}"),
            Note::Reaped { runner, reason } => write!(f, "runner {runner} reaped: {reason}"),
            Note::Restored => f.write_str("restored from the state store after a restart"),
            Note::Egress { runner, seen } => write!(f, "egress of runner {runner}: {seen}"),
            Note::Recorded(text) => f.write_str(text),
            _ => unreachable!("sorted by Display::fmt"),
        }
    }
}

pub(super) fn describe(reason: &DelayReason) -> String {
    match reason {
        DelayReason::Ladder { rung } => format!("ladder rung {}", rung + 1),
        DelayReason::RetryAfter => "Retry-After".into(),
        DelayReason::RateReset { reset } => format!("rate budget empty until {reset}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_delivery_id_prints_back_as_it_came_and_a_uuid_is_held_compact() {
        for id in [
            "72d3162e-cc78-11e3-81ab-4c9367dc0958",
            "00000000-0000-0000-0000-000000000000",
            "72D3162E-CC78-11E3-81AB-4C9367DC0958",
            "72d3162e-cc78-11e3-81ab-4c9367dc095",
            "72d3162e_cc78-11e3-81ab-4c9367dc0958",
            "72d3162e-cc78-11e3-81ab-4c9367dc095g",
            "reconcile",
            "",
        ] {
            assert_eq!(DeliveryId::new(id).to_string(), id);
        }
        assert!(matches!(
            DeliveryId::new("72d3162e-cc78-11e3-81ab-4c9367dc0958"),
            DeliveryId::Uuid(_)
        ));
        assert!(matches!(
            DeliveryId::new("72D3162E-CC78-11E3-81AB-4C9367DC0958"),
            DeliveryId::Other(_)
        ));
        assert!(std::mem::size_of::<Option<DeliveryId>>() <= 24);
    }

    #[test]
    fn a_runner_s_end_reads_in_words() {
        use crate::provision::ExitReason;
        let gone = |code, reason| {
            Note::RunnerGone {
                runner: "r1".into(),
                reason,
                code,
                detail: None,
            }
            .to_string()
        };
        let vm = Note::RunnerGone {
            runner: "r1".into(),
            reason: ExitReason::Exited,
            code: Some(0),
            detail: Some("its runner exited with code 0, then the guest powered off".into()),
        };
        assert_eq!(
            vm.to_string(),
            "runner r1 gone: its process exited (exit code 0); its runner exited with code 0, \
             then the guest powered off"
        );
        assert_eq!(
            gone(None, ExitReason::TornDown),
            "runner r1 gone: torn down"
        );
        assert_eq!(
            gone(Some(0), ExitReason::Exited),
            "runner r1 gone: its process exited (exit code 0)"
        );
        for reason in [
            ExitReason::TimedOut,
            ExitReason::ProvisionerDied,
            ExitReason::Lost,
        ] {
            let text = gone(None, reason);
            assert!(
                !text.contains("None") && !text.contains(&format!("{reason:?}")),
                "{text}"
            );
        }
    }
}
