//! `ScaleSetListener`: one pool's scale set, its message session and its queue; the actor
//! shell over two pure parts. [`Machine`](super::machine) decides the session's next call
//! from the last answer (open, 409 wait, token refresh, eviction, the lease, the scale set
//! gone), and [`inbox`](super::inbox) decides what a message means (what to acquire, what to
//! hand the intake, what to acknowledge). The I/O is one loop ([`run`]) that owns the
//! [`Link`] and the machine: it carries one call out, feeds its outcome to the machine, and
//! publishes what `status`, claims and the final close read. Only `Stop` ends it (and closes
//! the session).

use std::time::Duration;

use actix::{Actor, ActorFutureExt, AsyncContext, Context, Handler, ResponseActFuture, WrapFuture};
use tokio::sync::{mpsc, watch};

use super::{
    lease::{renew_lease, take_lease},
    link::{Link, lease_key},
    machine::{Call, Fail, Machine, Note, Outcome, SessionState},
    poll::poll_once,
    reckon::reckon,
    reckoning::Reckoner,
    record::ensure_scale_set,
};
use crate::{
    cluster::Ledger,
    config::PoolName,
    github::{
        GithubError,
        actions::{ActionsClient, types::Statistics},
        actor::GenerateJitConfig,
        client::{JitRunner, with_fresh_names},
    },
    metrics::Metrics,
};

pub use super::link::{ScaleSetSettings, ScaleSetWiring};

/// What the loop last said: read by `status`, by claims (the scale set's id) and by the
/// final close (the session).
#[derive(Debug, Clone)]
pub(super) struct Published {
    pub(super) state: SessionState,
    pub(super) why: String,
    pub(super) set: Option<u64>,
    pub(super) session: Option<(u64, String)>,
    pub(super) last_message_id: u64,
    pub(super) statistics: Option<Statistics>,
    pub(super) dropped_labels: Vec<String>,
}

impl Published {
    fn of(link: &Link, machine: &Machine) -> Self {
        let (state, why) = machine.state();
        Published {
            state,
            why: why.to_string(),
            set: machine.set(),
            session: machine.session().map(|(set, id)| (set, id.to_string())),
            last_message_id: link.mark.last_message_id,
            statistics: link.statistics,
            dropped_labels: link.dropped_now.clone(),
        }
    }
}

/// What the loop starts with, until the actor starts it.
#[derive(Debug)]
struct Start {
    link: Link,
    machine: Machine,
    out: watch::Sender<Published>,
    forget: mpsc::UnboundedReceiver<()>,
}

/// One pool's scale-set listener.
#[derive(Debug)]
pub struct ScaleSetListener {
    start: Option<Start>,
    /// The loop's last word.
    pub(super) published: watch::Receiver<Published>,
    /// A claim found the scale set gone: the loop forgets it before its next step.
    forget: mpsc::UnboundedSender<()>,
    /// For claims and the final close (the loop holds its own).
    client: ActionsClient,
    pub(super) pool: PoolName,
    ledger: Option<Ledger>,
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
        let mark = &settings.mark;
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
        let (pool, ledger) = (settings.pool.clone(), wiring.ledger.clone());
        let link = Link::new(client.clone(), settings, wiring, metrics);
        let (out, published) = watch::channel(Published::of(&link, &machine));
        let (forget, forget_rx) = mpsc::unbounded_channel();
        ScaleSetListener {
            start: Some(Start {
                link,
                machine,
                out,
                forget: forget_rx,
            }),
            published,
            forget,
            client,
            pool,
            ledger,
        }
    }

    /// The owner (target) it listens for.
    pub(super) fn owner(&self) -> &str {
        self.client.owner()
    }
}

impl Actor for ScaleSetListener {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        if let Some(start) = self.start.take() {
            ctx.spawn(run(start).into_actor(self));
        }
    }

    fn stopped(&mut self, _: &mut Context<Self>) {
        // Close the session so another host (or this one, restarted) may open one at once.
        let Some((set, session)) = self.published.borrow().session.clone() else {
            return;
        };
        let (client, ledger, pool) = (self.client.clone(), self.ledger.clone(), self.pool.clone());
        crate::tasks::spawn(async move {
            let close = async {
                let closed = client.delete_session(set, &session).await;
                // Fleet mode: the lease goes with the session, so another host listens at once.
                if let (Ok(()), Some(ledger)) = (&closed, &ledger) {
                    let _ = ledger
                        .release_listener(&lease_key(&client, pool.as_str()))
                        .await;
                }
            };
            if tokio::time::timeout(Duration::from_secs(5), close)
                .await
                .is_err()
            {
                tracing::warn!(
                    pool = pool.as_str(),
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

/// The listener's loop: one call at a time, its outcome fed to the machine, what the machine
/// says next carried out. Ends only with the actor (which drops it).
async fn run(start: Start) {
    let Start {
        mut link,
        mut machine,
        out,
        mut forget,
    } = start;
    let mut shown = None;
    let mut call = machine.start();
    loop {
        let outcome = perform(&mut link, call).await;
        while forget.try_recv().is_ok() {
            machine.forget_set();
        }
        call = machine.on(outcome, draw());
        publish(&link, &mut machine, &mut shown);
        out.send_replace(Published::of(&link, &machine));
    }
}

/// The machine's state in the gauge (when it changed from `shown`), its notes in the log.
fn publish(link: &Link, machine: &mut Machine, shown: &mut Option<SessionState>) {
    let pool = link.pool();
    let state = machine.state().0;
    if *shown != Some(state) {
        link.metrics.scaleset.set_session(pool, state.as_str());
        *shown = Some(state);
    }
    for note in machine.take_notes() {
        match note {
            Note::Listening => {
                tracing::info!(pool, scale_set = machine.set().unwrap_or_default(), last_message_id = link.mark.last_message_id, capacity = link.settings.max, "scale set: listening")
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

/// Carries one call out against the service, the ledger or the clock.
async fn perform(link: &mut Link, call: Call) -> Outcome {
    let fail = |e: GithubError| Fail::from(&e);
    match call {
        Call::Wait(d) => {
            tokio::time::sleep(d).await;
            Outcome::Waited
        }
        Call::Resolve => Outcome::Resolved(ensure_scale_set(link).await.map_err(fail)),
        Call::TakeLease(set) => Outcome::Leased(take_lease(link, set).await),
        Call::Close { set, id } => {
            let closed = link.client.delete_session(set, &id).await;
            if closed.is_ok() {
                tracing::info!(pool = link.pool(), session = %id, "scale set: closed this host's session");
                forget_session(link, &id).await;
            } else if let Err(e) = &closed {
                tracing::debug!(error = %e, "scale set: the session could not be closed; it is kept to be closed again");
            }
            Outcome::Closed(closed.map_err(fail))
        }
        Call::Open(set) => {
            let opened = link
                .client
                .create_session(set, &link.settings.owner_name)
                .await;
            Outcome::Opened(match opened {
                Ok(session) => {
                    if let Some(stats) = &session.statistics {
                        link.observe(stats);
                    }
                    let id = session.session_id.clone();
                    link.mark.session_id = Some(id.clone());
                    link.session = Some(session);
                    link.reckoner = Reckoner::default();
                    link.save_mark().await;
                    Ok(id)
                }
                Err(e) => Err(fail(e)),
            })
        }
        Call::Renew => {
            let session = link.session.clone().unwrap_or_default();
            Outcome::Renewed(renew_lease(link, &session).await)
        }
        Call::Poll { set, capacity } => Outcome::Polled(poll_once(link, set, capacity).await),
        Call::Refresh(set) => {
            let id = link
                .session
                .as_ref()
                .map(|s| s.session_id.clone())
                .unwrap_or_default();
            Outcome::Refreshed(match link.client.refresh_session(set, &id).await {
                Ok(fresh) => {
                    link.session = Some(fresh);
                    Ok(())
                }
                Err(e) => Err(fail(e)),
            })
        }
        Call::Reckon(set) => Outcome::Reckoned(reckon(link, set).await.map_err(fail)),
    }
}

/// The session `id` is closed: the store forgets it.
async fn forget_session(link: &mut Link, id: &str) {
    if link.mark.session_id.as_deref() == Some(id) {
        link.mark.session_id = None;
        link.save_mark().await;
    }
}

impl Handler<GenerateJitConfig> for ScaleSetListener {
    type Result = ResponseActFuture<Self, Result<JitRunner, GithubError>>;

    /// A claim for this pool: a runner registered in the scale set.
    fn handle(&mut self, claim: GenerateJitConfig, _: &mut Context<Self>) -> Self::Result {
        let client = self.client.clone();
        let set = self.published.borrow().set;
        let register = async move {
            let Some(set) = set else {
                return Err(GithubError::Network {
                    endpoint: "actions_generate_jitconfig",
                    detail: "the scale set is not known yet".into(),
                });
            };
            let client = &client;
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
                        let _ = act.forget.send(());
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
