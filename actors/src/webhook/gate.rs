//! The intake's gate: delivery-id dedup and the hand-over to the scheduler, shared by the HTTP
//! edge's worker threads and the [`super::WebhookActor`].
//!
//! A delivery that needs no durable record (anything but a `queued` job a pool here covers,
//! when there is no fleet ledger) is decided on the worker thread that verified it, so the
//! request never waits for the actors' thread: [`Gate::open`] (replay check, the id marked in
//! flight), then [`Gate::hand_over`] (`try_send` to the scheduler, the id remembered). A
//! delivery that needs a durable record goes to the actor, which opens it here, awaits its
//! commit, and hands it over through the same gate. The in-flight mark makes a copy that
//! races the first a 503 (GitHub may redeliver), so a delivery id is handed over once.

use std::{
    collections::{HashMap, HashSet, VecDeque},
    sync::{Mutex, MutexGuard, PoisonError, RwLock, RwLockReadGuard},
    time::Duration,
};

use actix::Recipient;
use prometheus::IntCounter;
use tokio::time::Instant;

use super::actor::{DELIVERY_CAPACITY, DELIVERY_WINDOW, Verdict};
use crate::{job::JobAction, metrics::Metrics, scheduler::messages::JobEvent, vocab::LabelSet};

/// Redeliveries awaited at most (oldest forgotten first).
const EXPECTED_CAPACITY: usize = 4096;

/// Remembers recent delivery ids, bounded in time and count. Pure: `now` is passed in.
#[derive(Debug)]
pub struct DeliveryDedup {
    window: Duration,
    capacity: usize,
    seen: HashMap<String, Instant>,
    order: VecDeque<(Instant, String)>,
}

impl DeliveryDedup {
    /// Remembers ids for `window`, at most `capacity` of them.
    pub fn new(window: Duration, capacity: usize) -> Self {
        DeliveryDedup {
            window,
            capacity,
            seen: HashMap::new(),
            order: VecDeque::new(),
        }
    }

    /// True if `id` was recorded within the window.
    pub fn contains(&mut self, id: &str, now: Instant) -> bool {
        self.expire(now);
        self.seen.contains_key(id)
    }

    /// Records `id`. Returns false if it was already there.
    pub fn insert(&mut self, id: &str, now: Instant) -> bool {
        self.expire(now);
        if self.seen.contains_key(id) {
            return false;
        }
        while self.seen.len() >= self.capacity {
            match self.order.pop_front() {
                Some((_, old)) => {
                    self.seen.remove(&old);
                }
                None => break,
            }
        }
        self.seen.insert(id.to_string(), now);
        self.order.push_back((now, id.to_string()));
        true
    }

    /// Ids remembered now.
    pub fn len(&self) -> usize {
        self.seen.len()
    }

    /// True when nothing is remembered.
    pub fn is_empty(&self) -> bool {
        self.seen.is_empty()
    }

    fn expire(&mut self, now: Instant) {
        while let Some((at, _)) = self.order.front() {
            if now.saturating_duration_since(*at) < self.window {
                break;
            }
            if let Some((at, id)) = self.order.pop_front()
                && self.seen.get(&id) == Some(&at)
            {
                self.seen.remove(&id);
            }
        }
    }
}

/// What makes a delivery durable before its 202.
#[derive(Debug, Default)]
pub(super) struct Policy {
    /// A store records `queued` jobs.
    pub durable: bool,
    /// Fleet mode: a ledger records every job event but `waiting`.
    pub ledger: bool,
    /// The label sets of this host's enabled pools, when known: a `queued` job none of them
    /// covers is never claimed here, so it is not made durable.
    pub coverage: Option<Vec<LabelSet>>,
}

impl Policy {
    /// Whether the store records this event's job.
    pub fn stored(&self, event: &JobEvent) -> bool {
        self.durable && event.action == JobAction::Queued && self.covered(&event.job.labels)
    }

    /// Whether this event is recorded anywhere before its answer.
    pub fn recorded(&self, event: &JobEvent) -> bool {
        self.stored(event) || (self.ledger && event.action != JobAction::Waiting)
    }

    fn covered(&self, labels: &[String]) -> bool {
        let Some(pools) = &self.coverage else {
            return true;
        };
        let wanted = LabelSet::new(labels);
        pools.iter().any(|p| p.covers(&wanted))
    }
}

#[derive(Debug)]
struct State {
    deliveries: DeliveryDedup,
    /// Delivery ids being handed over (or, for the actor, committed): a concurrent copy is
    /// answered 503, never 200, since the first may still fail.
    in_flight: HashSet<String>,
    /// Guids GitHub was asked to redeliver, not yet come in.
    expected: VecDeque<String>,
}

/// See the module doc.
#[derive(Debug)]
pub struct Gate {
    policy: Policy,
    /// `None` once closed. Apart from the dedup state, so that no worker waits on a lock
    /// while another hands over (a `try_send` may wake the scheduler's thread).
    scheduler: RwLock<Option<Recipient<JobEvent>>>,
    state: Mutex<State>,
    /// `ephemerd_github_webhook_events_total{action}`, resolved once: queued, in_progress,
    /// completed, waiting.
    events: [IntCounter; 4],
    recovered: IntCounter,
}

impl Gate {
    pub(super) fn new(scheduler: Recipient<JobEvent>, policy: Policy, metrics: &Metrics) -> Self {
        let events = [
            JobAction::Queued,
            JobAction::InProgress,
            JobAction::Completed,
            JobAction::Waiting,
        ]
        .map(|a| metrics.webhook_events.with_label_values(&[a.as_str()]));
        Gate {
            policy,
            scheduler: RwLock::new(Some(scheduler)),
            state: Mutex::new(State {
                deliveries: DeliveryDedup::new(DELIVERY_WINDOW, DELIVERY_CAPACITY),
                in_flight: HashSet::new(),
                expected: VecDeque::new(),
            }),
            events,
            recovered: metrics
                .webhook_redeliveries
                .with_label_values(&["recovered"]),
        }
    }

    pub(super) fn policy(&self) -> &Policy {
        &self.policy
    }

    // Nothing panics while holding these locks; a poisoned one still holds consistent state.
    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn scheduler(&self) -> RwLockReadGuard<'_, Option<Recipient<JobEvent>>> {
        self.scheduler
            .read()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether [`Gate::quick`] decides this delivery (it needs no durable record).
    pub(super) fn decides(&self, event: &JobEvent) -> bool {
        !self.policy.recorded(event)
    }

    /// Decides, on the calling thread, a delivery that needs no durable record (see
    /// [`Gate::decides`]; one that does is the actor's).
    pub(super) fn quick(&self, event: JobEvent) -> Verdict {
        if let Some(verdict) = self.open(event.delivery_id.as_deref()) {
            return verdict;
        }
        self.hand_over(event)
    }

    /// The first step for a delivery: `Some` answers it now (closed, a replay, a copy in
    /// flight); `None` marks it in flight.
    pub(super) fn open(&self, delivery_id: Option<&str>) -> Option<Verdict> {
        if self.scheduler().is_none() {
            return Some(Verdict::Busy);
        }
        let id = delivery_id?;
        let mut state = self.state();
        if state.deliveries.contains(id, Instant::now()) {
            return Some(Verdict::Replayed);
        }
        if !state.in_flight.insert(id.to_string()) {
            return Some(Verdict::Busy);
        }
        None
    }

    /// Hands an opened delivery over ([`Verdict::Accepted`]) or refuses it ([`Verdict::Busy`]:
    /// a full or closed mailbox, or a closed intake); either way it is no longer in flight.
    pub(super) fn hand_over(&self, event: JobEvent) -> Verdict {
        let action = event.action;
        let delivery_id = event.delivery_id.clone();
        let sent = self
            .scheduler()
            .as_ref()
            .is_some_and(|scheduler| scheduler.try_send(event).is_ok());
        if let Some(id) = &delivery_id {
            let mut state = self.state();
            state.in_flight.remove(id);
            if sent {
                state.deliveries.insert(id, Instant::now());
                if let Some(at) = state.expected.iter().position(|g| g == id) {
                    state.expected.remove(at);
                    self.recovered.inc();
                }
            }
        }
        if !sent {
            return Verdict::Busy;
        }
        let index = match action {
            JobAction::Queued => 0,
            JobAction::InProgress => 1,
            JobAction::Completed => 2,
            JobAction::Waiting => 3,
        };
        self.events[index].inc();
        Verdict::Accepted
    }

    /// A delivery opened with [`Gate::open`] that will not be handed over.
    pub(super) fn abandon(&self, delivery_id: Option<&str>) {
        if let Some(id) = delivery_id {
            self.state().in_flight.remove(id);
        }
    }

    /// Every later delivery is refused; the scheduler is let go.
    pub(super) fn close(&self) {
        *self
            .scheduler
            .write()
            .unwrap_or_else(PoisonError::into_inner) = None;
    }

    /// Delivery ids remembered now.
    pub(super) fn remembered(&self) -> usize {
        self.state().deliveries.len()
    }

    /// Of `guids`, those neither accepted within the window nor in flight.
    pub(super) fn unprocessed(&self, guids: Vec<String>) -> Vec<String> {
        let mut state = self.state();
        let now = Instant::now();
        guids
            .into_iter()
            .filter(|g| !state.deliveries.contains(g, now) && !state.in_flight.contains(g))
            .collect()
    }

    /// GitHub was asked to redeliver `guids`.
    pub(super) fn expect(&self, guids: Vec<String>) {
        let mut state = self.state();
        for guid in guids {
            if state.expected.len() >= EXPECTED_CAPACITY {
                state.expected.pop_front();
            }
            state.expected.push_back(guid);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    };

    use actix::{Actor, Context, Handler};

    use super::*;
    use crate::{
        job::{JobInfo, JobKey},
        scheduler::messages::EventSource,
    };

    struct Count(Arc<AtomicUsize>);

    impl Actor for Count {
        type Context = Context<Self>;
        fn started(&mut self, ctx: &mut Context<Self>) {
            ctx.set_mailbox_capacity(10_000);
        }
    }

    impl Handler<JobEvent> for Count {
        type Result = ();
        fn handle(&mut self, _: JobEvent, _: &mut Context<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn event(delivery: &str) -> JobEvent {
        JobEvent {
            delivery_id: Some(delivery.to_string()),
            action: JobAction::InProgress,
            job: JobInfo {
                key: JobKey {
                    owner: "acme".into(),
                    job_id: 7,
                },
                ..JobInfo::default()
            },
            received: Instant::now(),
            source: EventSource::Webhook,
        }
    }

    /// Worker threads racing one delivery id: it is handed over once; every other copy is a
    /// replay.
    #[actix_rt::test]
    async fn copies_of_a_delivery_on_many_threads_are_handed_over_once() {
        let handed = Arc::new(AtomicUsize::new(0));
        let scheduler = Count(handed.clone()).start().recipient();
        let gate = Arc::new(Gate::new(scheduler, Policy::default(), &Metrics::new()));
        tokio::time::sleep(std::time::Duration::from_millis(10)).await; // the mailbox is sized
        let threads: Vec<_> = (0..8)
            .map(|_| {
                let gate = gate.clone();
                std::thread::spawn(move || {
                    (0..200)
                        .map(|i| gate.quick(event(&format!("d{i}"))))
                        .filter(|v| *v == Verdict::Accepted)
                        .count()
                })
            })
            .collect();
        let accepted: usize = threads.into_iter().map(|t| t.join().unwrap()).sum();
        assert_eq!(accepted, 200, "each of the 200 ids accepted once");
        assert_eq!(gate.remembered(), 200);
        gate.close();
        assert_eq!(gate.quick(event("late")), Verdict::Busy);
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        assert_eq!(handed.load(Ordering::SeqCst), 200);
    }
}
