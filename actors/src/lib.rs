//! The embeddable core of ephemer-actors: every actor, its messages, and the pure decision
//! cores behind them.
//!
//! A host actix application depends on this crate alone: it builds a [`config::Config`] (in
//! code or from the same TOML the daemon reads), a [`metrics::Metrics`] with its own registry,
//! and mounts the HTTP scopes it wants. Nothing here stops the actix `System` or installs global
//! state (no `SystemService`, no global metrics registry, no global tracing subscriber).

#![warn(missing_docs)]

pub mod admin;
pub mod clock;
pub mod cluster;
pub mod config;
pub mod github;
pub mod harden;
pub mod http;
pub mod lifecycle;
pub mod metrics;
pub mod provision;
pub mod rate;
pub mod release;
pub mod retry;
pub mod scaleset;
pub mod scheduler;
pub mod store;
pub mod system;
pub mod tls;
pub mod vocab;

pub use ephemer_decide::{durable, job};
pub mod webhook;

/// What the library's own tests share.
#[cfg(test)]
pub(crate) mod test_support {
    /// Says loudly that a test cannot run here and why; fails instead when
    /// `EPHEMER_REQUIRE_ENGINES` is set (CI, where nothing may skip).
    pub(crate) fn skip(what: &str, why: &str) {
        let required =
            std::env::var_os("EPHEMER_REQUIRE_ENGINES").is_some_and(|v| !v.is_empty() && v != "0");
        assert!(!required, "EPHEMER_REQUIRE_ENGINES is set, but {why}");
        eprintln!("\n!!! SKIPPING {what}: {why}\n");
    }
}
