//! The Actions service's runner scale-set side, as `actions/scaleset` (the Go client GitHub
//! publishes) expects it: the admin connection (`POST /actions/runner-registration` with a
//! registration token as `RemoteAuth`), scale sets under `_apis/runtime/runnerscalesets`, one
//! message session per scale set (409 while another owner holds it), a message queue that
//! long-polls (200 with a message, 202 after `long_poll` with none), keeps a message until it is
//! deleted, and batches job messages 50 to a message; `acquirejobs`, `generatejitconfig`, and the
//! statistics every message and session carries.
//!
//! Jobs reach a scale set when they are queued: the most specific scale set whose labels (or
//! name) cover the job's labels, among those with room under the `X-ScaleSetMaxCapacity` their
//! listener last sent, gets the job; one with no room leaves it waiting (ARC PR #3431: the
//! service holds the jobs it assigns against that number). Two message shapes, both played:
//!
//! - **github.com** ([`MessageShape::Dotcom`], the default): the job is assigned directly
//!   (`JobAssigned`, no `JobAvailable` to acquire), and its messages carry `runnerRequestId: 0`
//!   and name it by a string `jobId` (GARM PR #459; actions/scaleset PR #4 and #90).
//! - **GHES** ([`MessageShape::Ghes`]): offered first (`JobAvailable`), assigned once acquired,
//!   numbered by runner request ids (actions/scaleset#75).
//!
//! A runner of that scale set takes it (`JobStarted`); it ends (`JobCompleted`, `result`
//! `canceled` when it ended before a runner took it). With [`ScaleSets::assign_windows`] set, an
//! assigned job no runner took in time is withdrawn (`JobCompleted`, `canceled`, no runner) and
//! assigned again with the same ids, up to three times, then cancelled for good (the
//! actions/scaleset README, "up to 3 times"; ARC#4602). Fields the service's C# serializer
//! leaves unset are sent as `null`, the harsher reading of the sources.

use std::{
    collections::{BTreeMap, VecDeque},
    sync::Arc,
    time::Duration,
};

use serde_json::{Value, json};

use crate::state::{State, unix_now_ms};

mod clock;
mod service;

pub(crate) use clock::ticker;

pub(crate) use service::{answer, endpoint, poll, registration_token};

/// Job messages in one queue message at most (the service caps a batch at 50).
pub const BATCH: usize = 50;

/// Assignments of one job at most before the service gives it up (the scaleset README).
pub const ASSIGNMENTS: u32 = 3;

/// How the service words its job messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum MessageShape {
    /// github.com since mid-2025: assigned directly, `runnerRequestId: 0`, a string `jobId`.
    #[default]
    Dotcom,
    /// A GHES: `JobAvailable` first, acquired by runner request id.
    Ghes,
}

/// Where the Actions service lives on the stand-in.
const SERVICE: &str = "_services/pipelines";

/// The scale-set side of the stand-in's world.
#[derive(Debug)]
pub struct ScaleSets {
    /// Scale sets by id.
    pub sets: BTreeMap<u64, ScaleSet>,
    /// Runner requests (one per job that reached a scale set) by id.
    pub requests: BTreeMap<u64, Request>,
    /// Job id -> its runner request's id.
    by_job: BTreeMap<u64, u64>,
    /// Admin tokens issued: token -> unix expiry.
    pub admin_tokens: BTreeMap<String, u64>,
    /// Registration tokens issued (one hour each, as GitHub's): token -> unix expiry.
    pub registration_tokens: BTreeMap<String, u64>,
    /// Lifetime of an admin token.
    pub admin_token_ttl: Duration,
    /// Lifetime of a message queue token.
    pub queue_token_ttl: Duration,
    /// How long a message poll waits for a message before answering 202.
    pub long_poll: Duration,
    /// A session nobody polled for this long lapses (its owner died), so another may open one.
    pub session_idle: Duration,
    /// `acquirejobs` answers 404 (a GHES without job acquisition).
    pub no_acquire: bool,
    /// Where the service says it lives, when not at the stand-in's own address (a test puts
    /// it behind a name only its proxy resolves; runners keep the stand-in's address).
    pub service_base: Option<String>,
    /// This many jobs assigned next (acquired, on a GHES) go without their `JobAssigned`
    /// message (as if another consumer had acknowledged it): the statistics count them, the
    /// queue does not.
    pub swallow_assigned: usize,
    /// Every `X-ScaleSetMaxCapacity` a poll sent: (scale set id, value).
    pub capacities: Vec<(u64, u64)>,
    /// How job messages are worded and whether jobs are offered before they are assigned.
    pub shape: MessageShape,
    /// Scale sets keep labels beyond their name (false: a GHES without
    /// `AllowRunnerScaleSetCustomLabels`, which drops them silently).
    pub custom_labels: bool,
    /// With `custom_labels` off, a create or an update still answers the labels asked for,
    /// while the scale set keeps the name alone: only reading it back shows what was kept. A
    /// user's report against github.com (issue 79 of this project); the actions/scaleset README
    /// says the service keeps them, so this plays the report, not the sources.
    pub answer_dropped_labels: bool,
    /// An assigned job no runner takes within its window is withdrawn and assigned again:
    /// the first assignment's window, the second's, the third's (the last one listed stands
    /// for those after it; empty: never withdrawn). The service's windows grow.
    pub assign_windows: Vec<Duration>,
    /// How long after a withdrawal the job is assigned again (offered again, on a GHES:
    /// `JobAvailable`, to be acquired once more).
    pub reassign_delay: Duration,
    /// A withdrawal names when the lapsed assignment was made in `runnerAssignTime` (the
    /// service assigned the job to a runner slot that nobody filled), instead of `null`: the
    /// harsher reading, since the sources do not say. Only the absence of a runner and of a
    /// `JobStarted` then tells a withdrawal from a job that ran.
    pub withdrawal_assign_time: bool,
    /// Since when (unix ms) the assignment clock stands ([`ScaleSets::pause_clock`]).
    clock_paused_since: Option<u128>,
    /// Sessions that lapsed or were evicted: a DELETE of one answers 400
    /// `RunnerScaleSetSessionExpiredException` (ARC#4285).
    expired_sessions: std::collections::BTreeSet<String>,
    /// Wakes the polls waiting for a message.
    pub notify: Arc<tokio::sync::Notify>,
    next_set_id: u64,
    next_request_id: u64,
}

impl Default for ScaleSets {
    fn default() -> Self {
        ScaleSets {
            sets: BTreeMap::new(),
            requests: BTreeMap::new(),
            by_job: BTreeMap::new(),
            admin_tokens: BTreeMap::new(),
            registration_tokens: BTreeMap::new(),
            admin_token_ttl: Duration::from_secs(3600),
            queue_token_ttl: Duration::from_secs(3600),
            long_poll: Duration::from_secs(50),
            session_idle: Duration::from_secs(120),
            no_acquire: false,
            service_base: None,
            swallow_assigned: 0,
            capacities: Vec::new(),
            shape: MessageShape::Dotcom,
            custom_labels: true,
            answer_dropped_labels: false,
            assign_windows: Vec::new(),
            reassign_delay: Duration::from_millis(500),
            withdrawal_assign_time: false,
            clock_paused_since: None,
            expired_sessions: Default::default(),
            notify: Arc::new(tokio::sync::Notify::new()),
            next_set_id: 1,
            next_request_id: 70_000,
        }
    }
}

/// One runner scale set.
#[derive(Debug, Clone)]
pub struct ScaleSet {
    /// Id.
    pub id: u64,
    /// Name (unique in its runner group).
    pub name: String,
    /// Runner group id.
    pub group_id: u64,
    /// Labels.
    pub labels: Vec<String>,
    /// The session, while one is open.
    pub session: Option<Session>,
    /// Messages not yet deleted, oldest first.
    pub queue: VecDeque<Message>,
    /// The next message id.
    pub next_message_id: u64,
    /// Every session opened on it, in order: (session id, owner).
    pub sessions_opened: Vec<(String, String)>,
    /// The `X-ScaleSetMaxCapacity` its last poll sent (`None`: never polled; no limit).
    pub capacity: Option<u64>,
}

/// A message session.
#[derive(Debug, Clone)]
pub struct Session {
    /// Id.
    pub id: String,
    /// Who opened it.
    pub owner: String,
    /// The message queue token.
    pub token: String,
    /// Its expiry (unix seconds).
    pub token_expires: u64,
    /// Unix milliseconds of its last poll (or its creation).
    pub last_seen_ms: u128,
}

/// A queue message: a batch of job messages.
#[derive(Debug, Clone)]
pub struct Message {
    /// Id (increasing per scale set).
    pub id: u64,
    /// The job messages.
    pub items: Vec<Value>,
    /// Handed to a poll at least once (nothing more is added to it then).
    pub sent: bool,
    /// A message of another type, with this raw body (a test's: the service may add types).
    pub other: Option<(String, String)>,
}

/// Where a runner request is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RequestState {
    /// Offered to the scale set, not acquired yet.
    Available,
    /// Acquired: assigned to the scale set, waiting for one of its runners.
    Assigned,
    /// Withdrawn (no runner took it in time): assigned again after a delay.
    Withdrawn,
    /// A runner of the scale set took it.
    Running,
    /// Completed.
    Done,
}

/// A runner request: one job offered to one scale set.
#[derive(Debug, Clone)]
pub struct Request {
    /// Runner request id.
    pub id: u64,
    /// The job.
    pub job_id: u64,
    /// The scale set.
    pub set_id: u64,
    /// Where it is.
    pub state: RequestState,
    /// When its current assignment began (unix ms).
    pub assigned_at_ms: u128,
    /// How many times it was withdrawn.
    pub withdrawals: u32,
    /// Each state it entered and when (unix ms), for a failing test to show.
    pub history: Vec<(u128, RequestState)>,
}

impl Request {
    /// Moves to `state` at `now`, keeping the history.
    pub fn enter(&mut self, state: RequestState, now: u128) {
        self.state = state;
        self.history.push((now, state));
    }
}

/// The Actions service's timings, settable by tests.
#[derive(Debug, Clone, Copy)]
pub struct ServiceTimings {
    /// How long a message poll waits before 202.
    pub long_poll: Duration,
    /// A session not polled for this long lapses.
    pub session_idle: Duration,
    /// Lifetime of a message queue token.
    pub queue_token_ttl: Duration,
    /// Lifetime of an admin token.
    pub admin_token_ttl: Duration,
}

impl ScaleSets {
    /// Sets the timings.
    pub fn set_timings(&mut self, t: ServiceTimings) {
        self.long_poll = t.long_poll;
        self.session_idle = t.session_idle;
        self.queue_token_ttl = t.queue_token_ttl;
        self.admin_token_ttl = t.admin_token_ttl;
    }

    /// Deletes a scale set server-side (as GitHub does with one unused for days).
    pub fn delete_set(&mut self, id: u64) {
        self.sets.remove(&id);
        self.requests.retain(|_, r| r.set_id != id);
        let requests = &self.requests;
        self.by_job.retain(|_, r| requests.contains_key(r));
        self.notify.notify_waiters();
    }

    /// Stops the assignment clock: no assigned job is withdrawn, none withdrawn assigned again,
    /// until [`ScaleSets::resume_clock`], and each window then has what it had left. A test
    /// pauses it over a whole-service outage: the service's real windows (minutes) outlast an
    /// outage of seconds, as its scaled-down ones would not.
    pub fn pause_clock(&mut self) {
        self.clock_paused_since.get_or_insert_with(unix_now_ms);
    }

    /// Starts the assignment clock again, every window moved on by the time it stood.
    pub fn resume_clock(&mut self) {
        let Some(since) = self.clock_paused_since.take() else {
            return;
        };
        let now = unix_now_ms();
        for r in self.requests.values_mut() {
            if matches!(r.state, RequestState::Assigned | RequestState::Withdrawn) {
                // What stood of this window: since the pause, or since it began in the pause.
                r.assigned_at_ms += now.saturating_sub(r.assigned_at_ms.max(since));
            }
        }
    }

    /// Drops a scale set's session (an eviction): its polls get 404 and its refresh too.
    pub fn evict_session(&mut self, id: u64) {
        if let Some(set) = self.sets.get_mut(&id)
            && let Some(old) = set.session.take()
        {
            self.expired_sessions.insert(old.id);
        }
        self.notify.notify_waiters();
    }

    /// Puts a message of another type at the tail of a scale set's queue (one the service may
    /// add some day), with `body` as it is.
    pub fn inject_other(&mut self, set_id: u64, kind: &str, body: &str) {
        let Some(set) = self.sets.get_mut(&set_id) else {
            return;
        };
        let id = set.next_message_id;
        set.next_message_id += 1;
        set.queue.push_back(Message {
            id,
            items: Vec::new(),
            sent: false,
            other: Some((kind.to_string(), body.to_string())),
        });
        self.notify.notify_waiters();
    }

    /// Jobs assigned, running or between assignments in scale set `set_id`: what its capacity
    /// holds.
    fn held(&self, set_id: u64) -> u64 {
        self.requests
            .values()
            .filter(|r| r.set_id == set_id && r.state != RequestState::Done)
            .count() as u64
    }

    /// Whether scale set `set_id` has room for one more job under its capacity.
    fn has_room(&self, set_id: u64) -> bool {
        let capacity = self
            .sets
            .get(&set_id)
            .and_then(|s| s.capacity)
            .unwrap_or(u64::MAX);
        self.held(set_id) < capacity
    }

    /// Puts a raw job message on a scale set's queue (a test's hostile or stale message).
    pub fn inject(&mut self, set_id: u64, item: Value) {
        self.push(set_id, item);
    }

    /// The request of a job, if the job reached a scale set.
    pub fn request_of(&self, job_id: u64) -> Option<&Request> {
        self.requests.get(self.by_job.get(&job_id)?)
    }

    fn statistics(&self, set_id: u64, runners: &BTreeMap<u64, crate::state::Runner>) -> Value {
        let count = |f: &dyn Fn(RequestState) -> bool| {
            self.requests
                .values()
                .filter(|r| r.set_id == set_id && f(r.state))
                .count()
        };
        let assigned = count(&|s| matches!(s, RequestState::Assigned | RequestState::Running));
        let registered = runners
            .values()
            .filter(|r| r.scale_set == Some(set_id))
            .count();
        let busy = runners
            .values()
            .filter(|r| r.scale_set == Some(set_id) && r.busy)
            .count();
        json!({
            "totalAvailableJobs": count(&|s| s == RequestState::Available),
            "totalAcquiredJobs": assigned,
            "totalAssignedJobs": assigned,
            "totalRunningJobs": count(&|s| s == RequestState::Running),
            "totalRegisteredRunners": registered,
            "totalBusyRunners": busy,
            "totalIdleRunners": registered - busy,
        })
    }

    /// Appends a job message to the scale set's open message (one not yet sent, under 50
    /// items) or a new one, and wakes the polls.
    fn push(&mut self, set_id: u64, item: Value) {
        let Some(set) = self.sets.get_mut(&set_id) else {
            return;
        };
        match set.queue.back_mut() {
            Some(m) if !m.sent && m.other.is_none() && m.items.len() < BATCH => m.items.push(item),
            _ => {
                let id = set.next_message_id;
                set.next_message_id += 1;
                set.queue.push_back(Message {
                    id,
                    items: vec![item],
                    sent: false,
                    other: None,
                });
            }
        }
        self.notify.notify_waiters();
    }
}

/// The base of every URL the service hands out.
fn service_base(s: &State) -> &str {
    s.scalesets.service_base.as_deref().unwrap_or(&s.base_url)
}

/// A job message's common fields (`JobMessageBase` in `types.go`), with `null` where the
/// service has nothing (a runner not named yet, no result yet). On github.com the runner
/// request id is 0 and the job is named by `jobId` only.
fn job_message(
    shape: MessageShape,
    kind: &str,
    request: &Request,
    job: &crate::state::Job,
    owner: &str,
) -> Value {
    let iso = |ms: u128| {
        humantime::format_rfc3339_millis(std::time::UNIX_EPOCH + Duration::from_millis(ms as u64))
            .to_string()
    };
    let request_id = match shape {
        MessageShape::Dotcom => 0,
        MessageShape::Ghes => request.id,
    };
    json!({
        "messageType": kind,
        "runnerRequestId": request_id,
        "runnerId": null,
        "runnerName": null,
        "result": null,
        "repositoryName": job.repo,
        "ownerName": owner,
        "jobId": format!("{:08x}-0000-4000-8000-{:012x}", job.run_id, job.id),
        "jobWorkflowRef": format!("{owner}/{}/.github/workflows/ci.yml@refs/heads/main", job.repo),
        "jobDisplayName": format!("job {}", job.id),
        "workflowRunId": job.run_id,
        "eventName": "push",
        "requestLabels": job.labels,
        "queueTime": iso(job.queued_at_ms),
        "scaleSetAssignTime": iso(request.assigned_at_ms.max(job.queued_at_ms)),
        "runnerAssignTime": job.picked_at_ms.map(iso),
        "finishTime": (job.status == "completed").then(|| iso(unix_now_ms())),
    })
}

/// Gives a queued job to the most specific scale set that covers it (its labels, or its
/// name) and has room under its capacity: assigned at once (github.com) or offered as a
/// `JobAvailable` (GHES). A job no scale set covers, or none with room, waits.
fn offer(s: &mut State, job_id: u64) {
    let Some(job) = s.jobs.get(&job_id).cloned() else {
        return;
    };
    if job.status != "queued" || s.scalesets.by_job.contains_key(&job_id) {
        return;
    }
    let wanted: Vec<String> = job.labels.iter().map(|l| l.to_ascii_lowercase()).collect();
    let ss = &s.scalesets;
    // The fewest labels beyond the job's, among the scale sets with room.
    let pick = ss
        .sets
        .values()
        .filter(|set| {
            let offered: Vec<String> = set
                .labels
                .iter()
                .chain(std::iter::once(&set.name))
                .map(|l| l.to_ascii_lowercase())
                .collect();
            wanted.iter().all(|l| offered.contains(l))
        })
        .filter(|set| ss.has_room(set.id))
        .min_by_key(|set| (set.labels.len(), set.id))
        .map(|set| set.id);
    let Some(set_id) = pick else { return };
    let owner = s.owner.clone();
    let base = service_base(s).to_string();
    let ss = &mut s.scalesets;
    let id = ss.next_request_id;
    ss.next_request_id += 1;
    let shape = ss.shape;
    let mut request = Request {
        id,
        job_id,
        set_id,
        state: RequestState::Available,
        assigned_at_ms: unix_now_ms(),
        withdrawals: 0,
        history: vec![(unix_now_ms(), RequestState::Available)],
    };
    let item = match shape {
        MessageShape::Dotcom => {
            request.enter(RequestState::Assigned, unix_now_ms());
            job_message(shape, "JobAssigned", &request, &job, &owner)
        }
        MessageShape::Ghes => {
            let mut item = job_message(shape, "JobAvailable", &request, &job, &owner);
            item["acquireJobUrl"] = json!(format!(
                "{base}/{SERVICE}/_apis/runtime/runnerscalesets/{set_id}/acquirejobs"
            ));
            item
        }
    };
    ss.requests.insert(id, request);
    ss.by_job.insert(job_id, id);
    if shape == MessageShape::Dotcom && ss.swallow_assigned > 0 {
        ss.swallow_assigned -= 1;
        return;
    }
    ss.push(set_id, item);
}

/// Gives the queued jobs that wait (no scale set had room) to scale sets with room now,
/// oldest first.
pub(crate) fn offer_waiting(s: &mut State) {
    let mut waiting: Vec<(u128, u64)> = s
        .jobs
        .values()
        .filter(|j| j.status == "queued" && !s.scalesets.by_job.contains_key(&j.id))
        .map(|j| (j.queued_at_ms, j.id))
        .collect();
    waiting.sort_unstable();
    for (_, job_id) in waiting {
        offer(s, job_id);
    }
}

/// What a job's state change means for the scale sets: called for every `queued`,
/// `in_progress` and `completed` of a job, webhook or not.
pub(crate) fn on_job_event(s: &mut State, action: &str, job_id: u64) {
    let Some(job) = s.jobs.get(&job_id).cloned() else {
        return;
    };
    let owner = s.owner.clone();
    match action {
        "queued" => offer(s, job_id),
        "in_progress" | "completed" => {
            let Some(request) = s.scalesets.request_of(job_id).cloned() else {
                return;
            };
            if request.state == RequestState::Done {
                return;
            }
            let runner_id = job.runner_id.unwrap_or(0);
            let runner_name = job.runner_name.clone().unwrap_or_default();
            let shape = s.scalesets.shape;
            let mut item = if action == "in_progress" {
                job_message(shape, "JobStarted", &request, &job, &owner)
            } else {
                let mut m = job_message(shape, "JobCompleted", &request, &job, &owner);
                // The service spells a cancellation `canceled`.
                let result = match job.conclusion.as_deref() {
                    Some("cancelled") | None => "canceled",
                    Some(other) => other,
                };
                m["result"] = json!(result);
                m
            };
            // A job that ended before any runner took it names none: `null` (the Go types
            // read a string there, but the service writes C#'s `null` for what it never set;
            // the harsher reading of the sources).
            if runner_id != 0 {
                item["runnerId"] = json!(runner_id);
                item["runnerName"] = json!(runner_name);
            }
            let state = if action == "in_progress" {
                RequestState::Running
            } else {
                RequestState::Done
            };
            if let Some(r) = s.scalesets.requests.get_mut(&request.id) {
                r.enter(state, unix_now_ms());
            }
            // A request still only available when its job ends was never acquired: the
            // service just drops it.
            if request.state != RequestState::Available {
                s.scalesets.push(request.set_id, item);
            }
            if action == "completed" {
                offer_waiting(s);
            }
        }
        _ => {}
    }
}

/// Whether a runner may take a job: a scale set's runner only the jobs assigned to its scale
/// set; any other runner no job that went to a scale set.
pub(crate) fn may_take(s: &State, runner_set: Option<u64>, job_id: u64) -> bool {
    match (runner_set, s.scalesets.request_of(job_id)) {
        (Some(set), Some(r)) => r.set_id == set && r.state == RequestState::Assigned,
        (Some(_), None) => false,
        (None, Some(_)) => false,
        (None, None) => true,
    }
}
