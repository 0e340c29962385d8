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

/// The review's escalation: a `runner_dir` its job user owns. Before, a job appended a line
/// to `bin/Runner.Listener` (shared by hard link with every copy) and root ran it, with the
/// org's token in its environment, at the next version probe. Now check-config, doctor and
/// serve refuse the install, naming the path, no job is claimed for it, and nothing in it runs
/// as root.
#[actix_rt::test]
async fn a_runner_dir_a_job_user_can_write_is_refused_and_root_never_runs_it() {
    if !nix::unistd::geteuid().is_root() {
        crate::support::skip(
            "runner_dir trust",
            "handing the install to a user needs root",
        );
        return;
    }
    const USER: &str = "ephemer-install";
    assert!(crate::support::ensure_user(USER), "useradd {USER}");
    let user = nix::unistd::User::from_name(USER).unwrap().unwrap();
    let tmp = tempfile::tempdir().unwrap();
    std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let runner_dir = tmp.path().join("actions-runner");
    install(&runner_dir);
    // What the job did through its copy: the listener now also says who ran it. Without the
    // build's manifest the daemon has to run the listener to learn the version.
    let ran = tmp.path().join("ran");
    std::fs::write(&ran, "").unwrap();
    std::fs::set_permissions(&ran, std::fs::Permissions::from_mode(0o666)).unwrap();
    std::fs::remove_file(runner_dir.join("bin/Runner.Listener.deps.json")).unwrap();
    let listener = runner_dir.join("bin/Runner.Listener");
    std::fs::write(
        &listener,
        format!(
            "#!/bin/sh\necho \"$(id -u) ${{GITHUB_TOKEN:+token}}\" >> {}\necho 2.330.0\n",
            ran.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&listener, std::fs::Permissions::from_mode(0o755)).unwrap();
    let chown = std::process::Command::new("chown")
        .arg("-R")
        .arg(format!("{USER}:{USER}"))
        .arg(&runner_dir)
        .status()
        .unwrap();
    assert!(chown.success());

    let standin = crate::support::standin(200);
    let providers = format!(
        "[providers.local]\nrunner_dir = \"{}\"\nwork_root = \"{}\"\n\
         labels = [\"self-hosted\", \"linux\"]\nmax_concurrent = 1\nrun_as = \"{USER}\"\n",
        runner_dir.display(),
        tmp.path().join("work").display(),
    );
    let extra = "[runner]\nrelease_check_interval = \"1s\"\n";
    let daemon = Daemon::start(&standin, extra, &providers).await;
    let named = format!("{} is owned by uid {}", runner_dir.display(), user.uid);

    let mut check = crate::support::daemon();
    check.args(["check-config", "-c"]).arg(&daemon.config);
    let (code, _, err) = crate::support::output(check).await;
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("providers.local.runner_dir") && err.contains(&named),
        "{err}"
    );
    let mut doctor = crate::support::daemon();
    doctor.args(["doctor", "-c"]).arg(&daemon.config);
    let (code, out, _) = crate::support::output(doctor).await;
    assert_eq!(code, 1, "{out}");
    assert!(
        out.lines()
            .any(|l| l.starts_with("FAIL pool.local") && l.contains(&named)),
        "{out}"
    );

    standin.queue_jobs("app", LABELS, 1);
    eventually("serve names the path", Duration::from_secs(20), || {
        daemon.logs().contains(&named)
    })
    .await;
    // Release checks every second meanwhile: each would have run the listener as root.
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert_eq!(standin.count("generate_jitconfig"), 0, "{}", daemon.logs());
    let seen = std::fs::read_to_string(&ran).unwrap();
    for line in seen.lines() {
        let mut said = line.split_whitespace();
        assert_ne!(said.next(), Some("0"), "root ran the listener: {seen}");
        assert_eq!(said.next(), None, "the probe saw the token: {seen}");
    }
    assert_eq!(daemon.stop(Duration::from_secs(30)).await.0, Some(0));
}
