//! `ReleaseActor`: looks at the runner's releases every `release_check_interval`, installs a
//! new one for the managed pools (downloaded, verified against its published SHA-256,
//! unpacked, switched to for new jobs), and reports each pool's version.
//!
//! Nothing here blocks a job: offline or failing, what is installed stays in use, the failure
//! is logged and counted, and the next look tries again.

use std::{
    collections::HashMap,
    path::PathBuf,
    time::{Instant, SystemTime},
};

use actix::prelude::*;
use serde::{Deserialize, Serialize};

pub use super::probe::install_version;
use super::{
    Release, Version,
    check::ReleaseClient,
    installs::{ManagedInstalls, unpack},
    policy::{self, Answer, InstallError, Step},
};
use crate::{
    clock::unix_now,
    config::{Config, PoolName, RunnerProgram, RunnerUpdateConfig},
    metrics::Metrics,
};

/// Where a pool's runner comes from, for its version.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RunnerSource {
    /// The daemon-managed install.
    Managed,
    /// An operator's install (`runner_dir`): its files say ([`install_version`]).
    Install(PathBuf),
    /// What the pool's provisioner reports (a container pool's image).
    Reported,
}

/// The pools whose runner version the daemon can tell, by source.
pub fn runner_sources(config: &Config) -> Vec<(PoolName, RunnerSource)> {
    config
        .providers
        .enabled()
        .into_iter()
        .filter_map(|pool| {
            let source = match &pool.process()?.program {
                RunnerProgram::Managed => RunnerSource::Managed,
                RunnerProgram::Install(dir) => RunnerSource::Install(dir.clone()),
                RunnerProgram::Command(_) => return None,
            };
            Some((pool.name.clone(), source))
        })
        .collect()
}

/// `status`: the releases as last seen and each pool's runner.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunnerReleaseView {
    /// The latest release (or the pinned one), when known.
    pub latest: Option<Version>,
    /// When it was published (unix seconds).
    pub latest_published_unix: Option<u64>,
    /// When the releases were last looked at (unix seconds).
    pub checked_unix: Option<u64>,
    /// What went wrong last (the releases API out of reach, a refused archive, ...).
    pub problem: Option<String>,
    /// `runner.auto_update`
    pub auto_update: bool,
    /// Each pool whose runner version is known.
    pub pools: Vec<PoolRunnerView>,
}

/// One pool's runner.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PoolRunnerView {
    /// The pool.
    pub pool: String,
    /// The version its new jobs start (`None`: no install yet, or it cannot say).
    pub version: Option<Version>,
    /// The daemon keeps it current.
    pub managed: bool,
    /// Seconds since a newer release came out (0: current; `None`: the latest is unknown).
    pub behind_seconds: Option<u64>,
}

/// Seconds a runner of `version` has been behind `latest` (0 when it is not; at least 1 when
/// it is, so an older runner never reads as current in the release's first second).
pub fn behind(version: &Version, latest: &Release, now: u64) -> u64 {
    if version < &latest.version {
        now.saturating_sub(latest.published_unix).max(1)
    } else {
        0
    }
}

/// Looks at the releases and keeps the managed installs current.
#[derive(Debug)]
pub struct ReleaseActor {
    update: RunnerUpdateConfig,
    client: ReleaseClient,
    installs: Option<ManagedInstalls>,
    sources: Vec<(PoolName, RunnerSource)>,
    metrics: Metrics,
    etag: Option<String>,
    latest: Option<Release>,
    checked_unix: Option<u64>,
    problem: Option<String>,
    /// Versions of operator installs, by directory and the listener's modification time.
    seen: HashMap<PathBuf, (SystemTime, Version)>,
    /// The version label each pool's info series carries now.
    labelled: HashMap<PoolName, String>,
    /// Versions the provisioners reported (container pools).
    reported: HashMap<PoolName, Version>,
    /// A release whose archive did not match its digest, with the digest stated: not
    /// downloaded again until the release says something else.
    refused: Option<(Version, [u8; 32])>,
    busy: bool,
    /// A look was asked for while one ran: another follows it.
    look_again: bool,
    /// Each pool's run of refusals (exit code 7): when its first and its last came.
    refusals: HashMap<PoolName, policy::RefusalRun>,
    /// When the last look ended.
    looked: Option<Instant>,
}

impl ReleaseActor {
    /// Whether `config` needs one: a managed install to keep, or pools with release checks on.
    pub fn wanted(config: &Config) -> bool {
        let managed = super::installs::ManagedInstalls::for_config(config).is_some();
        let pools = !config.providers.enabled().is_empty();
        managed || (pools && config.runner.update.check_interval.is_some())
    }

    /// An actor for `config`'s pools; `installs` when a pool runs the managed install.
    pub fn new(config: &Config, installs: Option<ManagedInstalls>, metrics: Metrics) -> Self {
        let update = config.runner.update.clone();
        let client = ReleaseClient::new(&config.github, &update.releases_url, &super::platform());
        ReleaseActor {
            update,
            client,
            installs,
            sources: runner_sources(config),
            metrics,
            etag: None,
            latest: None,
            checked_unix: None,
            problem: None,
            seen: HashMap::new(),
            labelled: HashMap::new(),
            refused: None,
            reported: HashMap::new(),
            busy: false,
            refusals: HashMap::new(),
            looked: None,
            look_again: false,
        }
    }

    fn pinned(&self) -> Option<Version> {
        self.update.version.as_deref().and_then(Version::parse)
    }

    /// One look: the releases, then an install if one is due, then the report.
    fn look(&mut self, ctx: &mut Context<Self>) {
        if self.busy {
            return;
        }
        self.busy = true;
        let client = self.client.clone();
        let (pinned, etag) = (self.pinned(), self.etag.clone());
        let installs = self.installs.clone().filter(|_| self.update.auto_update);
        let known = self.latest.clone();
        let metrics = self.metrics.clone();
        let refused = self.refused.clone();
        let work = async move {
            let answer = match client.look(pinned.as_ref(), etag.as_deref()).await {
                Ok(looked) => Answer::Looked(looked),
                Err(e) => Answer::Failed(e.to_string()),
            };
            let managed = installs.is_some();
            let mut look =
                policy::after_look(answer, known, etag, refused, pinned.as_ref(), managed);
            if look.failed {
                metrics.runner_release_check_failures.inc();
            }
            if let (Step::Install(release), Some(installs)) = (&look.step, &installs) {
                let outcome = install(&client, installs, release, pinned.is_some(), &metrics).await;
                let (refused, problem) = policy::after_install(release, outcome);
                look.refused = refused;
                look.problem = problem.or(look.problem);
            }
            (look.release, look.etag, look.problem, look.refused)
        };
        ctx.spawn(fut::wrap_future(work).map(
            |(release, etag, problem, refused), act: &mut Self, ctx| {
                act.busy = false;
                act.refused = refused;
                act.latest = release;
                act.etag = etag;
                act.checked_unix = Some(unix_now());
                act.looked = Some(Instant::now());
                if let Some(p) = &problem {
                    tracing::warn!(problem = %p, "runner releases: keeping what is installed");
                }
                act.problem = problem.clone();
                if let Some(installs) = &act.installs {
                    installs.settle(policy::settle_reason(installs.current().is_some(), problem));
                }
                act.report(ctx);
                if std::mem::take(&mut act.look_again) {
                    act.look(ctx);
                }
            },
        ));
    }

    /// Each pool's version and lag to `/metrics` (operator installs read again only when their
    /// listener changed).
    fn report(&mut self, ctx: &mut Context<Self>) {
        let sources = self.sources.clone();
        let seen = self.seen.clone();
        let managed = self.installs.as_ref().and_then(ManagedInstalls::current);
        let reported = self.reported.clone();
        let work = async move {
            let mut found = Vec::new();
            for (pool, source) in sources {
                let version = match source {
                    RunnerSource::Managed => managed.clone().map(|v| (None, v)),
                    RunnerSource::Reported => reported.get(&pool).cloned().map(|v| (None, v)),
                    RunnerSource::Install(dir) => {
                        let stamp = std::fs::metadata(dir.join("bin/Runner.Listener"))
                            .and_then(|m| m.modified())
                            .ok();
                        let known = seen.get(&dir);
                        match (stamp, known) {
                            (Some(t), Some((_, v))) if !policy::read_again(stamp, known) => {
                                Some((Some((dir, t)), v.clone()))
                            }
                            (stamp, _) => match install_version(&dir).await {
                                Ok(v) => Some((stamp.map(|t| (dir, t)), v)),
                                Err(e) => {
                                    tracing::warn!(pool = pool.as_str(), error = %e, "cannot tell the runner's version");
                                    None
                                }
                            },
                        }
                    }
                };
                found.push((pool, version));
            }
            found
        };
        ctx.spawn(fut::wrap_future(work).map(|found, act: &mut Self, _| {
            let now = unix_now();
            for (pool, version) in found {
                let Some((stamp, version)) = version else {
                    continue;
                };
                if let Some((dir, t)) = stamp {
                    act.seen.insert(dir, (t, version.clone()));
                }
                let label = version.to_string();
                let old = act
                    .labelled
                    .insert(pool.clone(), label.clone())
                    .unwrap_or_else(|| crate::metrics::UNKNOWN_VERSION.to_string());
                if old != label {
                    let _ = act
                        .metrics
                        .runner_version_info
                        .remove_label_values(&[pool.as_str(), &old]);
                }
                act.metrics
                    .runner_version_info
                    .with_label_values(&[pool.as_str(), &label])
                    .set(1);
                if let Some(latest) = &act.latest {
                    act.metrics
                        .runner_release_behind
                        .with_label_values(&[pool.as_str()])
                        .set(behind(&version, latest, now) as i64);
                }
                if let Some(min) = act.update.min_version.as_deref().and_then(Version::parse) {
                    act.metrics
                        .runner_below_minimum
                        .with_label_values(&[pool.as_str()])
                        .set(i64::from(version < min));
                }
            }
        }));
    }

    fn view(&self) -> RunnerReleaseView {
        let now = unix_now();
        let managed = self.installs.as_ref().and_then(ManagedInstalls::current);
        let pools = self
            .sources
            .iter()
            .map(|(pool, source)| {
                let version = match source {
                    RunnerSource::Managed => managed.clone(),
                    RunnerSource::Reported => self.reported.get(pool).cloned(),
                    RunnerSource::Install(dir) => self.seen.get(dir).map(|(_, v)| v.clone()),
                };
                PoolRunnerView {
                    pool: pool.to_string(),
                    behind_seconds: version
                        .as_ref()
                        .zip(self.latest.as_ref())
                        .map(|(v, l)| behind(v, l, now)),
                    version,
                    managed: *source == RunnerSource::Managed,
                }
            })
            .collect();
        RunnerReleaseView {
            latest: self.latest.as_ref().map(|r| r.version.clone()),
            latest_published_unix: self.latest.as_ref().map(|r| r.published_unix),
            checked_unix: self.checked_unix,
            problem: self.problem.clone(),
            auto_update: self.update.auto_update,
            pools,
        }
    }
}

/// Installs `release` for new jobs if it is due: a newer one than the current (or the pinned
/// one), downloaded, verified against its published SHA-256, unpacked. An archive that does not
/// match is refused: counted, logged, and nothing is switched.
async fn install(
    client: &ReleaseClient,
    installs: &ManagedInstalls,
    release: &Release,
    pinned: bool,
    metrics: &Metrics,
) -> Result<(), InstallError> {
    let version = &release.version;
    let current = installs.current();
    if !policy::due(version, current.as_ref(), pinned) {
        return Ok(());
    }
    if installs.installed().contains(version) {
        installs.switch_to(version.clone());
        return Ok(());
    }
    let platform = super::platform();
    let archive = release.archive.as_ref().ok_or_else(|| {
        InstallError::Failed(format!(
            "runner release {version} has no archive for {platform}"
        ))
    })?;
    let Some(want) = archive.sha256 else {
        metrics
            .runner_release_refused
            .with_label_values(&["no_checksum"])
            .inc();
        return Err(InstallError::Refused(format!(
            "runner release {version} publishes no SHA-256 for {}: not installed",
            archive.name
        )));
    };
    let root = installs.root();
    std::fs::create_dir_all(&root)
        .map_err(|e| InstallError::Failed(format!("cannot create {}: {e}", root.display())))?;
    let download = root.join(format!(".download-{version}.tar.gz"));
    let current_name = current
        .as_ref()
        .map_or("no install".into(), |c| c.to_string());
    fetch_verified(
        client,
        archive,
        &download,
        want,
        version,
        &current_name,
        metrics,
    )
    .await?;
    let (from, to, v) = (download.clone(), root.clone(), version.clone());
    let unpacked = tokio::task::spawn_blocking(move || unpack(&from, &to, &v, &want))
        .await
        .map_err(|e| e.to_string())
        .and_then(|r| r.map_err(|e| e.to_string()));
    let _ = std::fs::remove_file(&download);
    if let Err(e) = unpacked {
        metrics
            .runner_release_refused
            .with_label_values(&["unpack"])
            .inc();
        return Err(InstallError::Failed(format!(
            "cannot unpack runner release {version}: {e}"
        )));
    }
    tracing::info!(
        version = %version,
        from = %current.as_ref().map_or("none".into(), |c| c.to_string()),
        "runner release verified and installed: new jobs use it, running jobs finish on theirs"
    );
    installs.switch_to(version.clone());
    Ok(())
}

/// Downloads `archive` to `download` and checks it against `want`, the SHA-256 the release
/// publishes; an archive that does not match is removed, counted and refused.
async fn fetch_verified(
    client: &ReleaseClient,
    archive: &crate::release::Archive,
    download: &std::path::Path,
    want: [u8; 32],
    version: &crate::release::Version,
    current: &str,
    metrics: &Metrics,
) -> Result<(), InstallError> {
    let got = client.download(archive, download).await;
    let got = match got {
        Ok(sha) => sha,
        Err(e) => {
            let _ = std::fs::remove_file(download);
            metrics.runner_release_check_failures.inc();
            return Err(InstallError::Failed(e.to_string()));
        }
    };
    if got != want {
        let _ = std::fs::remove_file(download);
        metrics
            .runner_release_refused
            .with_label_values(&["digest"])
            .inc();
        let why = format!(
            "runner release {version} refused: {} has SHA-256 {}, but the release says {}; \
             staying on {}",
            archive.name,
            hex::encode(got),
            hex::encode(want),
            current
        );
        tracing::error!("{why}");
        return Err(InstallError::Refused(why));
    }
    Ok(())
}

impl Actor for ReleaseActor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        self.report(ctx);
        self.look(ctx);
        if let Some(every) = self.update.check_interval {
            ctx.run_interval(every, |act, ctx| act.look(ctx));
        }
    }
}

/// `status`: the releases and each pool's runner.
#[derive(Debug, Clone, Copy, Message)]
#[rtype(result = "RunnerReleaseView")]
pub struct GetRunnerRelease;

impl Handler<GetRunnerRelease> for ReleaseActor {
    type Result = MessageResult<GetRunnerRelease>;
    fn handle(&mut self, _: GetRunnerRelease, _: &mut Context<Self>) -> Self::Result {
        MessageResult(self.view())
    }
}

/// A pool's provisioner learned the runner version its new jobs start (a container pool's
/// image).
#[derive(Debug, Clone, Message)]
#[rtype(result = "()")]
pub struct RunnerVersionSeen {
    /// The pool.
    pub pool: PoolName,
    /// The version.
    pub version: Version,
}

impl Handler<RunnerVersionSeen> for ReleaseActor {
    type Result = ();
    fn handle(&mut self, m: RunnerVersionSeen, ctx: &mut Context<Self>) {
        if !self.sources.iter().any(|(p, _)| *p == m.pool) {
            self.sources.push((m.pool.clone(), RunnerSource::Reported));
        }
        self.reported.insert(m.pool, m.version);
        self.report(ctx);
    }
}

/// A runner of `pool` exited with code 7 (`ephemer_decide::provision::RUNNER_VERSION_DEPRECATED`): GitHub
/// refused its version. A managed install fetches and verifies the newest release at once (the
/// job is claimed again by the scheduler, on it), unless a look since the pool's refusals
/// began found its install the newest release: that is GitHub's outage, said so, and nothing
/// is fetched (`policy::refusal`), and the answer is that release (the supervisor tells the
/// scheduler before the runner's exit, which holds the pool's jobs for a probe). An operator's
/// install or image is said to be too old, loudly, once per look.
#[derive(Debug, Clone, Message)]
#[rtype(result = "Option<String>")]
pub struct RunnerRefused {
    /// The pool.
    pub pool: PoolName,
    /// The runner, for the log.
    pub runner: String,
}

impl Handler<RunnerRefused> for ReleaseActor {
    type Result = Option<String>;
    fn handle(&mut self, m: RunnerRefused, ctx: &mut Context<Self>) -> Option<String> {
        self.metrics
            .runner_refused_as_old
            .with_label_values(&[m.pool.as_str()])
            .inc();
        let managed = self
            .sources
            .iter()
            .any(|(p, s)| *p == m.pool && *s == RunnerSource::Managed);
        if managed && self.update.auto_update && self.installs.is_some() {
            let now = Instant::now();
            let run = self
                .refusals
                .entry(m.pool.clone())
                .or_insert_with(|| policy::RefusalRun::new(now));
            run.refused(now);
            let looked_since = run.looked_since(self.looked);
            let install = self.installs.as_ref().and_then(ManagedInstalls::current);
            let newest = self.latest.as_ref().map(|r| &r.version);
            if let policy::Refusal::Outage(version) =
                policy::refusal(install.as_ref(), newest, looked_since)
            {
                // A look since the refusals began found nothing newer: looking again, or
                // fetching, would not help; the jobs are claimed again after their wait.
                let line = policy::outage_line(&version);
                tracing::warn!(pool = m.pool.as_str(), runner = %m.runner, "{line}: nothing is fetched; its jobs wait for the service, one probing it at a time");
                return Some(version.to_string());
            }
            tracing::warn!(pool = m.pool.as_str(), runner = %m.runner, "GitHub refused the runner's version as too old (exit code 7): fetching the newest release now; its job is claimed again on it");
            if self.busy {
                self.look_again = true;
            } else {
                self.look(ctx);
            }
        } else {
            tracing::error!(pool = m.pool.as_str(), runner = %m.runner, "GitHub refused the runner's version as too old (exit code 7): this pool's runner (its runner_dir, image or command) must be updated; its jobs wait and are claimed again");
        }
        None
    }
}

/// Look now (tests; an operator's `SIGHUP` could).
#[derive(Debug, Clone, Copy, Message)]
#[rtype(result = "()")]
pub struct LookNow;

impl Handler<LookNow> for ReleaseActor {
    type Result = ();
    fn handle(&mut self, _: LookNow, ctx: &mut Context<Self>) {
        self.look(ctx);
    }
}

crate::stop_on_request!(ReleaseActor);
