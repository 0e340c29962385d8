//! `WebhookActor`: the durable record of accepted jobs, and the scheduler's side of the
//! hand-over. The HTTP edge ([`super::WebhookIntake`]) verifies and parses on the worker
//! threads; a delivery that needs a record before its answer is asked of this actor
//! ([`Deliver`]), which answers with the [`Verdict`]; the others are decided on the worker
//! against the delivery ids both share and reach the scheduler through the outbox this actor
//! empties ([`super::handoff`]).
//!
//! A delivery is accepted in this order: not a replay (a delivery id committed within the
//! window), then a `queued` job is written to the store and the commit awaited (beside the
//! mailbox: the actor keeps handling other deliveries), then the event is handed to the
//! scheduler with `try_send`. Only then is its delivery id remembered and 202 answered. Any
//! other answer leaves nothing behind: a full scheduler mailbox undoes the store row before the
//! 503, a failed commit remembers nothing. After [`Close`] every delivery is answered 503 and
//! nothing is recorded (an embedded instance that was shut down must not swallow GitHub's only
//! delivery of a job).

use std::{sync::Arc, time::Duration};

use actix::{
    Actor, ActorFutureExt, AsyncContext, Context, Handler, Message, Recipient, ResponseActFuture,
    WrapFuture, dev::SendError,
};

use super::handoff::{FLUSH_AFTER, FLUSH_RETRY, Flush, Handoff, OUTBOX_CAPACITY};
use crate::github::signature::SignatureError;
use crate::{
    job::JobAction,
    metrics::Metrics,
    scheduler::messages::JobEvent,
    store::{JobRow, Op, Store},
};

/// How long a delivery id is remembered.
pub const DELIVERY_WINDOW: Duration = Duration::from_secs(60 * 60);
/// At most this many delivery ids are remembered (oldest forgotten first).
pub const DELIVERY_CAPACITY: usize = 65_536;
/// The intake's mailbox; the edge waits for room rather than refusing.
const MAILBOX: usize = 16_384;

/// What the intake decided about one delivery.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// A `workflow_job` handed to the scheduler (202).
    Accepted,
    /// A `workflow_job` with an action the daemon does not act on (202, nothing forwarded).
    IgnoredAction,
    /// `ping` or another event (200).
    OtherEvent,
    /// A delivery id seen within the window (200, nothing forwarded).
    Replayed,
    /// Bad or missing signature (401).
    Unauthorized(SignatureError),
    /// Not JSON (400).
    Malformed(String),
    /// JSON of the wrong shape (422).
    WrongShape(String),
    /// The scheduler's mailbox is full or closed (503).
    Busy,
    /// Fleet mode: the cluster ledger could not record the delivery (503).
    LedgerDown,
    /// The body is over `webhook.max_body` (413).
    TooLarge(usize),
    /// The body did not arrive in time (408).
    SlowBody,
    /// Too many unverified deliveries: of this peer, in all, or a peer that sent bad
    /// signatures just now (429, before the body is read).
    Overloaded,
}

/// A verified, parsed `workflow_job` delivery to accept or refuse.
#[derive(Debug, Clone, Message)]
#[rtype(result = "Verdict")]
pub struct Deliver(pub JobEvent);

/// Stop accepting: every later delivery is answered 503 and nothing more is recorded. The
/// actor lets go of the scheduler and the store.
#[derive(Debug, Clone, Copy, Message)]
#[rtype(result = "()")]
pub struct Close;

/// Ask how many entries each of the intake's collections holds (`GET /api/v1/census`).
#[derive(Debug, Clone, Copy, Message)]
#[rtype(result = "Vec<(&'static str, usize)>")]
pub struct IntakeCensus;

/// Ask how many delivery ids are remembered (tests, status).
#[derive(Debug, Clone, Copy, Message)]
#[rtype(result = "usize")]
pub struct RememberedDeliveries;

/// Of these delivery guids, the ones this intake has not accepted (within its window).
#[derive(Debug, Clone, Message)]
#[rtype(result = "Vec<String>")]
pub struct Unprocessed(pub Vec<String>);

/// GitHub was asked to redeliver these guids: count each that then comes in as recovered.
#[derive(Debug, Clone, Message)]
#[rtype(result = "()")]
pub struct ExpectRedelivery(pub Vec<String>);

/// The intake actor.
#[derive(Debug)]
pub struct WebhookActor {
    /// `None` once closed.
    scheduler: Option<Recipient<JobEvent>>,
    store: Option<Store>,
    metrics: Metrics,
    /// Fleet mode: every job event is recorded in the cluster ledger before it is answered.
    ledger: Option<crate::cluster::Ledger>,
    /// The delivery ids and the outbox, shared with the HTTP workers.
    handoff: Arc<Handoff>,
    /// A flush of the outbox is due: further [`Flush`] wake-ups join it.
    flush_armed: bool,
}

impl WebhookActor {
    /// An intake handing jobs to `scheduler`, recording `queued` jobs in `store` first.
    pub fn new(scheduler: Recipient<JobEvent>, store: Option<Store>, metrics: Metrics) -> Self {
        WebhookActor {
            handoff: Arc::new(Handoff::new(store.is_some(), metrics.clone())),
            scheduler: Some(scheduler),
            store,
            metrics,
            ledger: None,
            flush_armed: false,
        }
    }

    /// Delivery ids are remembered for `window` (`state.retention`; an hour by default), at
    /// most [`DELIVERY_CAPACITY`] of them.
    pub fn with_delivery_window(mut self, window: Duration) -> Self {
        self.unshared().set_window(window);
        self
    }

    /// Jobs no pool with these labels covers are accepted without a durable record.
    pub fn with_coverage(
        mut self,
        pools: impl IntoIterator<Item = crate::vocab::LabelSet>,
    ) -> Self {
        self.unshared().set_coverage(pools.into_iter().collect());
        self
    }

    /// The hand-over's shared half, for the HTTP edge ([`super::WebhookIntake::with_handoff`]):
    /// taken once the builder calls are done.
    pub fn handoff(&self) -> Arc<Handoff> {
        self.handoff.clone()
    }

    /// The hand-over, while only this actor holds it (the builder calls come before
    /// [`Self::handoff`]); a builder call after that starts a new one, which an edge given the
    /// old one does not see.
    fn unshared(&mut self) -> &mut Handoff {
        if Arc::get_mut(&mut self.handoff).is_none() {
            tracing::warn!(
                "the intake was configured after its hand-over was shared; the edge keeps the old one"
            );
            self.handoff = Arc::new(self.handoff.unshared_copy());
        }
        Arc::get_mut(&mut self.handoff).expect("just made unshared")
    }

    /// Passes the outbox to the scheduler, in order. What its full mailbox refuses goes back to
    /// the front and is tried again shortly; the workers answer 503 meanwhile.
    fn flush(&mut self, ctx: &mut Context<Self>) {
        // Not a clone: each clone of a recipient is a sender with a slot of its own beyond the
        // mailbox's capacity.
        let Some(scheduler) = &self.scheduler else {
            return;
        };
        let mut events = std::mem::take(&mut self.handoff.outbox().events);
        let mut refused = false;
        while let Some(event) = events.pop_front() {
            match scheduler.try_send(event) {
                Ok(()) => {}
                Err(SendError::Full(event)) => {
                    events.push_front(event);
                    refused = true;
                    break;
                }
                Err(SendError::Closed(_)) => {
                    tracing::error!(
                        lost = events.len() + 1,
                        "the scheduler stopped with accepted deliveries on their way to it"
                    );
                    events.clear();
                    break;
                }
            }
        }
        {
            let mut outbox = self.handoff.outbox();
            // What came in meanwhile goes after what was refused.
            let later = std::mem::take(&mut outbox.events);
            events.extend(later);
            outbox.events = events;
            outbox.scheduler_full = refused;
        }
        if refused && !self.flush_armed {
            self.flush_armed = true;
            ctx.run_later(FLUSH_RETRY, |act, ctx| {
                act.flush_armed = false;
                act.flush(ctx);
            });
        }
    }

    /// Fleet mode: record every job event in `ledger` (the source of truth) before answering;
    /// a delivery the ledger cannot take is answered 503, so GitHub may redeliver it.
    pub fn with_ledger(mut self, ledger: Option<crate::cluster::Ledger>) -> Self {
        self.unshared().fleet = ledger.is_some();
        self.ledger = ledger;
        self
    }

    /// The end of one delivery: hand it over, remember it, answer. It goes through the outbox
    /// behind the events the workers put there before it, and the outbox is passed on at once,
    /// so the scheduler sees every event in the order it was accepted.
    fn hand_over(
        &mut self,
        event: JobEvent,
        recorded: bool,
        ctx: &mut Context<Self>,
    ) -> ResponseActFuture<Self, Verdict> {
        let action = event.action;
        let delivery_id = event.delivery_id.clone();
        let key = event.job.key.clone();
        // A scheduler that was full at the last flush, a full outbox, or a closed intake:
        // refused.
        let sent = self.scheduler.is_some() && {
            let mut outbox = self.handoff.outbox();
            let room = !outbox.scheduler_full && outbox.events.len() < OUTBOX_CAPACITY;
            if room {
                outbox.events.push_back(event);
            }
            room
        };
        if sent {
            self.flush(ctx);
            if let Some(id) = &delivery_id {
                self.handoff.seen().accepted(id, &self.metrics);
            }
            self.metrics
                .webhook_events
                .with_label_values(&[action.as_str()])
                .inc();
            return Box::pin(actix::fut::ready(Verdict::Accepted));
        }
        // Refused: take the row back out before answering, so a 503 leaves nothing behind.
        let undo = self
            .store
            .clone()
            .filter(|_| recorded)
            .map(|store| async move { store.write(vec![Op::DeleteJob(key)]).await });
        Box::pin(
            async move {
                if let Some(undo) = undo
                    && let Err(e) = undo.await
                {
                    tracing::error!(error = %e, "cannot undo the record of a refused delivery");
                }
            }
            .into_actor(self)
            .map(move |(), act, _| {
                if let Some(id) = &delivery_id {
                    act.handoff.seen().in_flight.remove(id);
                }
                Verdict::Busy
            }),
        )
    }
}

impl Actor for WebhookActor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        ctx.set_mailbox_capacity(MAILBOX);
    }

    fn stopped(&mut self, _: &mut Self::Context) {
        // No one passes the outbox on now: the workers answer 503.
        self.handoff.seen().open = false;
    }
}

impl Handler<Flush> for WebhookActor {
    type Result = ();

    fn handle(&mut self, _: Flush, ctx: &mut Context<Self>) {
        if self.flush_armed {
            return;
        }
        self.flush_armed = true;
        ctx.run_later(FLUSH_AFTER, |act, ctx| {
            act.flush_armed = false;
            act.flush(ctx);
        });
    }
}

impl Handler<Deliver> for WebhookActor {
    type Result = ResponseActFuture<Self, Verdict>;

    fn handle(&mut self, Deliver(event): Deliver, ctx: &mut Context<Self>) -> Self::Result {
        if self.scheduler.is_none() {
            return Box::pin(actix::fut::ready(Verdict::Busy));
        }
        if let Some(id) = &event.delivery_id {
            let mut seen = self.handoff.seen();
            if seen.deliveries.contains(id, crate::clock::mono_now()) {
                return Box::pin(actix::fut::ready(Verdict::Replayed));
            }
            if !seen.in_flight.insert(id.clone()) {
                return Box::pin(actix::fut::ready(Verdict::Busy));
            }
        }
        // The same rules the workers use to give an event to the actor (`Handoff`).
        let record = match &self.store {
            Some(store) if self.handoff.needs_a_local_record(&event) => {
                let store = store.clone();
                let row = JobRow {
                    info: event.job.clone(),
                    received_unix: crate::clock::unix_now(),
                    started_unix: None,
                };
                Some(async move { store.write(vec![Op::AddJob(row)]).await })
            }
            _ => None,
        };
        let ledger = self
            .ledger
            .clone()
            .filter(|_| self.handoff.goes_to_the_ledger(&event));
        // Fleet mode: a job's start or end is recorded with this host's next round trip to
        // the ledger, not before the answer (docs/fleet.md, "What the ledger promises"); a
        // `queued` one is, as the job's only record.
        let ledger = match ledger {
            Some(l)
                if event.action != JobAction::Queued
                    && l.record_later(event.action, &event.job) =>
            {
                None
            }
            other => other,
        };
        if record.is_none() && ledger.is_none() {
            return self.hand_over(event, false, ctx);
        }
        let recorded = record.is_some();
        let (action, job) = (event.action, event.job.clone());
        let commit = async move {
            // Fleet mode: the ledger is the source of truth; what it cannot take is refused.
            if let Some(ledger) = ledger {
                ledger
                    .record(action, &job)
                    .await
                    .map_err(|e| (Verdict::LedgerDown, e.to_string()))?;
            }
            if let Some(record) = record {
                record.await.map_err(|e| (Verdict::Busy, e.to_string()))?;
            }
            Ok(())
        };
        // The commit is awaited beside the mailbox; the actor goes on with other deliveries.
        Box::pin(
            commit
                .into_actor(self)
                .then(move |written, act, ctx| match written {
                    Ok(()) => act.hand_over(event, recorded, ctx),
                    Err((verdict, e)) => {
                        tracing::error!(error = %e, "cannot record the job durably; answering 503 so GitHub may redeliver");
                        if let Some(id) = &event.delivery_id {
                            act.handoff.seen().in_flight.remove(id);
                        }
                        Box::pin(actix::fut::ready(verdict))
                    }
                }),
        )
    }
}

crate::stop_on_request!(WebhookActor);

impl Handler<Close> for WebhookActor {
    type Result = ();

    fn handle(&mut self, _: Close, ctx: &mut Context<Self>) {
        // What was answered 202 goes to the scheduler first; then nothing more is accepted.
        self.handoff.seen().open = false;
        self.flush(ctx);
        self.scheduler = None;
        self.store = None;
    }
}

impl Handler<RememberedDeliveries> for WebhookActor {
    type Result = usize;

    fn handle(&mut self, _: RememberedDeliveries, _: &mut Context<Self>) -> usize {
        self.handoff.seen().deliveries.len()
    }
}

impl Handler<IntakeCensus> for WebhookActor {
    type Result = actix::MessageResult<IntakeCensus>;

    fn handle(&mut self, _: IntakeCensus, _: &mut Context<Self>) -> Self::Result {
        let events = self.handoff.outbox().events.len();
        let seen = self.handoff.seen();
        actix::MessageResult(vec![
            ("webhook.deliveries", seen.deliveries.len()),
            ("webhook.in_flight", seen.in_flight.len()),
            ("webhook.expected", seen.expected_len()),
            ("webhook.outbox", events),
        ])
    }
}

impl Handler<Unprocessed> for WebhookActor {
    type Result = Vec<String>;

    fn handle(&mut self, Unprocessed(guids): Unprocessed, _: &mut Context<Self>) -> Vec<String> {
        let now = crate::clock::mono_now();
        let mut seen = self.handoff.seen();
        guids
            .into_iter()
            .filter(|g| !seen.deliveries.contains(g, now) && !seen.in_flight.contains(g))
            .collect()
    }
}

impl Handler<ExpectRedelivery> for WebhookActor {
    type Result = ();

    fn handle(&mut self, ExpectRedelivery(guids): ExpectRedelivery, _: &mut Context<Self>) {
        self.handoff.seen().expect(guids);
    }
}
