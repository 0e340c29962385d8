//! `doctor`'s look at the runner's version: each pool's against the latest release (or the
//! pinned one) and `runner.min_version`. GitHub stops assigning jobs to a runner that is too old:
//! behind the latest by more than 14 days is a warning, by more than 21 (GitHub refuses it at
//! 30) or below the minimum a failure. The
//! releases API out of reach is a warning: jobs keep running on what is installed.

use ephemer_actors_core::{
    config::Config,
    release::{
        Version,
        actor::{RunnerSource, behind, install_version, runner_sources},
        check::{Looked, ReleaseClient},
        installs::ManagedInstalls,
        platform,
    },
};

use super::Check;

/// Behind the latest release by more than this is a warning (GitHub wants an update within
/// 30 days).
const BEHIND_WARN: u64 = 14 * 24 * 3600;

/// One line for the releases and one per pool: its runner's version against them.
pub async fn checks(config: &Config) -> Vec<Check> {
    let mut sources = runner_sources(config);
    for pool in config.providers.enabled() {
        if !sources.iter().any(|(p, _)| *p == pool.name) {
            sources.push((pool.name.clone(), RunnerSource::Reported));
        }
    }
    if sources.is_empty() {
        return Vec::new();
    }
    let update = &config.runner.update;
    let pinned = update.version.as_deref().and_then(Version::parse);
    let client = ReleaseClient::new(&config.github, &update.releases_url, &platform());
    let mut out = Vec::new();
    let latest = match client.look(pinned.as_ref(), None).await {
        Ok(Looked::Found(release, _)) => {
            out.push(Check::ok(
                "runner.release",
                format!(
                    "{} is runner release {}",
                    if pinned.is_some() {
                        "the pinned"
                    } else {
                        "the latest"
                    },
                    release.version
                ),
            ));
            Some(release)
        }
        Ok(_) => {
            out.push(Check::warn(
                "runner.release",
                format!("no runner release found at {}", update.releases_url),
                "check runner.releases_url and runner.runner_version",
            ));
            None
        }
        Err(e) => {
            out.push(Check::warn(
                "runner.release",
                format!("cannot look at the runner's releases: {e}; jobs keep running on what is installed"),
                "let this host reach runner.releases_url (through github.proxy), or point it at a mirror",
            ));
            None
        }
    };
    let min = update.min_version.as_deref().and_then(Version::parse);
    let now = ephemer_actors_core::clock::unix_now();
    let managed = ManagedInstalls::for_config(config);
    for (pool, source) in sources {
        let name = format!("pool.{pool}.runner");
        let (version, fix) = match &source {
            RunnerSource::Managed => (
                managed
                    .as_ref()
                    .and_then(ManagedInstalls::current)
                    .ok_or_else(|| {
                        "no daemon-managed install yet: serve downloads the release at start"
                            .to_string()
                    }),
                "the daemon keeps it current (runner.auto_update); see docs/operations.md",
            ),
            // What the pool's backend can tell (a container pool asks its image).
            RunnerSource::Reported => match reported(config, &pool).await {
                Ok(Some(v)) => (
                    Ok(v),
                    "rebuild the pool's image on a current actions/runner release (docs/providers.md)",
                ),
                Ok(None) => {
                    out.push(Check::ok(
                        &name,
                        "its runner version cannot be told here (a command pool, a tart pool \
                         before its first job, or an image not on the engine yet)",
                    ));
                    continue;
                }
                Err(e) => (Err(e), "see docs/providers.md"),
            },
            RunnerSource::Install(dir) => (
                install_version(dir).await.map_err(|e| e.to_string()),
                "unpack the new actions/runner release into runner_dir (or drop runner_dir and let the daemon keep it current)",
            ),
        };
        let version = match version {
            Ok(v) => v,
            Err(e) => {
                out.push(Check::warn(&name, e, fix));
                continue;
            }
        };
        if let Some(min) = min.as_ref().filter(|m| &version < m) {
            out.push(Check::fail(
                &name,
                format!("runner {version} is below runner.min_version {min}: GitHub refuses runners that are too old"),
                fix,
            ));
            continue;
        }
        let lag = latest.as_ref().map(|l| (l, behind(&version, l, now)));
        out.push(match lag {
            Some((l, lag)) if lag > ephemer_actors_core::release::BEHIND_CUTOFF_WARN => {
                Check::fail(
                    &name,
                    format!(
                        "runner {version} is behind release {} by {} days: GitHub refuses a runner 30 days after a release",
                        l.version,
                        lag / 86_400
                    ),
                    fix,
                )
            }
            Some((l, lag)) if lag > BEHIND_WARN => Check::warn(
                &name,
                format!(
                    "runner {version} is behind release {} by {} days",
                    l.version,
                    lag / 86_400
                ),
                fix,
            ),
            Some((l, lag)) if lag > 0 => Check::ok(
                &name,
                format!(
                    "runner {version}; release {} came out {} days ago",
                    l.version,
                    lag / 86_400
                ),
            ),
            Some(_) => Check::ok(&name, format!("runner {version} is current")),
            None => Check::ok(
                &name,
                format!("runner {version} (the latest release is unknown)"),
            ),
        });
    }
    out
}

/// The version `pool`'s backend can tell (a container pool's image).
async fn reported(
    config: &Config,
    pool: &ephemer_actors_core::config::PoolName,
) -> Result<Option<Version>, String> {
    use ephemer_actors_core::provision::build::{backend, pool_settings};
    let Some(pool) = config.providers.get(pool.as_str()) else {
        return Ok(None);
    };
    let settings = pool_settings(config, pool, "doctor", None, std::env::temp_dir());
    let backend = backend(settings, None).map_err(|e| e.to_string())?;
    backend.runner_version().await.map_err(|e| e.to_string())
}
