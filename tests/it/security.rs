//! What a job's user can reach of the daemon: run as an unprivileged user, the daemon is
//! non-dumpable (a process of the same user cannot read its environment or memory), and its
//! store and admin token are private to it from their creation.

use std::{os::unix::fs::PermissionsExt, time::Duration};

use crate::support::{self, daemon::free_port, wait_for_http};

/// `cat PATH` as `uid`: (exit code, stderr).
async fn read_as(uid: u32, gid: u32, path: &str) -> (i32, String) {
    let out = tokio::process::Command::new("cat")
        .arg(path)
        .uid(uid)
        .gid(gid)
        .output()
        .await
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[actix_rt::test]
async fn a_process_of_the_daemons_own_user_cannot_read_its_environment() {
    if !nix::unistd::geteuid().is_root() {
        support::skip("security", "switching users needs root");
        return;
    }
    let nobody = nix::unistd::User::from_name("nobody").unwrap().unwrap();
    let (uid, gid) = (nobody.uid.as_raw(), nobody.gid.as_raw());
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let state = dir.path().join("state");
    std::fs::create_dir(&state).unwrap();
    nix::unistd::chown(&state, Some(nobody.uid), Some(nobody.gid)).unwrap();
    let (port, admin) = (free_port(), free_port());
    let config = support::write_file(
        dir.path(),
        "c.toml",
        &format!(
            "[github]\nowner = \"acme\"\napi_url = \"http://127.0.0.1:9\"\n\
             [webhook]\nlisten = \"127.0.0.1:{port}\"\nreconcile_interval = \"0s\"\n\
             [state]\ndir = \"{}\"\n[admin]\nlisten = \"127.0.0.1:{admin}\"\n\
             [providers.local]\ncommand = \"/bin/true\"\n",
            state.display()
        ),
    );
    let mut serve = support::daemon();
    serve
        .args(["serve", "--config"])
        .arg(&config)
        .env("GITHUB_TOKEN", "ghp_SECRET_IN_THE_ENVIRONMENT")
        .env("EPHEMER_WEBHOOK_SECRET", "hook")
        .uid(uid)
        .gid(gid)
        .kill_on_drop(true);
    let mut child = serve.spawn().unwrap();
    let up = wait_for_http(
        &format!("127.0.0.1:{port}"),
        "/healthz",
        Duration::from_secs(20),
    )
    .await;
    assert_eq!(up.map(|r| r.0), Some(200));
    let pid = child.id().unwrap();

    // A dumpable process of the same user is readable (the check can fail)...
    let mut sleeper = tokio::process::Command::new("sleep")
        .arg("30")
        .uid(uid)
        .gid(gid)
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let sleeper_env = format!("/proc/{}/environ", sleeper.id().unwrap());
    assert_eq!(read_as(uid, gid, &sleeper_env).await.0, 0);
    // ...the daemon is not.
    let (code, err) = read_as(uid, gid, &format!("/proc/{pid}/environ")).await;
    assert_ne!(code, 0, "the daemon's environment was readable");
    assert!(err.contains("Permission denied"), "{err}");

    for file in ["ephemer-actors.redb", "admin.token"] {
        let mode = std::fs::metadata(state.join(file))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o077, 0, "{file} is {mode:o}");
    }
    let _ = sleeper.start_kill();
    support::sigterm(&child);
    let status = tokio::time::timeout(Duration::from_secs(20), child.wait()).await;
    assert_eq!(status.unwrap().unwrap().code(), Some(0));
}
