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

/// The `ephemerd_*` names a registry exports once every labelled metric has a series.
fn exported() -> std::collections::BTreeSet<String> {
    let registry = ephemer_actors_core::metrics::Metrics::new();
    registry.init_provider("local");
    registry.init_runner_version("local");
    registry.set_build_info("0.0.0", "test");
    registry.scaleset.init_pool("local");
    registry.warm.init_pool("local", true);
    registry.warm.pickup.with_label_values(&["local", "hit"]);
    registry
        .warm
        .github_pickup
        .with_label_values(&["local", "hit"]);
    registry.vm.boot.with_label_values(&["vm"]);
    registry.job_uncovered(&["self-hosted".to_string()]);
    registry
        .api_requests
        .with_label_values(&["generate_jitconfig", "201"])
        .inc();
    metric_names(&registry.encode())
}

#[test]
fn dashboard_and_metrics_doc_match_the_registry() {
    let exported = exported();
    // The contract's 19, ephemerd_webhook_ignored_total, ephemerd_environment_failures_total,
    // ephemerd_orphan_sweep_checks_total, ephemerd_store_healthy,
    // ephemerd_reconcile_repo_failures_total, ephemerd_webhook_refused_total,
    // ephemerd_jobs_uncovered_total, ephemerd_pool_up, ephemerd_build_info,
    // ephemerd_ledger_up and its round trips, ephemerd_reconcile_readmitted_total (the
    // contract's too),
    // ephemerd_reconcile_queued_idle, ephemerd_jobs_parked_total, the runner's version and
    // lag (the contract's too), below the minimum, and its releases refused and lookups failed;
    // scale-set mode's statistics, messages, acquires, reckoning and session; warm pools'
    // available (the contract's too), booting, claims and discards, and the pickup latency,
    // to the runner's start and to GitHub's `started_at`; linux_vm pools' boot time; the
    // trace exporter's spans sent and dropped; trees teardowns could not remove; runners
    // GitHub refused as too old, and its outages refusing the newest release; deliveries
    // naming an unknown installation (the contract's); a scale set's labels the service
    // dropped.
    assert_eq!(exported.len(), 59, "{exported:?}");
    let dashboard =
        std::fs::read_to_string(repo_root().join("contrib/grafana-dashboard.json")).unwrap();
    let board: serde_json::Value = serde_json::from_str(&dashboard).expect("the dashboard is JSON");
    // One daemon or many: every query is scoped to the $instance variable.
    assert!(
        board["templating"]["list"]
            .as_array()
            .unwrap()
            .iter()
            .any(|v| v["name"] == "instance"),
        "no $instance variable"
    );
    for panel in board["panels"].as_array().unwrap() {
        for target in panel["targets"].as_array().unwrap() {
            let expr = target["expr"].as_str().unwrap();
            let metrics = expr.matches("ephemerd_").count() + expr.matches("process_").count();
            assert_eq!(
                expr.matches("instance=~\"$instance\"").count(),
                metrics,
                "{}: not every metric is scoped to $instance: {expr}",
                panel["title"]
            );
        }
    }
    for metric in [
        "ephemerd_webhook_refused_total",
        "ephemerd_jobs_uncovered_total",
        "ephemerd_pool_up",
        "ephemerd_store_healthy",
        "process_resident_memory_bytes",
    ] {
        assert!(dashboard.contains(metric), "no panel shows {metric}");
    }
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

/// `contrib/alerts.yml`: every rule has a name, an expression on exported metrics only, a
/// severity and a summary (parsed by shape; promtool is not on these machines).
#[test]
fn alert_rules_use_only_exported_metrics() {
    let exported = exported();
    let text = std::fs::read_to_string(repo_root().join("contrib/alerts.yml")).unwrap();
    assert!(text.starts_with('#') || text.starts_with("groups:"));
    let rules: Vec<&str> = text.split("- alert: ").skip(1).collect();
    assert!(rules.len() >= 10, "{} rules", rules.len());
    let mut names = std::collections::BTreeSet::new();
    for rule in &rules {
        let name = rule.lines().next().unwrap().trim();
        assert!(names.insert(name), "alert {name} twice");
        for key in ["expr:", "severity:", "summary:"] {
            assert!(rule.contains(key), "alert {name} lacks {key}");
        }
        let used = metric_names(rule);
        assert!(!used.is_empty(), "alert {name} uses no ephemerd metric");
        for metric in used {
            assert!(
                exported.contains(&metric),
                "alert {name} uses {metric}, which is not exported"
            );
        }
        assert!(
            !rule.contains('\t'),
            "alert {name}: tabs are not YAML indentation"
        );
    }
    for metric in [
        "ephemerd_pool_up",
        "ephemerd_webhook_refused_total",
        "ephemerd_store_healthy",
        "ephemerd_claim_retry_given_up_total",
        "ephemerd_reconcile_queued_idle",
        "ephemerd_jobs_parked_total",
    ] {
        assert!(text.contains(metric), "no alert on {metric}");
    }
}

/// `systemd-analyze verify` accepts the shipped unit (with ExecStart pointing at this build).
#[test]
fn the_systemd_unit_verifies() {
    let Some(analyze) = crate::support::which("systemd-analyze") else {
        eprintln!("SKIPPED the_systemd_unit_verifies: systemd-analyze is not installed");
        return;
    };
    let unit = std::fs::read_to_string(repo_root().join("contrib/ephemer-actors.service"))
        .unwrap()
        .replace(
            "/usr/bin/ephemer-actors",
            env!("CARGO_BIN_EXE_ephemer-actors"),
        );
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ephemer-actors.service");
    std::fs::write(&path, unit).unwrap();
    let out = std::process::Command::new(analyze)
        .arg("verify")
        .arg(&path)
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stderr);
    // Without a running systemd some checks cannot run ("System has not been booted"); what
    // the unit says itself must be clean.
    let about_unit: Vec<&str> = said
        .lines()
        .filter(|l| l.contains("ephemer-actors.service"))
        .collect();
    assert!(about_unit.is_empty(), "{said}");
}

#[test]
fn systemd_stop_window_outlasts_the_default_drain() {
    let unit = std::fs::read_to_string(repo_root().join("contrib/ephemer-actors.service")).unwrap();
    let stop: u64 = unit
        .lines()
        .find_map(|l| l.strip_prefix("TimeoutStopSec="))
        .and_then(|v| v.trim().parse().ok())
        .expect("TimeoutStopSec");
    let needed = ephemer_actors_core::config::defaults::SHUTDOWN_TIMEOUT
        + ephemer_actors_core::system::AFTER_SHUTDOWN_TIMEOUT;
    assert!(stop >= needed.as_secs(), "{stop} < {needed:?}");
    // Runners outlive a daemon that dies, to be adopted by the next one.
    assert!(unit.contains("\nKillMode=process\n"), "{unit}");
    assert!(unit.contains("ExecStart=/usr/bin/ephemer-actors serve --config"));
}

/// The README's embedding code is the example's code, which `embed.rs` runs as it is.
#[test]
fn the_readme_embedding_section_is_the_example() {
    let readme = std::fs::read_to_string(repo_root().join("README.md")).unwrap();
    let example = std::fs::read_to_string(repo_root().join("examples/embed/src/main.rs")).unwrap();
    let section = &readme[readme.find("## Embedding").expect("an embedding section")..];
    let start = section.find("```rust\n").expect("a rust block") + "```rust\n".len();
    let block = &section[start..start + section[start..].find("\n```").unwrap()];
    assert!(
        block.starts_with("use actix_web::") && example.ends_with(&format!("{block}\n")),
        "README.md's embedding block differs from examples/embed/src/main.rs"
    );
}

/// The top-level modules of `src` (`actors/src`, `decide/src`: each file or folder under it)
/// and the ones each names through `crate::` outside its tests.
fn module_graph(
    src: &str,
) -> std::collections::BTreeMap<String, std::collections::BTreeSet<String>> {
    let root = repo_root().join(src);
    let mut graph = std::collections::BTreeMap::new();
    let mut stack = vec![root.clone()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap().flatten() {
            let path = entry.path();
            if path.is_dir() {
                stack.push(path);
                continue;
            }
            let rel = path.strip_prefix(&root).unwrap();
            let top = rel
                .components()
                .next()
                .unwrap()
                .as_os_str()
                .to_string_lossy();
            let top = top.trim_end_matches(".rs").to_string();
            let is_test = rel.components().any(|c| c.as_os_str() == "tests")
                || rel.file_name().is_some_and(|f| f == "tests.rs");
            if top == "lib" || is_test || path.extension().is_none_or(|e| e != "rs") {
                continue;
            }
            let whole = std::fs::read_to_string(&path).unwrap();
            let code = non_test(&whole);
            let text = code.as_str();
            let deps: &mut std::collections::BTreeSet<String> =
                graph.entry(top.clone()).or_default();
            // `crate::name` and the names inside `crate::{...}`.
            let mut rest = text;
            while let Some(i) = rest.find("crate::") {
                rest = &rest[i + "crate::".len()..];
                let names: Vec<String> = if let Some(group) = rest.strip_prefix('{') {
                    let end = group.find("};").unwrap_or(group.len());
                    let mut depth = 0;
                    let mut out = Vec::new();
                    let mut word = String::new();
                    for c in group[..end].chars() {
                        match c {
                            '{' => depth += 1,
                            '}' => depth -= 1,
                            c if depth == 0 && (c.is_ascii_alphanumeric() || c == '_') => {
                                word.push(c);
                                continue;
                            }
                            _ => {}
                        }
                        // A word ends: at the top of the group it may be a module
                        // (names that are not are dropped below); deeper, it is not.
                        if depth == 0 && !word.is_empty() {
                            out.push(std::mem::take(&mut word));
                        } else {
                            word.clear();
                        }
                    }
                    if !word.is_empty() {
                        out.push(word);
                    }
                    out
                } else {
                    let word: String = rest
                        .chars()
                        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                        .collect();
                    vec![word]
                };
                deps.extend(names.into_iter().filter(|n| *n != top));
            }
        }
    }
    let modules: std::collections::BTreeSet<String> = graph.keys().cloned().collect();
    for deps in graph.values_mut() {
        deps.retain(|d| modules.contains(d));
    }
    graph
}

#[path = "../../decide/tests/common/non_test.rs"]
mod source;
use source::non_test;

#[test]
fn a_test_item_anywhere_is_left_out_and_what_follows_is_read() {
    let text = "use crate::a;\n#[cfg(test)]\nmod tests;\nuse crate::b;\n\
                #[cfg(test)]\nmod inline { use crate::c; fn f() { g(); } }\nuse crate::d;\n";
    let code = non_test(text);
    assert!(code.contains("crate::a") && code.contains("crate::b") && code.contains("crate::d"));
    assert!(!code.contains("crate::c"), "{code}");
}

/// The module edges ARCHITECTURE.md lists: `module -> dep, dep` (or `(nothing)`), one line
/// per module, in the `text` block under the heading `heading`.
fn documented_edges(
    heading: &str,
) -> std::collections::BTreeMap<String, std::collections::BTreeSet<String>> {
    let text = std::fs::read_to_string(repo_root().join("ARCHITECTURE.md")).unwrap();
    let section = &text[text
        .find(heading)
        .unwrap_or_else(|| panic!("a {heading} section"))..];
    let start = section.find("```text\n").expect("a text block") + "```text\n".len();
    let block = &section[start..start + section[start..].find("```").unwrap()];
    block
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|line| {
            let (module, deps) = line.split_once("->").expect("module -> deps");
            let deps = deps.trim();
            let deps = if deps == "(nothing)" {
                Default::default()
            } else {
                deps.split(',').map(|d| d.trim().to_string()).collect()
            };
            (module.trim().to_string(), deps)
        })
        .collect()
}

/// The import graph between the top-level modules of `actors/src`, and that of `decide/src`,
/// is exactly the one ARCHITECTURE.md lists (an edge added or dropped in the code fails until
/// the map says so), and neither has a cycle.
#[test]
fn the_library_module_edges_are_as_documented() {
    edges_are_as_documented("actors/src", "### Module edges");
    edges_are_as_documented("decide/src", "### Decision crate edges");
}

fn edges_are_as_documented(src: &str, heading: &str) {
    let graph = module_graph(src);
    let documented = documented_edges(heading);
    assert!(
        graph.len() > 8,
        "only {} modules read in {src}",
        graph.len()
    );
    let mut diff = Vec::new();
    for module in graph.keys().chain(documented.keys()) {
        let (code, doc) = (graph.get(module), documented.get(module));
        if code != doc {
            diff.push(format!("{module}: code {code:?}, ARCHITECTURE.md {doc:?}"));
        }
    }
    diff.dedup();
    assert!(
        diff.is_empty(),
        "module edges of {src} differ:\n{}",
        diff.join("\n")
    );
    // Depth-first search for a back edge.
    fn visit<'a>(
        node: &'a str,
        graph: &'a std::collections::BTreeMap<String, std::collections::BTreeSet<String>>,
        path: &mut Vec<&'a str>,
        done: &mut std::collections::BTreeSet<&'a str>,
    ) {
        if done.contains(node) {
            return;
        }
        if let Some(i) = path.iter().position(|n| *n == node) {
            panic!("import cycle: {} -> {node}", path[i..].join(" -> "));
        }
        path.push(node);
        for dep in &graph[node] {
            visit(dep, graph, path, done);
        }
        path.pop();
        done.insert(node);
    }
    let mut done = std::collections::BTreeSet::new();
    for node in graph.keys() {
        visit(node, &graph, &mut Vec::new(), &mut done);
    }
}

/// Every test an invariant of ARCHITECTURE.md names exists (`module::name`, or `module::*`
/// for a whole file of tests).
#[test]
fn the_tests_architecture_md_names_exist() {
    let text = std::fs::read_to_string(repo_root().join("ARCHITECTURE.md")).unwrap();
    let section =
        &text[text.find("## Invariants").unwrap()..text.find("## Cross-cutting").unwrap()];
    let mut sources = String::new();
    let mut stack = vec![
        repo_root().join("actors"),
        repo_root().join("decide"),
        repo_root().join("tests"),
    ];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap().flatten() {
            let path = entry.path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                sources.push_str(&std::fs::read_to_string(&path).unwrap());
            }
        }
    }
    let mut named = 0;
    for quoted in section.split('`').skip(1).step_by(2) {
        let Some((_, last)) = quoted.rsplit_once("::") else {
            continue;
        };
        if last == "*" || !last.chars().all(|c| c.is_ascii_lowercase() || c == '_') {
            continue;
        }
        named += 1;
        assert!(
            sources.contains(&format!("fn {last}(")) || sources.contains(&format!("mod {last}")),
            "ARCHITECTURE.md names `{quoted}`, which is no test"
        );
    }
    assert!(named >= 10, "only {named} tests named");
}

/// The catalogue at the top of `tests/it/main.rs` names every test module of this binary.
#[test]
fn the_test_catalogue_names_every_module() {
    let main = std::fs::read_to_string(repo_root().join("tests/it/main.rs")).unwrap();
    let catalogue: String = main
        .lines()
        .take_while(|l| l.starts_with("//!"))
        .collect::<Vec<_>>()
        .join("\n");
    let missing: Vec<&str> = main
        .lines()
        .filter_map(|l| l.strip_prefix("mod ")?.strip_suffix(';'))
        .filter(|m| {
            *m != "support"
                && !catalogue.contains(&format!("`{m}.rs`"))
                && !catalogue.contains(&format!("`{m}/`"))
        })
        .collect();
    assert!(
        missing.is_empty(),
        "tests/it/main.rs's catalogue does not name: {missing:?}"
    );
}

/// Each filter of the `it-bare` alias (`.cargo/config.toml`, docs/development.md) is a test
/// module of this binary, so the alias runs what it says and a renamed module is not silently
/// dropped from it.
#[test]
fn the_bare_alias_names_test_modules() {
    let config = std::fs::read_to_string(repo_root().join(".cargo/config.toml")).unwrap();
    let config: toml::Table = toml::from_str(&config).unwrap();
    let alias: Vec<&str> = config["alias"]["it-bare"]
        .as_array()
        .expect("it-bare is a list")
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    let filters = &alias[alias.iter().position(|a| *a == "--").expect("a `--`") + 1..];
    let main = std::fs::read_to_string(repo_root().join("tests/it/main.rs")).unwrap();
    let modules: Vec<&str> = main
        .lines()
        .filter_map(|l| {
            l.trim_start_matches("#[cfg(target_os = \"linux\")]")
                .strip_prefix("mod ")
        })
        .filter_map(|m| m.strip_suffix(';'))
        .collect();
    assert!(filters.len() >= 10, "only {} filters", filters.len());
    for filter in filters {
        let module = filter
            .strip_suffix("::")
            .unwrap_or_else(|| panic!("{filter} is no module path"));
        assert!(
            modules.contains(&module),
            "it-bare names {filter}, which is no module of tests/it/main.rs"
        );
        // A filter is a substring: `warm::` would also run `tart_warm::`'s tests.
        let also: Vec<&&str> = modules
            .iter()
            .filter(|m| **m != module && format!("{m}::").contains(filter))
            .collect();
        assert!(also.is_empty(), "{filter} also matches {also:?}");
    }
}
