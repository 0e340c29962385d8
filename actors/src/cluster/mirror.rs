//! `Mirror`: the task that writes this host's lazy changes ([`super::lazy`]) when no round
//! trip took them along: [`super::lazy::LINGER`] after the oldest, or at once when a
//! cordoned or draining host gives its unstarted jobs back (after the writes before it: a job
//! whose registration just went is released only once the ledger knows it went). A write
//! the database refuses is kept in front and tried again with backoff, in order, so the
//! ledger catches up after an outage. Also the statements a lazy batch is written with.

use std::time::Duration;

use super::{
    Ledger, LedgerError,
    lazy::{Batch, Lazy},
};
use crate::{
    durable::{Op, RetryRow, RunnerRow},
    job::{JobAction, JobInfo},
};

/// Between attempts to mirror to the ledger: 250 ms, doubling to 10 s.
const MIRROR_BACKOFF: crate::retry::Doubling =
    crate::retry::Doubling::new(Duration::from_millis(250), Duration::from_secs(10));

/// A handle on the mirroring task. Cheap to clone; the task ends when the last is dropped.
#[derive(Debug, Clone)]
pub struct Mirror {
    inner: std::sync::Arc<Handle>,
}

#[derive(Debug)]
struct Handle {
    lazy: std::sync::Arc<Lazy>,
}

impl Drop for Handle {
    fn drop(&mut self) {
        // Wakes the task to see it is no longer wanted.
        self.lazy.wake.notify_one();
    }
}

impl Mirror {
    /// Starts the task on the current runtime.
    pub fn spawn(ledger: Ledger) -> Self {
        let inner = std::sync::Arc::new(Handle {
            lazy: ledger.lazy.clone(),
        });
        let alive = std::sync::Arc::downgrade(&inner);
        let lazy = ledger.lazy.clone();
        crate::tasks::spawn(async move {
            while alive.strong_count() > 0 {
                match lazy.due() {
                    None => {
                        lazy.wake.notified().await;
                        continue;
                    }
                    Some(at) if at > std::time::Instant::now() => {
                        let at = tokio::time::Instant::from_std(at);
                        tokio::select! {
                            () = tokio::time::sleep_until(at) => {}
                            () = lazy.wake.notified() => {}
                        }
                        continue;
                    }
                    Some(_) => {}
                }
                let mut wait = MIRROR_BACKOFF.first;
                while alive.strong_count() > 0 {
                    match ledger.write_pending().await {
                        Ok(release) => {
                            if release {
                                match ledger.release_unstarted().await {
                                    Ok(0) => {}
                                    Ok(n) => tracing::info!(
                                        jobs = n,
                                        "gave unstarted jobs back to the fleet"
                                    ),
                                    Err(e) => {
                                        tracing::warn!(error = %e, "cannot give jobs back to the fleet; their lease does when it expires")
                                    }
                                }
                            }
                            break;
                        }
                        Err(e) => {
                            tracing::warn!(error = %e, retry_in = ?wait, "cannot mirror to the cluster ledger; kept in order");
                            tokio::time::sleep(wait).await;
                            wait = MIRROR_BACKOFF.following(Some(wait));
                        }
                    }
                }
            }
        });
        Mirror { inner }
    }

    /// Queues the ops the ledger keeps (the others are host-local); with `release`, the jobs
    /// this host holds and has no live registration for go back to the fleet once they are
    /// written (a cordoned or draining host: a claim it abandons, or a runner that failed at
    /// boot, leaves a job no other host may take while this host's lease is current).
    pub fn send(&self, ops: &[Op], release: bool) {
        self.inner.lazy.push_ops(ops, release);
    }
}

/// Registrations made: one row each, from arrays (every value a bound parameter).
const PUT_REGISTRATIONS: &str = "INSERT INTO ephemer_registrations \
     (name, runner_id, host, pool, repo, owner, job_id) \
     SELECT u.n, u.r, $3, u.p, u.rp, u.o, u.j \
     FROM unnest($1::text[], $2::bigint[], $4::text[], $5::text[], $6::text[], $7::bigint[]) \
     AS u(n, r, p, rp, o, j) ON CONFLICT (name) DO NOTHING";
/// Registrations whose environment is gone ($1) are marked so; the ones gone from GitHub too
/// ($2) are forgotten, so a survivor of this host is never handed them to delete. (A row is
/// changed once per statement: the mark skips what is forgotten.)
const GONE_REGISTRATIONS: &str = "WITH gone AS ( \
         UPDATE ephemer_registrations SET gone_at = clock_timestamp() \
         WHERE name = ANY($1::text[]) AND NOT name = ANY($2::text[])) \
     DELETE FROM ephemer_registrations WHERE name = ANY($2::text[])";
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
    /// Registrations gone from GitHub.
    unregistered: Vec<String>,
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
                Op::Unregistered(name) => c.unregistered.push(name.clone()),
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

    #[cfg(test)]
    fn is_empty(&self) -> bool {
        self.put.names.is_empty()
            && self.gone.is_empty()
            && self.unregistered.is_empty()
            && self.ladders.is_empty()
    }
}

/// Job events, as columns: owners, job ids, bodies, phases, actions.
#[derive(Debug, Default)]
struct Events {
    owners: Vec<String>,
    jobs: Vec<i64>,
    bodies: Vec<serde_json::Value>,
    phases: Vec<&'static str>,
    actions: Vec<&'static str>,
}

impl Events {
    fn of(events: &[(JobAction, JobInfo)]) -> Result<Self, LedgerError> {
        let mut e = Events::default();
        for (action, info) in events {
            let Some(phase) = super::jobs::phase_of(*action) else {
                continue;
            };
            e.owners.push(info.key.owner.to_ascii_lowercase());
            e.jobs.push(info.key.job_id as i64);
            e.bodies
                .push(serde_json::to_value(info).map_err(|x| LedgerError::Row(x.to_string()))?);
            e.phases.push(phase);
            e.actions.push(action.as_str());
        }
        Ok(e)
    }
}

/// Job events recorded: each job's row moved forward (never back; a `queued` one added once),
/// an event and its notification per change (the event rides in it; one over PostgreSQL's
/// 8000-byte payload limit is announced empty). A `queued` delivery's record is one of these
/// on its own; the lazy starts and ends go many in one.
pub(super) const RECORD_EVENTS: &str = "WITH u AS (
        SELECT * FROM unnest($1::text[], $2::bigint[], $3::jsonb[], $4::text[], $5::text[])
            AS u(owner, job_id, info, phase, action)
    ), up AS (
        INSERT INTO ephemer_jobs AS j (owner, job_id, info, phase, why)
        SELECT u.owner, u.job_id, u.info, u.phase, u.action || ' (delivered to ' || $6 || ')'
        FROM u
        ON CONFLICT (owner, job_id) DO UPDATE
            SET phase = EXCLUDED.phase, info = EXCLUDED.info, why = EXCLUDED.why,
                updated_at = clock_timestamp()
            WHERE EXCLUDED.phase <> 'queued' AND j.phase <> 'completed'
              AND j.phase <> EXCLUDED.phase
        RETURNING j.owner, j.job_id
    ), ev AS (
        INSERT INTO ephemer_events (owner, job_id, action, origin, body)
        SELECT u.owner, u.job_id, u.action, $6, u.info
        FROM up JOIN u ON u.owner = up.owner AND u.job_id = up.job_id
        RETURNING seq, action, body
    )
    SELECT pg_notify('ephemer_events', CASE WHEN octet_length(p) < 7900 THEN p ELSE '' END)
    FROM (SELECT json_build_object('seq', seq, 'action', action, 'origin', $6::text,
                                   'body', body)::text AS p FROM ev) n";

impl Ledger {
    /// Queues store ops for the ledger as [`Mirror::send`] does (without the task, they are
    /// written along this host's next round trip, or by [`Ledger::write_pending`]).
    pub fn queue_ops(&self, ops: &[Op], release: bool) {
        self.lazy.push_ops(ops, release);
    }

    /// Writes what waits in this host's lazy queue, if no other write of it is out: its own
    /// round trip. True when jobs are to be given back now (the caller does that after).
    pub async fn write_pending(&self) -> Result<bool, LedgerError> {
        let _writer = self.lazy.writer.lock().await;
        let batch = self.lazy.take();
        if batch.ops.is_empty() && batch.events.is_empty() {
            return Ok(batch.release);
        }
        let result = async {
            let client = self.client().await?;
            self.write_batch(&client, &batch).await
        }
        .await;
        let release = batch.release;
        if result.is_err() {
            self.lazy.put_back(batch);
        }
        self.track(result).map(|()| release)
    }

    /// Writes `batch` on `client`: registrations made and gone, the ladder of the jobs this
    /// host holds, job events. At most four statements, every value a bound parameter, sent
    /// together (pipelined, no round trip of their own when they ride along another), in
    /// order. Each is idempotent, so a batch the database refused is simply sent again.
    pub(super) async fn write_batch(
        &self,
        client: &deadpool_postgres::Object,
        batch: &Batch,
    ) -> Result<(), LedgerError> {
        let c = Columns::of(&batch.ops);
        let e = Events::of(&batch.events)?;
        let (put, gone, ladders, events) = futures_util::try_join!(
            client.prepare_cached(PUT_REGISTRATIONS),
            client.prepare_cached(GONE_REGISTRATIONS),
            client.prepare_cached(PUT_LADDERS),
            client.prepare_cached(RECORD_EVENTS),
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
                if c.gone.is_empty() && c.unregistered.is_empty() {
                    return Ok(0);
                }
                client.execute(&gone, &[&c.gone, &c.unregistered]).await
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
            async {
                if e.jobs.is_empty() {
                    return Ok(0);
                }
                client
                    .execute(
                        &events,
                        &[&e.owners, &e.jobs, &e.bodies, &e.phases, &e.actions, &host],
                    )
                    .await
            },
        )?;
        Ok(())
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
            Op::Unregistered("r'1".into()),
            Op::JobStarted(JobKey::new("acme", 1), 3),
        ]);
        assert_eq!(c.put.names, ["r'1"]);
        assert_eq!(c.put.owners, ["acme"], "owners are kept lowercase");
        assert_eq!(c.gone, ["r'1"]);
        assert_eq!(c.unregistered, ["r'1"]);
        assert_eq!(c.ladders.len(), 1);
        assert_eq!(c.ladders[0].attempts, 2, "the last row of a job wins");
        assert!(Columns::of(&[Op::JobStarted(JobKey::new("a", 1), 1)]).is_empty());
    }
}
