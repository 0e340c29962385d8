//! `[cluster]`: fleet mode. Absent, the daemon is one host with its embedded store (the
//! default). Present, every host of the fleet shares one PostgreSQL ledger (see
//! the `cluster` module).

use std::time::Duration;

use super::Secret;

/// `[cluster]`
#[derive(Debug, Clone)]
pub struct ClusterConfig {
    /// `cluster.url` (or `EPHEMER_CLUSTER_URL`): the PostgreSQL URL, a secret (it may carry a
    /// password).
    pub url: Secret,
    /// `cluster.host`: this host's name in the fleet (default: the hostname). Unique per
    /// host: the ledger knows who holds a job by it.
    pub host: String,
    /// `cluster.lease`: how long a host holds its jobs without renewing; a host silent for
    /// longer is taken for dead and its unstarted jobs go to the others.
    pub lease: Duration,
    /// `cluster.pool_size`: connections to the database (besides the one that listens).
    pub pool_size: usize,
}

impl ClusterConfig {
    /// How often the lease is renewed: a third of it, so two heartbeats may be lost.
    pub fn heartbeat(&self) -> Duration {
        (self.lease / 3).max(Duration::from_millis(500))
    }
}

/// This machine's hostname, the default `cluster.host` (`gethostname`, on every OS).
pub(crate) fn hostname() -> String {
    nix::unistd::gethostname()
        .ok()
        .and_then(|h| h.into_string().ok())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".to_string())
}
