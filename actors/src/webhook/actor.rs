//! `WebhookActor`: the owner of the durable record of accepted jobs and, through its
//! [`Gate`], of delivery-id dedup. The HTTP edge ([`super::WebhookIntake`]) verifies and parses
//! on the worker threads, decides there what needs no durable record ([`Gate::quick`]) and asks
//! this actor ([`Deliver`]) about the rest; the actor answers with the [`Verdict`].
//!
//! A delivery the actor takes is accepted in this order: not a replay (a delivery id committed within the
//! window), then a `queued` job is written to the store and the commit awaited (beside the
//! mailbox: the actor keeps handling other deliveries), then the event is handed to the
//! scheduler with `try_send`. Only then is its delivery id remembered and 202 answered. Any
//! other answer leaves nothing behind: a full scheduler mailbox undoes the store row before the
//! 503, a failed commit remembers nothing. After [`Close`] every delivery is answered 503 and
//! nothing is recorded (an embedded instance that was shut down must not swallow GitHub's only
//! delivery of a job).

use std::{sync::Arc, time::Duration};

use actix::{
    Actor, ActorFutureExt, Addr, Context, Handler, Message, Recipient, ResponseActFuture,
    WrapFuture,
};

use super::gate::{Gate, Policy};
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
    scheduler: Recipient<JobEvent>,
    store: Option<Store>,
    metrics: Metrics,
    /// Fleet mode: every job event is recorded in the cluster ledger before it is answered.
    ledger: Option<crate::cluster::Ledger>,
    coverage: Option<Vec<crate::vocab::LabelSet>>,
    /// Built at the start from the fields above.
    gate: Option<Arc<Gate>>,
}

/// A started intake actor and the gate its edge decides quick deliveries with.
#[derive(Debug, Clone)]
pub struct IntakeHandle {
    addr: Addr<WebhookActor>,
    gate: Arc<Gate>,
}

impl IntakeHandle {
    /// The actor.
    pub fn addr(&self) -> &Addr<WebhookActor> {
        &self.addr
    }

    pub(super) fn gate(&self) -> &Arc<Gate> {
        &self.gate
    }
}

impl WebhookActor {
    /// An intake handing jobs to `scheduler`, recording `queued` jobs in `store` first.
    pub fn new(scheduler: Recipient<JobEvent>, store: Option<Store>, metrics: Metrics) -> Self {
        WebhookActor {
            scheduler,
            store,
            metrics,
            ledger: None,
            coverage: None,
            gate: None,
        }
    }

    /// Jobs no pool with these labels covers are accepted without a durable record (the
    /// scheduler remembers them as seen, in memory; losing one in a crash loses nothing, since
    /// it could not be claimed here).
    pub fn with_coverage(
        mut self,
        pools: impl IntoIterator<Item = crate::vocab::LabelSet>,
    ) -> Self {
        self.coverage = Some(pools.into_iter().collect());
        self
    }

    /// Fleet mode: record every job event in `ledger` (the source of truth) before answering;
    /// a delivery the ledger cannot take is answered 503, so GitHub may redeliver it.
    pub fn with_ledger(mut self, ledger: Option<crate::cluster::Ledger>) -> Self {
        self.ledger = ledger;
        self
    }

    /// Starts the actor; the handle builds its HTTP edge.
    pub fn spawn(mut self) -> IntakeHandle {
        let gate = self.gate();
        IntakeHandle {
            addr: self.start(),
            gate,
        }
    }

    fn gate(&mut self) -> Arc<Gate> {
        let (scheduler, metrics) = (&self.scheduler, &self.metrics);
        let policy = || Policy {
            durable: self.store.is_some(),
            ledger: self.ledger.is_some(),
            coverage: self.coverage.clone(),
        };
        self.gate
            .get_or_insert_with(|| Arc::new(Gate::new(scheduler.clone(), policy(), metrics)))
            .clone()
    }

    /// The end of a recorded delivery: hand it over, or take its store row back out.
    fn hand_over(&mut self, event: JobEvent, stored: bool) -> ResponseActFuture<Self, Verdict> {
        let key = event.job.key.clone();
        let verdict = self.gate().hand_over(event);
        if verdict == Verdict::Accepted {
            return Box::pin(actix::fut::ready(verdict));
        }
        // Refused: take the row back out before answering, so a 503 leaves nothing behind.
        let undo = self
            .store
            .clone()
            .filter(|_| stored)
            .map(|store| async move { store.write(vec![Op::DeleteJob(key)]).await });
        Box::pin(
            async move {
                if let Some(undo) = undo
                    && let Err(e) = undo.await
                {
                    tracing::error!(error = %e, "cannot undo the record of a refused delivery");
                }
                verdict
            }
            .into_actor(self),
        )
    }
}

impl Actor for WebhookActor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        ctx.set_mailbox_capacity(MAILBOX);
        self.gate();
    }
}

impl Handler<Deliver> for WebhookActor {
    type Result = ResponseActFuture<Self, Verdict>;

    fn handle(&mut self, Deliver(event): Deliver, _: &mut Context<Self>) -> Self::Result {
        let gate = self.gate();
        if gate.decides(&event) {
            // Nothing to record: decided at once.
            let verdict = gate.quick(event);
            return Box::pin(actix::fut::ready(verdict));
        }
        if let Some(verdict) = gate.open(event.delivery_id.as_deref()) {
            return Box::pin(actix::fut::ready(verdict));
        }
        let record = match &self.store {
            Some(store) if gate.policy().stored(&event) => {
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
            .filter(|_| event.action != JobAction::Waiting);
        let stored = record.is_some();
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
                .then(move |written, act, _| match written {
                    Ok(()) => act.hand_over(event, stored),
                    Err((verdict, e)) => {
                        tracing::error!(error = %e, "cannot record the job durably; answering 503 so GitHub may redeliver");
                        act.gate().abandon(event.delivery_id.as_deref());
                        Box::pin(actix::fut::ready(verdict))
                    }
                }),
        )
    }
}

crate::stop_on_request!(WebhookActor);

impl Handler<Close> for WebhookActor {
    type Result = ();

    fn handle(&mut self, _: Close, _: &mut Context<Self>) {
        self.gate().close();
        self.store = None;
    }
}

impl Handler<RememberedDeliveries> for WebhookActor {
    type Result = usize;

    fn handle(&mut self, _: RememberedDeliveries, _: &mut Context<Self>) -> usize {
        self.gate().remembered()
    }
}

impl Handler<Unprocessed> for WebhookActor {
    type Result = Vec<String>;

    fn handle(&mut self, Unprocessed(guids): Unprocessed, _: &mut Context<Self>) -> Vec<String> {
        self.gate().unprocessed(guids)
    }
}

impl Handler<ExpectRedelivery> for WebhookActor {
    type Result = ();

    fn handle(&mut self, ExpectRedelivery(guids): ExpectRedelivery, _: &mut Context<Self>) {
        self.gate().expect(guids)
    }
}
