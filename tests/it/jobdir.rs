//! Root never follows a job's symlink while it builds a job's directory.
//!
//! A process of the job's uid (here `nobody`) swaps every directory it can reach in the job
//! directories for symlinks to root's files, in a loop, while root builds 300 job directories
//! (a copy of a many-directory install, handed to `nobody`) and removes them. Had root made,
//! chmodded or chowned a child by path in a tree the user could already enter, one swap would
//! hand root's canary file to `nobody` or change its mode, or put a directory inside root's
//! canary directory. Built root-owned and `0700`, through directory descriptors, and handed
//! over last, nothing outside the job directories changes.

use std::{
    os::unix::fs::{MetadataExt, PermissionsExt},
    path::Path,
    time::Duration,
};

use ephemer_actors_core::provision::install::copy_install;

use crate::support;

/// An install with `dirs` nested directories, each with a file, and `run.sh`.
fn install(root: &Path, dirs: usize) {
    let mut dir = root.to_path_buf();
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(root.join("run.sh"), "#!/bin/sh\n").unwrap();
    for i in 0..dirs {
        dir = dir.join(format!("d{i}"));
        std::fs::create_dir(&dir).unwrap();
        std::fs::write(dir.join("lib.so"), "x").unwrap();
    }
    for d in walk(root) {
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
}

fn walk(root: &Path) -> Vec<std::path::PathBuf> {
    let mut out = vec![root.to_path_buf()];
    let mut i = 0;
    while i < out.len() {
        if let Ok(entries) = std::fs::read_dir(&out[i]) {
            for e in entries.flatten() {
                if e.file_type().is_ok_and(|t| t.is_dir()) {
                    out.push(e.path());
                }
            }
        }
        i += 1;
    }
    out
}

/// The attacker, as `nobody` (Python: a loop of renames and symlinks as fast as the kernel
/// takes them): in the job directory being built (it cannot list the work root, only try the
/// names), every directory it can rename becomes a symlink to the canary file or the canary
/// directory, over and over, until `stop` exists.
const SWAPPER: &str = r#"
import os, sys
W, F, D = sys.argv[1:4]
subs = [""] + ["/" + "/".join("d%d" % k for k in range(j + 1)) for j in range(5)]
subs += ["/_work", "/_home", "/_tmp", "/_diag"]
i, n = 0, 0
while not os.path.exists(W + "/stop"):
    for k in range(i, i + 4):
        if os.path.lexists("%s/job%d" % (W, k)):
            i = k
    for k in (i, i + 1):
        base = "%s/job%d" % (W, k)
        for s in subs:
            p = base + s
            n += 1
            try:
                os.rename(p, "%s.x%d" % (p, n))
                os.symlink(F if n % 2 else D, p)
            except OSError:
                pass
"#;

#[actix_rt::test]
async fn root_never_follows_a_symlink_a_job_user_swaps_in() {
    if !nix::unistd::geteuid().is_root() {
        return support::skip(
            "symlink race",
            "building job directories for another user needs root",
        );
    }
    let nobody = nix::unistd::User::from_name("nobody").unwrap().unwrap();
    let tmp = tempfile::tempdir().unwrap();
    std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let src = tmp.path().join("install");
    install(&src, 12);
    let work = tmp.path().join("work");
    ephemer_actors_core::harden::passable_dir(&work).unwrap();
    // The work root is the daemon's (0711): nobody can rename what is in it, only inside the
    // job directories it is given; let it drop its swapped-out directories in one of its own.
    let canary = tmp.path().join("canary");
    std::fs::write(&canary, "root's").unwrap();
    std::fs::set_permissions(&canary, std::fs::Permissions::from_mode(0o600)).unwrap();
    let canary_dir = tmp.path().join("canary-dir");
    std::fs::create_dir(&canary_dir).unwrap();
    std::fs::set_permissions(&canary_dir, std::fs::Permissions::from_mode(0o700)).unwrap();

    // The system's Python (one under root's home would not run as nobody).
    let python = Path::new("/usr/bin/python3");
    if !python.exists() {
        return support::skip(
            "symlink race",
            "/usr/bin/python3 (the attacker) is not installed",
        );
    }
    let mut swapper = tokio::process::Command::new(python)
        .args(["-c", SWAPPER])
        .arg(&work)
        .arg(&canary)
        .arg(&canary_dir)
        .uid(nobody.uid.as_raw())
        .gid(nobody.gid.as_raw())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let owner = Some((nobody.uid, nobody.gid));
    let (src2, work2) = (src.clone(), work.clone());
    let built = tokio::task::spawn_blocking(move || {
        let mut failures = 0;
        for i in 0..300 {
            let dir = work2.join(format!("job{i}"));
            if copy_install(&src2, &dir, owner).is_err() {
                failures += 1;
            }
            // Let the swapper at the finished tree a moment, then tear it down as root.
            std::thread::yield_now();
            let _ = std::fs::remove_dir_all(&dir);
        }
        failures
    })
    .await
    .unwrap();
    std::fs::write(work.join("stop"), "").unwrap();
    let _ = tokio::time::timeout(Duration::from_secs(10), swapper.wait()).await;

    let meta = std::fs::metadata(&canary).unwrap();
    assert_eq!(
        (meta.uid(), meta.mode() & 0o7777),
        (0, 0o600),
        "root's file was changed through a symlink"
    );
    assert_eq!(std::fs::read_to_string(&canary).unwrap(), "root's");
    let meta = std::fs::metadata(&canary_dir).unwrap();
    assert_eq!((meta.uid(), meta.mode() & 0o7777), (0, 0o700));
    assert!(
        std::fs::read_dir(&canary_dir).unwrap().next().is_none(),
        "root made something inside its own directory through a symlink"
    );
    assert_eq!(
        built, 0,
        "every job directory was built, the user's swaps notwithstanding"
    );
    // The install itself is untouched too.
    for d in walk(&src) {
        let m = std::fs::metadata(&d).unwrap();
        assert_eq!((m.uid(), m.mode() & 0o7777), (0, 0o755), "{}", d.display());
    }
}
