//! The ledger's job operations: recording deliveries, the claim decision, giving jobs back,
//! and where one job stands.

use std::time::Duration;

use futures_util::future::LocalBoxFuture;

use super::{Acquire, JobHolder, Ledger, LedgerError, PACED_BUDGET, PACED_WINDOW};
use crate::job::{JobAction, JobInfo, JobKey};

/// The ledger's phase a job event moves a job to (`waiting` moves nothing).
pub(super) fn phase_of(action: JobAction) -> Option<&'static str> {
    match action {
        JobAction::Queued => Some("queued"),
        JobAction::InProgress => Some("running"),
        JobAction::Completed => Some("completed"),
        JobAction::Waiting => None,
    }
}

/// The claim decision; a grant is announced to every host (see `stream::Notice`), so those
/// waiting to ask for the job do not.
const ACQUIRE: &str = "SELECT a.outcome, a.detail, a.wait_ms,
        CASE WHEN a.outcome = 'granted' THEN pg_notify('ephemer_events',
            json_build_object('held', json_build_object(
                'owner', $1::text, 'job_id', $2::bigint, 'host', $4::text))::text)
        END
    FROM ephemer_acquire($1, $2, $3, $4, $5, $6, $7) a";

impl Ledger {
    /// Queues an `in_progress` or `completed` delivery to be recorded with this host's next
    /// round trip (or after [`super::lazy::LINGER`]), and says every host of it then. False
    /// when the queue is full (a ledger down for long): record it now instead.
    pub fn record_later(&self, action: JobAction, info: &JobInfo) -> bool {
        self.lazy.push_event(action, info.clone())
    }

    /// Takes this host's lazy queue along a round trip it makes anyway, when no other write
    /// of it is out: the writer's guard and the batch.
    fn ride(&self) -> Option<(tokio::sync::OwnedMutexGuard<()>, super::lazy::Batch)> {
        if !self.lazy.rideable() {
            return None;
        }
        let guard = self.lazy.writer.clone().try_lock_owned().ok()?;
        let batch = self.lazy.take();
        Some((guard, batch))
    }

    /// One round trip: `own` (its own statement) on a pooled connection, with this host's lazy
    /// queue riding along when it can (pipelined on the same connection, after `own`). Answers
    /// as soon as `own`'s answer is in; the ride finishes on its own, and a batch the database
    /// refused goes back in front of the queue (the mirror task tries it again).
    async fn round_trip<T: 'static>(
        &self,
        own: impl for<'c> FnOnce(
            &'c deadpool_postgres::Object,
        ) -> LocalBoxFuture<'c, Result<T, LedgerError>>
        + 'static,
    ) -> Result<T, LedgerError> {
        let client = self.client().await?;
        let Some((guard, batch)) = self.ride() else {
            return own(&client).await;
        };
        let (tx, rx) = tokio::sync::oneshot::channel();
        let ledger = self.clone();
        crate::tasks::spawn(async move {
            let own = async {
                let _ = tx.send(own(&client).await);
            };
            let ((), rode) = futures_util::join!(own, ledger.write_batch(&client, &batch));
            if let Err(e) = rode {
                tracing::debug!(error = %e, "lazy ledger changes refused along a round trip; the mirror task tries again");
                ledger.lazy.put_back(batch);
                drop(guard);
                ledger.lazy.wake.notify_one();
            }
        });
        rx.await
            .unwrap_or_else(|_| Err(LedgerError::Pool("the round trip was dropped".into())))
    }

    /// Records one delivery, idempotent by job id, and tells every host if it changed
    /// anything: a `queued` job is added once (a copy changes nothing); `in_progress` and
    /// `completed` move its phase forward (never back). One round trip. True when it was news.
    ///
    /// The event rides in the notification, so no host reads it back (one over PostgreSQL's
    /// 8000-byte payload limit is announced empty, and read from the table).
    pub async fn record(&self, action: JobAction, info: &JobInfo) -> Result<bool, LedgerError> {
        let Some(phase) = phase_of(action) else {
            return Ok(false);
        };
        let body = serde_json::to_value(info).map_err(|e| LedgerError::Row(e.to_string()))?;
        let owner = info.key.owner.to_ascii_lowercase();
        let job = info.key.job_id as i64;
        let host = self.host.clone();
        let result = self
            .round_trip(move |client| {
                Box::pin(async move {
                    // Prepared once per connection: a statement prepared per call is a round
                    // trip of its own.
                    let statement = client.prepare_cached(super::mirror::RECORD_EVENTS).await?;
                    let (owners, jobs, bodies) = (vec![owner], vec![job], vec![body]);
                    let (phases, actions) = (vec![phase], vec![action.as_str()]);
                    let rows = client
                        .query(
                            &statement,
                            &[&owners, &jobs, &bodies, &phases, &actions, &&*host],
                        )
                        .await?;
                    Ok(!rows.is_empty())
                })
            })
            .await;
        self.track(result)
    }

    /// Asks to hold `info`'s job for a claim (see [`Acquire`]); a grant is announced to every
    /// host. One round trip.
    pub async fn acquire(&self, info: &JobInfo) -> Result<Acquire, LedgerError> {
        let body = serde_json::to_value(info).map_err(|e| LedgerError::Row(e.to_string()))?;
        let owner = info.key.owner.to_ascii_lowercase();
        let job = info.key.job_id as i64;
        let fresh = crate::retry::RATE_READING_FRESH.as_secs() as i32;
        let (credential, per_minute) = self.budget_of(&owner);
        let (credential, host) = (credential.to_string(), self.host.clone());
        let result = self
            .round_trip(move |client| {
                Box::pin(async move {
                    let statement = client.prepare_cached(ACQUIRE).await?;
                    let row = client
                        .query_one(
                            &statement,
                            &[
                                &owner,
                                &job,
                                &body,
                                &&*host,
                                &credential,
                                &per_minute,
                                &fresh,
                            ],
                        )
                        .await?;
                    let outcome: String = row.get(0);
                    let detail: String = row.get(1);
                    let wait: i64 = row.get(2);
                    Ok(match outcome.as_str() {
                        "granted" => Acquire::Granted,
                        "held" => Acquire::HeldBy(detail),
                        "started" => Acquire::Started,
                        _ => Acquire::Paced {
                            wait: Duration::from_millis(wait.max(1) as u64),
                            why: if detail.contains("budget") {
                                PACED_BUDGET
                            } else {
                                PACED_WINDOW
                            },
                        },
                    })
                })
            })
            .await;
        self.track(result)
    }

    /// Gives back the jobs this host holds and has made no registration for (a drain or a
    /// cordon: another host may take them). Their ladder goes with them.
    pub async fn release_unstarted(&self) -> Result<u64, LedgerError> {
        let result = async {
            let client = self.client().await?;
            let rows = client
                .query(
                    "WITH released AS (
                        UPDATE ephemer_jobs j SET phase = 'queued', holder = NULL,
                            why = 'released by ' || j.holder || ' (cordoned or draining)',
                            updated_at = clock_timestamp()
                        WHERE j.holder = $1 AND j.phase = 'held' AND NOT EXISTS (
                            SELECT 1 FROM ephemer_registrations g
                            WHERE g.owner = j.owner AND g.job_id = j.job_id AND g.host = $1
                              AND g.gone_at IS NULL)
                        RETURNING j.*
                    ), ev AS (
                        INSERT INTO ephemer_events (owner, job_id, action, origin, body)
                        SELECT r.owner, r.job_id, 'released', $1, jsonb_build_object(
                            'info', r.info, 'attempts', r.attempts,
                            'first_failure', r.first_failure, 'next_attempt', r.next_attempt,
                            'class', r.failure_class, 'last_error', r.last_error)
                        FROM released r RETURNING seq
                    )
                    SELECT pg_notify('ephemer_events', '') FROM ev",
                    &[&&*self.host],
                )
                .await?;
            Ok(rows.len() as u64)
        }
        .await;
        self.track(result)
    }

    /// Where the ledger says a job stands.
    pub async fn job(&self, key: &JobKey) -> Result<Option<JobHolder>, LedgerError> {
        let result = async {
            let client = self.client().await?;
            let row = client
                .query_opt(
                    "SELECT phase, holder, why, attempts FROM ephemer_jobs
                     WHERE owner = $1 AND job_id = $2",
                    &[&key.owner.to_ascii_lowercase(), &(key.job_id as i64)],
                )
                .await?;
            Ok(row.map(|r| JobHolder {
                phase: r.get(0),
                holder: r.get(1),
                why: r.get(2),
                attempts: r.get(3),
            }))
        }
        .await;
        self.track(result)
    }
}
