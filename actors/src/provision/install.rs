//! One private copy of an actions/runner install per job (`runner_dir`).
//!
//! The actions runner keeps its state beside its own binaries, not in its working directory:
//! - its root is the parent of the directory its entry assembly is in (actions/runner
//!   `src/Runner.Common/HostContext.cs`, `GetDirectory(WellKnownDirectory.Root)`), and `_diag`
//!   and the default `_work` are resolved from that root;
//! - with a JIT config it writes each of the config's files (`.runner`, `.credentials`,
//!   `.credentials_rsaparams`) into the root with `File.WriteAllBytes`, which truncates and
//!   rewrites an existing file in place (`src/Runner.Listener/Runner.cs`, `GetJitConfig`);
//! - `run.sh` finds the root from its own path (`cd -P "$(dirname "$SOURCE")"`) and rewrites
//!   `run-helper.sh` from its template with `cp -f` on every start (`src/Misc/layoutroot/run.sh`).
//!
//! So two jobs started from one install overwrite each other's identity and share `_work`. Each
//! job therefore runs from its own copy: fresh directories (owned by `run_as`, so the runner can
//! write its root), whose files are hard links to the install's files. A link costs no bytes and
//! no time worth measuring; the files the runner writes in place (above) are left out, so the
//! runner creates its own and the install is never written. Where a link cannot be made (the
//! work root on another filesystem, or a kernel that refuses to link a file the daemon does not
//! own) the file is copied, which the kernel serves as a reflink where the filesystem has them
//! (`copy_file_range`), and the caller is told so it can say so once.

use std::{
    ffi::OsStr,
    fs,
    io::{self, ErrorKind},
    os::unix::fs::PermissionsExt,
    path::Path,
};

use nix::unistd::{Gid, Uid};

use super::jobdir::Tree;

/// Files and directories at the install's root that the runner writes (see the module docs):
/// never linked, so the runner creates its own in the copy.
pub const RUNNER_WRITES: [&str; 16] = [
    ".runner",
    ".runner_migrated",
    ".credentials",
    ".credentials_migrated",
    ".credentials_rsaparams",
    ".credential_store",
    ".credential_store.keychain",
    ".service",
    ".certificates",
    ".options",
    ".setup_info",
    ".telemetry",
    "run-helper.sh",
    "run-helper.cmd",
    "_work",
    "_diag",
];

/// Per-job directories made fresh in every copy: the runner's work and diagnostics, and the
/// job's own `HOME` and `TMPDIR`.
pub const FRESH_DIRS: [&str; 4] = ["_work", "_diag", "_home", "_tmp"];

/// How a copy was made.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct CopyReport {
    /// Files shared with the install by a hard link.
    pub linked: usize,
    /// Files that had to be copied (another filesystem, or a link refused).
    pub copied: usize,
}

/// Makes `dest` (which must not exist) a private copy of the install at `src`; its directories
/// belong to `owner` when set. It is built root's and `0700` through directory descriptors and
/// handed over last ([`super::jobdir`]), so no link `owner` plants meanwhile is ever followed.
/// On error the partial copy is left for the caller to remove.
pub fn copy_install(src: &Path, dest: &Path, owner: Option<(Uid, Gid)>) -> io::Result<CopyReport> {
    let mut report = CopyReport::default();
    let top = Tree::create(dest, owner)?;
    copy_tree(src, src, &top, &mut report)?;
    for name in FRESH_DIRS {
        top.dir(OsStr::new(name), 0o700)?;
    }
    top.hand_over()?;
    Ok(report)
}

/// Copies the install at `top` into `dest`, one directory at a time (its depth on the heap).
fn copy_tree(top: &Path, src: &Path, dest: &Tree, report: &mut CopyReport) -> io::Result<()> {
    let mut todo = vec![(src.to_path_buf(), None::<Tree>)];
    while let Some((dir, made)) = todo.pop() {
        let into = made.as_ref().unwrap_or(dest);
        copy_dir(top, &dir, into, made.is_none(), report, &mut todo)?;
    }
    Ok(())
}

/// Copies the entries of `src` into `dest`; its subdirectories are made and queued in `todo`.
fn copy_dir(
    top: &Path,
    src: &Path,
    dest: &Tree,
    root: bool,
    report: &mut CopyReport,
    todo: &mut Vec<(std::path::PathBuf, Option<Tree>)>,
) -> io::Result<()> {
    for entry in fs::read_dir(src)? {
        let entry = entry?;
        let name = entry.file_name();
        if root && name.to_str().is_some_and(|n| RUNNER_WRITES.contains(&n)) {
            continue;
        }
        let from = entry.path();
        let meta = fs::symlink_metadata(&from)?;
        let kind = meta.file_type();
        if kind.is_dir() {
            // Owner-writable at least, so the runner (as `owner`) may add files, as it may in
            // its own install.
            let sub = dest.dir(&name, meta.permissions().mode() & 0o7777 | 0o700)?;
            todo.push((from, Some(sub)));
        } else if kind.is_symlink() {
            // Judged at start; a link that leaves the install since is not copied (the job's
            // copy would lead its runner out of it).
            let target = fs::read_link(&from)?;
            if !super::trust::stays_inside(top, &from, &target) {
                return Err(io::Error::new(
                    ErrorKind::PermissionDenied,
                    format!(
                        "{} leads out of the install ({}): not copied into a job (see \
                         docs/security.md)",
                        from.display(),
                        target.display()
                    ),
                ));
            }
            dest.symlink(&target, &name)?;
        } else if kind.is_file() {
            // The install was judged at start (`check_install`); a file someone loosened
            // since is not shared with a job.
            if super::trust::shared_writable(&meta) {
                return Err(io::Error::new(
                    ErrorKind::PermissionDenied,
                    format!(
                        "{} can be written by a user other than root and the daemon's: not \
                         shared with a job (see docs/security.md)",
                        from.display()
                    ),
                ));
            }
            match dest.link(&from, &name) {
                Ok(()) => report.linked += 1,
                Err(e) if link_refused(&e) => {
                    dest.copy(&from, &name, meta.permissions().mode())?;
                    report.copied += 1;
                }
                Err(e) => return Err(with_path(e, &from)),
            }
        }
        // Sockets, fifos and devices are no part of an install: left out.
    }
    Ok(())
}

/// A link that cannot be made here but a copy can: another filesystem (`EXDEV`), or
/// `fs.protected_hardlinks` refusing a file the daemon does not own (`EPERM`).
fn link_refused(e: &io::Error) -> bool {
    e.kind() == ErrorKind::CrossesDevices || e.raw_os_error() == Some(nix::libc::EPERM)
}

fn with_path(e: io::Error, path: &Path) -> io::Error {
    io::Error::new(e.kind(), format!("{}: {e}", path.display()))
}

/// The host check of an install: `run.sh` is an executable file at its root, and no job user
/// can change anything in it ([`super::trust::check_trusted`]).
pub fn check_install(dir: &Path) -> Result<(), InstallCheckError> {
    let shown = || dir.display().to_string();
    let meta =
        fs::metadata(dir).map_err(|e| InstallCheckError::Unreadable(shown(), e.to_string()))?;
    if !meta.is_dir() {
        return Err(InstallCheckError::NotADirectory(shown()));
    }
    let run = dir.join("run.sh");
    match fs::metadata(&run) {
        Ok(m) if m.is_file() && m.permissions().mode() & 0o111 != 0 => {
            Ok(super::trust::check_trusted(dir)?)
        }
        Ok(_) => Err(InstallCheckError::NotExecutable(run.display().to_string())),
        Err(e) => Err(InstallCheckError::NotAnInstall(shown(), e.to_string())),
    }
}

/// Why a directory is not an install a pool may run.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InstallCheckError {
    /// It cannot be read.
    #[error("runner_dir {0}: {1}")]
    Unreadable(String, String),
    /// It is a file.
    #[error("runner_dir {0} is not a directory")]
    NotADirectory(String),
    /// Its `run.sh` is not an executable file.
    #[error("{0} is not an executable file")]
    NotExecutable(String),
    /// It has no `run.sh`.
    #[error("runner_dir {0} is not an actions/runner install: run.sh: {1}")]
    NotAnInstall(String, String),
    /// A job user could change it.
    #[error(transparent)]
    Untrusted(#[from] super::trust::TrustError),
}

/// Whether two paths are on the same filesystem (so the copy can use hard links).
pub fn same_filesystem(a: &Path, b: &Path) -> io::Result<bool> {
    use std::os::unix::fs::MetadataExt;
    Ok(fs::metadata(a)?.dev() == fs::metadata(b)?.dev())
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::MetadataExt;

    use super::*;

    fn install(root: &Path) {
        fs::create_dir_all(root.join("bin/sub")).unwrap();
        fs::write(root.join("run.sh"), "#!/bin/sh\n").unwrap();
        fs::set_permissions(root.join("run.sh"), fs::Permissions::from_mode(0o755)).unwrap();
        fs::write(root.join("bin/Runner.Listener"), "listener").unwrap();
        fs::write(root.join("bin/sub/lib.so"), "lib").unwrap();
        fs::write(root.join(".env"), "LANG=C\n").unwrap();
        fs::write(root.join(".runner"), "old identity").unwrap();
        fs::write(root.join("run-helper.sh"), "helper").unwrap();
        fs::create_dir_all(root.join("_work/old")).unwrap();
        std::os::unix::fs::symlink("bin", root.join("current")).unwrap();
    }

    #[test]
    fn the_copy_links_the_install_and_leaves_out_what_the_runner_writes() {
        let tmp = tempfile::tempdir().unwrap();
        let (src, dest) = (tmp.path().join("install"), tmp.path().join("job"));
        install(&src);
        let report = copy_install(&src, &dest, None).unwrap();
        assert_eq!(
            report,
            CopyReport {
                linked: 4,
                copied: 0
            }
        );
        let ino = |p: &Path| fs::metadata(p).unwrap().ino();
        assert_eq!(
            ino(&src.join("bin/sub/lib.so")),
            ino(&dest.join("bin/sub/lib.so"))
        );
        assert_eq!(ino(&src.join(".env")), ino(&dest.join(".env")));
        for written in [".runner", "run-helper.sh", "_work/old"] {
            assert!(!dest.join(written).exists(), "{written} was carried over");
        }
        for fresh in FRESH_DIRS {
            let meta = fs::metadata(dest.join(fresh)).unwrap();
            assert!(meta.is_dir());
            assert_eq!(meta.permissions().mode() & 0o777, 0o700);
        }
        assert_eq!(
            fs::read_link(dest.join("current")).unwrap(),
            Path::new("bin")
        );
        assert!(fs::read_dir(dest.join("_work")).unwrap().next().is_none());
    }

    /// An install changed after its check: a link leading out of it is never put in a job's
    /// copy.
    #[test]
    fn a_link_leaving_the_install_is_not_copied_into_a_job() {
        let tmp = tempfile::tempdir().unwrap();
        let (src, dest) = (tmp.path().join("install"), tmp.path().join("job"));
        install(&src);
        std::os::unix::fs::symlink("../../../elsewhere", src.join("bin/sub/out")).unwrap();
        let err = copy_install(&src, &dest, None).unwrap_err();
        assert!(err.to_string().contains("leads out of the install"), "{err}");
    }

    #[test]
    fn an_install_without_run_sh_is_named_as_such() {
        let tmp = tempfile::tempdir().unwrap();
        let err = check_install(tmp.path()).unwrap_err();
        assert!(matches!(err, InstallCheckError::NotAnInstall(..)), "{err}");
        let err = err.to_string();
        assert!(err.contains("not an actions/runner install"), "{err}");
        install(&tmp.path().join("i"));
        check_install(&tmp.path().join("i")).unwrap();
    }
}
