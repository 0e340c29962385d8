//! A webhook's delivery log, as GitHub keeps it: every attempt the stand-in made to the hook's
//! URL, newest first, paged by `cursor` ("List deliveries for an organization webhook",
//! docs.github.com: `per_page` up to 100, the next page's cursor in the `Link` header), and
//! redelivery on request (`POST .../deliveries/{id}/attempts`, 202; the attempt is sent again
//! with the same `X-GitHub-Delivery` guid and the same bytes, and logged as a new attempt
//! with `redelivery: true`). Deliveries older than 3 days cannot be redelivered.

use actix_web::{HttpRequest, HttpResponse};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::routes::error;
use crate::state::{Delivery, Outgoing, State};

/// GitHub keeps deliveries, and redelivers them, for this long.
const RETENTION_SECS: u64 = 3 * 24 * 3600;

#[derive(Debug, Default, Deserialize)]
struct Query {
    per_page: Option<usize>,
    cursor: Option<String>,
}

fn same_url(a: &str, b: &str) -> bool {
    a.trim_end_matches('/') == b.trim_end_matches('/')
}

/// True when the stand-in has delivered to `url` (its log is then the dynamic one).
pub(crate) fn has_log(s: &State, url: &str) -> bool {
    s.deliveries.iter().any(|d| same_url(&d.url, url))
}

fn delivery_json(d: &Delivery) -> Value {
    let at = humantime::format_rfc3339_seconds(
        std::time::UNIX_EPOCH + std::time::Duration::from_secs(d.at_unix),
    )
    .to_string();
    json!({
        "id": d.seq,
        "guid": d.id,
        "delivered_at": at,
        "redelivery": d.redelivery,
        "duration": 0.01,
        "status": d.status_text(),
        "status_code": d.status,
        "event": "workflow_job",
        "action": d.action,
        "installation_id": null,
        "repository_id": null,
        "throttled_at": null,
    })
}

/// Answers a list or a redelivery for the hook that delivers to `url`.
pub(crate) fn answer(
    s: &mut State,
    req: &HttpRequest,
    endpoint: &str,
    segs: &[&str],
    url: &str,
    now: u64,
) -> (u16, HttpResponse) {
    if endpoint.starts_with("redeliver") {
        let seq: u64 = segs
            .iter()
            .rev()
            .nth(1)
            .and_then(|x| x.parse().ok())
            .unwrap_or(0);
        let Some(d) = s
            .deliveries
            .iter()
            .find(|d| d.seq == seq && same_url(&d.url, url))
        else {
            return error(404, "Not Found");
        };
        if d.at_unix + RETENTION_SECS < now {
            return error(422, "Validation Failed");
        }
        if let Some(outbox) = &s.outbox {
            let _ = outbox.send(Outgoing::Again(seq));
        }
        return (202, HttpResponse::Accepted().json(json!({})));
    }
    let q = actix_web::web::Query::<Query>::from_query(req.query_string())
        .map(|q| q.into_inner())
        .unwrap_or_default();
    let per = q.per_page.unwrap_or(30).clamp(1, 100);
    let start = q
        .cursor
        .as_deref()
        .and_then(|c| c.strip_prefix("v1_"))
        .and_then(|n| n.parse::<u64>().ok())
        .unwrap_or(u64::MAX);
    let mut log: Vec<&Delivery> = s
        .deliveries
        .iter()
        .filter(|d| same_url(&d.url, url) && d.seq <= start)
        .collect();
    log.sort_by_key(|d| std::cmp::Reverse(d.seq));
    let page: Vec<Value> = log.iter().take(per).map(|d| delivery_json(d)).collect();
    let mut r = HttpResponse::Ok();
    if let Some(next) = log.get(per) {
        r.insert_header((
            "Link",
            format!(
                "<{}?per_page={per}&cursor=v1_{}>; rel=\"next\"",
                req.path(),
                next.seq
            ),
        ));
    }
    (200, r.json(page))
}
