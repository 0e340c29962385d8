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
pub mod durable;
pub mod github;
pub mod harden;
pub mod http;
pub mod job;
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
pub mod webhook;
