//! The corpus against `linux` pools: each job's script runs in its container (Podman, the
//! tests' own service) before its stand-in runner.

use std::{os::unix::fs::PermissionsExt, time::Duration};

use super::{Found, record};
use crate::support::{
    self,
    daemon::{Daemon, linux_provider},
    podman::{IMAGE, Podman},
};

const KIND: &str = "linux";
const LABELS: &[&str] = &["self-hosted", "linux"];

/// A directory the containers see read-only at `/hostile`, holding the job's script.
fn script_dir(script: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    support::write_file(
        dir.path(),
        "job.sh",
        &format!("{script}\nexec /usr/local/bin/ephemer-actors standin-runner \"$@\"\n"),
    );
    dir
}

/// The containers' saved logs.
fn logs(daemon: &Daemon) -> Vec<String> {
    std::fs::read_dir(daemon.state_dir().join("logs"))
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| std::fs::read_to_string(e.path()).unwrap_or_default())
        .collect()
}

/// Waits until a log says `word`, or `within` passed.
async fn until_said(daemon: &Daemon, word: &str, within: Duration) -> bool {
    let deadline = tokio::time::Instant::now() + within;
    while tokio::time::Instant::now() < deadline {
        if logs(daemon).iter().any(|l| l.contains(word)) {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    false
}

/// A job allocates 600 MB: its container's memory limit holds, the daemon lives.
async fn memory_hog(podman: &Podman, memory: &str) -> Found {
    let dir = script_dir(
        "if head -c 629145600 /dev/zero | tail >/dev/null; then echo \"RESULT allocated\"; else echo \"RESULT killed\"; fi",
    );
    let standin = support::standin(500);
    let providers = linux_provider(
        &podman.socket,
        IMAGE,
        1,
        &format!(
            "network = \"host\"\nmemory = \"{memory}\"\ncommand = [\"/bin/sh\", \"/hostile/job.sh\"]\nvolumes = [\"{}:/hostile:ro\"]\n",
            dir.path().display()
        ),
    );
    let daemon = Daemon::start(&standin, "", &providers).await;
    standin.queue_jobs("app", LABELS, 1);
    daemon
        .wait_completed(&standin, 1, Duration::from_secs(180))
        .await;
    let saved = until_said(&daemon, "RESULT", Duration::from_secs(30)).await;
    let all = logs(&daemon);
    let _ = daemon.stop(Duration::from_secs(60)).await;
    standin.stop().await;
    if all.iter().any(|l| l.contains("RESULT allocated")) {
        Found::got("600 MB allocated")
    } else if saved {
        Found::refused("killed inside its container; the daemon lives")
    } else {
        Found::silent("the job said nothing")
    }
}

/// Finding 8: a bind that check-config accepted is made to lead into `/etc` by a symlink put
/// on the host afterwards; the engine follows it at the next start.
async fn bind_symlinked_after_check(podman: &Podman, weaken: &str) -> Found {
    let dir = script_dir(
        "if [ -e /cache/passwd ]; then echo \"RESULT reached-etc\"; else echo \"RESULT clean\"; fi",
    );
    let cache = dir.path().join("cache");
    std::fs::create_dir(&cache).unwrap();
    let standin = support::standin(500);
    let providers = linux_provider(
        &podman.socket,
        IMAGE,
        1,
        &format!(
            "network = \"host\"\ncommand = [\"/bin/sh\", \"/hostile/job.sh\"]\nvolumes = [\"{}:/hostile:ro\", \"{}:/cache:ro\"]\n",
            dir.path().display(),
            cache.display()
        ),
    );
    let env: Vec<(&str, &str)> = if weaken.is_empty() {
        Vec::new()
    } else {
        vec![("EPHEMER_TEST_WEAKEN", weaken)]
    };
    let daemon = Daemon::start_with_env(&standin, "", &providers, &env).await;
    // After the daemon judged it: the bind's source becomes a link to the host's /etc.
    std::fs::remove_dir(&cache).unwrap();
    std::os::unix::fs::symlink("/etc", &cache).unwrap();
    standin.queue_jobs("app", LABELS, 1);
    let reached = until_said(&daemon, "RESULT reached-etc", Duration::from_secs(90)).await;
    let refused = daemon.logs().contains("judged again at this start");
    let _ = daemon.stop(Duration::from_secs(60)).await;
    standin.stop().await;
    if reached {
        Found::got("the container saw the host's /etc")
    } else if refused {
        Found::refused("the start was refused, the bind judged again; the pool is down")
    } else {
        Found::silent("no container ran")
    }
}

/// The corpus on `linux`.
pub(super) async fn all() {
    let Some(podman) = Podman::start().await else {
        return;
    };
    record(
        "memory_hog",
        KIND,
        "config: memory = 2GiB",
        memory_hog(&podman, "2GiB").await,
        memory_hog(&podman, "256MiB").await,
    );
    record(
        "bind_symlinked_after_check",
        KIND,
        "bind-recheck",
        bind_symlinked_after_check(&podman, "bind-recheck").await,
        bind_symlinked_after_check(&podman, "").await,
    );
}
