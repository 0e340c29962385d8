//! Fleet mode: what the cluster ledger's answers mean for this host's decisions. The ledger
//! arbitrates (one holder per job across the fleet, one budget per credential); the core
//! only hears the outcome.

use super::*;
use crate::cluster::{Acquire, Released, actor::Load};

/// How much later a host whose pool has one more label than the job needs asks the ledger,
/// so that the most specific pool in the fleet wins as it does on one host.
pub const OFFER_STEP_PER_EXTRA_LABEL: Duration = Duration::from_millis(100);
/// How much later a full host asks than an idle one (scaled by its load), so the least
/// loaded of equally specific hosts wins. Small: it is added to every claim of a busy host,
/// and a decision takes a millisecond or two.
pub const OFFER_STEP_FOR_LOAD: Duration = Duration::from_millis(10);

impl Scheduler {
    /// The job as last heard of.
    pub fn job_info(&self, key: &JobKey) -> Option<JobInfo> {
        self.jobs.get(key).map(|r| r.info.clone())
    }

    /// How long to wait before asking the ledger for `key` on `provider`: nothing for a pool
    /// with exactly the job's labels on an idle host, more for extra labels and for load.
    pub fn offer_delay(&self, key: &JobKey, provider: &PoolName) -> Duration {
        let Some(i) = self.provider_index(provider) else {
            return Duration::ZERO;
        };
        let extra = self.jobs.get(key).map_or(0, |r| {
            self.provider_sets[i].extra_over(&LabelSet::new(&r.info.labels))
        });
        let load = self.used_total as f64 / self.settings.max_concurrent.max(1) as f64;
        OFFER_STEP_PER_EXTRA_LABEL * (extra.min(20) as u32)
            + OFFER_STEP_FOR_LOAD.mul_f64(load.clamp(0.0, 1.0))
    }

    /// The ledger refused a claim this host started (its slot is given back): another host
    /// holds the job, GitHub already runs it, or the fleet's pacing says not yet (the job
    /// waits at the front of the queue and every claim pauses).
    pub fn on_acquire_refused(
        &mut self,
        key: JobKey,
        provider: PoolName,
        answer: Acquire,
        now: Now,
    ) -> Vec<Effect> {
        let mut fx = Vec::new();
        self.release(&provider);
        self.claiming.remove(&key);
        let t = self.target_index(&key);
        match answer {
            Acquire::Granted => {}
            Acquire::HeldBy(host) => {
                self.abandon(
                    &key,
                    Phase::Seen,
                    Note::HeldElsewhere { host },
                    now,
                    &mut fx,
                );
            }
            Acquire::Started => {
                self.stats.satisfied_elsewhere += 1;
                self.abandon(&key, Phase::Done, Note::RanElsewhere, now, &mut fx);
            }
            Acquire::Paced { wait, why } => {
                self.set_phase(&key, Phase::Pending);
                self.pending.push_front(key.clone());
                self.note(
                    &key,
                    now,
                    Note::FleetPaced {
                        why,
                        wait_ms: wait.as_millis() as u64,
                    },
                );
                self.pause_claims(t, wait.min(MAX_WAIT), why, now);
            }
        }
        self.pump(now, &mut fx);
        fx
    }

    /// Another host gave a job back: admit it again, with the ladder it had (its attempts,
    /// its first failure, its next attempt), unless it is already in play here, started, or
    /// this host is draining.
    pub fn readmit(&mut self, job: Released, by: String, now: Now) -> Vec<Effect> {
        let mut fx = Vec::new();
        let key = job.info.key.clone();
        if self.out_of_scope(&job.info).is_some() {
            return fx;
        }
        if let Some(rec) = self.jobs.get(&key)
            && (rec.started_at.is_some()
                || matches!(
                    rec.phase,
                    Phase::Pending
                        | Phase::Claiming { .. }
                        | Phase::Active { .. }
                        | Phase::Retrying
                        | Phase::Done
                ))
        {
            return fx;
        }
        if self.draining || self.pick(&job.info.labels, self.target_index(&key)) == Pick::Uncovered
        {
            return fx;
        }
        let ladder = job.ladder().filter(|_| self.settings.retry_enabled);
        let released = Note::Released {
            by,
            attempts: job.attempts.max(0) as u32,
        };
        match ladder {
            Some(row) if self.ladder.get(&key).is_none() => {
                let rec = self
                    .jobs
                    .entry(key.clone())
                    .or_insert_with(|| JobRecord::new(job.info.clone(), Phase::Seen, now.mono));
                rec.info = job.info.clone();
                rec.phase = Phase::Retrying;
                rec.seen_at = Some(now.mono);
                rec.claim_failures = row.attempts;
                rec.first_failure_class = Some(row.class);
                self.note(&key, now, released);
                self.ladder
                    .restore(std::slice::from_ref(&row), now.mono, now.unix);
                self.ops.push(Op::PutRetry(row));
                self.rearm_retry_timer(&mut fx);
            }
            _ => {
                if let Some(rec) = self.jobs.get_mut(&key) {
                    rec.seen_at = None;
                }
                self.on_queued(job.info, None, now.mono, now, &mut fx);
                self.note(&key, now, released);
            }
        }
        fx
    }

    /// What this host reports with its lease: its pools and their load.
    pub fn load(&self) -> Load {
        let pools = self
            .settings
            .providers
            .iter()
            .zip(&self.slots)
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
            used: self.used_total,
            capacity: self.settings.max_concurrent,
        }
    }
}
