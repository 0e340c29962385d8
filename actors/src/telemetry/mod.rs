//! One OpenTelemetry trace per job (`[telemetry] otlp_endpoint`), sent over OTLP/HTTP
//! (protobuf: the collector's `ExportTraceServiceRequest`, as `opentelemetry-proto` encodes it).
//!
//! The core builds a job's trace once, at its end ([`JobTrace`]); the scheduler hands it here
//! with a `try_send` into a bounded queue, so the scheduler never waits on the collector: a full
//! queue drops the trace and counts its spans (`ephemerd_trace_spans_dropped_total{reason=
//! "queue_full"}`). A thread of its own writes each trace to the [`outbox`] at once (under
//! `state.dir`, synced) and sends what waits there, oldest first, up to 4 MiB a request; only a
//! 2xx answer removes a trace. Refused or unanswered, the traces stay and are sent again
//! after 5 s, doubling to a minute, and after a restart: a `kill -9` right after a job ends,
//! or a collector away for an hour, loses nothing. The outbox keeps the newest
//! [`outbox::OUTBOX_TRACES`]; older ones are dropped and counted (`outbox_full`).

mod convert;
pub mod outbox;

use std::{
    path::Path,
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use ephemer_decide::scheduler::core::trace::JobTrace;
use opentelemetry::InstrumentationScope;
use opentelemetry_http::{Bytes, HttpClient as _, Request};
use opentelemetry_proto::{
    tonic::collector::trace::v1::ExportTraceServiceRequest,
    transform::{
        common::tonic::ResourceAttributesWithSchema,
        trace::tonic::group_spans_by_resource_and_scope,
    },
};
use opentelemetry_sdk::Resource;
use prost::Message as _;
use tokio::sync::{mpsc, oneshot};

use crate::{config::TelemetryConfig, metrics::traces::TraceMetrics};

/// Traces waiting for the exporter's thread, at most.
pub const QUEUE_TRACES: usize = 4096;
/// Bytes of traces sent in one request, at most (one trace is always sent whole).
const BATCH_BYTES: usize = 4 << 20;
/// How long a trace waits for others before a request goes.
const BATCH_WAIT: Duration = Duration::from_millis(200);
/// One request's deadline.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// After a refused or failed request, the next is tried after this, doubling to
/// [`RETRY_MAX`].
const RETRY_FIRST: Duration = Duration::from_secs(5);
/// The longest wait between tries.
const RETRY_MAX: Duration = Duration::from_secs(60);

enum Item {
    Trace(JobTrace),
    Flush(oneshot::Sender<()>),
}

/// The scheduler's handle on the exporter. Cloning is cheap; the exporter's thread ends once
/// every handle is dropped (what waits stays in the outbox for the next start).
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
    /// The HTTP client refused its settings.
    #[error("the OTLP exporter: {0}")]
    Exporter(String),
    /// No thread for it.
    #[error("the trace exporter's thread: {0}")]
    Thread(String),
}

/// What the exporter's thread holds.
struct Sender {
    client: opentelemetry_http::hyper::HyperClient<
        hyper_rustls::HttpsConnector<hyper_util::client::legacy::connect::HttpConnector>,
    >,
    url: String,
    resource: ResourceAttributesWithSchema,
    scope: InstrumentationScope,
    outbox: outbox::Outbox,
    metrics: TraceMetrics,
}

impl TraceExport {
    /// The exporter `config` asks for, or `None` when traces are off; traces wait for the
    /// collector under `state_dir/traces` (`None`: in memory).
    pub fn start(
        config: &TelemetryConfig,
        metrics: TraceMetrics,
        state_dir: Option<&Path>,
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
        let resource = Resource::builder_empty()
            .with_service_name(config.service_name.clone())
            .build();
        let dir = state_dir.map(|d| d.join("traces"));
        let outbox = outbox::Outbox::open(dir.as_deref(), outbox::OUTBOX_TRACES);
        if !outbox.is_empty() {
            tracing::info!(
                traces = outbox.len(),
                "job traces the collector had not accepted before the restart are sent again"
            );
        }
        let sender = Sender {
            client,
            url: url.clone(),
            resource: ResourceAttributesWithSchema::from(&resource),
            scope: InstrumentationScope::builder("ephemer-actors")
                .with_version(env!("CARGO_PKG_VERSION"))
                .build(),
            outbox,
            metrics: metrics.clone(),
        };
        let (tx, rx) = mpsc::channel(QUEUE_TRACES);
        std::thread::Builder::new()
            .name("trace-export".into())
            .spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build();
                match rt {
                    Ok(rt) => rt.block_on(run(sender, rx)),
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

    /// Waits up to `timeout` for what is queued now to be written to the outbox and, the
    /// collector willing, sent (at a shutdown). False when it was not sent: it is still kept.
    pub async fn flush(&self, timeout: Duration) -> bool {
        let (done, sent) = oneshot::channel();
        let asked = tokio::time::timeout(timeout, self.tx.send(Item::Flush(done)));
        let Ok(Ok(())) = asked.await else {
            return false;
        };
        matches!(tokio::time::timeout(timeout, sent).await, Ok(Ok(())))
    }
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

impl Sender {
    /// Writes `trace` to the outbox, encoded as the request the collector reads.
    fn keep(&mut self, trace: &JobTrace) {
        let spans = convert::spans(trace, &self.scope);
        let count = spans.len() as u64;
        let request = ExportTraceServiceRequest {
            resource_spans: group_spans_by_resource_and_scope(spans, &self.resource),
        };
        let dropped = self.outbox.put(request.encode_to_vec(), count, unix_ms());
        if dropped > 0 {
            self.metrics
                .dropped
                .with_label_values(&["outbox_full"])
                .inc_by(dropped);
        }
    }

    /// Sends the oldest waiting traces in one request (protobuf messages concatenated are
    /// one message with their repeated fields joined). Ok: the collector accepted them.
    async fn send_oldest(&mut self) -> Result<(), String> {
        let batch = self.outbox.oldest(BATCH_BYTES);
        if batch.is_empty() {
            return Ok(());
        }
        let n = batch.len();
        let spans: u64 = batch.iter().map(|w| w.spans).sum();
        let body: Vec<u8> = batch.iter().flat_map(|w| w.body.iter().copied()).collect();
        let request = Request::builder()
            .method("POST")
            .uri(&self.url)
            .header("content-type", "application/x-protobuf")
            .body(Bytes::from(body))
            .map_err(|e| e.to_string())?;
        let answer = self
            .client
            .send_bytes(request)
            .await
            .map_err(|e| e.to_string())?;
        if !answer.status().is_success() {
            return Err(format!("the collector answered {}", answer.status()));
        }
        self.outbox.sent(n);
        self.metrics.exported.inc_by(spans);
        Ok(())
    }
}

/// The exporter's loop: keeps each trace as it comes, sends what waits, and tries again
/// after a failure, until every handle is gone.
async fn run(mut sender: Sender, mut rx: mpsc::Receiver<Item>) {
    let mut flushes: Vec<oneshot::Sender<()>> = Vec::new();
    let mut wait = RETRY_FIRST;
    let mut retry_at: Option<tokio::time::Instant> = None;
    let mut failing = false;
    // When the traces gathered now go (set by the first of them).
    let mut batch_at: Option<tokio::time::Instant> = None;
    loop {
        // Something to send and no failure to wait out: gather for a moment, then send.
        let due = if sender.outbox.is_empty() {
            None
        } else {
            Some(retry_at.unwrap_or_else(|| {
                *batch_at.get_or_insert_with(|| tokio::time::Instant::now() + BATCH_WAIT)
            }))
        };
        let item = match due {
            Some(at) => match tokio::time::timeout_at(at, rx.recv()).await {
                Ok(item) => item.map(Some),
                Err(_) => Some(None),
            },
            None => rx.recv().await.map(Some),
        };
        match item {
            // Every handle gone: what waits stays in the outbox.
            None => return,
            Some(Some(Item::Trace(t))) => {
                sender.keep(&t);
                continue;
            }
            Some(Some(Item::Flush(done))) => {
                if sender.outbox.is_empty() {
                    let _ = done.send(());
                    continue;
                }
                if retry_at.is_some() {
                    // The collector is away: the traces are kept, the flush says not sent.
                    drop(done);
                    continue;
                }
                // Sent below, without waiting for others.
                flushes.push(done);
            }
            Some(None) => {}
        }
        batch_at = None;
        match sender.send_oldest().await {
            Ok(()) => {
                if failing {
                    tracing::info!(
                        waiting = sender.outbox.len(),
                        "the OTLP collector accepts job traces again"
                    );
                }
                failing = false;
                retry_at = None;
                wait = RETRY_FIRST;
                if sender.outbox.is_empty() {
                    for done in flushes.drain(..) {
                        let _ = done.send(());
                    }
                }
            }
            Err(e) => {
                if !failing {
                    tracing::warn!(error = %e, waiting = sender.outbox.len(), "job traces could not be sent to the OTLP collector; kept and sent again");
                }
                failing = true;
                retry_at = Some(tokio::time::Instant::now() + wait);
                wait = (wait * 2).min(RETRY_MAX);
                // A flush does not wait out an outage: the traces are kept.
                flushes.clear();
            }
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
        let export = TraceExport::start(&config, metrics.clone(), None)
            .unwrap()
            .unwrap();
        // The first trace is kept and its request hangs on the silent collector for the
        // request's deadline: the queue behind it fills.
        export.send(trace(0));
        // A plain test thread, not an arbiter: blocking it is what the test wants.
        #[allow(clippy::disallowed_methods)]
        std::thread::sleep(BATCH_WAIT * 3);
        let extra = 1_000;
        for job in 1..=(QUEUE_TRACES + extra) as u64 {
            export.send(trace(job));
        }
        // A send that waited for room would never see the queue full: none would be counted.
        let full = metrics.dropped.with_label_values(&["queue_full"]).get();
        assert!(
            (extra as u64..=extra as u64 + 1).contains(&full),
            "{full}"
        );
        assert_eq!(metrics.exported.get(), 0);
    }

    /// Traces the collector refuses are kept and sent again once it accepts (only a 2xx
    /// removes one), in order, each once.
    #[actix_rt::test]
    async fn refused_traces_are_kept_and_sent_again_once_the_collector_accepts() {
        use std::sync::{
            Arc,
            atomic::{AtomicUsize, Ordering},
        };
        let dir = tempfile::tempdir().unwrap();
        let refuse = Arc::new(AtomicUsize::new(2));
        let got = Arc::new(std::sync::Mutex::new(Vec::<u8>::new()));
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let (r, g) = (refuse.clone(), got.clone());
        let server = actix_web::HttpServer::new(move || {
            let (r, g) = (r.clone(), g.clone());
            actix_web::App::new().route(
                "/v1/traces",
                actix_web::web::post().to(move |body: actix_web::web::Bytes| {
                    let (r, g) = (r.clone(), g.clone());
                    async move {
                        if r.load(Ordering::SeqCst) > 0 {
                            r.fetch_sub(1, Ordering::SeqCst);
                            return actix_web::HttpResponse::ServiceUnavailable().finish();
                        }
                        g.lock().unwrap().extend_from_slice(&body);
                        actix_web::HttpResponse::Ok().finish()
                    }
                }),
            )
        })
        .listen(listener)
        .unwrap()
        .workers(1)
        .run();
        actix_rt::spawn(server);
        let config = TelemetryConfig {
            otlp_endpoint: Some(url),
            service_name: "test".into(),
        };
        let metrics = TraceMetrics::new(&prometheus::Registry::new());
        let export = TraceExport::start(&config, metrics.clone(), Some(dir.path()))
            .unwrap()
            .unwrap();
        export.send(trace(1));
        export.send(trace(2));
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while metrics.exported.get() < 2 && std::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert_eq!(metrics.exported.get(), 2, "both sent once the collector accepted");
        assert_eq!(refuse.load(Ordering::SeqCst), 0);
        let body = got.lock().unwrap().clone();
        let request = ExportTraceServiceRequest::decode(&body[..]).unwrap();
        let spans: usize = request
            .resource_spans
            .iter()
            .flat_map(|r| &r.scope_spans)
            .map(|s| s.spans.len())
            .sum();
        assert_eq!(spans, 2, "each once");
        let left = std::fs::read_dir(dir.path().join("traces")).unwrap().count();
        assert_eq!(left, 0, "a 2xx removes them from the outbox");
    }

    #[test]
    fn without_an_endpoint_there_is_no_exporter() {
        let metrics = TraceMetrics::new(&prometheus::Registry::new());
        assert!(
            TraceExport::start(&TelemetryConfig::default(), metrics, None)
                .unwrap()
                .is_none()
        );
    }
}
