//! The Actions service's scale-set vocabulary, field for field as `actions/scaleset`'s
//! `types.go` spells it on the wire. Plain data.

use serde::{Deserialize, Serialize};

/// A label of a scale set (`type` is `System` unless said otherwise).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Label {
    /// `System`.
    #[serde(rename = "type", default)]
    pub kind: String,
    /// The label.
    pub name: String,
}

/// A runner scale set.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ScaleSet {
    /// Id (0 before it is created).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub id: u64,
    /// Name, unique in its runner group.
    #[serde(default)]
    pub name: String,
    /// Runner group id.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub runner_group_id: u64,
    /// Runner group name.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub runner_group_name: String,
    /// Labels.
    #[serde(default)]
    pub labels: Vec<Label>,
    /// Its runners' settings (`RunnerSetting`, capitalised on the wire).
    #[serde(rename = "RunnerSetting", default)]
    pub runner_setting: RunnerSetting,
    /// Statistics, when the answer carries them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub statistics: Option<Statistics>,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl ScaleSet {
    /// The label names, sorted.
    pub fn label_names(&self) -> Vec<String> {
        let mut names: Vec<String> = self.labels.iter().map(|l| l.name.clone()).collect();
        names.sort();
        names
    }
}

/// A scale set's runner settings.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RunnerSetting {
    /// The runners do not update themselves.
    #[serde(default)]
    pub disable_update: bool,
}

/// What the service counts for a scale set, on every message and session.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Statistics {
    /// Jobs offered, not acquired.
    #[serde(default, deserialize_with = "nullable")]
    pub total_available_jobs: u64,
    /// Jobs acquired.
    #[serde(default, deserialize_with = "nullable")]
    pub total_acquired_jobs: u64,
    /// Jobs assigned to the scale set (running ones included): the runners it needs.
    #[serde(default, deserialize_with = "nullable")]
    pub total_assigned_jobs: u64,
    /// Jobs a runner runs.
    #[serde(default, deserialize_with = "nullable")]
    pub total_running_jobs: u64,
    /// Runners registered.
    #[serde(default, deserialize_with = "nullable")]
    pub total_registered_runners: u64,
    /// Of those, busy.
    #[serde(default, deserialize_with = "nullable")]
    pub total_busy_runners: u64,
    /// Of those, idle.
    #[serde(default, deserialize_with = "nullable")]
    pub total_idle_runners: u64,
}

/// A message session.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Session {
    /// Id.
    #[serde(default, deserialize_with = "nullable")]
    pub session_id: String,
    /// Who holds it.
    #[serde(default, deserialize_with = "nullable")]
    pub owner_name: String,
    /// Where its messages are polled.
    #[serde(default, deserialize_with = "nullable")]
    pub message_queue_url: String,
    /// The queue's token.
    #[serde(default, deserialize_with = "nullable")]
    pub message_queue_access_token: String,
    /// Statistics at the session's start.
    /// The scale set's figures when the message was sent.
    #[serde(default)]
    pub statistics: Option<Statistics>,
}

impl std::fmt::Display for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} (owner {})", self.session_id, self.owner_name)
    }
}

/// A message as the queue sends it; `body` is a JSON array of job messages, as a string.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WireMessage {
    /// The message's id (acknowledged by it; a restart resumes after it).
    pub message_id: u64,
    /// `RunnerScaleSetJobMessages`, or a kind this daemon does not read.
    #[serde(default, deserialize_with = "nullable")]
    pub message_type: String,
    /// The job messages: a JSON array, as a string.
    #[serde(default, deserialize_with = "nullable")]
    pub body: String,
    /// The scale set's figures when the message was sent.
    #[serde(default)]
    pub statistics: Option<Statistics>,
}

/// The kinds of job messages.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
pub enum JobMessageKind {
    /// Offered to the scale set: acquire it to have it assigned.
    JobAvailable,
    /// Assigned to the scale set: one of its runners will get it.
    #[default]
    JobAssigned,
    /// A runner of the scale set took it.
    JobStarted,
    /// It ended (`result` `canceled` when no runner took it in time).
    JobCompleted,
}

impl JobMessageKind {
    /// The wire spelling, also the `type` metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            JobMessageKind::JobAvailable => "JobAvailable",
            JobMessageKind::JobAssigned => "JobAssigned",
            JobMessageKind::JobStarted => "JobStarted",
            JobMessageKind::JobCompleted => "JobCompleted",
        }
    }
}

/// A field the service may send as `null` (or leave out): read as its default. The service
/// is written in C#, whose serializer writes `null` for a string or number never set; the Go
/// clients' types read that as the zero value, and so does this.
fn nullable<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Deserialize<'de> + Default,
{
    Ok(Option::<T>::deserialize(d)?.unwrap_or_default())
}

/// One job message (`JobMessageBase` with the fields of each kind). Every field but the kind
/// may be `null` or absent.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct JobMessage {
    /// Which kind.
    pub message_type: JobMessageKind,
    /// The runner request: what `acquirejobs` takes. **0 in github.com's messages** since
    /// mid-2025 (only a GHES still numbers them).
    #[serde(default, deserialize_with = "nullable")]
    pub runner_request_id: u64,
    /// Repository (without the owner).
    #[serde(default, deserialize_with = "nullable")]
    pub repository_name: String,
    /// Owner.
    #[serde(default, deserialize_with = "nullable")]
    pub owner_name: String,
    /// The job's id in the service (a UUID-like string): the job's identity.
    #[serde(default, deserialize_with = "nullable")]
    pub job_id: String,
    /// The job's display name.
    #[serde(default, deserialize_with = "nullable")]
    pub job_display_name: String,
    /// Workflow run id.
    #[serde(default, deserialize_with = "nullable")]
    pub workflow_run_id: u64,
    /// The job's `runs-on`.
    #[serde(default, deserialize_with = "nullable")]
    pub request_labels: Vec<String>,
    /// `JobStarted`, `JobCompleted`: the runner.
    #[serde(default, deserialize_with = "nullable")]
    pub runner_id: u64,
    /// `JobStarted`, `JobCompleted`: the runner's name (empty when none took it).
    #[serde(default, deserialize_with = "nullable")]
    pub runner_name: String,
    /// `JobCompleted`: `succeeded`, `failed`, `canceled`, ...
    #[serde(default, deserialize_with = "nullable")]
    pub result: String,
    /// When the job was queued (RFC 3339).
    #[serde(default)]
    pub queue_time: Option<String>,
    /// When a runner took it (RFC 3339; GitHub's zero time, or nothing, until then).
    #[serde(default)]
    pub runner_assign_time: Option<String>,
}

impl JobMessage {
    /// Whether a runner ever took the job: a runner named, or a runner assignment time that
    /// is not the zero time (`0001-01-01...`).
    pub fn ran(&self) -> bool {
        let assigned = self
            .runner_assign_time
            .as_deref()
            .is_some_and(|t| !t.is_empty() && !t.starts_with("0001-"));
        !self.runner_name.is_empty() || self.runner_id != 0 || assigned
    }
}

/// One message of the queue: its id, the statistics, and its job messages in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueMessage {
    /// Id; poll with it as `lastMessageId` for the next.
    pub id: u64,
    /// The scale set's statistics.
    pub statistics: Option<Statistics>,
    /// The job messages. One that could not be read is left out and counted in `unreadable`.
    pub jobs: Vec<JobMessage>,
    /// Job messages of a kind not known (or unreadable): skipped, never blocking the queue.
    pub unreadable: usize,
    /// Why the whole message could not be read (an envelope of another type, a body that is
    /// not a JSON array): it is acknowledged all the same, so it never blocks the queue.
    pub unreadable_message: Option<String>,
}

impl WireMessage {
    /// The message's job messages; an item that does not parse (an unknown kind, a field of
    /// the wrong type) is skipped and counted; a message of another type, or with a body that
    /// is not an array, is kept as unreadable (with its id, so it can be acknowledged).
    pub fn parse(self) -> QueueMessage {
        let mut message = QueueMessage {
            id: self.message_id,
            statistics: self.statistics,
            jobs: Vec::new(),
            unreadable: 0,
            unreadable_message: None,
        };
        if self.message_type != "RunnerScaleSetJobMessages" {
            message.unreadable_message = Some(format!("a message of type {:?}", self.message_type));
            return message;
        }
        let body = self.body.trim_start_matches('\u{feff}');
        let items: Vec<serde_json::Value> = if body.trim().is_empty() {
            Vec::new()
        } else {
            match serde_json::from_str(body) {
                Ok(items) => items,
                Err(e) => {
                    message.unreadable_message = Some(format!("a body that does not parse: {e}"));
                    return message;
                }
            }
        };
        let past_cap = items.len().saturating_sub(MAX_JOBS_PER_MESSAGE);
        message.unreadable += past_cap;
        for item in items.into_iter().take(MAX_JOBS_PER_MESSAGE) {
            match serde_json::from_value::<JobMessage>(item) {
                Ok(j) if j.within_bounds() => message.jobs.push(j.with_short_name()),
                _ => message.unreadable += 1,
            }
        }
        message
    }
}

/// The most job messages read from one queue message; more are counted as unreadable (the
/// service batches a few dozen; a queue answering thousands is not the service).
pub const MAX_JOBS_PER_MESSAGE: usize = 2000;
/// The longest name, id or result a job message may carry (GitHub's own limits are shorter:
/// 39 characters for an owner, 100 for a repository); a longer one makes the entry unreadable.
pub const MAX_FIELD: usize = 256;
/// The most labels a job message may carry (the webhook intake's limit too).
pub const MAX_LABELS: usize = 64;
/// A job's display name is cut to this many bytes (it is only shown).
pub const MAX_DISPLAY_NAME: usize = 1024;

impl JobMessage {
    /// Whether every field is within what the service sends: a queue that names a repository
    /// in a megabyte is not read as one.
    pub fn within_bounds(&self) -> bool {
        let short = |s: &str| s.len() <= MAX_FIELD;
        [
            &self.repository_name,
            &self.owner_name,
            &self.job_id,
            &self.runner_name,
            &self.result,
        ]
        .iter()
        .all(|s| short(s))
            && [&self.queue_time, &self.runner_assign_time]
                .iter()
                .all(|t| t.as_deref().is_none_or(short))
            && self.request_labels.len() <= MAX_LABELS
            && self.request_labels.iter().all(|l| short(l))
    }

    /// The same, its display name cut to [`MAX_DISPLAY_NAME`] bytes (at a character's edge).
    pub fn with_short_name(mut self) -> Self {
        if self.job_display_name.len() > MAX_DISPLAY_NAME {
            let mut end = MAX_DISPLAY_NAME;
            while !self.job_display_name.is_char_boundary(end) {
                end -= 1;
            }
            self.job_display_name.truncate(end);
        }
        self
    }
}

/// `generatejitconfig`'s answer.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct JitAnswer {
    /// The runner it registered.
    pub runner: RunnerReference,
    /// The runner's config (a secret).
    #[serde(rename = "encodedJITConfig")]
    pub encoded_jit_config: String,
}

/// A runner as the service names it.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RunnerReference {
    /// Its id.
    pub id: u64,
    /// Its name.
    pub name: String,
}

/// A list answer (`{count, value}`).
#[derive(Debug, Clone, Deserialize)]
pub struct List<T> {
    /// The items.
    #[serde(default = "Vec::new")]
    pub value: Vec<T>,
}

/// A runner group as the service lists it.
#[derive(Debug, Clone, Deserialize)]
pub struct RunnerGroup {
    /// Its id.
    pub id: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_message_with_an_unknown_item_keeps_the_rest() {
        let body = serde_json::json!([
            { "messageType": "JobAvailable", "runnerRequestId": 7, "acquireJobUrl": "x" },
            { "messageType": "JobSomethingNew", "runnerRequestId": 8 },
            { "messageType": "JobCompleted", "runnerRequestId": 9, "result": "canceled", "runnerName": "" },
        ]);
        let wire = WireMessage {
            message_id: 3,
            message_type: "RunnerScaleSetJobMessages".into(),
            body: body.to_string(),
            statistics: Some(Statistics {
                total_assigned_jobs: 2,
                ..Statistics::default()
            }),
        };
        let m = wire.parse();
        assert_eq!(m.id, 3);
        assert_eq!(m.unreadable, 1);
        let kinds: Vec<_> = m
            .jobs
            .iter()
            .map(|j| (j.message_type, j.runner_request_id))
            .collect();
        assert_eq!(
            kinds,
            [
                (JobMessageKind::JobAvailable, 7),
                (JobMessageKind::JobCompleted, 9)
            ]
        );
        assert_eq!(m.statistics.unwrap().total_assigned_jobs, 2);
    }

    /// A queue that is not the service: thousands of entries, a repository named in 100 KB,
    /// a thousand labels. What is past the bounds is counted as unreadable, never kept.
    #[test]
    fn entries_and_fields_past_the_bounds_are_counted_not_kept() {
        let job = |n: usize| serde_json::json!({ "messageType": "JobAssigned", "jobId": format!("j{n}"), "repositoryName": "app" });
        let mut items: Vec<serde_json::Value> = (0..MAX_JOBS_PER_MESSAGE + 500).map(job).collect();
        items[0]["repositoryName"] = "r".repeat(100_000).into();
        items[1]["requestLabels"] = serde_json::json!(vec!["x"; 1000]);
        items[2]["jobDisplayName"] = "é".repeat(5000).into();
        let wire = WireMessage {
            message_id: 4,
            message_type: "RunnerScaleSetJobMessages".into(),
            body: serde_json::Value::Array(items).to_string(),
            statistics: None,
        };
        let m = wire.parse();
        assert_eq!(m.jobs.len(), MAX_JOBS_PER_MESSAGE - 2);
        assert_eq!(m.unreadable, 500 + 2);
        let named = &m.jobs[0];
        assert_eq!(named.job_id, "j2");
        assert!(named.job_display_name.len() <= MAX_DISPLAY_NAME);
        assert!(named.job_display_name.chars().all(|c| c == 'é'));
    }

    #[test]
    fn a_message_of_another_type_or_an_unparsable_body_is_kept_to_be_acknowledged() {
        let wire = |kind: &str, body: &str| WireMessage {
            message_id: 8,
            message_type: kind.into(),
            body: body.into(),
            statistics: None,
        };
        let other = wire("RunnerScaleSetSomethingNew", "[]").parse();
        assert_eq!(other.id, 8);
        assert!(other.unreadable_message.unwrap().contains("SomethingNew"));
        let bad = wire("RunnerScaleSetJobMessages", "{not json").parse();
        assert!(bad.unreadable_message.is_some() && bad.jobs.is_empty());
        let bom = wire("RunnerScaleSetJobMessages", "\u{feff}[]").parse();
        assert_eq!(bom.unreadable_message, None);
    }

    #[test]
    fn null_fields_read_as_empty_and_a_job_without_a_runner_never_ran() {
        let item = serde_json::json!({
            "messageType": "JobCompleted", "runnerRequestId": 0, "jobId": "a-b",
            "runnerName": null, "runnerId": null, "result": null, "requestLabels": null,
            "workflowRunId": null, "repositoryName": null, "ownerName": null,
            "jobDisplayName": null, "queueTime": null, "runnerAssignTime": "0001-01-01T00:00:00Z",
        });
        let m: JobMessage = serde_json::from_value(item).unwrap();
        assert_eq!((m.job_id.as_str(), m.runner_name.as_str()), ("a-b", ""));
        assert!(!m.ran());
        let started: JobMessage = serde_json::from_value(serde_json::json!({
            "messageType": "JobStarted", "runnerName": "r-1", "runnerId": 4
        }))
        .unwrap();
        assert!(started.ran());
        let stats: Statistics =
            serde_json::from_value(serde_json::json!({ "totalAssignedJobs": null })).unwrap();
        assert_eq!(stats.total_assigned_jobs, 0);
    }

    #[test]
    fn a_scale_set_serializes_as_the_service_reads_it() {
        let set = ScaleSet {
            name: "linux".into(),
            runner_group_id: 1,
            labels: vec![Label {
                kind: "System".into(),
                name: "linux".into(),
            }],
            ..ScaleSet::default()
        };
        let v = serde_json::to_value(&set).unwrap();
        assert_eq!(v["name"], "linux");
        assert_eq!(v["runnerGroupId"], 1);
        assert_eq!(v["labels"][0]["type"], "System");
        assert_eq!(v["RunnerSetting"]["disableUpdate"], false);
        assert!(v.get("id").is_none(), "no id before it exists");
    }
}
