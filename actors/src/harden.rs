//! What the daemon does to itself at start, so the jobs it runs cannot read its secrets.
//!
//! Its memory and `/proc/<pid>/environ` hold the GitHub credential and the webhook secret. A
//! process of the same user can read both (`ptrace` access mode "read") unless the daemon is
//! non-dumpable; a core dump would write them to disk. So: `PR_SET_DUMPABLE` 0 (Linux) and
//! `RLIMIT_CORE` 0. And every file the daemon creates that holds something of a job or a
//! secret (the store, runner logs, the admin token) is created mode 0600, never chmodded after.

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

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

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
