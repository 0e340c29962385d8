//! `Scheduler`: every scheduling decision, as a plain struct. No actix, no I/O, no clock: each
//! method takes the time ([`Now`]) and returns the [`Effect`]s the actor shell must carry out.
//!
//! It owns the job table (dedup: pending / running / seen, observed `started`), the runner
//! ledger, the slot counts, claim pacing, and cordon. Decisions follow the original's order for
//! a queued job: dedup gate (running, pending, seen) before the label check; a job no provider
//! covers is remembered as seen (so a re-delivery costs nothing) and never made pending; cordon
//! before the zombie count; route and claim only when a slot and a claim token are free.
//!
//! It also owns the claim retry ladder (each failed job's item, and every delay, decided with
//! the rate reading it is pushed). It holds no metrics and writes no logs: what operators count
//! or read leaves as [`Observation`]s, durable changes as store [`Op`]s, and everything to do
//! as plain-data [`Effect`]s; the actor shell carries all three out.

use crate::config::PoolName;
use std::{collections::HashMap, sync::Arc, time::Duration};

use crate::clock::Instant;
use serde::Serialize;

use crate::{
    clock::Now,
    durable::{Op, RunnerRow},
    job::JobKey,
    provision::RunnerSpec,
    rate::RateBook,
    retry::Backoff,
};
#[cfg(test)]
use crate::{github::ErrorClass, job::JobInfo};
use observation::Observation;

mod admission;
mod capacity;
mod dispatch;
mod fleet;
#[cfg(test)]
mod fleet_tests;
pub mod hour;
mod intake;
mod job_table;
mod ladder;
mod ledger;
pub mod observation;
mod pacing;
mod parking;
pub mod refusal;
mod restore;
mod runner_book;
mod settings;
mod setup;
mod shared;
mod sizes;
mod supply;
mod sweep;
pub mod timeline;
#[cfg(any(test, feature = "fixtures"))]
pub mod timeline_words;
pub mod trace;
mod usage;
mod view;
mod warm;

use admission::Admission;
use capacity::SlotTable;
use job_table::JobTable;
pub use job_table::{JobRecord, Refused, edge};
use ladder::Ladder;
pub use pacing::ClaimPacer;
use runner_book::RunnerBook;
pub use runner_book::RunnerRecord;
pub use settings::{ProviderSpec, SchedulerSettings, TargetSpec};
pub use setup::Setup;
pub use sizes::Census;
pub use supply::PoolDemand;
pub use timeline::{Abandon, DeliveryId, Note, TimelineEntry};
pub use view::{
    Capacity, JobDetail, JobView, JobsView, ProviderView, RetryQueueView, SchedulerState,
    StatusView, TargetView,
};
pub use warm::{REAP_WARM_AGE, REAP_WARM_SURPLUS};

/// A job is remembered as seen this long; a re-delivery inside it is a duplicate.
pub const SEEN_TTL: Duration = Duration::from_secs(10 * 60);
/// How long an observed start is remembered when there is no job timeout.
pub const STARTED_TTL_NO_TIMEOUT: Duration = Duration::from_secs(6 * 3600);
/// Idle reaps after which a job is parked: runners made for it sat idle until the orphan sweep
/// reaped them this many times, so GitHub lists it queued but never assigns it (a superseded
/// run, say). Only this counts: a runner that ran a sibling's job, or crashed, does not.
pub const ZOMBIE_CAP: u32 = 5;
/// How long a parked job waits before it is looked at again (its state asked of GitHub; a
/// reconcile pass that lists it queued after this time, or a new delivery, admits it too).
pub const PARK_LOOK: Duration = Duration::from_secs(30 * 60);
/// Runners of one job that may exit cleanly with no job seen before the next such exit is
/// taken for an environment that failed (its ladder climbs): a JIT runner exits 0 after its
/// one job, so a clean exit is a job ran whose event is late, unless it keeps happening.
pub const QUIET_EXITS_FREE: u8 = 2;

/// How long a job whose runner GitHub refused as too old waits before it is claimed again
/// (the pool's managed install fetches the newest release meanwhile), doubling with each
/// refusal of its runners up to [`OUTDATED_WAIT_MAX`]: never a failure on its ladder, and no
/// tight loop of registrations while an operator updates an install by hand.
pub const OUTDATED_WAIT: Duration = Duration::from_secs(15);
/// The longest [`OUTDATED_WAIT`] grows to.
pub const OUTDATED_WAIT_MAX: Duration = Duration::from_secs(600);
/// How long a runner that exited by itself may wait for its job's `in_progress` before it is
/// taken for one that never ran a job (and deleted on GitHub).
pub const DELETE_DELAY: Duration = Duration::from_secs(10);
/// Deletions of one registration tried before it is left to the next start's cleanup.
pub const DELETE_ATTEMPTS: u32 = 8;
/// The wait after a registration's first failed deletion (doubling after each).
const DELETE_RETRY_FIRST: Duration = Duration::from_secs(5);
/// The longest wait between two deletions of one registration.
const MAX_WAIT_DELETE: Duration = Duration::from_secs(300);

pub use crate::vocab::runner_prefix;

/// A generate-jitconfig call, as plain data.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimRequest {
    /// The job's repo, for repo-level runners; `None` claims at the org.
    pub repo: Option<String>,
    /// Runner name without its random part (`<prefix>-<provider>-<install id>`).
    pub name_base: String,
    /// Labels the runner registers with.
    pub labels: Vec<String>,
}

/// What the actor shell must do after a decision. Plain data: the shell builds the messages.
#[derive(Debug, Clone, PartialEq)]
pub enum Effect {
    /// Call generate-jitconfig; report back with `on_claim_result`.
    Claim {
        /// The job.
        key: JobKey,
        /// The provider the runner is for.
        provider: PoolName,
        /// The call.
        request: ClaimRequest,
    },
    /// Hand a claimed runner to its provisioner.
    Provision {
        /// Which provisioner.
        provider: PoolName,
        /// The runner.
        spec: RunnerSpec,
    },
    /// Ask a provisioner to stop a runner.
    Teardown {
        /// Which provisioner.
        provider: PoolName,
        /// Runner name.
        name: String,
        /// Why.
        reason: &'static str,
    },
    /// Delete a runner registration on GitHub (it never ran a job, so it will not go by itself);
    /// report the answer with `on_runner_deleted`.
    DeleteRunner(Deletion),
    /// Ask GitHub for a parked job's state; report it with `on_job_looked`.
    LookAtJob {
        /// The job.
        key: JobKey,
        /// Its repo.
        repo: String,
    },
    /// Arm the one timer for the earliest due time of everything timed (a ladder item, a
    /// deferred decision, the claim pacing's next token; `None`: nothing waits); when it
    /// fires, call `on_timer`.
    ArmTimer {
        /// Due time.
        at: Option<Instant>,
    },
    /// Delete a runner's registration on GitHub before reaping it, unless it is busy (its
    /// `in_progress` may be late; GitHub refuses to delete a runner that runs a job); report
    /// back with `on_idle_checked` (`Ok(false)`: deleted, `Ok(true)`: busy).
    CheckIdle {
        /// The owner whose target registered it.
        owner: String,
        /// Runner name.
        name: String,
        /// Runner id.
        runner_id: u64,
        /// Repo for repo-level runners.
        repo: Option<String>,
        /// Why it would be reaped.
        reason: &'static str,
    },
}

/// One registration to delete, and how many deletions of it failed before.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Deletion {
    /// The owner whose target registered it.
    pub owner: String,
    /// Repo for repo-level runners.
    pub repo: Option<String>,
    /// Runner id.
    pub runner_id: u64,
    /// Runner name, for logs.
    pub name: String,
    /// Deletions of it that failed before this one.
    pub attempt: u32,
}

impl Deletion {
    /// The first deletion of `r`'s registration.
    pub(crate) fn of(r: &RunnerRow) -> Self {
        Deletion {
            owner: r.intent.owner.to_string(),
            repo: r.repo.clone(),
            runner_id: r.id,
            name: r.name.clone(),
            attempt: 0,
        }
    }
}

/// Where a job stands.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum Phase {
    /// Admitted before; nothing in flight (failed, abandoned, cordoned, zombie, torn down).
    Seen,
    /// No enabled provider's labels cover the job; remembered only to make re-deliveries free.
    Unroutable,
    /// Outside the configured owner, repos or installation: accepted and left alone.
    Ignored,
    /// Waiting for a slot or a claim token.
    Pending,
    /// generate-jitconfig in flight; a slot is held.
    Claiming {
        /// For this provider.
        provider: PoolName,
    },
    /// On the retry ladder; no slot held.
    Retrying,
    /// A runner was claimed for it and its environment is starting or running.
    Active {
        /// The provider.
        provider: PoolName,
        /// The runner created for the job (its name, shared with the ledger).
        runner: Arc<str>,
    },
    /// Observed in progress or completed (on any runner); nothing more to do.
    Done,
    /// Not running, and not claimed for now: looked at again at `look_unix` (GitHub asked
    /// whether it is still queued), or sooner when a delivery or a reconcile pass brings it.
    Parked {
        /// Why.
        reason: ParkReason,
        /// Unix seconds of the next look.
        look_unix: u64,
    },
}

/// Why a job is parked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ParkReason {
    /// Its runners sat idle until reaped `ZOMBIE_CAP` times: GitHub never assigns it.
    Zombie,
    /// Its claims kept failing past `max_age`.
    GaveUp,
    /// Its last failure cannot be helped by retrying right away (a claim GitHub refused).
    NotRetryable,
}

impl ParkReason {
    /// The reason's name (the `reason` label, and `jobs`).
    pub fn as_str(self) -> &'static str {
        match self {
            ParkReason::Zombie => "zombie",
            ParkReason::GaveUp => "gave_up",
            ParkReason::NotRetryable => "not_retryable",
        }
    }
}

impl Phase {
    /// The state's name, as its `state` tag on the wire.
    pub fn name(&self) -> &'static str {
        match self {
            Phase::Seen => "seen",
            Phase::Unroutable => "unroutable",
            Phase::Ignored => "ignored",
            Phase::Pending => "pending",
            Phase::Claiming { .. } => "claiming",
            Phase::Retrying => "retrying",
            Phase::Active { .. } => "active",
            Phase::Done => "done",
            Phase::Parked { .. } => "parked",
        }
    }
}

/// The scheduler: what it was configured with, and what it holds now. Its methods are the
/// shell's entry points (an event, a timer, a call's answer: each returns the effects) and
/// [`Scheduler::view`]; the mechanics they run are `State`'s, each reading the [`Setup`].
#[derive(Debug)]
pub struct Scheduler {
    setup: Setup,
    state: State,
}

/// What the scheduler holds now: its owned parts, and what crosses them (cordon, the one
/// timer, and what waits for the shell).
#[derive(Debug)]
struct State {
    /// The job table: every job's record, changed only through its transitions.
    jobs: JobTable,
    /// The pending queue, shared strings, jobs held idle.
    admission: Admission,
    /// Slots, pacing, claims in flight.
    capacity: SlotTable,
    /// Runners of ours, runners just gone, deferred decisions.
    book: RunnerBook,
    /// The claim retry ladder: the one owner of every failed job's retry state.
    ladder: Ladder,
    /// Fleet mode: jobs whose claim is in flight here that another host was heard to hold
    /// (the host): a claim still waiting for its offer delay does not ask the ledger.
    held_notices: HashMap<JobKey, String>,
    /// Fleet mode: claims waiting out their offer delay, each due at its instant.
    offers: Vec<fleet::Offer>,
    /// Scale-set mode: jobs a look was wanted for, answered `queued` at the next timer.
    unanswerable: Vec<(Instant, JobKey)>,
    draining: bool,
    /// The shutdown drain has begun: the cordon can no longer be lifted.
    shutting_down: bool,
    stats: Stats,
    /// When the claim pacing next has a token for a job that waits for one.
    pace_wake: Option<Instant>,
    /// When the sweep runs again: to retry a busy check GitHub failed to answer, or to look at
    /// the job of a runner idle for it (`sweep::UNBOUND_LOOK_AFTER`).
    sweep_wake: Option<Instant>,
    /// The due time the timer was last handed.
    timer: Option<Instant>,
    /// What operators count or read, waiting for the shell.
    observed: Vec<Observation>,
    /// State changes waiting to be made durable.
    ops: Vec<Op>,
    /// Registered warm runners: the counts and the claims.
    warm: warm::WarmBook,
    /// Unix seconds from which the usage rows older than their retention are forgotten again.
    next_usage_prune: u64,
    /// Finished jobs' traces, waiting for the shell's exporter (only when traces are on).
    traces: Vec<trace::JobTrace>,
    /// Jobs whose runners GitHub refused as too old, per pool, and the pools in an outage.
    refusals: refusal::Refusals,
}

/// A read-only look at the scheduler ([`Scheduler::view`]): every status page, count and
/// record the admin API and the tests read.
#[derive(Debug, Clone, Copy)]
pub struct View<'a> {
    setup: &'a Setup,
    state: &'a State,
}

/// A cordon cannot be lifted: the daemon is draining to shut down.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the daemon is draining to shut down; it cannot be uncordoned")]
pub struct ShuttingDown;

/// Counters for status views and tests.
#[derive(Debug, Clone, Copy, Default, Serialize, serde::Deserialize)]
pub struct Stats {
    /// Queued events received.
    pub queued_events: u64,
    /// Queued events dropped by the dedup gate.
    pub duplicates: u64,
    /// Claims sent.
    pub claims: u64,
    /// Claims that failed.
    pub claim_failures: u64,
    /// Runners that reported started.
    pub runners_started: u64,
    /// Dispatches abandoned because the job was observed running elsewhere.
    pub satisfied_elsewhere: u64,
}

impl Scheduler {
    /// A scheduler with no jobs, climbing `backoff` on failures; `seed` seeds the ladder's
    /// jitter (random from the shell, fixed in tests).
    pub fn new(settings: SchedulerSettings, backoff: Backoff, seed: u64) -> Self {
        let state = State {
            jobs: JobTable::default(),
            admission: Admission::new(settings.targets.len()),
            capacity: SlotTable::new(&settings),
            warm: warm::WarmBook::new(settings.providers.len()),
            book: RunnerBook::default(),
            ladder: Ladder::new(backoff, seed),
            held_notices: HashMap::new(),
            offers: Vec::new(),
            unanswerable: Vec::new(),
            draining: false,
            shutting_down: false,
            stats: Stats::default(),
            pace_wake: None,
            sweep_wake: None,
            timer: None,
            observed: Vec::new(),
            ops: Vec::new(),
            next_usage_prune: 0,
            traces: Vec::new(),
            refusals: Default::default(),
        };
        Scheduler {
            setup: Setup::new(settings),
            state,
        }
    }

    /// What the scheduler was configured with (targets, pools, the runner names it owns).
    pub fn setup(&self) -> &Setup {
        &self.setup
    }

    /// A read-only look at everything it holds.
    pub fn view(&self) -> View<'_> {
        View {
            setup: &self.setup,
            state: &self.state,
        }
    }

    /// The orphan sweep. Spares (unbound runners whose job no longer needs them) are first
    /// handed to jobs that wait for a runner (`rebalance`); the spares left are surplus and
    /// reaped at once. An unbound runner its own job still waits for, older than the grace,
    /// is an orphan: GitHub did not hand it that job (or any) while it sat idle, which is the
    /// one thing that counts toward the job's zombie cap. Each is deleted on GitHub first
    /// (`CheckIdle`), which GitHub refuses for a runner that runs a job.
    pub fn sweep(&mut self, now: Now) -> Vec<Effect> {
        self.state.sweep(&self.setup, now)
    }

    /// The ledger refused a claim this host started (its slot is given back): another host
    /// holds the job, GitHub already runs it, or the fleet's pacing says not yet (the job
    /// waits at the front of the queue and every claim pauses).
    pub fn on_acquire_refused(
        &mut self,
        key: JobKey,
        provider: PoolName,
        answer: crate::cluster::Acquire,
        now: Now,
    ) -> Vec<Effect> {
        self.state
            .on_acquire_refused(&self.setup, key, provider, answer, now)
    }

    /// GitHub's answer about a parked job: still queued, it is admitted again; started or
    /// completed, nothing is left to do; unknown to GitHub, it is done with. A failed look is
    /// tried again after `PARK_LOOK`.
    pub fn on_job_looked(
        &mut self,
        key: &JobKey,
        status: Result<String, crate::github::GithubError>,
        now: Now,
    ) -> Vec<Effect> {
        self.state.on_job_looked(&self.setup, key, status, now)
    }

    /// Reads rate-limit readings from `book`, target `t`'s under `credentials[t]` (targets
    /// that share a credential share its budget). Without it, a rate-limited claim climbs the
    /// plain ladder.
    pub fn read_rates(&mut self, book: RateBook, credentials: Vec<String>) {
        self.state.ladder.read_rates(book, credentials);
    }

    /// What was observed since the last call (the shell logs and counts it).
    pub fn take_observations(&mut self) -> Vec<Observation> {
        std::mem::take(&mut self.state.observed)
    }
}

impl State {
    /// Runner `name` as its notes share it (see [`RunnerBook::handle`]).
    fn runner_handle(&self, name: &str) -> Arc<str> {
        self.book.handle(name)
    }

    fn note(&mut self, key: &JobKey, now: Now, note: Note) {
        self.jobs.note(key, now, note);
    }

    /// Carries out a transition's answer: a job with no record is left alone (it was
    /// forgotten, or never known); a refused move changes nothing and is told (a bug: the
    /// property test in `job_table_tests.rs` drives the core so that none happens).
    fn moved(&mut self, key: &JobKey, answer: Result<(), Refused>) -> bool {
        match answer {
            Ok(()) => true,
            Err(Refused::Unknown) => false,
            Err(Refused::Edge { from, to }) => {
                self.observe(Observation::TransitionRefused {
                    job_id: key.job_id,
                    from,
                    to,
                });
                false
            }
        }
    }

    fn observe(&mut self, o: Observation) {
        self.observed.push(o);
    }

    fn release(&mut self, setup: &Setup, provider: &PoolName) {
        let i = setup.provider_index(provider);
        self.capacity.free(i);
    }
}

/// GitHub's conclusions, so the metric label stays bounded.
fn bounded_conclusion(c: &str) -> &'static str {
    match c {
        "success" => "success",
        "failure" => "failure",
        "cancelled" => "cancelled",
        "skipped" => "skipped",
        "timed_out" => "timed_out",
        "neutral" => "neutral",
        "action_required" => "action_required",
        _ => "unknown",
    }
}

#[cfg(test)]
mod driver;
#[cfg(test)]
mod fungible_tests;
#[cfg(test)]
mod ladder_tests;
#[cfg(test)]
mod parking_tests;
#[cfg(test)]
mod refusal_tests;
#[cfg(test)]
mod sim_tests;
#[cfg(test)]
mod targets_tests;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod warm_tests;
