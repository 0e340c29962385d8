//! What the HTTP workers and the intake actor share, and the workers' own way for deliveries
//! that need nothing written before their answer.
//!
//! A delivery needs the actor only when something must be durable before its 202, or written
//! through the ledger it holds: a `queued` job a pool here covers (the store), or any job event
//! in fleet mode (a `queued` one recorded in the ledger before its 202, a start or an end
//! queued in the ledger's lazy writes). Every other
//! delivery (`in_progress`, `completed`, `waiting`, a `queued` job no pool covers) is decided
//! on the worker that verified it: the replay check against the delivery ids both sides share,
//! then the event joins the outbox and the worker answers at once, with no round trip to the
//! actors' thread. The actor is woken once per batch: the first event into an empty outbox
//! sends it [`Flush`], and [`FLUSH_AFTER`] later it passes everything the outbox holds to the
//! scheduler. Under load that is one wake-up of the actors' thread for many deliveries instead
//! of two (there and back) for each.
//!
//! Nothing answered 202 is dropped: an event the scheduler's full mailbox refuses stays in the
//! outbox and is tried again, and while the scheduler is full (or the outbox holds
//! [`OUTBOX_CAPACITY`] events) the workers answer 503, as the actor does.

use std::{
    collections::{HashSet, VecDeque},
    sync::{Mutex, MutexGuard},
    time::Duration,
};

use actix::Message;

use super::{
    actor::{DELIVERY_CAPACITY, DELIVERY_WINDOW, Verdict},
    dedup::DeliveryDedup,
};
use crate::{job::JobAction, metrics::Metrics, scheduler::messages::JobEvent, vocab::LabelSet};

/// How long the first event into an empty outbox waits for others before the actor passes them
/// on: the batch a burst forms, for a millisecond of latency on events no claim waits for.
pub(crate) const FLUSH_AFTER: Duration = Duration::from_millis(1);
/// A refused flush (the scheduler's mailbox full) is tried again this much later.
pub(crate) const FLUSH_RETRY: Duration = Duration::from_millis(10);
/// Events the outbox holds at most; past it the workers answer 503.
pub(crate) const OUTBOX_CAPACITY: usize = 16_384;
/// Guids GitHub was asked to redeliver that are awaited at most (oldest forgotten first).
const EXPECTED_CAPACITY: usize = 4096;

/// Tells the intake actor the outbox has events to pass on.
#[derive(Debug, Clone, Copy, Message)]
#[rtype(result = "()")]
pub struct Flush;

/// The delivery ids the intake knows, under one lock.
#[derive(Debug)]
pub(super) struct Seen {
    /// Accepted within the window.
    pub(super) deliveries: DeliveryDedup,
    /// Whose commit is in flight: a concurrent copy is answered 503, never 200, since the first
    /// may still fail.
    pub(super) in_flight: HashSet<String>,
    /// Guids GitHub was asked to redeliver, not yet come in.
    expected: VecDeque<String>,
    /// False once the intake is closed or its actor stopped: every delivery is then a 503.
    pub(super) open: bool,
}

impl Seen {
    /// Redeliveries asked for, not yet come in.
    pub(super) fn expected_len(&self) -> usize {
        self.expected.len()
    }

    /// Delivery `id` was handed over: remembered, and counted if it was an awaited redelivery.
    pub(super) fn accepted(&mut self, id: &str, metrics: &Metrics) {
        self.deliveries.insert(id, crate::clock::mono_now());
        self.handed_over(id, metrics);
    }

    /// Delivery `id`, which [`DeliveryDedup::probe`] found absent under this same lock, was
    /// handed over: recorded without a second look-up.
    pub(super) fn accepted_absent(
        &mut self,
        id: &str,
        absent: super::dedup::Absent,
        now: crate::clock::Instant,
        metrics: &Metrics,
    ) {
        self.deliveries.insert_absent(absent, now);
        self.handed_over(id, metrics);
    }

    /// Recorded delivery `id` is no longer in flight, and is counted if it was an awaited
    /// redelivery.
    fn handed_over(&mut self, id: &str, metrics: &Metrics) {
        // Only the actor's commits are in flight: a worker's delivery never was (and the
        // empty set's look-up still hashed the id with SipHash).
        if !self.in_flight.is_empty() {
            self.in_flight.remove(id);
        }
        if self.expected.is_empty() {
            return;
        }
        if let Some(at) = self.expected.iter().position(|g| g == id) {
            self.expected.remove(at);
            metrics
                .webhook_redeliveries
                .with_label_values(&["recovered"])
                .inc();
        }
    }

    /// Awaits these guids as redeliveries.
    pub(super) fn expect(&mut self, guids: Vec<String>) {
        for guid in guids {
            if self.expected.len() >= EXPECTED_CAPACITY {
                self.expected.pop_front();
            }
            self.expected.push_back(guid);
        }
    }
}

/// Events on their way to the scheduler.
#[derive(Debug, Default)]
pub(super) struct Outbox {
    pub(super) events: VecDeque<JobEvent>,
    /// The scheduler's mailbox refused the last flush: the workers answer 503 until one goes
    /// through.
    pub(super) scheduler_full: bool,
}

/// The shared half of the intake.
#[derive(Debug)]
pub struct Handoff {
    seen: Mutex<Seen>,
    outbox: Mutex<Outbox>,
    /// The label sets of this host's enabled pools, when known: a `queued` job none of them
    /// covers is never claimed here, so it needs no durable record (the scheduler remembers it
    /// as seen, in memory; losing it in a crash loses nothing).
    coverage: Option<Vec<LabelSet>>,
    /// Fleet mode: every job event is recorded in the ledger first, by the actor.
    pub(super) fleet: bool,
    /// There is a store to record covered `queued` jobs in.
    pub(super) durable: bool,
    metrics: Metrics,
    /// `ephemerd_github_webhook_events_total` for each action, looked up once: the label lookup
    /// hashes and takes a lock, once per delivery otherwise.
    events: [prometheus::IntCounter; 4],
}

/// What the worker decided, and whether it must wake the actor.
#[derive(Debug)]
pub struct Decided {
    /// The answer.
    pub verdict: Verdict,
    /// The event was the first into an empty outbox: send the actor [`Flush`].
    pub wake: bool,
}

impl Handoff {
    pub(super) fn new(durable: bool, metrics: Metrics) -> Self {
        Handoff {
            seen: Mutex::new(Seen {
                deliveries: DeliveryDedup::new(DELIVERY_WINDOW, DELIVERY_CAPACITY),
                in_flight: HashSet::new(),
                expected: VecDeque::new(),
                open: true,
            }),
            outbox: Mutex::new(Outbox::default()),
            coverage: None,
            fleet: false,
            durable,
            events: [
                JobAction::Queued,
                JobAction::InProgress,
                JobAction::Completed,
                JobAction::Waiting,
            ]
            .map(|a| metrics.webhook_events.with_label_values(&[a.as_str()])),
            metrics,
        }
    }

    pub(super) fn set_coverage(&mut self, pools: Vec<LabelSet>) {
        self.coverage = Some(pools);
    }

    /// Remembers delivery ids for `window` from now on.
    pub(super) fn set_window(&mut self, window: Duration) {
        self.seen().deliveries.set_window(window);
    }

    /// The delivery ids, locked. A poisoned lock (a panic while it was held) still holds
    /// consistent ids: every update under it is a single insert or remove.
    pub(super) fn seen(&self) -> MutexGuard<'_, Seen> {
        self.seen.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(super) fn outbox(&self) -> MutexGuard<'_, Outbox> {
        self.outbox.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A new hand-over with this one's settings (coverage, fleet, durable) and nothing in it.
    pub(super) fn unshared_copy(&self) -> Handoff {
        let mut copy = Handoff {
            coverage: self.coverage.clone(),
            fleet: self.fleet,
            ..Handoff::new(self.durable, self.metrics.clone())
        };
        copy.set_window(self.seen().deliveries.window());
        copy
    }

    /// Whether a `queued` job with `labels` could be claimed here.
    pub(super) fn covered(&self, labels: &[String]) -> bool {
        let Some(pools) = &self.coverage else {
            return true;
        };
        pools.iter().any(|p| p.covers_labels(labels))
    }

    /// Whether `event` needs the actor: something written before its answer, or (fleet mode)
    /// queued for the ledger.
    fn needs_a_record(&self, event: &JobEvent) -> bool {
        self.goes_to_the_ledger(event) || self.needs_a_local_record(event)
    }

    /// Fleet mode: every event but `waiting` goes to the ledger (a `queued` one before its
    /// answer; a start or an end with the host's next round trip).
    pub(super) fn goes_to_the_ledger(&self, event: &JobEvent) -> bool {
        self.fleet && event.action != JobAction::Waiting
    }

    /// A `queued` job some pool here covers is written to the store before its 202.
    pub(super) fn needs_a_local_record(&self, event: &JobEvent) -> bool {
        self.durable && event.action == JobAction::Queued && self.covered(&event.job.labels)
    }

    /// Decides `event` on the worker, or gives it back when the actor must (it needs a record).
    pub fn decide(&self, event: JobEvent) -> Result<Decided, Box<JobEvent>> {
        if self.needs_a_record(&event) {
            return Err(Box::new(event));
        }
        let busy = Decided {
            verdict: Verdict::Busy,
            wake: false,
        };
        let mut seen = self.seen();
        if !seen.open {
            return Ok(busy);
        }
        let now = crate::clock::mono_now();
        // Looked up once: what records it after the hand-over (under the same lock).
        let mut absent = None;
        if let Some(id) = &event.delivery_id {
            match seen.deliveries.probe(id, now) {
                None => {
                    return Ok(Decided {
                        verdict: Verdict::Replayed,
                        wake: false,
                    });
                }
                Some(a) => absent = Some(a),
            }
            if !seen.in_flight.is_empty() && seen.in_flight.contains(id) {
                return Ok(busy);
            }
        }
        let action = event.action;
        let wake = {
            let mut outbox = self.outbox();
            if outbox.scheduler_full || outbox.events.len() >= OUTBOX_CAPACITY {
                return Ok(busy);
            }
            // Recorded before the event moves into the outbox, under both locks: nothing can
            // see one without the other.
            if let (Some(id), Some(absent)) = (&event.delivery_id, absent) {
                seen.accepted_absent(id, absent, now, &self.metrics);
            }
            outbox.events.push_back(event);
            outbox.events.len() == 1
        };
        drop(seen);
        let counter = match action {
            JobAction::Queued => 0,
            JobAction::InProgress => 1,
            JobAction::Completed => 2,
            JobAction::Waiting => 3,
        };
        self.events[counter].inc();
        Ok(Decided {
            verdict: Verdict::Accepted,
            wake,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A builder call after the hand-over was shared starts a new one: it keeps every setting
    /// (the actor decides by them too) and none of the old one's deliveries.
    #[test]
    fn a_fresh_copy_keeps_the_settings_and_none_of_the_deliveries() {
        let mut h = Handoff::new(true, Metrics::new());
        h.set_coverage(vec![LabelSet::new(&["linux".to_string()])]);
        h.fleet = true;
        h.seen().in_flight.insert("d-1".into());
        let copy = h.unshared_copy();
        assert!(copy.fleet && copy.durable);
        assert!(copy.covered(&["linux".into()]));
        assert!(!copy.covered(&["macos".into()]));
        assert!(copy.seen().in_flight.is_empty());
    }
}
