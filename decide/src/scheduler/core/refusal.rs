//! GitHub's false "deprecated". A runner GitHub refuses as too old (exit code 7) is normally an
//! old install: its job waits [`OUTDATED_WAIT`] (doubling) while the pool's install is updated.
//! But when the shell says the install *is* the newest release (a look since the refusals began
//! found nothing newer), the refusal is GitHub's outage (its 2026-08-06 one did this to the latest
//! runner): waiting minutes would leave the jobs queued long after the service is back, and a
//! claim per job per wait would spend registrations for nothing.
//!
//! So a pool in such an outage holds its refused jobs, and one of them at a time probes the
//! service: claimed again after [`probe_wait`] (1 s, doubling, at most [`PROBE_WAIT_MAX`]). The
//! first runner of the pool seen with a job ends the outage, and every held job is claimed at
//! once. A pool with nothing left to hold forgets its outage (the next refusal says it again).

use std::{collections::HashMap, sync::Arc, time::Duration};

use super::Effect;
use super::{
    OUTDATED_WAIT, OUTDATED_WAIT_MAX, Phase, Setup, State, ledger::Strand,
    observation::Observation, runner_book::Deferred,
};
use crate::clock::Instant;
use crate::{clock::Now, config::PoolName, job::JobKey};

/// The first wait of a probe of a pool in an outage.
pub const PROBE_WAIT_FIRST: Duration = Duration::from_secs(1);
/// The longest wait between two probes: a job runs within about this long, plus a runner's
/// boot, of the service's return.
pub const PROBE_WAIT_MAX: Duration = Duration::from_secs(5);

/// The wait before the next probe, after `refused` probes of this outage were refused.
pub fn probe_wait(refused: u32) -> Duration {
    PROBE_WAIT_FIRST
        .saturating_mul(2u32.saturating_pow(refused))
        .min(PROBE_WAIT_MAX)
}

/// The wait of a job refused `refusals` times by GitHub, outside an outage (an old install).
pub fn outdated_wait(refusals: u8) -> Duration {
    OUTDATED_WAIT
        .saturating_mul(2u32.saturating_pow(u32::from(refusals).saturating_sub(1)))
        .min(OUTDATED_WAIT_MAX)
}

/// A pool's jobs refused by GitHub, and its outage if the shell said so.
#[derive(Debug, Default)]
pub(super) struct PoolRefusals {
    /// The newest release GitHub refuses, once the shell said this is an outage.
    outage: Option<Outage>,
    /// Jobs whose runner of this pool was refused, waiting, oldest first.
    held: Vec<JobKey>,
    /// The held job claimed again to probe the service.
    probe: Option<JobKey>,
    /// When the next probe is due (a deferred probe is waiting for it; one that fires earlier
    /// was overtaken and does nothing).
    next_probe: Option<Instant>,
}

#[derive(Debug)]
struct Outage {
    version: Arc<str>,
    since_unix: u64,
    /// Probes refused so far.
    refused: u32,
}

/// Every pool's refusals.
#[derive(Debug, Default)]
pub(super) struct Refusals(HashMap<PoolName, PoolRefusals>);

impl Refusals {
    /// The `status` line of `pool`, while it is in an outage.
    pub(super) fn status(&self, pool: &PoolName, now_unix: u64) -> Option<String> {
        let p = self.0.get(pool)?;
        let o = p.outage.as_ref()?;
        let waiting = p.held.len() + usize::from(p.probe.is_some());
        Some(format!(
            "{} for {} s: {} probes refused; {waiting} jobs wait, one probing the service at a time",
            crate::release::policy::outage_line(&o.version),
            now_unix.saturating_sub(o.since_unix),
            o.refused
        ))
    }

    /// Whether `key` is held by a pool in an outage (its own probe is not).
    fn held_in_outage(&self, key: &JobKey) -> bool {
        self.0
            .values()
            .any(|p| p.outage.is_some() && p.held.contains(key))
    }
}

impl State {
    /// The shell: GitHub refused runner `runner` of `pool`, whose install is the newest release
    /// `version`. Told before the runner's exit, whose job is then held.
    pub(super) fn refused_newest(
        &mut self,
        pool: &PoolName,
        runner: &str,
        version: &str,
        now: Now,
    ) {
        let p = self.refusals.0.entry(pool.clone()).or_default();
        match &mut p.outage {
            Some(o) if *o.version == *version => {}
            Some(o) => o.version = version.into(),
            None => {
                p.outage = Some(Outage {
                    version: version.into(),
                    since_unix: now.unix,
                    refused: 0,
                });
                self.observe(Observation::RefusalOutage {
                    provider: pool.clone(),
                    runner: runner.to_string(),
                    version: version.to_string(),
                });
            }
        }
    }

    /// A runner of `pool` made for `intent` exited with code 7. Its job is held: in an outage
    /// it waits for a probe; otherwise for its own wait, the install updated meanwhile.
    pub(super) fn refused_exit(
        &mut self,
        pool: &PoolName,
        runner: &str,
        intent: &JobKey,
        now: Now,
        fx: &mut Vec<Effect>,
    ) {
        let refusals = self.jobs.outdated_exit(intent);
        let p = self.refusals.0.entry(pool.clone()).or_default();
        if !p.held.contains(intent) {
            p.held.push(intent.clone());
        }
        let was_probe = p.probe.as_ref() == Some(intent);
        if was_probe {
            p.probe = None;
        }
        let wait = match &mut p.outage {
            Some(o) => {
                if was_probe {
                    o.refused += 1;
                }
                let wait = probe_wait(o.refused);
                // The next probe after this wait, unless one is out or already due.
                if was_probe || (p.probe.is_none() && p.next_probe.is_none()) {
                    let due = now.mono + wait;
                    p.next_probe = Some(due);
                    let what = Deferred::Probe { pool: pool.clone() };
                    self.defer(due, what, fx);
                }
                wait
            }
            None => {
                let wait = outdated_wait(refusals);
                let what = Deferred::Heal {
                    key: intent.clone(),
                    why: Strand::Outdated,
                };
                self.defer(now.mono + wait, what, fx);
                wait
            }
        };
        self.observe(Observation::RunnerOutdated {
            provider: pool.clone(),
            runner: runner.to_string(),
            wait,
        });
    }

    /// A refused job's own wait is over. One held by a pool in an outage waits for its probe;
    /// any other is claimed again.
    pub(super) fn outdated_wait_over(&mut self, key: &JobKey) -> bool {
        if self.refusals.held_in_outage(key) {
            return false;
        }
        for p in self.refusals.0.values_mut() {
            p.held.retain(|k| k != key);
        }
        self.refusals
            .0
            .retain(|_, p| p.outage.is_some() || !p.held.is_empty());
        true
    }

    /// A pool's probe is due: the oldest held job still waiting is claimed again, unless the
    /// last probe is still out (its runner not yet refused nor seen with a job).
    pub(super) fn probe(&mut self, setup: &Setup, pool: &PoolName, now: Now, fx: &mut Vec<Effect>) {
        let Some(mut p) = self.refusals.0.remove(pool) else {
            return;
        };
        if p.next_probe.is_some_and(|due| now.mono < due) {
            // Overtaken: a later probe is due.
            self.refusals.0.insert(pool.clone(), p);
            return;
        }
        p.next_probe = None;
        let waiting = |s: &State, k: &JobKey| {
            s.jobs
                .get(k)
                .is_some_and(|r| *r.phase() == Phase::Seen && r.started_at().is_none())
        };
        p.held.retain(|k| waiting(self, k));
        if let Some(probe) = p.probe.take() {
            let out = self
                .jobs
                .get(&probe)
                .is_some_and(|r| *r.phase() != Phase::Seen && r.started_at().is_none());
            if out {
                p.probe = Some(probe);
            } else if waiting(self, &probe) && !p.held.contains(&probe) {
                // Stranded for another reason: it waits with the others.
                p.held.insert(0, probe);
            }
        }
        let Some(outage) = &p.outage else {
            // An old install's jobs only: they keep their own waits.
            if !p.held.is_empty() {
                self.refusals.0.insert(pool.clone(), p);
            }
            return;
        };
        if p.held.is_empty() && p.probe.is_none() {
            // Nothing waits for the service: the outage is forgotten (a refusal says it again).
            self.observe(Observation::RefusalOutageOver {
                provider: pool.clone(),
                version: outage.version.to_string(),
                why: "no job of the pool waits for the service any more",
            });
            return;
        }
        if p.probe.is_none() && !self.draining {
            let key = p.held.remove(0);
            p.probe = Some(key.clone());
            self.dispatch_again(
                setup,
                &key,
                "a probe of GitHub's service, which refuses the newest runner release (likely an outage)",
                now,
                fx,
            );
        }
        // Looked at again in any case: a probe lost on its way, or a drain, is seen to.
        let due = now.mono + PROBE_WAIT_MAX;
        p.next_probe = Some(due);
        self.refusals.0.insert(pool.clone(), p);
        let what = Deferred::Probe { pool: pool.clone() };
        self.defer(due, what, fx);
    }

    /// A runner of `pool` was seen with a job: GitHub takes its runners again. An outage is
    /// over and every job it held is claimed at once.
    pub(super) fn refusal_passed(
        &mut self,
        setup: &Setup,
        pool: &PoolName,
        now: Now,
        fx: &mut Vec<Effect>,
    ) {
        let Some(p) = self.refusals.0.remove(pool) else {
            return;
        };
        let Some(o) = p.outage else {
            // An old install's jobs keep their own waits.
            self.refusals.0.insert(pool.clone(), p);
            return;
        };
        self.observe(Observation::RefusalOutageOver {
            provider: pool.clone(),
            version: o.version.to_string(),
            why: "GitHub took a runner of the pool again",
        });
        for key in p.held {
            self.dispatch_again(
                setup,
                &key,
                "GitHub takes the pool's runners again: its refusal of the newest release is over",
                now,
                fx,
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probes_wait_a_second_doubling_to_five() {
        let waits: Vec<u64> = (0..6).map(|n| probe_wait(n).as_secs()).collect();
        assert_eq!(waits, [1, 2, 4, 5, 5, 5]);
        assert_eq!(probe_wait(u32::MAX), PROBE_WAIT_MAX);
    }

    #[test]
    fn an_old_install_s_jobs_wait_fifteen_seconds_doubling_to_ten_minutes() {
        let waits: Vec<u64> = [1u8, 2, 3, 4, 6, 255]
            .iter()
            .map(|&n| outdated_wait(n).as_secs())
            .collect();
        assert_eq!(waits, [15, 30, 60, 120, 480, 600]);
    }
}
