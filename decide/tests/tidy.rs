//! Tidy: this crate stays pure. The compiler keeps out what it can: no async runtime, actor
//! framework, HTTP, store, database or logging crate is reachable from this crate's
//! dependencies (checked here with `cargo tree`, so a new dependency that pulls one in fails
//! the build). What the compiler cannot refuse, because it is in `std`, is checked by name: a clock
//! read, the file system, the network, a process, a thread, printing, the environment, or the
//! system's randomness. Each core takes the time and every reading as arguments and returns
//! data, so it can be tested with hand-made inputs and replayed in a simulation.

#[path = "common/non_test.rs"]
mod non_test;
use non_test::non_test;
use std::{
    collections::BTreeSet,
    path::{Path, PathBuf},
};

/// The crates this one may depend on directly: data, encodings, calendar arithmetic, seeded
/// randomness, a hash function, error derives.
const ALLOWED: &[&str] = &[
    "base64",
    "foldhash",
    "hex",
    "humantime",
    "jiff",
    "rand",
    "serde",
    "serde_json",
    "thiserror",
];

/// Crates that must not be reachable at all, and what they would bring.
const UNREACHABLE: &[(&str, &str)] = &[
    ("tokio", "an async runtime"),
    ("mio", "an event loop"),
    ("actix", "an actor framework"),
    ("actix-rt", "an actor runtime"),
    ("actix-web", "an HTTP server"),
    ("awc", "an HTTP client"),
    ("hyper", "HTTP"),
    ("reqwest", "HTTP"),
    ("h2", "HTTP"),
    ("rustls", "TLS"),
    ("tracing", "logging"),
    ("log", "logging"),
    ("prometheus", "metrics"),
    ("redb", "the store"),
    ("tokio-postgres", "the ledger's database"),
    ("deadpool-postgres", "the ledger's database"),
    ("bollard", "a container engine"),
    ("nix", "system calls"),
    ("libc", "system calls"),
];

/// What `std` offers that a core may not name, and why.
const FORBIDDEN: &[(&str, &str)] = &[
    ("SystemTime::now", "the wall clock (time is passed in)"),
    ("Instant::now", "the clock (time is passed in)"),
    ("std::fs", "the file system"),
    ("File::", "the file system"),
    ("std::net", "the network"),
    ("std::process", "processes"),
    ("std::thread", "threads"),
    ("std::env::var", "the environment"),
    ("std::io::stdin", "the terminal"),
    ("println!", "printing"),
    ("eprintln!", "printing"),
    ("dbg!", "printing"),
    (
        "rand::rng",
        "the system's randomness (a seeded generator is passed in)",
    ),
    (
        "thread_rng",
        "the system's randomness (a seeded generator is passed in)",
    ),
    (
        "TimeZone::system",
        "the host's zone files (the zone is resolved and passed in)",
    ),
    (
        "TimeZone::get",
        "the host's zone files (the zone is resolved and passed in)",
    ),
];

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).to_path_buf()
}

/// Every `.rs` file under `path`.
fn files(path: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(path).unwrap().flatten() {
        let p = entry.path();
        if p.is_dir() {
            out.extend(files(&p));
        } else if p.extension().is_some_and(|e| e == "rs") {
            out.push(p);
        }
    }
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

/// The violations in `text`: (line number, what, why). Comments and `#[cfg(test)]` items,
/// wherever they sit, are not code the core runs; every other line is read.
fn violations(text: &str) -> Vec<(usize, &'static str, &'static str)> {
    let code = non_test(text);
    let mut found = Vec::new();
    for (i, line) in code.lines().enumerate() {
        let line = line.trim_start();
        if line.starts_with("//") {
            continue;
        }
        for (what, why) in FORBIDDEN {
            if line.contains(what) {
                found.push((i + 1, *what, *why));
            }
        }
    }
    found
}

#[test]
fn the_cores_read_no_clock_and_touch_nothing() {
    let mut problems = Vec::new();
    let mut checked = 0;
    for file in files(&root().join("src"))
        .into_iter()
        .filter(|f| !is_test_file(f))
    {
        checked += 1;
        let text = std::fs::read_to_string(&file).unwrap();
        let rel = file.strip_prefix(root()).unwrap().display().to_string();
        for (line, what, why) in violations(&text) {
            problems.push(format!("{rel}:{line}: names `{what}` ({why})"));
        }
    }
    assert!(checked >= 40, "only {checked} files checked");
    assert!(
        problems.is_empty(),
        "the cores take time and readings as arguments and return data:\n{}",
        problems.join("\n")
    );
}

/// The rule itself: each name is caught, comments and tests are not.
#[test]
fn the_rule_catches_what_it_names() {
    let bad = "fn f() { let t = std::time::Instant::now(); }\nfn g() { std::fs::read(\"x\"); }\n";
    let found: Vec<&str> = violations(bad).into_iter().map(|(_, w, _)| w).collect();
    assert_eq!(found, vec!["Instant::now", "std::fs"]);
    let fine = "// Instant::now is not used here\nfn f() {}\n\n#[cfg(test)]\nmod tests {\n    use std::fs;\n}\n";
    assert!(violations(fine).is_empty());
}

/// A violation after a test module (or after a test item inside an impl) is still found, at
/// its own line.
#[test]
fn a_violation_planted_after_a_test_module_is_found() {
    let planted = "fn f() {}\n#[cfg(test)]\nmod tests {\n    fn t() { std::fs::read(\"x\"); }\n}\n\
                   impl S {\n    #[cfg(test)]\n    fn count(&self) -> usize { 0 }\n    \
                   fn now() { Instant::now(); }\n}\n";
    assert_eq!(
        violations(planted),
        vec![(9, "Instant::now", violations_why("Instant::now"))]
    );
}

/// What a record's owner must not hand out: its collections, to change as a caller likes.
const COLLECTIONS: &[&str] = &[
    "HashMap", "HashSet", "BTreeMap", "BTreeSet", "VecDeque", "Vec<", "&mut [",
];

const PUBLIC_FIELD: &str =
    "a record type's field is public (read it through an accessor, change it through its owner)";
const COLLECTION_MUT: &str =
    "a `_mut` accessor hands out a collection (give its owner a method that says what changes)";

/// The shape rules' violations in `text`: (line number, why). A struct named `...Record` has
/// no `pub` field (its owner, the job table or the runner book, changes it); no `..._mut`
/// function returns a collection. Test items are not read.
fn shape_violations(text: &str) -> Vec<(usize, &'static str)> {
    let code = non_test(text);
    let mut found = Vec::new();
    let mut depth: Option<i32> = None;
    for (i, line) in code.lines().enumerate() {
        let t = line.trim_start();
        if t.starts_with("//") {
            continue;
        }
        match depth {
            None => {
                let record = t
                    .split_whitespace()
                    .skip_while(|w| *w != "struct")
                    .nth(1)
                    .is_some_and(|name| name.trim_end_matches('{').ends_with("Record"));
                if record && t.ends_with('{') {
                    depth = Some(1);
                }
            }
            Some(d) => {
                if d == 1 && t.starts_with("pub") && t.contains(':') {
                    found.push((i + 1, PUBLIC_FIELD));
                }
                let d = d + t.matches('{').count() as i32 - t.matches('}').count() as i32;
                depth = (d > 0).then_some(d);
            }
        }
    }
    let mut at = 0;
    while let Some(off) = code[at..].find("fn ") {
        let start = at + off;
        at = start + 3;
        let name: String = code[at..]
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        if !name.ends_with("_mut") {
            continue;
        }
        let signature = &code[at..];
        let end = signature.find(['{', ';']).unwrap_or(signature.len());
        let returns = signature[..end].split("->").nth(1).unwrap_or("");
        if COLLECTIONS.iter().any(|c| returns.contains(c)) {
            found.push((code[..start].matches('\n').count() + 1, COLLECTION_MUT));
        }
    }
    found
}

#[test]
fn records_are_changed_only_by_their_owners() {
    let mut problems = Vec::new();
    let mut records = 0;
    for file in files(&root().join("src"))
        .into_iter()
        .filter(|f| !is_test_file(f))
    {
        let text = std::fs::read_to_string(&file).unwrap();
        records += text.matches("Record {\n").count();
        let rel = file.strip_prefix(root()).unwrap().display().to_string();
        for (line, why) in shape_violations(&text) {
            problems.push(format!("{rel}:{line}: {why}"));
        }
    }
    assert!(records >= 2, "the job and runner records were not found");
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn the_shape_rules_catch_a_public_record_field_and_a_collection_handed_out() {
    let planted = "pub struct JobRecord {\n    pub phase: Phase,\n    seen: u64,\n}\n\
                   pub struct Other {\n    pub open: u8,\n}\n\
                   impl T {\n    fn claiming_mut(&mut self) -> &mut HashMap<K, V> {\n        \
                   &mut self.c\n    }\n    fn pacer_mut(&mut self) -> &mut Pacer {\n        \
                   &mut self.p\n    }\n}\n\
                   #[cfg(test)]\nmod tests {\n    fn jobs_mut(&mut self) -> &mut Vec<u8> { x }\n}\n\
                   fn queue_mut(\n    &mut self,\n) -> &mut VecDeque<K> {\n    x\n}\n";
    assert_eq!(
        shape_violations(planted),
        vec![(2, PUBLIC_FIELD), (9, COLLECTION_MUT), (20, COLLECTION_MUT)],
        "a public record field, and two collections handed out (one after a test module); \
         another type's public field, an owned part handed out and test code pass"
    );
}

fn violations_why(what: &str) -> &'static str {
    FORBIDDEN.iter().find(|(w, _)| *w == what).unwrap().1
}

/// This crate's direct dependencies, from its manifest.
fn direct_dependencies() -> BTreeSet<String> {
    let manifest: toml::Table = std::fs::read_to_string(root().join("Cargo.toml"))
        .unwrap()
        .parse()
        .unwrap();
    manifest
        .get("dependencies")
        .and_then(|d| d.as_table())
        .map(|d| d.keys().cloned().collect())
        .unwrap_or_default()
}

#[test]
fn the_crate_depends_only_on_data_crates() {
    let extra: Vec<String> = direct_dependencies()
        .into_iter()
        .filter(|d| !ALLOWED.contains(&d.as_str()))
        .collect();
    assert!(
        extra.is_empty(),
        "ephemer-decide may depend on {ALLOWED:?} only; it names {extra:?}: a decision that \
         needs more belongs in a shell of ephemer-actors-core"
    );
}

/// Every package `package` builds with (normal dependencies, features resolved for it alone),
/// as `cargo tree` lists them offline from the lock.
fn reachable(package: &str) -> BTreeSet<String> {
    let out = std::process::Command::new(env!("CARGO"))
        .args([
            "tree",
            "--offline",
            "-e",
            "normal",
            "--prefix",
            "none",
            "-p",
            package,
        ])
        .arg("--manifest-path")
        .arg(root().join("../Cargo.toml"))
        .output()
        .expect("cargo tree runs");
    assert!(
        out.status.success(),
        "cargo tree: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .filter_map(|l| l.split(' ').next())
        .map(str::to_string)
        .collect()
}

#[test]
fn no_runtime_network_store_or_log_is_reachable() {
    let reached = reachable("ephemer-decide");
    assert!(
        reached.contains("serde"),
        "the tree was not read: {reached:?}"
    );
    let found: Vec<String> = UNREACHABLE
        .iter()
        .filter(|(name, _)| reached.contains(*name))
        .map(|(name, why)| format!("{name} ({why})"))
        .collect();
    assert!(
        found.is_empty(),
        "ephemer-decide reaches {found:?}; its dependencies are {:?}",
        direct_dependencies()
    );
    // The check can fail: the daemon's crate reaches every one of the first three.
    let daemon = reachable("ephemer-actors-core");
    for name in ["tokio", "actix", "awc"] {
        assert!(daemon.contains(name), "{name} not found from the daemon");
    }
}
