//! `GET /api/v1/usage?since=30d&by=repo`: runner-minutes, jobs, retries and pickup per repo
//! (or pool, or target) from the durable usage rows: what `ephemer-actors usage` prints and
//! the page's `/usage` shows.

use actix_web::{HttpRequest, HttpResponse, web};
use serde::{Deserialize, Serialize};

use super::{Admin, ErrorAnswer, access::Want, unavailable};
use crate::scheduler::messages::GetUsage;
use ephemer_decide::usage::{UsageBy, UsageLine, summarize};

/// The default window.
pub const DEFAULT_SINCE: &str = "30d";

/// The query.
#[derive(Debug, Default, Deserialize)]
pub struct UsageQuery {
    /// A span back from now (`30d`, `12h`); [`DEFAULT_SINCE`] when absent.
    #[serde(default)]
    pub since: Option<String>,
    /// `repo`, `pool` or `target`.
    #[serde(default)]
    pub by: Option<String>,
}

/// The answer.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct UsageAnswer {
    /// Rows from this unix second on.
    pub since_unix: u64,
    /// What the lines are per.
    pub by: UsageBy,
    /// Most runner-minutes first.
    pub lines: Vec<UsageLine>,
}

impl UsageQuery {
    /// The window's start and the grouping, or what is wrong with the query.
    pub fn read(&self, now_unix: u64) -> Result<(u64, UsageBy), String> {
        let since = since_unix(self.since.as_deref().unwrap_or(DEFAULT_SINCE), now_unix)?;
        let by = match self.by.as_deref() {
            None | Some("") => UsageBy::Repo,
            Some(b) => {
                UsageBy::parse(b).ok_or_else(|| format!("by: {b:?} is not repo, pool or target"))?
            }
        };
        Ok((since, by))
    }
}

/// The unix second `since` (a span back from `now_unix`: `30d`, `12h`) names, or what is wrong
/// with it (the `since` of `usage` and `egress`).
pub(super) fn since_unix(since: &str, now_unix: u64) -> Result<u64, String> {
    let span = humantime::parse_duration(since)
        .map_err(|e| format!("since: {since:?} is not a span like 30d or 12h ({e})"))?;
    Ok(now_unix.saturating_sub(span.as_secs()))
}

/// The usage, or the answer that says why not.
pub(super) async fn answer(admin: &Admin, q: &UsageQuery) -> Result<UsageAnswer, HttpResponse> {
    let (since_unix, by) = q
        .read(crate::clock::unix_now())
        .map_err(|error| HttpResponse::BadRequest().json(ErrorAnswer { error }))?;
    let Ok(rows) = admin.scheduler.send(GetUsage { since_unix }).await else {
        return Err(unavailable("scheduler"));
    };
    let rows =
        rows.map_err(|error| HttpResponse::ServiceUnavailable().json(ErrorAnswer { error }))?;
    Ok(UsageAnswer {
        since_unix,
        by,
        lines: summarize(&rows, by),
    })
}

pub(super) async fn usage(
    admin: web::Data<Admin>,
    q: web::Query<UsageQuery>,
    req: HttpRequest,
) -> HttpResponse {
    if let Err(refused) = admin.access.check(&req, Want::Read) {
        return refused.answer();
    }
    match answer(&admin, &q).await {
        Ok(a) => HttpResponse::Ok().json(a),
        Err(no) => no,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_query_reads_a_span_and_a_grouping_and_says_what_is_wrong() {
        let q = |since: Option<&str>, by: Option<&str>| UsageQuery {
            since: since.map(Into::into),
            by: by.map(Into::into),
        };
        assert_eq!(
            q(None, None).read(100 * 86_400),
            Ok((70 * 86_400, UsageBy::Repo))
        );
        assert_eq!(
            q(Some("12h"), Some("pool")).read(86_400),
            Ok((43_200, UsageBy::Pool))
        );
        assert!(
            q(Some("soon"), None)
                .read(0)
                .unwrap_err()
                .starts_with("since:")
        );
        assert!(
            q(None, Some("team"))
                .read(0)
                .unwrap_err()
                .starts_with("by:")
        );
    }
}
