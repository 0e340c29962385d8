//! The shipped operations files stay true to the code: the dashboard uses only metrics that
//! exist, docs/metrics.md lists them all, and the systemd stop window outlasts a drain.

use crate::support::repo_root;

fn metric_names(text: &str) -> std::collections::BTreeSet<String> {
    let mut out = std::collections::BTreeSet::new();
    let mut rest = text;
    while let Some(i) = rest.find("ephemerd_") {
        let name: String = rest[i..]
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        let base = ["_bucket", "_count", "_sum"]
            .iter()
            .fold(name.clone(), |n, s| {
                n.strip_suffix(s).map(str::to_string).unwrap_or(n)
            });
        out.insert(base);
        rest = &rest[i + name.len()..];
    }
    out
}

#[test]
fn dashboard_and_metrics_doc_match_the_registry() {
    let registry = ephemer_actors_core::metrics::Metrics::new();
    registry.init_provider("local");
    registry
        .api_requests
        .with_label_values(&["generate_jitconfig", "201"])
        .inc();
    let exported = metric_names(&registry.encode());
    assert_eq!(exported.len(), 19, "{exported:?}");
    let dashboard =
        std::fs::read_to_string(repo_root().join("contrib/grafana-dashboard.json")).unwrap();
    serde_json::from_str::<serde_json::Value>(&dashboard).expect("the dashboard is JSON");
    for name in metric_names(&dashboard) {
        assert!(
            exported.contains(&name),
            "dashboard uses {name}, which is not exported"
        );
    }
    let doc = metric_names(&std::fs::read_to_string(repo_root().join("docs/metrics.md")).unwrap());
    assert_eq!(
        doc, exported,
        "docs/metrics.md lists exactly the exported metrics"
    );
}

#[test]
fn systemd_stop_window_outlasts_the_default_drain() {
    let unit = std::fs::read_to_string(repo_root().join("contrib/ephemer-actors.service")).unwrap();
    let stop: u64 = unit
        .lines()
        .find_map(|l| l.strip_prefix("TimeoutStopSec="))
        .and_then(|v| v.trim().parse().ok())
        .expect("TimeoutStopSec");
    assert!(
        stop > ephemer_actors_core::config::defaults::SHUTDOWN_TIMEOUT.as_secs(),
        "{stop}"
    );
    assert!(unit.contains("ExecStart=/usr/local/bin/ephemer-actors serve --config"));
}

/// The README's embedding code is the example's code, which `embed.rs` runs as it is.
#[test]
fn the_readme_embedding_section_is_the_example() {
    let readme = std::fs::read_to_string(repo_root().join("README.md")).unwrap();
    let example = std::fs::read_to_string(repo_root().join("examples/embed.rs")).unwrap();
    let section = &readme[readme.find("## Embedding").expect("an embedding section")..];
    let start = section.find("```rust\n").expect("a rust block") + "```rust\n".len();
    let block = &section[start..start + section[start..].find("\n```").unwrap()];
    assert!(
        block.starts_with("use actix_web::") && example.ends_with(&format!("{block}\n")),
        "README.md's embedding block differs from examples/embed.rs"
    );
}
