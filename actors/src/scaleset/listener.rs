//! `ScaleSetListener`: one pool's scale set, its message session and its queue.
//!
//! Its loop: make sure the scale set exists with the pool's labels (created, adopted, updated,
//! or created again when GitHub deleted it); close this host's own session left by a crash;
//! open a session (a 409 means another owner listens: wait, growing to a minute, never hot);
//! then long-poll. A 401 refreshes the session's token, a 404 (session evicted) opens a new
//! session, keeping `lastMessageId`; a dropped connection is polled again after a backoff.
//! Its restart policy: whatever ends the loop, the loop starts over after the backoff, keeping
//! the scale set's id and `lastMessageId`; only `Stop` ends it (and closes the session).

use std::{cell::RefCell, rc::Rc, time::Duration};

use actix::{
    Actor, ActorFutureExt, AsyncContext, Context, Handler, Recipient, ResponseFuture, WrapFuture,
};

use super::{
    Backoff, Mark, event_of,
    lease::{lease_key, renew_lease, take_lease},
    reckon::{Reckoner, reckon},
    view::{observe, set_state},
};
use crate::{
    cluster::Ledger,
    config::PoolName,
    durable::Op,
    github::{
        GithubError,
        actions::{
            ActionsClient,
            types::{JobMessageKind, Label, QueueMessage, ScaleSet, Session, Statistics},
        },
        actor::GenerateJitConfig,
        client::{JitRunner, random_suffix},
    },
    metrics::Metrics,
    scheduler::{
        JobEvent, SchedulerActor,
        messages::{EventSource, GetStatus},
    },
    store::Store,
    webhook::{Deliver, Verdict},
};

/// Runner names tried per claim when the name is taken (409).
const NAME_ATTEMPTS: u32 = 3;
/// How long a 409'd listener waits first, and at most, before asking for the session again.
const HELD_FIRST: Duration = Duration::from_secs(5);
const HELD_CAP: Duration = Duration::from_secs(60);
/// The backoff after a failure to reach the service.
const DOWN_FIRST: Duration = Duration::from_secs(1);
const DOWN_CAP: Duration = Duration::from_secs(30);

/// What a listener serves.
#[derive(Debug, Clone)]
pub struct ScaleSetSettings {
    /// The pool (its scale set has the pool's name).
    pub pool: PoolName,
    /// The pool's labels: the scale set's labels.
    pub labels: Vec<String>,
    /// The pool's `max_concurrent`.
    pub max: usize,
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
    /// The scheduler, for the pool's free slots.
    pub scheduler: actix::WeakAddr<SchedulerActor>,
    /// The store, for the mark.
    pub store: Option<Store>,
    /// Fleet mode: the ledger, whose lease says which host listens.
    pub ledger: Option<Ledger>,
}

/// The listener's state, shared by its loop and its claim handler.
#[derive(Debug)]
pub(super) struct Shared {
    pub(super) client: ActionsClient,
    pub(super) settings: ScaleSetSettings,
    pub(super) wiring: ScaleSetWiring,
    pub(super) metrics: Metrics,
    pub(super) mark: RefCell<Mark>,
    /// The scale set's id once it is known to exist.
    pub(super) set_id: RefCell<Option<u64>>,
    /// The session's state (a `SESSION_STATES` word) and why, for `status`.
    pub(super) state: RefCell<(&'static str, String)>,
    /// The statistics the last message carried.
    pub(super) statistics: RefCell<Option<Statistics>>,
}

/// One pool's scale-set listener.
#[derive(Debug)]
pub struct ScaleSetListener {
    pub(super) shared: Rc<Shared>,
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
        ScaleSetListener {
            shared: Rc::new(Shared {
                client,
                settings,
                wiring,
                metrics,
                mark: RefCell::new(mark),
                set_id: RefCell::new(None),
                state: RefCell::new(("reconnecting", "starting".into())),
                statistics: RefCell::new(None),
            }),
        }
    }
}

impl Actor for ScaleSetListener {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        self.run(ctx);
    }

    fn stopped(&mut self, _: &mut Context<Self>) {
        // Close the session so another host (or this one, restarted) may open one at once.
        let shared = self.shared.clone();
        let session = shared.mark.borrow().session_id.clone();
        let set = *shared.set_id.borrow();
        if let (Some(session), Some(set)) = (session, set) {
            actix_rt::spawn(async move {
                let close = async {
                    let closed = shared.client.delete_session(set, &session).await;
                    // Fleet mode: the lease goes with the session, so another host listens
                    // at once.
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
}

impl ScaleSetListener {
    /// The loop, started again after a backoff whenever it ends.
    fn run(&mut self, ctx: &mut Context<Self>) {
        let shared = self.shared.clone();
        ctx.spawn(listen(shared).into_actor(self).map(|(), _, ctx| {
            ctx.run_later(DOWN_CAP, |act, ctx| act.run(ctx));
        }));
    }
}

fn draw() -> f64 {
    use rand::RngExt as _;
    rand::rng().random()
}

/// Why a session's polling ended.
enum Ended {
    /// Another host holds the listener lease now: close the session and wait.
    LostLease,
    /// The session is gone (evicted, or lapsed): open another.
    SessionGone,
    /// The service failed; wait, then start over.
    Failed(GithubError),
}

/// Listens until the actor stops; returns only on an unexpected end (the caller restarts it).
async fn listen(shared: Rc<Shared>) {
    let pool = shared.settings.pool.clone();
    let mut down = Backoff::new(DOWN_FIRST, DOWN_CAP);
    let mut held = Backoff::new(HELD_FIRST, HELD_CAP);
    let mut said_held = false;
    loop {
        let set = match ensure_scale_set(&shared).await {
            Ok(id) => id,
            Err(e) => {
                set_state(
                    &shared,
                    "reconnecting",
                    format!("cannot make sure the scale set exists: {e}"),
                );
                tracing::warn!(pool = pool.as_str(), error = %e, "scale set: cannot make sure it exists; trying again");
                tokio::time::sleep(down.next(draw())).await;
                continue;
            }
        };
        if let Err(holder) = take_lease(&shared, set).await {
            set_state(
                &shared,
                "held_elsewhere",
                format!("host {holder} holds the listener lease"),
            );
            if !said_held {
                tracing::info!(pool = pool.as_str(), holder = %holder, "scale set: another host listens; waiting for its lease to lapse");
                said_held = true;
            }
            let lease = shared
                .wiring
                .ledger
                .as_ref()
                .map_or(HELD_CAP, |l| l.lease());
            tokio::time::sleep(held.next(draw()).min(lease / 3)).await;
            continue;
        }
        close_own_stale_session(&shared, set).await;
        let session = match shared
            .client
            .create_session(set, &shared.settings.owner_name)
            .await
        {
            Ok(s) => s,
            Err(GithubError::Http(f)) if f.status == 409 => {
                set_state(&shared, "held_elsewhere", f.message.clone());
                if !said_held {
                    tracing::info!(pool = pool.as_str(), answer = %f.message, "scale set: another owner holds the message session; waiting for it");
                    said_held = true;
                }
                tokio::time::sleep(held.next(draw())).await;
                continue;
            }
            Err(GithubError::Http(f)) if f.status == 404 => {
                tracing::warn!(
                    pool = pool.as_str(),
                    "scale set: it is gone (deleted on GitHub); making it again"
                );
                *shared.set_id.borrow_mut() = None;
                continue;
            }
            Err(e) => {
                set_state(
                    &shared,
                    "reconnecting",
                    format!("cannot open the message session: {e}"),
                );
                tracing::warn!(pool = pool.as_str(), error = %e, "scale set: cannot open the message session; trying again");
                tokio::time::sleep(down.next(draw())).await;
                continue;
            }
        };
        said_held = false;
        held.reset();
        down.reset();
        shared.mark.borrow_mut().session_id = Some(session.session_id.clone());
        save_mark(&shared).await;
        if !renew_lease(&shared, &session).await {
            let _ = shared.client.delete_session(set, &session.session_id).await;
            shared.mark.borrow_mut().session_id = None;
            continue;
        }
        set_state(&shared, "listening", String::new());
        if let Some(stats) = &session.statistics {
            observe(&shared, stats);
        }
        tracing::info!(pool = pool.as_str(), scale_set = set, session = %session, last_message_id = shared.mark.borrow().last_message_id, "scale set: listening");
        match poll(&shared, set, session).await {
            Ended::LostLease => {
                tracing::info!(
                    pool = pool.as_str(),
                    "scale set: another host took the listener lease; closing this session"
                );
                let closing = shared.mark.borrow_mut().session_id.take();
                if let Some(id) = closing {
                    let _ = shared.client.delete_session(set, &id).await;
                }
            }
            Ended::SessionGone => {
                tracing::info!(
                    pool = pool.as_str(),
                    "scale set: the message session is gone; opening another"
                );
                shared.mark.borrow_mut().session_id = None;
            }
            Ended::Failed(e) => {
                set_state(
                    &shared,
                    "reconnecting",
                    format!("the message queue failed: {e}"),
                );
                tracing::warn!(pool = pool.as_str(), error = %e, "scale set: the message queue failed; reconnecting");
                tokio::time::sleep(down.next(draw())).await;
            }
        }
    }
}

pub(super) fn values(s: &Statistics) -> [u64; 7] {
    [
        s.total_available_jobs,
        s.total_acquired_jobs,
        s.total_assigned_jobs,
        s.total_running_jobs,
        s.total_registered_runners,
        s.total_busy_runners,
        s.total_idle_runners,
    ]
}

/// The scale set's id: the one known, else found by name in the runner group (its labels set
/// to the pool's if they differ), else created.
async fn ensure_scale_set(shared: &Shared) -> Result<u64, GithubError> {
    let s = &shared.settings;
    let known = *shared.set_id.borrow();
    if let Some(id) = known {
        return Ok(id);
    }
    let client = &shared.client;
    let group = client
        .runner_group_id(s.runner_group.as_deref(), s.runner_group_id)
        .await?;
    let mut wanted_labels: Vec<String> = s.labels.clone();
    wanted_labels.sort();
    wanted_labels.dedup();
    let wanted = ScaleSet {
        name: s.pool.to_string(),
        runner_group_id: group,
        labels: wanted_labels
            .iter()
            .map(|l| Label {
                kind: "System".into(),
                name: l.clone(),
            })
            .collect(),
        ..ScaleSet::default()
    };
    let id = match client.find_scale_set(group, s.pool.as_str()).await? {
        Some(found) if found.label_names() == wanted_labels => found.id,
        Some(found) => {
            tracing::info!(pool = s.pool.as_str(), was = ?found.label_names(), now = ?wanted_labels, "scale set: the pool's labels changed; updating the scale set");
            client
                .update_scale_set(found.id, &wanted)
                .await?
                .id
                .max(found.id)
        }
        None => {
            let made = client.create_scale_set(&wanted).await?;
            tracing::info!(
                pool = s.pool.as_str(),
                scale_set = made.id,
                "scale set: created"
            );
            made.id
        }
    };
    let was = shared.mark.borrow().scale_set_id;
    if was != id {
        // Another scale set (this one was made again): its queue starts over, and the jobs
        // still waiting from the old one are GitHub's to assign anew.
        let orphans = if was == 0 {
            Vec::new()
        } else {
            super::reckon::demand(shared)
                .await
                .map(|d| d.waiting.iter().map(|k| k.job_id).collect())
                .unwrap_or_default()
        };
        if !orphans.is_empty() {
            tracing::info!(
                pool = s.pool.as_str(),
                jobs = orphans.len(),
                "scale set: made again; its old jobs still waiting are withdrawn unless the new scale set counts them"
            );
        }
        *shared.mark.borrow_mut() = Mark {
            scale_set_id: id,
            orphans,
            ..Mark::default()
        };
        save_mark(shared).await;
    }
    *shared.set_id.borrow_mut() = Some(id);
    Ok(id)
}

/// Closes the session this host held before it was killed, if the store remembers one.
async fn close_own_stale_session(shared: &Shared, set: u64) {
    let stale = shared.mark.borrow().session_id.clone();
    let Some(stale) = stale else { return };
    match shared.client.delete_session(set, &stale).await {
        Ok(()) => {
            tracing::info!(pool = shared.settings.pool.as_str(), session = %stale, "scale set: closed this host's previous session")
        }
        Err(e) => {
            tracing::debug!(error = %e, "scale set: the previous session could not be closed")
        }
    }
    shared.mark.borrow_mut().session_id = None;
}

/// Long-polls the session's queue until the session is gone or the service fails.
async fn poll(shared: &Shared, set: u64, mut session: Session) -> Ended {
    let pool = shared.settings.pool.clone();
    let mut dropped = Backoff::new(DOWN_FIRST, DOWN_CAP);
    let mut failures = 0u32;
    let mut reckoner = Reckoner::default();
    loop {
        let capacity = free_slots(shared).await;
        let last = shared.mark.borrow().last_message_id;
        let answer = {
            let get = shared.client.get_message(&session, last, capacity);
            tokio::pin!(get);
            // Fleet mode: the lease is renewed while the long poll waits.
            let every = shared
                .wiring
                .ledger
                .as_ref()
                .map_or(Duration::from_secs(3600), |l| l.heartbeat_every());
            loop {
                tokio::select! {
                    answer = &mut get => break answer,
                    () = tokio::time::sleep(every) => {
                        if !renew_lease(shared, &session).await {
                            return Ended::LostLease;
                        }
                    }
                }
            }
        };
        match answer {
            Ok(None) => {
                failures = 0;
                dropped.reset();
                // The queue is drained: the statistics can be held against the jobs known.
                match reckon(shared, set, &mut session, &mut reckoner).await {
                    Ok(()) => {}
                    Err(GithubError::Http(f)) if f.status == 404 => return Ended::SessionGone,
                    Err(e) => {
                        tracing::debug!(pool = pool.as_str(), error = %e, "scale set: the reckoning's session refresh failed")
                    }
                }
            }
            Ok(Some(message)) => {
                failures = 0;
                dropped.reset();
                if let Err(e) = handle(shared, set, &session, message).await {
                    // Not acknowledged: the queue hands the message out again.
                    tracing::warn!(pool = pool.as_str(), error = %e, "scale set: a message could not be handled; it comes again");
                    tokio::time::sleep(dropped.next(draw())).await;
                }
                if !renew_lease(shared, &session).await {
                    return Ended::LostLease;
                }
            }
            Err(GithubError::Http(f)) if f.status == 401 => {
                // The queue's token expired: refresh the session, keeping its place.
                match shared
                    .client
                    .refresh_session(set, &session.session_id)
                    .await
                {
                    Ok(fresh) => session = fresh,
                    Err(GithubError::Http(f)) if f.status == 404 => return Ended::SessionGone,
                    Err(e) => return Ended::Failed(e),
                }
            }
            Err(GithubError::Http(f)) if f.status == 404 => return Ended::SessionGone,
            Err(e) => {
                // A proxy that dropped the long poll, a timeout: poll again after a backoff;
                // after many in a row, start over with a new session.
                failures += 1;
                if failures >= 5 {
                    return Ended::Failed(e);
                }
                tracing::debug!(pool = pool.as_str(), error = %e, "scale set: the poll failed; polling again");
                tokio::time::sleep(dropped.next(draw())).await;
            }
        }
    }
}

/// The pool's free slots, the `X-ScaleSetMaxCapacity` of the next poll (0 while it is down).
async fn free_slots(shared: &Shared) -> usize {
    let s = &shared.settings;
    let Some(scheduler) = shared.wiring.scheduler.upgrade() else {
        return 0;
    };
    match scheduler.send(GetStatus).await {
        Ok(view) => view
            .providers
            .iter()
            .find(|p| p.provider == s.pool)
            .map_or(0, |p| {
                if p.up {
                    p.max.saturating_sub(p.used)
                } else {
                    0
                }
            }),
        Err(_) => s.max,
    }
}

/// Handles one message: acquires its available jobs, hands its assigned, started and
/// completed jobs to the intake, and once all are durable keeps its id and acknowledges it.
async fn handle(
    shared: &Shared,
    set: u64,
    session: &Session,
    message: QueueMessage,
) -> Result<(), String> {
    let pool = shared.settings.pool.as_str();
    let metrics = &shared.metrics.scaleset;
    if let Some(stats) = &message.statistics {
        observe(shared, stats);
    }
    if message.unreadable > 0 {
        metrics
            .messages
            .with_label_values(&[pool, "unreadable"])
            .inc_by(message.unreadable as u64);
        tracing::warn!(
            pool,
            count = message.unreadable,
            "scale set: job messages of an unknown kind were skipped"
        );
    }
    let available: Vec<u64> = message
        .jobs
        .iter()
        .filter(|j| j.message_type == JobMessageKind::JobAvailable)
        .map(|j| j.runner_request_id)
        .collect();
    if !available.is_empty() {
        match shared.client.acquire_jobs(set, session, &available).await {
            Ok(acquired) => {
                let lost = available.len().saturating_sub(acquired.len());
                metrics
                    .acquire
                    .with_label_values(&[pool, "acquired"])
                    .inc_by(acquired.len() as u64);
                metrics
                    .acquire
                    .with_label_values(&[pool, "lost"])
                    .inc_by(lost as u64);
            }
            Err(GithubError::Http(f)) if f.status == 404 => {
                // A GHES without job acquisition: the jobs are assigned without it.
                metrics
                    .acquire
                    .with_label_values(&[pool, "error"])
                    .inc_by(available.len() as u64);
                tracing::warn!(
                    pool,
                    "scale set: this server has no acquirejobs (see docs/operations.md for the version floor)"
                );
            }
            Err(e) => {
                metrics
                    .acquire
                    .with_label_values(&[pool, "error"])
                    .inc_by(available.len() as u64);
                return Err(format!("acquiring jobs: {e}"));
            }
        }
    }
    let pin = crate::config::scaleset_pin(&shared.settings.pool);
    let owner = shared.client.owner().to_string();
    for job in &message.jobs {
        metrics
            .messages
            .with_label_values(&[pool, job.message_type.as_str()])
            .inc();
        let Some((action, info)) = event_of(job, &owner, &pin) else {
            continue;
        };
        let event = JobEvent {
            delivery_id: Some(format!(
                "scaleset-{}-{}",
                job.runner_request_id,
                job.message_type.as_str()
            )),
            action,
            job: info,
            received: tokio::time::Instant::now(),
            source: EventSource::ScaleSet,
        };
        match shared.wiring.intake.send(Deliver(event)).await {
            Ok(Verdict::Accepted | Verdict::IgnoredAction | Verdict::Replayed) => {}
            Ok(other) => {
                return Err(format!(
                    "the intake refused job {}: {other:?}",
                    job.runner_request_id
                ));
            }
            Err(e) => return Err(format!("the intake is gone: {e}")),
        }
    }
    shared.mark.borrow_mut().last_message_id = message.id;
    save_mark(shared).await;
    if let Err(e) = shared.client.delete_message(session, message.id).await {
        // Durable already: when it comes again its jobs are known (dedup by request id).
        tracing::debug!(pool, error = %e, "scale set: acknowledging a message failed");
    }
    Ok(())
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
    type Result = ResponseFuture<Result<JitRunner, GithubError>>;

    /// A claim for this pool: a runner registered in the scale set.
    fn handle(&mut self, claim: GenerateJitConfig, _: &mut Context<Self>) -> Self::Result {
        let shared = self.shared.clone();
        Box::pin(async move {
            let set = match *shared.set_id.borrow() {
                Some(id) => id,
                None => {
                    return Err(GithubError::Network {
                        endpoint: "actions_generate_jitconfig",
                        detail: "the scale set is not known yet".into(),
                    });
                }
            };
            for _ in 0..NAME_ATTEMPTS {
                let name = format!("{}{}", claim.name_base, random_suffix());
                match shared.client.generate_jitconfig(set, &name).await {
                    Err(GithubError::Http(f)) if f.status == 409 => continue,
                    Err(GithubError::Http(f)) if f.status == 404 => {
                        // Deleted under us: the loop makes it again.
                        *shared.set_id.borrow_mut() = None;
                        return Err(GithubError::Http(f));
                    }
                    other => return other,
                }
            }
            Err(GithubError::NameConflict {
                attempts: NAME_ATTEMPTS,
            })
        })
    }
}

crate::stop_on_request!(ScaleSetListener);
