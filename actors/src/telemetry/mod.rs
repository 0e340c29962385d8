//! One OpenTelemetry trace per job (`[telemetry] otlp_endpoint`), sent over OTLP/HTTP
//! (protobuf) by `opentelemetry-otlp`.
//!
//! The core builds a job's trace once, at its end ([`JobTrace`]); the scheduler hands it here
//! with a `try_send` into a bounded queue, so the export never waits on the scheduler and the
//! scheduler never waits on the collector: a full queue drops the trace and counts its spans
//! (`ephemerd_trace_spans_dropped_total{reason="queue_full"}`). A thread of its own batches
//! the queue (512 spans, or what came within a second) and exports, with the exporter's own
//! retries; a batch still refused is dropped and counted (`export_failed`).

mod convert;

use std::time::Duration;

use ephemer_decide::scheduler::core::trace::JobTrace;
use opentelemetry::InstrumentationScope;
use opentelemetry_otlp::{Protocol, WithExportConfig as _, WithHttpConfig as _};
use opentelemetry_sdk::{
    Resource,
    trace::{SpanData, SpanExporter as _},
};
use tokio::sync::{mpsc, oneshot};

use crate::{config::TelemetryConfig, metrics::traces::TraceMetrics};

/// Traces waiting for the exporter, at most.
pub const QUEUE_TRACES: usize = 4096;
/// Spans sent in one request, at most.
const BATCH_SPANS: usize = 512;
/// How long the first trace of a batch waits for others.
const BATCH_WAIT: Duration = Duration::from_secs(1);
/// One request's deadline (each of the exporter's retries).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

enum Item {
    Trace(JobTrace),
    Flush(oneshot::Sender<()>),
}

/// The scheduler's handle on the exporter. Cloning is cheap; the exporter's thread ends once
/// every handle is dropped and what was queued is sent.
#[derive(Clone)]
pub struct TraceExport {
    tx: mpsc::Sender<Item>,
    metrics: TraceMetrics,
}

impl std::fmt::Debug for TraceExport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TraceExport")
            .field("queued", &(QUEUE_TRACES - self.tx.capacity()))
            .finish()
    }
}

/// Why the exporter could not be made.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TraceExportError {
    /// The OTLP exporter refused its settings.
    #[error("the OTLP exporter: {0}")]
    Exporter(String),
    /// No thread for it.
    #[error("the trace exporter's thread: {0}")]
    Thread(String),
}

impl TraceExport {
    /// The exporter `config` asks for, or `None` when traces are off.
    pub fn start(
        config: &TelemetryConfig,
        metrics: TraceMetrics,
    ) -> Result<Option<Self>, TraceExportError> {
        let Some(url) = config.traces_url() else {
            return Ok(None);
        };
        let connector = hyper_rustls::HttpsConnectorBuilder::new()
            .with_provider_and_webpki_roots(rustls::crypto::ring::default_provider())
            .map_err(|e| TraceExportError::Exporter(e.to_string()))?
            .https_or_http()
            .enable_http1()
            .build();
        let client = opentelemetry_http::hyper::HyperClient::new(connector, REQUEST_TIMEOUT, None);
        let mut exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_http_client(client)
            .with_protocol(Protocol::HttpBinary)
            .with_endpoint(url.clone())
            .with_timeout(REQUEST_TIMEOUT)
            .build()
            .map_err(|e| TraceExportError::Exporter(e.to_string()))?;
        exporter.set_resource(
            &Resource::builder_empty()
                .with_service_name(config.service_name.clone())
                .build(),
        );
        let (tx, rx) = mpsc::channel(QUEUE_TRACES);
        let worker = metrics.clone();
        std::thread::Builder::new()
            .name("trace-export".into())
            .spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build();
                match rt {
                    Ok(rt) => rt.block_on(run(exporter, rx, worker)),
                    Err(e) => tracing::error!(error = %e, "the trace exporter has no runtime: no traces are sent"),
                }
            })
            .map_err(|e| TraceExportError::Thread(e.to_string()))?;
        tracing::info!(url = %url, "one trace per job is sent over OTLP/HTTP");
        Ok(Some(TraceExport { tx, metrics }))
    }

    /// Queues `trace`, or drops and counts it when the queue is full. Never waits.
    pub fn send(&self, trace: JobTrace) {
        let spans = trace.spans.len() as u64;
        match self.tx.try_send(Item::Trace(trace)) {
            Ok(()) => {}
            Err(mpsc::error::TrySendError::Full(_)) => self.dropped("queue_full", spans),
            Err(mpsc::error::TrySendError::Closed(_)) => self.dropped("export_failed", spans),
        }
    }

    fn dropped(&self, reason: &str, spans: u64) {
        self.metrics
            .dropped
            .with_label_values(&[reason])
            .inc_by(spans);
    }

    /// Waits up to `timeout` for what is queued now to be sent (at a shutdown). False when
    /// it was not.
    pub async fn flush(&self, timeout: Duration) -> bool {
        let (done, sent) = oneshot::channel();
        let asked = tokio::time::timeout(timeout, self.tx.send(Item::Flush(done)));
        let Ok(Ok(())) = asked.await else {
            return false;
        };
        matches!(tokio::time::timeout(timeout, sent).await, Ok(Ok(())))
    }
}

/// The exporter's loop: a batch at a time, until every handle is gone.
async fn run(
    exporter: opentelemetry_otlp::SpanExporter,
    mut rx: mpsc::Receiver<Item>,
    metrics: TraceMetrics,
) {
    let scope = InstrumentationScope::builder("ephemer-actors")
        .with_version(env!("CARGO_PKG_VERSION"))
        .build();
    let mut batch: Vec<SpanData> = Vec::new();
    let mut flushes = Vec::new();
    let take = |item: Item, batch: &mut Vec<SpanData>, flushes: &mut Vec<oneshot::Sender<()>>| {
        match item {
            Item::Trace(t) => batch.extend(convert::spans(&t, &scope)),
            Item::Flush(done) => flushes.push(done),
        }
    };
    while let Some(first) = rx.recv().await {
        take(first, &mut batch, &mut flushes);
        let deadline = tokio::time::Instant::now() + BATCH_WAIT;
        while batch.len() < BATCH_SPANS && flushes.is_empty() {
            match tokio::time::timeout_at(deadline, rx.recv()).await {
                Ok(Some(item)) => take(item, &mut batch, &mut flushes),
                Ok(None) | Err(_) => break,
            }
        }
        if !batch.is_empty() {
            let spans = batch.len() as u64;
            match exporter.export(std::mem::take(&mut batch)).await {
                Ok(()) => metrics.exported.inc_by(spans),
                Err(e) => {
                    metrics
                        .dropped
                        .with_label_values(&["export_failed"])
                        .inc_by(spans);
                    tracing::warn!(error = %e, spans, "job traces could not be sent to the OTLP collector; dropped");
                }
            }
        }
        for done in flushes.drain(..) {
            let _ = done.send(());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ephemer_decide::scheduler::core::trace::{TraceSpan, trace_id};

    fn trace(job: u64) -> JobTrace {
        JobTrace {
            trace_id: trace_id("acme", job),
            spans: vec![TraceSpan {
                id: [1; 8],
                parent: None,
                name: "workflow job",
                start_ms: 1_000,
                end_ms: 2_000,
                error: None,
                attributes: Vec::new(),
                events: Vec::new(),
            }],
        }
    }

    #[test]
    fn a_collector_that_never_answers_fills_the_queue_and_the_rest_is_dropped_and_counted() {
        // Accepts connections (the kernel's backlog) and never answers one.
        let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let config = TelemetryConfig {
            otlp_endpoint: Some(format!("http://{}", silent.local_addr().unwrap())),
            service_name: "test".into(),
        };
        let metrics = TraceMetrics::new(&prometheus::Registry::new());
        let export = TraceExport::start(&config, metrics.clone())
            .unwrap()
            .unwrap();
        let extra = 1_000;
        for job in 0..(QUEUE_TRACES + extra) as u64 {
            export.send(trace(job));
        }
        // A send that waited for room would never see the queue full: none would be counted.
        let full = metrics.dropped.with_label_values(&["queue_full"]).get();
        // The exporter's thread holds at most one batch (a span a trace here) out of the
        // queue, so at least `extra` less that batch were refused.
        assert!(
            full >= (extra as u64).saturating_sub(BATCH_SPANS as u64) && full <= extra as u64,
            "{full}"
        );
        assert_eq!(metrics.exported.get(), 0);
    }

    #[test]
    fn without_an_endpoint_there_is_no_exporter() {
        let metrics = TraceMetrics::new(&prometheus::Registry::new());
        assert!(
            TraceExport::start(&TelemetryConfig::default(), metrics)
                .unwrap()
                .is_none()
        );
    }
}
