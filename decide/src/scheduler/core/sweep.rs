//! The orphan sweep (spares, surplus, grace-expired orphans; each checked idle on GitHub first),
//! the drain's teardown of every runner, and pruning of forgotten jobs.

use super::{
    Effect, Note, Scheduler, job_table::JobTable, observation::Observation, runner_book::RunnerBook,
};
use super::{Setup, State};
use crate::{clock::Instant, config::PoolName};
use crate::{clock::Now, durable::Op, github::GithubError, job::JobKey, retry::Doubling};
use std::{collections::HashSet, sync::Arc, time::Duration};

/// The sweep asks GitHub about one runner at most this often.
pub const IDLE_CHECK_EVERY: Duration = Duration::from_secs(60);
/// A busy check GitHub failed to answer (a 5xx, a dropped connection) is asked again this
/// soon, from a timer of its own: a registration left after the last job is a leak until
/// the next check, and the sweep's own interval is longer.
pub const IDLE_RETRY_AFTER_ERROR: Duration = Duration::from_secs(10);

/// A runner up this long, unbound, its job not seen started, has its job looked at on GitHub;
/// again after twice as long, and so on (30 s, 1 min, 2 min, ... after it came up or was
/// handed its job). A JIT runner that is up takes a queued job within seconds, so one that
/// sits idle this long most likely waits for a job that ran elsewhere and whose events never
/// reached this host (delivered to a fleet host killed before it wrote them, or lost on the
/// way). Looked at, the job is marked started and the runner becomes a spare the sweep
/// deletes, instead of staying registered for the whole orphan grace.
pub const UNBOUND_LOOK_AFTER: Duration = Duration::from_secs(30);
/// The looks after the first: again after 1, 2, 4 minutes, ... while the job stays queued,
/// doubling up to 256 times the first wait.
const LOOK_AGAIN: Doubling = Doubling::new(
    UNBOUND_LOOK_AFTER,
    Duration::from_secs(UNBOUND_LOOK_AFTER.as_secs() * 256),
);

/// Why the sweep reaps a spare: its job ran elsewhere and no waiting job can use it.
pub const REAP_SPARE: &str = "spare runner: its job ran elsewhere and no queued job needs it";
/// How long a runner made for a scale set's job that the service withdrew before any runner
/// took it is kept as a spare: the service assigns the job again moments later (the
/// withdrawal and the new assignment come in consecutive messages, ARC#4602), and the runner
/// already on its way serves it. A job cancelled for good looks the same in its message, so
/// its runner waits this long for nothing: kept short.
pub const REASSIGN_GRACE: std::time::Duration = std::time::Duration::from_secs(20);
/// Why the runner made for a job cancelled before any runner took it goes (once GitHub agrees
/// it runs nothing).
pub const REAP_CANCELLED: &str = "its job was cancelled before any runner took it";
/// Why the sweep reaps an orphan: no job took it within the grace (the zombie signal).
pub const REAP_ORPHAN: &str = "orphan: no job took it within the grace";

/// The runners the sweep would reap, by name, each with why, in name order: unbound spares
/// (but a registered pool's, which its warm keeping counts) and runners idle for their own job
/// past `grace` (orphans), neither busy nor on its way out nor kept for a moment longer.
pub(super) fn reaps(
    book: &RunnerBook,
    jobs: &JobTable,
    keeps_warm: impl Fn(&PoolName) -> bool,
    grace: Duration,
    now: Instant,
) -> Vec<(String, &'static str)> {
    let mut reap: Vec<(String, &'static str)> = book
        .runners()
        .filter(|r| !(keeps_warm(&r.provider) && jobs.is_spare(r)))
        .filter(|r| r.bound.is_none() && !r.seen_busy() && !r.tearing_down())
        .filter(|r| r.kept_until().is_none_or(|until| until <= now))
        .filter_map(|r| {
            if jobs.is_spare(r) {
                Some((r.name.clone(), REAP_SPARE))
            } else if now.saturating_duration_since(r.intent_since()) >= grace {
                Some((r.name.clone(), REAP_ORPHAN))
            } else {
                None
            }
        })
        .collect();
    reap.sort();
    reap
}

impl Scheduler {
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
        self.state.observe(Observation::SweepChecked {
            result: match &busy {
                Ok(false) => "idle",
                Ok(true) => "busy",
                Err(_) => "error",
            },
        });
        let retry_at = now.mono + IDLE_RETRY_AFTER_ERROR;
        let Some(answer) =
            self.state
                .book
                .idle_answered(name, busy.as_ref().ok().copied(), retry_at)
        else {
            return fx;
        };
        if busy.is_err() {
            self.state.wake_sweep_at(retry_at, &mut fx);
        }
        if answer.bound {
            return fx;
        }
        let (provider, intent) = (answer.provider, answer.intent);
        let handle = self.state.runner_handle(name);
        match busy {
            Ok(false) => {
                self.state.observe(Observation::Reaping {
                    runner: name.to_string(),
                    provider: provider.clone(),
                    reason,
                });
                self.state.note(
                    &intent,
                    now,
                    Note::Reaped {
                        runner: handle,
                        reason,
                    },
                );
                if reason == REAP_ORPHAN {
                    self.state
                        .idle_reaped(&self.setup, &intent, name, now, &mut fx);
                }
                fx.push(Effect::Teardown {
                    provider,
                    name: name.to_string(),
                    reason,
                });
            }
            Ok(true) => self.state.observe(Observation::Keeping {
                runner: name.to_string(),
                why: "it looked idle but GitHub says it is busy".into(),
            }),
            Err(e) => self.state.observe(Observation::Keeping {
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
            .state
            .book
            .entries()
            .map(|(name, r)| (name.clone(), r.intent.clone()))
            .collect();
        for (name, intent) in runners {
            self.state
                .tear_down(&intent, &name, "shutdown timeout reached", now, &mut fx);
        }
        fx
    }

    /// Forgets jobs whose dedup and started windows have passed (and no runner points at),
    /// and runners gone longer than the dedup window.
    pub fn prune(&mut self, now: Now) {
        let referenced: HashSet<&JobKey> = self
            .state
            .book
            .runners()
            .flat_map(|r| std::iter::once(&r.intent).chain(r.bound.as_ref()))
            .collect();
        let ttl = super::job_table::Ttl {
            seen: self.setup.settings.seen_ttl,
            started: self.setup.settings.started_ttl,
            done: self.setup.settings.retention,
        };
        let gone = self.state.jobs.prune(now, ttl, &referenced);
        self.state.admission.prune_shared();
        self.state.ops.extend(gone.into_iter().map(Op::DeleteJob));
        self.state.book.prune_recent(now.mono, ttl.seen);
        self.state.prune_usage(&self.setup, now);
    }
}

impl State {
    /// The orphan sweep ([`Scheduler::sweep`]).
    pub(super) fn sweep(&mut self, setup: &Setup, now: Now) -> Vec<Effect> {
        let mut fx = Vec::new();
        self.rebalance(setup, now, &mut fx);
        self.look_for_idle_runners(setup, now, &mut fx);
        let Some(grace) = setup.settings.orphan_grace else {
            return fx;
        };
        // A registered pool's spares are its warm runners, kept or rotated by `keep_warm`.
        if setup.any_registered_warm() {
            self.pump(setup, now, &mut fx);
        }
        // A scale set's spare waits a moment before it goes: the slot its job held at the
        // service frees when that job ends elsewhere, and the service assigns the next job
        // it holds back to the pool at once; a runner already up serves it, where a new one
        // could boot slower than the assignment's window.
        if setup.settings.scaleset {
            self.keep_spares_a_moment(now, &mut fx);
        }
        let reap = reaps(
            &self.book,
            &self.jobs,
            |pool| setup.keeps_warm(pool),
            grace,
            now.mono,
        );
        for (name, why) in reap {
            self.ask_idle(&name, why, now, &mut fx);
        }
        fx
    }

    /// Gives each spare not kept yet [`REASSIGN_GRACE`] before the sweep reaps it (scale-set
    /// mode: see `sweep`). A spare handed to a job and spare again gets it anew.
    fn keep_spares_a_moment(&mut self, now: Now, fx: &mut Vec<Effect>) {
        let fresh: Vec<String> = self
            .book
            .runners()
            .filter(|r| r.kept_until().is_none() && self.jobs.is_spare(r))
            .map(|r| r.name.clone())
            .collect();
        let until = now.mono + REASSIGN_GRACE;
        for name in &fresh {
            self.book.keep_until(name, until);
        }
        if !fresh.is_empty() {
            self.wake_sweep_at(until, fx);
        }
    }

    /// Looks on GitHub at the job of each runner that has sat up and unbound for it longer
    /// than its next [`UNBOUND_LOOK_AFTER`] step (`on_job_looked` marks a job GitHub says
    /// started or finished, which makes its runner a spare), and wakes the sweep for the next
    /// step due. Warm intents and scale-set placeholders have no job to look at.
    fn look_for_idle_runners(&mut self, setup: &Setup, now: Now, fx: &mut Vec<Effect>) {
        let mut next: Option<crate::clock::Instant> = None;
        let mut due = Vec::new();
        for r in self.book.runners() {
            let Some(up) = r.started_at() else { continue };
            if r.bound.is_some()
                || r.seen_busy()
                || r.tearing_down()
                || r.intent.is_warm()
                || r.intent.is_reckoned()
                || self.jobs.is_spare(r)
            {
                continue;
            }
            let at = r
                .look_due()
                .unwrap_or_else(|| up.max(r.intent_since()) + UNBOUND_LOOK_AFTER);
            if at <= now.mono {
                due.push(r.name.clone());
            } else {
                next = Some(next.map_or(at, |n| n.min(at)));
            }
        }
        for name in due {
            // Look n is followed by look n + 1 after 30 s doubled n times.
            let Some((at, key)) = self.book.looked(name.as_str(), |looks| {
                now.mono + LOOK_AGAIN.after(u32::from(looks) + 1, 0.0)
            }) else {
                continue;
            };
            next = Some(next.map_or(at, |n| n.min(at)));
            let Some(job) = self.jobs.get(&key) else {
                continue;
            };
            if job.info().repo.is_empty() {
                continue;
            }
            let repo = job.info().repo.to_string();
            self.ask_where(setup, key, repo, now, fx);
        }
        if let Some(at) = next {
            self.wake_sweep_at(at, fx);
        }
    }

    /// Makes the sweep run by `at` (on the one timer), unless it runs sooner already.
    pub(super) fn wake_sweep_at(&mut self, at: crate::clock::Instant, fx: &mut Vec<Effect>) {
        self.sweep_wake = Some(self.sweep_wake.map_or(at, |w| w.min(at)));
        self.rearm_timer(fx);
    }

    /// Asks GitHub to delete runner `name`'s registration unless it is busy (`CheckIdle`), at
    /// most once a minute and never while an answer is outstanding: the sweep runs on every
    /// `completed` in the org, and without this one runner whose `in_progress` was lost would
    /// cost a call per completed job.
    pub(super) fn ask_idle(
        &mut self,
        name: &str,
        reason: &'static str,
        now: Now,
        fx: &mut Vec<Effect>,
    ) {
        let Some(r) = self.book.ask_idle(name, now.mono, IDLE_CHECK_EVERY) else {
            return;
        };
        fx.push(Effect::CheckIdle {
            owner: r.intent.owner.to_string(),
            runner_id: r.id,
            repo: r.repo.clone(),
            name: name.to_string(),
            reason,
        });
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
        let Some(provider) = self.book.tear_down(name) else {
            return;
        };
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
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{durable::RunnerRow, job::JobInfo};

    fn runner(book: &mut RunnerBook, name: &str, pool: &str, job: u64, made: Instant) {
        let row = RunnerRow {
            name: name.into(),
            id: job,
            provider: PoolName::from(pool),
            repo: None,
            intent: JobKey::new("acme", job),
            bound: None,
            created_unix: 0,
        };
        book.insert(Arc::from(name), super::super::RunnerRecord::new(row, made));
    }

    fn active_on(jobs: &mut JobTable, job: u64, runner: &str, at: Instant) {
        let phase = super::super::Phase::Active {
            provider: PoolName::from("local"),
            runner: Arc::from(runner),
        };
        let info = JobInfo {
            key: JobKey::new("acme", job),
            ..JobInfo::default()
        };
        jobs.insert(
            info.key.clone(),
            super::super::JobRecord::in_phase(info, phase, at),
        );
    }

    #[test]
    fn the_sweep_reaps_spares_and_orphans_past_the_grace_and_nothing_busy_kept_or_warm() {
        let t0 = Instant::now();
        let now = t0 + Duration::from_secs(1000);
        let grace = Duration::from_secs(600);
        let (mut book, mut jobs) = (RunnerBook::default(), JobTable::default());
        // A spare: its job has no record (ran elsewhere, forgotten).
        runner(&mut book, "spare", "local", 1, t0);
        // An orphan: its job still waits on it, past the grace.
        runner(&mut book, "orphan", "local", 2, t0);
        active_on(&mut jobs, 2, "orphan", t0);
        // Young: its job waits on it, inside the grace.
        runner(
            &mut book,
            "young",
            "local",
            3,
            now - Duration::from_secs(10),
        );
        active_on(&mut jobs, 3, "young", t0);
        // Bound to a job, busy on GitHub, tearing down, kept a moment: left alone.
        runner(&mut book, "bound", "local", 4, t0);
        book.named("bound", None, &JobKey::new("acme", 40));
        runner(&mut book, "busy", "local", 5, t0);
        book.ask_idle("busy", t0, Duration::from_secs(60));
        book.idle_answered("busy", Some(true), t0);
        runner(&mut book, "going", "local", 6, t0);
        book.tear_down("going");
        runner(&mut book, "kept", "local", 7, t0);
        book.keep_until("kept", now + Duration::from_secs(5));
        // A registered pool's spare: its warm keeping counts it.
        runner(&mut book, "warm", "registered", 8, t0);
        let reap = reaps(&book, &jobs, |p| p.as_str() == "registered", grace, now);
        assert_eq!(
            reap,
            [
                ("orphan".to_string(), REAP_ORPHAN),
                ("spare".to_string(), REAP_SPARE)
            ]
        );
        book.keep_until("kept", now);
        let later = reaps(&book, &jobs, |_| false, grace, now);
        let names: Vec<&str> = later.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(
            names,
            ["kept", "orphan", "spare", "warm"],
            "a keep that ran out, and a pool that keeps no warm runners"
        );
    }
}
