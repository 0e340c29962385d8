//! A pool's last hour as a small SVG (no script, nothing fetched): per five-minute bucket, the
//! queued -> running wait (p90 as a light bar, p50 as a dark one inside it) over the claims
//! (blue), failed claims (orange) and warm hits (green) below. Each bar carries its figures as
//! a tooltip, and the caption says the hour's totals in words, for a screen reader too.

use maud::{Markup, html};

use super::render::span_age;
use crate::scheduler::core::hour::{BUCKET_SECS, PoolHour};

/// Chart units: 12 buckets of 50, a top panel of 60 and a bottom one of 30.
const W: f64 = 50.0;
const TOP: f64 = 60.0;
const LOW: f64 = 30.0;

/// One pool's chart.
pub(super) fn pool_hour(h: &PoolHour) -> Markup {
    let slowest = h
        .buckets
        .iter()
        .filter_map(|b| b.pickup_p90_ms)
        .max()
        .unwrap_or(0)
        .max(1_000);
    let busiest = h
        .buckets
        .iter()
        .map(|b| b.claims.max(b.retries.values().sum()).max(b.warm_hits))
        .max()
        .unwrap_or(0)
        .max(1);
    let height = |ms: u64| ms as f64 / slowest as f64 * (TOP - 4.0);
    let count = |n: u32| f64::from(n) / f64::from(busiest) * (LOW - 4.0);
    let started: u32 = h.buckets.iter().map(|b| b.started).sum();
    let claims: u32 = h.buckets.iter().map(|b| b.claims).sum();
    let failed: u32 = h.buckets.iter().flat_map(|b| b.retries.values()).sum();
    let warm: u32 = h.buckets.iter().map(|b| b.warm_hits).sum();
    let width = W * h.buckets.len() as f64;
    html! {
        figure.hour {
            svg viewBox=(format!("0 0 {width} {}", TOP + LOW + 2.0)) preserveAspectRatio="none" role="img"
                aria-label={ "Pool " (h.pool) ", the last hour in five-minute buckets" } {
                line.axis x1="0" x2=(width) y1=(TOP) y2=(TOP) {}
                @for (i, b) in h.buckets.iter().enumerate() {
                    @let x = i as f64 * W;
                    @let tip = bucket_words(b);
                    g {
                        title { (tip) }
                        rect.bg x=(x) y="0" width=(W) height=(TOP + LOW) {}
                        @if let Some(p90) = b.pickup_p90_ms {
                            rect.p90 x=(x + 8.0) y=(format!("{:.1}", TOP - height(p90))) width=(W - 16.0) height=(format!("{:.1}", height(p90))) {}
                        }
                        @if let Some(p50) = b.pickup_p50_ms {
                            rect.p50 x=(x + 16.0) y=(format!("{:.1}", TOP - height(p50))) width=(W - 32.0) height=(format!("{:.1}", height(p50))) {}
                        }
                        @let failed: u32 = b.retries.values().sum();
                        rect.claims x=(x + 6.0) y=(TOP + 2.0) width="11" height=(format!("{:.1}", count(b.claims))) {}
                        rect.fails x=(x + 19.0) y=(TOP + 2.0) width="11" height=(format!("{:.1}", count(failed))) {}
                        rect.warm x=(x + 32.0) y=(TOP + 2.0) width="11" height=(format!("{:.1}", count(b.warm_hits))) {}
                    }
                }
            }
            figcaption {
                "Last hour of " strong { (h.pool) } ": " (started) " jobs started, " (claims) " claims, "
                (failed) " failed, " (warm) " warm hits. Bars up: queued to running, p90 light, p50 dark, up to "
                (span_age(slowest)) ". Bars down: claims, failed claims, warm hits."
            }
        }
    }
}

/// A bucket in words (its tooltip).
fn bucket_words(b: &crate::scheduler::core::hour::HourBucket) -> String {
    let from = b.start_unix % 86_400;
    let to = (b.start_unix + BUCKET_SECS) % 86_400;
    let clock = |s: u64| format!("{:02}:{:02}", s / 3600, (s % 3600) / 60);
    let mut words = format!("{}-{} UTC: {} started", clock(from), clock(to), b.started);
    if let (Some(p50), Some(p90)) = (b.pickup_p50_ms, b.pickup_p90_ms) {
        words += &format!(", waited {} (p50) / {} (p90)", span_age(p50), span_age(p90));
    }
    words += &format!(", {} claims", b.claims);
    for (class, n) in &b.retries {
        words += &format!(", {n} failed ({})", class.replace('_', " "));
    }
    words += &format!(", {} warm hits", b.warm_hits);
    words
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheduler::core::hour::HourBucket;

    #[test]
    fn a_bucket_reads_in_words_and_draws_a_bar_for_each_figure() {
        let mut b = HourBucket {
            start_unix: 1_800_000_000 - 1_800_000_000 % BUCKET_SECS,
            started: 3,
            pickup_p50_ms: Some(800),
            pickup_p90_ms: Some(2_500),
            claims: 4,
            warm_hits: 1,
            ..HourBucket::default()
        };
        b.retries.insert("rate_limit".into(), 2);
        let words = bucket_words(&b);
        assert!(words.contains("3 started, waited 0.8s (p50) / 2.5s (p90), 4 claims, 2 failed (rate limit), 1 warm hits"), "{words}");
        let hour = PoolHour {
            pool: "<b>linux</b>".into(),
            buckets: vec![HourBucket::default(), b],
        };
        let svg = pool_hour(&hour).into_string();
        assert!(svg.contains("&lt;b&gt;linux"), "{svg}");
        for class in ["p90", "p50", "claims", "fails", "warm"] {
            assert!(
                svg.contains(&format!("class=\"{class}\"")),
                "{class}: {svg}"
            );
        }
        assert!(
            svg.contains("3 jobs started, 4 claims, 2 failed, 1 warm hits"),
            "{svg}"
        );
    }
}
