//! `ProcessBackend`: the runner as a process on this host (the `local` and `native_macos`
//! providers).
//!
//! Each runner gets a fresh directory `<work_root>/<name>` (mode 0700): with `runner_dir`, a
//! private copy of the actions/runner install it runs `run.sh` from (see [`super::install`]);
//! with `command`, an empty directory the command runs in. Inside it are the runner's own
//! `HOME` (`_home`) and `TMPDIR` (`_tmp`). It also gets its own process group
//! (so teardown, `job_timeout` and leftover reaping kill the whole tree: SIGTERM, then SIGKILL
//! after a grace), and a log file `<log_dir>/<name>.log` for its stdout and stderr. The JIT
//! config travels only in `ACTIONS_RUNNER_INPUT_JITCONFIG`; the environment is otherwise cleared
//! down to a few harmless variables, so none of the daemon's own secrets reach the job. The
//! process group id is kept in `<work_root>/.run/<name>.pid` with the leader's start time and
//! the boot id ([`super::procgroup`]), which makes `stop` work by name for any later incarnation
//! of the provisioner, or of the daemon, and never on a process that merely reused the pid.

use std::{
    cell::{Cell, RefCell},
    ffi::OsString,
    path::{Path, PathBuf},
    process::Stdio,
    rc::Rc,
    time::Duration,
};

use tokio::process::Command;

use super::{
    Backend, ProvisionError, RunnerEnv, RunnerSpec, RunningRunner,
    cgroup::CgroupRoot,
    check_executable,
    install::{check_install, copy_install, same_filesystem},
    jobdir::command_dir,
    procgroup::{self, group_alive, kill_group},
    spawn_error,
    unremovable::Unremovable,
    users,
};
use crate::{
    config::{PoolName, ProviderKind, RunnerProgram},
    release::{
        self,
        installs::{Lease, ManagedInstalls},
    },
    vocab::runner_vars,
};

/// How long a managed pool's first host check waits for the first install.
const MANAGED_FIRST_LOOK: Duration = Duration::from_secs(120);
/// How long a runner may take to exit after SIGTERM before SIGKILL.
pub const KILL_GRACE: Duration = Duration::from_secs(10);
/// Runner logs older than this are removed at start-up.
const LOG_RETENTION: Duration = Duration::from_secs(7 * 24 * 3600);
/// Variables a runner inherits from the daemon; everything else is dropped. `HOME` and `TMPDIR`
/// are the runner's own, inside its directory.
const INHERITED_ENV: [&str; 5] = ["PATH", "USER", "LANG", "LC_ALL", "TZ"];

/// Settings of a process backend.
#[derive(Debug, Clone)]
pub struct ProcessSettings {
    /// `local` or `native_macos`.
    pub kind: ProviderKind,
    /// The pool (`[providers.NAME]`).
    pub pool: PoolName,
    /// What the runner gets in its environment besides its JIT config.
    pub env: RunnerEnv,
    /// `runner_dir` (an install copied per job) or `command`.
    pub program: RunnerProgram,
    /// Its arguments.
    pub args: Vec<String>,
    /// Parent of the per-job directories.
    pub work_root: PathBuf,
    /// Where runner logs go.
    pub log_dir: PathBuf,
    /// Run as one of these users (`sudo -n -u`), one per concurrent runner when there are
    /// several; empty: as the daemon's user.
    pub run_as: Vec<String>,
    /// Runner names of this provider start with this (`<name_prefix>-<provider>-`).
    pub name_prefix: String,
    /// SIGTERM to SIGKILL.
    pub grace: Duration,
    /// Every process pool's work root on this host (this one's included): a `run_as` user
    /// with a job directory in any of them is taken ([`super::users`]).
    pub peers: Vec<users::WorkRoot>,
    /// Where the trees its teardowns could not remove are written down
    /// (`state.dir/unremoved/<pool>`; [`super::unremovable`]).
    pub left_record: Option<PathBuf>,
    /// `ephemerd_teardown_unremoved{provider}` of the pool, when metrics are kept.
    pub left_gauge: Option<prometheus::IntGauge>,
    /// A `run_as` user with uid 0 is accepted (`allow_root`).
    pub allow_root: bool,
    /// A `run_as` user with the daemon's own uid is accepted (`allow_same_user`).
    pub allow_same_user: bool,
}

impl ProcessSettings {
    /// These settings with a daemon-managed install resolved to the current one's directory
    /// in `managed` (`None` when the pool is managed and there is no install yet): what a job
    /// started now would run, for the path probes of `check-config` and `doctor`.
    pub fn on_current_install(&self, managed: Option<&ManagedInstalls>) -> Option<Self> {
        let mut s = self.clone();
        if s.program == RunnerProgram::Managed {
            let installs = managed?;
            s.program = RunnerProgram::Install(installs.dir_of(&installs.current()?));
        }
        Some(s)
    }
}

/// Runs runners as host processes.
#[derive(Debug, Clone)]
pub struct ProcessBackend {
    pub(super) s: Rc<ProcessSettings>,
    /// Whether the log already said that the install is copied, not linked.
    said_copied: Rc<Cell<bool>>,
    /// Where runner cgroups go, when this host lets the daemon make them.
    cgroups: Rc<Option<CgroupRoot>>,
    /// Why there are none (said once by the host check).
    no_cgroups: Rc<RefCell<Option<String>>>,
    /// The daemon-managed installs, for a pool with neither `runner_dir` nor `command`.
    pub(super) managed: Option<ManagedInstalls>,
    /// Warm directories prepared ahead of their claims, by name (see `process_warm`).
    pub(super) warm: Rc<RefCell<std::collections::HashMap<String, Prepared>>>,
    /// The trees teardowns left, tried again at each later teardown.
    pub(super) left: Unremovable,
}

/// What [`ProcessBackend::prepare`] made for a runner beside its directory.
#[derive(Debug)]
pub(super) struct Prepared {
    /// The `run_as` user the directory belongs to.
    pub(super) user: Option<String>,
    /// The managed install the directory was copied from, held while it is in use.
    pub(super) lease: Option<Lease>,
}

impl ProcessBackend {
    /// A backend with these settings.
    pub fn new(settings: ProcessSettings) -> Self {
        let (cgroups, why) = match CgroupRoot::detect() {
            Ok(root) => (Some(root), None),
            Err(why) => (None, Some(why.to_string())),
        };
        let left = Unremovable::new(settings.left_record.clone(), settings.left_gauge.clone());
        ProcessBackend {
            left,
            s: Rc::new(settings),
            said_copied: Rc::default(),
            cgroups: Rc::new(cgroups),
            no_cgroups: Rc::new(RefCell::new(why)),
            managed: None,
            warm: Rc::default(),
        }
    }

    /// The same backend starting a managed pool's runners from `installs`, the daemon-managed
    /// installs (a pool whose program is [`RunnerProgram::Managed`]), when there are any.
    pub fn with_managed(mut self, installs: Option<&ManagedInstalls>) -> Self {
        self.managed = installs.cloned();
        self
    }

    fn cgroup(&self, name: &str) -> Option<super::cgroup::RunnerCgroup> {
        (*self.cgroups).as_ref().map(|c| c.runner(name))
    }

    /// The work root, passable by `run_as` users (`0711`), and its private `.run` (`0700`).
    async fn make_work_root(&self) -> std::io::Result<()> {
        let root = self.s.work_root.clone();
        tokio::task::spawn_blocking(move || crate::harden::passable_dir(&root))
            .await
            .map_err(std::io::Error::other)??;
        create_private_dir(&self.s.work_root.join(".run")).await
    }

    fn pid_file(&self, name: &str) -> PathBuf {
        self.s.work_root.join(".run").join(format!("{name}.pid"))
    }

    fn command(
        &self,
        spec: &RunnerSpec,
        jit_config: &str,
        dir: &Path,
        user: Option<&str>,
        log: std::fs::File,
    ) -> std::io::Result<Command> {
        let s = &self.s;
        let program = match &s.program {
            RunnerProgram::Install(_) | RunnerProgram::Managed => dir.join("run.sh"),
            RunnerProgram::Command(command) => command.clone(),
        };
        let (home, tmp) = (dir.join("_home"), dir.join("_tmp"));
        let extra = s.env.on_host();
        // The runner enters its cgroup first; one that cannot be entered leaves the
        // process-group kill alone to work.
        let mut argv = procgroup::gated(self.cgroup(&spec.name).map(|c| c.procs()));
        if let Some(user) = user {
            // sudo resets HOME to the user's own; `env` sets the job's after it. Values travel
            // in the environment, never on argv (where any user could read them).
            let mut keep = format!(
                "ACTIONS_RUNNER_INPUT_JITCONFIG,RUNNER_MANUALLY_TRAP_SIG,{}",
                runner_vars::VERSION_EXIT
            );
            for (name, _) in &extra {
                keep.push(',');
                keep.push_str(name);
            }
            argv.extend(["sudo", "-n", "-u", user].map(OsString::from));
            argv.push(format!("--preserve-env={keep}").into());
            argv.extend(["--", "env"].map(OsString::from));
            argv.push(env_assignment("HOME", &home));
            argv.push(env_assignment("TMPDIR", &tmp));
        }
        argv.push(program.into_os_string());
        argv.extend(s.args.iter().map(OsString::from));
        let mut cmd = Command::new(&argv[0]);
        cmd.args(&argv[1..])
            .current_dir(dir)
            .env_clear()
            .envs(
                INHERITED_ENV
                    .iter()
                    .filter_map(|k| std::env::var_os(k).map(|v| (k, v))),
            )
            .envs(extra)
            .env("HOME", &home)
            .env("TMPDIR", &tmp)
            .env("ACTIONS_RUNNER_INPUT_JITCONFIG", jit_config)
            .env("RUNNER_MANUALLY_TRAP_SIG", "1")
            .env(runner_vars::VERSION_EXIT, "1")
            .stdin(Stdio::piped())
            .stdout(log.try_clone()?)
            .stderr(log)
            .process_group(0)
            .kill_on_drop(false);
        if user.is_none() && nix::unistd::geteuid().is_root() {
            cmd.env("RUNNER_ALLOW_RUNASROOT", "1");
        }
        Ok(cmd)
    }

    /// Makes the runner's directory: a copy of the install, or an empty directory for a
    /// command; with its own `HOME` and `TMPDIR` either way.
    async fn prepare_dir(
        &self,
        dir: &Path,
        user: Option<&str>,
    ) -> Result<Option<Lease>, ProvisionError> {
        let owner = match user {
            Some(user) => {
                let u = self.user_named(user)?;
                Some((u.uid, u.gid))
            }
            None => None,
        };
        // A directory of this name from before (a crash between making and using it).
        self.left
            .remove(&dir_name(dir), dir)
            .await
            .map_err(|e| ProvisionError::HostUnavailable(format!("cannot clear the runner directory: {e}")))?;
        // A managed pool's job is copied from the current install, held until it ends.
        let lease = match &self.s.program {
            RunnerProgram::Managed => Some(
                self.managed
                    .as_ref()
                    .and_then(ManagedInstalls::lease)
                    .ok_or_else(|| {
                        ProvisionError::HostUnavailable(
                            "no runner install yet (the daemon downloads one)".into(),
                        )
                    })?,
            ),
            _ => None,
        };
        let install = match (&self.s.program, &lease) {
            (_, Some(lease)) => Some(lease.dir.clone()),
            (RunnerProgram::Install(install), None) => Some(install.clone()),
            _ => None,
        };
        let made = match install {
            Some(install) => {
                let dest = dir.to_path_buf();
                tokio::task::spawn_blocking(move || copy_install(&install, &dest, owner))
                    .await
                    .map_err(std::io::Error::other)
                    .and_then(|r| r)
                    .map(|report| {
                        if report.copied > 0 && !self.said_copied.replace(true) {
                            tracing::warn!(
                                provider = self.s.pool.as_str(),
                                copied = report.copied,
                                linked = report.linked,
                                "files of runner_dir were copied, not hard-linked, into a job's \
                                 directory: put work_root on the install's filesystem (and let \
                                 the daemon link the install's files) so a job's copy costs no bytes"
                            );
                        }
                    })
            }
            None => command_dir(dir, owner),
        };
        made.map(|()| lease).map_err(|e| {
            // Only the daemon has written it so far: small, and no job's shape.
            let _ = crate::remove::remove_tree(dir, crate::remove::TEARDOWN_BUDGET);
            ProvisionError::HostUnavailable(format!(
                "cannot prepare the runner directory {}: {e}",
                dir.display()
            ))
        })
    }
}

impl ProcessBackend {
    /// Everything a runner's directory needs before the runner: the work root, a user, the
    /// directory (the install's copy), the install's lease.
    pub(super) async fn prepare(&self, dir: &Path, wait: bool) -> Result<Prepared, ProvisionError> {
        let fail =
            |what: &str, e: std::io::Error| ProvisionError::HostUnavailable(format!("{what}: {e}"));
        self.make_work_root()
            .await
            .map_err(|e| fail("cannot create the work root", e))?;
        tokio::fs::create_dir_all(&self.s.log_dir)
            .await
            .map_err(|e| fail("cannot create the log directory", e))?;
        let name = dir_name(dir);
        let user = self.take_user(&name, wait).await?;
        match self.prepare_dir(dir, user.as_deref()).await {
            Ok(lease) => Ok(Prepared { user, lease }),
            Err(e) => {
                users::release(&name);
                Err(e)
            }
        }
    }

    /// Starts `spec`'s runner from `dir`, prepared by [`ProcessBackend::prepare`].
    pub(super) async fn launch(
        &self,
        spec: RunnerSpec,
        dir: PathBuf,
        prepared: Prepared,
    ) -> Result<RunningRunner, ProvisionError> {
        let fail =
            |what: &str, e: std::io::Error| ProvisionError::HostUnavailable(format!("{what}: {e}"));
        let Prepared { user, lease } = prepared;
        // A runner the daemon keeps current must not update itself inside the job's copy.
        let jit = match &lease {
            Some(_) => release::without_self_update(spec.jit_config.expose()).unwrap_or_else(|e| {
                tracing::warn!(runner = %spec.name, error = %e, "cannot turn the runner's own updates off");
                spec.jit_config.expose().to_string()
            }),
            None => spec.jit_config.expose().to_string(),
        };
        if let Some(cgroup) = self.cgroup(&spec.name)
            && let Err(e) = cgroup
                .create()
                .and_then(|()| cgroup.limit_pids(super::cgroup::RUNNER_PIDS))
        {
            tracing::warn!(runner = %spec.name, error = %e, "cannot make the runner's cgroup; teardown kills its process group only");
        }
        let log_path = self.s.log_dir.join(format!("{}.log", spec.name));
        // Appended to, so the daemon can cut it while the runner writes (see `watch_log`).
        let log = crate::harden::private_file(&log_path, true)
            .map_err(|e| fail(&format!("cannot create {}", log_path.display()), e))?;
        let mut child = self
            .command(&spec, &jit, &dir, user.as_deref(), log)
            .and_then(|mut c| c.spawn())
            .map_err(|e| {
                let program = self.s.program.executable();
                spawn_error(&format!("cannot start {}", program.display()), &e)
            })?;
        let pid = child.id().ok_or_else(|| {
            ProvisionError::EnvironmentFailed("the runner exited before it could be tracked".into())
        })?;
        let gate = child.stdin.take();
        tokio::fs::write(self.pid_file(&spec.name), procgroup::record(pid))
            .await
            .map_err(|e| fail("cannot write the pid file", e))?;
        // Named in its pid file: now it may become the runner. A gate that cannot be opened
        // is this runner's wrapper gone (killed), not the host's failing.
        procgroup::open_gate(gate).await.map_err(|e| {
            ProvisionError::EnvironmentFailed(format!("cannot let the runner start: {e}"))
        })?;
        tracing::info!(provider = self.s.pool.as_str(), runner = %spec.name, pid, dir = %dir.display(), user = user.as_deref().unwrap_or("(the daemon's)"), "runner process started");
        Ok(RunningRunner {
            exited: Box::pin(async move {
                let code = tokio::select! {
                    status = child.wait() => status.ok().and_then(|s| s.code()),
                    never = super::runner_log::watch(log_path) => match never {},
                };
                drop(lease);
                code
            }),
        })
    }
}


impl Backend for ProcessBackend {
    fn kind(&self) -> ProviderKind {
        self.s.kind
    }

    fn pool(&self) -> &PoolName {
        &self.s.pool
    }

    async fn start(self, spec: RunnerSpec) -> Result<RunningRunner, ProvisionError> {
        let dir = self.s.work_root.join(&spec.name);
        let prepared = self.prepare(&dir, true).await?;
        self.launch(spec, dir, prepared).await
    }

    async fn warm_boot(self, name: String) -> Result<(), ProvisionError> {
        self.boot_warm(name).await
    }

    async fn warm_ready(self, name: String) -> Result<(), &'static str> {
        self.check_warm(&name)
    }

    async fn warm_start(
        self,
        warm: String,
        spec: RunnerSpec,
    ) -> Result<RunningRunner, ProvisionError> {
        self.start_warm(warm, spec).await
    }

    async fn stop(self, name: String) {
        // A warm directory's install lease goes with it.
        self.warm.borrow_mut().remove(&name);
        let dir = self.s.work_root.join(&name);
        let uid = tokio::fs::metadata(&dir)
            .await
            .ok()
            .map(|m| std::os::unix::fs::MetadataExt::uid(&m));
        let pid_file = self.pid_file(&name);
        if let Some(pgid) = procgroup::read(&pid_file).await {
            kill_group(pgid, self.s.grace).await;
        }
        // Whatever left the group (a double fork into a new session) is still in the cgroup.
        if let Some(cgroup) = self.cgroup(&name) {
            cgroup.kill_and_remove().await;
        }
        let _ = tokio::fs::remove_file(&pid_file).await;
        if let Some(uid) = uid {
            self.clear_leftovers(&name, uid).await;
        }
        if let Err(e) = self.left.remove(&name, &dir).await {
            // Left behind, it must not keep its user taken for ever (a user is free when no
            // directory of the pool's runners is its): root takes it back; the removal is
            // tried again at later teardowns and at the next start.
            let disowned = nix::unistd::fchownat(
                nix::fcntl::AT_FDCWD,
                &dir,
                Some(nix::unistd::Uid::from_raw(0)),
                Some(nix::unistd::Gid::from_raw(0)),
                nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW,
            );
            tracing::warn!(runner = %name, dir = %dir.display(), error = %e, disowned = disowned.is_ok(), "cannot remove the runner directory; root keeps it until a later try removes it");
        }
        self.left.retry_due().await;
        users::release(&name);
    }

    fn left_behind(&self, name: &str) -> Option<String> {
        self.left.take_said(name)
    }

    async fn reap_leftovers(self, keep: Vec<String>) -> Vec<String> {
        let mut names = Vec::new();
        for dir in [self.s.work_root.join(".run"), self.s.work_root.clone()] {
            let Ok(mut entries) = tokio::fs::read_dir(&dir).await else {
                continue;
            };
            while let Ok(Some(entry)) = entries.next_entry().await {
                let file = entry.file_name().to_string_lossy().into_owned();
                let name = file.strip_suffix(".pid").unwrap_or(&file).to_string();
                if name.starts_with(&self.s.name_prefix)
                    && !names.contains(&name)
                    && !keep.contains(&name)
                {
                    names.push(name);
                }
            }
        }
        for name in &names {
            self.clone().stop(name.clone()).await;
        }
        prune_logs(&self.s.log_dir).await;
        names
    }

    async fn adopt(self, name: String) -> Option<RunningRunner> {
        let pgid = procgroup::read(&self.pid_file(&name)).await?;
        if !group_alive(pgid) {
            return None;
        }
        tracing::info!(runner = %name, pgid = pgid.as_raw(), "adopted a runner process from before the restart");
        let log_path = self.s.log_dir.join(format!("{name}.log"));
        Some(RunningRunner {
            exited: Box::pin(async move {
                let alive = async {
                    while group_alive(pgid) {
                        tokio::time::sleep(Duration::from_millis(250)).await;
                    }
                };
                tokio::select! {
                    () = alive => {},
                    never = super::runner_log::watch(log_path) => match never {},
                }
                None
            }),
        })
    }

    /// The host check: the runner install has an executable `run.sh` (or the command is an
    /// executable), the `run_as` user exists, and the work root can be written.
    async fn probe(self) -> Result<(), ProvisionError> {
        match &self.s.program {
            RunnerProgram::Install(dir) => {
                check_install(dir).map_err(|e| ProvisionError::Misconfigured(e.to_string()))?;
                // An install GitHub would refuse is not registered at all.
                if let Ok(version) = release::probe::install_version(dir).await
                    && let Some(why) = release::refused_by_github(&version)
                {
                    return Err(ProvisionError::Misconfigured(format!(
                        "{why}: update the install in {} (or drop runner_dir and let the daemon keep one current)",
                        dir.display()
                    )));
                }
            }
            RunnerProgram::Command(command) => check_executable(command, "runner command")?,
            RunnerProgram::Managed => {
                let installs = self.managed.as_ref().ok_or_else(|| {
                    ProvisionError::Misconfigured("no managed runner installs were given".into())
                })?;
                // The first start waits for the first look at the releases.
                installs.settled(MANAGED_FIRST_LOOK).await;
                let current = installs.current().ok_or_else(|| {
                    ProvisionError::HostUnavailable(installs.problem().unwrap_or_else(|| {
                        "no runner install yet: the releases were not looked at".into()
                    }))
                })?;
                check_install(&installs.dir_of(&current))
                    .map_err(|e| ProvisionError::Misconfigured(e.to_string()))?
            }
        }
        for user in &self.s.run_as {
            self.user_named(user)?;
        }
        self.make_work_root().await.map_err(|e| {
            ProvisionError::HostUnavailable(format!(
                "cannot write the work root {}: {e}",
                self.s.work_root.display()
            ))
        })?;
        let no_cgroups = self.no_cgroups.borrow_mut().take();
        if let Some(why) = no_cgroups {
            let reach = if self.s.run_as.is_empty() {
                "a job that double-forks into a new session (setsid) can leave it: give the pool \
                 run_as users, whose every process is killed after their last runner"
            } else {
                "and, after each run_as user's last runner, every process of that user (one that \
                 double-forked into a new session included)"
            };
            tracing::warn!(
                provider = self.s.pool.as_str(),
                "no cgroup for runners ({why}): teardown kills each runner's process group, {reach}"
            );
        }
        if let RunnerProgram::Install(dir) = &self.s.program
            && !same_filesystem(dir, &self.s.work_root).unwrap_or(true)
        {
            tracing::warn!(
                provider = self.s.pool.as_str(),
                runner_dir = %dir.display(),
                work_root = %self.s.work_root.display(),
                "runner_dir and work_root are on different filesystems: each job's copy of the \
                 install is a full copy instead of hard links"
            );
        }
        Ok(())
    }

    /// `doctor`: each `run_as` user can reach and start its runner (a real probe as the user).
    fn doctor_checks(self) -> impl Future<Output = Vec<super::Finding>> {
        let s = self.s.clone();
        let resolved = self.s.on_current_install(self.managed.as_ref());
        async move {
            use super::Finding;
            if let Some(why) = super::reach::skipped(&s) {
                return vec![Finding::Ok(format!("runner path probe not needed: {why}"))];
            }
            let Some(settings) = resolved else {
                return vec![Finding::Ok(
                    "no runner install yet: the daemon downloads one at start, and the path \
                     probe runs once it is there"
                        .into(),
                )];
            };
            let found = tokio::task::spawn_blocking(move || {
                super::reach::probe(&settings, settings.env.ca_bundle.as_deref())
            })
            .await
            .unwrap_or_default();
            found
                .into_iter()
                .map(|r| match r {
                    Ok(ok) => Finding::Ok(ok),
                    Err(e) => Finding::Fail(e.to_string()),
                })
                .collect()
        }
    }

    fn startup_warning(&self) -> Option<String> {
        (self.s.kind == ProviderKind::NativeMacos).then(|| {
            "native_macos runs jobs directly on this host: they share its files, network and \
             credentials; isolation is weak, use vm_macos where it matters"
                .to_string()
        })
    }
}

async fn create_private_dir(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    tokio::fs::create_dir_all(dir).await?;
    tokio::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)).await
}

/// The last part of a runner directory's path: its name.
fn dir_name(dir: &Path) -> String {
    dir.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

impl ProcessBackend {
    /// `run_as` user `user`, looked up now (at the host check, at each directory's making and
    /// at each claim), and refused by its uid: 0 unless `allow_root` (root under another name,
    /// `useradd -o -u 0`, is root), the daemon's own unless `allow_same_user`.
    pub(super) fn user_named(&self, user: &str) -> Result<nix::unistd::User, ProvisionError> {
        let u = nix::unistd::User::from_name(user)
            .map_err(|e| {
                ProvisionError::Misconfigured(format!("cannot look up run_as user {user}: {e}"))
            })?
            .ok_or_else(|| {
                ProvisionError::Misconfigured(format!("run_as user {user} does not exist"))
            })?;
        let uid = u.uid.as_raw();
        if crate::weaken::off("uid-check") {
            return Ok(u);
        }
        if uid == 0 && !self.s.allow_root {
            return Err(ProvisionError::Misconfigured(format!(
                "run_as user {user} has uid 0: root under another name, refused (allow_root = \
                 true accepts it)"
            )));
        }
        if uid == nix::unistd::geteuid().as_raw() && uid != 0 && !self.s.allow_same_user {
            return Err(ProvisionError::Misconfigured(format!(
                "run_as user {user} has the daemon's own uid {uid}: refused (allow_same_user = \
                 true accepts it)"
            )));
        }
        Ok(u)
    }
}

/// `NAME=value` for `env`.
fn env_assignment(name: &str, value: &Path) -> std::ffi::OsString {
    let mut a = std::ffi::OsString::from(format!("{name}="));
    a.push(value);
    a
}

async fn prune_logs(dir: &Path) {
    let Ok(mut entries) = tokio::fs::read_dir(dir).await else {
        return;
    };
    while let Ok(Some(entry)) = entries.next_entry().await {
        let old = entry
            .metadata()
            .await
            .ok()
            .and_then(|m| m.modified().ok())
            .and_then(|t| t.elapsed().ok())
            .is_some_and(|age| age > LOG_RETENTION);
        if old {
            let _ = tokio::fs::remove_file(entry.path()).await;
        }
    }
}
