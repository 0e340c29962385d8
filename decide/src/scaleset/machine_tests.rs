//! The session machine, one test per row of its table (`machine.rs`), on hand-made outcomes.

use std::time::Duration;

use super::machine::*;

const MID: f64 = 0.5;

/// A poll of scale set 3 saying `capacity`.
fn poll(capacity: usize) -> Call {
    Call::Poll { set: 3, capacity }
}

fn listening(m: &mut Machine) {
    assert_eq!(m.on(Outcome::Resolved(Ok(3)), MID), Call::Open(3));
    let call = m.on(Outcome::Opened(Ok("s1".into())), MID);
    assert_eq!(call, poll(6));
    assert_eq!(m.state().0, SessionState::Listening);
}

#[test]
fn capacity_is_what_the_pool_can_run_on_every_poll_whatever_is_busy() {
    let mut m = Machine::new(6, None, None);
    listening(&mut m);
    for _ in 0..10 {
        assert_eq!(m.on(Outcome::Polled(Ok(Polled::Handled)), MID), poll(6));
    }
}

#[test]
fn a_scale_set_not_made_sure_of_is_tried_again_after_a_growing_wait() {
    let mut m = Machine::new(2, None, None);
    let waits: Vec<Call> = (0..6)
        .map(|_| {
            let c = m.on(Outcome::Resolved(Err(Fail::Other("500".into()))), MID);
            assert_eq!(m.on(Outcome::Waited, MID), Call::Resolve);
            c
        })
        .collect();
    let secs: Vec<u64> = waits
        .iter()
        .map(|c| match c {
            Call::Wait(d) => d.as_secs(),
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(secs, [1, 2, 4, 8, 16, 30]);
    assert_eq!(m.state().0, SessionState::Reconnecting);
}

#[test]
fn this_host_s_old_session_is_closed_first_and_kept_while_its_close_fails() {
    let mut m = Machine::new(2, Some((3, "old".into())), None);
    let close = Call::Close {
        set: 3,
        id: "old".into(),
    };
    assert_eq!(m.on(Outcome::Resolved(Ok(3)), MID), close);
    // The close failed: the id is kept, the session is asked for all the same.
    assert_eq!(
        m.on(Outcome::Closed(Err(Fail::Other("502".into()))), MID),
        Call::Open(3)
    );
    assert_eq!(m.session(), Some((3, "old")));
    // Still held (by the old session itself): wait, then close it again.
    assert!(matches!(
        m.on(Outcome::Opened(Err(Fail::Conflict("active".into()))), MID),
        Call::Wait(_)
    ));
    assert_eq!(m.on(Outcome::Waited, MID), Call::Resolve);
    assert_eq!(m.on(Outcome::Resolved(Ok(3)), MID), close);
    // Gone now (a 404, or the 400 an expired session gets, which the client says as Ok).
    assert_eq!(m.on(Outcome::Closed(Ok(())), MID), Call::Open(3));
    assert_eq!(m.session(), None);
}

#[test]
fn a_409_waits_growing_to_a_minute_and_says_so_once() {
    let mut m = Machine::new(2, None, None);
    let mut secs = Vec::new();
    for _ in 0..6 {
        assert_eq!(m.on(Outcome::Resolved(Ok(3)), MID), Call::Open(3));
        match m.on(
            Outcome::Opened(Err(Fail::Conflict("held by b".into()))),
            MID,
        ) {
            Call::Wait(d) => secs.push(d.as_secs()),
            other => panic!("{other:?}"),
        }
        assert_eq!(m.on(Outcome::Waited, MID), Call::Resolve);
    }
    assert_eq!(secs, [5, 10, 20, 40, 60, 60]);
    let held: Vec<Note> = m.take_notes();
    assert_eq!(held, [Note::Held("held by b".into())]);
    assert_eq!(m.state(), (SessionState::HeldElsewhere, "held by b"));
    // Once listening, the wait starts over.
    assert_eq!(m.on(Outcome::Resolved(Ok(3)), MID), Call::Open(3));
    m.on(Outcome::Opened(Ok("s".into())), MID);
    m.on(Outcome::Polled(Err(Fail::NotFound)), MID);
    assert_eq!(
        m.on(Outcome::Opened(Err(Fail::Conflict("b".into()))), MID),
        Call::Wait(Duration::from_secs(5))
    );
}

#[test]
fn a_deleted_scale_set_is_made_again_at_once() {
    let mut m = Machine::new(2, None, None);
    assert_eq!(m.on(Outcome::Resolved(Ok(3)), MID), Call::Open(3));
    assert_eq!(
        m.on(Outcome::Opened(Err(Fail::NotFound)), MID),
        Call::Resolve
    );
    assert_eq!(m.set(), None);
    assert!(m.take_notes().contains(&Note::SetGone));
}

#[test]
fn an_expired_queue_token_is_refreshed_and_the_poll_goes_on() {
    let mut m = Machine::new(6, None, None);
    listening(&mut m);
    assert_eq!(
        m.on(Outcome::Polled(Err(Fail::Unauthorized)), MID),
        Call::Refresh(3)
    );
    assert_eq!(m.on(Outcome::Refreshed(Ok(())), MID), poll(6));
}

#[test]
fn an_evicted_session_is_replaced_keeping_the_scale_set() {
    for gone in [
        Outcome::Polled(Err(Fail::NotFound)),
        Outcome::Refreshed(Err(Fail::NotFound)),
        Outcome::Reckoned(Err(Fail::NotFound)),
    ] {
        let mut m = Machine::new(6, None, None);
        listening(&mut m);
        assert_eq!(m.on(gone, MID), Call::Open(3));
        assert_eq!(m.session(), None, "an evicted session is not closed");
    }
}

#[test]
fn a_refresh_that_fails_otherwise_starts_over_closing_the_session() {
    let mut m = Machine::new(6, None, None);
    listening(&mut m);
    m.on(Outcome::Polled(Err(Fail::Unauthorized)), MID);
    assert!(matches!(
        m.on(Outcome::Refreshed(Err(Fail::Other("503".into()))), MID),
        Call::Wait(_)
    ));
    m.on(Outcome::Waited, MID);
    assert_eq!(
        m.on(Outcome::Resolved(Ok(3)), MID),
        Call::Close {
            set: 3,
            id: "s1".into()
        }
    );
}

#[test]
fn an_empty_poll_reckons_and_a_failed_reckoning_polls_on() {
    let mut m = Machine::new(6, None, None);
    listening(&mut m);
    assert_eq!(
        m.on(Outcome::Polled(Ok(Polled::Nothing)), MID),
        Call::Reckon(3)
    );
    assert_eq!(
        m.on(Outcome::Reckoned(Err(Fail::Other("x".into()))), MID),
        poll(6)
    );
}

#[test]
fn a_message_not_taken_is_polled_for_again_after_a_wait() {
    let mut m = Machine::new(6, None, None);
    listening(&mut m);
    assert_eq!(
        m.on(Outcome::Polled(Ok(Polled::NotHandled)), MID),
        Call::Wait(Duration::from_secs(1))
    );
    assert_eq!(m.on(Outcome::Waited, MID), poll(6));
    assert_eq!(
        m.on(Outcome::Polled(Ok(Polled::NotHandled)), MID),
        Call::Wait(Duration::from_secs(2))
    );
}

#[test]
fn failed_polls_back_off_and_the_fifth_in_a_row_starts_over() {
    let mut m = Machine::new(6, None, None);
    listening(&mut m);
    let drop = || Outcome::Polled(Err(Fail::Other("connection reset".into())));
    for i in 0..POLL_FAILURES - 1 {
        assert_eq!(
            m.on(drop(), MID),
            Call::Wait(Duration::from_secs(1 << i)),
            "failure {i}"
        );
        assert_eq!(m.on(Outcome::Waited, MID), poll(6));
    }
    assert!(matches!(m.on(drop(), MID), Call::Wait(_)));
    assert_eq!(m.on(Outcome::Waited, MID), Call::Resolve);
    assert_eq!(m.state().0, SessionState::Reconnecting);
    // A success in between resets the count.
    let mut m = Machine::new(6, None, None);
    listening(&mut m);
    for _ in 0..10 {
        m.on(drop(), MID);
        m.on(Outcome::Waited, MID);
        m.on(drop(), MID);
        m.on(Outcome::Waited, MID);
        assert_eq!(m.on(Outcome::Polled(Ok(Polled::Handled)), MID), poll(6));
    }
}

#[test]
fn fleet_mode_takes_the_lease_first_and_waits_at_most_a_third_of_it() {
    let lease = Duration::from_secs(30);
    let mut m = Machine::new(4, None, Some(lease));
    assert_eq!(m.on(Outcome::Resolved(Ok(3)), MID), Call::TakeLease(3));
    let mut waits = Vec::new();
    for _ in 0..4 {
        match m.on(Outcome::Leased(Err("b".into())), MID) {
            Call::Wait(d) => waits.push(d.as_secs()),
            other => panic!("{other:?}"),
        }
        m.on(Outcome::Waited, MID);
        m.on(Outcome::Resolved(Ok(3)), MID);
    }
    assert_eq!(waits, [5, 10, 10, 10]);
    assert_eq!(m.on(Outcome::Leased(Ok(())), MID), Call::Open(3));
    assert_eq!(m.on(Outcome::Opened(Ok("s".into())), MID), Call::Renew);
    assert_eq!(m.on(Outcome::Renewed(true), MID), poll(4));
    assert_eq!(m.state().0, SessionState::Listening);
    // Each message is followed by a renewal.
    assert_eq!(m.on(Outcome::Polled(Ok(Polled::Handled)), MID), Call::Renew);
    assert_eq!(m.on(Outcome::Renewed(true), MID), poll(4));
}

#[test]
fn a_lost_lease_closes_the_session_and_goes_back_to_waiting_for_the_lease() {
    let mut m = Machine::new(4, None, Some(Duration::from_secs(30)));
    m.on(Outcome::Resolved(Ok(3)), MID);
    m.on(Outcome::Leased(Ok(())), MID);
    m.on(Outcome::Opened(Ok("s".into())), MID);
    m.on(Outcome::Renewed(true), MID);
    let close = Call::Close {
        set: 3,
        id: "s".into(),
    };
    assert_eq!(m.on(Outcome::Polled(Ok(Polled::LostLease)), MID), close);
    assert_eq!(m.state().0, SessionState::HeldElsewhere);
    assert_eq!(m.on(Outcome::Closed(Ok(())), MID), Call::Resolve);
    assert_eq!(m.session(), None);
    assert_eq!(m.on(Outcome::Resolved(Ok(3)), MID), Call::TakeLease(3));
}

#[test]
fn a_claim_that_finds_the_scale_set_gone_makes_the_next_round_make_it_again() {
    let mut m = Machine::new(6, None, None);
    listening(&mut m);
    m.forget_set();
    assert_eq!(
        m.on(Outcome::Polled(Ok(Polled::Handled)), MID),
        Call::Resolve
    );
    // Made again with another id: the old scale set's session is closed there first.
    assert_eq!(
        m.on(Outcome::Resolved(Ok(8)), MID),
        Call::Close {
            set: 3,
            id: "s1".into()
        }
    );
    assert_eq!(
        m.on(Outcome::Closed(Err(Fail::NotFound)), MID),
        Call::Open(8)
    );
}
