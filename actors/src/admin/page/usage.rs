//! `GET /usage?since=30d&by=repo`: the same figures as `ephemer-actors usage`, as a table.

use maud::{Markup, html};

use super::render::{layout, span_age};
use crate::admin::usage::{DEFAULT_SINCE, UsageAnswer, UsageQuery};

/// The page: the form, then a line per repo (pool, target).
pub(super) fn page(q: &UsageQuery, a: &UsageAnswer) -> Markup {
    let since = q.since.as_deref().unwrap_or(DEFAULT_SINCE);
    let ms = |v: Option<u64>| v.map_or_else(|| "-".to_string(), span_age);
    let total: f64 = a.lines.iter().map(|l| l.runner_minutes).sum();
    let body = html! {
        h1 { "Usage" }
        form.filters method="get" action="/usage" {
            label { "Since " input name="since" value=(since); }
            label { "By " select name="by" {
                @for by in ["repo", "pool", "target"] { option value=(by) selected[a.by.as_str() == by] { (by) } }
            } }
            button type="submit" { "Show" }
        }
        p #usage-total { (format!("{total:.1}")) " runner-minutes in the last " (since) ", by " (a.by.as_str()) "." }
        div.scroll { table #usage {
            thead { tr {
                th scope="col" { (a.by.as_str()) } th scope="col" { "Runner-minutes" } th scope="col" { "Jobs" }
                th scope="col" { "Failed claims" } th scope="col" { "Queued to running, p50" } th scope="col" { "p90" }
            } }
            tbody {
                @for l in &a.lines {
                    tr {
                        th scope="row" { (l.key) }
                        td { (format!("{:.1}", l.runner_minutes)) }
                        td { (l.jobs) }
                        td { (l.retries) }
                        td { (ms(l.pickup_p50_ms)) }
                        td { (ms(l.pickup_p90_ms)) }
                    }
                }
            }
        } }
        p.muted { "Runner-minutes run from a runner's claim to its job's completion. The same figures: " code { "ephemer-actors usage --since " (since) " --by " (a.by.as_str()) } "." }
    };
    layout("Usage", body)
}
