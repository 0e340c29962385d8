//! The one clock every actor reads: tokio's monotonic clock for timers and ages (kept as a
//! std [`Instant`], the type the pure cores hold), and unix seconds for GitHub's rate-limit
//! resets.
//!
//! In production unix time is the system's. Under paused tokio time (tests, benchmarks) a
//! [`Clock::virtual_from`] derives unix seconds from the paused monotonic clock, so a rate reset
//! "in 90 s" and a timer "in 90 s" move together.

use std::time::{SystemTime, UNIX_EPOCH};

pub use ephemer_decide::clock::{Instant, Now, github_unix, github_wait, rfc3339, unix_of_rfc3339};

/// Monotonic now, from tokio's clock: paused and advanced with it in tests, so timers and the
/// ages the cores compute move together. Every actor reads the time here, never
/// `std::time::Instant::now()` (which a paused clock does not move).
pub fn mono_now() -> Instant {
    tokio::time::Instant::now().into_std()
}

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
            virtual_base: Some((mono_now(), unix_now)),
        }
    }

    /// Monotonic now.
    pub fn now(&self) -> Instant {
        mono_now()
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
                let since = mono_now().saturating_duration_since(base);
                unix * 1000 + since.as_millis() as u64
            }
            None => unix_ms_now(),
        }
    }
}
