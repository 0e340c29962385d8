//! `ephemer-actors usage`: runner-minutes, jobs, failed claims and pickup per repo, pool or
//! target, from a running daemon's durable usage rows (`GET /api/v1/usage`).

use actix_web::http::Method;
use ephemer_actors_core::admin::usage::UsageAnswer;
use ephemer_actors_core::usage::{UsageBy, csv};

use crate::ctl::{Target, call, print_json};

/// Prints the usage since `since` (a span: `30d`, `12h`) by `by`, as a table, CSV or JSON.
pub fn usage(t: &Target, since: &str, by: UsageBy, as_csv: bool) -> anyhow::Result<()> {
    let since: String = since
        .chars()
        .map(|c| if c == ' ' { '+' } else { c })
        .filter(|c| c.is_ascii_alphanumeric() || *c == '+')
        .collect();
    let path = format!("/api/v1/usage?since={since}&by={}", by.as_str());
    let v: UsageAnswer = call(t, Method::GET, &path)?;
    if t.json {
        return print_json(&v);
    }
    print!("{}", crate::term::printable(&text(&v, as_csv)));
    Ok(())
}

/// The table (or CSV) for `v`.
fn text(v: &UsageAnswer, as_csv: bool) -> String {
    if as_csv {
        return csv(&v.lines, v.by);
    }
    let ms = |m: Option<u64>| {
        m.map_or_else(|| "-".to_string(), |m| format!("{:.1}s", m as f64 / 1000.0))
    };
    let mut out = format!(
        "{:<32} {:>14} {:>8} {:>14} {:>10} {:>10}\n",
        v.by.as_str().to_uppercase(),
        "RUNNER-MINUTES",
        "JOBS",
        "FAILED CLAIMS",
        "PICKUP P50",
        "P90"
    );
    for l in &v.lines {
        out += &format!(
            "{:<32} {:>14.1} {:>8} {:>14} {:>10} {:>10}\n",
            l.key,
            l.runner_minutes,
            l.jobs,
            l.retries,
            ms(l.pickup_p50_ms),
            ms(l.pickup_p90_ms)
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use ephemer_actors_core::usage::UsageLine;

    #[test]
    fn the_table_and_the_csv_say_the_same_figures() {
        let v = UsageAnswer {
            since_unix: 0,
            by: UsageBy::Pool,
            lines: vec![UsageLine {
                key: "linux".into(),
                jobs: 3,
                runner_minutes: 12.5,
                retries: 1,
                pickup_p50_ms: Some(1500),
                pickup_p90_ms: None,
            }],
        };
        let table = text(&v, false);
        assert!(table.starts_with("POOL"), "{table}");
        assert!(
            table.contains("linux") && table.contains("12.5") && table.contains("1.5s"),
            "{table}"
        );
        assert_eq!(
            text(&v, true),
            "pool,jobs,runner_minutes,retries,pickup_p50_ms,pickup_p90_ms\nlinux,3,12.50,1,1500,\n"
        );
    }
}
