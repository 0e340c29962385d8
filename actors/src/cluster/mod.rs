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

use crate::config::{ClusterConfig, Config};

pub(crate) mod actor;
mod connect;
mod hosts;
mod jobs;
pub(crate) mod lazy;
mod listeners;
mod mirror;
mod redeliveries;
pub mod schema;
pub mod stream;

pub use actor::FleetActor;
pub use ephemer_decide::cluster::types::*;
pub use listeners::ListenerLease;
pub use mirror::Mirror;

/// The channel `NOTIFY` wakes listeners on.
pub const CHANNEL: &str = "ephemer_events";
/// Between attempts to reach the ledger at start, and to reconnect the event stream: 250 ms,
/// doubling to 5 s.
pub(crate) const CONNECT_BACKOFF: crate::retry::Doubling =
    crate::retry::Doubling::new(Duration::from_millis(250), Duration::from_secs(5));

/// A ledger operation that failed.
#[derive(Debug, thiserror::Error)]
pub enum LedgerError {
    /// The database answered with an error, or the connection broke.
    #[error("database: {0}")]
    Db(#[from] tokio_postgres::Error),
    /// No connection could be had from the pool.
    #[error("database unreachable: {0}")]
    Pool(String),
    /// The schema is newer than this binary, and needs a newer one.
    #[error(
        "the ledger's schema is version {found}, newer than this binary knows ({known}), and \
         needs a binary that knows version {needs}: upgrade ephemer-actors on this host"
    )]
    SchemaTooNew {
        /// In the database.
        found: i32,
        /// Known here.
        known: i32,
        /// The oldest schema version a binary must know to work with it.
        needs: i32,
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
    /// Each target's budget: its owner (lowercased), credential key and claims per minute;
    /// the first is the budget of an owner no target has.
    budgets: Arc<[(String, String, i32)]>,
    lease: Duration,
    health: LedgerHealth,
    /// Round trips made, for the benchmarks.
    trips: Arc<AtomicU64>,
    /// What this host writes without waiting for it ([`lazy`]).
    lazy: Arc<lazy::Lazy>,
    url: crate::config::Secret,
    tls: connect::Tls,
}

/// The key one credential's budget is kept under across the fleet: the same token (or App
/// installation) on the same API is one budget, whichever host spends it. A token is keyed by
/// a hash, never stored.
pub fn fleet_credential(config: &Config) -> String {
    crate::github::auth::budget_key(&config.github.api_url, &config.github.auth)
}

/// Every target's budget: (owner lowercased, credential key, claims per minute).
fn budgets(config: &Config) -> Arc<[(String, String, i32)]> {
    config
        .targets()
        .iter()
        .map(|t| {
            (
                t.github.owner.to_ascii_lowercase(),
                crate::github::auth::budget_key(&t.github.api_url, &t.github.auth),
                t.github.max_claims_per_minute.min(i32::MAX as u32) as i32,
            )
        })
        .collect()
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
            budgets: budgets(config),
            lease: cluster.lease,
            health: LedgerHealth::default(),
            trips: Arc::default(),
            lazy: Arc::default(),
            url: cluster.url.clone(),
            tls,
        };
        let deadline = tokio::time::Instant::now() + patience;
        let mut wait = CONNECT_BACKOFF.first;
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
                    wait = CONNECT_BACKOFF.following(Some(wait));
                }
            }
        }
    }

    /// The budget the claims of `owner`'s jobs spend: (credential key, claims per minute).
    fn budget_of(&self, owner: &str) -> (&str, i32) {
        let found = self
            .budgets
            .iter()
            .find(|(o, _, _)| o.eq_ignore_ascii_case(owner))
            .or(self.budgets.first());
        found.map_or(("", 1), |(_, credential, per_minute)| {
            (credential.as_str(), *per_minute)
        })
    }

    async fn migrate(&self) -> Result<i32, LedgerError> {
        let mut client = self.pool.get().await?;
        schema::migrate(&mut client).await
    }

    /// Takes this host's lease before it serves: a claim it makes before its first heartbeat
    /// must already count as held by a live host. (`doctor` connects without it.)
    pub async fn take_lease(&self) -> Result<(), LedgerError> {
        let client = self.client().await?;
        client
            .execute(
                "INSERT INTO ephemer_hosts (host, lease_until)
                 VALUES ($1, clock_timestamp() + $2::bigint * interval '1 millisecond')
                 ON CONFLICT (host) DO UPDATE SET lease_until = EXCLUDED.lease_until,
                    swept_at = NULL",
                &[&&*self.host, &(self.lease.as_millis() as i64)],
            )
            .await?;
        Ok(())
    }

    /// This host's name in the fleet.
    pub fn host(&self) -> &str {
        &self.host
    }

    /// How often a lease is renewed: a third of `cluster.lease`, so two renewals may be lost.
    pub fn heartbeat_every(&self) -> Duration {
        (self.lease / 3).max(Duration::from_millis(500))
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

    /// Writes what waits in the lazy queue now, trying until `within` is over (a shutdown:
    /// what this host answered reaches the fleet before it goes). False if some is left.
    pub async fn flush(&self, within: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + within;
        while self.lazy.due().is_some() {
            if tokio::time::Instant::now() >= deadline {
                return false;
            }
            if self.write_pending().await.is_err() {
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
        }
        true
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
}
