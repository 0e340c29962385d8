//! What the scheduler decides with: the slice of config it reads ([`SchedulerSettings`]), each
//! GitHub target ([`TargetSpec`]) and each enabled pool ([`ProviderSpec`]).

use std::time::Duration;

use super::runner_prefix;
use crate::config::{PoolName, ProviderKind};

/// The slice of config the scheduler decides with.
#[derive(Debug, Clone)]
pub struct SchedulerSettings {
    /// Enabled providers, in tie-break order.
    pub providers: Vec<ProviderSpec>,
    /// `runner.max_concurrent`.
    pub max_concurrent: usize,
    /// `runner.name_prefix`.
    pub name_prefix: String,
    /// This install's id (`store::install_id` (in the actors crate)); empty where there is none (tests).
    pub install_id: String,
    /// The GitHub targets (at least one): whose jobs are ours, where their runners register,
    /// their claim pacing and their share of scarce slots.
    pub targets: Vec<TargetSpec>,
    /// `runner.claim_retry.enabled`.
    pub retry_enabled: bool,
    /// Seen TTL.
    pub seen_ttl: Duration,
    /// How long an observed start is remembered.
    pub started_ttl: Duration,
    /// `state.retention`: how long a finished job's record is kept after its start (for the
    /// page, `jobs`, and to know its late events).
    pub retention: Duration,
    /// `state.usage_retention`: how long a finished job's usage row is kept.
    pub usage_retention: Duration,
    /// Zombie cap.
    pub zombie_cap: u32,
    /// How long a runner's job may stay unobserved after the runner exits before the job is
    /// dispatched again: zero when job events are pushed; in pull mode, two polls (the job's
    /// `in_progress` may simply not have been polled yet).
    pub heal_grace: Duration,
    /// `runner.orphan_sweep`: `None` when disabled, else the grace.
    pub orphan_grace: Option<Duration>,
    /// `webhook.reconcile_interval`: `None` when disabled.
    pub reconcile_interval: Option<Duration>,
    /// Fleet mode: a claim waits out its offer delay (`State::offer_delay`) before the
    /// ledger is asked, so the host that received the delivery, then the one that fits the
    /// job best, asks first.
    pub fleet: bool,
    /// Scale-set mode: a job is a runner request the REST API does not know, so a look at it
    /// is answered `queued` by the core itself (`State::ask_where`).
    pub scaleset: bool,
    /// `telemetry.otlp_endpoint` is set: each finished job's trace is built
    /// ([`Scheduler::take_traces`](super::Scheduler::take_traces)).
    pub traces: bool,
}

impl SchedulerSettings {
    /// What the names of this install's runners of `provider` start with (a random part
    /// follows): `<name_prefix>-<provider>-<install_id>`.
    pub fn runner_prefix(&self, provider: &PoolName) -> String {
        runner_prefix(&self.name_prefix, provider, &self.install_id)
    }
}

/// One GitHub target, as the scheduler sees it.
#[derive(Debug, Clone)]
pub struct TargetSpec {
    /// Its name (`github.targets[].name`, else the owner).
    pub name: String,
    /// Its owner: the jobs of this owner are its jobs.
    pub owner: String,
    /// Repo-level runners in these repos (jobs of other repos are ignored); empty: org-level.
    pub repos: Vec<String>,
    /// The App installation (with App auth): jobs delivered for another are ignored.
    pub installation_id: Option<u64>,
    /// Claims (generate-jitconfig calls) allowed per minute with its credential.
    pub claims_per_minute: u32,
    /// Its share of scarce slots.
    pub weight: u32,
}

impl TargetSpec {
    /// A target of `owner`, org-level, token auth, default pacing, weight 1.
    pub fn new(owner: &str) -> Self {
        TargetSpec {
            name: owner.to_string(),
            owner: owner.to_string(),
            repos: Vec::new(),
            installation_id: None,
            claims_per_minute: crate::config::defaults::MAX_CLAIMS_PER_MINUTE,
            weight: 1,
        }
    }

    /// Repo-level runners: claim in the job's repo.
    pub fn repo_level(&self) -> bool {
        !self.repos.is_empty()
    }

    /// Where its runners are registered: each of its repos, else `[None]` (the org, or the
    /// enterprise).
    pub fn scopes(&self) -> Vec<Option<String>> {
        if self.repos.is_empty() {
            vec![None]
        } else {
            self.repos.iter().cloned().map(Some).collect()
        }
    }
}

/// One enabled provider, as routing sees it.
#[derive(Debug, Clone)]
pub struct ProviderSpec {
    /// The pool (`[providers.NAME]`).
    pub name: PoolName,
    /// Which provisioner serves it.
    pub kind: ProviderKind,
    /// Labels its runners register with (as configured).
    pub labels: Vec<String>,
    /// Its slot count.
    pub max_concurrent: usize,
    /// The targets (indices into `SchedulerSettings::targets`) whose jobs it takes; `None`:
    /// every target's.
    pub targets: Option<Vec<usize>>,
    /// `warm_mode = "registered"`: its warm count and max age (`None`: it keeps no
    /// registered runners; booted warm environments are its supervisor's).
    pub warm: Option<crate::config::WarmConfig>,
    /// A VM pool's accelerator (`kvm`, `tcg`), shown with the pool.
    pub accel: Option<String>,
}
