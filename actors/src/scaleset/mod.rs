//! Scale-set mode (`webhook.mode = "scaleset"`): each pool is one of GitHub's runner scale
//! sets, and a [`ScaleSetListener`] per pool holds the scale set's message session and long-polls
//! its queue. No webhook, no inbound port, no REST polling: GitHub assigns a job to one scale
//! set, so a pool's runners never take another pool's job.
//!
//! A message's job messages go through the intake's gate as webhook deliveries do
//! (`JobAssigned` is a `queued`, `JobStarted` an `in_progress`, `JobCompleted` a `completed`;
//! the job's identity is its runner request id), so they meet the same dedup and durable record;
//! the message is acknowledged (deleted) only once all of them are durable, and its id is kept in
//! the store as the `lastMessageId` a restart resumes from. `JobAvailable` jobs are acquired.
//! Claims for a pool go to its listener, which registers the runner in the scale set
//! (`generatejitconfig`): they climb the ladder as REST claims do.

mod lease;
pub mod listener;
mod reckon;
mod view;

use std::time::Duration;

pub use listener::{ScaleSetListener, ScaleSetSettings, ScaleSetWiring};
pub use view::{GetListener, ListenerView};

use crate::{
    github::actions::types::{JobMessage, JobMessageKind},
    job::{JobAction, JobInfo, JobKey},
};

/// The store mark a pool's listener keeps: `scaleset:<owner>/<pool>`.
pub fn mark_of(owner: &str, pool: &str) -> String {
    format!("scaleset:{}/{pool}", owner.to_ascii_lowercase())
}

/// What a listener keeps across restarts.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Mark {
    /// The scale set's id.
    #[serde(default)]
    pub scale_set_id: u64,
    /// The last message handled and acknowledged.
    #[serde(default)]
    pub last_message_id: u64,
    /// This host's last session, closed at the next start so the host does not wait out its
    /// own session (after a `kill -9`).
    #[serde(default)]
    pub session_id: Option<String>,
    /// Jobs (runner request ids) still waiting when the scale set was made again: GitHub
    /// assigns them anew in the new scale set, so these may be withdrawn when the new one's
    /// statistics do not count them (see `reckon`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub orphans: Vec<u64>,
}

/// The job event a job message means (`None`: `JobAvailable`, which is acquired, not
/// recorded). `pin` is the pool's routing label ([`crate::config::scaleset_pin`]).
pub fn event_of(m: &JobMessage, owner: &str, pin: &str) -> Option<(JobAction, JobInfo)> {
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
        key: JobKey::new(owner, m.runner_request_id),
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
    };
    Some((action, info))
}

/// A growing, capped wait with jitter (0.8x-1.2x): the session's and the poll's backoffs.
#[derive(Debug, Clone)]
pub struct Backoff {
    first: Duration,
    cap: Duration,
    next: Duration,
}

impl Backoff {
    /// Starts at `first`, doubles up to `cap`.
    pub fn new(first: Duration, cap: Duration) -> Self {
        Backoff {
            first,
            cap,
            next: first,
        }
    }

    /// The next wait; `draw` in `[0, 1)` places it in the jitter band.
    pub fn next(&mut self, draw: f64) -> Duration {
        let base = self.next;
        self.next = (self.next * 2).min(self.cap);
        base.mul_f64(0.8 + 0.4 * draw.clamp(0.0, 1.0))
    }

    /// Back to the first wait (after a success).
    pub fn reset(&mut self) {
        self.next = self.first;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(kind: JobMessageKind, result: &str, runner: &str) -> JobMessage {
        JobMessage {
            message_type: kind,
            runner_request_id: 42,
            repository_name: "app".into(),
            owner_name: "Acme".into(),
            job_id: "x".into(),
            job_display_name: "build".into(),
            workflow_run_id: 9,
            request_labels: vec!["linux".into()],
            runner_id: if runner.is_empty() { 0 } else { 5 },
            runner_name: runner.into(),
            result: result.into(),
            queue_time: None,
            runner_assign_time: None,
        }
    }

    #[test]
    fn job_messages_become_the_job_events_of_a_pinned_job() {
        let pin = "scaleset:linux";
        assert!(event_of(&message(JobMessageKind::JobAvailable, "", ""), "acme", pin).is_none());
        let (action, info) =
            event_of(&message(JobMessageKind::JobAssigned, "", ""), "Acme", pin).unwrap();
        assert_eq!(action, JobAction::Queued);
        assert_eq!(info.key, JobKey::new("acme", 42));
        assert_eq!(&*info.labels, [pin.to_string()]);
        assert_eq!(info.runner_name, None);
        let (action, info) =
            event_of(&message(JobMessageKind::JobStarted, "", "r-1"), "acme", pin).unwrap();
        assert_eq!(action, JobAction::InProgress);
        assert_eq!(
            (info.runner_name.as_deref(), info.runner_id),
            (Some("r-1"), Some(5))
        );
        let (_, info) = event_of(
            &message(JobMessageKind::JobCompleted, "canceled", ""),
            "acme",
            pin,
        )
        .unwrap();
        assert_eq!(info.conclusion.as_deref(), Some("cancelled"));
        let (_, info) = event_of(
            &message(JobMessageKind::JobCompleted, "succeeded", "r-1"),
            "acme",
            pin,
        )
        .unwrap();
        assert_eq!(info.conclusion.as_deref(), Some("success"));
    }

    #[test]
    fn the_backoff_doubles_to_its_cap_and_starts_over_after_a_success() {
        let mut b = Backoff::new(Duration::from_secs(5), Duration::from_secs(60));
        let waits: Vec<u64> = (0..6).map(|_| b.next(0.5).as_secs()).collect();
        assert_eq!(waits, [5, 10, 20, 40, 60, 60]);
        assert!(b.next(0.0) >= Duration::from_secs(48));
        assert!(b.next(1.0) <= Duration::from_secs(72));
        b.reset();
        assert_eq!(b.next(0.5), Duration::from_secs(5));
    }

    #[test]
    fn the_mark_survives_json_and_an_older_one_reads() {
        let m = Mark {
            scale_set_id: 3,
            last_message_id: 17,
            session_id: Some("s".into()),
            orphans: vec![5],
        };
        let v = serde_json::to_value(&m).unwrap();
        assert_eq!(serde_json::from_value::<Mark>(v).unwrap(), m);
        let old: Mark =
            serde_json::from_value(serde_json::json!({ "last_message_id": 4 })).unwrap();
        assert_eq!(old.last_message_id, 4);
        assert_eq!(mark_of("Acme", "linux"), "scaleset:acme/linux");
    }
}
