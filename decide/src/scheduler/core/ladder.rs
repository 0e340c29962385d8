//! The claim retry ladder. The scheduler owns it: each failed claim's item (attempts, first
//! failure, class, next attempt) lives in its [`RetryQueue`], and every delay is decided here
//! with the failed answer's own rate reading, else the rate actor's latest one (read from its
//! book). The `RetryActor` is only the timer: it is handed the earliest due time of everything
//! timed ([`Effect::ArmTimer`]) and says when it has come ([`Scheduler::on_timer`]).

use super::{Setup, State};
use rand::{SeedableRng, rngs::SmallRng};

use super::{
    Abandon, Effect, Note, ParkReason, Phase, Scheduler, job_table::Rest, observation::Observation,
};
use crate::{
    clock::Now,
    durable::Op,
    job::JobKey,
    rate::RateBook,
    retry::{Backoff, Failure, RetryQueue, Scheduled},
    vocab::{RateBucket, RateSnapshot},
};

/// The ladder: each failed job's item (the one count of its failures), the jitter, and where
/// the rate readings its delays are decided with are read.
#[derive(Debug)]
pub(super) struct Ladder {
    queue: RetryQueue,
    /// Jitter (seeded in tests).
    rng: SmallRng,
    /// The rate actor's book, and each target's credential in it: read, never copied.
    rates: Option<(RateBook, Vec<String>)>,
}

impl Ladder {
    /// An empty ladder climbing `backoff`; `seed` fixes its jitter (the shell passes a random
    /// one, tests a fixed one).
    pub(super) fn new(backoff: Backoff, seed: u64) -> Self {
        Ladder {
            queue: RetryQueue::new(backoff),
            rng: SmallRng::seed_from_u64(seed),
            rates: None,
        }
    }

    /// The items on the ladder.
    pub(super) fn queue(&self) -> &RetryQueue {
        &self.queue
    }

    /// The items on the ladder, to hold, take or remove one.
    pub(super) fn queue_mut(&mut self) -> &mut RetryQueue {
        &mut self.queue
    }

    /// Reads rate readings from `book`, target `t`'s under `credentials[t]`.
    pub(super) fn read_rates(&mut self, book: RateBook, credentials: Vec<String>) {
        self.rates = Some((book, credentials));
    }

    /// The latest reading of `bucket` of target `t`'s credential.
    pub(super) fn reading(&self, t: usize, bucket: RateBucket) -> Option<RateSnapshot> {
        let (book, credentials) = self.rates.as_ref()?;
        book.get(credentials.get(t)?, bucket)
    }

    /// Puts `key` (of target `t`) on the ladder after `failure`, or gives it up. The delay
    /// snaps to a rate reset with the failed answer's own reading, else the latest reading of
    /// the bucket the failing call spent (a claim's is actions_runner_registration when the
    /// answer did not say).
    pub(super) fn record_failure(
        &mut self,
        key: &JobKey,
        t: usize,
        failure: &Failure,
        now: Now,
    ) -> Scheduled {
        let bucket = failure
            .bucket
            .unwrap_or(RateBucket::ActionsRunnerRegistration);
        let reading = failure.reading.or_else(|| self.reading(t, bucket));
        self.queue.record_failure(
            key,
            failure,
            now.mono,
            now.unix,
            reading.as_ref(),
            &mut self.rng,
        )
    }
}

impl Scheduler {
    /// The timer fired: deferred decisions that are due are taken, every ladder item due now
    /// goes back through dispatch, and the pacing's waiting jobs get their tokens. An item
    /// stays on the ladder (in flight) until its attempt resolves, so a retry that fails again
    /// keeps its attempts and first failure.
    pub fn on_timer(&mut self, now: Now) -> Vec<Effect> {
        let mut fx = Vec::new();
        self.state.run_deferred(&self.setup, now, false, &mut fx);
        self.state.offers_due(&self.setup, now, &mut fx);
        self.state.answer_unanswerable(&self.setup, now, &mut fx);
        if self.state.sweep_wake.is_some_and(|at| at <= now.mono) {
            self.state.sweep_wake = None;
            fx.extend(self.state.sweep(&self.setup, now));
        }
        for (key, attempts) in self.state.ladder.queue_mut().pop_due(now.mono) {
            let phase = self.state.jobs.get(&key).map(|r| r.phase().clone());
            if phase != Some(Phase::Retrying) {
                // Resolved while it waited (started elsewhere, completed): nothing to retry.
                self.state.leave_ladder(&key, &mut fx);
                continue;
            }
            if self.state.draining {
                self.state.abandon(
                    &key,
                    Rest::Seen,
                    Note::Abandoned(Abandon::CordonedRetryDropped),
                    now,
                    &mut fx,
                );
                continue;
            }
            let answer = self.state.jobs.admit(&key);
            self.state.moved(&key, answer);
            let t = self.setup.target_index(&key);
            self.state.admission.queue(t, key.clone());
            self.state
                .note(&key, now, Note::RetryDue { attempt: attempts });
        }
        self.state.pump(&self.setup, now, &mut fx);
        // The timer that fired holds nothing now: only the time everything left points to is
        // handed to it, not the steps on the way there.
        fx.retain(|e| !matches!(e, Effect::ArmTimer { .. }));
        self.state.timer = None;
        self.state.rearm_timer(&mut fx);
        fx
    }
}

impl State {
    /// An attempt for the job failed (its claim, its environment, or its runner before the job
    /// started): onto the ladder, or give up. Every path finds the job's one item, so attempts
    /// and the first failure carry over until the job starts or `max_age` gives up.
    pub(super) fn failed(
        &mut self,
        setup: &Setup,
        key: &JobKey,
        failure: Failure,
        now: Now,
        fx: &mut Vec<Effect>,
    ) {
        let Some(rec) = self.jobs.get(key) else {
            return;
        };
        if rec.started_at().is_some() {
            self.abandon(key, Rest::Done, Note::RanElsewhere, now, fx);
            return;
        }
        // The ladder's item counts the job's failures (this one included once it is recorded).
        let attempts = self.ladder.queue().get(key).map_or(0, |i| i.attempts) + 1;
        if !(setup.settings.retry_enabled && failure.class.is_retryable() && !self.draining) {
            self.not_retried(key, &failure, attempts, now, fx);
            return;
        }
        let outcome = self
            .ladder
            .record_failure(key, setup.target_index(key), &failure, now);
        match outcome {
            Scheduled::Retry {
                delay,
                attempts,
                reason,
                class,
                ..
            } => {
                let answer = self.jobs.retry(key);
                self.moved(key, answer);
                self.observe(Observation::RetryScheduled { class });
                if let Some(row) = self
                    .jobs
                    .get(key)
                    .and_then(|rec| self.ladder.queue().row(rec.info(), now.mono, now.unix))
                {
                    self.ops.push(Op::PutRetry(row));
                }
                self.note(
                    key,
                    now,
                    Note::RetryScheduled {
                        attempt: attempts,
                        due_unix: now.unix.saturating_add(delay.as_secs()),
                        delay,
                        reason,
                        class,
                    },
                );
            }
            Scheduled::GaveUp {
                attempts,
                age,
                class,
            } => self.gave_up(key, attempts, age, class, now, fx),
            Scheduled::NotRetryable { class } => {
                unreachable!("a {class} failure was given up before the ladder")
            }
        }
        self.rearm_timer(fx);
    }

    /// A failure that does not go on the ladder: the daemon is cordoned, retries are off, or
    /// the failure's class cannot be helped by trying again (then the job is parked).
    fn not_retried(
        &mut self,
        key: &JobKey,
        failure: &Failure,
        attempts: u32,
        now: Now,
        fx: &mut Vec<Effect>,
    ) {
        let mut park = None;
        let why = if self.draining {
            Abandon::CordonedNoRetry
        } else if !failure.class.is_retryable() {
            park = Some(ParkReason::NotRetryable);
            // Retrying cannot help (a claim GitHub refuses, an environment the engine
            // rejects as invalid): the job's attempts end here, counted as given up.
            self.observe(Observation::RetryGivenUp {
                job_id: key.job_id,
                attempts,
                class: failure.class,
            });
            Abandon::NotRetryable(failure.class)
        } else {
            Abandon::RetryDisabled
        };
        self.abandon(key, Rest::Seen, Note::Abandoned(why), now, fx);
        self.jobs.left_ladder(key, attempts, failure.class);
        // Not forgotten: looked at again on the slow lane (an operator may fix what the
        // claim refused), like a job given up on after `max_age`.
        if let Some(reason) = park {
            self.park(key, reason, now, fx);
        }
    }

    /// The ladder gave up on the job after `max_age`: it is parked for a slower look.
    fn gave_up(
        &mut self,
        key: &JobKey,
        attempts: u32,
        age: std::time::Duration,
        class: crate::vocab::ErrorClass,
        now: Now,
        fx: &mut Vec<Effect>,
    ) {
        // The ladder dropped its item: what it held stays on the record.
        self.jobs.left_ladder(key, attempts, class);
        self.ops.push(Op::DeleteRetry(key.clone()));
        self.observe(Observation::RetryGivenUp {
            job_id: key.job_id,
            attempts,
            class,
        });
        let why = Abandon::GaveUp {
            attempts,
            age_secs: age.as_secs(),
            class,
        };
        self.abandon(key, Rest::Seen, Note::Abandoned(why), now, fx);
        self.park(key, ParkReason::GaveUp, now, fx);
    }

    /// Takes `key` off the ladder, if it is on it (claimed, started elsewhere, abandoned).
    pub(super) fn leave_ladder(&mut self, key: &JobKey, fx: &mut Vec<Effect>) {
        if let Some(item) = self.ladder.queue_mut().remove(key) {
            self.jobs.left_ladder(key, item.attempts, item.class);
            self.ops.push(Op::DeleteRetry(key.clone()));
            self.rearm_timer(fx);
        }
    }

    /// Hands the timer the earliest due time of everything timed (the ladder's next item, a
    /// deferred decision, the claim pacing's next token), when it changed: one timer serves
    /// them all.
    pub(super) fn rearm_timer(&mut self, fx: &mut Vec<Effect>) {
        let next = [
            self.ladder.queue_mut().next_due(),
            self.book.next_due(),
            self.pace_wake,
            self.sweep_wake,
            self.next_offer(),
            // A look answered here is due when it was asked.
            self.unanswerable.iter().map(|(at, _)| *at).min(),
        ]
        .into_iter()
        .flatten()
        .min();
        if next != self.timer {
            self.timer = next;
            fx.push(Effect::ArmTimer { at: next });
        }
    }
}
