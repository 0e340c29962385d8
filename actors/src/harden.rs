//! What the daemon does to itself at start, so the jobs it runs cannot read its secrets.
//!
//! Its memory and `/proc/<pid>/environ` hold the GitHub credential and the webhook secret. A
//! process of the same user can read both (`ptrace` access mode "read") unless the daemon is
//! non-dumpable; a core dump would write them to disk. So: `PR_SET_DUMPABLE` 0 (Linux) and
//! `RLIMIT_CORE` 0. And every file the daemon creates that holds something of a job or a
//! secret (the store, runner logs, the admin token) is created mode 0600, never chmodded after.
//!
//! macOS has no `PR_SET_DUMPABLE`: there another process's memory needs `task_for_pid`, which
//! takes root or a debugger's entitlement, and its arguments and environment
//! (`KERN_PROCARGS2`, what `ps -E` shows) are readable by the same uid only; a job there runs as
//! a `run_as` user, never the daemon's (check-config refuses the daemon's own user without
//! `allow_same_user`). Core dumps are turned off the same way on both.

use std::{fs::File, io, os::unix::fs::OpenOptionsExt, path::Path};

/// Makes this process non-dumpable and turns core dumps off; what could not be done is
/// returned as a warning for the log.
pub fn harden_process() -> Vec<String> {
    let mut warnings = Vec::new();
    #[cfg(target_os = "linux")]
    if let Err(e) = nix::sys::prctl::set_dumpable(false) {
        warnings.push(format!(
            "cannot make the daemon non-dumpable (PR_SET_DUMPABLE): {e}; a process of the same \
             user could read its memory"
        ));
    }
    use nix::sys::resource::{Resource, setrlimit};
    if let Err(e) = setrlimit(Resource::RLIMIT_CORE, 0, 0) {
        warnings.push(format!("cannot turn core dumps off (RLIMIT_CORE): {e}"));
    }
    warnings
}

/// Opens `path` for writing, created mode 0600 if new (appending, or truncating).
pub fn private_file(path: &Path, append: bool) -> io::Result<File> {
    std::fs::OpenOptions::new()
        .create(true)
        .write(true)
        .append(append)
        .truncate(!append)
        .mode(0o600)
        .open(path)
}

/// Makes `dir` a directory only its owner can enter (`0700`, whatever the umask); what is
/// missing above it is created too.
pub fn private_dir(dir: &Path) -> io::Result<()> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
}

/// Makes `dir` (and what is missing above it) a directory runners can pass through to their
/// own job directories but nobody else can list: `0711`, set explicitly whatever the umask (a
/// unit's `UMask=0077` would make it `0700` and lock every `run_as` user out). A directory of
/// another owner is left as it is (the path probe of `doctor` says whether runners can pass).
pub fn passable_dir(dir: &Path) -> io::Result<()> {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    std::fs::create_dir_all(dir)?;
    let meta = std::fs::metadata(dir)?;
    if meta.uid() == nix::unistd::geteuid().as_raw() && meta.permissions().mode() & 0o7777 != 0o711
    {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o711))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    #[test]
    fn a_passable_dir_is_0711_under_any_umask() {
        let dir = tempfile::tempdir().unwrap();
        let old = nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(0o077));
        let work = dir.path().join("state-work");
        let made = passable_dir(&work);
        nix::sys::stat::umask(old);
        made.unwrap();
        let mode = std::fs::metadata(&work).unwrap().permissions().mode();
        assert_eq!(mode & 0o7777, 0o711);
    }

    #[test]
    fn private_files_are_0600_from_their_creation() {
        let dir = tempfile::tempdir().unwrap();
        for append in [false, true] {
            let path = dir.path().join(format!("f{append}"));
            private_file(&path, append).unwrap();
            let mode = std::fs::metadata(&path).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o600);
        }
    }
}
