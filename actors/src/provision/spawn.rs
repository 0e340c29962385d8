//! The host checks of a program a pool runs, as [`ProvisionError`]s.

use super::ProvisionError;

/// Sorts an I/O error of starting a runner command: a command that is missing or not
/// executable is the pool's settings; anything else is this one environment.
pub fn spawn_error(what: &str, e: &std::io::Error) -> ProvisionError {
    use std::io::ErrorKind as K;
    match e.kind() {
        K::NotFound | K::PermissionDenied => ProvisionError::Misconfigured(format!("{what}: {e}")),
        _ => ProvisionError::EnvironmentFailed(format!("{what}: {e}")),
    }
}

/// The host check of a program a pool runs: it exists (a bare name on `PATH`, as spawning it
/// would find it) and is an executable file.
pub fn check_executable(path: &std::path::Path, what: &str) -> Result<(), ProvisionError> {
    use std::os::unix::fs::PermissionsExt;
    let resolved = if path.components().count() == 1 && path.is_relative() {
        std::env::var_os("PATH")
            .into_iter()
            .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
            .map(|d| d.join(path))
            .find(|c| c.is_file())
            .unwrap_or_else(|| path.to_path_buf())
    } else {
        path.to_path_buf()
    };
    let meta = std::fs::metadata(&resolved)
        .map_err(|e| ProvisionError::Misconfigured(format!("{what} {}: {e}", path.display())))?;
    if !meta.is_file() || meta.permissions().mode() & 0o111 == 0 {
        return Err(ProvisionError::Misconfigured(format!(
            "{what} {} is not an executable file",
            path.display()
        )));
    }
    Ok(())
}
