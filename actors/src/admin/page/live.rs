//! `GET /events`: the page's live updates, as server-sent events. The stream looks at the
//! scheduler's generation ([`GetGeneration`]) every [`LOOK_EVERY`] and sends `change` when it
//! moved, so an open page fetches itself again within a second of a decision; a comment every
//! [`KEEP_ALIVE`] keeps proxies from closing an idle stream. At most [`MAX_STREAMS`] are open at
//! once (each a connection held); past that the answer is 503 and the page polls instead.

use std::{
    sync::atomic::{AtomicUsize, Ordering},
    time::Duration,
};

use actix_web::{HttpRequest, HttpResponse, web};

use super::super::{Admin, access::Want};
use crate::scheduler::messages::GetGeneration;

/// How often a stream asks the scheduler.
pub(super) const LOOK_EVERY: Duration = Duration::from_millis(250);
/// A comment this often on a quiet stream.
const KEEP_ALIVE: Duration = Duration::from_secs(15);
/// Streams open at most.
pub(super) const MAX_STREAMS: usize = 32;

static OPEN: AtomicUsize = AtomicUsize::new(0);

/// One open stream's place, given back when the stream is dropped.
struct Place;

impl Place {
    fn take() -> Option<Place> {
        OPEN.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
            (n < MAX_STREAMS).then_some(n + 1)
        })
        .ok()
        .map(|_| Place)
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        OPEN.fetch_sub(1, Ordering::AcqRel);
    }
}

/// What a stream sends next, given the generation it last sent and the one it sees now.
pub(super) fn next_event(sent: Option<u64>, now: Option<u64>, quiet: Duration) -> Option<String> {
    match (sent, now) {
        (_, None) => Some("event: gone\ndata: the scheduler stopped\n\n".into()),
        (Some(a), Some(b)) if a == b => (quiet >= KEEP_ALIVE).then(|| ": still here\n\n".into()),
        (_, Some(b)) => Some(format!("event: change\ndata: {b}\n\n")),
    }
}

pub(super) async fn events(admin: web::Data<Admin>, req: HttpRequest) -> HttpResponse {
    if let Err(refusal) = admin.access.check(&req, Want::Read) {
        return refusal.answer();
    }
    let Some(place) = Place::take() else {
        return HttpResponse::ServiceUnavailable()
            .insert_header(("Retry-After", "30"))
            .body("too many live pages open; this one polls");
    };
    let scheduler = admin.scheduler.clone();
    struct State {
        sent: Option<u64>,
        quiet: Duration,
        done: bool,
        _place: Place,
    }
    let start = State {
        sent: None,
        quiet: Duration::ZERO,
        done: false,
        _place: place,
    };
    let stream = futures_util::stream::unfold(start, move |mut st| {
        let scheduler = scheduler.clone();
        async move {
            loop {
                if st.done {
                    return None;
                }
                if st.sent.is_some() {
                    tokio::time::sleep(LOOK_EVERY).await;
                    st.quiet += LOOK_EVERY;
                }
                let now = scheduler.send(GetGeneration).await.ok();
                if let Some(event) = next_event(st.sent, now, st.quiet) {
                    st.quiet = Duration::ZERO;
                    st.done = now.is_none();
                    st.sent = now.or(st.sent);
                    let chunk = web::Bytes::from(event);
                    return Some((Ok::<_, actix_web::Error>(chunk), st));
                }
            }
        }
    });
    HttpResponse::Ok()
        .content_type("text/event-stream")
        .insert_header(("Cache-Control", "no-store"))
        .insert_header(("X-Accel-Buffering", "no"))
        .streaming(stream)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stream_says_change_when_the_generation_moves_and_keeps_quiet_otherwise() {
        let first = next_event(None, Some(7), Duration::ZERO).unwrap();
        assert_eq!(first, "event: change\ndata: 7\n\n");
        assert_eq!(next_event(Some(7), Some(7), Duration::from_secs(1)), None);
        assert_eq!(
            next_event(Some(7), Some(7), KEEP_ALIVE).as_deref(),
            Some(": still here\n\n")
        );
        assert_eq!(
            next_event(Some(7), Some(8), Duration::ZERO).as_deref(),
            Some("event: change\ndata: 8\n\n")
        );
        assert!(
            next_event(Some(7), None, Duration::ZERO)
                .unwrap()
                .starts_with("event: gone")
        );
    }
}
