//! `Mirror`: the store changes that must survive this host (registrations made and gone, the
//! ladder of held jobs), written to the ledger in the order they were made, by one task. What
//! arrives while a write is out goes in the next one; a write the database refuses is kept
//! and tried again with backoff, in order, so the ledger catches up after an outage.

use std::{collections::HashSet, time::Duration};

use tokio::sync::mpsc;

use super::{Ledger, LedgerError};
use crate::store::{Op, RetryRow, RunnerRow};

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
            // Registrations in the ledger now: a runner's row is put again when it binds to a
            // job, which changes nothing there, so it is not sent again.
            let mut mirrored: HashSet<String> = HashSet::new();
            while let Some(first) = rx.recv().await {
                let mut batch = first;
                while let Ok(more) = rx.try_recv() {
                    batch.extend(more);
                }
                batch.retain(|op| match op {
                    Op::PutRunner(r) => mirrored.insert(r.name.clone()),
                    Op::DeleteRunner(name) => {
                        mirrored.remove(name);
                        true
                    }
                    _ => true,
                });
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

impl Ledger {
    /// Mirrors the store changes that must survive this host: registrations made and gone,
    /// and the ladder of the jobs it holds. One round trip for the lot.
    pub async fn mirror(&self, ops: &[Op]) -> Result<(), LedgerError> {
        let mut sql = String::new();
        let mut any = false;
        for op in ops {
            match op {
                Op::PutRunner(r) => {
                    any = true;
                    sql.push_str(&self.put_registration(r));
                }
                Op::DeleteRunner(name) => {
                    any = true;
                    sql.push_str(&format!(
                        "UPDATE ephemer_registrations SET gone_at = clock_timestamp() \
                         WHERE name = {};\n",
                        quote(name)
                    ));
                }
                Op::PutRetry(r) => {
                    any = true;
                    sql.push_str(&ladder(r));
                }
                _ => {}
            }
        }
        if !any {
            return Ok(());
        }
        let result = async {
            let client = self.client().await?;
            client.batch_execute(&sql).await?;
            Ok(())
        }
        .await;
        self.track(result)
    }

    fn put_registration(&self, r: &RunnerRow) -> String {
        format!(
            "INSERT INTO ephemer_registrations (name, runner_id, host, pool, repo, owner, job_id) \
             VALUES ({}, {}, {}, {}, {}, {}, {}) ON CONFLICT (name) DO NOTHING;\n",
            quote(&r.name),
            r.id as i64,
            quote(&self.host),
            quote(r.provider.as_str()),
            r.repo.as_deref().map_or("NULL".to_string(), quote),
            quote(&r.intent.owner.to_ascii_lowercase()),
            r.intent.job_id as i64,
        )
    }
}

/// The ladder of a held job, mirrored so it survives its host.
fn ladder(r: &RetryRow) -> String {
    let class = serde_json::to_value(r.class)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_default();
    format!(
        "UPDATE ephemer_jobs SET attempts = {}, first_failure = {}, next_attempt = {}, \
         failure_class = {}, last_error = {}, updated_at = clock_timestamp() \
         WHERE owner = {} AND job_id = {};\n",
        r.attempts,
        r.first_failure_unix as i64,
        r.next_attempt_unix as i64,
        quote(&class),
        quote(&r.last_error),
        quote(&r.job.key.owner.to_ascii_lowercase()),
        r.job.key.job_id as i64,
    )
}

/// A SQL string literal (standard_conforming_strings: only `'` needs doubling; NUL is
/// dropped, which PostgreSQL text cannot hold).
fn quote(s: &str) -> String {
    let mut q = String::with_capacity(s.len() + 2);
    q.push('\'');
    for c in s.chars() {
        match c {
            '\'' => q.push_str("''"),
            '\0' => {}
            c => q.push(c),
        }
    }
    q.push('\'');
    q
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoting_doubles_quotes_and_drops_nul() {
        assert_eq!(quote("it's"), "'it''s'");
        assert_eq!(quote("a\0b"), "'ab'");
        assert_eq!(quote(r"back\slash"), r"'back\slash'");
    }
}
