//! One uid never carries a job's leftovers to the next job.
//!
//! Two jobs in a row on one `run_as` user (one slot). The first leaves what a job can leave
//! outside its process group and directory: a daemonized process (`setsid`), a crontab entry,
//! a file in `/tmp`, one in `/dev/shm`, one in `/run/lock` and one in its real home, a POSIX
//! message queue (`/dev/mqueue`), a System V shared memory segment, and a key in its user's
//! kernel keyring (which outlives every process of the uid). The second
//! looks for each before it runs its job, and writes what it saw to its log. It sees none.

use std::{os::unix::fs::PermissionsExt, path::Path, time::Duration};

use github_standin::{Standin, StandinConfig};

use crate::support::{self, daemon::Daemon};

const USER: &str = "ephemer-leftover";
const LABELS: &[&str] = &["self-hosted", "linux"];

/// The job's code around the stand-in runner: report what the uid already has, leave
/// leftovers, then run the job.
fn script() -> String {
    format!(
        r#"#!/bin/sh
me=$(id -u)
pgrep -u "$me" -f 'sleep 4242' >/dev/null && echo "SAW process"
crontab -l 2>/dev/null | grep -q leftover-cron && echo "SAW crontab"
ls /tmp/leftover-file-* >/dev/null 2>&1 && echo "SAW tmp file"
ls /dev/shm/leftover-shm-* >/dev/null 2>&1 && echo "SAW shm file"
ls /run/lock/leftover-lock-* >/dev/null 2>&1 && echo "SAW lock file"
ls /dev/mqueue/leftover-mq-* >/dev/null 2>&1 && echo "SAW message queue"
ls "$(getent passwd "$me" | cut -d: -f6)"/leftover-home-* >/dev/null 2>&1 && echo "SAW home file"
awk -v u="$me" 'NR > 1 && $8 == u' /proc/sysvipc/shm | grep -q . && echo "SAW ipc"
keyctl search @u user leftover-key >/dev/null 2>&1 && echo "SAW keyring key"
echo "LOOKED"
setsid sleep 4242 >/dev/null 2>&1 < /dev/null &
echo '* * * * * true # leftover-cron' | crontab - 2>/dev/null
echo secret > "/tmp/leftover-file-$$"
echo secret > "/dev/shm/leftover-shm-$$"
echo secret > "/run/lock/leftover-lock-$$"
: > "/dev/mqueue/leftover-mq-$$"
echo secret > "$(getent passwd "$me" | cut -d: -f6)/leftover-home-$$"
ipcmk -M 4096 >/dev/null 2>&1
keyctl add user leftover-key secret @u >/dev/null 2>&1 || echo "NO KEYRING"
exec '{bin}' standin-runner "$@"
"#,
        bin = env!("CARGO_BIN_EXE_ephemer-actors")
    )
}

/// `/dev/mqueue` as most hosts mount it (a container may not have it: mounted here, as root).
fn mqueue_mounted() -> Result<(), String> {
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap_or_default();
    if mounts
        .lines()
        .any(|l| l.split(' ').nth(1) == Some("/dev/mqueue"))
    {
        return Ok(());
    }
    std::fs::create_dir_all("/dev/mqueue").map_err(|e| format!("mkdir /dev/mqueue: {e}"))?;
    let done = std::process::Command::new("mount")
        .args(["-t", "mqueue", "mqueue", "/dev/mqueue"])
        .status()
        .map_err(|e| format!("mount: {e}"))?;
    done.success()
        .then_some(())
        .ok_or_else(|| "cannot mount /dev/mqueue here".to_string())
}

#[actix_rt::test]
async fn the_next_job_on_a_uid_sees_nothing_the_last_one_left() {
    if !nix::unistd::geteuid().is_root() || support::which("sudo").is_none() {
        return support::skip(
            "leftovers",
            "run_as needs root and sudo (bash .ci/run installs it)",
        );
    }
    if support::which("keyctl").is_none() {
        return support::skip(
            "leftovers",
            "keyctl is not installed (bash .ci/run installs keyutils)",
        );
    }
    if support::which("crontab").is_none() {
        return support::skip(
            "leftovers",
            "crontab is not installed (bash .ci/run installs cron)",
        );
    }
    assert!(support::ensure_user(USER), "cannot create the user {USER}");
    if let Err(why) = mqueue_mounted() {
        return support::skip("leftovers", &why);
    }
    // A home of its own, as `useradd --create-home` makes (what docs/security.md once said).
    let account = nix::unistd::User::from_name(USER).unwrap().unwrap();
    std::fs::create_dir_all(&account.dir).unwrap();
    nix::unistd::chown(&account.dir, Some(account.uid), Some(account.gid)).unwrap();
    // Whatever an earlier run left is not this run's to see.
    let uid = nix::unistd::User::from_name(USER)
        .unwrap()
        .unwrap()
        .uid
        .as_raw();
    ephemer_actors_core::provision::leftovers::clear(uid, USER, &[]);
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let runner = support::write_file(dir.path(), "runner.sh", &script());
    std::fs::set_permissions(&runner, std::fs::Permissions::from_mode(0o755)).unwrap();
    let standin = Standin::start(StandinConfig::default()).unwrap();
    let providers = format!(
        "[providers.local]\ncommand = \"{}\"\nrun_as = [\"{USER}\"]\nlabels = [\"self-hosted\", \"linux\"]\nmax_concurrent = 1\n",
        runner.display()
    );
    let daemon = Daemon::start(&standin, "", &providers).await;
    for n in 1..=2 {
        standin.queue_jobs("app", LABELS, 1);
        daemon
            .wait_completed(&standin, n, Duration::from_secs(60))
            .await;
        // The runner is torn down after its job's `completed`; wait for its directory to go.
        let work = daemon.runner_dir();
        let prefix = daemon.prefix();
        support::provision::eventually("the runner torn down", Duration::from_secs(20), || {
            std::fs::read_dir(&work).is_ok_and(|d| {
                !d.flatten()
                    .any(|e| e.file_name().to_string_lossy().starts_with(&prefix))
            })
        })
        .await;
    }
    let logs: Vec<String> = std::fs::read_dir(daemon.state_dir().join("logs"))
        .unwrap()
        .flatten()
        .map(|e| std::fs::read_to_string(e.path()).unwrap_or_default())
        .collect();
    assert_eq!(logs.len(), 2, "{logs:#?}");
    assert!(logs.iter().all(|l| l.contains("LOOKED")), "{logs:#?}");
    // The attack itself works here: the first job could leave a key.
    assert!(!logs.iter().any(|l| l.contains("NO KEYRING")), "{logs:#?}");
    let seen: Vec<&str> = logs
        .iter()
        .flat_map(|l| l.lines())
        .filter(|l| l.starts_with("SAW"))
        .collect();
    assert!(
        seen.is_empty(),
        "the next job saw the last one's leftovers: {seen:?}\n{}",
        daemon.logs()
    );
    assert!(
        !Path::new("/var/spool/cron/crontabs").join(USER).exists(),
        "{}",
        daemon.logs()
    );
    assert_eq!(daemon.stop(Duration::from_secs(30)).await.0, Some(0));
}

/// A job directory the teardown cannot remove (a mount inside it, here) does not keep its user
/// taken for ever (a user is free when no runner directory is its): root takes the directory
/// back, and the next jobs run.
#[actix_rt::test]
async fn a_job_directory_that_cannot_be_removed_does_not_retire_its_user() {
    if !nix::unistd::geteuid().is_root() || support::which("sudo").is_none() {
        return support::skip(
            "stale directory",
            "run_as needs root and sudo (bash .ci/run installs it)",
        );
    }
    // Users of its own: the other test here clears everything its user runs.
    const USERS: [&str; 2] = ["ephemer-stale1", "ephemer-stale2"];
    for user in USERS {
        assert!(support::ensure_user(user), "cannot create the user {user}");
    }
    let standin = support::standin(3000);
    let providers = format!(
        "[providers.local]\ncommand = \"{}\"\nargs = [\"standin-runner\"]\nrun_as = [\"{}\", \"{}\"]\n\
         labels = [\"self-hosted\", \"linux\"]\nmax_concurrent = 2\n",
        env!("CARGO_BIN_EXE_ephemer-actors"),
        USERS[0],
        USERS[1]
    );
    let daemon = Daemon::start(&standin, "", &providers).await;
    standin.queue_jobs("app", LABELS, 1);
    let (work, prefix) = (daemon.runner_dir(), daemon.prefix());
    let job_dir = || {
        std::fs::read_dir(&work).ok().and_then(|d| {
            d.flatten().map(|e| e.path()).find(|p| {
                p.file_name()
                    .unwrap()
                    .to_string_lossy()
                    .starts_with(&prefix)
            })
        })
    };
    support::provision::eventually("the first job's directory", Duration::from_secs(30), || {
        job_dir().is_some_and(|d| d.join("_tmp").is_dir())
    })
    .await;
    let dir = job_dir().unwrap();
    let stuck = dir.join("_tmp");
    let source = tempfile::tempdir().unwrap();
    let mounted = std::process::Command::new("mount")
        .args(["--bind"])
        .arg(source.path())
        .arg(&stuck)
        .status()
        .is_ok_and(|s| s.success());
    if !mounted {
        return support::skip("stale directory", "cannot bind-mount here");
    }
    daemon
        .wait_completed(&standin, 1, Duration::from_secs(60))
        .await;
    support::provision::eventually(
        "the teardown gave up on it",
        Duration::from_secs(20),
        || daemon.logs().contains("cannot remove the runner directory"),
    )
    .await;
    let owner = std::os::unix::fs::MetadataExt::uid(&std::fs::metadata(&dir).unwrap());
    standin.queue_jobs("app", LABELS, 2);
    let ran = tokio::time::timeout(
        Duration::from_secs(60),
        daemon.wait_completed(&standin, 3, Duration::from_secs(60)),
    )
    .await;
    let _ = std::process::Command::new("umount").arg(&stuck).status();
    assert_eq!(owner, 0, "root took the directory back from the job's user");
    assert!(ran.is_ok(), "the next jobs never ran:\n{}", daemon.logs());
    assert_eq!(daemon.stop(Duration::from_secs(30)).await.0, Some(0));
}
