//! `PullActor`: pull mode (`webhook.mode = "pull"`), for hosts GitHub cannot reach.
//!
//! No delivery comes in; the actor asks GitHub what changed ([`crate::github::poll`]) and hands
//! every job whose status changed to the intake actor, as a delivery would be, so polls pass the
//! same dedup gate and durable record as webhooks. It polls every `poll_interval` while jobs are
//! queued or running or something changed, and otherwise backs off, doubling, to
//! `poll_idle_interval`. Its spend is capped at `poll_budget` of the `core` limit per rate
//! window: past half the share it spreads what is left over the time to the reset, and when the share
//! is gone it waits for the reset, so claims (and everything else) keep their budget.

use std::time::Duration;

use actix::{Actor, ActorFutureExt, AsyncContext, Context, Recipient, WrapFuture};

use super::actor::{Deliver, Verdict};
use crate::{
    github::{
        actor::{PollAnswer, PollPass},
        poll::PollMemory,
    },
    metrics::Metrics,
    scheduler::messages::{EventSource, JobEvent},
};

/// `[webhook]` settings of pull mode.
#[derive(Debug, Clone, Copy)]
pub struct PullSettings {
    /// While jobs are queued or running.
    pub active: Duration,
    /// The longest interval, while nothing changes.
    pub idle: Duration,
    /// Share of the `core` limit the polls may spend per rate window.
    pub budget: f64,
}

/// The pace of the polls: the backoff and the budget spent in the current rate window.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Pace {
    interval: Option<Duration>,
    window_reset: u64,
    spent: u64,
    /// True while the budget, not activity, sets the interval.
    pub capped: bool,
}

impl Pace {
    /// The wait before the next pass, after one that spent `spent` requests, found changes
    /// (`changed`), with jobs still open (`active`), and left `core` at (remaining, limit,
    /// reset) at unix second `now`.
    pub(crate) fn next(
        &mut self,
        s: &PullSettings,
        spent: u32,
        changed: bool,
        active: bool,
        core: Option<(u64, u64, u64)>,
        now: u64,
    ) -> Duration {
        let base = match self.interval {
            _ if changed || active => s.active,
            None => s.active,
            Some(last) => crate::retry::Doubling::new(s.active, s.idle).following(Some(last)),
        };
        self.interval = Some(base);
        self.capped = false;
        let Some((_, limit, reset)) = core.filter(|(_, limit, reset)| *limit > 0 && *reset > 0)
        else {
            return base;
        };
        if reset != self.window_reset {
            self.window_reset = reset;
            self.spent = 0;
        }
        self.spent += u64::from(spent);
        let cap = (limit as f64 * s.budget).floor() as u64;
        // Until half the share is spent the polls keep their pace; past it, what is left is
        // spread over the time to the reset.
        if self.spent * 2 < cap {
            return base;
        }
        let left = cap.saturating_sub(self.spent);
        let to_reset = reset.saturating_sub(now).max(1);
        // What a pass costs, by the last one (at least one request).
        let per_pass = u64::from(spent.max(1));
        let passes = left / per_pass;
        let floor = if passes == 0 {
            Duration::from_secs(to_reset + 1)
        } else {
            Duration::from_secs_f64(to_reset as f64 / passes as f64)
        };
        if floor > base {
            self.capped = true;
            return floor;
        }
        base
    }
}

/// What the actor talks to.
#[derive(Debug)]
pub struct PullWiring {
    /// Runs a pass.
    pub github: Recipient<PollPass>,
    /// The intake's gate.
    pub intake: Recipient<Deliver>,
}

/// The actor.
#[derive(Debug)]
pub struct PullActor {
    settings: PullSettings,
    wiring: PullWiring,
    metrics: Metrics,
    /// `None` while a pass holds it.
    memory: Option<PollMemory>,
    pace: Pace,
}

impl PullActor {
    /// An actor that polls with `settings`.
    pub fn new(settings: PullSettings, wiring: PullWiring, metrics: Metrics) -> Self {
        PullActor {
            settings,
            wiring,
            metrics,
            memory: Some(PollMemory::default()),
            pace: Pace::default(),
        }
    }

    fn pass(&mut self, ctx: &mut Context<Self>) {
        let Some(memory) = self.memory.take() else {
            return;
        };
        let (github, intake) = (self.wiring.github.clone(), self.wiring.intake.clone());
        let work = async move {
            let answer = match github.send(PollPass(memory)).await {
                Ok(answer) => answer,
                Err(e) => {
                    tracing::error!(error = %e, "pull mode: the GitHub actor is gone");
                    return None;
                }
            };
            // Each event through the intake's gate, in order; one it refused is seen again.
            let mut refused = Vec::new();
            if let Ok(outcome) = &answer.outcome {
                for (action, job) in &outcome.events {
                    let event = JobEvent {
                        delivery_id: Some(format!("poll-{}-{}", job.key.job_id, action.as_str())),
                        action: *action,
                        job: job.clone(),
                        received: crate::clock::mono_now(),
                        source: EventSource::Poll,
                    };
                    match intake.send(Deliver(event)).await {
                        Ok(Verdict::Accepted | Verdict::IgnoredAction | Verdict::Replayed) => {}
                        _ => refused.push(job.key.job_id),
                    }
                }
            }
            Some((answer, refused))
        };
        ctx.spawn(work.into_actor(self).map(|done, act, ctx| {
            let Some((answer, refused)) = done else {
                return;
            };
            act.settle(answer, refused, ctx);
        }));
    }

    fn settle(&mut self, answer: PollAnswer, refused: Vec<u64>, ctx: &mut Context<Self>) {
        let PollAnswer {
            mut memory,
            outcome,
            core,
        } = answer;
        for id in refused {
            memory.forget(id);
        }
        let count = |what: &str, n: u32| {
            self.metrics
                .pull_polls
                .with_label_values(&[what])
                .inc_by(u64::from(n));
        };
        let (spent, changed) = match &outcome {
            Ok(o) => {
                count("changed", o.spent);
                count("unchanged", o.free);
                count("error", o.failed.len() as u32);
                for (repo, e) in &o.failed {
                    tracing::warn!(repo = %repo, error = %e, "pull mode: cannot list this repo's jobs; trying again next poll");
                }
                (o.spent, !o.events.is_empty())
            }
            Err(e) => {
                count("error", 1);
                tracing::warn!(error = %e, "pull mode: cannot list the repos; trying again next poll");
                (1, false)
            }
        };
        let active = memory.open_jobs() > 0;
        self.memory = Some(memory);
        let was_capped = self.pace.capped;
        let wait = self.pace.next(
            &self.settings,
            spent,
            changed,
            active,
            core,
            crate::clock::unix_now(),
        );
        if self.pace.capped && !was_capped {
            tracing::warn!(wait = ?wait, budget = self.settings.budget, "pull mode: the polls reached their share of the core rate limit; polling slower until the reset");
        }
        ctx.run_later(wait, |act, ctx| act.pass(ctx));
    }
}

impl Actor for PullActor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        tracing::info!(interval = ?self.settings.active, idle = ?self.settings.idle, "pull mode: polling GitHub for queued jobs");
        self.pass(ctx);
    }
}

crate::stop_on_request!(PullActor);

#[cfg(test)]
mod tests {
    use super::*;

    const S: PullSettings = PullSettings {
        active: Duration::from_secs(5),
        idle: Duration::from_secs(30),
        budget: 0.2,
    };

    #[test]
    fn idle_polls_back_off_to_the_idle_interval_and_activity_resets_them() {
        let mut p = Pace::default();
        let waits: Vec<u64> = (0..5)
            .map(|_| p.next(&S, 0, false, false, None, 0).as_secs())
            .collect();
        assert_eq!(waits, vec![5, 10, 20, 30, 30]);
        assert_eq!(p.next(&S, 3, true, false, None, 0), S.active);
        assert_eq!(p.next(&S, 0, false, true, None, 0), S.active);
    }

    #[test]
    fn the_budget_spreads_what_is_left_then_waits_for_the_reset() {
        let mut p = Pace::default();
        // Limit 1000: the share is 200 per window; 100 s to the reset.
        let core = Some((900, 1000, 1100));
        // Under half the share: the pace is the activity's.
        assert_eq!(p.next(&S, 90, true, true, core, 1000), S.active);
        assert!(!p.capped);
        // Half spent, 10 requests a pass: 10 passes fit in what is left, every 10 s.
        let wait = p.next(&S, 10, true, true, core, 1000);
        assert!(p.capped);
        assert_eq!(wait, Duration::from_secs(10));
        // The share spent: wait for the reset.
        let wait = p.next(&S, 100, true, true, core, 1000);
        assert_eq!(wait, Duration::from_secs(101));
        // A new window starts over.
        let wait = p.next(&S, 10, true, true, Some((999, 1000, 1150)), 1100);
        assert_eq!(wait, S.active);
        assert!(!p.capped);
    }
}
