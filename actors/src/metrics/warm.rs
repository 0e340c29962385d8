//! Warm pools' series, per pool (labels bounded: pools are configured; outcomes and reasons
//! are fixed words). Part of the daemon's `Metrics`, registered with them.

use prometheus::{HistogramOpts, HistogramVec, IntCounterVec, IntGaugeVec, Opts, Registry};

/// Why a warm environment was thrown away, the `reason` label.
pub(crate) const DISCARD_REASONS: [&str; 6] = ["age", "dead", "failed", "stale", "surplus", "user"];

/// The series.
#[derive(Debug, Clone)]
pub struct WarmMetrics {
    /// `ephemerd_warm_available{pool}`: environments booted and waiting for a claim.
    pub available: IntGaugeVec,
    /// `ephemerd_warm_booting{pool}`: environments booting to be warm.
    pub booting: IntGaugeVec,
    /// `ephemerd_warm_claims_total{pool,outcome}`: runners started in a warm environment
    /// (`hit`) or in one booted for them (`miss`), in pools that keep some warm.
    pub claims: IntCounterVec,
    /// `ephemerd_warm_discarded_total{pool,reason}`: warm environments thrown away: `age`
    /// (older than `warm_max_age`), `dead` (failed its readiness check), `failed` (its boot
    /// failed), `stale` (built from what is no longer current), `surplus` (more than the
    /// pool keeps now: a window closed, a cordon, a drain), `user` (its `run_as` user went to
    /// a claimed job's runner waiting for it).
    pub discarded: IntCounterVec,
    /// `ephemerd_pickup_seconds{pool,warm}`: queued to runner process started, by whether
    /// the runner started in a warm environment (`hit`) or not (`miss`).
    pub pickup: HistogramVec,
    /// `ephemerd_pickup_github_seconds{pool,warm}`: GitHub's `started_at` less its
    /// `created_at` (whole seconds, GitHub's clock), for jobs taken by a runner of ours whose
    /// event carried both, by whether the runner started warm.
    pub github_pickup: HistogramVec,
}

use super::register;

impl WarmMetrics {
    /// The series, registered in `registry`.
    pub fn new(registry: &Registry) -> Self {
        let gauges = |name: &str, help: &str| {
            register(
                registry,
                super::must(IntGaugeVec::new(Opts::new(name, help), &["pool"])),
            )
        };
        let counters = |name: &str, help: &str, label: &str| {
            register(
                registry,
                super::must(IntCounterVec::new(Opts::new(name, help), &["pool", label])),
            )
        };
        WarmMetrics {
            available: gauges(
                "ephemerd_warm_available",
                "Environments booted and waiting for a claim, per pool.",
            ),
            booting: gauges(
                "ephemerd_warm_booting",
                "Environments booting to be kept warm, per pool.",
            ),
            claims: counters(
                "ephemerd_warm_claims_total",
                "Runners started in a warm environment (hit) or in one booted for them (miss), in pools that keep some warm.",
                "outcome",
            ),
            discarded: counters(
                "ephemerd_warm_discarded_total",
                "Warm environments thrown away: age, dead (failed its readiness check), failed (its boot failed), stale, surplus.",
                "reason",
            ),
            pickup: register(
                registry,
                super::must(HistogramVec::new(
                    HistogramOpts::new(
                        "ephemerd_pickup_seconds",
                        "Queued to runner process started, by pool and by whether the runner started in a warm environment (hit) or not (miss).",
                    )
                    .buckets(vec![
                        0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0,
                    ]),
                    &["pool", "warm"],
                )),
            ),
            github_pickup: register(
                registry,
                super::must(HistogramVec::new(
                    HistogramOpts::new(
                        "ephemerd_pickup_github_seconds",
                        "GitHub's started_at less its created_at (whole seconds), for jobs taken by a runner of ours, by pool and by whether the runner started warm (hit) or not (miss).",
                    )
                    .buckets(vec![1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 900.0]),
                    &["pool", "warm"],
                )),
            ),
        }
    }

    /// Touches a pool's series so they show zeros before its first environment.
    pub fn init_pool(&self, pool: &str, keeps_warm: bool) {
        self.available.with_label_values(&[pool]);
        if keeps_warm {
            self.booting.with_label_values(&[pool]);
            for outcome in ["hit", "miss"] {
                self.claims.with_label_values(&[pool, outcome]);
            }
            for reason in DISCARD_REASONS {
                self.discarded.with_label_values(&[pool, reason]);
            }
        }
    }
}
