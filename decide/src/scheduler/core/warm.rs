//! Registered warm runners (`warm_mode = "registered"`): JIT runners claimed ahead of any job
//! and left idle, so GitHub hands a queued job to one at once.
//!
//! Such a runner is made "for" a warm intent ([`crate::job::Intent::Warm`]), not a job, so it is
//! a spare from its claim on: the fungibility accounting already counts it as supply, and a
//! job that arrives is handed one (`rebalance`) before any claim is made for it. This module
//! keeps their number per pool:
//!
//! - the pool's spares (warm runners, and runners whose own job ran elsewhere, which are the
//!   same thing to GitHub) younger than `warm_max_age` are kept from the sweep, newest first,
//!   up to the pool's warm count (its window's, at the minute);
//! - an older one is rotated: its registration is deleted (`CheckIdle`) and, until GitHub
//!   answered, it still counts, so the old registration goes before a new one is made;
//! - the rest are surplus and reaped the same way (a window closed; a cordon or a drain,
//!   under which the count is 0, so a drain leaves no registration behind);
//! - the count is topped up by claims of their own, within the pool's and the host's slots
//!   and the target's claim pacing, never while a job waits for a claim, while cordoned or
//!   draining, or while the pool is down; a failed warm claim holds the pool's for a while.

use super::{Setup, State};
use std::{sync::Arc, time::Duration};

use crate::clock::Instant;

use super::{
    ClaimRequest, Effect, ProviderSpec, job_table::JobTable, observation::Observation,
    runner_book::RunnerBook,
};
use crate::{
    clock::Now,
    config::PoolName,
    github::{GithubError, JitRunner},
    job::{Intent, JobKey},
    provision::WarmView,
};

/// Why a warm runner is reaped: older than `warm_max_age`.
pub const REAP_WARM_AGE: &str = "warm runner older than warm_max_age: rotated";
/// Why a warm runner is reaped: more than the pool keeps now.
pub const REAP_WARM_SURPLUS: &str = "warm runner beyond the pool's warm count";
/// How long a pool's warm claims wait after the first failure in a row (a claim refused, a
/// warm runner dead before any job); each further failure doubles it, up to
/// [`WARM_CLAIM_BACKOFF_MAX`]; a job taken by one of the pool's runners resets it. (A job's
/// claims climb their own ladder.)
pub const WARM_CLAIM_BACKOFF: Duration = Duration::from_secs(5);
/// The longest wait between warm claims that keep failing.
pub const WARM_CLAIM_BACKOFF_MAX: Duration = Duration::from_secs(300);

/// The registered pools' counts and claims.
#[derive(Debug)]
pub(super) struct WarmBook {
    /// Per pool (settings order): how many to keep, as of `minute`.
    targets: Vec<usize>,
    /// The unix minute `targets` were read at.
    minute: Option<u64>,
    /// The next warm intent's id, past every one in the runner book.
    next: u64,
    /// Warm claims in flight: intent, pool index.
    claiming: Vec<(JobKey, usize)>,
    /// Per pool: no warm claim before this (after a failed one).
    hold_until: Vec<Option<Instant>>,
    /// Per pool: failures in a row (claims refused, warm runners dead before any job).
    failures: Vec<u32>,
}

impl WarmBook {
    /// Entries held: warm claims in flight.
    pub(super) fn census(&self, out: &mut super::Census) {
        out.push(("scheduler.warm_claiming", self.claiming.len()));
    }

    /// Reads each registered pool's count for the minute of `now` (windows are in minutes),
    /// once a minute.
    fn read_targets(&mut self, providers: &[ProviderSpec], now: Now) {
        let minute = now.unix / 60;
        if self.minute == Some(minute) {
            return;
        }
        self.minute = Some(minute);
        self.targets = providers
            .iter()
            .map(|p| {
                p.warm
                    .as_ref()
                    .map_or(0, |w| w.target_at(w.week_time(now.unix)))
            })
            .collect();
    }

    /// How many pool `i` keeps now: its count, 0 while cordoned or draining.
    fn target(&self, i: usize, draining: bool) -> usize {
        if draining {
            return 0;
        }
        self.targets.get(i).copied().unwrap_or(0)
    }

    /// Holds pool `i`'s warm claims after a failure at `now`: 5 s, doubling with each failure
    /// in a row up to 5 min, and never less than GitHub's `retry_after`.
    fn hold(&mut self, i: usize, retry_after: Option<Duration>, now: Instant) {
        let failures = self.failures[i];
        self.failures[i] = failures.saturating_add(1);
        let wait = crate::retry::Doubling::new(WARM_CLAIM_BACKOFF, WARM_CLAIM_BACKOFF_MAX)
            .after(failures.saturating_add(1), 0.0)
            .max(retry_after.unwrap_or_default());
        self.hold_until[i] = Some(now + wait);
    }

    /// The book of `pools` pools, none held back.
    pub(super) fn new(pools: usize) -> Self {
        WarmBook {
            targets: vec![0; pools],
            minute: None,
            next: 0,
            claiming: Vec::new(),
            hold_until: vec![None; pools],
            failures: vec![0; pools],
        }
    }
}

/// One registered pool's spares now: a plan the keeping carries out.
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct Spares {
    /// Kept warm, newest first.
    pub(super) kept: Vec<Arc<str>>,
    /// Older than `warm_max_age`.
    pub(super) old: Vec<Arc<str>>,
    /// Beyond the count.
    pub(super) surplus: Vec<Arc<str>>,
    /// Of `kept`, those whose environment is up.
    pub(super) up: usize,
    /// When the oldest of `kept` grows older than `warm_max_age`.
    pub(super) rotate_at: Option<Instant>,
}

/// Pool `pool`'s spares in `book` sorted: up to `target` of those younger than `max_age`
/// kept, newest first; the older ones rotated; the rest surplus.
pub(super) fn spares(
    pool: &PoolName,
    max_age: Duration,
    target: usize,
    book: &RunnerBook,
    jobs: &JobTable,
    now: Instant,
) -> Spares {
    let mut fresh: Vec<(Instant, Arc<str>, bool)> = Vec::new();
    let mut old = Vec::new();
    for (name, r) in book.entries() {
        if r.provider != *pool || !jobs.is_spare(r) {
            continue;
        }
        if now.saturating_duration_since(r.created_at()) >= max_age {
            old.push(name.clone());
        } else {
            fresh.push((r.created_at(), name.clone(), r.started_at().is_some()));
        }
    }
    fresh.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.cmp(&b.1)));
    let keep = target.min(fresh.len());
    let surplus = fresh.split_off(keep);
    old.sort();
    Spares {
        up: fresh.iter().filter(|(_, _, up)| *up).count(),
        rotate_at: fresh
            .iter()
            .map(|(created, _, _)| *created)
            .min()
            .and_then(|t| t.checked_add(max_age)),
        kept: fresh.into_iter().map(|(_, n, _)| n).collect(),
        old,
        surplus: surplus.into_iter().map(|(_, n, _)| n).collect(),
    }
}

impl State {
    /// Keeps every registered pool at its count: rotates and reaps, then claims. Returns
    /// when the claim pacing or a held pool next allows a claim, if one is wanted.
    pub(super) fn keep_warm(
        &mut self,
        setup: &Setup,
        now: Now,
        fx: &mut Vec<Effect>,
    ) -> Option<Instant> {
        if !setup.any_registered_warm() {
            return None;
        }
        self.warm.read_targets(&setup.settings.providers, now);
        let mut wake: Option<Instant> = None;
        for i in 0..setup.settings.providers.len() {
            if setup.settings.providers[i].warm.is_none() {
                continue;
            }
            let spec = &setup.settings.providers[i];
            let max_age = spec.warm.as_ref().map_or(Duration::MAX, |w| w.max_age);
            let target = self.warm.target(i, self.draining);
            let spares = spares(
                &spec.name, max_age, target, &self.book, &self.jobs, now.mono,
            );
            for name in &spares.old {
                self.ask_idle(name, REAP_WARM_AGE, now, fx);
            }
            for name in &spares.surplus {
                self.ask_idle(name, REAP_WARM_SURPLUS, now, fx);
            }
            // The oldest is rotated on time, not at the next sweep.
            if let Some(at) = spares.rotate_at {
                wake = Some(wake.map_or(at, |w| w.min(at)));
            }
            let claiming = self.warm.claiming.iter().filter(|(_, p)| *p == i).count();
            self.show_warm(
                setup,
                i,
                WarmView {
                    available: spares.up,
                    booting: spares.kept.len() - spares.up + claiming,
                    target,
                },
            );
            // An old registration still counts until it is deleted: the new one comes after.
            let have = spares.kept.len() + spares.old.len() + claiming;
            if have >= target || !self.admission.pending().is_empty() || !self.capacity.slot(i).up {
                continue;
            }
            if let Some(until) = self.warm.hold_until[i].filter(|t| *t > now.mono) {
                wake = Some(wake.map_or(until, |w| w.min(until)));
                continue;
            }
            for _ in have..target {
                let max = setup.settings.providers[i].max_concurrent;
                if self.capacity.host_full() || self.capacity.slot(i).used >= max {
                    break;
                }
                let t = self.warm_target_of(setup, i);
                if !self.capacity.pacer_mut(t).try_take(now.mono) {
                    let at = self.capacity.pacer_mut(t).next_slot_at(now.mono);
                    wake = Some(wake.map_or(at, |w| w.min(at)));
                    break;
                }
                self.start_warm_claim(setup, i, t, fx);
            }
        }
        wake
    }

    /// The target a warm runner of pool `i` registers with: of the targets the pool serves,
    /// the one holding the fewest of its warm runners.
    fn warm_target_of(&self, setup: &Setup, i: usize) -> usize {
        let spec = &setup.settings.providers[i];
        let serves: Vec<usize> = match &spec.targets {
            Some(t) if !t.is_empty() => t.clone(),
            _ => (0..setup.settings.targets.len()).collect(),
        };
        let held = |t: usize| {
            self.book
                .runners()
                .filter(|r| r.provider == spec.name && r.intent.is_warm())
                .filter(|r| setup.target_index(&r.intent) == t)
                .count()
        };
        serves.into_iter().min_by_key(|&t| held(t)).unwrap_or(0)
    }

    /// Claims a warm runner for pool `i` with target `t`, in one of the pool's slots.
    fn start_warm_claim(&mut self, setup: &Setup, i: usize, t: usize, fx: &mut Vec<Effect>) {
        let past = self
            .book
            .runners()
            .filter_map(|r| match r.intent.intent() {
                Intent::Warm(n) => Some(n),
                _ => None,
            })
            .max()
            .map_or(0, |n| n + 1);
        self.warm.next = self.warm.next.max(past);
        let key = JobKey::warm(&setup.settings.targets[t].owner, self.warm.next);
        self.warm.next += 1;
        self.capacity.take(i);
        self.stats.claims += 1;
        self.capacity.claim_sent(key.clone(), t);
        self.warm.claiming.push((key.clone(), i));
        let spec = &setup.settings.providers[i];
        let (provider, labels) = (spec.name.clone(), spec.labels.clone());
        let name_base = setup.settings.runner_prefix(&provider);
        self.observe(Observation::WarmClaiming {
            provider: provider.clone(),
        });
        fx.push(Effect::Claim {
            key,
            provider,
            request: ClaimRequest {
                repo: None,
                name_base,
                labels,
            },
        });
    }

    /// Job `key` was taken by a runner of ours of `provider` (`warm_start`: started in a
    /// booted warm environment): counts a registered pool's hit or miss (a hit when no claim
    /// was made for the job: a runner registered ahead took it), and GitHub's own queued ->
    /// started wait when the event carried it.
    pub(super) fn job_taken(
        &mut self,
        setup: &Setup,
        key: &JobKey,
        provider: PoolName,
        warm_start: bool,
        github_wait_secs: Option<u32>,
    ) {
        let registered = setup.keeps_warm(&provider);
        let hit = if registered {
            self.jobs.get(key).is_none_or(|j| {
                !j.timeline()
                    .iter()
                    .any(|e| matches!(e.note, super::Note::Claiming { .. }))
            })
        } else {
            warm_start
        };
        if let Some(secs) = github_wait_secs {
            self.observe(Observation::GithubPickup {
                provider: provider.clone(),
                hit,
                secs,
            });
        }
        if registered {
            // The pool's warm runners work: its warm claims' backoff starts over.
            if let Some(f) = setup
                .provider_index(&provider)
                .and_then(|i| self.warm.failures.get_mut(i))
            {
                *f = 0;
            }
            self.observe(Observation::WarmOutcome { provider, hit });
        }
    }

    /// A runner ended by itself or failed: if it was a warm runner that never took a job, its
    /// pool's warm claims wait a while (a pool whose runners die at boot would otherwise spend
    /// a registration on each, as fast as the claim pacing allows).
    pub(super) fn warm_runner_lost(&mut self, setup: &Setup, r: &super::RunnerRecord, now: Now) {
        if !r.intent.is_warm() || r.bound.is_some() {
            return;
        }
        if let Some(i) = setup.provider_index(&r.provider) {
            self.warm.hold(i, None, now.mono);
        }
    }

    /// Shows pool `i`'s warm runners in `status` and the metrics, when they changed.
    fn show_warm(&mut self, setup: &Setup, i: usize, view: WarmView) {
        if !self.capacity.show_warm(i, view) {
            return;
        }
        self.observe(Observation::WarmRegistered {
            provider: setup.settings.providers[i].name.clone(),
            available: view.available,
            booting: view.booting,
        });
    }

    /// The answer to a warm claim: the runner joins the book as a spare and is provisioned
    /// (or, claimed into a cordon, deleted); a failure holds the pool's warm claims a while.
    pub(super) fn on_warm_claim_result(
        &mut self,
        setup: &Setup,
        key: JobKey,
        provider: PoolName,
        result: Result<JitRunner, GithubError>,
        now: Now,
        fx: &mut Vec<Effect>,
    ) {
        let t = self.capacity.claim_ended(&key);
        self.warm.claiming.retain(|(k, _)| *k != key);
        let i = setup.provider_index(&provider);
        let runner = match result {
            Ok(runner) => runner,
            Err(e) => {
                self.release(setup, &provider);
                self.stats.claim_failures += 1;
                // A rate limit is the credential's: the target's job claims wait too.
                let t = t.unwrap_or_else(|| setup.target_index(&key));
                self.hold_claims_after(setup, t, &e, now);
                if let Some(i) = i {
                    self.warm.hold(i, e.retry_after(), now.mono);
                }
                self.observe(Observation::WarmClaimFailed {
                    provider,
                    class: e.class(),
                    error: e.to_string(),
                });
                return;
            }
        };
        if self.draining || i.is_none() {
            self.release(setup, &provider);
            fx.push(Effect::DeleteRunner(super::Deletion {
                owner: key.owner.to_string(),
                repo: None,
                runner_id: runner.id,
                name: runner.name.clone(),
                attempt: 0,
            }));
            return;
        }
        self.observe(Observation::WarmRegisteredOne {
            provider: provider.clone(),
            runner: runner.name.clone(),
        });
        self.add_runner(setup, key, provider, None, runner, now, fx);
        // A job may have come while the claim was out.
        self.rebalance(setup, now, fx);
    }
}
