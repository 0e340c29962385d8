//! What a job's uid leaves behind, cleared before the uid runs another job.
//!
//! A job may leave processes outside its process group and cgroup (a daemonized child), a
//! crontab or `at` entry, files in the shared temp directories (`/tmp`, `/var/tmp`,
//! `/dev/shm`) and System V IPC objects. The next job on that uid could then read that job's
//! environment (its JIT config) or be read by it. So when the last runner of a `run_as` user
//! is torn down, every process of the uid is killed, its crontab and `at` jobs, its files in
//! the temp directories and its IPC objects are removed, the keys in its kernel keyrings (the
//! user keyring outlives every process of the uid: a key one job adds, the next job on the uid
//! reads) are cleared; and a uid that still has processes is not handed out (`uid_busy`).

use std::{
    fs,
    io::{self, BufRead},
    os::unix::fs::MetadataExt,
    path::Path,
};

use nix::{sys::signal::Signal, unistd::Pid};

use super::owned::remove_owned;

/// Shared directories a job may write to that outlive it (POSIX message queues live in
/// `/dev/mqueue`, lock files in `/run/lock`).
const TEMP_DIRS: [&str; 5] = ["/tmp", "/var/tmp", "/dev/shm", "/run/lock", "/dev/mqueue"];
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
    /// Entries removed from the user's home directory (jobs get their own `HOME`; the real
    /// one is cleared so nothing in it reaches the next job).
    pub home_entries: usize,
    /// Keys cleared from the uid's kernel keyrings (user, user session, persistent).
    pub keys: usize,
}

impl Cleared {
    /// Whether anything was left.
    pub fn any(&self) -> bool {
        *self != Cleared::default()
    }
}

/// The processes of `uid` (real, effective or saved): from `/proc` on Linux, from the OS's
/// own listing (`ps`, which asks the kernel) elsewhere (macOS has no `/proc`).
pub fn processes_of(uid: u32) -> Vec<Pid> {
    if cfg!(target_os = "linux") {
        proc_processes_of(uid)
    } else {
        ps_processes_of(uid)
    }
}

/// The processes of `uid` as `ps` lists every process (its real, effective and saved uid
/// and its state, zombies left out). No listing at all (no `ps`) reads as none.
pub fn ps_processes_of(uid: u32) -> Vec<Pid> {
    std::process::Command::new("ps")
        .args(["-A", "-o", "pid=,uid=,ruid=,svuid=,stat="])
        .stdin(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .output()
        .map(|out| parse_ps(&String::from_utf8_lossy(&out.stdout), uid))
        .unwrap_or_default()
}

/// The pids of `uid` in `ps -o pid=,uid=,ruid=,svuid=,stat=` output.
pub fn parse_ps(text: &str, uid: u32) -> Vec<Pid> {
    text.lines()
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            let [pid, e, r, s, state, ..] = f.as_slice() else {
                return None;
            };
            let ours = [e, r, s].iter().any(|id| id.parse() == Ok(uid));
            if !ours || state.starts_with('Z') {
                return None;
            }
            pid.parse().ok().map(Pid::from_raw)
        })
        .collect()
}

/// The processes of `uid` from `/proc`.
fn proc_processes_of(uid: u32) -> Vec<Pid> {
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
    // One clearing of a uid at a time: the keyring helper runs as the uid, and a second
    // clearing's kill loop would take it (and orphan its children) halfway.
    let lock = clearing(uid);
    let _one = lock.lock().unwrap_or_else(|p| p.into_inner());
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
    if let Some(home) = own_home(user, uid) {
        out.home_entries += remove_owned(&home, uid, TEMP_DEPTH, keep);
    }
    out.ipc = remove_ipc(uid);
    out.keys = clear_keyrings(user, uid);
    out
}

/// The lock held while `uid` is cleared.
fn clearing(uid: u32) -> std::sync::Arc<std::sync::Mutex<()>> {
    static LOCKS: std::sync::Mutex<Vec<(u32, std::sync::Arc<std::sync::Mutex<()>>)>> =
        std::sync::Mutex::new(Vec::new());
    let mut locks = LOCKS.lock().unwrap_or_else(|p| p.into_inner());
    if let Some((_, lock)) = locks.iter().find(|(u, _)| *u == uid) {
        return lock.clone();
    }
    let lock = std::sync::Arc::default();
    locks.push((uid, std::sync::Arc::clone(&lock)));
    lock
}

/// Clears the keys of the uid's kernel keyrings, as the uid (a keyring is its owner's: root
/// cannot name another uid's), with keyutils' `keyctl`. Linux only.
const CLEAR_KEYRINGS: &str = r#"command -v keyctl >/dev/null 2>&1 || { echo none; exit 0; }
n=0
for k in @u @us $(keyctl get_persistent @u 2>/dev/null); do
    c=$(keyctl rlist "$k" 2>/dev/null | wc -w)
    n=$((n + c))
    keyctl clear "$k" >/dev/null 2>&1
done
echo "$n""#;

fn clear_keyrings(user: &str, uid: u32) -> usize {
    use std::os::unix::process::CommandExt;
    if !cfg!(target_os = "linux") || crate::weaken::off("keyring") {
        return 0;
    }
    let Some(gid) = nix::unistd::User::from_name(user)
        .ok()
        .flatten()
        .map(|u| u.gid.as_raw())
    else {
        return 0;
    };
    let out = std::process::Command::new("sh")
        .args(["-c", CLEAR_KEYRINGS])
        .uid(uid)
        .gid(gid)
        .current_dir("/")
        .env_clear()
        .env("PATH", "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin")
        .stdin(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .output();
    let said = out
        .map(|o| String::from_utf8_lossy(&o.stdout[..o.stdout.len().min(64)]).trim().to_string())
        .unwrap_or_default();
    if said == "none" {
        static SAID: std::sync::Once = std::sync::Once::new();
        SAID.call_once(|| {
            tracing::warn!("keyctl is not installed: keys a job adds to its user's kernel keyrings are not cleared before the next job on the uid (install keyutils)");
        });
    }
    said.parse().unwrap_or(0)
}

/// The home directory of `user` when it is a directory of its own: owned by `uid`, not `/`.
/// A home shared with others (`/nonexistent`, `/var/empty`, `/`) is never cleared.
fn own_home(user: &str, uid: u32) -> Option<std::path::PathBuf> {
    let home = nix::unistd::User::from_name(user).ok()??.dir;
    let meta = fs::symlink_metadata(&home).ok()?;
    (meta.is_dir() && meta.uid() == uid && home.parent().is_some()).then_some(home)
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

#[cfg(test)]
mod tests {
    use super::*;

    /// What macOS's `ps -A -o pid=,uid=,ruid=,svuid=,stat=` prints: a process of the uid by
    /// any of its three ids counts, a zombie does not.
    #[test]
    fn the_listing_of_ps_names_every_live_process_of_the_uid() {
        let text = "    1     0     0     0 Ss\n  501   502   502   502 S\n  777     0   502     0 R+\n\
                    \x20 778   502   502   502 Z\n  779     0     0   502 S\n  780   503   503   503 S\n";
        let pids: Vec<i32> = parse_ps(text, 502).iter().map(|p| p.as_raw()).collect();
        assert_eq!(pids, [501, 777, 779]);
        assert!(parse_ps("garbage\n", 502).is_empty());
    }

    /// Where both exist (here), `ps` and `/proc` agree that this process is its uid's: the
    /// path macOS takes is the one tested against the kernel's own answer.
    #[test]
    fn ps_and_proc_agree_on_this_process() {
        let uid = nix::unistd::getuid().as_raw();
        let me = Pid::this();
        assert!(proc_processes_of(uid).contains(&me));
        if std::process::Command::new("ps")
            .arg("-p1")
            .output()
            .is_err()
        {
            return crate::test_support::skip("the ps listing", "there is no ps");
        }
        assert!(ps_processes_of(uid).contains(&me));
        assert!(!ps_processes_of(4_000_123).contains(&me));
    }
}
