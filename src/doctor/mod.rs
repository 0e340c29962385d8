//! `doctor`: every check a platform engineer would do by hand before trusting the daemon with
//! jobs, one line each, ok / warn / fail with what to do. Exit 0 when nothing failed, 1 when
//! something did, 2 when the config itself is invalid (`--json` for scripts).
//!
//! It reads and asks, never changes: GitHub is only read (a handful of GETs), no runner is
//! registered, no container is started but the pools' own host checks, the state directory
//! gets one probe file that is removed at once.

mod cluster;
mod github;
mod host;
mod mac;
mod runner;
mod scaleset;
mod webhook;

use std::process::ExitCode;

use ephemer_actors_core::config::Config;
use serde::Serialize;

/// How a check came out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Level {
    /// As it should be.
    Ok,
    /// Works, but worth a look.
    Warn,
    /// Will not work.
    Fail,
}

/// One line of the report.
#[derive(Debug, Clone, Serialize)]
pub struct Check {
    /// What was checked: `config`, `github.credential`, `webhook.hook`, `pool.<name>`, ...
    pub name: String,
    /// Its outcome.
    pub status: Level,
    /// What was found.
    pub detail: String,
    /// What to do about it (warn and fail lines).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fix: Option<String>,
}

impl Check {
    fn ok(name: impl Into<String>, detail: impl Into<String>) -> Check {
        Check {
            name: name.into(),
            status: Level::Ok,
            detail: detail.into(),
            fix: None,
        }
    }

    fn warn(name: impl Into<String>, detail: impl Into<String>, fix: impl Into<String>) -> Check {
        Check {
            name: name.into(),
            status: Level::Warn,
            detail: detail.into(),
            fix: Some(fix.into()),
        }
    }

    fn fail(name: impl Into<String>, detail: impl Into<String>, fix: impl Into<String>) -> Check {
        Check {
            name: name.into(),
            status: Level::Fail,
            detail: detail.into(),
            fix: Some(fix.into()),
        }
    }
}

/// The `--json` document: stable field names (documented in docs/operations.md).
#[derive(Debug, Serialize)]
struct Report<'a> {
    checks: &'a [Check],
    ok: usize,
    warn: usize,
    fail: usize,
}

/// Runs every check on a loaded config and prints the report.
pub fn run(config: &Config, json: bool) -> ExitCode {
    let mut checks = vec![Check::ok("config", "valid; secrets present (not shown)")];
    checks.extend(
        config
            .warnings()
            .into_iter()
            .map(|w| Check::warn("config", w, "see docs/configuration.md")),
    );
    let more = actix_rt::System::new().block_on(async {
        let mut found = Vec::new();
        // Each target's credential, scope, runner group and hook, as if it were the only one.
        for target in config.targets() {
            let mut one = config.clone();
            one.github = target.github;
            one.webhook.secret = target.webhook_secret;
            let checks = github::checks(&one).await;
            found.extend(checks.into_iter().map(|mut c| {
                if config.multi_target() {
                    c.name = format!("{} [{}]", c.name, target.name);
                }
                c
            }));
        }
        found.extend(host::pool_checks(config).await);
        found.extend(mac::checks(config).await);
        found.extend(runner::checks(config).await);
        found.extend(cluster::checks(config).await);
        found
    });
    checks.extend(more);
    checks.extend(host::host_checks(config));
    let count = |l: Level| checks.iter().filter(|c| c.status == l).count();
    let report = Report {
        checks: &checks,
        ok: count(Level::Ok),
        warn: count(Level::Warn),
        fail: count(Level::Fail),
    };
    if json {
        match serde_json::to_string_pretty(&report) {
            Ok(text) => println!("{text}"),
            Err(e) => eprintln!("error: {e}"),
        }
    } else {
        for c in &checks {
            let tag = match c.status {
                Level::Ok => "ok  ",
                Level::Warn => "warn",
                Level::Fail => "FAIL",
            };
            println!("{tag} {}: {}", c.name, c.detail);
            if let Some(fix) = &c.fix {
                println!("     fix: {fix}");
            }
        }
        println!(
            "\n{} ok, {} warnings, {} failures",
            report.ok, report.warn, report.fail
        );
    }
    if report.fail > 0 {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    }
}
