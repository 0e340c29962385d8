//! The orphan sweep (spares, surplus, grace-expired orphans; each checked idle on GitHub first),
//! the drain's teardown of every runner, and pruning of forgotten jobs.

use super::*;
#[allow(unused_imports)]
use crate::config::PoolName;

/// The sweep asks GitHub about one runner at most this often.
pub const IDLE_CHECK_EVERY: Duration = Duration::from_secs(60);

impl Scheduler {
    /// The orphan sweep. An unbound runner older than the grace is reaped (nobody wanted it).
    /// A *spare* (an unbound runner whose own job ran elsewhere) covers one unit of uncovered
    /// demand (a queued job its labels cover that no live runner was made for), newest spare
    /// first; the surplus is reaped at once instead of waiting out the grace. Reaped runners are
    /// deleted on GitHub when they report their exit (they never ran a job).
    pub fn sweep(&mut self, now: Now) -> Vec<Effect> {
        let mut fx = Vec::new();
        let Some(grace) = self.settings.orphan_grace else {
            return fx;
        };
        // The uncovered demand is counted only when a spare is there to weigh against it: it
        // walks every tracked job, and the sweep runs on every `completed`.
        let mut demand: Option<Vec<(JobKey, LabelSet)>> = None;
        let mut unbound: Vec<&RunnerRecord> = self
            .runners
            .values()
            .filter(|r| r.bound.is_none() && !r.seen_busy && !r.tearing_down)
            .collect();
        unbound.sort_by(|a, b| b.created_at.cmp(&a.created_at).then(a.name.cmp(&b.name)));
        let mut reap: Vec<(String, PoolName, JobKey, &'static str)> = Vec::new();
        for r in unbound {
            let intent_started = self
                .jobs
                .get(&r.intent)
                .is_none_or(|j| j.started_at.is_some());
            if intent_started {
                let offered = self
                    .provider_index(&r.provider)
                    .map(|i| self.provider_sets[i].clone())
                    .unwrap_or_default();
                let demand = demand.get_or_insert_with(|| self.uncovered_demand());
                if let Some(pos) = demand.iter().position(|(_, wanted)| offered.covers(wanted)) {
                    demand.remove(pos);
                    continue;
                }
                reap.push((
                    r.name.clone(),
                    r.provider.clone(),
                    r.intent.clone(),
                    "spare runner: its job ran elsewhere and no queued job needs it",
                ));
            } else if now.mono.saturating_duration_since(r.created_at) >= grace {
                reap.push((
                    r.name.clone(),
                    r.provider.clone(),
                    r.intent.clone(),
                    "orphan: no job took it within the grace",
                ));
            }
        }
        for (name, _, _, why) in reap {
            let Some(r) = self.runners.get_mut(name.as_str()) else {
                continue;
            };
            // The sweep runs on every `completed` in the org: without this, one runner whose
            // `in_progress` was lost would cost a GET per completed job.
            let recently = r
                .idle_checked_at
                .is_some_and(|t| now.mono.saturating_duration_since(t) < IDLE_CHECK_EVERY);
            if r.idle_check_pending || recently {
                continue;
            }
            r.idle_checked_at = Some(now.mono);
            r.idle_check_pending = true;
            fx.push(Effect::CheckIdle {
                owner: r.intent.owner.to_string(),
                runner_id: r.id,
                repo: r.repo.clone(),
                name,
                reason: why,
            });
        }
        fx
    }

    /// Queued demand no live runner was made for: each job that has not started, is not past
    /// the zombie cap, is waiting, claiming, retrying or active, and whose own runner (if any)
    /// is no longer free to take it; sorted, with the labels it wants.
    fn uncovered_demand(&self) -> Vec<(JobKey, LabelSet)> {
        // A job still needs a runner if it has not started and no runner made for it is still
        // free to take it (its own runner may have been given a sibling).
        let has_free_runner = |j: &JobRecord| match &j.phase {
            Phase::Active { runner, .. } => {
                self.runners.get(runner).is_some_and(|r| r.bound.is_none())
            }
            _ => false,
        };
        let mut demand: Vec<(JobKey, LabelSet)> = self
            .jobs
            .values()
            .filter(|j| {
                j.started_at.is_none()
                    && j.admissions <= self.settings.zombie_cap
                    && matches!(
                        j.phase,
                        Phase::Pending
                            | Phase::Claiming { .. }
                            | Phase::Retrying
                            | Phase::Active { .. }
                    )
                    && !has_free_runner(j)
            })
            .map(|j| (j.info.key.clone(), LabelSet::new(&j.info.labels)))
            .collect();
        demand.sort();
        demand
    }

    /// GitHub's answer about a runner the sweep would reap: its registration deleted (it was
    /// not busy, or GitHub no longer knew it) and it is torn down; or it is busy and kept.
    pub fn on_idle_checked(
        &mut self,
        name: &str,
        busy: Result<bool, GithubError>,
        reason: &'static str,
        now: Now,
    ) -> Vec<Effect> {
        let mut fx = Vec::new();
        self.observe(Observation::SweepChecked {
            result: match &busy {
                Ok(false) => "idle",
                Ok(true) => "busy",
                Err(_) => "error",
            },
        });
        let Some(r) = self.runners.get_mut(name) else {
            return fx;
        };
        r.idle_check_pending = false;
        if r.bound.is_some() {
            return fx;
        }
        r.seen_busy = matches!(busy, Ok(true));
        r.registration_deleted = matches!(busy, Ok(false));
        r.tearing_down |= matches!(busy, Ok(false));
        let (provider, intent) = (r.provider.clone(), r.intent.clone());
        let handle = self.runner_handle(name);
        match busy {
            Ok(false) => {
                self.observe(Observation::Reaping {
                    runner: name.to_string(),
                    provider: provider.clone(),
                    reason,
                });
                self.note(
                    &intent,
                    now,
                    Note::Reaped {
                        runner: handle,
                        reason,
                    },
                );
                fx.push(Effect::Teardown {
                    provider,
                    name: name.to_string(),
                    reason,
                });
            }
            Ok(true) => self.observe(Observation::Keeping {
                runner: name.to_string(),
                why: "it looked idle but GitHub says it is busy".into(),
            }),
            Err(e) => self.observe(Observation::Keeping {
                runner: name.to_string(),
                why: format!("cannot check it ({}): {e}", e.class()),
            }),
        }
        fx
    }

    /// Tears down every runner (the end of a drain). Runners that never ran a job are deleted
    /// on GitHub when they report their exit.
    pub fn teardown_all(&mut self, now: Now) -> Vec<Effect> {
        let mut fx = Vec::new();
        let runners: Vec<(Arc<str>, JobKey)> = self
            .runners
            .iter()
            .map(|(name, r)| (name.clone(), r.intent.clone()))
            .collect();
        for (name, intent) in runners {
            self.tear_down(&intent, &name, "shutdown timeout reached", now, &mut fx);
        }
        fx
    }

    /// Asks the provisioner of runner `name` (of ours) to stop it, noting why on `key`.
    pub(super) fn tear_down(
        &mut self,
        key: &JobKey,
        name: &str,
        reason: &'static str,
        now: Now,
        fx: &mut Vec<Effect>,
    ) {
        let Some(r) = self.runners.get_mut(name) else {
            return;
        };
        r.tearing_down = true;
        let provider = r.provider.clone();
        let handle = self.runner_handle(name);
        self.note(
            key,
            now,
            Note::TearingDown {
                runner: handle,
                reason,
            },
        );
        fx.push(Effect::Teardown {
            provider,
            name: name.to_string(),
            reason,
        });
    }

    /// Forgets jobs whose dedup and started windows have passed.
    pub fn prune(&mut self, now: Now) {
        let seen_ttl = self.settings.seen_ttl;
        let started_ttl = self.settings.started_ttl;
        let referenced: std::collections::HashSet<&JobKey> = self
            .runners
            .values()
            .flat_map(|r| std::iter::once(&r.intent).chain(r.bound.as_ref()))
            .collect();
        let expired = |at: Option<Instant>, ttl: Duration| {
            at.is_none_or(|t| now.mono.saturating_duration_since(t) >= ttl)
        };
        let gone: Vec<JobKey> = self
            .jobs
            .iter()
            .filter(|(k, r)| {
                matches!(
                    r.phase,
                    Phase::Seen | Phase::Unroutable | Phase::Ignored | Phase::Done
                ) && expired(r.seen_at, seen_ttl)
                    && expired(r.started_at, started_ttl)
                    && !referenced.contains(k)
            })
            .map(|(k, _)| k.clone())
            .collect();
        for k in gone {
            self.jobs.remove(&k);
            self.ops.push(Op::DeleteJob(k.clone()));
        }
        self.recent_runners
            .retain(|_, (_, _, gone, _)| now.mono.saturating_duration_since(*gone) < seen_ttl);
        self.shared.prune();
    }
}
