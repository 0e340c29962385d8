//! `[cluster]`: validated without connecting (`doctor` connects).

use super::{Problems, count, positive_duration};
use crate::config::{
    ClusterConfig, Environment, Secret, cluster::hostname, defaults, raw::RawCluster,
};

pub(super) fn build_cluster(
    raw: Option<RawCluster>,
    env: &Environment,
    p: &mut Problems,
) -> Option<ClusterConfig> {
    let raw = raw?;
    let url = raw
        .url
        .filter(|u| !u.trim().is_empty())
        .map(Secret::new)
        .or_else(|| env.cluster_url.clone());
    let url = match url {
        None => {
            p.push(
                "cluster.url",
                "required with [cluster] (or set EPHEMER_CLUSTER_URL): the PostgreSQL URL, \
                 e.g. postgresql://ephemer@db.internal/ephemer",
            );
            Secret::new(String::new())
        }
        Some(url) => {
            check_url(url.expose(), raw.allow_insecure.unwrap_or(false), p);
            url
        }
    };
    let host = raw
        .host
        .filter(|h| !h.trim().is_empty())
        .unwrap_or_else(hostname);
    if host.len() > 63
        || !host
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
    {
        p.push(
            "cluster.host",
            format!(
                "{host:?} must be 1 to 63 letters, digits, '-', '_' or '.' (it names this host \
                 in the ledger)"
            ),
        );
    }
    let lease = positive_duration("cluster.lease", raw.lease, defaults::CLUSTER_LEASE, p);
    if lease < std::time::Duration::from_secs(3) {
        p.push(
            "cluster.lease",
            "must be at least 3s (it is renewed every third of it)",
        );
    }
    let pool_size = count(
        "cluster.pool_size",
        raw.pool_size,
        defaults::CLUSTER_POOL_SIZE,
        1,
        p,
    );
    if pool_size > 64 {
        p.push("cluster.pool_size", "must be at most 64");
    }
    Some(ClusterConfig {
        url,
        host,
        lease,
        pool_size,
    })
}

/// The URL must parse as a PostgreSQL connection string; the message never quotes it (it may
/// hold a password). A ledger off this host must be reached over TLS that cannot be stripped
/// (`sslmode=require`: the default `prefer` falls back to plain text when an attacker on the
/// path says the server has no TLS), unless `allow_insecure` says so.
fn check_url(url: &str, allow_insecure: bool, p: &mut Problems) {
    if !(url.starts_with("postgres://") || url.starts_with("postgresql://")) {
        p.push("cluster.url", "must be a postgres:// or postgresql:// URL");
        return;
    }
    match url.parse::<tokio_postgres::Config>() {
        Err(e) => p.push("cluster.url", format!("not a valid PostgreSQL URL: {e}")),
        Ok(c) if c.get_hosts().is_empty() => p.push("cluster.url", "names no host"),
        Ok(c) if c.get_dbname().is_none() => {
            p.push("cluster.url", "names no database (…/DBNAME at the end)")
        }
        Ok(c) => {
            // Every address the URL can reach: its hosts, and `hostaddr`, which (when given)
            // is where the connection really goes, whatever the host's name says.
            let hosts_local = c.get_hosts().iter().all(|h| match h {
                tokio_postgres::config::Host::Tcp(name) => {
                    name == "localhost"
                        || name
                            .trim_matches(['[', ']'])
                            .parse::<std::net::IpAddr>()
                            .is_ok_and(|ip| ip.is_loopback())
                }
                tokio_postgres::config::Host::Unix(_) => true,
            });
            let addrs = c.get_hostaddrs();
            let local = if addrs.is_empty() {
                hosts_local
            } else {
                addrs.iter().all(|ip| ip.is_loopback())
                    && c.get_hosts()
                        .iter()
                        .all(|h| !matches!(h, tokio_postgres::config::Host::Tcp(_)) || hosts_local)
            };
            let tls = c.get_ssl_mode() == tokio_postgres::config::SslMode::Require;
            if !local && !tls && !allow_insecure {
                p.push(
                    "cluster.url",
                    "reaches a ledger off this host without sslmode=require: with the default \
                     (prefer) anyone on the path can strip TLS and read or change the ledger; \
                     add ?sslmode=require, or cluster.allow_insecure = true to accept that",
                );
            }
        }
    }
}
