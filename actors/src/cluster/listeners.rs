//! Scale-set mode across a fleet: one host listens per scale set. The lease is a row per scale
//! set naming the host; the holder renews it while it listens, and a host may take it once it
//! lapsed (its holder died), closing the dead holder's session and resuming from the last
//! message that holder acknowledged.

use std::time::Duration;

use super::{Ledger, LedgerError};

/// What asking for a scale set's listener lease answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ListenerLease {
    /// This host holds it: close `stale_session` (the previous holder's, or this host's own
    /// from before a restart) and resume after `last_message_id`.
    Held {
        /// A session left open by the previous holder.
        stale_session: Option<String>,
        /// The last message acknowledged.
        last_message_id: u64,
    },
    /// Another host holds it, until its lease lapses.
    HeldBy(String),
}

impl Ledger {
    /// Takes or renews the lease of `scale_set` for `ttl`: granted when no host holds it, this
    /// host does, or the holder's lease lapsed.
    pub async fn hold_listener(
        &self,
        scale_set: &str,
        ttl: Duration,
    ) -> Result<ListenerLease, LedgerError> {
        let client = self.client().await?;
        let row = client
            .query_opt(
                "INSERT INTO ephemer_listeners (scale_set, host, lease_until)
                 VALUES ($1, $2, clock_timestamp() + $3::bigint * interval '1 millisecond')
                 ON CONFLICT (scale_set) DO UPDATE
                    SET host = EXCLUDED.host, lease_until = EXCLUDED.lease_until
                    WHERE ephemer_listeners.host = EXCLUDED.host
                       OR ephemer_listeners.lease_until < clock_timestamp()
                 RETURNING session_id, last_message_id",
                &[&scale_set, &self.host(), &(ttl.as_millis() as i64)],
            )
            .await?;
        if let Some(row) = row {
            let last: i64 = row.get(1);
            return Ok(ListenerLease::Held {
                stale_session: row.get(0),
                last_message_id: last.max(0) as u64,
            });
        }
        let holder = client
            .query_opt(
                "SELECT host FROM ephemer_listeners WHERE scale_set = $1",
                &[&scale_set],
            )
            .await?
            .map(|r| r.get::<_, String>(0))
            .unwrap_or_default();
        Ok(ListenerLease::HeldBy(holder))
    }

    /// Renews this host's lease with its session and place; false when another host holds it
    /// now (this host must stop listening).
    pub async fn listener_progress(
        &self,
        scale_set: &str,
        session_id: Option<&str>,
        last_message_id: u64,
        ttl: Duration,
    ) -> Result<bool, LedgerError> {
        let client = self.client().await?;
        let n = client
            .execute(
                "UPDATE ephemer_listeners
                    SET session_id = $3,
                        last_message_id = greatest(last_message_id, $4),
                        lease_until = clock_timestamp() + $5::bigint * interval '1 millisecond'
                  WHERE scale_set = $1 AND host = $2",
                &[
                    &scale_set,
                    &self.host(),
                    &session_id,
                    &(last_message_id as i64),
                    &(ttl.as_millis() as i64),
                ],
            )
            .await?;
        Ok(n == 1)
    }

    /// Gives the lease up (its session closed), so another host may take it at once.
    pub async fn release_listener(&self, scale_set: &str) -> Result<(), LedgerError> {
        let client = self.client().await?;
        client
            .execute(
                "UPDATE ephemer_listeners SET lease_until = clock_timestamp(), session_id = NULL
                  WHERE scale_set = $1 AND host = $2",
                &[&scale_set, &self.host()],
            )
            .await?;
        Ok(())
    }
}
