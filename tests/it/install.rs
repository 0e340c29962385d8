//! `runner_dir`: many jobs from one actions/runner install, each from its own private copy.
//!
//! The stand-in runner keeps its identity and `_work` in its install root, as the real one does
//! (see `standin-runner`), and fails its job when another runner shared that root.

use std::{
    collections::BTreeMap,
    os::unix::fs::{MetadataExt, PermissionsExt},
    path::{Path, PathBuf},
    time::Duration,
};

use crate::support::{daemon::Daemon, provision::eventually};

const LABELS: &[&str] = &["self-hosted", "linux"];

/// Every entry under `root` with its content (files), its target (links), mode and mtime.
fn snapshot(root: &Path) -> BTreeMap<PathBuf, (Vec<u8>, u32, i64, i64)> {
    let mut out = BTreeMap::new();
    let mut dirs = vec![root.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap().flatten() {
            let path = entry.path();
            let meta = std::fs::symlink_metadata(&path).unwrap();
            let content = if meta.is_dir() {
                dirs.push(path.clone());
                Vec::new()
            } else if meta.file_type().is_symlink() {
                std::fs::read_link(&path)
                    .unwrap()
                    .into_os_string()
                    .into_encoded_bytes()
            } else {
                std::fs::read(&path).unwrap()
            };
            let key = path.strip_prefix(root).unwrap().to_path_buf();
            out.insert(key, (content, meta.mode(), meta.mtime(), meta.mtime_nsec()));
        }
    }
    out
}

/// A stand-in actions/runner install at `dir`.
fn install(dir: &Path) {
    let daemon = Path::new(env!("CARGO_BIN_EXE_ephemer-actors"));
    standin_runner::write_install(dir, daemon, &["standin-runner"]).unwrap();
}

/// Runs four concurrent jobs from one install with these extra `[providers.local]` keys and
/// checks: all complete, each ran from its own copy with its own identity, HOME and TMPDIR,
/// the install is unchanged, and no copy is left.
async fn four_jobs_from_one_install(base: &Path, extra: &str, uid: u32) {
    let standin = crate::support::standin(1500);
    let runner_dir = base.join("actions-runner");
    install(&runner_dir);
    let before = snapshot(&runner_dir);
    let providers = format!(
        r#"
[providers.local]
runner_dir = "{}"
work_root = "{}"
labels = ["self-hosted", "linux", "x64"]
max_concurrent = 4
{extra}
"#,
        runner_dir.display(),
        base.join("work").display(),
    );
    let daemon = Daemon::start(&standin, "", &providers).await;
    let work_root = base.join("work");
    standin.queue_jobs("app", LABELS, 4);
    daemon
        .wait_completed(&standin, 4, Duration::from_secs(60))
        .await;
    daemon.wait_no_runner_left(&standin).await;

    // Each runner ran from its own copy, wrote its identity there and found it intact.
    let logs_dir = daemon.state_dir().join("logs");
    let runner_logs: Vec<(String, String)> = std::fs::read_dir(&logs_dir)
        .unwrap()
        .flatten()
        .map(|e| {
            let name = e
                .file_name()
                .to_string_lossy()
                .trim_end_matches(".log")
                .to_string();
            (name, std::fs::read_to_string(e.path()).unwrap())
        })
        .collect();
    assert!(runner_logs.len() >= 4, "{runner_logs:?}");
    for (name, log) in &runner_logs {
        let root = work_root.join(name);
        let own = format!(
            "(root {r}, HOME {r}/_home, TMPDIR {r}/_tmp) as uid {uid}",
            r = root.display()
        );
        assert!(
            log.contains(&own),
            "{name} did not run from its own copy {}:\n{log}",
            root.display()
        );
        assert!(!log.contains("failing job"), "{name}:\n{log}");
    }
    assert_eq!(snapshot(&runner_dir), before, "the install was written");
    eventually("no per-job copy left", Duration::from_secs(20), || {
        std::fs::read_dir(&work_root)
            .unwrap()
            .flatten()
            .all(|e| e.file_name() == ".run")
    })
    .await;
    assert_eq!(daemon.stop(Duration::from_secs(30)).await.0, Some(0));
}

#[actix_rt::test]
async fn four_concurrent_jobs_from_one_install_each_keep_their_own_identity() {
    let tmp = tempfile::tempdir().unwrap();
    let me = std::fs::metadata("/proc/self").unwrap().uid();
    four_jobs_from_one_install(tmp.path(), "allow_root = true", me).await;
}

/// With `run_as`, the copy's directories belong to that user, who can write its root but not
/// the install (still root's).
#[actix_rt::test]
async fn four_jobs_as_another_user_from_one_install() {
    if crate::support::which("sudo").is_none() {
        crate::support::skip("run_as", "sudo is not installed (bash .ci/run installs it)");
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    // The user must be able to reach the install and its copies.
    std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    // A user of its own (never `nobody`): the teardown ends everything a run_as user runs.
    const USER: &str = "ephemer-install";
    assert!(crate::support::ensure_user(USER), "useradd {USER}");
    let user = nix::unistd::User::from_name(USER).unwrap().unwrap();
    four_jobs_from_one_install(
        tmp.path(),
        "run_as = \"ephemer-install\"",
        user.uid.as_raw(),
    )
    .await;
}
