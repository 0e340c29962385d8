//! Time as the pure cores take it: one reading ([`Now`]) passed in, never read here, and the
//! calendar arithmetic on GitHub's RFC 3339 times.

use std::time::{Duration, UNIX_EPOCH};

/// The monotonic instant every core keeps. The shells read it from tokio's clock (paused in
/// tests) and hand it in; nothing here reads a clock.
pub type Instant = std::time::Instant;

/// One reading of the clock: what pure cores take instead of reading time themselves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Now {
    /// Monotonic.
    pub mono: Instant,
    /// Unix seconds.
    pub unix: u64,
    /// Unix milliseconds (`unix` with its fraction), for what is shown finer than a second.
    pub unix_ms: u64,
}

impl Now {
    /// A reading at `mono` and unix second `unix` (no fraction): for tests and benchmarks
    /// that count whole seconds.
    pub fn whole_seconds(mono: Instant, unix: u64) -> Now {
        Now {
            mono,
            unix,
            unix_ms: unix * 1000,
        }
    }
}

/// Unix seconds of an RFC 3339 time as GitHub writes them (`2026-12-02T08:00:00Z`, with or
/// without the `Z` or fractions); `None` when it is no such time or before 1970.
pub fn unix_of_rfc3339(text: &str) -> Option<u64> {
    humantime::parse_rfc3339_weak(text.trim_end_matches('Z'))
        .ok()?
        .duration_since(UNIX_EPOCH)
        .ok()
        .map(|d| d.as_secs())
}

/// Unix seconds of GitHub's RFC 3339 time, when it is one and fits 32 bits (until 2106).
pub fn github_unix(time: Option<&str>) -> Option<u32> {
    u32::try_from(unix_of_rfc3339(time?)?).ok()
}

/// Seconds from GitHub's `created_at` to its `started_at` (RFC 3339), when both are there and
/// in that order.
pub fn github_wait(created_at: Option<&str>, started_at: Option<&str>) -> Option<u32> {
    // The start first: a `queued` delivery has none, and its creation is then not parsed.
    let started = unix_of_rfc3339(started_at?)?;
    let created = unix_of_rfc3339(created_at?)?;
    u32::try_from(started.checked_sub(created)?).ok()
}

/// Unix seconds as RFC 3339, or the number itself where no calendar date fits.
pub fn rfc3339(unix: u64) -> String {
    UNIX_EPOCH
        .checked_add(Duration::from_secs(unix))
        .filter(|t| *t < UNIX_EPOCH + Duration::from_secs(253_402_300_799))
        .map_or_else(
            || format!("unix {unix}"),
            |t| humantime::format_rfc3339_seconds(t).to_string(),
        )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn github_times_read_back_as_unix_seconds() {
        assert_eq!(unix_of_rfc3339("2026-12-02T08:00:00Z"), Some(1_796_198_400));
        assert_eq!(unix_of_rfc3339("2026-12-02T08:00:00"), Some(1_796_198_400));
        assert_eq!(
            unix_of_rfc3339("2026-12-02T08:00:00.250Z"),
            Some(1_796_198_400)
        );
        assert_eq!(
            unix_of_rfc3339(&rfc3339(1_796_198_400)),
            Some(1_796_198_400)
        );
        assert_eq!(unix_of_rfc3339("yesterday"), None);
    }
}
