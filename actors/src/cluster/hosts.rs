//! The ledger's host operations: leases, the reaping of dead hosts and their registrations,
//! shared rate readings, the fleet view, pruning.

use super::{DeadRegistration, FleetView, HostView, Ledger, LedgerError, RunnerIdentity};

impl Ledger {
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
            let statement = client
                .prepare_cached(
                    "INSERT INTO ephemer_hosts (host, lease_until, pools, used, capacity, version,
                        name_prefix, install_id)
                     VALUES ($1, clock_timestamp() + $2::bigint * interval '1 millisecond', $3, $4,
                        $5, $6, $7, $8)
                     ON CONFLICT (host) DO UPDATE SET lease_until = EXCLUDED.lease_until,
                        pools = EXCLUDED.pools, used = EXCLUDED.used,
                        capacity = EXCLUDED.capacity, version = EXCLUDED.version,
                        name_prefix = EXCLUDED.name_prefix, install_id = EXCLUDED.install_id,
                        swept_at = NULL",
                )
                .await?;
            client
                .execute(
                    &statement,
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
                    "SELECT name, runner_id, repo, host, owner FROM ephemer_reap_owned($1)",
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
                    owner: r.get(4),
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

    /// Writes a rate reading of `credential`, for the other hosts' claim decisions.
    pub async fn put_rate(
        &self,
        credential: &str,
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
                        &credential,
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
                        AND updated_at < now() - interval '1 day';
                     DELETE FROM ephemer_redeliveries WHERE at < now() - interval '3 days';",
                )
                .await?;
            Ok(())
        }
        .await;
        self.track(result)
    }
}
