//! The version of an operator's runner install, told without root running anything in it.
//!
//! The install is the operator's (`runner_dir`), and every job's copy shares its files; even
//! when the host check says no job user can change it (`provision/trust.rs`), the
//! daemon never hands it root and the org's token:
//! 1. the version is read from the install's files: `bin/Runner.Listener.deps.json`, which the
//!    runner's build writes with the listener as `Runner.Listener/<version>` (actions/runner
//!    `src/dir.proj` publishes every project with `Version=$(RunnerVersion)`);
//! 2. only when that file is missing or says nothing is `bin/Runner.Listener --version` run,
//!    with an empty environment, from `/`, and (when the daemon is root) as `nobody` with no
//!    supplementary groups.

use std::{path::Path, time::Duration};

use super::Version;

/// The build's dependency manifest beside the listener.
const DEPS: &str = "bin/Runner.Listener.deps.json";
/// How long the listener gets to say its version.
const PROBE_TIMEOUT: Duration = Duration::from_secs(20);

/// The version of the install at `dir`: from its files, else from its listener run unprivileged.
pub async fn install_version(dir: &Path) -> Result<Version, ProbeError> {
    if let Some(version) = deps_version(dir) {
        return Ok(version);
    }
    run_listener(dir).await
}

/// `Runner.Listener/<version>` among the manifest's targets or libraries.
pub(crate) fn deps_version(dir: &Path) -> Option<Version> {
    let text = std::fs::read(dir.join(DEPS)).ok()?;
    let deps: serde_json::Value = serde_json::from_slice(&text).ok()?;
    let targets = deps.get("targets")?.as_object()?.values();
    let libraries = deps.get("libraries").into_iter();
    targets
        .chain(libraries)
        .filter_map(|map| map.as_object())
        .flat_map(|map| map.keys())
        .find_map(|key| Version::parse(key.strip_prefix("Runner.Listener/")?))
}

/// Who runs the probe: `nobody` when the daemon is root, else the daemon itself.
fn unprivileged() -> Option<(u32, u32)> {
    if !nix::unistd::geteuid().is_root() {
        return None;
    }
    Some(match nix::unistd::User::from_name("nobody") {
        Ok(Some(u)) => (u.uid.as_raw(), u.gid.as_raw()),
        _ => (65534, 65534),
    })
}

async fn run_listener(dir: &Path) -> Result<Version, ProbeError> {
    let listener = dir.join("bin/Runner.Listener");
    let mut command = tokio::process::Command::new(&listener);
    command
        .arg("--version")
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .current_dir("/")
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true);
    let who = match unprivileged() {
        Some((uid, gid)) => {
            // std drops the supplementary groups when it changes the uid from root.
            command.uid(uid).gid(gid);
            format!(" as uid {uid}")
        }
        None => String::new(),
    };
    let shown = || listener.display().to_string();
    let out = tokio::time::timeout(PROBE_TIMEOUT, command.output())
        .await
        .map_err(|_| ProbeError::Silent(shown(), who.clone()))?
        .map_err(|e| ProbeError::NotRun(shown(), who.clone(), e.to_string()))?;
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines()
        .find_map(Version::parse)
        .ok_or_else(|| ProbeError::NoVersion(shown(), who, text.trim().to_string()))
}

/// Why an install's version could not be told.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProbeError {
    /// The listener did not answer within its time.
    #[error("{0} --version did not answer{1}")]
    Silent(String, String),
    /// The listener could not be started.
    #[error("cannot run {0}{1}: {2}")]
    NotRun(String, String, String),
    /// It answered no version.
    #[error("{0} --version{1} said {2:?} (the install has no {DEPS} to read it from)")]
    NoVersion(String, String, String),
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    fn listener(dir: &Path, script: &str) {
        std::fs::create_dir_all(dir.join("bin")).unwrap();
        let path = dir.join("bin/Runner.Listener");
        std::fs::write(&path, script).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    }

    #[actix_rt::test]
    async fn the_version_is_read_from_the_manifest_without_running_anything() {
        let tmp = tempfile::tempdir().unwrap();
        let ran = tmp.path().join("ran");
        listener(
            tmp.path(),
            &format!("#!/bin/sh\ntouch {}\necho 9.9.9\n", ran.display()),
        );
        std::fs::write(
            tmp.path().join(DEPS),
            r#"{"runtimeTarget":{"name":".NETCoreApp,Version=v8.0/linux-x64"},
                "targets":{".NETCoreApp,Version=v8.0/linux-x64":{
                    "Runner.Listener/2.331.0":{"dependencies":{"Sdk":"2.331.0"}},
                    "Sdk/2.331.0":{}}},
                "libraries":{"Runner.Listener/2.331.0":{"type":"project"}}}"#,
        )
        .unwrap();
        let version = install_version(tmp.path()).await.unwrap();
        assert_eq!(version, Version::parse("2.331.0").unwrap());
        assert!(
            !ran.exists(),
            "the listener ran although the manifest says the version"
        );
    }

    #[actix_rt::test]
    async fn without_a_manifest_the_listener_runs_unprivileged_with_an_empty_environment() {
        // Where nobody can reach it: a world-readable directory of its own.
        let tmp = tempfile::tempdir().unwrap();
        std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let out = tmp.path().join("out");
        std::fs::create_dir(&out).unwrap();
        std::fs::set_permissions(&out, std::fs::Permissions::from_mode(0o777)).unwrap();
        listener(
            tmp.path(),
            &format!(
                "#!/bin/sh\nid -u > {o}/uid\nid -G > {o}/groups\nenv > {o}/env\necho 2.330.1\n",
                o = out.display()
            ),
        );
        let version = install_version(tmp.path()).await.unwrap();
        assert_eq!(version, Version::parse("2.330.1").unwrap());
        // Only what the probe sets and what the shell adds by itself: nothing of the daemon's.
        let env = std::fs::read_to_string(out.join("env")).unwrap();
        for line in env.lines() {
            let name = line.split('=').next().unwrap_or_default();
            assert!(
                ["PATH", "PWD", "SHLVL", "_", "OLDPWD"].contains(&name),
                "the probe saw {line}"
            );
        }
        let uid: u32 = std::fs::read_to_string(out.join("uid"))
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        if nix::unistd::geteuid().is_root() {
            assert_ne!(uid, 0, "root ran the install's listener");
            let groups = std::fs::read_to_string(out.join("groups")).unwrap();
            assert!(
                !groups.split_whitespace().any(|g| g == "0"),
                "the probe kept root's groups: {groups}"
            );
        }
    }
}
