//! Process-wide tracing setup for the daemon: `log.level` (or `RUST_LOG`) and `log.format`.
//!
//! Only the binary installs a global subscriber; the library never does.

use anyhow::Context;
use ephemer_actors_core::config::{LogConfig, LogFormat};
use tracing_subscriber::EnvFilter;

/// Installs the global subscriber. `RUST_LOG`, when set, overrides `log.level`.
pub fn init(log: &LogConfig) -> anyhow::Result<()> {
    let filter = match std::env::var("RUST_LOG") {
        Ok(directives) if !directives.is_empty() => {
            EnvFilter::try_new(&directives).context("RUST_LOG is not a valid filter")?
        }
        _ => EnvFilter::try_new(&log.level).context("log.level is not a valid level")?,
    };
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let result = match log.format {
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
        LogFormat::Text => builder.with_ansi(false).try_init(),
    };
    result.map_err(|e| anyhow::anyhow!("cannot install the log subscriber: {e}"))
}
