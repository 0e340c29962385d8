//! `[telemetry]`: where each finished job's trace goes.

use super::Problems;
use crate::config::{TelemetryConfig, raw::RawTelemetry};

/// `service_name` when none is set.
const SERVICE_NAME: &str = "ephemer-actors";

pub(super) fn build_telemetry(raw: RawTelemetry, p: &mut Problems) -> TelemetryConfig {
    let otlp_endpoint = raw
        .otlp_endpoint
        .map(|e| e.trim().to_string())
        .filter(|e| !e.is_empty());
    if let Some(e) = &otlp_endpoint {
        if let Err(why) = check_endpoint(e) {
            p.push("telemetry.otlp_endpoint", why);
        } else if let Some(rest) = e.strip_prefix("http://")
            && !super::loopback(rest)
            && !raw.allow_insecure.unwrap_or(false)
        {
            // A trace names repositories, workflows, branches and runner names, and the
            // exporter's headers (OTEL_EXPORTER_OTLP_HEADERS) often carry a collector's key.
            p.push(
                "telemetry.otlp_endpoint",
                format!(
                    "{e:?} is plain http to another host: every job's trace (repositories, \
                     workflows, branches) and the exporter's headers would cross the network in \
                     clear; use https://, or set telemetry.allow_insecure = true to accept that"
                ),
            );
        }
    }
    let service_name = raw.service_name.unwrap_or_else(|| SERVICE_NAME.into());
    if service_name.trim().is_empty() {
        p.push("telemetry.service_name", "must not be empty");
    }
    TelemetryConfig {
        otlp_endpoint,
        service_name,
    }
}

/// An OTLP/HTTP base URL: `http://` or `https://`, a host, no query or credentials.
fn check_endpoint(e: &str) -> Result<(), String> {
    let rest = e
        .strip_prefix("http://")
        .or_else(|| e.strip_prefix("https://"))
        .ok_or_else(|| {
            format!("{e:?} is not an http:// or https:// URL (the collector's OTLP/HTTP address, e.g. http://localhost:4318)")
        })?;
    let authority = rest.split('/').next().unwrap_or_default();
    if authority.is_empty() {
        return Err(format!("{e:?} names no host"));
    }
    if authority.contains('@') {
        return Err(format!(
            "{e:?} carries credentials: put them in OTEL_EXPORTER_OTLP_HEADERS instead, out of the config file"
        ));
    }
    if e.contains(['?', '#', ' ']) {
        return Err(format!("{e:?} has a query, a fragment or a space"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_endpoint_is_an_http_url_with_a_host_and_traces_are_off_without_one() {
        let mut p = Problems::default();
        let off = build_telemetry(RawTelemetry::default(), &mut p);
        assert_eq!(off.otlp_endpoint, None);
        assert_eq!(off.service_name, "ephemer-actors");
        for good in [
            "http://localhost:4318",
            "https://otel.example.com/",
            "http://10.0.0.1:4318/v1/traces",
        ] {
            assert_eq!(check_endpoint(good), Ok(()), "{good}");
        }
        for bad in [
            "localhost:4318",
            "grpc://x:4317",
            "http://",
            "http://u:p@x:4318",
            "http://x:4318/?a=b",
        ] {
            assert!(check_endpoint(bad).is_err(), "{bad}");
        }
        let mut p = Problems::default();
        build_telemetry(
            RawTelemetry {
                otlp_endpoint: Some("collector:4318".into()),
                service_name: Some(" ".into()),
                allow_insecure: None,
            },
            &mut p,
        );
        let keys: Vec<_> = p.0.iter().map(|e| e.key.as_str()).collect();
        assert_eq!(keys, ["telemetry.otlp_endpoint", "telemetry.service_name"]);
    }

    /// Plain http to another host carries every job's trace in clear (issue 65, item 9):
    /// refused unless said; loopback and https are fine.
    #[test]
    fn plain_http_off_loopback_needs_allow_insecure() {
        let problems = |endpoint: &str, allow: Option<bool>| {
            let mut p = Problems::default();
            build_telemetry(
                RawTelemetry {
                    otlp_endpoint: Some(endpoint.into()),
                    service_name: None,
                    allow_insecure: allow,
                },
                &mut p,
            );
            p.0.into_iter().map(|e| e.reason).collect::<Vec<_>>()
        };
        let refused = problems("http://collector.corp:4318", None);
        assert!(
            refused.len() == 1 && refused[0].contains("allow_insecure"),
            "{refused:?}"
        );
        assert!(problems("http://collector.corp:4318", Some(true)).is_empty());
        for fine in [
            "http://127.0.0.1:4318",
            "http://[::1]:4318",
            "http://localhost:4318",
            "https://collector.corp",
        ] {
            assert!(problems(fine, None).is_empty(), "{fine}");
        }
    }
}
