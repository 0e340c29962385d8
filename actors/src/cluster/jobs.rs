//! The ledger's job operations: recording deliveries, the claim decision, giving jobs back,
//! and where one job stands.

use std::time::Duration;

use super::{Acquire, JobHolder, Ledger, LedgerError, PACED_BUDGET, PACED_WINDOW};
use crate::job::{JobAction, JobInfo, JobKey};

impl Ledger {
    /// Records one delivery, idempotent by job id, and tells every host if it changed
    /// anything: a `queued` job is added once (a copy changes nothing); `in_progress` and
    /// `completed` move its phase forward (never back). One round trip. True when it was news.
    ///
    /// The event rides in the notification, so no host reads it back (one over PostgreSQL's
    /// 8000-byte payload limit is announced empty, and read from the table).
    pub async fn record(&self, action: JobAction, info: &JobInfo) -> Result<bool, LedgerError> {
        let phase = match action {
            JobAction::Queued => "queued",
            JobAction::InProgress => "running",
            JobAction::Completed => "completed",
            JobAction::Waiting => return Ok(false),
        };
        let body = serde_json::to_value(info).map_err(|e| LedgerError::Row(e.to_string()))?;
        let owner = info.key.owner.to_ascii_lowercase();
        let job = info.key.job_id as i64;
        let sql = "WITH up AS (
                INSERT INTO ephemer_jobs AS j (owner, job_id, info, phase, why)
                VALUES ($1, $2, $3, $4, $5 || ' (delivered to ' || $6 || ')')
                ON CONFLICT (owner, job_id) DO UPDATE
                    SET phase = EXCLUDED.phase, info = EXCLUDED.info, why = EXCLUDED.why,
                        updated_at = clock_timestamp()
                    WHERE EXCLUDED.phase <> 'queued' AND j.phase <> 'completed'
                      AND j.phase <> EXCLUDED.phase
                RETURNING j.owner, j.job_id
            ), ev AS (
                INSERT INTO ephemer_events (owner, job_id, action, origin, body)
                SELECT owner, job_id, $7, $6, $3 FROM up RETURNING seq
            )
            SELECT pg_notify('ephemer_events', CASE WHEN octet_length(p) < 7900 THEN p ELSE '' END)
            FROM (SELECT json_build_object('seq', seq, 'action', $7::text, 'origin', $6::text,
                                           'body', $3::jsonb)::text AS p FROM ev) n";
        let result = async {
            let client = self.client().await?;
            // Prepared once per connection: a statement prepared per call is a round trip of
            // its own.
            let statement = client.prepare_cached(sql).await?;
            let rows = client
                .query(
                    &statement,
                    &[
                        &owner,
                        &job,
                        &body,
                        &phase,
                        &action.as_str(),
                        &&*self.host,
                        &action.as_str(),
                    ],
                )
                .await?;
            Ok(!rows.is_empty())
        }
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
        let result = async {
            let client = self.client().await?;
            let statement = client
                .prepare_cached(
                    // A grant is announced to every host (see `stream::Notice`), so those
                    // waiting to ask for the job do not.
                    "SELECT a.outcome, a.detail, a.wait_ms,
                        CASE WHEN a.outcome = 'granted' THEN pg_notify('ephemer_events',
                            json_build_object('held', json_build_object(
                                'owner', $1::text, 'job_id', $2::bigint, 'host', $4::text))::text)
                        END
                     FROM ephemer_acquire($1, $2, $3, $4, $5, $6, $7) a",
                )
                .await?;
            let row = client
                .query_one(
                    &statement,
                    &[
                        &owner,
                        &job,
                        &body,
                        &&*self.host,
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
        }
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
