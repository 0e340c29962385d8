//! Fleet mode: many hosts serve one org through a shared PostgreSQL ledger.
//!
//! The ledger holds what must survive a host: every accepted job with its phase and who holds
//! it, the retry ladder of held jobs, the JIT registrations made (runner id, name, host), each
//! host's lease, and each credential's claim window and rate readings. What is host-local
//! (processes, containers, VMs) stays in the host's own store.
//!
//! - Intake: any host records any delivery ([`Ledger::record`], idempotent by job id, committed
//!   before the 202) and every host hears it: `NOTIFY` wakes the listeners, which read the
//!   events table from their cursor ([`stream`]), so a missed notification loses nothing.
//! - Arbitration: before a claim, a host asks [`Ledger::acquire`], one round trip into
//!   `ephemer_acquire`, which decides under row locks: a job is held by at most one live host;
//!   the credential's fleet-wide claim window and its registration budget are checked there,
//!   under the credential's row lock, so three hosts share one budget.
//! - Leases: each host renews its lease on a heartbeat ([`actor::FleetActor`]) and reaps the
//!   hosts whose lease expired: their unstarted jobs go back to `queued` with their ladder,
//!   their idle registrations are deleted on GitHub. A running job is GitHub's.
//!
//! The schema is versioned and migrated at start ([`schema`]).

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::Duration,
};

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod};
use serde::{Deserialize, Serialize};
use sha2::Digest;

use crate::{
    config::{ClusterConfig, Config, GithubAuth},
    job::{JobAction, JobInfo, JobKey},
    store::{Op, RetryRow, RunnerRow},
    vocab::ErrorClass,
};

pub mod actor;
mod connect;
mod mirror;
pub mod schema;
pub mod stream;

pub use actor::FleetActor;
pub use mirror::Mirror;

/// The channel `NOTIFY` wakes listeners on.
pub const CHANNEL: &str = "ephemer_events";

/// A ledger operation that failed.
#[derive(Debug, thiserror::Error)]
pub enum LedgerError {
    /// The database answered with an error, or the connection broke.
    #[error("database: {0}")]
    Db(#[from] tokio_postgres::Error),
    /// No connection could be had from the pool.
    #[error("database unreachable: {0}")]
    Pool(String),
    /// The schema is newer than this binary.
    #[error(
        "the ledger's schema is version {found}, newer than this binary knows ({known}): upgrade \
         ephemer-actors on this host"
    )]
    SchemaTooNew {
        /// In the database.
        found: i32,
        /// Known here.
        known: i32,
    },
    /// A row the ledger wrote could not be read back.
    #[error("ledger row: {0}")]
    Row(String),
}

impl From<deadpool_postgres::PoolError> for LedgerError {
    fn from(e: deadpool_postgres::PoolError) -> Self {
        LedgerError::Pool(e.to_string())
    }
}

/// The answer to a claim request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Acquire {
    /// This host holds the job: claim it.
    Granted,
    /// Another live host holds it.
    HeldBy(String),
    /// GitHub already runs (or ran) it.
    Started,
    /// Not now: the fleet's claim window is full or the registration budget is empty.
    Paced {
        /// For how long.
        wait: Duration,
        /// Why.
        why: &'static str,
    },
}

/// Why a claim was paced: the fleet's window is full.
pub const PACED_WINDOW: &str = "the fleet sent max_claims_per_minute claims in the last 60 s";
/// Why a claim was paced: the credential's registration budget is empty.
pub const PACED_BUDGET: &str = "the registration budget is empty until its reset";
/// Why a claim was paced: the ledger did not answer.
pub const PACED_LEDGER: &str = "the cluster ledger is unreachable";

/// A job another host gave back (its lease expired, or it drained), with its ladder.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Released {
    /// The job.
    pub info: JobInfo,
    /// Failures so far.
    #[serde(default)]
    pub attempts: i32,
    /// Unix seconds of its first failure.
    pub first_failure: Option<i64>,
    /// Unix seconds of its next attempt.
    pub next_attempt: Option<i64>,
    /// Class of its first failure.
    pub class: Option<String>,
    /// The latest failure.
    pub last_error: Option<String>,
}

impl Released {
    /// Its ladder item, when it has one (a failure was recorded).
    pub fn ladder(&self) -> Option<RetryRow> {
        if self.attempts <= 0 {
            return None;
        }
        let class = self
            .class
            .as_deref()
            .and_then(|c| serde_json::from_value(serde_json::Value::String(c.into())).ok())
            .unwrap_or(ErrorClass::Network);
        let first = self.first_failure.unwrap_or(0).max(0) as u64;
        Some(RetryRow {
            job: self.info.clone(),
            attempts: self.attempts as u32,
            first_failure_unix: first,
            next_attempt_unix: self.next_attempt.unwrap_or(0).max(0) as u64,
            class,
            last_error: self.last_error.clone().unwrap_or_default(),
        })
    }
}

/// One host of the fleet, as `status` shows it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct HostView {
    /// `cluster.host`.
    pub host: String,
    /// Its lease is current.
    pub alive: bool,
    /// Seconds until its lease expires (negative: expired that long ago).
    pub lease_secs: i64,
    /// Its pools (name, kind, labels, slots) as it last reported them.
    pub pools: serde_json::Value,
    /// Runners it has.
    pub used: i32,
    /// Its slots.
    pub capacity: i32,
    /// Jobs it holds that have not started.
    pub holding: i64,
}

/// The fleet, as `status` shows it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct FleetView {
    /// This host.
    pub me: String,
    /// Every host the ledger knows.
    pub hosts: Vec<HostView>,
    /// Jobs recorded and not yet claimed by anyone.
    pub queued: i64,
}

/// Where the ledger says a job stands (`jobs ID`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct JobHolder {
    /// queued, held, running or completed.
    pub phase: String,
    /// The host holding it, if one does.
    pub holder: Option<String>,
    /// The last change, in words.
    pub why: String,
    /// Claim failures recorded on its ladder.
    pub attempts: i32,
}

/// Whether the ledger answered lately (`/readyz`, `ephemerd_ledger_up`).
#[derive(Debug, Clone, Default)]
pub struct LedgerHealth(Arc<AtomicBool>);

impl LedgerHealth {
    /// True after the last operation succeeded.
    pub fn is_up(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }

    fn set(&self, up: bool) {
        let was = self.0.swap(up, Ordering::Relaxed);
        if was && !up {
            tracing::error!(
                "the cluster ledger is unreachable: deliveries are answered 503 until it is back"
            );
        } else if !was && up {
            tracing::info!("the cluster ledger is reachable");
        }
    }
}

/// A handle on the shared ledger. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Ledger {
    pool: Pool,
    host: Arc<str>,
    credential: Arc<str>,
    per_minute: i32,
    lease: Duration,
    health: LedgerHealth,
    /// Round trips made, for the benchmarks.
    trips: Arc<AtomicU64>,
    url: crate::config::Secret,
    tls: connect::Tls,
}

/// The key one credential's budget is kept under across the fleet: the same token (or App
/// installation) on the same API is one budget, whichever host spends it. A token is keyed by
/// a hash, never stored.
pub fn fleet_credential(config: &Config) -> String {
    match &config.github.auth {
        GithubAuth::Token(token) => {
            let digest = sha2::Sha256::digest(
                format!("{}\n{}", config.github.api_url, token.expose()).as_bytes(),
            );
            format!("token-{}", &hex::encode(digest)[..16])
        }
        GithubAuth::App(app) => format!(
            "app-{}-installation-{}@{}",
            app.app_id, app.installation_id, config.github.api_url
        ),
    }
}

impl Ledger {
    /// Connects, and migrates the schema. Tries for up to `patience` (the database may come
    /// up after this host) before giving up.
    pub async fn connect(
        cluster: &ClusterConfig,
        config: &Config,
        patience: Duration,
    ) -> Result<Ledger, LedgerError> {
        let tls = connect::tls(config)?;
        let pg: tokio_postgres::Config = cluster
            .url
            .expose()
            .parse()
            .map_err(|e| LedgerError::Pool(format!("cluster.url: {e}")))?;
        let manager = Manager::from_config(
            pg,
            tls.0.clone(),
            ManagerConfig {
                recycling_method: RecyclingMethod::Fast,
            },
        );
        let pool = Pool::builder(manager)
            .max_size(cluster.pool_size)
            .runtime(deadpool_postgres::Runtime::Tokio1)
            .wait_timeout(Some(Duration::from_secs(3)))
            .create_timeout(Some(Duration::from_secs(3)))
            .recycle_timeout(Some(Duration::from_secs(3)))
            .build()
            .map_err(|e| LedgerError::Pool(e.to_string()))?;
        let ledger = Ledger {
            pool,
            host: cluster.host.as_str().into(),
            credential: fleet_credential(config).into(),
            per_minute: config.github.max_claims_per_minute.min(i32::MAX as u32) as i32,
            lease: cluster.lease,
            health: LedgerHealth::default(),
            trips: Arc::default(),
            url: cluster.url.clone(),
            tls,
        };
        let deadline = tokio::time::Instant::now() + patience;
        let mut wait = Duration::from_millis(250);
        loop {
            match ledger.migrate().await {
                Ok(version) => {
                    tracing::info!(host = %ledger.host, version, "connected to the cluster ledger");
                    ledger.health.set(true);
                    return Ok(ledger);
                }
                Err(e @ LedgerError::SchemaTooNew { .. }) => return Err(e),
                Err(e) if tokio::time::Instant::now() + wait > deadline => return Err(e),
                Err(e) => {
                    tracing::warn!(error = %e, retry_in = ?wait, "cannot reach the cluster ledger yet");
                    tokio::time::sleep(wait).await;
                    wait = (wait * 2).min(Duration::from_secs(5));
                }
            }
        }
    }

    async fn migrate(&self) -> Result<i32, LedgerError> {
        let mut client = self.pool.get().await?;
        schema::migrate(&mut client).await
    }

    /// This host's name in the fleet.
    pub fn host(&self) -> &str {
        &self.host
    }

    /// `cluster.lease`.
    pub fn lease(&self) -> Duration {
        self.lease
    }

    /// Whether the ledger answered lately.
    pub fn health(&self) -> LedgerHealth {
        self.health.clone()
    }

    /// Round trips made so far (benchmarks).
    pub fn round_trips(&self) -> u64 {
        self.trips.load(Ordering::Relaxed)
    }

    /// A pooled connection; counts the round trip and keeps the health current.
    async fn client(&self) -> Result<deadpool_postgres::Object, LedgerError> {
        self.trips.fetch_add(1, Ordering::Relaxed);
        self.pool.get().await.map_err(|e| {
            self.health.set(false);
            e.into()
        })
    }

    fn track<T>(&self, r: Result<T, LedgerError>) -> Result<T, LedgerError> {
        self.health.set(r.is_ok());
        r
    }

    /// Records one delivery, idempotent by job id, and wakes every host if it changed
    /// anything: a `queued` job is added once (a copy changes nothing); `in_progress` and
    /// `completed` move its phase forward (never back). One round trip. True when it was news.
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
            SELECT pg_notify('ephemer_events', '') FROM ev";
        let result = async {
            let client = self.client().await?;
            let rows = client
                .query(
                    sql,
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

    /// Asks to hold `info`'s job for a claim (see [`Acquire`]). One round trip.
    pub async fn acquire(&self, info: &JobInfo) -> Result<Acquire, LedgerError> {
        let body = serde_json::to_value(info).map_err(|e| LedgerError::Row(e.to_string()))?;
        let owner = info.key.owner.to_ascii_lowercase();
        let job = info.key.job_id as i64;
        let fresh = crate::retry::RATE_READING_FRESH.as_secs() as i32;
        let result = async {
            let client = self.client().await?;
            let row = client
                .query_one(
                    "SELECT outcome, detail, wait_ms FROM ephemer_acquire($1, $2, $3, $4, $5, $6, $7)",
                    &[
                        &owner,
                        &job,
                        &body,
                        &&*self.host,
                        &&*self.credential,
                        &self.per_minute,
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

    /// Renews this host's lease and what it reports (pools, load).
    pub async fn heartbeat(
        &self,
        pools: &serde_json::Value,
        used: i32,
        capacity: i32,
        identity: &RunnerIdentity,
    ) -> Result<(), LedgerError> {
        let lease_ms = self.lease.as_millis() as i64;
        let result = async {
            let client = self.client().await?;
            client
                .execute(
                    "INSERT INTO ephemer_hosts (host, lease_until, pools, used, capacity, version,
                        name_prefix, install_id)
                     VALUES ($1, clock_timestamp() + $2::bigint * interval '1 millisecond', $3, $4,
                        $5, $6, $7, $8)
                     ON CONFLICT (host) DO UPDATE SET lease_until = EXCLUDED.lease_until,
                        pools = EXCLUDED.pools, used = EXCLUDED.used,
                        capacity = EXCLUDED.capacity, version = EXCLUDED.version,
                        name_prefix = EXCLUDED.name_prefix, install_id = EXCLUDED.install_id,
                        swept_at = NULL",
                    &[
                        &&*self.host,
                        &lease_ms,
                        pools,
                        &used,
                        &capacity,
                        &env!("CARGO_PKG_VERSION"),
                        &identity.name_prefix,
                        &identity.install_id,
                    ],
                )
                .await?;
            Ok(())
        }
        .await;
        self.track(result)
    }

    /// Releases the jobs of hosts whose lease expired and returns the registrations of theirs
    /// this host should delete on GitHub (name, runner id, repo, host).
    pub async fn reap(&self) -> Result<Vec<DeadRegistration>, LedgerError> {
        let result = async {
            let client = self.client().await?;
            let rows = client
                .query(
                    "SELECT name, runner_id, repo, host FROM ephemer_reap($1)",
                    &[&&*self.host],
                )
                .await?;
            Ok(rows
                .iter()
                .map(|r| DeadRegistration {
                    name: r.get(0),
                    runner_id: r.get::<_, i64>(1) as u64,
                    repo: r.get(2),
                    host: r.get(3),
                })
                .collect())
        }
        .await;
        self.track(result)
    }

    /// Dead hosts whose runners this host should look for on GitHub now: each is handed to
    /// one survivor at a time, again a minute later until none of its runners is left.
    pub async fn dead_hosts_to_sweep(&self) -> Result<Vec<(String, RunnerIdentity)>, LedgerError> {
        let result = async {
            let client = self.client().await?;
            let rows = client
                .query(
                    "UPDATE ephemer_hosts SET swept_at = clock_timestamp()
                     WHERE host IN (
                        SELECT host FROM ephemer_hosts
                        WHERE lease_until < clock_timestamp() AND host <> $1
                          AND (swept_at IS NULL OR swept_at < clock_timestamp() - interval '60 seconds')
                        FOR UPDATE SKIP LOCKED)
                     RETURNING host, name_prefix, install_id",
                    &[&&*self.host],
                )
                .await?;
            Ok(rows
                .iter()
                .map(|r| {
                    (
                        r.get(0),
                        RunnerIdentity {
                            name_prefix: r.get(1),
                            install_id: r.get(2),
                        },
                    )
                })
                .collect())
        }
        .await;
        self.track(result)
    }

    /// Forgets a dead host none of whose runners is left on GitHub (its jobs were released
    /// already; a host that comes back writes its row again).
    pub async fn forget_host(&self, host: &str) -> Result<(), LedgerError> {
        let result = async {
            let client = self.client().await?;
            client
                .execute(
                    "DELETE FROM ephemer_hosts WHERE host = $1 AND lease_until < clock_timestamp()",
                    &[&host],
                )
                .await?;
            Ok(())
        }
        .await;
        self.track(result)
    }

    /// Forgets a registration that is gone on GitHub.
    pub async fn forget_registration(&self, name: &str) -> Result<(), LedgerError> {
        let result = async {
            let client = self.client().await?;
            client
                .execute(
                    "DELETE FROM ephemer_registrations WHERE name = $1",
                    &[&name],
                )
                .await?;
            Ok(())
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

    /// Writes a rate reading of this credential, for the other hosts' claim decisions.
    pub async fn put_rate(
        &self,
        resource: &str,
        reading: &crate::vocab::RateSnapshot,
    ) -> Result<(), LedgerError> {
        let opt = |v: Option<u64>| v.map(|v| v as i64);
        let result = async {
            let client = self.client().await?;
            client
                .execute(
                    "INSERT INTO ephemer_rates (credential, resource, remaining, lim, reset, updated, host)
                     VALUES ($1, $2, $3, $4, $5, $6, $7)
                     ON CONFLICT (credential, resource) DO UPDATE SET remaining = EXCLUDED.remaining,
                        lim = EXCLUDED.lim, reset = EXCLUDED.reset, updated = EXCLUDED.updated,
                        host = EXCLUDED.host
                     WHERE ephemer_rates.updated <= EXCLUDED.updated",
                    &[
                        &&*self.credential,
                        &resource,
                        &opt(reading.remaining),
                        &opt(reading.limit),
                        &opt(reading.reset),
                        &(reading.updated as i64),
                        &&*self.host,
                    ],
                )
                .await?;
            Ok(())
        }
        .await;
        self.track(result)
    }

    /// The fleet: every host with its lease, pools and load.
    pub async fn fleet(&self) -> Result<FleetView, LedgerError> {
        let result = async {
            let client = self.client().await?;
            let rows = client
                .query(
                    "SELECT h.host, h.lease_until > clock_timestamp(),
                        floor(extract(epoch FROM h.lease_until - clock_timestamp()))::bigint,
                        h.pools, h.used, h.capacity,
                        (SELECT count(*) FROM ephemer_jobs j WHERE j.holder = h.host AND j.phase = 'held'),
                        (SELECT count(*) FROM ephemer_jobs j WHERE j.phase = 'queued')
                     FROM ephemer_hosts h ORDER BY h.host",
                    &[],
                )
                .await?;
            let queued = rows.first().map_or(0, |r| r.get(7));
            Ok(FleetView {
                me: self.host.to_string(),
                queued,
                hosts: rows
                    .iter()
                    .map(|r| HostView {
                        host: r.get(0),
                        alive: r.get(1),
                        lease_secs: r.get(2),
                        pools: r.get(3),
                        used: r.get(4),
                        capacity: r.get(5),
                        holding: r.get(6),
                    })
                    .collect(),
            })
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

    /// Drops what nobody needs any more: completed jobs and events older than a day,
    /// registrations whose environment went ten minutes ago. Any host may run it.
    pub async fn prune(&self) -> Result<(), LedgerError> {
        let result = async {
            let client = self.client().await?;
            client
                .batch_execute(
                    "DELETE FROM ephemer_events WHERE at < now() - interval '1 day';
                     DELETE FROM ephemer_registrations
                        WHERE gone_at < now() - interval '10 minutes';
                     DELETE FROM ephemer_jobs WHERE phase IN ('running', 'completed')
                        AND updated_at < now() - interval '1 day';",
                )
                .await?;
            Ok(())
        }
        .await;
        self.track(result)
    }
}

/// What a host's runner names are made of: `<name_prefix>-<pool>-<install_id><random>`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RunnerIdentity {
    /// `runner.name_prefix`.
    pub name_prefix: String,
    /// The host's install id (`state.dir/install-id`).
    pub install_id: String,
}

/// A registration of a dead host that this host was given to delete.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadRegistration {
    /// Runner name.
    pub name: String,
    /// GitHub's id.
    pub runner_id: u64,
    /// Repo of a repo-level runner.
    pub repo: Option<String>,
    /// The dead host.
    pub host: String,
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

    #[test]
    fn a_released_job_without_failures_has_no_ladder() {
        let r = Released {
            info: JobInfo::default(),
            attempts: 0,
            first_failure: None,
            next_attempt: None,
            class: None,
            last_error: None,
        };
        assert!(r.ladder().is_none());
        let r = Released {
            attempts: 2,
            first_failure: Some(100),
            next_attempt: Some(160),
            class: Some("rate_limit".into()),
            ..r
        };
        let row = r.ladder().unwrap();
        assert_eq!(
            (row.attempts, row.first_failure_unix, row.next_attempt_unix),
            (2, 100, 160)
        );
        assert_eq!(row.class, ErrorClass::RateLimit);
    }
}
