//! Fleet mode: which host listens for a scale set, by a lease in the ledger (docs/fleet.md).

use super::link::{Link, lease_key};
use crate::{cluster::ListenerLease, github::actions::types::Session};

/// Fleet mode: whether this host may listen (taking the lease, closing a dead holder's
/// session, resuming from its place); `Err(holder)` when another host listens.
pub(super) async fn take_lease(link: &mut Link, set: u64) -> Result<(), String> {
    let Some(ledger) = &link.wiring.ledger else {
        return Ok(());
    };
    let key = lease_key(&link.client, link.pool());
    match ledger.hold_listener(&key, ledger.lease()).await {
        Ok(ListenerLease::Held {
            stale_session,
            last_message_id,
        }) => {
            if let Some(stale) = stale_session {
                match link.client.delete_session(set, &stale).await {
                    Ok(()) => {
                        tracing::info!(pool = link.pool(), session = %stale, "scale set: took the listener lease; closed the previous holder's session")
                    }
                    Err(e) => {
                        tracing::debug!(error = %e, "scale set: the previous holder's session could not be closed")
                    }
                }
            }
            link.mark.last_message_id = link.mark.last_message_id.max(last_message_id);
            Ok(())
        }
        Ok(ListenerLease::HeldBy(host)) => Err(host),
        Err(e) => Err(format!("(the ledger did not answer: {e})")),
    }
}

/// Fleet mode: renews the lease with the session and place; false when another host took it.
pub(super) async fn renew_lease(link: &Link, session: &Session) -> bool {
    let Some(ledger) = &link.wiring.ledger else {
        return true;
    };
    let key = lease_key(&link.client, link.pool());
    let last = link.mark.last_message_id;
    match ledger
        .listener_progress(&key, Some(&session.session_id), last, ledger.lease())
        .await
    {
        Ok(held) => held,
        // A ledger that does not answer: keep listening (a lapse lets another host take over,
        // and that host's renewal then tells this one).
        Err(e) => {
            tracing::warn!(error = %e, "scale set: cannot renew the listener lease");
            true
        }
    }
}
