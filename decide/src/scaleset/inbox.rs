//! What one queue message means: the pure decision of the listener's message handling.
//!
//! A job's identity in a scale set is its `jobId` (github.com sends `runnerRequestId: 0` since
//! mid-2025; a GHES that sends no `jobId` is keyed by its request id), **and the assignment it
//! belongs to**: the service withdraws a job no runner took in time (`JobCompleted`, `canceled`)
//! and assigns it again, up to three times, with the same ids or new ones. Each withdrawal
//! starts the job's next assignment, which is a job of its own to the scheduler, so the second
//! assignment gets a runner (or the first one's spare) instead of being swallowed as a
//! duplicate of the first.
//!
//! What tells a withdrawal from a job that ran is what the daemon saw, not the service's time
//! fields (the sources do not say what a withdrawal carries in `runnerAssignTime`): a
//! `JobCompleted` that names no runner, for an assignment whose `JobStarted` never came. The assignments are counted in the [`Mark`], which is written
//! with the message's id in one write: a message handled again after a crash counts nothing
//! twice. Each job message is a delivery named by the scale set, the message id and its place
//! in the message: acknowledged messages never come back, and one handled but not
//! acknowledged meets the intake's dedup.
//!
//! Nothing here does I/O or reads a clock; the listener carries the [`Handled`] out.

use super::Mark;
use crate::{
    github::actions::types::{JobMessage, JobMessageKind, QueueMessage},
    job::{JobAction, JobInfo, JobKey},
};

/// Keys of scale-set jobs named by a `jobId` are at or above this (and below 2^53, so a
/// browser reads them whole): far above GitHub's REST job ids and runner request ids, far
/// below the placeholders' ranges ([`crate::job::Intent`]).
pub const JOB_ID_BASE: u64 = 1 << 52;

/// How long a job's assignment count is kept after it last changed: far past the service's
/// three assignments (minutes apart) and its job timeout.
pub const ASSIGNMENTS_KEPT_SECS: u64 = 48 * 3600;

/// At most this many assignment counts are kept (the oldest go first).
pub const ASSIGNMENTS_CAP: usize = 10_000;

/// A job the daemon keeps count of: one assigned again (its ordinal is how many times it was
/// withdrawn) or one a runner took (`started`, until it completes), and when that changed
/// (unix seconds).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Assignment {
    /// `jobId`, or `rr:<runnerRequestId>`.
    pub ident: String,
    /// How many times the job was withdrawn.
    pub ordinal: u32,
    /// When the count changed (unix seconds).
    pub at: u64,
    /// A `JobStarted` came for the current assignment: a runner took it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub started: bool,
}

/// A job message's identity (`None`: it names no job at all).
pub fn ident(m: &JobMessage) -> Option<String> {
    if !m.job_id.is_empty() {
        Some(m.job_id.clone())
    } else if m.runner_request_id != 0 {
        Some(format!("rr:{}", m.runner_request_id))
    } else {
        None
    }
}

/// The scheduler's key of assignment `ordinal` of the job `ident` (of request `request`) in
/// scale set `set`. A job assigned in a scale set made again is a new assignment too: a runner
/// of the old scale set never gets it. A GHES job on its first assignment keeps its request id
/// (unique across the service's scale sets), as before `jobId` was read.
pub fn key_of(owner: &str, set: u64, ident: &str, ordinal: u32, request: u64) -> JobKey {
    if ordinal == 0 && ident.starts_with("rr:") && request != 0 && request < JOB_ID_BASE {
        return JobKey::new(owner, request);
    }
    // FNV-1a: stable across builds and hosts (the fleet's hosts must agree on a key).
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let bytes = set
        .to_le_bytes()
        .into_iter()
        .chain(ident.bytes())
        .chain([0])
        .chain(ordinal.to_le_bytes());
    for b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    JobKey::new(owner, JOB_ID_BASE | (h & (JOB_ID_BASE - 1)))
}

/// Whether `key` is a scale-set job keyed by its runner request id (a GHES job with no
/// `jobId`, or any job recorded before `jobId` keys), not a placeholder or a warm intent.
pub fn keyed_by_request(key: &JobKey) -> bool {
    matches!(key.intent(), crate::job::Intent::Job(id) if id < JOB_ID_BASE)
}

/// One job message for the intake.
#[derive(Debug, Clone, PartialEq)]
pub struct Delivery {
    /// `scaleset-<set>-<message>-<index>`.
    pub id: String,
    /// The event.
    pub action: JobAction,
    /// The job.
    pub job: JobInfo,
}

/// What a message calls for, in order: acquire its offered jobs, hand the deliveries to the
/// intake, then keep the mark and acknowledge the message.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Handled {
    /// `JobAvailable` request ids to acquire.
    pub acquire: Vec<u64>,
    /// The job events.
    pub deliveries: Vec<Delivery>,
    /// Job messages per `type` label (the kind, or `unreadable`).
    pub counts: Vec<(&'static str, u64)>,
    /// Why the whole message could not be read, or job messages that were skipped (a kind
    /// not known, a field of the wrong type, no job named): logged with the message's id.
    pub unreadable: Option<String>,
    /// Jobs withdrawn by the service, to be assigned again.
    pub withdrawn: usize,
}

/// The job event a job message means (`None`: `JobAvailable`, which is acquired, not
/// recorded). `pin` is the pool's routing label ([`crate::config::scaleset_pin`]).
pub fn event_of(m: &JobMessage, key: JobKey, pin: &str) -> Option<(JobAction, JobInfo)> {
    let action = match m.message_type {
        JobMessageKind::JobAvailable => return None,
        JobMessageKind::JobAssigned => JobAction::Queued,
        JobMessageKind::JobStarted => JobAction::InProgress,
        JobMessageKind::JobCompleted => JobAction::Completed,
    };
    let conclusion = (action == JobAction::Completed).then(|| {
        // The service's results, in the REST API's words.
        match m.result.to_ascii_lowercase().as_str() {
            "succeeded" | "success" => "success",
            "failed" | "failure" => "failure",
            "canceled" | "cancelled" | "" => "cancelled",
            "skipped" => "skipped",
            _ => "failure",
        }
        .into()
    });
    let info = JobInfo {
        key,
        repo: m.repository_name.as_str().into(),
        run_id: m.workflow_run_id,
        run_attempt: 1,
        labels: vec![pin.to_string()].into(),
        runner_name: Some(m.runner_name.clone()).filter(|n| !n.is_empty()),
        runner_id: Some(m.runner_id).filter(|id| *id != 0),
        conclusion,
        installation_id: None,
        github_wait_secs: crate::clock::github_wait(
            m.queue_time.as_deref(),
            m.runner_assign_time.as_deref(),
        ),
        github_created_unix: crate::clock::github_unix(m.queue_time.as_deref()),
        withdrawn: withdrawn(m),
        // The service's message names the job, not its workflow, branch or trigger.
        about: crate::job::JobAbout::new(&m.job_display_name, "", "", "").map(Into::into),
    };
    Some((action, info))
}

/// Whether a `JobCompleted` ends an assignment, not the job, as far as the message says:
/// cancelled, and no runner named (the service assigns it again, or it was cancelled for
/// good: either way this assignment is over, and a later `JobAssigned` is a new one).
/// [`handle`] also asks that no `JobStarted` came for it.
fn withdrawn(m: &JobMessage) -> bool {
    m.message_type == JobMessageKind::JobCompleted
        && matches!(
            m.result.to_ascii_lowercase().as_str(),
            "canceled" | "cancelled" | ""
        )
        && m.runner_name.is_empty()
        && m.runner_id == 0
}

/// Decides message `message` of scale set `set` for owner `owner` and the pool pinned by
/// `pin`, counting assignments in `mark` (`now`: unix seconds). The caller writes the mark
/// with the message's id once the deliveries are durable, then acknowledges the message.
pub fn handle(
    message: &QueueMessage,
    set: u64,
    owner: &str,
    pin: &str,
    mark: &mut Mark,
    now: u64,
) -> Handled {
    let mut out = Handled::default();
    let count = |out: &mut Handled, label: &'static str| match out
        .counts
        .iter_mut()
        .find(|(l, _)| *l == label)
    {
        Some((_, n)) => *n += 1,
        None => out.counts.push((label, 1)),
    };
    let mut skipped = message.unreadable;
    for _ in 0..message.unreadable {
        count(&mut out, "unreadable");
    }
    if let Some(why) = &message.unreadable_message {
        count(&mut out, "unreadable");
        out.unreadable = Some(why.clone());
        return out;
    }
    for (index, m) in message.jobs.iter().enumerate() {
        let Some(ident) = ident(m) else {
            skipped += 1;
            count(&mut out, "unreadable");
            continue;
        };
        count(&mut out, m.message_type.as_str());
        if m.message_type == JobMessageKind::JobAvailable {
            if m.runner_request_id != 0 {
                out.acquire.push(m.runner_request_id);
            }
            continue;
        }
        let counted = mark.assignments.iter().find(|a| a.ident == ident);
        let ordinal = counted.map_or(0, |a| a.ordinal);
        let started = counted.is_some_and(|a| a.started);
        let key = key_of(owner, set, &ident, ordinal, m.runner_request_id);
        let Some((action, mut job)) = event_of(m, key, pin) else {
            continue;
        };
        // Withdrawn only if no runner took this assignment as far as the daemon saw.
        job.withdrawn = job.withdrawn && !started;
        let withdrawn = job.withdrawn;
        out.deliveries.push(Delivery {
            id: format!("scaleset-{set}-{}-{index}", message.id),
            action,
            job,
        });
        match m.message_type {
            JobMessageKind::JobStarted => mark_started(mark, &ident, ordinal, now),
            JobMessageKind::JobCompleted if withdrawn => {
                out.withdrawn += 1;
                bump(mark, &ident, ordinal + 1, now);
            }
            // Ran and ended: no later assignment.
            JobMessageKind::JobCompleted => mark.assignments.retain(|a| a.ident != ident),
            _ => {}
        }
    }
    if skipped > 0 {
        out.unreadable = Some(format!(
            "{skipped} job message(s) of a kind not known, with a field that does not parse, or naming no job"
        ));
    }
    prune(mark, now);
    out
}

fn bump(mark: &mut Mark, ident: &str, ordinal: u32, now: u64) {
    mark.assignments.retain(|a| a.ident != ident);
    mark.assignments.push(Assignment {
        ident: ident.to_string(),
        ordinal,
        at: now,
        started: false,
    });
}

/// A runner took assignment `ordinal` of `ident`: its `JobCompleted` is not a withdrawal,
/// whatever its fields say. Kept until that completion.
fn mark_started(mark: &mut Mark, ident: &str, ordinal: u32, now: u64) {
    bump(mark, ident, ordinal, now);
    if let Some(a) = mark.assignments.last_mut() {
        a.started = true;
    }
}

/// Forgets counts older than [`ASSIGNMENTS_KEPT_SECS`], and the oldest past the cap.
fn prune(mark: &mut Mark, now: u64) {
    mark.assignments
        .retain(|a| now.saturating_sub(a.at) < ASSIGNMENTS_KEPT_SECS);
    let over = mark.assignments.len().saturating_sub(ASSIGNMENTS_CAP);
    if over > 0 {
        mark.assignments.sort_by_key(|a| a.at);
        mark.assignments.drain(..over);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PIN: &str = "scaleset:alpha";

    fn msg(kind: JobMessageKind, request: u64, job: &str) -> JobMessage {
        JobMessage {
            message_type: kind,
            runner_request_id: request,
            job_id: job.into(),
            repository_name: "app".into(),
            ..JobMessage::default()
        }
    }

    fn started(request: u64, job: &str, runner: &str) -> JobMessage {
        JobMessage {
            runner_name: runner.into(),
            runner_id: 7,
            ..msg(JobMessageKind::JobStarted, request, job)
        }
    }

    fn completed(request: u64, job: &str, result: &str, runner: &str) -> JobMessage {
        JobMessage {
            result: result.into(),
            runner_name: runner.into(),
            ..msg(JobMessageKind::JobCompleted, request, job)
        }
    }

    fn queue(id: u64, jobs: Vec<JobMessage>) -> QueueMessage {
        QueueMessage {
            id,
            statistics: None,
            jobs,
            unreadable: 0,
            unreadable_message: None,
        }
    }

    fn keys(h: &Handled) -> Vec<(JobAction, u64)> {
        h.deliveries
            .iter()
            .map(|d| (d.action, d.job.key.job_id))
            .collect()
    }

    /// github.com: request id 0 on every job, the job named by `jobId`. Keyed by request id
    /// (the old way), the second job was the first one's duplicate.
    #[test]
    fn jobs_with_request_id_zero_are_told_apart_by_their_job_id() {
        let mut mark = Mark::default();
        let m = queue(
            1,
            vec![
                msg(JobMessageKind::JobAssigned, 0, "job-a"),
                msg(JobMessageKind::JobAssigned, 0, "job-b"),
            ],
        );
        let h = handle(&m, 3, "acme", PIN, &mut mark, 1000);
        let k = keys(&h);
        assert_eq!(k.len(), 2);
        assert_ne!(k[0].1, k[1].1, "two jobs, two keys");
        assert!(k.iter().all(|(_, id)| (JOB_ID_BASE..1 << 53).contains(id)));
        assert_eq!(h.deliveries[0].id, "scaleset-3-1-0");
        assert_eq!(h.deliveries[1].id, "scaleset-3-1-1");
        assert!(
            h.acquire.is_empty(),
            "assigned directly: nothing to acquire"
        );
        // The same job's later messages land on the same key.
        let h2 = handle(
            &queue(2, vec![started(0, "job-b", "r-1")]),
            3,
            "acme",
            PIN,
            &mut mark,
            1001,
        );
        assert_eq!(keys(&h2), [(JobAction::InProgress, k[1].1)]);
    }

    /// GHES: offered first, acquired by request id; a job with no `jobId` keeps the request
    /// id as its key.
    #[test]
    fn offered_jobs_are_acquired_and_a_job_without_job_id_is_keyed_by_its_request() {
        let mut mark = Mark::default();
        let h = handle(
            &queue(
                4,
                vec![
                    msg(JobMessageKind::JobAvailable, 70_001, "x"),
                    msg(JobMessageKind::JobAvailable, 70_002, ""),
                ],
            ),
            1,
            "acme",
            PIN,
            &mut mark,
            0,
        );
        assert_eq!(h.acquire, [70_001, 70_002]);
        assert!(h.deliveries.is_empty());
        let h = handle(
            &queue(5, vec![msg(JobMessageKind::JobAssigned, 70_002, "")]),
            1,
            "acme",
            PIN,
            &mut mark,
            0,
        );
        assert_eq!(keys(&h), [(JobAction::Queued, 70_002)]);
    }

    /// The service withdraws a job no runner took in time and assigns it again with the same
    /// ids: the second assignment is a new job to the scheduler (the old dedup swallowed it).
    #[test]
    fn a_job_withdrawn_and_assigned_again_with_the_same_ids_is_a_new_assignment() {
        let mut mark = Mark::default();
        let first = handle(
            &queue(1, vec![msg(JobMessageKind::JobAssigned, 9, "job-a")]),
            1,
            "acme",
            PIN,
            &mut mark,
            10,
        );
        let withdraw = handle(
            &queue(2, vec![completed(9, "job-a", "canceled", "")]),
            1,
            "acme",
            PIN,
            &mut mark,
            20,
        );
        assert_eq!(withdraw.withdrawn, 1);
        assert_eq!(
            keys(&withdraw),
            [(JobAction::Completed, keys(&first)[0].1)],
            "the first assignment ends"
        );
        let again = handle(
            &queue(
                3,
                vec![
                    msg(JobMessageKind::JobAssigned, 9, "job-a"),
                    started(9, "job-a", "r-2"),
                    completed(9, "job-a", "succeeded", "r-2"),
                ],
            ),
            1,
            "acme",
            PIN,
            &mut mark,
            30,
        );
        let k = keys(&again);
        assert_ne!(k[0].1, keys(&first)[0].1, "a new assignment, a new key");
        assert!(k.iter().all(|(_, id)| *id == k[0].1));
        assert!(mark.assignments.is_empty(), "a job that ran is forgotten");
    }

    /// Three assignments of one job, each withdrawal carrying the lapsed assignment's time
    /// in `runnerAssignTime` (the sources do not say it is empty): each assignment is a new
    /// key, in both shapes (github.com's `jobId` with request id 0; a GHES's request id,
    /// offered again and acquired between assignments), and the third that ran ends it.
    #[test]
    fn every_assignment_is_new_work_whatever_the_withdrawal_s_times_say() {
        for (request, job) in [(0, "job-a"), (9, ""), (9, "job-a")] {
            let mut mark = Mark::default();
            let mut seen = Vec::new();
            let at = Some("2026-12-05T10:00:00Z".to_string());
            for round in 0..3u64 {
                let base = 10 * round;
                let mut offer = vec![msg(JobMessageKind::JobAssigned, request, job)];
                if request != 0 {
                    offer.insert(0, msg(JobMessageKind::JobAvailable, request, job));
                }
                let h = handle(&queue(base + 1, offer), 1, "acme", PIN, &mut mark, base);
                if request != 0 {
                    assert_eq!(h.acquire, [request], "offered again: acquired again");
                }
                let key = keys(&h)[0].1;
                assert!(!seen.contains(&key), "{job:?} round {round}: an old key");
                seen.push(key);
                if round < 2 {
                    let lapsed = JobMessage {
                        runner_assign_time: at.clone(),
                        ..completed(request, job, "canceled", "")
                    };
                    let h = handle(
                        &queue(base + 2, vec![lapsed]),
                        1,
                        "acme",
                        PIN,
                        &mut mark,
                        base,
                    );
                    assert_eq!(h.withdrawn, 1, "{job:?} round {round}");
                    assert!(h.deliveries[0].job.withdrawn);
                    assert_eq!(keys(&h)[0].1, key, "the assignment ends, not another");
                }
            }
            let ran = handle(
                &queue(
                    40,
                    vec![
                        started(request, job, "r-3"),
                        completed(request, job, "succeeded", "r-3"),
                    ],
                ),
                1,
                "acme",
                PIN,
                &mut mark,
                40,
            );
            assert!(keys(&ran).iter().all(|(_, k)| *k == seen[2]));
            assert!(mark.assignments.is_empty(), "a job that ran is forgotten");
        }
    }

    /// A runner took it (`JobStarted` came), then the job was cancelled by a completion that
    /// names no runner: the job's end, not a withdrawal; its runner is torn down.
    #[test]
    fn a_completion_after_a_start_is_never_a_withdrawal() {
        let mut mark = Mark::default();
        let h = handle(
            &queue(
                1,
                vec![
                    msg(JobMessageKind::JobAssigned, 0, "job-s"),
                    started(0, "job-s", "r-1"),
                ],
            ),
            1,
            "acme",
            PIN,
            &mut mark,
            0,
        );
        let key = keys(&h)[0].1;
        assert!(mark.assignments.iter().any(|a| a.started));
        let done = handle(
            &queue(2, vec![completed(0, "job-s", "canceled", "")]),
            1,
            "acme",
            PIN,
            &mut mark,
            1,
        );
        assert_eq!(done.withdrawn, 0);
        assert!(!done.deliveries[0].job.withdrawn);
        assert_eq!(keys(&done)[0].1, key);
        assert!(mark.assignments.is_empty());
    }

    /// Cancelled while running is the job's end, not a withdrawal.
    #[test]
    fn a_job_cancelled_after_a_runner_took_it_is_not_assigned_again() {
        let mut mark = Mark::default();
        let h = handle(
            &queue(1, vec![completed(0, "job-a", "canceled", "r-1")]),
            1,
            "acme",
            PIN,
            &mut mark,
            0,
        );
        assert_eq!(h.withdrawn, 0);
        assert!(mark.assignments.is_empty());
    }

    /// A message of an unknown type, an item with a field of the wrong type and an item that
    /// names no job are counted and reported, and the rest of the batch is handled.
    #[test]
    fn what_cannot_be_read_is_counted_and_never_holds_the_rest() {
        let mut mark = Mark::default();
        let mut m = queue(
            6,
            vec![
                msg(JobMessageKind::JobAssigned, 0, ""),
                msg(JobMessageKind::JobAssigned, 0, "job-c"),
            ],
        );
        m.unreadable = 2;
        let h = handle(&m, 1, "acme", PIN, &mut mark, 0);
        assert_eq!(h.deliveries.len(), 1);
        assert!(h.unreadable.unwrap().starts_with("3 job message"));
        assert!(h.counts.contains(&("unreadable", 3)));
        assert!(h.counts.contains(&("JobAssigned", 1)));
        let whole = QueueMessage {
            unreadable_message: Some("a message of type \"X\"".into()),
            ..queue(7, Vec::new())
        };
        let h = handle(&whole, 1, "acme", PIN, &mut mark, 0);
        assert!(h.deliveries.is_empty());
        assert_eq!(h.counts, [("unreadable", 1)]);
        assert!(h.unreadable.is_some());
    }

    /// A `JobCompleted` naming no runner (`runnerName: null`) still ends its job.
    #[test]
    fn a_completion_that_names_no_runner_ends_its_job() {
        let mut mark = Mark::default();
        let queued = handle(
            &queue(1, vec![msg(JobMessageKind::JobAssigned, 0, "job-d")]),
            1,
            "acme",
            PIN,
            &mut mark,
            0,
        );
        let done = handle(
            &queue(2, vec![completed(0, "job-d", "failed", "")]),
            1,
            "acme",
            PIN,
            &mut mark,
            0,
        );
        assert_eq!(keys(&done), [(JobAction::Completed, keys(&queued)[0].1)]);
        assert_eq!(
            done.deliveries[0].job.conclusion.as_deref(),
            Some("failure")
        );
    }

    #[test]
    fn assignment_counts_are_forgotten_after_two_days_and_past_the_cap() {
        let mut mark = Mark::default();
        bump(&mut mark, "old", 1, 0);
        bump(&mut mark, "new", 2, ASSIGNMENTS_KEPT_SECS);
        prune(&mut mark, ASSIGNMENTS_KEPT_SECS + 1);
        assert_eq!(mark.assignments.len(), 1);
        for i in 0..ASSIGNMENTS_CAP as u64 + 5 {
            bump(&mut mark, &format!("j{i}"), 1, ASSIGNMENTS_KEPT_SECS + i);
        }
        prune(&mut mark, ASSIGNMENTS_KEPT_SECS + 1);
        assert_eq!(mark.assignments.len(), ASSIGNMENTS_CAP);
        assert!(!mark.assignments.iter().any(|a| a.ident == "new"));
    }

    #[test]
    fn request_keys_are_told_from_job_id_keys_and_placeholders() {
        assert!(keyed_by_request(&JobKey::new("acme", 70_001)));
        assert!(!keyed_by_request(&key_of("acme", 1, "job-a", 0, 0)));
        assert!(!keyed_by_request(&JobKey::reckoned("acme", 1)));
        assert!(!keyed_by_request(&JobKey::warm("acme", 1)));
    }

    #[test]
    fn keys_are_stable_and_kept_apart_by_assignment() {
        assert_eq!(key_of("acme", 1, "j", 0, 0), key_of("Acme", 1, "j", 0, 0));
        assert_ne!(key_of("acme", 1, "j", 0, 0), key_of("acme", 1, "j", 1, 0));
        assert_ne!(
            key_of("acme", 1, "j", 0, 0),
            key_of("acme", 2, "j", 0, 0),
            "a scale set made again assigns anew"
        );
        assert_ne!(key_of("acme", 1, "rr:5", 1, 5).job_id, 5);
        assert_eq!(key_of("acme", 1, "rr:5", 0, 5).job_id, 5);
    }
}
