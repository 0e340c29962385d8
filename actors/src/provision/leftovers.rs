//! What a job's uid leaves behind, cleared before the uid runs another job.
//!
//! A job may leave processes outside its process group and cgroup (a daemonized child), a
//! crontab or `at` entry, files in the shared temp directories (`/tmp`, `/var/tmp`,
//! `/dev/shm`) and System V IPC objects. The next job on that uid could then read that job's
//! environment (its JIT config) or be read by it. So when the last runner of a `run_as` user
//! is torn down, every process of the uid is killed, its crontab and `at` jobs, its files in
//! the temp directories and its IPC objects are removed; and a uid that still has processes is
//! not handed out (`uid_busy`).

use std::{
    fs,
    io::{self, BufRead},
    os::unix::fs::MetadataExt,
    path::Path,
};

use nix::{sys::signal::Signal, unistd::Pid};

/// Shared directories a job may write to that outlive it.
const TEMP_DIRS: [&str; 3] = ["/tmp", "/var/tmp", "/dev/shm"];
/// Where cron and at keep a user's entries (Debian's and Red Hat's layouts).
const CRONTABS: [&str; 2] = ["/var/spool/cron/crontabs", "/var/spool/cron"];
const AT_JOBS: [&str; 2] = ["/var/spool/cron/atjobs", "/var/spool/at"];
/// How deep the temp directories are searched for the uid's entries below others'.
const TEMP_DEPTH: usize = 4;

/// What was cleared.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Cleared {
    /// Processes killed.
    pub processes: usize,
    /// Files and directories removed from the temp directories.
    pub temp_entries: usize,
    /// Crontab and `at` entries removed.
    pub schedules: usize,
    /// System V IPC objects removed.
    pub ipc: usize,
}

impl Cleared {
    /// Whether anything was left.
    pub fn any(&self) -> bool {
        *self != Cleared::default()
    }
}

/// The processes of `uid` (real, effective or saved), from `/proc`.
pub fn processes_of(uid: u32) -> Vec<Pid> {
    let Ok(entries) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| owned_by(*pid, uid))
        .map(Pid::from_raw)
        .collect()
}

/// Whether `pid` runs as `uid` (a zombie runs nothing: its parent has yet to reap it).
fn owned_by(pid: i32, uid: u32) -> bool {
    let Ok(f) = fs::File::open(format!("/proc/{pid}/status")) else {
        return false;
    };
    let (mut zombie, mut ours) = (false, false);
    for line in io::BufReader::new(f).lines().map_while(Result::ok) {
        if let Some(state) = line.strip_prefix("State:") {
            zombie = state.trim_start().starts_with('Z');
        } else if let Some(ids) = line.strip_prefix("Uid:") {
            ours = ids
                .split_whitespace()
                .take(3)
                .any(|id| id.parse() == Ok(uid));
            break;
        }
    }
    ours && !zombie
}

/// Whether `uid` still runs anything (it is not handed to a new job then).
pub fn uid_busy(uid: u32) -> bool {
    !processes_of(uid).is_empty()
}

/// Clears everything `uid` (user `user`) left: blocking; never for root or the daemon's uid.
/// Nothing under `keep` is touched (the work roots: job directories live there, and a work
/// root may itself be under `/tmp`).
pub fn clear(uid: u32, user: &str, keep: &[&Path]) -> Cleared {
    let mut out = Cleared::default();
    if uid == 0 || uid == nix::unistd::geteuid().as_raw() {
        return out;
    }
    // A process may fork while the others are being killed: kill until none is left.
    for _ in 0..50 {
        let found = processes_of(uid);
        if found.is_empty() {
            break;
        }
        for pid in found {
            if nix::sys::signal::kill(pid, Signal::SIGKILL).is_ok() {
                out.processes += 1;
            }
        }
        std::thread::yield_now();
    }
    for dir in CRONTABS {
        if fs::remove_file(Path::new(dir).join(user)).is_ok() {
            out.schedules += 1;
        }
    }
    for dir in AT_JOBS {
        out.schedules += remove_owned(Path::new(dir), uid, 0, keep);
    }
    for dir in TEMP_DIRS {
        out.temp_entries += remove_owned(Path::new(dir), uid, TEMP_DEPTH, keep);
    }
    out.ipc = remove_ipc(uid);
    out
}

/// Removes the entries of `dir` that `uid` owns (without following links), looking `depth`
/// directories down into the others'.
fn remove_owned(dir: &Path, uid: u32, depth: usize, keep: &[&Path]) -> usize {
    if keep.iter().any(|k| dir.starts_with(k)) {
        return 0;
    }
    let Ok(entries) = fs::read_dir(dir) else {
        return 0;
    };
    let mut removed = 0;
    for entry in entries.flatten() {
        let Ok(meta) = entry.metadata() else {
            continue;
        };
        let path = entry.path();
        if keep.iter().any(|k| path.starts_with(k)) {
            continue;
        }
        if meta.uid() == uid {
            let gone = if meta.is_dir() {
                // Never follows a link inside (std walks by descriptor).
                fs::remove_dir_all(&path)
            } else {
                fs::remove_file(&path)
            };
            removed += usize::from(gone.is_ok());
        } else if meta.is_dir() && depth > 0 {
            removed += remove_owned(&path, uid, depth - 1, keep);
        }
    }
    removed
}

/// Removes the System V shared memory segments, message queues and semaphore sets `uid`
/// owns (`/proc/sysvipc`), with `ipcrm`.
fn remove_ipc(uid: u32) -> usize {
    let mut removed = 0;
    for (kind, id_col) in [("shm", "shmid"), ("msg", "msqid"), ("sem", "semid")] {
        let Ok(text) = fs::read_to_string(format!("/proc/sysvipc/{kind}")) else {
            continue;
        };
        let mut lines = text.lines();
        let Some(header) = lines.next() else {
            continue;
        };
        let cols: Vec<&str> = header.split_whitespace().collect();
        let (Some(id_at), Some(uid_at)) = (
            cols.iter().position(|c| *c == id_col),
            cols.iter().position(|c| *c == "uid"),
        ) else {
            continue;
        };
        for line in lines {
            let f: Vec<&str> = line.split_whitespace().collect();
            let (Some(id), Some(owner)) = (f.get(id_at), f.get(uid_at)) else {
                continue;
            };
            if owner.parse() != Ok(uid) {
                continue;
            }
            let Ok(id) = id.parse::<i32>() else {
                continue;
            };
            // util-linux's ipcrm (the library forbids unsafe, and libc is all there is).
            let flag = match kind {
                "shm" => "-m",
                "msg" => "-q",
                _ => "-s",
            };
            let rc = std::process::Command::new("ipcrm")
                .args([flag, &id.to_string()])
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .status()
                .map_or(1, |s| i32::from(!s.success()));
            removed += usize::from(rc == 0);
        }
    }
    removed
}
