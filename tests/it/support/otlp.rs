//! An OTLP/HTTP trace receiver for tests: `POST /v1/traces`, the body decoded as the
//! collector's protobuf (`ExportTraceServiceRequest`, the types `opentelemetry-proto` generates
//! from the OTLP spec), each span kept. It can refuse the first requests (503), as a collector
//! that is starting does.

use std::{
    collections::BTreeMap,
    sync::{Arc, Mutex},
};

use actix_web::{App, HttpResponse, HttpServer, web};
use opentelemetry_proto::tonic::{
    collector::trace::v1::{ExportTraceServiceRequest, ExportTraceServiceResponse},
    common::v1::any_value::Value,
};
use prost::Message as _;

/// One span as received.
#[derive(Debug, Clone)]
pub struct Span {
    pub trace_id: String,
    pub span_id: String,
    pub parent: String,
    pub name: String,
    pub start_ms: u64,
    pub end_ms: u64,
    /// Its attributes, each as text.
    pub attributes: BTreeMap<String, String>,
    /// Its events' names, each with its attributes as text.
    pub events: Vec<(String, BTreeMap<String, String>)>,
    /// The status message, when its status is an error.
    pub error: Option<String>,
    /// The resource's `service.name`.
    pub service: String,
}

#[derive(Debug, Default)]
struct Inner {
    spans: Vec<Span>,
    requests: usize,
    refuse: usize,
}

/// The receiver; stops with the test's actix system.
#[derive(Debug, Clone)]
pub struct Receiver {
    pub url: String,
    inner: Arc<Mutex<Inner>>,
}

fn text(v: Option<&Value>) -> String {
    match v {
        Some(Value::StringValue(s)) => s.clone(),
        Some(Value::IntValue(n)) => n.to_string(),
        Some(Value::BoolValue(b)) => b.to_string(),
        Some(Value::DoubleValue(d)) => d.to_string(),
        other => format!("{other:?}"),
    }
}

fn attrs(list: &[opentelemetry_proto::tonic::common::v1::KeyValue]) -> BTreeMap<String, String> {
    list.iter()
        .map(|kv| {
            (
                kv.key.clone(),
                text(kv.value.as_ref().and_then(|v| v.value.as_ref())),
            )
        })
        .collect()
}

async fn traces(body: web::Bytes, inner: web::Data<Arc<Mutex<Inner>>>) -> HttpResponse {
    let mut inner = inner.lock().unwrap();
    inner.requests += 1;
    if inner.refuse > 0 {
        inner.refuse -= 1;
        return HttpResponse::ServiceUnavailable().finish();
    }
    let Ok(req) = ExportTraceServiceRequest::decode(body) else {
        return HttpResponse::BadRequest().body("not an ExportTraceServiceRequest");
    };
    for rs in req.resource_spans {
        let service = rs
            .resource
            .as_ref()
            .map(|r| attrs(&r.attributes))
            .and_then(|a| a.get("service.name").cloned())
            .unwrap_or_default();
        for ss in rs.scope_spans {
            for s in ss.spans {
                let error = s
                    .status
                    .as_ref()
                    .filter(|st| st.code == 2)
                    .map(|st| st.message.clone());
                inner.spans.push(Span {
                    trace_id: hex(&s.trace_id),
                    span_id: hex(&s.span_id),
                    parent: hex(&s.parent_span_id),
                    name: s.name,
                    start_ms: s.start_time_unix_nano / 1_000_000,
                    end_ms: s.end_time_unix_nano / 1_000_000,
                    attributes: attrs(&s.attributes),
                    events: s
                        .events
                        .iter()
                        .map(|e| (e.name.clone(), attrs(&e.attributes)))
                        .collect(),
                    error,
                    service: service.clone(),
                });
            }
        }
    }
    HttpResponse::Ok()
        .content_type("application/x-protobuf")
        .body(ExportTraceServiceResponse::default().encode_to_vec())
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

impl Receiver {
    /// Listens on a free port, refusing the first `refuse` requests with 503.
    pub fn start(refuse: usize) -> Receiver {
        let inner = Arc::new(Mutex::new(Inner {
            refuse,
            ..Inner::default()
        }));
        let data = web::Data::new(inner.clone());
        let server = HttpServer::new(move || {
            App::new()
                .app_data(data.clone())
                .app_data(web::PayloadConfig::new(16 << 20))
                .route("/v1/traces", web::post().to(traces))
        })
        .workers(1)
        .bind(("127.0.0.1", 0))
        .unwrap();
        let addr = server.addrs()[0];
        actix_rt::spawn(server.run());
        Receiver {
            url: format!("http://{addr}"),
            inner,
        }
    }

    /// Refuses the next `n` requests with 503 (`usize::MAX`: a collector that is away).
    pub fn refuse(&self, n: usize) {
        self.inner.lock().unwrap().refuse = n;
    }

    /// Every span so far.
    pub fn spans(&self) -> Vec<Span> {
        self.inner.lock().unwrap().spans.clone()
    }

    /// Requests so far (refused ones too).
    pub fn requests(&self) -> usize {
        self.inner.lock().unwrap().requests
    }
}
