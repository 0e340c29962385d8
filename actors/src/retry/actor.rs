//! `RetryActor`: a thin shell over [`RetryQueue`] that keeps exactly one `run_later` armed, for
//! the earliest due item, and re-arms it whenever the head changes.
//!
//! One timer, not one per job: actix polls every spawned future of a context on each wake, so a
//! timer per job would make every message cost O(jobs). When the timer fires, every due item is
//! handed to the scheduler (`RetryDue`) and stays indexed until its attempt resolves. Every
//! decision is reported back (`RetryDecided`) so the scheduler's timeline says why.

use actix::{
    Actor, AsyncContext, Context, Handler, Message, MessageResult, Recipient, SpawnHandle,
};
use rand::{SeedableRng, rngs::SmallRng};
use serde::Serialize;
use tokio::time::Instant;

use super::{
    backoff::Backoff,
    queue::{Failure, RetryQueue, RetryView, Scheduled},
};
use crate::{
    clock::Clock,
    job::{JobInfo, JobKey},
    metrics::Metrics,
    rate::RateSnapshot,
    scheduler::messages::{RetryDecided, RetryDue},
    store::{Op, Store},
};

/// Put a failed claim on the ladder.
#[derive(Debug, Clone, Message)]
#[rtype(result = "()")]
pub struct ScheduleRetry {
    /// The job.
    pub job: JobInfo,
    /// The failure.
    pub failure: Failure,
    /// The latest rate reading of the credential, when the failure was a rate limit.
    pub rate: Option<RateSnapshot>,
}

/// Take a job off the ladder (claimed, started elsewhere, abandoned).
#[derive(Debug, Clone, Message)]
#[rtype(result = "()")]
pub struct CancelRetry {
    /// The job.
    pub key: JobKey,
}

/// Ask for the queue's contents.
#[derive(Debug, Clone, Message)]
#[rtype(result = "RetryQueueView")]
pub struct GetRetryQueue;

/// The queue's contents.
#[derive(Debug, Clone, Serialize)]
pub struct RetryQueueView {
    /// Items waiting for their next attempt.
    pub depth: usize,
    /// Timers armed right now (0 or 1, whatever the depth).
    pub armed_timers: usize,
    /// Seconds until the armed timer fires.
    pub next_due_in_secs: Option<f64>,
    /// Every item, waiting or in flight.
    pub items: Vec<RetryView>,
}

/// Where the retry actor reports.
#[derive(Debug, Clone)]
pub struct RetrySink {
    /// Due items.
    pub due: Recipient<RetryDue>,
    /// Decisions.
    pub decided: Recipient<RetryDecided>,
}

/// The ladder's timer.
#[derive(Debug)]
pub struct RetryActor {
    queue: RetryQueue,
    clock: Clock,
    rng: SmallRng,
    sink: RetrySink,
    metrics: Metrics,
    armed: Option<(SpawnHandle, Instant)>,
    store: Option<Store>,
}

impl RetryActor {
    /// A retry actor climbing `backoff`; `seed` fixes the jitter for tests.
    pub fn new(
        backoff: Backoff,
        sink: RetrySink,
        metrics: Metrics,
        clock: Clock,
        seed: Option<u64>,
    ) -> Self {
        RetryActor {
            queue: RetryQueue::new(backoff),
            clock,
            rng: SmallRng::seed_from_u64(seed.unwrap_or_else(rand::random)),
            sink,
            metrics,
            armed: None,
            store: None,
        }
    }

    /// Makes the ladder durable in `store`, starting from the items it held.
    pub fn with_store(mut self, store: Store, rows: &[crate::store::RetryRow]) -> Self {
        let now = self.clock.tick();
        self.queue.restore(rows, now.mono, now.unix);
        self.store = Some(store);
        self
    }

    fn persist(&self, op: Op) {
        if let Some(store) = &self.store {
            store.send(vec![op]);
        }
    }

    /// Arms the one timer for the earliest due item, if that changed.
    fn rearm(&mut self, ctx: &mut Context<Self>) {
        self.metrics
            .retry_queue_depth
            .set(i64::try_from(self.queue.len()).unwrap_or(i64::MAX));
        let next = self.queue.next_due();
        if self.armed.as_ref().map(|(_, at)| *at) == next {
            return;
        }
        if let Some((handle, _)) = self.armed.take() {
            ctx.cancel_future(handle);
        }
        if let Some(at) = next {
            let delay = at.saturating_duration_since(self.clock.now());
            let handle = ctx.run_later(delay, |act, ctx| {
                act.armed = None;
                act.fire(ctx);
            });
            self.armed = Some((handle, at));
        }
    }

    fn fire(&mut self, ctx: &mut Context<Self>) {
        for (job, attempts) in self.queue.pop_due(self.clock.now()) {
            self.sink.due.do_send(RetryDue { job, attempts });
        }
        self.rearm(ctx);
    }
}

impl Actor for RetryActor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        ctx.set_mailbox_capacity(100_000);
        // Restart and first start share this path: arm from whatever the queue holds.
        self.armed = None;
        self.rearm(ctx);
    }
}

impl Handler<ScheduleRetry> for RetryActor {
    type Result = ();

    fn handle(&mut self, m: ScheduleRetry, ctx: &mut Context<Self>) {
        let key = m.job.key.clone();
        let now = self.clock.tick();
        let outcome = self.queue.record_failure(
            m.job,
            &m.failure,
            now.mono,
            now.unix,
            m.rate.as_ref(),
            &mut self.rng,
        );
        match &outcome {
            Scheduled::Retry { class, .. } => {
                self.metrics
                    .retry_attempts
                    .with_label_values(&[class.as_str()])
                    .inc();
                if let Some(row) = self.queue.row(&key, now.mono, now.unix) {
                    self.persist(Op::PutRetry(row));
                }
            }
            Scheduled::GaveUp { .. } => {
                self.metrics.retry_given_up.inc();
                self.persist(Op::DeleteRetry(key.clone()));
            }
            Scheduled::NotRetryable { .. } => self.persist(Op::DeleteRetry(key.clone())),
        }
        self.sink.decided.do_send(RetryDecided { key, outcome });
        self.rearm(ctx);
    }
}

impl Handler<CancelRetry> for RetryActor {
    type Result = ();

    fn handle(&mut self, m: CancelRetry, ctx: &mut Context<Self>) {
        if self.queue.remove(&m.key) {
            self.persist(Op::DeleteRetry(m.key));
            self.rearm(ctx);
        }
    }
}

impl Handler<GetRetryQueue> for RetryActor {
    type Result = MessageResult<GetRetryQueue>;

    fn handle(&mut self, _: GetRetryQueue, _: &mut Context<Self>) -> Self::Result {
        let now = self.clock.now();
        MessageResult(RetryQueueView {
            depth: self.queue.len(),
            armed_timers: usize::from(self.armed.is_some()),
            next_due_in_secs: self
                .armed
                .as_ref()
                .map(|(_, at)| at.saturating_duration_since(now).as_secs_f64()),
            items: self.queue.views(now),
        })
    }
}
