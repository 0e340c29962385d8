//! `Mirror`: the store changes that must survive this host (registrations made and gone, the
//! ladder of held jobs), written to the ledger in the order they were made, by one task. What
//! arrives while a write is out goes in the next one; a write the database refuses is kept
//! and tried again with backoff, in order, so the ledger catches up after an outage.

use std::time::Duration;

use tokio::sync::mpsc;

use super::Ledger;
use crate::store::Op;

/// A handle on the mirroring task. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Mirror {
    tx: mpsc::UnboundedSender<Vec<Op>>,
}

impl Mirror {
    /// Starts the task on the current runtime.
    pub fn spawn(ledger: Ledger) -> Self {
        let (tx, mut rx) = mpsc::unbounded_channel::<Vec<Op>>();
        actix_rt::spawn(async move {
            while let Some(first) = rx.recv().await {
                let mut batch = first;
                while let Ok(more) = rx.try_recv() {
                    batch.extend(more);
                }
                let mut wait = Duration::from_millis(250);
                while let Err(e) = ledger.mirror(&batch).await {
                    tracing::warn!(error = %e, ops = batch.len(), retry_in = ?wait, "cannot mirror to the cluster ledger; kept in order");
                    tokio::time::sleep(wait).await;
                    wait = (wait * 2).min(Duration::from_secs(10));
                    while let Ok(more) = rx.try_recv() {
                        batch.extend(more);
                    }
                }
            }
        });
        Mirror { tx }
    }

    /// Queues the ops the ledger keeps (the others are host-local).
    pub fn send(&self, ops: &[Op]) {
        let kept: Vec<Op> = ops
            .iter()
            .filter(|op| matches!(op, Op::PutRunner(_) | Op::DeleteRunner(_) | Op::PutRetry(_)))
            .cloned()
            .collect();
        if !kept.is_empty() {
            let _ = self.tx.send(kept);
        }
    }
}
