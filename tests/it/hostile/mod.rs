//! The hostile-job corpus: jobs that attack every boundary they can touch, run through every
//! Linux kind each applies to (`local` with `run_as`, `linux` containers, `linux_vm` under
//! TCG), each outcome in a table printed at the end (`.ci/run` runs it like chaos).
//!
//! Each attack is a small job body (a shell script the job runs before its runner starts) with
//! the outcome that must hold. Each is run twice: once against a deliberately weakened daemon
//! (a debug build told to leave one defence out, `EPHEMER_TEST_WEAKEN`, or a config that
//! gives the defence away), where it must succeed, so the test can fail; then against the real
//! one, where it must fail. An attack whose weakened run does not succeed fails the corpus as
//! surely as one whose real run does: it would test nothing.
//!
//! A network attack from a `local` or `linux` job is the egress issue's (each of those jobs
//! gets a namespace there); here the `linux_vm` guest's network is attacked, which already has
//! one. The catalogue is docs/security.md's threat model, whose rows name each attack here.

mod container;
mod local;
#[cfg(target_os = "linux")]
mod vm;

use std::{fmt::Write as _, sync::Mutex};

/// What one run of an attack found.
#[derive(Debug, Clone)]
pub(crate) struct Found {
    /// Whether the attack got what it was after.
    pub(crate) succeeded: bool,
    /// What it saw, in a few words.
    pub(crate) said: String,
    /// Whether it ran and said what it found.
    pub(crate) ran: bool,
}

impl Found {
    pub(crate) fn got(said: impl Into<String>) -> Found {
        Found {
            succeeded: true,
            said: said.into(),
            ran: true,
        }
    }

    /// The attack did not run, or did not say what it found: counted as not held, so a
    /// corpus that stopped testing fails.
    pub(crate) fn silent(said: impl Into<String>) -> Found {
        Found {
            succeeded: false,
            said: format!("NOT RUN: {}", said.into()),
            ran: false,
        }
    }

    pub(crate) fn refused(said: impl Into<String>) -> Found {
        Found {
            succeeded: false,
            said: said.into(),
            ran: true,
        }
    }
}

/// One row of the table.
#[derive(Debug, Clone)]
struct Row {
    attack: &'static str,
    kind: &'static str,
    weakened_by: &'static str,
    weakened: Found,
    real: Found,
}

impl Row {
    fn held(&self) -> bool {
        self.weakened.ran && self.real.ran && self.weakened.succeeded && !self.real.succeeded
    }
}

static ROWS: Mutex<Vec<Row>> = Mutex::new(Vec::new());

/// Records attack `attack` on `kind`: what it found against the daemon weakened by
/// `weakened_by`, and against the real one.
pub(crate) fn record(
    attack: &'static str,
    kind: &'static str,
    weakened_by: &'static str,
    weakened: Found,
    real: Found,
) {
    let row = Row {
        attack,
        kind,
        weakened_by,
        weakened,
        real,
    };
    eprintln!(
        "hostile: {attack} on {kind}: weakened ({weakened_by}) {}: {}; real {}: {}",
        verdict(&row.weakened),
        row.weakened.said,
        verdict(&row.real),
        row.real.said
    );
    ROWS.lock().unwrap().push(row);
}

fn verdict(f: &Found) -> &'static str {
    if f.succeeded {
        "got through"
    } else {
        "refused"
    }
}

fn table(rows: &[Row]) -> String {
    let mut out = String::from(
        "\nhostile-job corpus\n\
         | attack | kind | weakened by | weakened daemon | real daemon | held |\n\
         |---|---|---|---|---|---|\n",
    );
    for r in rows {
        let _ = writeln!(
            out,
            "| {} | {} | {} | {}: {} | {}: {} | {} |",
            r.attack,
            r.kind,
            r.weakened_by,
            verdict(&r.weakened),
            r.weakened.said,
            verdict(&r.real),
            r.real.said,
            if r.held() { "yes" } else { "NO" }
        );
    }
    out
}

/// `check-config` on a config in `dir` with pools `providers` (weakened by `weaken`, if any):
/// its exit code and what it said on stderr.
pub(crate) async fn check_config(
    dir: &std::path::Path,
    providers: &str,
    weaken: &str,
) -> (i32, String) {
    use crate::support;
    let standin = support::standin(100);
    let config = support::daemon::config(&standin, 9, &dir.join("state"), "0s", "", providers);
    let path = support::write_file(dir, "ephemer.toml", &config);
    let mut cmd = support::daemon();
    cmd.args(["check-config", "--config"]).arg(&path);
    if !weaken.is_empty() {
        cmd.env("EPHEMER_TEST_WEAKEN", weaken);
    }
    let (code, _, err) = support::output(cmd).await;
    standin.stop().await;
    (code, err)
}

/// Whether this host can run the corpus (root, sudo, perl, busybox); says loudly why not.
pub(crate) fn can_run() -> bool {
    use crate::support::{skip, which};
    if !nix::unistd::geteuid().is_root() {
        skip("hostile corpus", "jobs run as run_as users: needs root");
        return false;
    }
    for tool in ["sudo", "perl", "busybox", "ip", "nft", "keyctl"] {
        if which(tool).is_none() {
            skip(
                "hostile corpus",
                &format!("{tool} is not installed (bash .ci/run installs it)"),
            );
            return false;
        }
    }
    true
}

/// Every attack, every kind, then the table. `.ci/run` runs it; each kind's attacks run one
/// after another (a fork bomb beside a VM boot would measure the machine, not the daemon).
#[actix_rt::test]
#[ignore = "the hostile corpus: bash .ci/run runs it as a step of its own"]
async fn corpus() {
    if !can_run() {
        return;
    }
    // `HOSTILE_KINDS=local,linux` runs only those (while working on one); CI runs all.
    let only = std::env::var("HOSTILE_KINDS").ok();
    let run = |kind: &str| {
        only.as_deref()
            .is_none_or(|k| k.split(',').any(|k| k == kind))
    };
    if run("local") {
        local::all().await;
    }
    if run("linux") {
        container::all().await;
    }
    #[cfg(target_os = "linux")]
    if run("linux_vm") {
        vm::all().await;
    }
    let rows = ROWS.lock().unwrap().clone();
    let text = table(&rows);
    println!("{text}");
    let failed: Vec<String> = rows
        .iter()
        .filter(|r| !r.held())
        .map(|r| format!("{} on {}", r.attack, r.kind))
        .collect();
    if only.is_none() {
        assert!(
            rows.len() >= 12,
            "the corpus ran {} attacks{text}",
            rows.len()
        );
    }
    assert!(
        failed.is_empty(),
        "attacks that did not hold: {failed:?}{text}"
    );
}
