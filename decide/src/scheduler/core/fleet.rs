//! Fleet mode: what the cluster ledger's answers mean for this host's decisions. The ledger
//! arbitrates (one holder per job across the fleet, one budget per credential); the core
//! only hears the outcome.

use super::job_table::{Begin, Rest};
use super::{ClaimRequest, Effect, JobRecord, Note, Phase, Scheduler, capacity::Pick};
use super::{Setup, State, View};
use crate::cluster::{Acquire, Load, Released};
use crate::{
    clock::Now,
    config::PoolName,
    durable::Op,
    job::{JobAction, JobInfo, JobKey},
    retry::MAX_WAIT,
    vocab::LabelSet,
};
use std::time::Duration;

/// How much later a host whose pool has one more label than the job needs asks the ledger,
/// so that the most specific pool in the fleet wins as it does on one host.
pub const OFFER_STEP_PER_EXTRA_LABEL: Duration = Duration::from_millis(100);
/// How much later a full host asks than an idle one (scaled by its load), so the least
/// loaded of equally specific hosts wins. Small: it is added to every claim of a busy host,
/// and a decision takes a millisecond or two.
pub const OFFER_STEP_FOR_LOAD: Duration = Duration::from_millis(10);
/// How much later a host asks for a job another host's intake received. That host asks
/// first (more than [`OFFER_STEP_FOR_LOAD`], so it does even when busy), and the others,
/// hearing it granted meanwhile, never ask: one claim decision per job on the happy path.
pub const OFFER_STEP_FOR_ELSEWHERE: Duration = Duration::from_millis(15);

impl Scheduler {
    /// A job event another host's intake recorded: as [`Scheduler::on_job_event`], and the
    /// job is marked as delivered elsewhere (see `OFFER_STEP_FOR_ELSEWHERE`).
    pub fn on_fleet_job_event(
        &mut self,
        action: JobAction,
        info: JobInfo,
        now: Now,
    ) -> Vec<Effect> {
        let key = info.key.clone();
        let fx = self.on_job_event(action, info, None, now.mono, now);
        self.state.jobs.delivered_elsewhere(&key);
        fx
    }

    /// Another host was granted a job: one waiting for a slot here is left alone (as when the
    /// ledger answers "held"); one whose claim waits for its offer delay will not ask
    /// (`State::take_held_notice`).
    pub fn on_held_elsewhere(&mut self, key: JobKey, host: String, now: Now) -> Vec<Effect> {
        let mut fx = Vec::new();
        match self.state.jobs.get(&key).map(|r| r.phase()) {
            Some(Phase::Pending) => self.state.held_elsewhere(&key, host, now, &mut fx),
            Some(Phase::Claiming { .. }) => {
                self.state.held_notices.insert(key, host);
            }
            _ => {}
        }
        fx
    }

    /// Another host gave a job back: admit it again, with the ladder it had (its attempts,
    /// its first failure, its next attempt), unless it is already in play here, started, or
    /// this host is draining.
    pub fn readmit(&mut self, job: Released, by: String, now: Now) -> Vec<Effect> {
        let mut fx = Vec::new();
        let key = job.info.key.clone();
        if self.state.out_of_scope(&self.setup, &job.info).is_some() {
            return fx;
        }
        if let Some(rec) = self.state.jobs.get(&key)
            && (rec.started_at().is_some()
                || matches!(
                    rec.phase(),
                    Phase::Pending
                        | Phase::Claiming { .. }
                        | Phase::Active { .. }
                        | Phase::Retrying
                        | Phase::Done
                ))
        {
            return fx;
        }
        if self.state.draining
            || self
                .state
                .pick(&self.setup, &job.info.labels, self.setup.target_index(&key))
                == Pick::Uncovered
        {
            return fx;
        }
        let ladder = job.ladder().filter(|_| self.setup.settings.retry_enabled);
        let released = Note::Released {
            by,
            attempts: job.attempts.max(0) as u32,
        };
        match ladder {
            Some(row) if self.state.ladder.queue().get(&key).is_none() => {
                self.state.jobs.enter(&key, || {
                    JobRecord::begin(job.info.clone(), Begin::Seen, now.mono)
                });
                let answer = self.state.jobs.replace_info(job.info.clone(), now.mono);
                self.state.moved(&key, answer);
                let answer = self.state.jobs.retry(&key);
                self.state.moved(&key, answer);
                self.state.note(&key, now, released);
                self.state.ladder.queue_mut().restore(
                    std::slice::from_ref(&row),
                    now.mono,
                    now.unix,
                );
                self.state.ops.push(Op::PutRetry(row));
                self.state.rearm_timer(&mut fx);
            }
            _ => {
                self.state.jobs.unsee(&key);
                self.state
                    .on_queued(&self.setup, job.info, None, now.mono, now, &mut fx);
                self.state.note(&key, now, released);
            }
        }
        fx
    }

    /// What this host reports with its lease: its pools and their load.
    pub fn load(&self) -> Load {
        let pools = self
            .setup
            .settings
            .providers
            .iter()
            .zip(self.state.capacity.slots())
            .map(|(p, s)| {
                serde_json::json!({
                    "name": p.name.as_str(),
                    "kind": p.kind.as_str(),
                    "labels": p.labels,
                    "max_concurrent": p.max_concurrent,
                    "used": s.used,
                    "up": s.up,
                })
            })
            .collect();
        Load {
            pools: serde_json::Value::Array(pools),
            used: self.state.capacity.used_total(),
            capacity: self.setup.settings.max_concurrent,
        }
    }
}

impl State {
    /// How long to wait before asking the ledger for `key` on `provider`: nothing for a pool
    /// with exactly the job's labels on an idle host, more for extra labels and for load.
    pub(super) fn offer_delay(&self, setup: &Setup, key: &JobKey, provider: &PoolName) -> Duration {
        let Some(i) = setup.provider_index(provider) else {
            return Duration::ZERO;
        };
        let (extra, elsewhere) = self.jobs.get(key).map_or((0, false), |r| {
            let extra = self
                .capacity
                .set(i)
                .extra_over(&LabelSet::new(&r.info().labels));
            (extra, r.delivered_elsewhere())
        });
        let load = self.capacity.used_total() as f64 / setup.settings.max_concurrent.max(1) as f64;
        let elsewhere = if elsewhere {
            OFFER_STEP_FOR_ELSEWHERE
        } else {
            Duration::ZERO
        };
        OFFER_STEP_PER_EXTRA_LABEL * (extra.min(20) as u32)
            + OFFER_STEP_FOR_LOAD.mul_f64(load.clamp(0.0, 1.0))
            + elsewhere
    }

    /// A claim this host starts: at once, or in fleet mode after its offer delay (a
    /// registered warm runner is made for no job: nothing is offered for it).
    pub(super) fn offer_claim(
        &mut self,
        setup: &Setup,
        key: JobKey,
        provider: PoolName,
        request: ClaimRequest,
        now: Now,
        fx: &mut Vec<Effect>,
    ) {
        let delay = if setup.settings.fleet && !key.is_warm() {
            self.offer_delay(setup, &key, &provider)
        } else {
            Duration::ZERO
        };
        if delay.is_zero() {
            fx.push(Effect::Claim {
                key,
                provider,
                request,
            });
            return;
        }
        self.offers.push(Offer {
            at: now.mono + delay,
            key,
            provider,
            request,
        });
        self.rearm_timer(fx);
    }

    /// When the next offer delay ends.
    pub(super) fn next_offer(&self) -> Option<crate::clock::Instant> {
        self.offers.iter().map(|o| o.at).min()
    }

    /// Claims whose offer delay ended: one another host was heard to hold meanwhile is given
    /// up as held there, without asking the ledger; the rest are claimed.
    pub(super) fn offers_due(&mut self, setup: &Setup, now: Now, fx: &mut Vec<Effect>) {
        let (due, waiting): (Vec<Offer>, Vec<Offer>) = std::mem::take(&mut self.offers)
            .into_iter()
            .partition(|o| o.at <= now.mono);
        self.offers = waiting;
        for o in due {
            match self.take_held_notice(&o.key) {
                Some(host) => fx.extend(self.on_acquire_refused(
                    setup,
                    o.key,
                    o.provider,
                    Acquire::HeldBy(host),
                    now,
                )),
                None => fx.push(Effect::Claim {
                    key: o.key,
                    provider: o.provider,
                    request: o.request,
                }),
            }
        }
    }

    /// Another live host holds the job: this one leaves it alone (a release or a new
    /// delivery brings it back).
    fn held_elsewhere(&mut self, key: &JobKey, host: String, now: Now, fx: &mut Vec<Effect>) {
        self.abandon(key, Rest::Seen, Note::HeldElsewhere { host }, now, fx);
    }

    /// The host heard to hold a job whose claim is in flight here, if any (taken).
    pub(super) fn take_held_notice(&mut self, key: &JobKey) -> Option<String> {
        self.held_notices.remove(key)
    }

    /// A refused acquire ([`Scheduler::on_acquire_refused`]).
    pub(super) fn on_acquire_refused(
        &mut self,
        setup: &Setup,
        key: JobKey,
        provider: PoolName,
        answer: Acquire,
        now: Now,
    ) -> Vec<Effect> {
        let mut fx = Vec::new();
        self.release(setup, &provider);
        self.capacity.claim_ended(&key);
        self.held_notices.remove(&key);
        let t = setup.target_index(&key);
        match answer {
            Acquire::Granted => {}
            Acquire::HeldBy(host) => self.held_elsewhere(&key, host, now, &mut fx),
            Acquire::Started => {
                self.stats.satisfied_elsewhere += 1;
                self.abandon(&key, Rest::Done, Note::RanElsewhere, now, &mut fx);
            }
            Acquire::Paced { wait, why } => {
                let answer = self.jobs.admit(&key);
                self.moved(&key, answer);
                self.admission.queue_first(t, key.clone());
                self.note(
                    &key,
                    now,
                    Note::FleetPaced {
                        why,
                        wait_ms: wait.as_millis() as u64,
                    },
                );
                self.pause_claims(setup, t, wait.min(MAX_WAIT), why, now);
            }
        }
        self.pump(setup, now, &mut fx);
        fx
    }
}

impl<'a> View<'a> {
    /// The job as last heard of.
    pub fn job_info(&self, key: &JobKey) -> Option<JobInfo> {
        self.state.jobs.get(key).map(|r| r.info().clone())
    }
}

/// A claim waiting out its offer delay (fleet mode).
#[derive(Debug, Clone)]
pub(super) struct Offer {
    /// When the ledger may be asked.
    pub(super) at: crate::clock::Instant,
    pub(super) key: JobKey,
    pub(super) provider: PoolName,
    pub(super) request: ClaimRequest,
}
