//! One `run_as` user, one job, across the whole host.
//!
//! Pools may list the same users (check-config warns). A user is handed to a runner only when
//! nothing on the host has it: no hold (a runner of any pool from its allocation to the end of
//! its teardown, warm directories included), no job directory it owns in any process pool's
//! work root (what survives a restart), and no live process (a leftover the teardown could not
//! end, or something else the user runs). A pool with a single user shared by its own
//! concurrent runners (warned about) still never shares it with another pool.
//!
//! The decision is [`pick`]; the holds are one table for the daemon (every process pool's
//! backend takes from it), keyed by runner directory name, which is unique on the host.

use std::{
    collections::BTreeMap,
    path::PathBuf,
    sync::{Mutex, MutexGuard},
};

use crate::config::PoolName;

/// What the host says of one candidate user, besides the runner asking.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Seen {
    /// Pools whose runners (or warm directories) hold the user now.
    pub held_by: Vec<PoolName>,
    /// Pools with a job directory of the user in their work root.
    pub dirs_of: Vec<PoolName>,
    /// The user runs a process.
    pub busy: bool,
    /// A claimed job's runner waits for the user.
    pub wanted: bool,
}

/// The first of `users` free for a runner of `pool`, or why none is. `shared`: the pool's
/// single user serves all of its runners, so its own holds, directories and processes do not
/// count (only another pool's do). `warm`: the runner is a warm directory, which never takes a
/// user a claimed job's runner waits for.
pub(crate) fn pick(
    pool: &PoolName,
    shared: bool,
    warm: bool,
    users: &[(String, Seen)],
) -> Result<usize, UserTaken> {
    let mut why = Vec::new();
    for (i, (user, seen)) in users.iter().enumerate() {
        let counts = |p: &PoolName| !shared || p != pool;
        let reason = if let Some(p) = seen.held_by.iter().find(|p| counts(p)) {
            Busy::Job(p.clone())
        } else if let Some(p) = seen.dirs_of.iter().find(|p| counts(p)) {
            Busy::Directory(p.clone())
        } else if seen.busy && !shared {
            Busy::Process
        } else if seen.wanted && warm {
            Busy::Wanted
        } else {
            return Ok(i);
        };
        why.push((user.clone(), reason));
    }
    Err(UserTaken::All(why))
}

/// What keeps a user from a runner.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Busy {
    /// It runs a job of this pool.
    Job(PoolName),
    /// It owns a job directory of this pool.
    Directory(PoolName),
    /// It runs a process no runner of it started.
    Process,
    /// A claimed job's runner waits for it (a warm directory's view).
    Wanted,
}

impl std::fmt::Display for Busy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Busy::Job(p) => write!(f, "runs a job of pool {p}"),
            Busy::Directory(p) => write!(f, "owns a job directory of pool {p}"),
            Busy::Process => f.write_str("still runs a process"),
            Busy::Wanted => f.write_str("is waited for by a claimed job's runner"),
        }
    }
}

/// Why no user (or not this one) can serve a runner now.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum UserTaken {
    /// Every user of the pool is taken, each for its reason.
    #[error(
        "each of the {} run_as users is taken ({}): a user serves one job at a time on this \
         host, whatever pool lists it",
        .0.len(),
        .0.iter().map(|(u, why)| format!("{u} {why}")).collect::<Vec<_>>().join("; ")
    )]
    All(Vec<(String, Busy)>),
    /// The user given to a directory is not its alone any more.
    #[error("uid {0} also {1}")]
    NotAlone(u32, Busy),
}

/// A runner's hold on its user.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Hold {
    uid: u32,
    pool: PoolName,
}

static HOLDS: Mutex<BTreeMap<String, Hold>> = Mutex::new(BTreeMap::new());
/// The uids each waiting runner (of a claimed job) could take, by runner directory name.
static WANTS: Mutex<BTreeMap<String, Vec<u32>>> = Mutex::new(BTreeMap::new());

fn holds() -> MutexGuard<'static, BTreeMap<String, Hold>> {
    HOLDS
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Where one process pool keeps its runners' directories.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkRoot {
    /// The pool.
    pub pool: PoolName,
    /// Its `work_root`.
    pub dir: PathBuf,
    /// Its runners' name prefix (what its job directories are called).
    pub prefix: String,
}

/// One user of a pool's `run_as`: its name and uid.
#[derive(Debug, Clone)]
pub(crate) struct Candidate {
    /// The user's name.
    pub name: String,
    /// Its uid.
    pub uid: u32,
}

fn wants() -> MutexGuard<'static, BTreeMap<String, Vec<u32>>> {
    WANTS.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// A claimed job's runner waiting for one of its users: while it lives, warm directories take
/// none of them and give up the one they hold ([`wanted`]), so an idle warm directory never
/// keeps a job waiting.
#[derive(Debug)]
pub(crate) struct Want(String);

impl Want {
    /// Runner directory `name` waits for any of `users`.
    pub(crate) fn new(name: &str, users: &[Candidate]) -> Self {
        wants().insert(name.to_string(), users.iter().map(|u| u.uid).collect());
        Want(name.to_string())
    }
}

impl Drop for Want {
    fn drop(&mut self) {
        wants().remove(&self.0);
    }
}

/// Whether a claimed job's runner waits for `uid`.
pub(crate) fn wanted(uid: u32) -> bool {
    wants().values().any(|uids| uids.contains(&uid))
}

/// Takes a user for runner directory `name` of `pool` from `users` (in order), looking at
/// every pool's `roots`: the user's name, held until [`release`]`(name)`. `warm`: for a warm
/// directory, which leaves alone the users a claimed job's runner waits for.
pub(crate) fn take(
    pool: &PoolName,
    name: &str,
    users: &[Candidate],
    roots: &[WorkRoot],
    warm: bool,
) -> Result<String, UserTaken> {
    let shared = users.len() == 1;
    let mut table = holds();
    let seen: Vec<(String, Seen)> = users
        .iter()
        .map(|u| (u.name.clone(), look(&table, name, u.uid, roots, !shared)))
        .collect();
    let i = pick(pool, shared, warm, &seen)?;
    table.insert(
        name.to_string(),
        Hold {
            uid: users[i].uid,
            pool: pool.clone(),
        },
    );
    Ok(users[i].name.clone())
}

/// Whether directory `name`'s user (`uid`) is still its alone, looked at again at the claim
/// (a warm directory was given its user before): no other hold, no other job directory, no
/// process. Not for a pool's single shared user.
pub(crate) fn still_alone(name: &str, uid: u32, roots: &[WorkRoot]) -> Result<(), UserTaken> {
    let table = holds();
    let seen = look(&table, name, uid, roots, true);
    let busy = match (seen.held_by.first(), seen.dirs_of.first(), seen.busy) {
        (Some(p), _, _) => Busy::Job(p.clone()),
        (_, Some(p), _) => Busy::Directory(p.clone()),
        (_, _, true) => Busy::Process,
        _ => return Ok(()),
    };
    Err(UserTaken::NotAlone(uid, busy))
}

/// Holds `uid` for directory `name` of `pool` (a teardown of a runner from before a restart
/// holds its user while it clears it). A hold `name` already has is kept.
pub(crate) fn hold(pool: &PoolName, name: &str, uid: u32) {
    holds().entry(name.to_string()).or_insert(Hold {
        uid,
        pool: pool.clone(),
    });
}

/// Moves the hold of directory `from` to `to` (a warm directory renamed at its claim).
pub(crate) fn rename(from: &str, to: &str) {
    let mut table = holds();
    if let Some(h) = table.remove(from) {
        table.insert(to.to_string(), h);
    }
}

/// Ends directory `name`'s hold.
pub(crate) fn release(name: &str) {
    holds().remove(name);
}

/// Whether anything but directory `name` holds `uid` or has a job directory of it.
pub(crate) fn others_have(name: &str, uid: u32, roots: &[WorkRoot]) -> bool {
    let seen = look(&holds(), name, uid, roots, false);
    !seen.held_by.is_empty() || !seen.dirs_of.is_empty()
}

fn look(
    table: &BTreeMap<String, Hold>,
    name: &str,
    uid: u32,
    roots: &[WorkRoot],
    processes: bool,
) -> Seen {
    let held_by = table
        .iter()
        .filter(|(n, h)| n.as_str() != name && h.uid == uid)
        .map(|(_, h)| h.pool.clone())
        .collect();
    let dirs_of = roots
        .iter()
        .filter(|root| owns_dir_in(root, name, uid))
        .map(|root| root.pool.clone())
        .collect();
    Seen {
        held_by,
        dirs_of,
        busy: processes && super::leftovers::uid_busy(uid),
        wanted: wanted(uid),
    }
}

fn owns_dir_in(root: &WorkRoot, name: &str, uid: u32) -> bool {
    let Ok(entries) = std::fs::read_dir(&root.dir) else {
        return false;
    };
    entries.flatten().any(|entry| {
        let file = entry.file_name();
        let file = file.to_string_lossy();
        file != name
            && file.starts_with(&root.prefix)
            && entry
                .metadata()
                .is_ok_and(|m| std::os::unix::fs::MetadataExt::uid(&m) == uid)
    })
}

impl super::process::ProcessBackend {
    /// After the last runner of a `run_as` user: whatever the uid still runs or left (see
    /// [`super::leftovers`]) goes before the uid runs another job. Not while another runner of
    /// the same user lives (a shared `run_as` user), nor for the daemon's own uid.
    pub(super) async fn clear_leftovers(&self, name: &str, uid: u32) {
        let Some(user) = self
            .s
            .run_as
            .iter()
            .find(|u| self.user_named(u).is_ok_and(|x| x.uid.as_raw() == uid))
            .cloned()
        else {
            return;
        };
        // Another runner of the uid (a pool's shared user): not cleared under it. This one's
        // hold keeps the user from a new runner until the clearing is done.
        if others_have(name, uid, &self.s.peers) {
            return;
        }
        hold(&self.s.pool, name, uid);
        // Every pool's job directories are left alone (a work root may be under /tmp).
        let roots: Vec<std::path::PathBuf> = self.s.peers.iter().map(|r| r.dir.clone()).collect();
        let who = user.clone();
        let cleared = tokio::task::spawn_blocking(move || {
            let keep: Vec<&std::path::Path> = roots.iter().map(std::path::PathBuf::as_path).collect();
            super::leftovers::clear(uid, &who, &keep)
        })
        .await
        .unwrap_or_default();
        if cleared.any() {
            tracing::info!(runner = %name, uid, processes = cleared.processes, temp_entries = cleared.temp_entries, schedules = cleared.schedules, ipc = cleared.ipc, home_entries = cleared.home_entries, keys = cleared.keys, "cleared what the job's user left behind");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool(name: &str) -> PoolName {
        PoolName::from(name)
    }

    fn seen(held_by: &[&str], dirs_of: &[&str], busy: bool) -> Seen {
        Seen {
            held_by: held_by.iter().map(|p| pool(p)).collect(),
            dirs_of: dirs_of.iter().map(|p| pool(p)).collect(),
            busy,
            wanted: false,
        }
    }

    #[test]
    fn a_user_another_pool_holds_is_never_handed_out() {
        let a = pool("a");
        let users = [
            ("u1".to_string(), seen(&["b"], &[], false)),
            ("u2".to_string(), seen(&[], &[], false)),
        ];
        assert_eq!(pick(&a, false, false, &users), Ok(1));
        let err = pick(&a, false, false, &users[..1]).unwrap_err();
        assert_eq!(
            err,
            UserTaken::All(vec![("u1".into(), Busy::Job(pool("b")))])
        );
        assert!(err.to_string().contains("u1 runs a job of pool b"), "{err}");
    }

    #[test]
    fn a_directory_or_a_process_of_the_user_anywhere_keeps_it_taken() {
        let a = pool("a");
        for taken in [
            seen(&[], &["b"], false),
            seen(&[], &["a"], false),
            seen(&[], &[], true),
        ] {
            let users = [
                ("u1".to_string(), taken.clone()),
                ("u2".to_string(), seen(&[], &[], false)),
            ];
            assert_eq!(pick(&a, false, false, &users), Ok(1), "{taken:?}");
        }
        let err = pick(&a, false, false, &[("u1".into(), seen(&["a"], &["b"], true))]).unwrap_err();
        assert!(
            err.to_string()
                .contains("each of the 1 run_as users is taken"),
            "{err}"
        );
    }

    #[test]
    fn a_pools_single_shared_user_is_shared_only_within_the_pool() {
        let a = pool("a");
        let own = [("u1".to_string(), seen(&["a", "a"], &["a"], true))];
        assert_eq!(pick(&a, true, false, &own), Ok(0));
        let other = [("u1".to_string(), seen(&["a", "b"], &[], true))];
        assert_eq!(
            pick(&a, true, false, &other),
            Err(UserTaken::All(vec![("u1".into(), Busy::Job(pool("b")))]))
        );
        let dir = [("u1".to_string(), seen(&[], &["b"], false))];
        assert!(pick(&a, true, false, &dir).is_err());
    }

    #[test]
    fn holds_follow_a_warm_directory_renamed_and_end_at_release() {
        // uids no test user has, so no other test's holds meet these.
        let (a, b) = (pool("a"), pool("b"));
        let users = [
            Candidate {
                name: "x1".into(),
                uid: 4_000_001,
            },
            Candidate {
                name: "x2".into(),
                uid: 4_000_002,
            },
        ];
        assert_eq!(take(&a, "warm-a-1", &users, &[], false).unwrap(), "x1");
        assert_eq!(take(&b, "run-b-1", &users, &[], false).unwrap(), "x2");
        assert!(take(&b, "run-b-2", &users, &[], false).is_err());
        rename("warm-a-1", "run-a-1");
        assert!(others_have("run-b-1", 4_000_001, &[]));
        assert!(still_alone("run-a-1", 4_000_001, &[]).is_ok());
        release("run-a-1");
        assert_eq!(take(&b, "run-b-2", &users, &[], false).unwrap(), "x1");
        release("run-b-1");
        release("run-b-2");
        assert!(!others_have("none", 4_000_001, &[]));
    }

    #[test]
    fn a_user_a_claimed_jobs_runner_waits_for_is_left_to_it_by_warm_directories() {
        let a = pool("a");
        let mut waited_for = seen(&[], &[], false);
        waited_for.wanted = true;
        let users = [
            ("u1".to_string(), waited_for),
            ("u2".to_string(), seen(&[], &[], false)),
        ];
        assert_eq!(pick(&a, false, true, &users), Ok(1));
        assert_eq!(pick(&a, false, false, &users), Ok(0));
        assert_eq!(
            pick(&a, false, true, &users[..1]),
            Err(UserTaken::All(vec![("u1".into(), Busy::Wanted)]))
        );

        // The registry: a wait lasts as long as its guard.
        let users = [Candidate {
            name: "y1".into(),
            uid: 4_000_011,
        }];
        assert!(!wanted(4_000_011));
        let want = Want::new("run-c-1", &users);
        assert!(wanted(4_000_011));
        assert!(take(&a, "warm-c-1", &users, &[], true).is_err());
        drop(want);
        assert!(!wanted(4_000_011));
        assert_eq!(take(&a, "warm-c-1", &users, &[], true).unwrap(), "y1");
        release("warm-c-1");
    }
}
