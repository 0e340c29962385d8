//! A job's trace ([`JobTrace`], built by the core) as the OpenTelemetry SDK's span data.

use std::{
    borrow::Cow,
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use ephemer_decide::scheduler::core::trace::{JobTrace, TraceEvent, TraceValue};
use opentelemetry::{
    InstrumentationScope, KeyValue, Value,
    trace::{Event, SpanContext, SpanId, SpanKind, Status, TraceFlags, TraceId, TraceState},
};
use opentelemetry_sdk::trace::{SpanData, SpanEvents, SpanLinks};

fn time(ms: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_millis(ms)
}

fn attributes(list: &[(&'static str, TraceValue)]) -> Vec<KeyValue> {
    list.iter()
        .map(|(k, v)| {
            let value = match v {
                TraceValue::Text(t) => Value::from(t.to_string()),
                TraceValue::Int(n) => Value::I64(*n),
                TraceValue::Bool(b) => Value::Bool(*b),
            };
            KeyValue::new(*k, value)
        })
        .collect()
}

fn event(e: &TraceEvent) -> Event {
    Event::new(e.name, time(e.at_ms), attributes(&e.attributes), 0)
}

/// `trace`'s spans, root first, each under `scope`.
pub(crate) fn spans(trace: &JobTrace, scope: &InstrumentationScope) -> Vec<SpanData> {
    let trace_id = TraceId::from_bytes(trace.trace_id);
    trace
        .spans
        .iter()
        .map(|s| {
            let mut events = SpanEvents::default();
            events.events = s.events.iter().map(event).collect();
            SpanData {
                span_context: SpanContext::new(
                    trace_id,
                    SpanId::from_bytes(s.id),
                    TraceFlags::SAMPLED,
                    false,
                    TraceState::default(),
                ),
                parent_span_id: s.parent.map_or(SpanId::INVALID, SpanId::from_bytes),
                parent_span_is_remote: false,
                span_kind: if s.parent.is_none() {
                    SpanKind::Server
                } else {
                    SpanKind::Internal
                },
                name: Cow::Borrowed(s.name),
                start_time: time(s.start_ms),
                end_time: time(s.end_ms),
                attributes: attributes(&s.attributes),
                dropped_attributes_count: 0,
                events,
                links: SpanLinks::default(),
                status: match &s.error {
                    Some(e) => Status::error(e.clone()),
                    None => Status::Unset,
                },
                instrumentation_scope: scope.clone(),
            }
        })
        .collect()
}
