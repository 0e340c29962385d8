//! The event stream: every host hears every job event any host recorded, and every release.
//!
//! A dedicated connection `LISTEN`s on [`super::CHANNEL`]. A job event's notification carries
//! the event itself ([`Notice`]): it is handed over without a query. An empty one (a release,
//! an event too large for a payload), a payload this binary cannot read, and [`BACKSTOP`]
//! gone by since the last read (for what was missed) make the listener read the events table
//! from its cursor. Sequence numbers are handed out before their transaction commits, so a
//! lower one can appear after a higher one: the [`Cursor`] keeps the numbers it has seen above its
//! low-water mark and waits up to [`GAP_PATIENCE`] for a missing one before taking it for a
//! rolled-back transaction. When the connection breaks it reconnects with backoff and reads on
//! from the cursor, so events recorded meanwhile are not lost.

use std::{collections::BTreeSet, time::Duration};

use actix::{Message, Recipient};
use futures_util::StreamExt;
use tokio::time::Instant;
use tokio_postgres::AsyncMessage;

use super::{Ledger, LedgerError, Released};
use crate::job::{JobAction, JobInfo, JobKey};

/// How often the events table is read at least, whatever the notifications carried.
pub const BACKSTOP: Duration = Duration::from_secs(5);
/// How long a missing sequence number is waited for.
pub const GAP_PATIENCE: Duration = Duration::from_secs(10);
/// Events read per query.
const PAGE: i64 = 1000;

/// What the fleet tells this host's scheduler.
#[derive(Debug, Clone, Message)]
#[rtype(result = "()")]
pub enum FleetEvent {
    /// Another host's intake recorded a job event.
    Job {
        /// What happened.
        action: JobAction,
        /// The job.
        info: JobInfo,
        /// The host that received it.
        origin: String,
    },
    /// A job open in the ledger when this host started (queued, or held by this host).
    Open(JobInfo),
    /// Another host was granted a job (it asks GitHub for a runner now).
    Held {
        /// The job.
        key: JobKey,
        /// That host.
        host: String,
    },
    /// A job another host held was given back (its lease expired, or it drained).
    Released {
        /// The job and its ladder.
        job: Released,
        /// The host that released it.
        by: String,
    },
}

/// The listener's position in the events table. Pure: time is passed in.
#[derive(Debug, Clone, Default)]
pub struct Cursor {
    /// Every event at or below this was handled (or given up for a rolled-back one).
    pub low: i64,
    above: BTreeSet<i64>,
    gap_since: Option<Instant>,
}

impl Cursor {
    /// A cursor after `low`.
    pub fn after(low: i64) -> Self {
        Cursor {
            low,
            ..Cursor::default()
        }
    }

    /// True if `seq` is news (and remembers it).
    pub fn take(&mut self, seq: i64) -> bool {
        seq > self.low && self.above.insert(seq)
    }

    /// Moves the low-water mark past what was seen; a gap older than [`GAP_PATIENCE`] is
    /// skipped.
    pub fn settle(&mut self, now: Instant) {
        loop {
            while self.above.remove(&(self.low + 1)) {
                self.low += 1;
            }
            if self.above.is_empty() {
                self.gap_since = None;
                return;
            }
            match self.gap_since {
                None => {
                    self.gap_since = Some(now);
                    return;
                }
                Some(since) if now.saturating_duration_since(since) >= GAP_PATIENCE => {
                    self.low += 1;
                    self.gap_since = Some(now);
                }
                Some(_) => return,
            }
        }
    }
}

/// Runs the listener forever (spawn it): hands every event to `to`. Events this host recorded
/// itself are skipped (its intake handed them over already).
pub async fn listen(ledger: Ledger, to: Recipient<FleetEvent>) {
    let mut cursor: Option<Cursor> = None;
    let mut wait = super::CONNECT_BACKOFF.first;
    loop {
        match session(&ledger, &to, &mut cursor).await {
            Ok(()) => return, // the scheduler is gone
            Err(e) => {
                ledger.health.set(false);
                tracing::warn!(error = %e, retry_in = ?wait, "cluster event stream lost; reconnecting");
                tokio::time::sleep(wait).await;
                wait = super::CONNECT_BACKOFF.following(Some(wait));
            }
        }
        if cursor.is_some() {
            wait = wait.min(Duration::from_secs(5));
        }
    }
}

/// One connection's life. `Ok` when the recipient is gone.
async fn session(
    ledger: &Ledger,
    to: &Recipient<FleetEvent>,
    cursor: &mut Option<Cursor>,
) -> Result<(), LedgerError> {
    let pg: tokio_postgres::Config = ledger
        .url
        .expose()
        .parse()
        .map_err(|e| LedgerError::Pool(format!("cluster.url: {e}")))?;
    let (client, mut connection) = pg.connect(ledger.tls.0.clone()).await?;
    let (wake_tx, mut wake) = tokio::sync::mpsc::unbounded_channel::<String>();
    let drive = crate::tasks::spawn(async move {
        let mut messages = futures_util::stream::poll_fn(move |cx| connection.poll_message(cx));
        while let Some(message) = messages.next().await {
            match message {
                Ok(AsyncMessage::Notification(n)) => {
                    let _ = wake_tx.send(n.payload().to_string());
                }
                Ok(_) => {}
                Err(e) => return Some(e),
            }
        }
        None
    });
    let result = async {
        client
            .batch_execute(&format!("LISTEN {}", super::CHANNEL))
            .await?;
        ledger.health.set(true);
        if cursor.is_none() {
            let Some(first) = first_cursor(&client, ledger, to).await? else {
                return Ok(());
            };
            *cursor = Some(first);
        }
        let Some(cursor) = cursor.as_mut() else {
            return Ok(());
        };
        let from_cursor = client
            .prepare(
                "SELECT seq, action, origin, body FROM ephemer_events
                 WHERE seq > $1 ORDER BY seq LIMIT $2",
            )
            .await?;
        let mut must_read = true;
        let mut last_read = Instant::now();
        loop {
            if must_read {
                if !read(&client, &from_cursor, ledger.host(), cursor, to).await? {
                    return Ok(());
                }
                last_read = Instant::now();
            }
            must_read = tokio::select! {
                woke = wake.recv() => {
                    let Some(first) = woke else {
                        return Err(LedgerError::Pool("the listening connection closed".into()));
                    };
                    let Some(read_after) = burst(first, &mut wake, ledger.host(), cursor, to).await
                    else {
                        return Ok(());
                    };
                    // The backstop runs on a busy stream too, not only after a quiet spell.
                    read_after || last_read.elapsed() >= BACKSTOP
                }
                _ = tokio::time::sleep(BACKSTOP) => true,
            };
        }
    }
    .await;
    drive.abort();
    result
}

/// Where a fresh stream starts: after the newest event, with the jobs open now (queued, or
/// held by this host) handed over first. `None` when the recipient is gone.
async fn first_cursor(
    client: &tokio_postgres::Client,
    ledger: &Ledger,
    to: &Recipient<FleetEvent>,
) -> Result<Option<Cursor>, LedgerError> {
    let row = client
        .query_one("SELECT coalesce(max(seq), 0) FROM ephemer_events", &[])
        .await?;
    let cursor = Cursor::after(row.get(0));
    let open = client
        .query(
            "SELECT info FROM ephemer_jobs WHERE phase = 'queued'
                OR (phase = 'held' AND holder = $1)
             ORDER BY received_at",
            &[&ledger.host()],
        )
        .await?;
    for row in open {
        if let Ok(info) = serde_json::from_value::<JobInfo>(row.get(0))
            && to.send(FleetEvent::Open(info)).await.is_err()
        {
            return Ok(None);
        }
    }
    Ok(Some(cursor))
}

/// A burst of notifications from `first` on: each carried event handed over in order.
/// Answers whether one carried none (a read follows), `None` when the recipient is gone.
async fn burst(
    first: String,
    wake: &mut tokio::sync::mpsc::UnboundedReceiver<String>,
    me: &str,
    cursor: &mut Cursor,
    to: &Recipient<FleetEvent>,
) -> Option<bool> {
    let mut read_after = false;
    let mut next = Some(first);
    while let Some(payload) = next {
        match Notice::parse(&payload) {
            Some(notice) => {
                if !notice.hand_over(me, cursor, to).await {
                    return None;
                }
            }
            None => read_after = true,
        }
        next = wake.try_recv().ok();
    }
    cursor.settle(Instant::now());
    Some(read_after)
}

/// Reads and hands over what is new. False when the recipient is gone.
async fn read(
    client: &tokio_postgres::Client,
    from_cursor: &tokio_postgres::Statement,
    me: &str,
    cursor: &mut Cursor,
    to: &Recipient<FleetEvent>,
) -> Result<bool, LedgerError> {
    loop {
        let rows = client.query(from_cursor, &[&cursor.low, &PAGE]).await?;
        let full = rows.len() as i64 == PAGE;
        for row in &rows {
            let seq: i64 = row.get(0);
            if !cursor.take(seq) {
                continue;
            }
            let action: String = row.get(1);
            let origin: String = row.get(2);
            let body: serde_json::Value = row.get(3);
            let Some(event) = decode(&action, origin, body, me) else {
                continue;
            };
            // `send` waits for room in the scheduler's mailbox: an event is never dropped.
            if to.send(event).await.is_err() {
                return Ok(false);
            }
        }
        cursor.settle(Instant::now());
        if !full {
            return Ok(true);
        }
    }
}

/// What a notification carries: a job event (with its place in the events table), or a
/// grant (which has none: a host that misses one asks the ledger, and is told "held").
#[derive(Debug, serde::Deserialize)]
#[serde(untagged)]
enum Notice {
    Event {
        seq: i64,
        action: String,
        origin: String,
        body: serde_json::Value,
    },
    Held {
        held: HeldNotice,
    },
}

#[derive(Debug, serde::Deserialize)]
struct HeldNotice {
    owner: String,
    job_id: i64,
    host: String,
}

impl Notice {
    /// `None` for an empty payload, or one this binary cannot read: the table has the event.
    fn parse(payload: &str) -> Option<Notice> {
        serde_json::from_str(payload).ok()
    }

    /// Hands the event over unless the cursor has it already (or it is this host's). False
    /// when the recipient is gone.
    async fn hand_over(self, me: &str, cursor: &mut Cursor, to: &Recipient<FleetEvent>) -> bool {
        let event = match self {
            Notice::Event {
                seq,
                action,
                origin,
                body,
            } => {
                if !cursor.take(seq) {
                    return true;
                }
                decode(&action, origin, body, me)
            }
            Notice::Held { held } => (held.host != me).then(|| FleetEvent::Held {
                key: JobKey::new(&held.owner, held.job_id as u64),
                host: held.host,
            }),
        };
        match event {
            Some(event) => to.send(event).await.is_ok(),
            None => true,
        }
    }
}

fn decode(action: &str, origin: String, body: serde_json::Value, me: &str) -> Option<FleetEvent> {
    if action == "released" {
        let job: Released = serde_json::from_value(body).ok()?;
        return Some(FleetEvent::Released { job, by: origin });
    }
    if origin == me {
        return None;
    }
    let action = match action {
        "queued" => JobAction::Queued,
        "in_progress" => JobAction::InProgress,
        "completed" => JobAction::Completed,
        _ => return None,
    };
    let info: JobInfo = serde_json::from_value(body).ok()?;
    Some(FleetEvent::Job {
        action,
        info,
        origin,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cursor_waits_for_a_gap_then_skips_it() {
        let t0 = Instant::now();
        let mut c = Cursor::after(10);
        assert!(c.take(11));
        assert!(c.take(13)); // 12 is not committed yet
        c.settle(t0);
        assert_eq!(c.low, 11);
        assert!(!c.take(13), "seen already");
        assert!(c.take(12), "the late one is still news");
        c.settle(t0 + Duration::from_secs(1));
        assert_eq!(c.low, 13);

        assert!(c.take(15)); // 14 rolled back
        c.settle(t0 + Duration::from_secs(2));
        assert_eq!(c.low, 13);
        c.settle(t0 + Duration::from_secs(2) + GAP_PATIENCE);
        assert_eq!(c.low, 15, "a gap older than the patience is skipped");
        assert!(!c.take(14), "below the mark: too late");
    }

    #[test]
    fn own_job_events_are_skipped_but_releases_are_not() {
        let info = serde_json::to_value(JobInfo::default()).unwrap();
        assert!(decode("queued", "me".into(), info.clone(), "me").is_none());
        assert!(matches!(
            decode("queued", "other".into(), info.clone(), "me"),
            Some(FleetEvent::Job {
                action: JobAction::Queued,
                ..
            })
        ));
        let released = serde_json::json!({"info": info, "attempts": 1});
        assert!(matches!(
            decode("released", "me".into(), released, "me"),
            Some(FleetEvent::Released { .. })
        ));
    }
}
