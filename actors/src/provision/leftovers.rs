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
//!
//! Where these live differs by OS ([`Places::of`]): on macOS the temp directories are
//! `/private/tmp` and `/private/var/tmp` plus the user's own `/var/folders/…/{T,C}` (its
//! `$TMPDIR` and cache), cron and at keep their files under `/usr/lib/cron`, a job's launchd
//! agents (which would come back after every kill) are booted out with the user's launchd
//! domains first, IPC objects are listed by `ipcs`, and there are no kernel keyrings. The home
//! directory is cleared on both (on macOS that takes `~/Library/Caches`, the `LaunchAgents` a
//! job installed and its keychains).

use std::{
    fs,
    io::{self, BufRead},
    os::unix::fs::MetadataExt,
    path::Path,
};

use nix::{sys::signal::Signal, unistd::Pid};

use super::owned::remove_owned;
use crate::config::HostOs;

/// How deep the temp directories are searched for the uid's entries below others'.
const TEMP_DEPTH: usize = 4;

/// Where a uid's leftovers live on a host of one OS.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Places {
    /// Shared directories a job may write to that outlive it, searched for the uid's
    /// entries (real paths: a symlinked `/tmp` is not followed).
    pub temp_dirs: &'static [&'static str],
    /// Where cron keeps a user's crontab, a file named after the user.
    pub crontabs: &'static [&'static str],
    /// Where at keeps its jobs, files owned by the uid.
    pub at_jobs: &'static [&'static str],
    /// The root of the per-user temp and cache directories (macOS's `/var/folders`).
    pub user_folders: Option<&'static str>,
    /// launchd's per-user domains are booted out before the kill (macOS).
    pub launchd: bool,
    /// The uid's kernel keyrings are cleared (Linux).
    pub keyrings: bool,
    /// Where System V IPC objects are listed.
    pub ipc: IpcListing,
}

/// Where the System V IPC objects of a host are listed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IpcListing {
    /// `/proc/sysvipc/{shm,msg,sem}`, by uid (Linux).
    Proc,
    /// `ipcs -m -q -s`, by owner name (macOS and the BSDs).
    Ipcs,
}

impl Places {
    /// The places of a host of `os`.
    pub fn of(os: HostOs) -> Places {
        match os {
            HostOs::Linux => Places {
                // POSIX message queues live in `/dev/mqueue`, lock files in `/run/lock`.
                temp_dirs: &["/tmp", "/var/tmp", "/dev/shm", "/run/lock", "/dev/mqueue"],
                // Debian's and Red Hat's layouts.
                crontabs: &["/var/spool/cron/crontabs", "/var/spool/cron"],
                at_jobs: &["/var/spool/cron/atjobs", "/var/spool/at"],
                user_folders: None,
                launchd: false,
                keyrings: true,
                ipc: IpcListing::Proc,
            },
            HostOs::Macos => Places {
                // `/tmp` and `/var/tmp` are links to these.
                temp_dirs: &["/private/tmp", "/private/var/tmp"],
                // `/usr/lib/cron` links to `/private/var/at`.
                crontabs: &["/private/var/at/tabs"],
                at_jobs: &["/private/var/at/jobs"],
                user_folders: Some("/private/var/folders"),
                launchd: true,
                keyrings: false,
                ipc: IpcListing::Ipcs,
            },
            HostOs::Other => Places {
                temp_dirs: &["/tmp", "/var/tmp"],
                crontabs: &["/var/cron/tabs"],
                at_jobs: &["/var/at/jobs"],
                user_folders: None,
                launchd: false,
                keyrings: false,
                ipc: IpcListing::Ipcs,
            },
        }
    }
}

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
    let places = Places::of(HostOs::this());
    // A launchd agent the job loaded would start again after each kill.
    if places.launchd {
        out.schedules += boot_out_launchd(uid);
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
    for dir in places.crontabs {
        if fs::remove_file(Path::new(dir).join(user)).is_ok() {
            out.schedules += 1;
        }
    }
    for dir in places.at_jobs {
        out.schedules += remove_owned(Path::new(dir), uid, 0, keep);
    }
    for dir in places.temp_dirs {
        out.temp_entries += remove_owned(Path::new(dir), uid, TEMP_DEPTH, keep);
    }
    if let Some(root) = places.user_folders {
        for dir in user_folders(Path::new(root), uid) {
            out.temp_entries += remove_owned(&dir, uid, TEMP_DEPTH, keep);
        }
    }
    if let Some(home) = own_home(user, uid) {
        out.home_entries += remove_owned(&home, uid, TEMP_DEPTH, keep);
    }
    out.ipc = match places.ipc {
        IpcListing::Proc => remove_ipc(uid),
        IpcListing::Ipcs => remove_ipcs(user),
    };
    if places.keyrings {
        out.keys = clear_keyrings(user, uid);
    }
    out
}

/// The uid's own temp and cache directories under `root` (macOS's `/var/folders/xx/yyyy/`,
/// a directory per user two levels down, owned by the uid): its `T` (`$TMPDIR`) and `C`
/// (caches). Their contents go, not they: the system made them and expects them.
pub fn user_folders(root: &Path, uid: u32) -> Vec<std::path::PathBuf> {
    let mut found = Vec::new();
    let Ok(level1) = fs::read_dir(root) else {
        return found;
    };
    for a in level1.flatten().filter(|e| e.file_type().is_ok_and(|t| t.is_dir())) {
        let Ok(level2) = fs::read_dir(a.path()) else {
            continue;
        };
        for b in level2.flatten() {
            let owned = fs::symlink_metadata(b.path()).is_ok_and(|m| m.is_dir() && m.uid() == uid);
            if owned {
                found.extend(["T", "C"].map(|sub| b.path().join(sub)));
            }
        }
    }
    found
}

/// Boots out the uid's launchd domains (`user/UID`, `gui/UID`): every agent a job loaded
/// stops and is not started again. How many of the two were there.
fn boot_out_launchd(uid: u32) -> usize {
    ["user", "gui"]
        .into_iter()
        .filter(|domain| {
            std::process::Command::new("launchctl")
                .args(["bootout", &format!("{domain}/{uid}")])
                .stdin(std::process::Stdio::null())
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
        })
        .count()
}

/// Removes the System V IPC objects `user` owns, as `ipcs` lists them (macOS, the BSDs).
fn remove_ipcs(user: &str) -> usize {
    let Ok(out) = std::process::Command::new("ipcs")
        .args(["-m", "-q", "-s"])
        .stdin(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .output()
    else {
        return 0;
    };
    let text = String::from_utf8_lossy(&out.stdout[..out.stdout.len().min(1 << 20)]);
    ipcs_owned_by(&text, user)
        .into_iter()
        .filter(|(flag, id)| ipcrm(flag, *id))
        .count()
}

/// The objects of `user` in BSD `ipcs` output (`T ID KEY MODE OWNER GROUP` rows under a
/// heading per kind): each as `ipcrm`'s flag and its id.
pub fn ipcs_owned_by(text: &str, user: &str) -> Vec<(&'static str, i32)> {
    text.lines()
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            let [kind, id, _key, _mode, owner, ..] = f.as_slice() else {
                return None;
            };
            let flag = match *kind {
                "m" => "-m",
                "q" => "-q",
                "s" => "-s",
                _ => return None,
            };
            (*owner == user).then_some(())?;
            Some((flag, id.parse().ok()?))
        })
        .collect()
}

/// `ipcrm FLAG ID`; whether it went (the library forbids unsafe, and libc is all there is).
fn ipcrm(flag: &str, id: i32) -> bool {
    std::process::Command::new("ipcrm")
        .args([flag, &id.to_string()])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
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
/// cannot name another uid's), with keyutils' `keyctl`. Linux's (see [`Places::keyrings`]).
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
    if crate::weaken::off("keyring") {
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
            let flag = match kind {
                "shm" => "-m",
                "msg" => "-q",
                _ => "-s",
            };
            removed += usize::from(ipcrm(flag, id));
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
    #[cfg(target_os = "linux")]
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

    /// What macOS's `ipcs -m -q -s` prints: only the user's rows, each with its kind's flag.
    #[test]
    fn the_ipcs_listing_names_the_user_s_objects_by_kind() {
        let text = "IPC status from <running system> as of Sat Dec  5 21:00:00 UTC 2026\n\
                    T     ID     KEY        MODE       OWNER    GROUP\n\
                    Message Queues:\n\
                    q  65536 0x0000162e --rw-------  runner1    staff\n\
                    \n\
                    Shared Memory:\n\
                    m  65537 0x0100075d --rw-------  runner1    staff\n\
                    m  65538 0x0100075e --rw-------     root    wheel\n\
                    m  65539 0x0100075f --rw-------  runner10   staff\n\
                    \n\
                    Semaphores:\n\
                    s  65540 0x00000000 --ra-------  runner1    staff\n";
        assert_eq!(
            ipcs_owned_by(text, "runner1"),
            [("-q", 65536), ("-m", 65537), ("-s", 65540)]
        );
        assert!(ipcs_owned_by(text, "nobody").is_empty());
        assert!(ipcs_owned_by("garbage\nm x y z runner1\n", "runner1").is_empty());
    }

    /// A user's `/var/folders/xx/yyyy/` is found by its owner, two levels down: its `T` and
    /// `C` are cleared; another uid's folder is not named.
    #[test]
    fn the_user_s_own_folders_are_found_by_owner_two_levels_down() {
        let root = tempfile::tempdir().unwrap();
        let mine = root.path().join("zz/abc123_xyz");
        fs::create_dir_all(mine.join("T")).unwrap();
        fs::create_dir_all(root.path().join("qq")).unwrap();
        let uid = nix::unistd::geteuid().as_raw();
        assert_eq!(user_folders(root.path(), uid), [mine.join("T"), mine.join("C")]);
        assert!(user_folders(root.path(), uid + 1).is_empty());
        assert!(user_folders(&root.path().join("none"), uid).is_empty());
        // What the clearing does with them: the contents go, the folder stays.
        fs::write(mine.join("T/left.txt"), "secret").unwrap();
        let cleared: usize = user_folders(root.path(), uid)
            .iter()
            .map(|d| remove_owned(d, uid, TEMP_DEPTH, &[]))
            .sum();
        assert_eq!(cleared, 1);
        assert!(mine.join("T").is_dir() && !mine.join("T/left.txt").exists());
    }

    /// Each OS's places: Linux keeps what it had; a Mac uses the real paths behind its links,
    /// its launchd domains and `ipcs`, and has no keyrings.
    #[test]
    fn each_host_os_has_its_own_places() {
        let linux = Places::of(HostOs::Linux);
        assert!(linux.temp_dirs.contains(&"/dev/shm") && linux.keyrings && !linux.launchd);
        assert_eq!(linux.ipc, IpcListing::Proc);
        assert_eq!(linux.user_folders, None);
        let mac = Places::of(HostOs::Macos);
        assert_eq!(mac.temp_dirs, ["/private/tmp", "/private/var/tmp"]);
        assert!(mac.launchd && !mac.keyrings);
        assert_eq!(mac.ipc, IpcListing::Ipcs);
        assert_eq!(mac.user_folders, Some("/private/var/folders"));
        assert_eq!(mac.crontabs, ["/private/var/at/tabs"]);
        // Every place is absolute and none is a link target's link (`/tmp` on a Mac).
        for os in [HostOs::Linux, HostOs::Macos, HostOs::Other] {
            let p = Places::of(os);
            for dir in p.temp_dirs.iter().chain(p.crontabs).chain(p.at_jobs) {
                assert!(dir.starts_with('/'), "{dir}");
            }
        }
    }
}
