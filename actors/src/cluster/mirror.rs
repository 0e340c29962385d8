//! `Mirror`: the store changes that must survive this host (registrations made and gone, the
//! ladder of held jobs), written to the ledger in the order they were made, by one task. What
//! arrives while a write is out goes in the next one; a write the database refuses is kept
//! and tried again with backoff, in order, so the ledger catches up after an outage. A
//! cordoned or draining host also gives its unstarted jobs back to the fleet here, after the
//! writes before it: a job whose registration just went is released only once the ledger
//! knows it went.

use std::{collections::HashSet, time::Duration};

use tokio::sync::mpsc;

use super::{Ledger, LedgerError};
use crate::durable::{Op, RetryRow, RunnerRow};

/// A handle on the mirroring task. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Mirror {
    tx: mpsc::UnboundedSender<Batch>,
}

/// Ops to mirror, and whether to give unstarted jobs back to the fleet once they are written.
#[derive(Debug, Default)]
struct Batch {
    ops: Vec<Op>,
    release: bool,
}

impl Batch {
    fn extend(&mut self, more: Batch) {
        self.ops.extend(more.ops);
        self.release |= more.release;
    }
}

impl Mirror {
    /// Starts the task on the current runtime.
    pub fn spawn(ledger: Ledger) -> Self {
        let (tx, mut rx) = mpsc::unbounded_channel::<Batch>();
        actix_rt::spawn(async move {
            // Registrations in the ledger now: a runner's row is put again when it binds to a
            // job, which changes nothing there, so it is not sent again.
            let mut mirrored: HashSet<String> = HashSet::new();
            while let Some(first) = rx.recv().await {
                let mut batch = first;
                while let Ok(more) = rx.try_recv() {
                    batch.extend(more);
                }
                batch.ops.retain(|op| match op {
                    Op::PutRunner(r) => mirrored.insert(r.name.clone()),
                    Op::DeleteRunner(name) => {
                        mirrored.remove(name);
                        true
                    }
                    _ => true,
                });
                let mut wait = Duration::from_millis(250);
                while let Err(e) = ledger.mirror(&batch.ops).await {
                    tracing::warn!(error = %e, ops = batch.ops.len(), retry_in = ?wait, "cannot mirror to the cluster ledger; kept in order");
                    tokio::time::sleep(wait).await;
                    wait = (wait * 2).min(Duration::from_secs(10));
                    while let Ok(more) = rx.try_recv() {
                        batch.extend(more);
                    }
                }
                if batch.release {
                    match ledger.release_unstarted().await {
                        Ok(0) => {}
                        Ok(n) => tracing::info!(jobs = n, "gave unstarted jobs back to the fleet"),
                        Err(e) => {
                            tracing::warn!(error = %e, "cannot give jobs back to the fleet; their lease does when it expires")
                        }
                    }
                }
            }
        });
        Mirror { tx }
    }

    /// Queues the ops the ledger keeps (the others are host-local); with `release`, the jobs
    /// this host holds and has no live registration for go back to the fleet once they are
    /// written (a cordoned or draining host: a claim it abandons, or a runner that failed at
    /// boot, leaves a job no other host may take while this host's lease is current).
    pub fn send(&self, ops: &[Op], release: bool) {
        let kept: Vec<Op> = ops
            .iter()
            .filter(|op| matches!(op, Op::PutRunner(_) | Op::DeleteRunner(_) | Op::PutRetry(_)))
            .cloned()
            .collect();
        if !kept.is_empty() || release {
            let _ = self.tx.send(Batch { ops: kept, release });
        }
    }
}

/// Registrations made: one row each, from arrays (every value a bound parameter).
const PUT_REGISTRATIONS: &str = "INSERT INTO ephemer_registrations \
     (name, runner_id, host, pool, repo, owner, job_id) \
     SELECT u.n, u.r, $3, u.p, u.rp, u.o, u.j \
     FROM unnest($1::text[], $2::bigint[], $4::text[], $5::text[], $6::text[], $7::bigint[]) \
     AS u(n, r, p, rp, o, j) ON CONFLICT (name) DO NOTHING";
/// Registrations whose environment is gone.
const GONE_REGISTRATIONS: &str = "UPDATE ephemer_registrations SET gone_at = clock_timestamp() \
     WHERE name = ANY($1::text[])";
/// The ladder of held jobs.
const PUT_LADDERS: &str = "UPDATE ephemer_jobs SET attempts = u.a, first_failure = u.f, \
     next_attempt = u.n, failure_class = u.c, last_error = u.e, updated_at = clock_timestamp() \
     FROM unnest($1::int[], $2::bigint[], $3::bigint[], $4::text[], $5::text[], $6::text[], \
     $7::bigint[]) AS u(a, f, n, c, e, o, j) \
     WHERE ephemer_jobs.owner = u.o AND ephemer_jobs.job_id = u.j";

/// Registrations made, as columns: names, runner ids, pools, repos, owners, job ids.
#[derive(Debug, Default)]
struct Registrations {
    names: Vec<String>,
    ids: Vec<i64>,
    pools: Vec<String>,
    repos: Vec<Option<String>>,
    owners: Vec<String>,
    jobs: Vec<i64>,
}

/// A batch of mirrored ops as the columns of the three statements.
#[derive(Debug, Default)]
struct Columns {
    put: Registrations,
    gone: Vec<String>,
    /// Per job, its last ladder row in the batch.
    ladders: Vec<RetryRow>,
}

impl Columns {
    fn of(ops: &[Op]) -> Self {
        let mut c = Columns::default();
        for op in ops {
            match op {
                Op::PutRunner(r) => c.put_registration(r),
                Op::DeleteRunner(name) => c.gone.push(name.clone()),
                Op::PutRetry(r) => {
                    c.ladders.retain(|l| l.job.key != r.job.key);
                    c.ladders.push(r.clone());
                }
                _ => {}
            }
        }
        c
    }

    fn put_registration(&mut self, r: &RunnerRow) {
        let p = &mut self.put;
        p.names.push(r.name.clone());
        p.ids.push(r.id as i64);
        p.pools.push(r.provider.as_str().to_string());
        p.repos.push(r.repo.clone());
        p.owners.push(r.intent.owner.to_ascii_lowercase());
        p.jobs.push(r.intent.job_id as i64);
    }

    fn is_empty(&self) -> bool {
        self.put.names.is_empty() && self.gone.is_empty() && self.ladders.is_empty()
    }
}

impl Ledger {
    /// Mirrors the store changes that must survive this host: registrations made and gone,
    /// and the ladder of the jobs it holds. At most three statements, every value a bound
    /// parameter, sent together (pipelined: one round trip for the lot, in order: made, gone,
    /// ladders). Each is idempotent, so a batch the database refused is simply sent again.
    pub async fn mirror(&self, ops: &[Op]) -> Result<(), LedgerError> {
        let c = Columns::of(ops);
        if c.is_empty() {
            return Ok(());
        }
        let result = async {
            let client = self.client().await?;
            let (put, gone, ladders) = futures_util::try_join!(
                client.prepare_cached(PUT_REGISTRATIONS),
                client.prepare_cached(GONE_REGISTRATIONS),
                client.prepare_cached(PUT_LADDERS),
            )?;
            let class = |r: &RetryRow| {
                serde_json::to_value(r.class)
                    .ok()
                    .and_then(|v| v.as_str().map(str::to_string))
                    .unwrap_or_default()
            };
            let l = &c.ladders;
            let attempts: Vec<i32> = l.iter().map(|r| r.attempts as i32).collect();
            let first: Vec<i64> = l.iter().map(|r| r.first_failure_unix as i64).collect();
            let next: Vec<i64> = l.iter().map(|r| r.next_attempt_unix as i64).collect();
            let classes: Vec<String> = l.iter().map(class).collect();
            let errors: Vec<String> = l.iter().map(|r| r.last_error.replace('\0', "")).collect();
            let owners: Vec<String> = l
                .iter()
                .map(|r| r.job.key.owner.to_ascii_lowercase())
                .collect();
            let jobs: Vec<i64> = l.iter().map(|r| r.job.key.job_id as i64).collect();
            let p = &c.put;
            let host: &str = &self.host;
            futures_util::try_join!(
                async {
                    if p.names.is_empty() {
                        return Ok(0);
                    }
                    client
                        .execute(
                            &put,
                            &[
                                &p.names, &p.ids, &host, &p.pools, &p.repos, &p.owners, &p.jobs,
                            ],
                        )
                        .await
                },
                async {
                    if c.gone.is_empty() {
                        return Ok(0);
                    }
                    client.execute(&gone, &[&c.gone]).await
                },
                async {
                    if l.is_empty() {
                        return Ok(0);
                    }
                    client
                        .execute(
                            &ladders,
                            &[&attempts, &first, &next, &classes, &errors, &owners, &jobs],
                        )
                        .await
                },
            )?;
            Ok(())
        }
        .await;
        self.track(result)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{config::PoolName, job::JobKey, scheduler::fixtures::job};

    #[test]
    fn a_batch_becomes_columns_with_the_last_ladder_row_of_each_job() {
        let row = |id: u64, attempts: u32| RetryRow {
            job: job(id, &["self-hosted"]),
            attempts,
            first_failure_unix: 1,
            next_attempt_unix: 2,
            class: crate::github::ErrorClass::ServerSide,
            last_error: "it's; DROP TABLE ephemer_jobs; --".into(),
        };
        let runner = RunnerRow {
            name: "r'1".into(),
            id: 7,
            provider: PoolName::from("local"),
            repo: None,
            intent: JobKey::new("Acme", 9),
            bound: None,
            created_unix: 0,
        };
        let c = Columns::of(&[
            Op::PutRetry(row(1, 1)),
            Op::PutRunner(runner),
            Op::PutRetry(row(1, 2)),
            Op::DeleteRunner("r'1".into()),
            Op::JobStarted(JobKey::new("acme", 1), 3),
        ]);
        assert_eq!(c.put.names, ["r'1"]);
        assert_eq!(c.put.owners, ["acme"], "owners are kept lowercase");
        assert_eq!(c.gone, ["r'1"]);
        assert_eq!(c.ladders.len(), 1);
        assert_eq!(c.ladders[0].attempts, 2, "the last row of a job wins");
        assert!(Columns::of(&[Op::JobStarted(JobKey::new("a", 1), 1)]).is_empty());
    }
}
