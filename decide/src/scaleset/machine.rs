//! The listener's session, as a state machine: what to ask the service next, given what the
//! last call answered. Pure: no I/O, no clock (waits are effects, jitter draws come in), so
//! each row of the session's life is a unit test. The listener ((`actors::scaleset::listener`)) carries
//! each [`Call`] out and feeds its [`Outcome`] back.
//!
//! | what happened | what comes next |
//! |---|---|
//! | the scale set could not be made sure of | wait (1 s doubling to 30 s), again |
//! | fleet: another host holds the listener lease | wait (5 s doubling to 60 s, at most a third of the lease), again |
//! | a session of this host is remembered | close it first; it is forgotten only once the service says it is gone |
//! | 409 on opening: another owner listens | wait (5 s doubling to 60 s), never hot |
//! | 404 on opening: the scale set was deleted | make it again, at once |
//! | a poll answered 401: the queue token expired | refresh the session, poll again |
//! | a poll or refresh answered 404: the session was evicted | open another, keeping the place |
//! | a poll with nothing (202, or 200 empty) | reckon the statistics, poll again |
//! | a message not handled (the intake refused it) | wait (1 s doubling), poll again: it comes again |
//! | a poll failed (a dropped connection) | wait and poll again; the fifth in a row starts over |
//! | fleet: the lease was lost | close the session, then wait for the lease |
//!
//! `X-ScaleSetMaxCapacity` is the pool's capacity, what it can run at once, the same on every
//! poll: the service holds the jobs it assigns to a scale set against it, so free slots there
//! would stall assignment at half the pool (docs/configuration.md, scale sets).

use std::time::Duration;

use crate::retry::{Doubling, DoublingBackoff};

/// The session's waits move by ±20 % of themselves.
const JITTER: f64 = 0.2;

/// The backoff after a failure to reach the service.
pub const DOWN_FIRST: Duration = Duration::from_secs(1);
/// Its cap.
pub const DOWN_CAP: Duration = Duration::from_secs(30);
/// How long a held-off listener waits first before asking for the session again.
pub const HELD_FIRST: Duration = Duration::from_secs(5);
/// Its cap.
pub const HELD_CAP: Duration = Duration::from_secs(60);
/// Failed polls in a row that start the session over.
pub const POLL_FAILURES: u32 = 5;

/// How a call failed, as far as the session is concerned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fail {
    /// 409: another owner holds the session (its words).
    Conflict(String),
    /// 404: the session (or the scale set) is gone.
    NotFound,
    /// 401: a token expired.
    Unauthorized,
    /// Anything else (5xx, a dropped connection, an answer that does not parse).
    Other(String),
}

impl From<&crate::github::GithubError> for Fail {
    fn from(e: &crate::github::GithubError) -> Self {
        match e {
            crate::github::GithubError::Http(f) if f.status == 409 => {
                Fail::Conflict(f.message.clone())
            }
            crate::github::GithubError::Http(f) if f.status == 404 => Fail::NotFound,
            crate::github::GithubError::Http(f) if f.status == 401 => Fail::Unauthorized,
            other => Fail::Other(other.to_string()),
        }
    }
}

impl std::fmt::Display for Fail {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Fail::Conflict(m) => write!(f, "held by another owner: {m}"),
            Fail::NotFound => f.write_str("not found"),
            Fail::Unauthorized => f.write_str("the token was refused"),
            Fail::Other(m) => f.write_str(m),
        }
    }
}

/// What the listener does next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Call {
    /// Make sure the scale set exists (found, made, or made again).
    Resolve,
    /// Fleet mode: take the listener lease of scale set `set`.
    TakeLease(u64),
    /// Close session `id` of scale set `set` (this host's, left by a crash or a lost lease).
    Close {
        /// The scale set.
        set: u64,
        /// The session.
        id: String,
    },
    /// Open the message session of scale set `set`.
    Open(u64),
    /// Fleet mode: renew the lease with the session and place.
    Renew,
    /// Long-poll the queue of scale set `set`, saying `capacity`, and handle what comes.
    Poll {
        /// The scale set.
        set: u64,
        /// `X-ScaleSetMaxCapacity`.
        capacity: usize,
    },
    /// Refresh the session's queue token.
    Refresh(u64),
    /// Hold the statistics against the jobs held (when a reading is due).
    Reckon(u64),
    /// Wait, then go on.
    Wait(Duration),
}

/// What a poll brought.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Polled {
    /// No message within the long poll.
    Nothing,
    /// A message, handled and acknowledged.
    Handled,
    /// A message the intake did not take: it comes again.
    NotHandled,
    /// Fleet mode: another host took the lease while the poll waited.
    LostLease,
}

/// What a call answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// [`Call::Resolve`]: the scale set's id.
    Resolved(Result<u64, Fail>),
    /// [`Call::TakeLease`]: `Err(holder)` when another host listens.
    Leased(Result<(), String>),
    /// [`Call::Close`].
    Closed(Result<(), Fail>),
    /// [`Call::Open`]: the session's id.
    Opened(Result<String, Fail>),
    /// [`Call::Renew`]: whether this host still holds the lease.
    Renewed(bool),
    /// [`Call::Poll`].
    Polled(Result<Polled, Fail>),
    /// [`Call::Refresh`].
    Refreshed(Result<(), Fail>),
    /// [`Call::Reckon`].
    Reckoned(Result<(), Fail>),
    /// [`Call::Wait`] is over.
    Waited,
}

/// The session's state, as `status` and the `ephemerd_scaleset_session` gauge say it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SessionState {
    /// Polling the queue.
    Listening,
    /// Another owner (host) holds the session or the lease.
    HeldElsewhere,
    /// Getting there, or after a failure.
    Reconnecting,
}

impl SessionState {
    /// The word (a `SESSION_STATES` label).
    pub fn as_str(self) -> &'static str {
        match self {
            SessionState::Listening => "listening",
            SessionState::HeldElsewhere => "held_elsewhere",
            SessionState::Reconnecting => "reconnecting",
        }
    }
}

/// Something worth a log line, said once where it repeats.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Note {
    /// Now listening.
    Listening,
    /// Another owner or host holds the session (said once per spell).
    Held(String),
    /// The session is gone: another is opened.
    SessionGone,
    /// The scale set is gone: it is made again.
    SetGone,
    /// Something failed (the words).
    Failed(String),
    /// The lease went to another host.
    LostLease,
}

/// One pool's session, its state and its waits.
#[derive(Debug, Clone)]
pub struct Machine {
    fleet: bool,
    lease: Duration,
    capacity: usize,
    set: Option<u64>,
    /// The session this host holds or held: (its scale set, its id).
    session: Option<(u64, String)>,
    after_wait: Call,
    down: DoublingBackoff,
    held: DoublingBackoff,
    dropped: DoublingBackoff,
    failures: u32,
    said_held: bool,
    /// The close under way is for a lost lease (then the lease is waited for, not the
    /// session opened).
    yielding: bool,
    state: SessionState,
    why: String,
    notes: Vec<Note>,
}

impl Machine {
    /// A machine for a pool that can run `capacity` runners at once; `session`: the one this
    /// host held before it stopped (the store remembers it, with its scale set); `lease`:
    /// fleet mode's lease.
    pub fn new(capacity: usize, session: Option<(u64, String)>, lease: Option<Duration>) -> Self {
        Machine {
            fleet: lease.is_some(),
            lease: lease.unwrap_or(HELD_CAP * 3),
            capacity,
            set: None,
            session,
            after_wait: Call::Resolve,
            down: DoublingBackoff::new(Doubling::new(DOWN_FIRST, DOWN_CAP).jittered(JITTER)),
            held: DoublingBackoff::new(Doubling::new(HELD_FIRST, HELD_CAP).jittered(JITTER)),
            dropped: DoublingBackoff::new(Doubling::new(DOWN_FIRST, DOWN_CAP).jittered(JITTER)),
            failures: 0,
            said_held: false,
            yielding: false,
            state: SessionState::Reconnecting,
            why: "starting".into(),
            notes: Vec::new(),
        }
    }

    /// The first call.
    pub fn start(&self) -> Call {
        Call::Resolve
    }

    /// The scale set's id, once known.
    pub fn set(&self) -> Option<u64> {
        self.set
    }

    /// The session this host holds (or held and has not closed yet): its scale set and id.
    pub fn session(&self) -> Option<(u64, &str)> {
        self.session.as_ref().map(|(set, id)| (*set, id.as_str()))
    }

    /// The state and why.
    pub fn state(&self) -> (SessionState, &str) {
        (self.state, &self.why)
    }

    /// The notes since the last call, for the log.
    pub fn take_notes(&mut self) -> Vec<Note> {
        std::mem::take(&mut self.notes)
    }

    /// A claim found the scale set gone: the next round makes it again.
    pub fn forget_set(&mut self) {
        self.set = None;
    }

    /// The next call after `outcome`; `draw` in `[0, 1)` places a wait in its jitter band.
    pub fn on(&mut self, outcome: Outcome, draw: f64) -> Call {
        match outcome {
            Outcome::Waited => std::mem::replace(&mut self.after_wait, Call::Resolve),
            Outcome::Resolved(Ok(set)) => {
                self.set = Some(set);
                if self.fleet {
                    Call::TakeLease(set)
                } else {
                    self.close_or_open(set)
                }
            }
            Outcome::Resolved(Err(e)) => {
                self.reconnect(format!("cannot make sure the scale set exists: {e}"), draw)
            }
            Outcome::Leased(Ok(())) => match self.set {
                Some(set) => self.close_or_open(set),
                None => Call::Resolve,
            },
            Outcome::Leased(Err(holder)) => {
                let wait = self.held.next(draw).min(self.lease / 3);
                self.hold(format!("host {holder} holds the listener lease"));
                self.wait(wait, Call::Resolve)
            }
            Outcome::Closed(result) => self.on_closed(result),
            Outcome::Opened(result) => self.on_opened(result, draw),
            Outcome::Renewed(true) => match self.state {
                SessionState::Listening => self.poll(),
                _ => self.listen(),
            },
            Outcome::Renewed(false) => self.lost_lease(),
            Outcome::Polled(result) => self.on_polled(result, draw),
            Outcome::Refreshed(Err(Fail::NotFound)) | Outcome::Reckoned(Err(Fail::NotFound)) => {
                self.session_gone()
            }
            Outcome::Refreshed(Ok(())) | Outcome::Reckoned(_) => self.poll(),
            Outcome::Refreshed(Err(e)) => {
                self.reconnect(format!("cannot refresh the message session: {e}"), draw)
            }
        }
    }

    /// The old session was closed (or was gone already).
    fn on_closed(&mut self, result: Result<(), Fail>) -> Call {
        if result.is_ok() || result == Err(Fail::NotFound) {
            self.session = None;
        }
        match (std::mem::take(&mut self.yielding), self.set) {
            // A lost lease: back to waiting for it.
            (true, _) | (_, None) => Call::Resolve,
            (false, Some(set)) => Call::Open(set),
        }
    }

    /// A session was asked for: listening, held by another listener, or the scale set gone.
    fn on_opened(&mut self, result: Result<String, Fail>, draw: f64) -> Call {
        match result {
            Ok(id) => {
                self.session = self.set.map(|set| (set, id));
                self.said_held = false;
                self.held.reset();
                self.down.reset();
                self.failures = 0;
                if self.fleet {
                    Call::Renew
                } else {
                    self.listen()
                }
            }
            Err(Fail::Conflict(words)) => {
                let wait = self.held.next(draw);
                self.hold(words);
                self.wait(wait, Call::Resolve)
            }
            Err(Fail::NotFound) => {
                self.set = None;
                self.notes.push(Note::SetGone);
                self.set_state(
                    SessionState::Reconnecting,
                    "the scale set is gone; making it again",
                );
                Call::Resolve
            }
            Err(e) => self.reconnect(format!("cannot open the message session: {e}"), draw),
        }
    }

    /// A long poll ended: a message, none, a message not handled, or a failure.
    fn on_polled(&mut self, result: Result<Polled, Fail>, draw: f64) -> Call {
        match result {
            Ok(Polled::LostLease) => self.lost_lease(),
            Ok(Polled::Nothing) => {
                self.polled_fine();
                match self.set {
                    Some(set) => Call::Reckon(set),
                    None => Call::Resolve,
                }
            }
            Ok(Polled::Handled) => {
                self.polled_fine();
                self.after_message()
            }
            Ok(Polled::NotHandled) => {
                self.failures = 0;
                let wait = self.dropped.next(draw);
                let next = self.after_message();
                self.wait(wait, next)
            }
            Err(Fail::Unauthorized) => match self.set {
                Some(set) => Call::Refresh(set),
                None => Call::Resolve,
            },
            Err(Fail::NotFound) => self.session_gone(),
            Err(e) => {
                self.failures += 1;
                if self.failures >= POLL_FAILURES {
                    self.failures = 0;
                    self.reconnect(format!("the message queue failed: {e}"), draw)
                } else {
                    let wait = self.dropped.next(draw);
                    let next = self.poll();
                    self.wait(wait, next)
                }
            }
        }
    }

    fn close_or_open(&mut self, set: u64) -> Call {
        match &self.session {
            Some((old, id)) => Call::Close {
                set: *old,
                id: id.clone(),
            },
            None => Call::Open(set),
        }
    }

    fn listen(&mut self) -> Call {
        self.set_state(SessionState::Listening, "");
        self.notes.push(Note::Listening);
        self.poll()
    }

    fn poll(&self) -> Call {
        match self.set {
            Some(set) => Call::Poll {
                set,
                capacity: self.capacity,
            },
            None => Call::Resolve,
        }
    }

    fn after_message(&self) -> Call {
        if self.fleet { Call::Renew } else { self.poll() }
    }

    fn polled_fine(&mut self) {
        self.failures = 0;
        self.dropped.reset();
    }

    fn session_gone(&mut self) -> Call {
        self.session = None;
        self.notes.push(Note::SessionGone);
        self.set_state(
            SessionState::Reconnecting,
            "the message session is gone; opening another",
        );
        match self.set {
            Some(set) => Call::Open(set),
            None => Call::Resolve,
        }
    }

    fn lost_lease(&mut self) -> Call {
        self.notes.push(Note::LostLease);
        self.set_state(
            SessionState::HeldElsewhere,
            "another host took the listener lease",
        );
        match &self.session {
            Some((set, id)) => {
                self.yielding = true;
                Call::Close {
                    set: *set,
                    id: id.clone(),
                }
            }
            None => Call::Resolve,
        }
    }

    fn hold(&mut self, why: String) {
        if !self.said_held {
            self.notes.push(Note::Held(why.clone()));
            self.said_held = true;
        }
        self.set_state(SessionState::HeldElsewhere, why);
    }

    fn reconnect(&mut self, why: String, draw: f64) -> Call {
        self.notes.push(Note::Failed(why.clone()));
        self.set_state(SessionState::Reconnecting, why);
        let wait = self.down.next(draw);
        self.wait(wait, Call::Resolve)
    }

    fn wait(&mut self, wait: Duration, then: Call) -> Call {
        self.after_wait = then;
        Call::Wait(wait)
    }

    fn set_state(&mut self, state: SessionState, why: impl Into<String>) {
        self.state = state;
        self.why = why.into();
    }
}
