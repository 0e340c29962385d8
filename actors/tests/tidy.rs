//! Tidy: rules about the source tree itself, checked on every test run (in the manner of
//! rust-analyzer's tidy tests).
//!
//! The pure modules decide; the actors around them carry decisions out. A pure module takes
//! the time and every reading as arguments and returns data, so it can be tested with
//! hand-made inputs and replayed in a simulation. This test fails the build when one of them
//! reaches for an actor framework, a log, a metric, the store, a database, the network, the
//! file system or a process.

use std::path::{Path, PathBuf};

/// The pure modules of `actors/src`: files, or folders taken whole.
const PURE: &[&str] = &[
    "scheduler/core",
    "retry/backoff.rs",
    "retry/queue.rs",
    "retry/doubling.rs",
    "rate/book.rs",
    "durable.rs",
    "job.rs",
    "vocab.rs",
    "cluster/types.rs",
    "scaleset/machine.rs",
    "scaleset/inbox.rs",
    "release/policy.rs",
    "provision/warm_keeping.rs",
];

/// What a pure module may not name, and why.
const FORBIDDEN: &[(&str, &str)] = &[
    ("actix", "an actor framework"),
    ("tracing::", "logging"),
    ("println!", "printing"),
    ("eprintln!", "printing"),
    ("prometheus", "metrics"),
    ("crate::metrics", "metrics"),
    ("crate::store", "the store"),
    ("redb", "the store"),
    ("tokio_postgres", "the ledger's database"),
    ("deadpool", "the ledger's database"),
    ("crate::cluster::Ledger", "the ledger's database"),
    ("reqwest", "the network"),
    ("hyper", "the network"),
    ("std::net", "the network"),
    ("tokio::net", "the network"),
    ("std::fs", "the file system"),
    ("tokio::fs", "the file system"),
    ("std::process", "processes"),
    ("tokio::process", "processes"),
    ("std::thread", "threads"),
    ("tokio::spawn", "tasks"),
    ("tokio::task", "tasks"),
    ("SystemTime::now", "the wall clock (time is passed in)"),
    ("Instant::now", "the clock (time is passed in)"),
    ("crate::system", "the composition root"),
    ("crate::webhook", "an actor module"),
    ("crate::admin", "an actor module"),
    ("crate::http", "an actor module"),
    ("crate::lifecycle", "an actor module"),
    ("crate::scheduler::actor", "an actor module"),
    ("crate::scheduler::messages", "an actor module"),
    ("crate::scheduler::observe", "an actor module"),
    ("super::observe", "an actor module"),
    ("::actor::", "an actor module"),
];

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// Every `.rs` file under `path` (or `path` itself).
fn files(path: &Path) -> Vec<PathBuf> {
    if path.is_file() {
        return vec![path.to_path_buf()];
    }
    let mut out = Vec::new();
    for entry in std::fs::read_dir(path).unwrap().flatten() {
        out.extend(files(&entry.path()));
    }
    out.retain(|p| p.extension().is_some_and(|e| e == "rs"));
    out.sort();
    out
}

/// Whether `file` is test code (its tests may use a clock, the file system, anything).
fn is_test_file(file: &Path) -> bool {
    let name = file.file_name().unwrap().to_string_lossy();
    name == "tests.rs"
        || name.ends_with("_tests.rs")
        || file
            .components()
            .any(|c| c.as_os_str().to_string_lossy().ends_with("_tests"))
}

/// The violations in `text`: (line number, what, why). Comments and `#[cfg(test)]` modules
/// at the end of a file are not code the module runs. Inside a grouped import
/// (`use crate::{store::Op, ...}`) each item is read with its root (`crate::store::Op`).
fn violations(text: &str) -> Vec<(usize, &'static str, &'static str)> {
    let code = text
        .split("\n#[cfg(test)]\nmod ")
        .next()
        .unwrap_or_default();
    let mut found = Vec::new();
    let mut group: Option<&str> = None;
    for (i, line) in code.lines().enumerate() {
        let line = line.trim_start();
        if line.starts_with("//") {
            continue;
        }
        let mut read = line.to_string();
        // `use some::path::{a, b::C, ...` opens a group rooted at `some::path`.
        if let Some((root, items)) = line
            .strip_prefix("use ")
            .and_then(|rest| rest.split_once("::{"))
            .filter(|(root, _)| !root.contains(' '))
        {
            read = rooted(root, items);
            group = (!line.ends_with("};")).then_some(root);
        } else if let Some(root) = group {
            read = rooted(root, line);
            if line.starts_with("};") {
                group = None;
            }
        }
        for (what, why) in FORBIDDEN {
            if read.contains(what) {
                found.push((i + 1, *what, *why));
            }
        }
    }
    found
}

/// `items` of a `use root::{...}` group, each with `root::` in front.
fn rooted(root: &str, items: &str) -> String {
    items
        .split(',')
        .map(|item| format!("{root}::{}", item.trim()))
        .collect::<Vec<_>>()
        .join(" ")
}

#[test]
fn pure_modules_do_no_io_and_reach_no_actor() {
    let mut problems = Vec::new();
    let mut checked = 0;
    for pure in PURE {
        let path = src().join(pure);
        assert!(path.exists(), "{pure} is listed as pure but does not exist");
        for file in files(&path).into_iter().filter(|f| !is_test_file(f)) {
            checked += 1;
            let text = std::fs::read_to_string(&file).unwrap();
            let rel = file.strip_prefix(src()).unwrap().display().to_string();
            for (line, what, why) in violations(&text) {
                problems.push(format!("{rel}:{line}: names `{what}` ({why})"));
            }
        }
    }
    assert!(checked >= 20, "only {checked} files checked");
    assert!(
        problems.is_empty(),
        "pure modules must take time and readings as arguments and return data:\n{}",
        problems.join("\n")
    );
}

/// The rule itself: each kind of import is caught, comments and tests are not.
#[test]
fn the_rule_catches_what_it_names() {
    let bad = "use actix::Actor;\nuse crate::store::Store;\nfn f() { tracing::info!(\"x\"); }\n";
    let found: Vec<&str> = violations(bad).into_iter().map(|(_, w, _)| w).collect();
    assert_eq!(found, vec!["actix", "crate::store", "tracing::"]);
    let grouped = "use crate::{\n    clock::Now,\n    store::{Op, RunnerRow},\n};\nuse super::{Effect, observe::Observation};\nuse crate::cluster::{Acquire, actor::Load};\n";
    let found: Vec<&str> = violations(grouped).into_iter().map(|(_, w, _)| w).collect();
    assert_eq!(found, vec!["crate::store", "super::observe", "::actor::"]);
    let fine = "// tracing::info is not used here\nfn f() {}\n\n#[cfg(test)]\nmod tests {\n    use std::fs;\n}\n";
    assert!(violations(fine).is_empty());
}
