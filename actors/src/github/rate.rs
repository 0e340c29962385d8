//! Rate-limit readings: what GitHub's `X-RateLimit-*` headers said, parsed without side effects.
//!
//! A response without `X-RateLimit-Remaining` yields no reading at all, so endpoints that send no
//! rate headers can never clobber a good reading (the original learned this the hard way).

use std::time::Duration;

pub(crate) use crate::vocab::{RateBucket, RateHeaders};
use actix_web::http::header::HeaderMap;

/// Parses the rate headers of one answer; `None` when `X-RateLimit-Remaining` is absent.
/// Unparseable values are skipped one by one.
pub(crate) fn parse_rate_headers(headers: &HeaderMap) -> Option<RateHeaders> {
    let get = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::trim)
    };
    let num = |name: &str| get(name).and_then(|v| v.parse::<u64>().ok());
    headers.get("x-ratelimit-remaining")?;
    Some(RateHeaders {
        remaining: num("x-ratelimit-remaining"),
        limit: num("x-ratelimit-limit"),
        reset: num("x-ratelimit-reset"),
        used: num("x-ratelimit-used"),
        resource: get("x-ratelimit-resource").map_or(RateBucket::Core, RateBucket::parse),
    })
}

/// `Retry-After` in seconds (GitHub never sends the HTTP-date form).
pub(crate) fn parse_retry_after(headers: &HeaderMap) -> Option<Duration> {
    headers
        .get("retry-after")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map(Duration::from_secs)
}

#[cfg(test)]
mod tests {
    use actix_web::http::header::{HeaderName, HeaderValue};

    use super::*;

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(HeaderName::from_static(k), HeaderValue::from_static(v));
        }
        h
    }

    #[test]
    fn full_reading() {
        let r = parse_rate_headers(&headers(&[
            ("x-ratelimit-remaining", "4990"),
            ("x-ratelimit-limit", "5000"),
            ("x-ratelimit-reset", "1764470000"),
            ("x-ratelimit-used", "10"),
            ("x-ratelimit-resource", "core"),
        ]))
        .unwrap();
        assert_eq!(r.remaining, Some(4990));
        assert_eq!(r.limit, Some(5000));
        assert_eq!(r.reset, Some(1_764_470_000));
        assert_eq!(r.used, Some(10));
        assert_eq!(r.resource, RateBucket::Core);
        let r = parse_rate_headers(&headers(&[
            ("x-ratelimit-remaining", "14"),
            ("x-ratelimit-resource", "actions_runner_registration"),
        ]))
        .unwrap();
        assert_eq!(r.resource, RateBucket::ActionsRunnerRegistration);
    }

    #[test]
    fn no_remaining_header_means_no_reading() {
        assert_eq!(
            parse_rate_headers(&headers(&[("x-ratelimit-limit", "5000")])),
            None
        );
    }

    #[test]
    fn garbage_values_are_skipped_one_by_one() {
        let r = parse_rate_headers(&headers(&[
            ("x-ratelimit-remaining", "lots"),
            ("x-ratelimit-limit", "5000"),
        ]))
        .unwrap();
        assert_eq!(r.remaining, None);
        assert_eq!(r.limit, Some(5000));
        assert_eq!(
            parse_retry_after(&headers(&[("retry-after", "7")])),
            Some(Duration::from_secs(7))
        );
        assert_eq!(
            parse_retry_after(&headers(&[("retry-after", "soon")])),
            None
        );
    }
}
