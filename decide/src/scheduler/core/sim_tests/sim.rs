//! The simulated world the core runs in: GitHub's jobs and registrations, the durable store,
//! virtual time, faults, and the daemon's events in order.

use crate::{
    github::{GithubError, JitRunner},
    job::{JobAction, JobInfo},
    provision::{ExitReason, RunnerEventKind},
};
mod github;

use std::{
    cmp::Reverse,
    collections::{BTreeMap, BinaryHeap, HashMap},
    time::Duration,
};

use proptest::prelude::*;
use rand::{SeedableRng, rngs::SmallRng};

use crate::scheduler::core::*;
use crate::{
    config::{ClaimRetryConfig, Secret},
    durable::{JobRow, RetryRow, Snapshot},
    github::error::HttpFailure,
    scheduler::fixtures::job,
};

const UNIX0: u64 = 1_800_000_000;
const SETS: [&[&str]; 2] = [&["self-hosted", "linux", "x64"], &["self-hosted", "linux"]];
const RECONCILE: u64 = 20_000;
const GRACE: u64 = 600_000;

/// How GitHub picks the job an idle runner gets.
#[derive(Debug, Clone, Copy)]
pub(super) enum Policy {
    OldestFirst,
    NewestFirst,
    Random,
}

/// One run's knobs.
#[derive(Debug, Clone)]
pub(super) struct Plan {
    pub(super) seed: u64,
    pub(super) policy: Policy,
    pub(super) jobs: usize,
    pub(super) slots: usize,
    /// Milliseconds between two queued jobs.
    pub(super) gap: u64,
    pub(super) claim_faults: f64,
    pub(super) crashes: f64,
    pub(super) lost_queued: f64,
    pub(super) duplicates: f64,
    pub(super) failed_deletes: f64,
    pub(super) restarts: usize,
}

#[derive(Debug, Clone)]
enum Ev {
    Queue(u64),
    Deliver(JobAction, JobInfo),
    ClaimAnswer(u32, JobKey, PoolName, Result<JitRunner, GithubError>),
    Boot(String),
    Crash(String),
    JobDone(String),
    Exit(String, Option<i32>, ExitReason),
    Timer(u32, u64),
    IdleAnswer(u32, String, Result<bool, GithubError>, &'static str),
    Deleted(u32, Effect, Result<(), GithubError>),
    Looked(u32, JobKey, Result<String, GithubError>),
    Sweep,
    Prune,
    Reconcile,
    Restart,
}

#[derive(Debug, Clone, PartialEq)]
enum Proc {
    Booting,
    Idle,
    Running(u64),
    Dead,
}

#[derive(Debug, Clone)]
struct GhJob {
    labels: &'static [&'static str],
    status: &'static str,
    runner: Option<String>,
}

#[derive(Debug, Clone)]
struct Reg {
    name: String,
    busy: Option<u64>,
}

pub(super) struct Sim {
    plan: Plan,
    rng: SmallRng,
    t: u64,
    t0: Instant,
    seq: u64,
    queue: BinaryHeap<Reverse<(u64, u64, usize)>>,
    events: Vec<Option<Ev>>,
    core: Scheduler,
    /// Bumped on a restart: answers to the old incarnation's calls are dropped.
    epoch: u32,
    timer_armed: Option<u64>,
    quiet_after: u64,
    gh_jobs: BTreeMap<u64, GhJob>,
    regs: BTreeMap<u64, Reg>,
    /// Runners that ran a job (GitHub removed them): a deletion of one is waste.
    ran: HashMap<String, u64>,
    procs: HashMap<String, (u64, Proc)>,
    next_reg: u64,
    store: Store,
    /// Since when each queued job has been held outside an active phase, or unknown.
    idle_since: HashMap<u64, u64>,
    surplus_since: Option<u64>,
    violations: Vec<String>,
    needless_deletes: usize,
    pub(super) claims: usize,
}

#[derive(Default)]
struct Store {
    jobs: BTreeMap<JobKey, JobRow>,
    runners: BTreeMap<String, RunnerRow>,
    retries: BTreeMap<JobKey, RetryRow>,
}

impl Store {
    fn apply(&mut self, ops: Vec<Op>) {
        for op in ops {
            match op {
                Op::AddJob(row) => {
                    self.jobs.entry(row.info.key.clone()).or_insert(row);
                }
                Op::JobStarted(key, at) => {
                    let row = self.jobs.entry(key.clone()).or_insert_with(|| JobRow {
                        info: JobInfo {
                            key,
                            ..JobInfo::default()
                        },
                        received_unix: at,
                        started_unix: None,
                    });
                    row.started_unix.get_or_insert(at);
                }
                Op::DeleteJob(key) => {
                    self.jobs.remove(&key);
                }
                Op::PutRunner(row) => {
                    self.runners.insert(row.name.clone(), row);
                }
                Op::DeleteRunner(name) => {
                    self.runners.remove(&name);
                }
                Op::PutRetry(row) => {
                    self.retries.insert(row.job.key.clone(), row);
                }
                Op::DeleteRetry(key) => {
                    self.retries.remove(&key);
                }
                Op::PutMark(..) | Op::Unregistered(_) | Op::PutUsage(_) | Op::PruneUsage(_) => {}
            }
        }
    }

    fn snapshot(&self) -> Snapshot {
        Snapshot {
            jobs: self.jobs.values().cloned().collect(),
            runners: self.runners.values().cloned().collect(),
            retries: self.retries.values().cloned().collect(),
            ..Snapshot::default()
        }
    }
}

/// The core tests' settings with one pool of `slots`, unpaced claims, a 10-minute grace and
/// a reconcile pass every 20 s.
fn settings(slots: usize) -> SchedulerSettings {
    let mut s = crate::scheduler::core::tests::settings();
    s.providers[0].max_concurrent = slots;
    s.max_concurrent = slots;
    s.name_prefix = "sim".into();
    s.targets = vec![TargetSpec {
        claims_per_minute: 6000,
        ..TargetSpec::new("acme")
    }];
    s.orphan_grace = Some(Duration::from_millis(GRACE));
    s.reconcile_interval = Some(Duration::from_millis(RECONCILE));
    s
}

fn new_core(slots: usize, seed: u64) -> Scheduler {
    let backoff = Backoff::try_new(&ClaimRetryConfig {
        schedule: vec![
            Duration::from_secs(1),
            Duration::from_secs(2),
            Duration::from_secs(3),
        ],
        max_age: Duration::from_secs(4 * 3600),
        ..ClaimRetryConfig::default()
    })
    .unwrap();
    Scheduler::new(settings(slots), backoff, seed)
}

fn http(status: u16, endpoint: &'static str) -> GithubError {
    GithubError::Http(HttpFailure {
        endpoint,
        status,
        message: "stand-in fault".into(),
        documentation_url: None,
        rate_remaining: None,
        rate_bucket: None,
        rate_reset: None,
        retry_after: None,
    })
}

impl Sim {
    pub(super) fn new(plan: Plan) -> Sim {
        let mut core = new_core(plan.slots, plan.seed);
        let t0 = Instant::now();
        let now = Now::whole_seconds(t0, UNIX0);
        core.on_provider_status(PoolName::from("local"), true, None, now);
        let mut sim = Sim {
            rng: SmallRng::seed_from_u64(plan.seed),
            quiet_after: plan.jobs as u64 * plan.gap + 60_000,
            plan,
            t: 0,
            t0,
            seq: 0,
            queue: BinaryHeap::new(),
            events: Vec::new(),
            core,
            epoch: 0,
            timer_armed: None,
            gh_jobs: BTreeMap::new(),
            regs: BTreeMap::new(),
            ran: HashMap::new(),
            procs: HashMap::new(),
            next_reg: 1,
            store: Store::default(),
            idle_since: HashMap::new(),
            surplus_since: None,
            violations: Vec::new(),
            needless_deletes: 0,
            claims: 0,
        };
        for i in 0..sim.plan.jobs as u64 {
            sim.at(i * sim.plan.gap, Ev::Queue(1000 + i));
        }
        for k in 0..sim.plan.restarts as u64 {
            let t = sim
                .rng
                .random_range(1..=sim.plan.jobs as u64 * sim.plan.gap + 1);
            sim.at(t + k, Ev::Restart);
        }
        sim.at(RECONCILE, Ev::Reconcile);
        sim.at(30_000, Ev::Sweep);
        sim.at(60_000, Ev::Prune);
        sim
    }

    fn now(&self) -> Now {
        Now::whole_seconds(
            self.t0 + Duration::from_millis(self.t),
            UNIX0 + self.t / 1000,
        )
    }

    /// An instant as virtual milliseconds, rounded up (a timer never fires early).
    fn ms(&self, at: Instant) -> u64 {
        at.saturating_duration_since(self.t0)
            .as_nanos()
            .div_ceil(1_000_000) as u64
    }

    fn at(&mut self, t: u64, ev: Ev) {
        self.seq += 1;
        self.events.push(Some(ev));
        self.queue
            .push(Reverse((t.max(self.t), self.seq, self.events.len() - 1)));
    }

    fn after(&mut self, ms: u64, ev: Ev) {
        self.at(self.t + ms, ev);
    }

    fn faulty(&mut self, share: f64) -> bool {
        self.t < self.quiet_after && share > 0.0 && self.rng.random_bool(share.min(1.0))
    }

    fn jitter(&mut self, lo: u64, hi: u64) -> u64 {
        self.rng.random_range(lo..hi)
    }

    /// Sends a delivery about `id` as it is now (late, duplicated, lost, as the plan says).
    fn deliver(&mut self, action: JobAction, id: u64) {
        let j = &self.gh_jobs[&id];
        let info = JobInfo {
            runner_name: j.runner.clone(),
            runner_id: j.runner.as_ref().and_then(|n| {
                self.regs
                    .iter()
                    .find(|(_, r)| &r.name == n)
                    .map(|(i, _)| *i)
            }),
            conclusion: (action == JobAction::Completed).then(|| "success".into()),
            ..job(id, j.labels)
        };
        let lose = self.plan.lost_queued;
        if action == JobAction::Queued && self.faulty(lose) {
            return;
        }
        let late = self.jitter(1, 400);
        self.after(late, Ev::Deliver(action, info.clone()));
        let dup = self.plan.duplicates;
        if self.faulty(dup) {
            let later = self.jitter(1, 3000);
            self.after(later, Ev::Deliver(action, info));
        }
    }

    pub(super) fn run(&mut self) {
        let end = self.quiet_after + 40 * 60_000;
        let mut steps = 0u64;
        while let Some(Reverse((t, _, i))) = self.queue.pop() {
            if t > end {
                break;
            }
            steps += 1;
            if steps > 2_000_000 {
                let kinds: Vec<String> = self
                    .events
                    .iter()
                    .rev()
                    .take(10)
                    .map(|e| format!("{e:?}"))
                    .collect();
                self.violations.push(format!(
                    "t={t}: runaway events, the last: {kinds:?}; ladder {:?}",
                    self.core.view().retry_queue(self.now())
                ));
                break;
            }
            self.t = t;
            let Some(ev) = self.events[i].take() else {
                continue;
            };
            self.step(ev);
            self.assign();
            self.check();
            if self.t > self.quiet_after
                && self.gh_jobs.values().all(|j| j.status == "completed")
                && self.regs.is_empty()
                && self.core.view().runner_count() == 0
                && self.procs.values().all(|(_, p)| *p == Proc::Dead)
            {
                break;
            }
        }
    }

    fn step(&mut self, ev: Ev) {
        let now = self.now();
        let e = self.epoch;
        let fx = match ev {
            Ev::Queue(id) => {
                let labels = SETS[self.rng.random_range(0..2)];
                self.gh_jobs.insert(
                    id,
                    GhJob {
                        labels,
                        status: "queued",
                        runner: None,
                    },
                );
                self.deliver(JobAction::Queued, id);
                return;
            }
            Ev::Deliver(action, info) => {
                if action == JobAction::Queued {
                    // The intake makes a covered queued job durable before its 202.
                    self.store.apply(vec![Op::AddJob(JobRow {
                        info: info.clone(),
                        received_unix: now.unix,
                        started_unix: None,
                    })]);
                }
                self.core
                    .on_job_event(action, info, Some("d"), now.mono, now)
            }
            Ev::ClaimAnswer(ep, key, pool, result) if ep == e => {
                self.core.on_claim_result(key, pool, result, now)
            }
            Ev::Boot(name) => {
                if let Some((_, p @ Proc::Booting)) = self.procs.get_mut(&name) {
                    *p = Proc::Idle;
                    self.core
                        .on_runner_event(&name, RunnerEventKind::Started { warm: false }, now)
                } else {
                    return;
                }
            }
            Ev::Crash(name) => {
                if let Some((_, p @ Proc::Booting)) = self.procs.get_mut(&name) {
                    *p = Proc::Dead;
                    self.after(5, Ev::Exit(name, Some(1), ExitReason::Exited));
                }
                return;
            }
            Ev::JobDone(name) => {
                let Some((reg, Proc::Running(id))) = self.procs.get(&name).cloned() else {
                    return;
                };
                self.gh_jobs.get_mut(&id).unwrap().status = "completed";
                self.regs.remove(&reg);
                self.ran.insert(name.clone(), reg);
                self.procs.get_mut(&name).unwrap().1 = Proc::Dead;
                self.deliver(JobAction::Completed, id);
                let exit = self.jitter(1, 300);
                self.after(exit, Ev::Exit(name, Some(0), ExitReason::Exited));
                return;
            }
            Ev::Exit(name, code, reason) => {
                // A provisioner reports to whichever incarnation runs now.
                let kind = RunnerEventKind::Exited {
                    code,
                    reason,
                    detail: None,
                };
                self.core.on_runner_event(&name, kind, now)
            }
            Ev::Timer(ep, at) if ep == e && self.timer_armed == Some(at) => {
                self.timer_armed = None;
                self.core.on_timer(now)
            }
            Ev::IdleAnswer(ep, name, busy, reason) if ep == e => {
                self.core.on_idle_checked(&name, busy, reason, now)
            }
            Ev::Deleted(ep, effect, result) if ep == e => {
                let Effect::DeleteRunner(deletion) = effect else {
                    unreachable!()
                };
                self.core.on_runner_deleted(deletion, result, now)
            }
            Ev::Looked(ep, key, status) if ep == e => self.core.on_job_looked(&key, status, now),
            Ev::Sweep => {
                self.after(30_000, Ev::Sweep);
                self.core.sweep(now)
            }
            Ev::Prune => {
                self.after(60_000, Ev::Prune);
                self.core.prune(now);
                Vec::new()
            }
            Ev::Reconcile => {
                self.after(RECONCILE, Ev::Reconcile);
                let queued: Vec<JobInfo> = self
                    .gh_jobs
                    .iter()
                    .filter(|(_, j)| j.status == "queued")
                    .map(|(id, j)| job(*id, j.labels))
                    .collect();
                self.core.on_reconcile(0, queued, now)
            }
            Ev::Restart => return self.restart(),
            _ => return,
        };
        self.carry_out(fx);
    }

    /// `kill -9` and a start on the same store: the provisioners adopt live runners and report
    /// gone ones; registrations no ledger names are deleted unless busy.
    fn restart(&mut self) {
        let now = self.now();
        self.epoch += 1;
        self.timer_armed = None;
        self.core = new_core(self.plan.slots, self.plan.seed ^ u64::from(self.epoch));
        self.core
            .on_provider_status(PoolName::from("local"), true, None, now);
        let (redo, fx) = self.core.restore(&self.store.snapshot(), now);
        self.carry_out(fx);
        let ledger: Vec<String> = self.store.runners.keys().cloned().collect();
        for name in ledger {
            let alive = self.procs.get(&name).is_some_and(|(_, p)| *p != Proc::Dead);
            if !alive {
                self.after(1, Ev::Exit(name, None, ExitReason::Lost));
            }
        }
        let unledgered: Vec<u64> = self
            .regs
            .iter()
            .filter(|(_, r)| r.busy.is_none() && !self.store.runners.contains_key(&r.name))
            .map(|(id, _)| *id)
            .collect();
        for id in unledgered {
            self.regs.remove(&id);
        }
        for info in redo {
            let fx = self
                .core
                .on_job_event(JobAction::Queued, info, None, now.mono, now);
            self.carry_out(fx);
        }
    }
}
