//! A runner's process group, named in a pid file that identifies one incarnation of it.
//!
//! A bare pid in a file outlives what it named: after a reboot (or enough forks) the number
//! belongs to an unrelated process, and signalling it would kill that. So a pid file holds the
//! group leader's pid, its start time (`/proc/<pid>/stat` field 22, clock ticks since boot) and
//! the boot id (`/proc/sys/kernel/random/boot_id`); a group is signalled or adopted only when
//! the live process with that pid has the same start time in the same boot. (Where there is no
//! `/proc`, as on macOS, only the pid is kept and checked.)

use std::{
    ffi::OsString,
    path::{Path, PathBuf},
    time::Duration,
};

use nix::{
    sys::signal::{Signal, killpg},
    unistd::Pid,
};

/// `sh -c` script every runner starts as: it moves itself into the cgroup whose
/// `cgroup.procs` is `$1` (when `$1` is not empty), waits for the daemon's word on its stdin,
/// then execs the rest of its arguments (same pid, same group). The word comes once the pid
/// file names it, so a runner never takes a job the daemon could not find again after a
/// `kill -9`; a daemon killed before the word leaves a wrapper that exits, never a runner.
const GATED_START: &str = r#"[ -n "$1" ] && echo $$ > "$1" 2>/dev/null; shift; IFS= read -r go || exit 125; exec "$@" </dev/null"#;

/// The start of a runner's argv: the gate, then (pushed by the caller) the runner's own
/// command. Spawn it with a piped stdin and pass that to [`open_gate`].
pub(super) fn gated(cgroup_procs: Option<PathBuf>) -> Vec<OsString> {
    let mut argv: Vec<OsString> = ["sh", "-c", GATED_START, "sh"].map(OsString::from).into();
    argv.push(
        cgroup_procs
            .map(PathBuf::into_os_string)
            .unwrap_or_default(),
    );
    argv
}

/// Lets a gated runner become itself (call once its pid file is written).
pub(super) async fn open_gate(gate: Option<tokio::process::ChildStdin>) -> std::io::Result<()> {
    use tokio::io::AsyncWriteExt;
    match gate {
        Some(mut gate) => gate.write_all(b"go\n").await,
        None => Err(std::io::Error::other("the runner's stdin is not a pipe")),
    }
}

/// The pid file's text for the group led by `pid`.
pub(super) fn record(pid: u32) -> String {
    match (start_time(pid as i32), boot_id()) {
        (Some(start), Some(boot)) => format!("{pid} {start} {boot}\n"),
        _ => format!("{pid}\n"),
    }
}

/// The group named by the pid file at `path`, if that very process still leads it.
pub(super) async fn read(path: &Path) -> Option<Pid> {
    let text = tokio::fs::read_to_string(path).await.ok()?;
    let mut fields = text.split_whitespace();
    let pid: i32 = fields.next()?.parse().ok()?;
    if pid <= 1 {
        return None;
    }
    let (start, boot) = (fields.next(), fields.next());
    // Without /proc (macOS) there is no identity to check: the pid alone.
    let Some(now_boot) = boot_id() else {
        return Some(Pid::from_raw(pid));
    };
    // The process is gone: nothing to signal or adopt, and nothing to warn about.
    let now_start = start_time(pid)?;
    let same = boot == Some(now_boot.as_str())
        && start.and_then(|s| s.parse::<u64>().ok()) == Some(now_start);
    if !same {
        tracing::warn!(
            pid_file = %path.display(),
            pid,
            "the pid file names a process that is not the runner it was written for (another \
             boot, or a reused pid): not signalled, not adopted"
        );
        return None;
    }
    Some(Pid::from_raw(pid))
}

/// Start time of `pid` in clock ticks since boot.
fn start_time(pid: i32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // pid (comm) state ...: comm may hold spaces, so split after the last ')'; starttime is
    // field 22, the 20th after comm.
    let (_, rest) = stat.rsplit_once(')')?;
    rest.split_whitespace().nth(19)?.parse().ok()
}

fn boot_id() -> Option<String> {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .ok()
        .map(|s| s.trim().to_string())
}

/// SIGTERM the group, wait up to `grace`, then SIGKILL, and wait until it is gone.
pub(super) async fn kill_group(pgid: Pid, grace: Duration) {
    if pgid.as_raw() <= 1 || !group_alive(pgid) {
        return;
    }
    let _ = killpg(pgid, Signal::SIGTERM);
    let alive = || group_alive(pgid);
    let deadline = tokio::time::Instant::now() + grace;
    while alive() && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    if alive() {
        tracing::warn!(
            pgid = pgid.as_raw(),
            "runner ignored SIGTERM; sending SIGKILL"
        );
        let _ = killpg(pgid, Signal::SIGKILL);
        for _ in 0..100 {
            if !alive() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// Whether any process of the group is alive. On Linux zombies do not count (a runner orphaned
/// by a daemon killed with `kill -9` may never be reaped by whatever adopted it).
pub(super) fn group_alive(pgid: Pid) -> bool {
    if killpg(pgid, None).is_err() {
        return false;
    }
    #[cfg(target_os = "linux")]
    {
        let Ok(entries) = std::fs::read_dir("/proc") else {
            return true;
        };
        for entry in entries.flatten() {
            let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
                continue;
            };
            // pid (comm) state ppid pgrp ...: comm may hold spaces, so split after the last ')'.
            let Some((_, rest)) = stat.rsplit_once(')') else {
                continue;
            };
            let mut fields = rest.split_whitespace();
            let state = fields.next();
            let pgrp = fields.nth(1).and_then(|p| p.parse::<i32>().ok());
            if pgrp == Some(pgid.as_raw()) && state != Some("Z") && state != Some("X") {
                return true;
            }
        }
        false
    }
    #[cfg(not(target_os = "linux"))]
    true
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    /// A pid file whose pid is alive but started at another time (a reused pid, another boot)
    /// names nothing: not signalled, not adopted.
    #[tokio::test]
    async fn a_pid_file_of_another_incarnation_names_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("r.pid");
        let me = std::process::id();
        tokio::fs::write(&path, record(me)).await.unwrap();
        assert_eq!(read(&path).await, Some(Pid::from_raw(me as i32)));
        let (start, boot) = (start_time(me as i32).unwrap(), boot_id().unwrap());
        tokio::fs::write(&path, format!("{me} {} {boot}\n", start + 1))
            .await
            .unwrap();
        assert_eq!(read(&path).await, None, "another start time");
        tokio::fs::write(&path, format!("{me} {start} 00000000-0000\n"))
            .await
            .unwrap();
        assert_eq!(read(&path).await, None, "another boot");
        tokio::fs::write(&path, format!("{me}\n")).await.unwrap();
        assert_eq!(read(&path).await, None, "no identity at all");
    }

    async fn gated_touch(marker: &Path, go: bool) -> Option<i32> {
        let mut argv = gated(None);
        argv.extend(["touch".into(), marker.as_os_str().to_owned()]);
        let mut child = tokio::process::Command::new(&argv[0])
            .args(&argv[1..])
            .stdin(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let gate = child.stdin.take();
        if go {
            open_gate(gate).await.unwrap();
        } else {
            // The daemon died before the pid file: its end of the pipe closes.
            drop(gate);
        }
        child.wait().await.unwrap().code()
    }

    /// The runner's command runs only after the word; without it the wrapper exits instead.
    #[tokio::test]
    async fn a_gated_runner_starts_only_on_the_word() {
        let dir = tempfile::tempdir().unwrap();
        let marker = dir.path().join("ran");
        assert_eq!(gated_touch(&marker, false).await, Some(125));
        assert!(!marker.exists(), "the command ran without the word");
        assert_eq!(gated_touch(&marker, true).await, Some(0));
        assert!(marker.exists(), "the command did not run after the word");
    }
}
