//! The one clock every actor reads: tokio's monotonic `Instant` for timers and ages, and unix
//! seconds for GitHub's rate-limit resets.
//!
//! In production unix time is the system's. Under paused tokio time (tests, benchmarks) a
//! [`Clock::virtual_from`] derives unix seconds from the paused monotonic clock, so a rate reset
//! "in 90 s" and a timer "in 90 s" move together.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::time::Instant;

/// Unix seconds now, from the system clock.
pub fn unix_now() -> u64 {
    unix_ms_now() / 1000
}

/// Unix milliseconds now, from the system clock (the one place that reads it).
pub fn unix_ms_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// Monotonic and wall time, real or virtual.
#[derive(Debug, Clone, Copy)]
pub struct Clock {
    virtual_base: Option<(Instant, u64)>,
}

impl Default for Clock {
    fn default() -> Self {
        Self::real()
    }
}

impl Clock {
    /// The system clock.
    pub fn real() -> Self {
        Clock { virtual_base: None }
    }

    /// Unix time that advances with tokio's (possibly paused) clock, starting at `unix_now`.
    pub fn virtual_from(unix_now: u64) -> Self {
        Clock {
            virtual_base: Some((Instant::now(), unix_now)),
        }
    }

    /// Monotonic now.
    pub fn now(&self) -> Instant {
        Instant::now()
    }

    /// Both readings at once, to pass into the pure cores.
    pub fn tick(&self) -> Now {
        let unix_ms = self.unix_ms();
        Now {
            mono: self.now(),
            unix: unix_ms / 1000,
            unix_ms,
        }
    }

    /// Unix seconds now.
    pub fn unix(&self) -> u64 {
        self.unix_ms() / 1000
    }

    /// Unix milliseconds now.
    pub fn unix_ms(&self) -> u64 {
        match self.virtual_base {
            Some((base, unix)) => {
                let since = Instant::now().saturating_duration_since(base);
                unix * 1000 + since.as_millis() as u64
            }
            None => unix_ms_now(),
        }
    }
}

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

/// Seconds from GitHub's `created_at` to its `started_at` (RFC 3339), when both are there and
/// in that order.
pub fn github_wait(created_at: Option<&str>, started_at: Option<&str>) -> Option<u32> {
    let created = unix_of_rfc3339(created_at?)?;
    let started = unix_of_rfc3339(started_at?)?;
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
