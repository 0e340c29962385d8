//! The embeddable core of ephemer-actors: every actor, its messages, and the pure decision
//! cores behind them.
//!
//! A host actix application depends on this crate alone: it builds a [`config::Config`] (in
//! code or from the same TOML the daemon reads), a [`metrics::Metrics`] with its own registry,
//! and mounts the HTTP scopes it wants. Nothing here stops the actix `System` or installs global
//! state (no `SystemService`, no global metrics registry, no global tracing subscriber).

#![warn(missing_docs, unreachable_pub)]
// Without the `daemon` feature the daemon's own modules are private and partly unused here.
#![cfg_attr(
    not(feature = "daemon"),
    allow(unreachable_pub, unused_imports, dead_code)
)]

// The embedding API (docs/embedding.md): what a host app names to run, observe and stop an
// instance. `examples/embed`, a crate of its own built without the `daemon` feature, is the
// proof that it is enough.
pub mod admin;
pub mod clock;
pub mod config;
pub mod http;
pub mod metrics;
pub mod system;
pub mod tasks;
pub mod webhook;

pub use ephemer_decide::job;

/// Modules public only to the daemon's own binary, the stand-ins and the tests (the `daemon`
/// feature); without it they are the crate's own, and their items' names do not leak.
macro_rules! daemon_modules {
    ($($name:ident),* $(,)?) => {
        $(
            #[cfg(feature = "daemon")]
            #[doc(hidden)]
            pub mod $name;
            #[cfg(not(feature = "daemon"))]
            mod $name;
        )*
    };
}

daemon_modules!(
    bounded, cluster, github, harden, netns, provision, rate, release, retry, scaleset, scheduler,
    store, remove, telemetry, vocab, weaken, next_build,
);
// Written out: it exports a macro the crate names by path, which a macro-made module cannot.
#[cfg(feature = "daemon")]
#[doc(hidden)]
pub mod lifecycle;
#[cfg(not(feature = "daemon"))]
mod lifecycle;
pub(crate) mod tls;

#[cfg(feature = "daemon")]
#[doc(hidden)]
pub use ephemer_decide::durable;
#[cfg(not(feature = "daemon"))]
use ephemer_decide::durable;
pub use ephemer_decide::usage;

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

    /// Another user's hand while root walks a tree: swaps directory `dir` for a symlink to
    /// `target` and back, as fast as it can, until dropped.
    pub(crate) struct Swapper {
        stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
        thread: Option<std::thread::JoinHandle<()>>,
    }

    impl Swapper {
        /// Starts swapping `dir` (parked at `parked` while the link stands) for a link to
        /// `target`.
        pub(crate) fn start(
            dir: std::path::PathBuf,
            parked: std::path::PathBuf,
            target: std::path::PathBuf,
        ) -> Swapper {
            let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
            let thread = std::thread::spawn({
                let stop = stop.clone();
                move || {
                    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                        let _ = std::fs::rename(&dir, &parked);
                        let _ = std::os::unix::fs::symlink(&target, &dir);
                        std::thread::yield_now();
                        let _ = std::fs::remove_file(&dir);
                        let _ = std::fs::rename(&parked, &dir);
                    }
                }
            });
            Swapper {
                stop,
                thread: Some(thread),
            }
        }
    }

    impl Drop for Swapper {
        fn drop(&mut self) {
            self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
            if let Some(t) = self.thread.take() {
                let _ = t.join();
            }
        }
    }
}
