//! The trace exporter's series (`[telemetry]`). Part of the daemon's `Metrics`, registered with
//! them; zero while traces are off.

use prometheus::{IntCounter, IntCounterVec, Opts, Registry};

use super::register;

/// Why spans were dropped, the `reason` label.
pub(crate) const DROP_REASONS: [&str; 3] = ["queue_full", "outbox_full", "export_failed"];

/// The series.
#[derive(Debug, Clone)]
pub struct TraceMetrics {
    /// `ephemerd_trace_spans_exported_total`: spans the collector accepted.
    pub exported: IntCounter,
    /// `ephemerd_trace_spans_dropped_total{reason}`: spans never sent: `queue_full` (the
    /// export queue was full: the collector is slow or away, and the scheduler never waits for
    /// it), `outbox_full` (the oldest of the traces kept for a collector that is away),
    /// `export_failed` (the exporter's thread was gone).
    pub dropped: IntCounterVec,
}

impl TraceMetrics {
    /// The series, registered in `registry`.
    pub fn new(registry: &Registry) -> Self {
        let dropped = register(
            registry,
            super::must(IntCounterVec::new(
                Opts::new(
                    "ephemerd_trace_spans_dropped_total",
                    "Job trace spans never sent to the OTLP collector, by reason (queue_full, outbox_full, export_failed).",
                ),
                &["reason"],
            )),
        );
        for reason in DROP_REASONS {
            dropped.with_label_values(&[reason]);
        }
        TraceMetrics {
            exported: register(
                registry,
                super::must(IntCounter::new(
                    "ephemerd_trace_spans_exported_total",
                    "Job trace spans the OTLP collector accepted.",
                )),
            ),
            dropped,
        }
    }
}
