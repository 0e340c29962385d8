//! Dispatch: routing a pending job to a covering provider with a free slot, claim pacing, and
//! what a claim's answer leads to.

use super::job_table::Rest;
use super::{
    Abandon, ClaimRequest, Deletion, Effect, Note, Phase, RunnerRecord, Scheduler, capacity::Pick,
    observation::Observation,
};
use super::{Setup, State};
use crate::clock::Instant;
use crate::{
    clock::Now,
    config::PoolName,
    durable::{Op, RunnerRow},
    github::{GithubError, JitRunner},
    job::JobKey,
    provision::RunnerSpec,
    retry::{Failure, MAX_WAIT, RATE_READING_FRESH},
    vocab::{LabelSet, RateBucket, RateSnapshot},
};
use std::{collections::VecDeque, sync::Arc, time::Duration};

/// What the pump does with one pending job.
enum Turn {
    /// Nothing more to do here: not pending any more, abandoned, or ran elsewhere.
    Gone,
    /// The host has no free slot: the pump stops.
    HostFull,
    /// No pool of its target has a free slot for it now.
    NoSlot,
    /// Its target is out of claim tokens until then.
    Paced(Instant),
    /// Claim it on pool `i`.
    Claim(usize),
}

/// The target whose turn it is: of those with a job to try and a claim token (not `paced`),
/// the one holding the fewest slots (`held`) per unit of `weight`; among equals, the one whose
/// next job is oldest (`age`: when it was received).
fn fairest(
    queues: &[VecDeque<JobKey>],
    held: &[usize],
    paced: &[bool],
    weight: impl Fn(usize) -> usize,
    age: impl Fn(&JobKey) -> Option<Instant>,
) -> Option<usize> {
    if queues.len() == 1 {
        return (!paced[0] && !queues[0].is_empty()).then_some(0);
    }
    let next = |t: usize| queues[t].front().and_then(&age);
    (0..queues.len())
        .filter(|&t| !paced[t] && !queues[t].is_empty())
        .min_by(|&a, &b| {
            (held[a] * weight(b))
                .cmp(&(held[b] * weight(a)))
                .then_with(|| next(a).cmp(&next(b)))
        })
}

impl Scheduler {
    /// The answer to a claim.
    pub fn on_claim_result(
        &mut self,
        key: JobKey,
        provider: PoolName,
        result: Result<JitRunner, GithubError>,
        now: Now,
    ) -> Vec<Effect> {
        let mut fx = Vec::new();
        if key.is_warm() {
            self.state
                .on_warm_claim_result(&self.setup, key, provider, result, now, &mut fx);
            self.state.pump(&self.setup, now, &mut fx);
            return fx;
        }
        self.state.capacity.claim_ended(&key);
        self.state.held_notices.remove(&key);
        let t = self.setup.target_index(&key);
        match result {
            Ok(runner) => self
                .state
                .claimed(&self.setup, key, provider, runner, now, &mut fx),
            Err(e) => {
                self.state.release(&self.setup, &provider);
                self.state.stats.claim_failures += 1;
                let reading = self.state.hold_claims_after(&self.setup, t, &e, now);
                let class = e.class();
                self.state.observe(Observation::ClaimFailed {
                    job_id: key.job_id,
                    target: self.setup.settings.targets[t].name.clone(),
                    provider,
                    class,
                    error: e.to_string(),
                });
                self.state.note(
                    &key,
                    now,
                    Note::ClaimFailed {
                        class,
                        error: e.to_string(),
                    },
                );
                let failure = Failure {
                    class,
                    retry_after: e.retry_after(),
                    bucket: e.rate_bucket(),
                    reading,
                    message: e.to_string(),
                };
                self.state.failed(&self.setup, &key, failure, now, &mut fx);
            }
        }
        self.state.pump(&self.setup, now, &mut fx);
        fx
    }
}

impl State {
    /// The pool for a job of `target` with `labels` (see [`SlotTable::pick`]).
    pub(super) fn pick(&self, setup: &Setup, labels: &[String], target: usize) -> Pick {
        self.capacity
            .pick(&setup.settings.providers, labels, target)
    }

    /// Slots each target holds now: its claims in flight and its runners.
    pub(super) fn held_per_target(&self, setup: &Setup) -> Vec<usize> {
        let mut held = vec![0; setup.settings.targets.len()];
        for t in self.capacity.claiming().values() {
            held[*t] += 1;
        }
        for r in self.book.runners() {
            held[setup.target_index(&r.intent)] += 1;
        }
        held
    }

    /// Starts claims for pending jobs while slots and claim tokens allow. When slots are
    /// scarce, targets get them in proportion to their weight: the next claim goes to the
    /// target holding the fewest slots per unit of weight (its oldest job first; among equals,
    /// the target whose next job is oldest). A target out of claim tokens waits alone.
    pub(super) fn pump(&mut self, setup: &Setup, now: Now, fx: &mut Vec<Effect>) {
        let n = setup.settings.targets.len();
        let mut queues = self.admission.take_queues(n);
        let mut skipped: Vec<VecDeque<JobKey>> = vec![VecDeque::new(); queues.len()];
        let mut held = if n > 1 {
            self.held_per_target(setup)
        } else {
            vec![0]
        };
        // Targets that can take no more claims in this pump: out of claim tokens, or no pool
        // of theirs has a free slot.
        let mut paced = vec![false; queues.len()];
        let mut wake: Option<Instant> = None;
        let weight = |t: usize| setup.settings.targets[t].weight.max(1) as usize;
        while let Some(t) = fairest(&queues, &held, &paced, weight, |k| {
            self.jobs.get(k).map(|r| r.received_at())
        }) {
            let Some(key) = queues[t].pop_front() else {
                break;
            };
            match self.turn(setup, &key, t, now, fx) {
                Turn::Gone => {}
                Turn::HostFull => {
                    queues[t].push_front(key);
                    break;
                }
                Turn::NoSlot => {
                    skipped[t].push_back(key);
                    // No pool of this target has a free slot: none of its other jobs can
                    // be claimed now either, and looking at each would cost a decision time
                    // in proportion to the backlog.
                    if !self.capacity.room_for(&setup.settings.providers, t) {
                        paced[t] = true;
                    }
                }
                Turn::Paced(at) => {
                    wake = Some(wake.map_or(at, |w| w.min(at)));
                    paced[t] = true;
                    queues[t].push_front(key);
                }
                Turn::Claim(i) => {
                    if let Some(h) = held.get_mut(t) {
                        *h += 1;
                    }
                    self.start_claim(setup, key, i, t, now, fx);
                }
            }
        }
        // The skipped jobs go back in front of the ones not reached, in their order.
        for (skipped, queue) in skipped.into_iter().zip(queues.iter_mut()) {
            for key in skipped.into_iter().rev() {
                queue.push_front(key);
            }
        }
        self.admission.restore_queues(queues);
        // Then the registered warm runners, with what the jobs left.
        if let Some(at) = self.keep_warm(setup, now, fx) {
            wake = Some(wake.map_or(at, |w| w.min(at)));
        }
        self.pace_wake = wake;
        self.rearm_timer(fx);
    }

    /// What one pending job of target `t` gets in this pump.
    fn turn(
        &mut self,
        setup: &Setup,
        key: &JobKey,
        t: usize,
        now: Now,
        fx: &mut Vec<Effect>,
    ) -> Turn {
        let Some(rec) = self.jobs.get(key) else {
            return Turn::Gone;
        };
        if *rec.phase() != Phase::Pending {
            return Turn::Gone;
        }
        if self.draining {
            let why = Note::Abandoned(Abandon::CordonedWhileWaiting);
            self.abandon(key, Rest::Seen, why, now, fx);
            return Turn::Gone;
        }
        if rec.started_at().is_some() {
            self.stats.satisfied_elsewhere += 1;
            self.abandon(key, Rest::Done, Note::RanElsewhere, now, fx);
            return Turn::Gone;
        }
        if self.capacity.host_full() {
            return Turn::HostFull;
        }
        let labels = rec.info().labels.clone();
        let i = match self.pick(setup, &labels, t) {
            Pick::Provider(i) => i,
            Pick::Wait => return Turn::NoSlot,
            Pick::Uncovered => {
                let why = Note::Abandoned(Abandon::NoProviderAnyMore);
                self.abandon(key, Rest::Unroutable, why, now, fx);
                return Turn::Gone;
            }
        };
        self.hold_claims_while_budget_empty(setup, t, now);
        if !self.capacity.pacer_mut(t).try_take(now.mono) {
            return Turn::Paced(self.capacity.pacer_mut(t).next_slot_at(now.mono));
        }
        Turn::Claim(i)
    }

    /// A registration budget a fresh reading proves empty is not spent: every claim of the
    /// target waits for its reset (a second past it, as readings count whole seconds).
    fn hold_claims_while_budget_empty(&mut self, setup: &Setup, t: usize, now: Now) {
        if let Some(reading) = self
            .ladder
            .reading(t, RateBucket::ActionsRunnerRegistration)
        {
            self.hold_claims_until_reset(setup, t, &reading, now);
        }
    }

    /// Holds target `t`'s claims until the reset of a registration budget `reading` proves
    /// empty.
    fn hold_claims_until_reset(
        &mut self,
        setup: &Setup,
        t: usize,
        reading: &RateSnapshot,
        now: Now,
    ) {
        let Some(reset) = reading.exhausted_until(now.unix, RATE_READING_FRESH) else {
            return;
        };
        let wait = Duration::from_secs(reset.saturating_sub(now.unix).saturating_add(1));
        self.pause_claims(
            setup,
            t,
            wait.min(MAX_WAIT),
            "the registration budget is empty until its reset",
            now,
        );
    }

    /// What a failed claim of target `t` says about the credential, not the job: a reading
    /// that proves the registration budget empty holds the target's claims until its reset,
    /// a secondary limit holds them for its wait (job claims and warm claims alike). The
    /// failed answer's own reading, whether or not the rate actor has folded it into its book
    /// yet: it decides the job's retry too.
    pub(super) fn hold_claims_after(
        &mut self,
        setup: &Setup,
        t: usize,
        e: &GithubError,
        now: Now,
    ) -> Option<RateSnapshot> {
        let reading = e.rate_reading().map(|(bucket, remaining, reset)| {
            let reading = RateSnapshot {
                remaining: Some(remaining),
                reset: Some(reset),
                updated: now.unix,
                ..RateSnapshot::default()
            };
            if bucket == RateBucket::ActionsRunnerRegistration {
                self.hold_claims_until_reset(setup, t, &reading, now);
            }
            reading
        });
        if let Some(wait) = e.secondary_limit_wait() {
            self.pause_claims(
                setup,
                t,
                wait,
                "GitHub answered a secondary rate limit",
                now,
            );
        }
        reading
    }

    /// Holds every claim of target `t` back for `wait` (a pause already longer stays).
    pub(super) fn pause_claims(
        &mut self,
        setup: &Setup,
        t: usize,
        wait: Duration,
        why: &'static str,
        now: Now,
    ) {
        let until = now.mono + wait;
        if self
            .capacity
            .pacer_mut(t)
            .paused(now.mono)
            .is_none_or(|p| p < until)
        {
            self.capacity.pacer_mut(t).pause_until(until);
            self.observe(Observation::ClaimsPaused {
                target: setup.settings.targets[t].name.clone(),
                until_unix: now.unix.saturating_add(wait.as_secs()),
                why,
            });
        }
    }

    /// Stops a job's dispatch with nothing in flight: `why` goes to its timeline and the log,
    /// and it leaves the ladder.
    pub(super) fn abandon(
        &mut self,
        key: &JobKey,
        rest: Rest,
        why: Note,
        now: Now,
        fx: &mut Vec<Effect>,
    ) {
        let answer = self.jobs.rest(key, rest);
        self.moved(key, answer);
        self.leave_ladder(key, fx);
        self.observe(Observation::Abandoned {
            job_id: key.job_id,
            why: match &why {
                Note::Abandoned(a) => a.to_string(),
                other => other.to_string(),
            },
        });
        self.note(key, now, why);
    }

    pub(super) fn start_claim(
        &mut self,
        setup: &Setup,
        key: JobKey,
        i: usize,
        t: usize,
        now: Now,
        fx: &mut Vec<Effect>,
    ) {
        let spec = &setup.settings.providers[i];
        let provider = spec.name.clone();
        let request = ClaimRequest {
            repo: setup.settings.targets[t].repo_level().then(|| {
                self.jobs
                    .get(&key)
                    .map(|j| j.info().repo.to_string())
                    .unwrap_or_default()
            }),
            name_base: setup.settings.runner_prefix(&provider),
            labels: spec.labels.clone(),
        };
        self.capacity.take(i);
        self.stats.claims += 1;
        self.capacity.claim_sent(key.clone(), t);
        let answer = self.jobs.claim(&key, provider.clone());
        self.moved(&key, answer);
        self.note(
            &key,
            now,
            Note::Claiming {
                provider: provider.clone(),
            },
        );
        self.observe(Observation::Claiming {
            job_id: key.job_id,
            provider: provider.clone(),
        });
        self.offer_claim(setup, key, provider, request, now, fx);
    }

    pub(super) fn claimed(
        &mut self,
        setup: &Setup,
        key: JobKey,
        provider: PoolName,
        runner: JitRunner,
        now: Now,
        fx: &mut Vec<Effect>,
    ) {
        let t = setup.target_index(&key);
        let repo = setup.settings.targets[t].repo_level().then(|| {
            self.jobs
                .get(&key)
                .map(|r| r.info().repo.to_string())
                .unwrap_or_default()
        });
        let started = self.jobs.get(&key).and_then(|r| r.started_at()).is_some();
        if self.draining || (started && !self.waiting_for(setup, &provider, &key)) {
            // The claim raced a cordon or the job starting elsewhere, and no other job waits
            // for a runner of this pool: the runner is not needed and has not connected yet,
            // so delete it rather than start an environment.
            self.release(setup, &provider);
            let why = if self.draining {
                Abandon::CordonedDuringClaim
            } else {
                Abandon::StartedDuringClaim
            };
            fx.push(Effect::DeleteRunner(Deletion {
                owner: key.owner.to_string(),
                repo,
                runner_id: runner.id,
                name: runner.name.clone(),
                attempt: 0,
            }));
            let rest = if started { Rest::Done } else { Rest::Seen };
            self.abandon(&key, rest, Note::Abandoned(why), now, fx);
            return;
        }
        // Started elsewhere during the claim, with another job waiting: the runner is supply
        // for that one (handed over below, as a spare).
        let spare = started;
        let runner_id = runner.id;
        let handle = self.add_runner(setup, key.clone(), provider.clone(), repo, runner, now, fx);
        let answer = if spare {
            self.jobs.complete(&key)
        } else {
            self.jobs.claimed(&key, provider.clone(), handle.clone())
        };
        self.moved(&key, answer);
        // A job on the ladder keeps its item (attempts, first failure) until it is seen
        // running: if this runner's environment fails, the same item climbs.
        self.note(
            &key,
            now,
            Note::Claimed {
                runner: handle.clone(),
                runner_id,
                provider: provider.clone(),
            },
        );
        self.observe(Observation::Claimed {
            job_id: key.job_id,
            provider,
            runner: handle.to_string(),
        });
        if spare {
            self.rebalance(setup, now, fx);
        }
    }

    /// Enters a claimed runner in the book (made for `intent`, registered in `repo` for a
    /// repo-level target), makes it durable, and asks its pool to start it: the same for a
    /// job's runner and a registered warm one. Its handle.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn add_runner(
        &mut self,
        setup: &Setup,
        intent: JobKey,
        provider: PoolName,
        repo: Option<String>,
        runner: JitRunner,
        now: Now,
        fx: &mut Vec<Effect>,
    ) -> Arc<str> {
        let handle: Arc<str> = Arc::from(runner.name.as_str());
        let row = RunnerRow {
            name: runner.name.clone(),
            id: runner.id,
            provider: provider.clone(),
            repo,
            intent: intent.clone(),
            bound: None,
            created_unix: now.unix,
        };
        self.book
            .insert(handle.clone(), RunnerRecord::new(row.clone(), now.mono));
        self.ops.push(Op::PutRunner(row));
        self.observe(Observation::RunnerAdded {
            provider: provider.clone(),
        });
        let labels = setup
            .provider_index(&provider)
            .map(|i| setup.settings.providers[i].labels.clone())
            .unwrap_or_default();
        fx.push(Effect::Provision {
            provider,
            spec: RunnerSpec {
                name: runner.name,
                runner_id: runner.id,
                jit_config: runner.encoded_jit_config,
                intent,
                labels,
            },
        });
        handle
    }

    /// Whether a job other than `except` waits for a runner `provider` could serve (pending
    /// or on the ladder, not started).
    fn waiting_for(&self, setup: &Setup, provider: &PoolName, except: &JobKey) -> bool {
        let Some(i) = setup.provider_index(provider) else {
            return false;
        };
        let covers = |k: &JobKey| {
            self.jobs.get(k).is_some_and(|j| {
                self.capacity
                    .set(i)
                    .covers(&LabelSet::new(&j.info().labels))
            })
        };
        self.admission
            .pending()
            .iter()
            .chain(self.ladder.queue().keys())
            .any(|k| k != except && self.jobs.needs_runner(k) && covers(k))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn queue(ids: &[u64]) -> VecDeque<JobKey> {
        ids.iter().map(|&i| JobKey::new("acme", i)).collect()
    }

    #[test]
    fn the_target_holding_the_fewest_slots_per_weight_goes_next_and_the_oldest_breaks_ties() {
        let t0 = Instant::now();
        let queues = [queue(&[1]), queue(&[2]), queue(&[3])];
        let weights = [1, 3, 1];
        let weight = |t: usize| weights[t];
        // Job 3 is the oldest, job 1 the newest.
        let age = |k: &JobKey| Some(t0 + std::time::Duration::from_secs(10 - k.job_id));
        let free = [false; 3];
        // Target 1 holds 2 slots of weight 3 (2/3 each): fewer than 1 of weight 1.
        assert_eq!(fairest(&queues, &[1, 2, 1], &free, weight, age), Some(1));
        // At 3 of weight 3 it ties with the others; target 2's job is the oldest.
        assert_eq!(fairest(&queues, &[1, 3, 1], &free, weight, age), Some(2));
        // A paced target and an empty queue never get a turn.
        let paced = [false, true, true];
        assert_eq!(fairest(&queues, &[5, 0, 0], &paced, weight, age), Some(0));
        let empty = [queue(&[]), queue(&[]), queue(&[3])];
        assert_eq!(fairest(&empty, &[0, 0, 9], &free, weight, age), Some(2));
        assert_eq!(fairest(&[queue(&[1])], &[0], &[true], weight, age), None);
    }
}
