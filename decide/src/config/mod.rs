//! The settings the cores read, as plain data: the claim retry ladder, warm keeping, a secret
//! that never prints, and the pin a scale set's jobs are routed by. Parsing and validation are
//! the daemon's (`ephemer-actors-core`'s `config`).

use std::time::Duration;

pub mod host;
mod secret;
pub mod warm;

pub use crate::vocab::{PoolName, ProviderKind};
pub use host::HostOs;
pub use secret::Secret;
pub use warm::{WarmConfig, WarmMode};

/// The ladder's defaults.
pub mod defaults {
    use std::time::Duration;

    /// `github.max_claims_per_minute`
    pub const MAX_CLAIMS_PER_MINUTE: u32 = 150;
    /// `runner.claim_retry.schedule`
    pub const RETRY_SCHEDULE: [Duration; 5] = [
        Duration::from_secs(30),
        Duration::from_secs(60),
        Duration::from_secs(120),
        Duration::from_secs(300),
        Duration::from_secs(600),
    ];
    /// `runner.claim_retry.max_age`
    pub const RETRY_MAX_AGE: Duration = Duration::from_secs(90 * 60);
    /// `runner.claim_retry.jitter`
    pub const RETRY_JITTER: f64 = 0.2;
    /// `runner.claim_retry.rate_reset_jitter`
    pub const RATE_RESET_JITTER: (Duration, Duration) =
        (Duration::from_secs(5), Duration::from_secs(25));
}

/// The label a pool's jobs carry inside the daemon in scale-set mode: GitHub assigned the
/// job to the pool's scale set, so it is routed to that pool and no other.
pub fn scaleset_pin(pool: &PoolName) -> String {
    format!("scaleset:{pool}")
}

/// `[runner.claim_retry]`: the ladder a failed claim climbs.
#[derive(Debug, Clone, PartialEq)]
pub struct ClaimRetryConfig {
    /// Off: a failed claim is given up at once.
    pub enabled: bool,
    /// Delays before each retry; the last rung repeats. Non-empty, non-decreasing.
    pub schedule: Vec<Duration>,
    /// Give up once the first failure is older than this.
    pub max_age: Duration,
    /// Uniform jitter as a fraction of the rung, in `[0, 1]`.
    pub jitter: f64,
    /// After a rate-limit error with a fresh reading: reset + uniform `[lo, hi)`.
    pub rate_reset_jitter: (Duration, Duration),
}

impl Default for ClaimRetryConfig {
    fn default() -> Self {
        ClaimRetryConfig {
            enabled: true,
            schedule: defaults::RETRY_SCHEDULE.to_vec(),
            max_age: defaults::RETRY_MAX_AGE,
            jitter: defaults::RETRY_JITTER,
            rate_reset_jitter: defaults::RATE_RESET_JITTER,
        }
    }
}
