//! Can each `run_as` user reach what its runner needs? Proved, not guessed from modes: a job
//! directory is made in the work root exactly as a job's is (the install's copy, owned by the
//! user), and the user itself (`sudo -n -u`) enters it, runs the check on `run.sh` (or the
//! command), reads the CA bundle and writes in its own directory. Where it cannot enter, each
//! directory above is tried as that user, and the first one that stops it is named with the
//! fix. `doctor` and `check-config` both run this; a unit's `StateDirectoryMode=0700` with the
//! work root inside the state directory is what it catches.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use super::{install::copy_install, jobdir::command_dir, process::ProcessSettings};
use crate::config::RunnerProgram;

/// What one user could not do, and what to change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unreachable {
    /// The user.
    pub user: String,
    /// What failed, with the directory or file.
    pub what: String,
    /// The fix.
    pub fix: String,
}

impl std::fmt::Display for Unreachable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "run_as user {} {}: {}", self.user, self.what, self.fix)
    }
}

/// Why the probe cannot run here (jobs run as the daemon's own user, the daemon is not root,
/// a user or the install is missing: the pool's own host check says so), if it cannot.
pub fn skipped(s: &ProcessSettings) -> Option<String> {
    if s.run_as.is_empty() {
        return Some("jobs run as the daemon's own user".into());
    }
    if !nix::unistd::geteuid().is_root() {
        return Some("not root: only root makes job directories for run_as users".into());
    }
    if let Some(user) = s
        .run_as
        .iter()
        .find(|u| nix::unistd::User::from_name(u).ok().flatten().is_none())
    {
        return Some(format!("run_as user {user} does not exist"));
    }
    let program = s.program.executable();
    if !program.exists() {
        return Some(format!("{} does not exist", program.display()));
    }
    None
}

/// Proves, for every `run_as` user of the pool, that its runner can start: enter its job
/// directory, find `run.sh` (or the command) executable, read `ca_bundle`, write its `_tmp`.
/// Call [`skipped`] first; blocking (it copies the install and runs `sudo`).
pub fn probe(s: &ProcessSettings, ca_bundle: Option<&Path>) -> Vec<Result<String, Unreachable>> {
    let mut out = Vec::new();
    if s.program == RunnerProgram::Managed {
        // The caller resolves a managed pool to its current install; there is none yet.
        out.push(Ok(
            "no runner install yet: the daemon downloads one at start, and the path probe runs \
             once it is there"
                .into(),
        ));
        return out;
    }
    if let Err(e) = crate::harden::passable_dir(&s.work_root) {
        let user = s.run_as.first().cloned().unwrap_or_default();
        out.push(Err(Unreachable {
            user,
            what: format!("has no work root: {}: {e}", s.work_root.display()),
            fix: "make work_root a directory the daemon can create and own".into(),
        }));
        return out;
    }
    for user in &s.run_as {
        out.push(probe_user(s, user, ca_bundle));
    }
    out
}

fn probe_user(s: &ProcessSettings, user: &str, ca: Option<&Path>) -> Result<String, Unreachable> {
    let fail = |what: String, fix: String| Unreachable {
        user: user.to_string(),
        what,
        fix,
    };
    let u = nix::unistd::User::from_name(user)
        .ok()
        .flatten()
        .ok_or_else(|| fail("does not exist".into(), "create the user".into()))?;
    // Not the pool's name prefix: neither the start-up reaping nor the choice of a free user
    // takes it for a job's directory.
    let dir = s
        .work_root
        .join(format!(".reach-probe-{user}-{}", std::process::id()));
    let _ = crate::remove::remove_tree(&dir, crate::remove::TEARDOWN_BUDGET);
    let owner = Some((u.uid, u.gid));
    let made = match &s.program {
        RunnerProgram::Install(install) => copy_install(install, &dir, owner).map(drop),
        RunnerProgram::Command(_) | RunnerProgram::Managed => command_dir(&dir, owner),
    };
    let result = match made {
        Err(e) => Err(fail(
            format!("has no job directory: {e}"),
            "check the work root's filesystem and runner_dir".into(),
        )),
        Ok(()) => run_checks(s, user, &dir, ca).map_err(|(what, fix)| fail(what, fix)),
    };
    let _ = crate::remove::remove_tree(&dir, crate::remove::TEARDOWN_BUDGET);
    result.map(|()| {
        format!(
            "run_as user {user} reaches its job directory in {} and can start its runner",
            s.work_root.display()
        )
    })
}

/// The checks, as the user; `(what failed, the fix)`.
fn run_checks(
    s: &ProcessSettings,
    user: &str,
    dir: &Path,
    ca: Option<&Path>,
) -> Result<(), (String, String)> {
    let program = match &s.program {
        RunnerProgram::Install(_) | RunnerProgram::Managed => dir.join("run.sh"),
        RunnerProgram::Command(c) => c.clone(),
    };
    let script = r#"cd "$1" 2>/dev/null || { echo enter; exit 3; }
[ -x "$2" ] || { echo run; exit 3; }
[ -z "$3" ] || [ -r "$3" ] || { echo read; exit 3; }
t="$1/_tmp/.reach-probe"
{ : > "$t" && rm -f "$t"; } 2>/dev/null || { echo write; exit 3; }"#;
    let ca_arg = ca.map(|p| p.as_os_str().to_owned()).unwrap_or_default();
    let out = as_user(user)
        .args(["sh", "-c", script, "sh"])
        .arg(dir)
        .arg(&program)
        .arg(&ca_arg)
        .output()
        .map_err(|e| {
            (
                format!("cannot be switched to with sudo: {e}"),
                "install sudo (the package depends on it)".into(),
            )
        })?;
    if out.status.success() {
        return Ok(());
    }
    let said = String::from_utf8_lossy(&out.stdout).trim().to_string();
    match said.as_str() {
        "enter" => Err(blocking_dir(user, dir)),
        "run" => Err((
            format!("cannot execute {}", program.display()),
            match &s.program {
                RunnerProgram::Install(i) => format!(
                    "make the install readable and run.sh executable by others: chmod -R o+rX {}",
                    i.display()
                ),
                RunnerProgram::Command(c) => format!("chmod o+rx {}", c.display()),
                RunnerProgram::Managed => {
                    "remove the daemon-managed install so it is made again".into()
                }
            },
        )),
        "read" => Err((
            format!("cannot read the CA bundle {}", ca_arg.to_string_lossy()),
            "the daemon writes it 0644 in <state.dir>-work; check that directory's mode (0711)"
                .into(),
        )),
        "write" => Err((
            format!("cannot write in its job directory {}", dir.display()),
            "the work root's filesystem must allow the user's files (not read-only, not full)"
                .into(),
        )),
        _ => Err((
            format!(
                "cannot run a shell through sudo -n -u {user}: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ),
            "root must be allowed to run commands as the run_as users without a password".into(),
        )),
    }
}

/// `sudo -n -u USER --`.
fn as_user(user: &str) -> Command {
    let mut cmd = Command::new("sudo");
    cmd.args(["-n", "-u", user, "--"]).env_clear();
    if let Some(path) = std::env::var_os("PATH") {
        cmd.env("PATH", path);
    }
    cmd
}

/// The first directory on the way to `dir` the user cannot pass through, with the fix.
fn blocking_dir(user: &str, dir: &Path) -> (String, String) {
    let mut path = PathBuf::from("/");
    for part in dir.components().skip(1) {
        path.push(part);
        let passes = as_user(user)
            .args(["test", "-x"])
            .arg(&path)
            .status()
            .is_ok_and(|s| s.success());
        if !passes {
            let mode = std::fs::metadata(&path)
                .map(|m| {
                    format!(
                        "{:04o}",
                        std::os::unix::fs::PermissionsExt::mode(&m.permissions()) & 0o7777
                    )
                })
                .unwrap_or_else(|_| "?".into());
            return (
                format!(
                    "cannot pass through {} (mode {mode}) to its job directory",
                    path.display()
                ),
                format!(
                    "put work_root outside it (the default, <state.dir>-work, is made 0711), or \
                     let others pass: chmod o+x {}",
                    path.display()
                ),
            );
        }
    }
    (
        format!("cannot enter its job directory {}", dir.display()),
        "check the work root's mount options (noexec, nosuid) and ACLs".into(),
    )
}
