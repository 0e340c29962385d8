//! `doctor`'s fleet check: with `[cluster]`, connect to the ledger (and migrate it, as `serve`
//! would) and show the fleet it knows.

use ephemer_actors_core::{cluster::Ledger, config::Config};

use super::Check;

/// How long `doctor` tries to reach the ledger.
const PATIENCE: std::time::Duration = std::time::Duration::from_secs(5);

/// Nothing without `[cluster]`; else one check for the connection and one for the fleet.
pub async fn checks(config: &Config) -> Vec<Check> {
    let Some(cluster) = &config.cluster else {
        return Vec::new();
    };
    let ledger = match Ledger::connect(cluster, config, PATIENCE).await {
        Ok(ledger) => ledger,
        Err(e) => {
            return vec![Check::fail(
                "cluster.url",
                format!("cannot use the cluster ledger: {e}"),
                "check cluster.url (host, port, database, role, sslmode) and that PostgreSQL is up; see docs/fleet.md",
            )];
        }
    };
    let mut found = vec![Check::ok(
        "cluster.url",
        format!(
            "connected; schema version {}; this host is {:?}",
            ephemer_actors_core::cluster::schema::schema_version(),
            ledger.host()
        ),
    )];
    match ledger.fleet().await {
        Ok(fleet) => {
            let alive = fleet.hosts.iter().filter(|h| h.alive).count();
            let clash = fleet
                .hosts
                .iter()
                .any(|h| h.host == ledger.host() && h.alive);
            found.push(if clash {
                Check::warn(
                    "cluster.host",
                    format!("a live host named {:?} holds a lease already", ledger.host()),
                    "if this is not the same machine's running daemon, give each host its own cluster.host",
                )
            } else {
                Check::ok(
                    "cluster.fleet",
                    format!(
                        "{} host(s) known, {alive} with a current lease; {} job(s) queued",
                        fleet.hosts.len(),
                        fleet.queued
                    ),
                )
            });
        }
        Err(e) => found.push(Check::fail(
            "cluster.fleet",
            format!("cannot read the fleet: {e}"),
            "check the role's rights on its database",
        )),
    }
    found
}
