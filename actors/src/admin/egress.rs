//! `GET /api/v1/egress?pool=NAME&since=7d`: the names a pool's jobs looked up in `audit` or
//! `allow-list` mode, how often, and which its allow-list refuses, from the pool's audit log
//! (`<state>/egress/<pool>.log` and the one before it): what `ephemer-actors egress` prints,
//! and what an operator writes an allow-list from.

use std::path::Path;

use actix_web::{HttpRequest, HttpResponse, web};
use serde::{Deserialize, Serialize};

use super::{Admin, ErrorAnswer, access::Want};
use crate::netns::watch::{AUDIT_LOG_MAX, audit_log_path};
use ephemer_decide::egress::{allow::report, audit};

/// The default window.
pub const DEFAULT_SINCE: &str = "7d";

/// The query.
#[derive(Debug, Default, Deserialize)]
pub struct EgressQuery {
    /// The pool.
    pub pool: String,
    /// A span back from now (`7d`, `12h`); [`DEFAULT_SINCE`] when absent.
    #[serde(default)]
    pub since: Option<String>,
}

/// One name.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AskedName {
    /// The name.
    pub name: String,
    /// How often the pool's jobs looked it up.
    pub lookups: u64,
    /// Whether the pool's allow-list refuses it.
    pub refused: bool,
}

/// The answer.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct EgressAnswer {
    /// The pool.
    pub pool: String,
    /// Lookups from this unix second on.
    pub since_unix: u64,
    /// Most asked first.
    pub names: Vec<AskedName>,
}

/// The report of pool `pool`'s lookups since `since_unix`, from the audit logs under `dir`.
pub fn read_report(dir: &Path, pool: &str, since_unix: u64) -> Vec<AskedName> {
    let path = audit_log_path(dir, pool);
    let mut older = path.clone().into_os_string();
    older.push(".1");
    let mut text = String::new();
    for p in [Path::new(&older), path.as_path()] {
        let bytes = crate::bounded::read_file(p, AUDIT_LOG_MAX + (64 << 10)).unwrap_or_default();
        text.push_str(&String::from_utf8_lossy(&bytes));
    }
    let lookups = text
        .lines()
        .filter_map(audit::parse)
        .filter(|(at, _, _)| *at >= since_unix)
        .map(|(_, refused, name)| (name, refused));
    report(lookups)
        .into_iter()
        .map(|a| AskedName {
            name: a.name,
            lookups: a.lookups,
            refused: a.refused,
        })
        .collect()
}

pub(super) async fn egress(
    admin: web::Data<Admin>,
    q: web::Query<EgressQuery>,
    req: HttpRequest,
) -> HttpResponse {
    if let Err(refused) = admin.access.check(&req, Want::Read) {
        return refused.answer();
    }
    let bad = |error: String| HttpResponse::BadRequest().json(ErrorAnswer { error });
    let pool = q.pool.clone();
    if pool.is_empty()
        || !pool
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    {
        return bad(format!("pool: {pool:?} is not a pool's name"));
    }
    let since = q.since.as_deref().unwrap_or(DEFAULT_SINCE);
    let since_unix = match super::usage::since_unix(since, crate::clock::unix_now()) {
        Ok(at) => at,
        Err(error) => return bad(error),
    };
    let dir = admin.egress_dir.clone();
    let read_pool = pool.clone();
    let names = web::block(move || read_report(&dir, &read_pool, since_unix))
        .await
        .unwrap_or_default();
    HttpResponse::Ok().json(EgressAnswer {
        pool,
        since_unix,
        names,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_report_reads_both_logs_in_the_window_and_skips_torn_lines() {
        let dir = tempfile::tempdir().unwrap();
        let log = audit_log_path(dir.path(), "linux");
        let mut older = log.clone().into_os_string();
        older.push(".1");
        std::fs::write(&older, "100 1 old.example\n500 0 github.com\n").unwrap();
        std::fs::write(
            &log,
            "600 1 registry.npmjs.org\n700 1 registry.npmjs.org\n800 0 github.com\n90",
        )
        .unwrap();
        let names = read_report(dir.path(), "linux", 200);
        let rows: Vec<(&str, u64, bool)> = names
            .iter()
            .map(|n| (n.name.as_str(), n.lookups, n.refused))
            .collect();
        assert_eq!(
            rows,
            [("github.com", 2, false), ("registry.npmjs.org", 2, true)]
        );
        assert!(read_report(dir.path(), "other", 0).is_empty());
    }
}
