//! `ScaleSetListener`: one pool's scale set, its message session and its queue; the actor
//! shell over two pure parts. [`Machine`](super::machine) decides the session's next call
//! from the last answer (open, 409 wait, token refresh, eviction, the lease, the scale set
//! gone), and [`inbox`](super::inbox) decides what a message means (what to acquire, what to
//! hand the intake, what to acknowledge). This file only carries their calls out: one call at
//! a time, its outcome fed back to the machine. Only `Stop` ends it (and closes the session).

use std::{cell::RefCell, rc::Rc, time::Duration};

use actix::{
    Actor, ActorFutureExt, AsyncContext, Context, Handler, Recipient, ResponseActFuture, WrapFuture,
};

use super::{
    Mark, inbox,
    lease::{lease_key, renew_lease, take_lease},
    machine::{Call, Fail, Machine, Note, Outcome, Polled, SessionState},
    reckon::{Reckoner, reckon},
    record::ensure_scale_set,
    view::observe,
};
use crate::{
    cluster::Ledger,
    config::PoolName,
    durable::Op,
    github::{
        GithubError,
        actions::{
            ActionsClient,
            types::{QueueMessage, Session, Statistics},
        },
        actor::GenerateJitConfig,
        client::{JitRunner, with_fresh_names},
    },
    metrics::Metrics,
    scheduler::{JobEvent, SchedulerActor, messages::EventSource},
    store::Store,
    webhook::{Deliver, Verdict},
};

/// What a listener serves.
#[derive(Debug, Clone)]
pub struct ScaleSetSettings {
    /// The pool (its scale set has the pool's name, which is also its first label).
    pub pool: PoolName,
    /// The pool's labels: the scale set's labels after its name.
    pub labels: Vec<String>,
    /// What the pool can run at once: its `max_concurrent`, bounded by the host's
    /// `runner.max_concurrent`. Sent as `X-ScaleSetMaxCapacity` on every poll.
    pub max: usize,
    /// The daemon keeps the pool's runner install current: the scale set's runners are
    /// registered with their own updates off (`RunnerSetting.disableUpdate`).
    pub disable_update: bool,
    /// `github.runner_group` (a name), if set.
    pub runner_group: Option<String>,
    /// `github.runner_group_id`.
    pub runner_group_id: u64,
    /// The session's owner name (`<host>-<install id>`): who listens, as the service shows it.
    pub owner_name: String,
    /// What the store held for this pool at start.
    pub mark: Mark,
}

/// Who a listener talks to.
#[derive(Debug, Clone)]
pub struct ScaleSetWiring {
    /// The intake's gate (dedup, durable record, fleet ledger).
    pub intake: Recipient<Deliver>,
    /// The scheduler, for the jobs it holds (the reckoning).
    pub scheduler: actix::WeakAddr<SchedulerActor>,
    /// The store, for the mark.
    pub store: Option<Store>,
    /// Fleet mode: the ledger, whose lease says which host listens.
    pub ledger: Option<Ledger>,
}

/// What the listener's calls share: the connection, the mark, the open session.
#[derive(Debug)]
pub(super) struct Shared {
    pub(super) client: ActionsClient,
    pub(super) settings: ScaleSetSettings,
    pub(super) wiring: ScaleSetWiring,
    pub(super) metrics: Metrics,
    pub(super) mark: RefCell<Mark>,
    /// The open session (its queue URL and token).
    pub(super) session: RefCell<Option<Session>>,
    /// The statistics the last message carried.
    pub(super) statistics: RefCell<Option<Statistics>>,
    /// The reckoning's last reading.
    pub(super) reckoner: RefCell<Reckoner>,
    /// The labels warning was given (once per run).
    pub(super) said_dropped: RefCell<bool>,
}

/// One pool's scale-set listener.
#[derive(Debug)]
pub struct ScaleSetListener {
    pub(super) shared: Rc<Shared>,
    pub(super) machine: Machine,
    published: Option<SessionState>,
}

impl ScaleSetListener {
    /// A listener for `settings.pool` through `client`.
    pub fn new(
        client: ActionsClient,
        settings: ScaleSetSettings,
        wiring: ScaleSetWiring,
        metrics: Metrics,
    ) -> Self {
        metrics.scaleset.init_pool(settings.pool.as_str());
        let mark = settings.mark.clone();
        let session = mark
            .session_id
            .clone()
            .filter(|_| mark.scale_set_id != 0)
            .map(|id| (mark.scale_set_id, id));
        let machine = Machine::new(
            settings.max,
            session,
            wiring.ledger.as_ref().map(Ledger::lease),
        );
        ScaleSetListener {
            shared: Rc::new(Shared {
                client,
                settings,
                wiring,
                metrics,
                mark: RefCell::new(mark),
                session: RefCell::new(None),
                statistics: RefCell::new(None),
                reckoner: RefCell::new(Reckoner::default()),
                said_dropped: RefCell::new(false),
            }),
            machine,
            published: None,
        }
    }
}

impl Actor for ScaleSetListener {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        let first = self.machine.start();
        self.perform(first, ctx);
    }

    fn stopped(&mut self, _: &mut Context<Self>) {
        // Close the session so another host (or this one, restarted) may open one at once.
        let shared = self.shared.clone();
        let Some((set, session)) = self.machine.session().map(|(s, id)| (s, id.to_string())) else {
            return;
        };
        crate::tasks::spawn(async move {
            let close = async {
                let closed = shared.client.delete_session(set, &session).await;
                // Fleet mode: the lease goes with the session, so another host listens at once.
                if let (Ok(()), Some(ledger)) = (&closed, &shared.wiring.ledger) {
                    let _ = ledger.release_listener(&lease_key(&shared)).await;
                }
            };
            if tokio::time::timeout(Duration::from_secs(5), close)
                .await
                .is_err()
            {
                tracing::warn!(
                    pool = shared.settings.pool.as_str(),
                    "scale set: closing the session timed out; it lapses by itself"
                );
            }
        });
    }
}

fn draw() -> f64 {
    use rand::RngExt as _;
    rand::rng().random()
}

impl ScaleSetListener {
    /// Carries `call` out; its outcome comes back to [`Self::step`].
    fn perform(&mut self, call: Call, ctx: &mut Context<Self>) {
        let shared = self.shared.clone();
        ctx.spawn(
            perform(shared, call)
                .into_actor(self)
                .map(|outcome, act, ctx| act.step(outcome, ctx)),
        );
    }

    /// Feeds `outcome` to the machine and carries out what it says next.
    fn step(&mut self, outcome: Outcome, ctx: &mut Context<Self>) {
        let next = self.machine.on(outcome, draw());
        self.publish();
        self.perform(next, ctx);
    }

    /// The machine's state in the gauge, its notes in the log.
    fn publish(&mut self) {
        let pool = self.shared.settings.pool.as_str();
        let state = self.machine.state().0;
        if self.published != Some(state) {
            self.shared
                .metrics
                .scaleset
                .set_session(pool, state.as_str());
            self.published = Some(state);
        }
        for note in self.machine.take_notes() {
            match note {
                Note::Listening => {
                    tracing::info!(pool, scale_set = self.machine.set().unwrap_or_default(), last_message_id = self.shared.mark.borrow().last_message_id, capacity = self.shared.settings.max, "scale set: listening")
                }
                Note::Held(who) => {
                    tracing::info!(pool, holder = %who, "scale set: another owner holds the message session or the lease; waiting for it")
                }
                Note::SessionGone => {
                    tracing::info!(
                        pool,
                        "scale set: the message session is gone; opening another"
                    )
                }
                Note::SetGone => {
                    tracing::warn!(
                        pool,
                        "scale set: it is gone (deleted on GitHub); making it again"
                    )
                }
                Note::Failed(why) => {
                    tracing::warn!(pool, error = %why, "scale set: reconnecting")
                }
                Note::LostLease => {
                    tracing::info!(
                        pool,
                        "scale set: another host took the listener lease; closing this session"
                    )
                }
            }
        }
    }
}

/// Carries one call out against the service, the ledger or the clock.
async fn perform(shared: Rc<Shared>, call: Call) -> Outcome {
    let fail = |e: GithubError| Fail::from(&e);
    match call {
        Call::Wait(d) => {
            tokio::time::sleep(d).await;
            Outcome::Waited
        }
        Call::Resolve => Outcome::Resolved(ensure_scale_set(&shared).await.map_err(fail)),
        Call::TakeLease(set) => Outcome::Leased(take_lease(&shared, set).await),
        Call::Close { set, id } => {
            let closed = shared.client.delete_session(set, &id).await;
            if closed.is_ok() {
                tracing::info!(pool = shared.settings.pool.as_str(), session = %id, "scale set: closed this host's session");
                forget_session(&shared, &id).await;
            } else if let Err(e) = &closed {
                tracing::debug!(error = %e, "scale set: the session could not be closed; it is kept to be closed again");
            }
            Outcome::Closed(closed.map_err(fail))
        }
        Call::Open(set) => {
            let opened = shared
                .client
                .create_session(set, &shared.settings.owner_name)
                .await;
            Outcome::Opened(match opened {
                Ok(session) => {
                    if let Some(stats) = &session.statistics {
                        observe(&shared, stats);
                    }
                    let id = session.session_id.clone();
                    shared.mark.borrow_mut().session_id = Some(id.clone());
                    *shared.session.borrow_mut() = Some(session);
                    *shared.reckoner.borrow_mut() = Reckoner::default();
                    save_mark(&shared).await;
                    Ok(id)
                }
                Err(e) => Err(fail(e)),
            })
        }
        Call::Renew => {
            let session = shared.session.borrow().clone().unwrap_or_default();
            Outcome::Renewed(renew_lease(&shared, &session).await)
        }
        Call::Poll { set, capacity } => Outcome::Polled(poll_once(&shared, set, capacity).await),
        Call::Refresh(set) => {
            let id = shared
                .session
                .borrow()
                .as_ref()
                .map(|s| s.session_id.clone())
                .unwrap_or_default();
            Outcome::Refreshed(match shared.client.refresh_session(set, &id).await {
                Ok(fresh) => {
                    *shared.session.borrow_mut() = Some(fresh);
                    Ok(())
                }
                Err(e) => Err(fail(e)),
            })
        }
        Call::Reckon(set) => Outcome::Reckoned(reckon(&shared, set).await.map_err(fail)),
    }
}

/// The session `id` is closed: the store forgets it.
async fn forget_session(shared: &Shared, id: &str) {
    let held = shared.mark.borrow().session_id.as_deref() == Some(id);
    if held {
        shared.mark.borrow_mut().session_id = None;
        save_mark(shared).await;
    }
}

/// One long poll, with the message it brings handled. Fleet mode renews the lease while the
/// poll waits.
async fn poll_once(shared: &Shared, set: u64, capacity: usize) -> Result<Polled, Fail> {
    let Some(session) = shared.session.borrow().clone() else {
        return Err(Fail::NotFound);
    };
    settle_acks(shared, &session).await;
    let last = shared.mark.borrow().last_message_id;
    let get = shared.client.get_message(&session, last, capacity);
    tokio::pin!(get);
    let every = shared
        .wiring
        .ledger
        .as_ref()
        .map_or(Duration::from_secs(3600), |l| l.heartbeat_every());
    let answer = loop {
        tokio::select! {
            answer = &mut get => break answer,
            () = tokio::time::sleep(every) => {
                if !renew_lease(shared, &session).await {
                    return Ok(Polled::LostLease);
                }
            }
        }
    };
    match answer {
        Ok(None) => Ok(Polled::Nothing),
        Ok(Some(message)) => match handle(shared, set, &session, message).await {
            Ok(()) => Ok(Polled::Handled),
            Err(e) => {
                // Not acknowledged: the queue hands the message out again.
                tracing::warn!(pool = shared.settings.pool.as_str(), error = %e, "scale set: a message could not be handled; it comes again");
                Ok(Polled::NotHandled)
            }
        },
        Err(e) => {
            tracing::debug!(pool = shared.settings.pool.as_str(), error = %e, "scale set: the poll failed");
            Err(Fail::from(&e))
        }
    }
}

/// Why a message was not handled (it is not acknowledged: the queue hands it out again).
#[derive(Debug, thiserror::Error)]
enum Unhandled {
    /// Its offered jobs could not be acquired.
    #[error("acquiring jobs: {0}")]
    Acquire(GithubError),
    /// The intake refused one of its jobs.
    #[error("the intake refused job {0}: {1}")]
    Refused(u64, String),
    /// The intake is gone (the daemon is stopping).
    #[error("the intake is gone: {0}")]
    IntakeGone(String),
}

/// Handles one message: acquires its offered jobs, hands its job events to the intake, and
/// once all are durable keeps its id (with the assignments it counted) and acknowledges it.
/// What cannot be read is counted, logged with the message's id, and acknowledged too.
async fn handle(
    shared: &Shared,
    set: u64,
    session: &Session,
    message: QueueMessage,
) -> Result<(), Unhandled> {
    let pool = shared.settings.pool.as_str();
    let metrics = &shared.metrics.scaleset;
    if let Some(stats) = &message.statistics {
        observe(shared, stats);
    }
    let last = shared.mark.borrow().last_message_id;
    if last > 0 && message.id <= last {
        // Handled before (the service answered from before `lastMessageId`): acknowledge only.
        let _ = shared.client.delete_message(session, message.id).await;
        return Ok(());
    }
    let mut mark = shared.mark.borrow().clone();
    let pin = crate::config::scaleset_pin(&shared.settings.pool);
    let handled = inbox::handle(
        &message,
        set,
        shared.client.owner(),
        &pin,
        &mut mark,
        crate::clock::unix_now(),
    );
    if let Some(why) = &handled.unreadable {
        tracing::warn!(
            pool,
            message_id = message.id,
            "scale set: {why}; counted as unreadable and acknowledged so the queue goes on"
        );
    }
    if !handled.acquire.is_empty() {
        acquire(shared, set, session, &handled.acquire).await?;
    }
    deliver_all(shared, handled.deliveries).await?;
    for (label, n) in handled.counts {
        metrics.messages.with_label_values(&[pool, label]).inc_by(n);
    }
    if handled.withdrawn > 0 {
        tracing::info!(
            pool,
            jobs = handled.withdrawn,
            message_id = message.id,
            "scale set: the service withdrew jobs no runner took in time; their next assignment gets a runner"
        );
    }
    // Kept with the acknowledgement owed, before it is asked: a poll past the message never
    // brings it back, but the service keeps it until it is deleted, even across a restart.
    mark.last_message_id = message.id;
    mark.owed_acks.push(message.id);
    *shared.mark.borrow_mut() = mark;
    save_mark(shared).await;
    match shared.client.delete_message(session, message.id).await {
        Ok(()) => shared
            .mark
            .borrow_mut()
            .owed_acks
            .retain(|id| *id != message.id),
        Err(e) => {
            tracing::debug!(pool, error = %e, "scale set: acknowledging a message failed; asked again before the next poll")
        }
    }
    Ok(())
}

/// Hands a message's job events to the intake, each as a delivery of its own; any it does
/// not take leaves the message unacknowledged.
async fn deliver_all(shared: &Shared, deliveries: Vec<inbox::Delivery>) -> Result<(), Unhandled> {
    for delivery in deliveries {
        let job_id = delivery.job.key.job_id;
        let event = JobEvent {
            delivery_id: Some(delivery.id),
            action: delivery.action,
            job: delivery.job,
            received: crate::clock::mono_now(),
            source: EventSource::ScaleSet,
        };
        match shared.wiring.intake.send(Deliver(event)).await {
            Ok(Verdict::Accepted | Verdict::IgnoredAction | Verdict::Replayed) => {}
            Ok(other) => return Err(Unhandled::Refused(job_id, format!("{other:?}"))),
            Err(e) => return Err(Unhandled::IntakeGone(e.to_string())),
        }
    }
    Ok(())
}

/// Asks again for the acknowledgements owed (a failed DELETE, or one cut short by a crash);
/// a message the queue no longer has counts as acknowledged (`Mark::acks_settled` keeps the rest).
async fn settle_acks(shared: &Shared, session: &Session) {
    let owed = shared.mark.borrow().owed_acks.clone();
    if owed.is_empty() {
        return;
    }
    let mut done = Vec::new();
    for id in owed {
        match shared.client.delete_message(session, id).await {
            Ok(()) => done.push(id),
            Err(GithubError::Http(f)) if f.status == 404 => done.push(id),
            Err(_) => {}
        }
    }
    shared.mark.borrow_mut().acks_settled(&done);
}

/// Acquires offered jobs (a GHES offers before it assigns); what was not acquired went to
/// another scale set or was cancelled meanwhile.
async fn acquire(
    shared: &Shared,
    set: u64,
    session: &Session,
    ids: &[u64],
) -> Result<(), Unhandled> {
    let pool = shared.settings.pool.as_str();
    let metrics = &shared.metrics.scaleset;
    match shared.client.acquire_jobs(set, session, ids).await {
        Ok(acquired) => {
            let lost = ids.len().saturating_sub(acquired.len());
            metrics
                .acquire
                .with_label_values(&[pool, "acquired"])
                .inc_by(acquired.len() as u64);
            metrics
                .acquire
                .with_label_values(&[pool, "lost"])
                .inc_by(lost as u64);
            Ok(())
        }
        Err(GithubError::Http(f)) if f.status == 404 => {
            // A service without job acquisition: the jobs are assigned without it.
            metrics
                .acquire
                .with_label_values(&[pool, "error"])
                .inc_by(ids.len() as u64);
            tracing::warn!(
                pool,
                "scale set: this server has no acquirejobs (see docs/operations.md for the version floor)"
            );
            Ok(())
        }
        Err(e) => {
            metrics
                .acquire
                .with_label_values(&[pool, "error"])
                .inc_by(ids.len() as u64);
            Err(Unhandled::Acquire(e))
        }
    }
}

/// Writes the mark (best effort: a lost write costs a message seen twice, which dedups).
pub(super) async fn save_mark(shared: &Shared) {
    let Some(store) = &shared.wiring.store else {
        return;
    };
    let name = super::mark_of(shared.client.owner(), shared.settings.pool.as_str());
    let value = serde_json::to_value(&*shared.mark.borrow()).unwrap_or_default();
    if let Err(e) = store.write(vec![Op::PutMark(name, value)]).await {
        tracing::warn!(error = %e, "scale set: cannot keep the message id in the store");
    }
}

impl Handler<GenerateJitConfig> for ScaleSetListener {
    type Result = ResponseActFuture<Self, Result<JitRunner, GithubError>>;

    /// A claim for this pool: a runner registered in the scale set.
    fn handle(&mut self, claim: GenerateJitConfig, _: &mut Context<Self>) -> Self::Result {
        let shared = self.shared.clone();
        let set = self.machine.set();
        let register = async move {
            let Some(set) = set else {
                return Err(GithubError::Network {
                    endpoint: "actions_generate_jitconfig",
                    detail: "the scale set is not known yet".into(),
                });
            };
            let client = &shared.client;
            with_fresh_names(&claim.name_base, |name| async move {
                client.generate_jitconfig(set, &name).await
            })
            .await
        };
        Box::pin(
            register
                .into_actor(self)
                .map(|result, act, _| match result {
                    Err(GithubError::Http(f)) if f.status == 404 => {
                        // Deleted under us: the next round makes it again, and the claim climbs the
                        // ladder meanwhile (the operator has nothing to fix).
                        act.machine.forget_set();
                        Err(GithubError::Network {
                            endpoint: "actions_generate_jitconfig",
                            detail: format!(
                                "the scale set is gone ({}); it is made again",
                                f.message
                            ),
                        })
                    }
                    other => other,
                }),
        )
    }
}

crate::stop_on_request!(ScaleSetListener);
