//! `RetryActor`: the scheduler's one timer, and nothing else. The scheduler owns the ladder, its
//! deferred decisions and its claim pacing, and hands this actor the earliest due time of them
//! all ([`ArmRetryTimer`]); it keeps exactly one `run_later` armed for it and sends
//! [`RetryDue`] back when it comes. Because the scheduler sends every arm in order from its own
//! handler, a newer time always replaces an older one. Nothing else in the scheduler arms a
//! timer of its own.
//!
//! One timer, not one per job: actix polls every spawned future of a context on each wake, so a
//! timer per job would make every message cost O(jobs). The timer dies with the actor.

use crate::clock::Instant;
use actix::{
    Actor, AsyncContext, Context, Handler, Message, MessageResult, SpawnHandle, WeakRecipient,
};
use serde::Serialize;

use crate::clock::Clock;

/// The time the ladder's earliest item is due (`None`: nothing waits).
#[derive(Debug, Clone, Copy, Message)]
#[rtype(result = "()")]
pub struct ArmRetryTimer {
    /// Due time.
    pub at: Option<Instant>,
}

/// The retry timer fired: items are due.
#[derive(Debug, Clone, Copy, Message)]
#[rtype(result = "()")]
pub struct RetryDue;

/// Ask what the timer holds.
#[derive(Debug, Clone, Copy, Message)]
#[rtype(result = "RetryTimerView")]
pub struct GetRetryTimer;

/// What the timer holds.
#[derive(Debug, Clone, Copy, Serialize, serde::Deserialize)]
pub struct RetryTimerView {
    /// Timers armed right now (0 or 1, whatever the ladder's depth).
    pub armed_timers: usize,
    /// Seconds until it fires.
    pub next_due_in_secs: Option<f64>,
}

/// The ladder's timer.
#[derive(Debug)]
pub struct RetryActor {
    /// Weak: the scheduler owns this actor, not the other way round.
    due: WeakRecipient<RetryDue>,
    clock: Clock,
    armed: Option<(SpawnHandle, Instant)>,
}

impl RetryActor {
    /// A timer telling `due` (its owner, held weakly) when the time it was handed has come.
    pub fn new(due: WeakRecipient<RetryDue>, clock: Clock) -> Self {
        RetryActor {
            due,
            clock,
            armed: None,
        }
    }
}

impl Actor for RetryActor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        ctx.set_mailbox_capacity(1024);
    }
}

crate::stop_on_request!(RetryActor);

impl Handler<ArmRetryTimer> for RetryActor {
    type Result = ();

    fn handle(&mut self, m: ArmRetryTimer, ctx: &mut Context<Self>) {
        if self.armed.as_ref().map(|(_, at)| *at) == m.at {
            return;
        }
        if let Some((handle, _)) = self.armed.take() {
            ctx.cancel_future(handle);
        }
        if let Some(at) = m.at {
            let delay = at.saturating_duration_since(self.clock.now());
            let handle = ctx.run_later(delay, |act, _| {
                act.armed = None;
                if let Some(due) = act.due.upgrade() {
                    due.do_send(RetryDue);
                }
            });
            self.armed = Some((handle, at));
        }
    }
}

impl Handler<GetRetryTimer> for RetryActor {
    type Result = MessageResult<GetRetryTimer>;

    fn handle(&mut self, _: GetRetryTimer, _: &mut Context<Self>) -> Self::Result {
        let now = self.clock.now();
        MessageResult(RetryTimerView {
            armed_timers: usize::from(self.armed.is_some()),
            next_due_in_secs: self
                .armed
                .as_ref()
                .map(|(_, at)| at.saturating_duration_since(now).as_secs_f64()),
        })
    }
}
