//! The stand-in's world: runners, workflow runs and jobs, the rate budget, scripted faults, and
//! the record of every call. Pure data behind one mutex; the HTTP layer only reads and writes it.

use std::{
    collections::{BTreeMap, VecDeque},
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use serde::Serialize;

/// Unix milliseconds now.
pub fn unix_now_ms() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis())
        .unwrap_or(0)
}

/// Unix seconds now.
pub fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// One recorded API call.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Call {
    /// Endpoint name, as the daemon's client labels it (`generate_jitconfig`, ...).
    pub endpoint: String,
    /// HTTP method.
    pub method: String,
    /// Path and query.
    pub path: String,
    /// Status answered (0 when the connection was dropped).
    pub status: u16,
    /// Unix milliseconds when it arrived.
    pub at_ms: u128,
    /// `X-GitHub-Api-Version` as sent.
    pub api_version: Option<String>,
    /// `Accept` as sent.
    pub accept: Option<String>,
    /// Whether an `Authorization: Bearer` header was sent.
    pub bearer: bool,
}

/// A registered runner.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Runner {
    /// Runner id.
    pub id: u64,
    /// Runner name.
    pub name: String,
    /// Labels it registered with.
    pub labels: Vec<String>,
    /// Repo for repo-level runners.
    pub repo: Option<String>,
    /// `online` once its process connected, else `offline`.
    pub status: String,
    /// Running a job.
    pub busy: bool,
    /// The job it took, if any.
    pub job_id: Option<u64>,
    /// The token in its JIT config.
    pub token: String,
    /// The runner group it registered in.
    pub group_id: u64,
    /// An enterprise runner (registered under `/enterprises/{slug}`).
    pub enterprise: bool,
    /// Unix milliseconds of its first `acquire` (its process came up).
    #[serde(skip)]
    pub connected_at_ms: Option<u128>,
    /// The scale set it was made for (`generatejitconfig` of a scale set), if any.
    pub scale_set: Option<u64>,
}

/// A job.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Job {
    /// Job id.
    pub id: u64,
    /// Run id.
    pub run_id: u64,
    /// Repo name.
    pub repo: String,
    /// `runs-on` labels.
    pub labels: Vec<String>,
    /// `queued`, `in_progress`, `completed`.
    pub status: String,
    /// Set when completed.
    pub conclusion: Option<String>,
    /// The runner that took it.
    pub runner_name: Option<String>,
    /// That runner's id.
    pub runner_id: Option<u64>,
    /// Unix milliseconds when it was queued.
    pub queued_at_ms: u128,
    /// Unix milliseconds when a runner took it.
    pub picked_at_ms: Option<u128>,
    /// Unix milliseconds when the runner that took it first asked for a job (its process up
    /// and connected): from there to `picked_at_ms` is the runner's own wait.
    pub runner_up_at_ms: Option<u128>,
    /// The job's name, workflow, branch and trigger as its deliveries say them (the defaults
    /// `job-ID`, `ci`, `main`, `octocat` where unset).
    pub about: Option<std::sync::Arc<ephemer_actors_core::job::JobAbout>>,
    /// Unix milliseconds until which the runner that took it holds its lock (renewed while it
    /// runs); past it, the service fails the job.
    pub locked_until_ms: Option<u128>,
    /// Failed by the service because its runner stopped renewing the lock: GitHub's "The
    /// self-hosted runner: NAME lost communication with the server" (a runner process killed,
    /// or cut off, mid-job).
    pub abandoned: bool,
}

impl Job {
    /// Its `created_at` and `started_at` in whole unix seconds, as GitHub reports them.
    pub fn github_times(&self) -> (Option<u64>, Option<u64>) {
        let secs = |ms: u128| u64::try_from(ms / 1000).ok();
        (secs(self.queued_at_ms), self.picked_at_ms.and_then(secs))
    }
}

/// A scripted fault for the next calls of an endpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fault {
    /// Answer this status with this message (and optional `Retry-After`), with or without rate headers.
    Status {
        /// HTTP status.
        status: u16,
        /// `message` of the JSON body.
        message: String,
        /// `Retry-After` seconds.
        retry_after: Option<u64>,
        /// Whether the answer carries `X-RateLimit-*` headers.
        rate_headers: bool,
    },
    /// Close the connection without a complete answer.
    Drop,
}

impl Fault {
    /// A bare `status` with its reason phrase as the message, with or without rate headers.
    pub fn http(status: u16, rate_headers: bool) -> Fault {
        Fault::Status {
            status,
            message: crate::routes::reason(status).to_string(),
            retry_after: None,
            rate_headers,
        }
    }
}

/// The rate budget of the one credential the stand-in serves.
#[derive(Debug, Clone)]
pub struct Budget {
    /// Requests per window.
    pub limit: u64,
    /// Left in this window.
    pub remaining: u64,
    /// Unix seconds the window resets.
    pub reset: u64,
    /// Window length.
    pub window: Duration,
}

impl Budget {
    /// Rolls the window over once its reset has passed.
    pub fn roll(&mut self, now: u64) {
        if now >= self.reset {
            self.remaining = self.limit;
            self.reset = now + self.window.as_secs();
        }
    }
}

/// The rate-limit bucket an endpoint spends, as GitHub names it in `X-RateLimit-Resource`:
/// registering a self-hosted runner (a JIT config, a registration token) spends
/// `actions_runner_registration`, everything else `core` (GitHub docs, "Rate limits for the
/// REST API" and `GET /rate_limit`'s `resources`).
pub fn bucket_of(endpoint: &str) -> &'static str {
    match endpoint {
        "generate_jitconfig" | "registration_token" => "actions_runner_registration",
        _ => "core",
    }
}

impl State {
    /// The budget of a bucket.
    pub fn budget_mut(&mut self, bucket: &str) -> &mut Budget {
        if bucket == "actions_runner_registration" {
            &mut self.registration
        } else {
            &mut self.budget
        }
    }
}

/// How stand-in runners behave when they take a job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunnerBehavior {
    /// How long a job "runs".
    pub job_ms: u64,
    /// The next this many runners crash at boot (exit 3) without taking a job.
    pub crash_next: usize,
    /// Runners hang on their job until killed.
    pub hang: bool,
    /// Runners get no job while this is set (they keep asking).
    pub hold: bool,
    /// A runner gets no job for this long after it first asks, as the real runner spends its
    /// first seconds starting its listener and opening its session before GitHub assigns it
    /// anything (0: at once).
    pub boot_ms: u64,
    /// Runners older than this are refused as GitHub refuses them since 2026 ("Runner
    /// version vX is deprecated and cannot receive messages"; actions/runner's listener then
    /// exits 7 when `ACTIONS_RUNNER_RETURN_VERSION_DEPRECATED_EXIT_CODE` is set).
    pub deprecated_below: Option<String>,
}

impl Default for RunnerBehavior {
    fn default() -> Self {
        RunnerBehavior {
            job_ms: 200,
            crash_next: 0,
            hang: false,
            hold: false,
            boot_ms: 0,
            deprecated_below: None,
        }
    }
}

/// Where the stand-in sends `workflow_job` webhooks.
#[derive(Debug, Clone)]
pub struct WebhookTarget {
    /// The daemon's webhook URL.
    pub url: String,
    /// The shared secret.
    pub secret: String,
    /// Send `application/x-www-form-urlencoded` (`payload=<JSON>`) instead of JSON: a hook's
    /// content type may be either, and the REST API creates hooks with `form` by default
    /// (GitHub docs, "Creating webhooks": content type; "Validating webhook deliveries": the
    /// signature is the HMAC of the raw body, whatever its type).
    pub form: bool,
    /// A fleet behind one org (a hook per host, or a balancer): when not empty, each delivery
    /// goes to one of these URLs at random instead of `url`, and a share of them to every one
    /// (each copy with its own delivery id, as separate hooks send).
    pub fleet: Vec<String>,
    /// That share, 0.0 to 1.0.
    pub duplicate_share: f64,
}

/// Scripted misbehaviour of webhook deliveries.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DeliveryFaults {
    /// Send every delivery this many extra times, each with a fresh delivery id.
    pub extra_copies: usize,
    /// Send the same delivery id again this many extra times (GitHub's redelivery).
    pub replays: usize,
    /// Drop the `queued` delivery of the next this many queued jobs.
    pub drop_next_queued: usize,
    /// Hold each `in_progress` back until after the job's `completed`.
    pub swap_in_progress_and_completed: bool,
    /// Send this share of deliveries (0.0 to 1.0, drawn with the fault seed) once more, with a
    /// fresh delivery id, as a second hook for the same events does.
    pub duplicate_share: f64,
    /// With each of the next this many `queued` deliveries, replay an earlier `queued`
    /// delivery (same guid, same bytes, drawn with the fault seed), as GitHub's redelivery
    /// of an old attempt does.
    pub replay_old_queued: usize,
}

/// One webhook the stand-in sent: an attempt, as a hook's delivery log lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Delivery {
    /// `X-GitHub-Delivery`: the guid, kept by its redeliveries.
    pub id: String,
    /// `workflow_job` action.
    pub action: String,
    /// The job.
    pub job_id: u64,
    /// HTTP status the daemon answered (0: no answer).
    pub status: u16,
    /// This attempt's id in the hook's delivery log (what a redelivery names).
    pub seq: u64,
    /// True for an attempt made on request (`POST .../deliveries/{id}/attempts`).
    pub redelivery: bool,
    /// Unix seconds of the attempt.
    pub at_unix: u64,
    /// The hook's URL it was logged under (the public URL, behind a proxy).
    pub url: String,
    /// Where it was actually posted.
    #[serde(skip)]
    pub posted_to: String,
    /// What was posted, to post it again byte for byte: (content type, signature, body).
    #[serde(skip)]
    pub sent: (String, String, String),
}

impl Delivery {
    /// What GitHub's delivery log says of it: `"OK"` for a 2xx answer, else why it failed.
    pub fn status_text(&self) -> String {
        match self.status {
            200..=299 => "OK".into(),
            0 => "failed to connect to host".into(),
            code => format!("Invalid HTTP Response: {code}"),
        }
    }
}

/// Something for the webhook sender.
#[derive(Debug, Clone)]
pub enum Outgoing {
    /// A new delivery: (action, job id, body).
    New(String, u64, String),
    /// Attempt `seq` again, same guid, same bytes, on request.
    Again(u64),
}

/// Everything the stand-in knows.
#[derive(Debug)]
pub struct State {
    /// `actions/runner` releases (github.com's releases API).
    pub releases: crate::releases::Releases,
    /// A classic PAT's scopes (`None`: a token that says none, as fine-grained ones and Apps).
    pub token_scopes: Option<Vec<String>>,
    /// Webhooks of the org and its repos.
    pub hooks: Vec<crate::org::Hook>,
    /// How runners behave.
    pub behavior: RunnerBehavior,
    /// Where webhooks go (none: no webhooks).
    pub webhook: Option<WebhookTarget>,
    /// Delivery misbehaviour.
    pub faults_webhook: DeliveryFaults,
    /// Every delivery sent, with the answer.
    pub deliveries: Vec<Delivery>,
    /// Runner processes that connected: name -> pid.
    pub runner_pids: BTreeMap<String, u32>,
    /// `in_progress` deliveries held back until `completed` (see `DeliveryFaults`).
    pub held: BTreeMap<u64, String>,
    /// Queue of webhook bodies to send: (action, job id, body).
    pub outbox: Option<tokio::sync::mpsc::UnboundedSender<Outgoing>>,
    /// The URL GitHub's hook names, when the daemon sits behind a proxy that forwards it to
    /// the webhook target (deliveries are logged under it).
    pub public_url: Option<String>,
    /// The enterprise the org belongs to (its slug), when it has one.
    pub enterprise: Option<String>,
    /// Every registration made: (runner name, runner group id), in order.
    pub registrations: Vec<(String, u64)>,
    /// The org's runner groups: (id, name); `1` is "Default", as in every org.
    pub runner_groups: Vec<(u64, String)>,
    /// The GitHub App's own webhook URL (`/app/hook`), when it has one.
    pub app_hook: Option<String>,
    /// The org/user that owns the repos.
    pub owner: String,
    /// The repos.
    pub repos: Vec<String>,
    /// Repos that are archived (listed as such; no workflow runs in them).
    pub archived: Vec<String>,
    /// Calls under `/repos/<owner>/<repo>/...` answered with this status, this many more times.
    pub repo_faults: BTreeMap<String, (u16, usize)>,
    /// Accepted PAT.
    pub token: String,
    /// Installation tokens issued: token -> unix expiry.
    pub installation_tokens: BTreeMap<String, u64>,
    /// Lifetime of an issued installation token.
    pub installation_token_ttl: Duration,
    /// How long a job's lock holds without a renewal from its runner.
    pub job_lock: Duration,
    /// Registered runners by id.
    pub runners: BTreeMap<u64, Runner>,
    /// Jobs by id.
    pub jobs: BTreeMap<u64, Job>,
    /// Rate budget of the `core` bucket.
    pub budget: Budget,
    /// Rate budget of the `actions_runner_registration` bucket.
    pub registration: Budget,
    /// Faults per endpoint, consumed in order.
    pub faults: BTreeMap<String, VecDeque<Fault>>,
    /// The next JIT runner is registered (and answered) under this name, not the one asked.
    pub rename_next_runner: Option<String>,
    /// Faults per endpoint played at random once the scripted ones are used up: each
    /// `(share, fault)` answers that share of the calls.
    pub fault_shares: BTreeMap<String, Vec<(f64, Fault)>>,
    /// The draws of `fault_shares` and of the random delivery faults (seeded, so a run can be
    /// played again).
    pub rng: rand::rngs::SmallRng,
    /// Every call.
    pub calls: Vec<Call>,
    /// Next ids.
    pub next_runner_id: u64,
    /// Every runner token and encoded JIT config handed out, for tests that look for them
    /// where they must not be.
    pub secrets_issued: Vec<String>,
    /// Next job/run id.
    pub next_job_id: u64,
    /// `ServerUrl` written into JIT configs.
    pub base_url: String,
    /// Where runners reach the stand-in, when not at `base_url` (a VM's guest reaches the
    /// host's loopback at QEMU's gateway): the `.runner` file's `ServerUrl`, which the real
    /// listener connects to (actions/runner, `RunnerSettings.ServerUrl` in
    /// `src/Runner.Common/ConfigurationStore.cs`).
    pub runner_url: Option<String>,
    /// The Actions service's scale sets, sessions and message queues.
    pub scalesets: crate::scaleset::ScaleSets,
}

impl State {
    /// Counts calls to `endpoint` (all statuses).
    pub fn count(&self, endpoint: &str) -> usize {
        self.calls.iter().filter(|c| c.endpoint == endpoint).count()
    }

    /// The next fault scripted for `endpoint`, if any, else one of its random faults drawn.
    pub fn take_fault(&mut self, endpoint: &str) -> Option<Fault> {
        if let Some(queue) = self.faults.get_mut(endpoint) {
            let fault = queue.pop_front();
            if queue.is_empty() {
                self.faults.remove(endpoint);
            }
            return fault;
        }
        use rand::RngExt as _;
        let shares = self.fault_shares.get(endpoint)?;
        let draw: f64 = self.rng.random();
        let mut upto = 0.0;
        shares.iter().find_map(|(share, fault)| {
            upto += share;
            (draw < upto).then(|| fault.clone())
        })
    }

    /// Whether `bearer` is the PAT or a live installation token.
    pub fn authorized(&self, bearer: &str, now: u64) -> bool {
        (!self.token.is_empty() && bearer == self.token)
            || self
                .installation_tokens
                .get(bearer)
                .is_some_and(|exp| *exp > now)
    }

    /// Queues a `workflow_job` webhook about `job` (if a target is set), applying the faults.
    pub fn emit(&mut self, action: &str, job_id: u64) {
        crate::scaleset::on_job_event(self, action, job_id);
        let Some(job) = self.jobs.get(&job_id).cloned() else {
            return;
        };
        if self.webhook.is_none() {
            return;
        }
        if action == "queued" && self.faults_webhook.drop_next_queued > 0 {
            self.faults_webhook.drop_next_queued -= 1;
            return;
        }
        if action == "queued" && self.faults_webhook.replay_old_queued > 0 {
            use rand::seq::IndexedRandom as _;
            let earlier: Vec<u64> = self
                .deliveries
                .iter()
                .filter(|d| d.action == "queued" && !d.redelivery)
                .map(|d| d.seq)
                .collect();
            if let Some(seq) = earlier.choose(&mut self.rng).copied() {
                self.faults_webhook.replay_old_queued -= 1;
                if let Some(outbox) = &self.outbox {
                    let _ = outbox.send(Outgoing::Again(seq));
                }
            }
        }
        let runner_id = job
            .runner_name
            .as_ref()
            .and_then(|n| self.runners.values().find(|r| &r.name == n).map(|r| r.id))
            .or(job.runner_id);
        let info = ephemer_actors_core::job::JobInfo {
            key: ephemer_actors_core::job::JobKey::new(&self.owner, job.id),
            repo: job.repo.as_str().into(),
            run_id: job.run_id,
            run_attempt: 1,
            labels: job.labels.clone().into(),
            runner_name: job.runner_name.clone(),
            runner_id,
            conclusion: job.conclusion.as_deref().map(Into::into),
            installation_id: None,
            github_wait_secs: None,
            github_created_unix: None,
            withdrawn: false,
            about: job.about.clone(),
        };
        let (created, started) = job.github_times();
        let body = ephemer_actors_core::github::event::render_workflow_job_at(
            action, &info, created, started,
        );
        if action == "in_progress" && self.faults_webhook.swap_in_progress_and_completed {
            self.held.insert(job_id, body);
            return;
        }
        self.post(action, job_id, body);
        if action == "completed"
            && let Some(held) = self.held.remove(&job_id)
        {
            self.post("in_progress", job_id, held);
        }
    }

    /// Hands a rendered delivery to the webhook sender.
    pub fn post(&self, action: &str, job_id: u64, body: String) {
        if let Some(outbox) = &self.outbox {
            let _ = outbox.send(Outgoing::New(action.to_string(), job_id, body));
        }
    }

    /// The status of a run, derived from its jobs like GitHub's.
    /// Every run of `repo` with its status, in one pass over the jobs (a run per job would
    /// make a listing quadratic in the jobs the stand-in has seen).
    pub fn runs_of(&self, repo: &str) -> Vec<(u64, &'static str)> {
        let mut runs: std::collections::BTreeMap<u64, Vec<&Job>> = Default::default();
        for job in self.jobs.values().filter(|j| j.repo == repo) {
            runs.entry(job.run_id).or_default().push(job);
        }
        runs.into_iter()
            .map(|(id, jobs)| (id, run_status_of(jobs.into_iter())))
            .collect()
    }
}

/// A run's status from its jobs': completed when all are, queued when all are, else in
/// progress.
fn run_status_of<'a>(jobs: impl Iterator<Item = &'a Job>) -> &'static str {
    let (mut all_done, mut all_queued) = (true, true);
    for j in jobs {
        all_done &= j.status == "completed";
        all_queued &= j.status == "queued";
    }
    if all_done {
        "completed"
    } else if all_queued {
        "queued"
    } else {
        "in_progress"
    }
}
