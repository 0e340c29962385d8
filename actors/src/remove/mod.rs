//! Removing a directory tree a job could have shaped, in bounded time, memory and stack.
//!
//! A job's directory, a VM's run directory and what a `run_as` user left in `/tmp` are trees
//! whose shape the job chose: 15,000 nested directories, a million files in one, a directory
//! swapped for a symlink while root walks it, a mount point. A recursive removal (the one
//! `std::fs::remove_dir_all` does) puts one frame per level on a 2 MiB blocking thread and
//! aborts the daemon, at teardown and again at every start-up's reaping. So the walk here keeps
//! its depth on the heap, never on the stack:
//! - every directory is opened relative to its parent's descriptor with `O_NOFOLLOW` and its
//!   entries are removed with `unlinkat` there, so a swapped-in symlink is removed, never entered;
//! - only the deepest [`WINDOW`] levels hold a descriptor; a level above is opened again
//!   through `..` of its child, and only if it is still the directory (device and inode) that
//!   was entered, so a tree moved mid-walk stops the walk instead of leading it elsewhere;
//! - names are read in batches, so a wide directory costs no more memory than a narrow one,
//!   and the deep levels of a tree keep at most one name each;
//! - it never crosses into another filesystem or a mount point (bind mounts included);
//! - it stops at a deadline, having removed what it could: the caller reports the rest and
//!   tries again later, never in a loop.

use std::{
    collections::HashSet,
    ffi::{OsStr, OsString},
    os::{
        fd::{AsFd, OwnedFd},
        unix::ffi::OsStrExt,
    },
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use nix::{
    dir::{Dir, Type},
    errno::Errno,
    fcntl::{AtFlags, OFlag},
    sys::stat::{FileStat, Mode, SFlag},
    unistd::UnlinkatFlags,
};


/// Opens directory `name` in `parent` without following a link (`ELOOP` or `ENOTDIR` if it
/// is one).
pub(crate) fn open_dir_at(parent: impl AsFd, name: &OsStr) -> nix::Result<OwnedFd> {
    nix::fcntl::openat(
        parent,
        name,
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
}

/// How long one teardown may spend removing a tree before it reports what is left.
pub const TEARDOWN_BUDGET: Duration = Duration::from_secs(30);
/// How many levels of the walk hold an open descriptor (the deepest ones).
const WINDOW: usize = 32;
/// Names read from a directory per pass, near the top of the tree.
const BATCH: usize = 256;
/// Below this depth, a pass reads one subdirectory's name (a deep tree costs one name a level).
const WIDE_DEPTH: usize = 64;
/// Entries that refused removal (a mount point, say) the walk remembers; past this it stops.
const MAX_REFUSED: usize = 4096;

/// Why a tree is (partly) still there.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Unremoved {
    /// The deadline came first.
    #[error(
        "{path}: not removed within {budget_s} s ({removed} entries removed so far); the rest is \
         removed at the next try"
    )]
    TimedOut {
        /// The tree.
        path: String,
        /// Entries removed before the deadline.
        removed: u64,
        /// The time it had.
        budget_s: u64,
    },
    /// A directory of it was moved while it was being removed (the walk stopped there).
    #[error("{path}: a directory in it moved while it was being removed ({removed} entries removed)")]
    Moved {
        /// The tree.
        path: String,
        /// Entries removed.
        removed: u64,
    },
    /// Something in it refused removal: a mount point, another filesystem, an error.
    #[error("{path}: {what} ({removed} entries removed)")]
    Refused {
        /// The tree.
        path: String,
        /// The first entry refused and why.
        what: String,
        /// Entries removed.
        removed: u64,
    },
}

impl Unremoved {
    /// Entries removed before it stopped.
    pub fn removed(&self) -> u64 {
        match self {
            Unremoved::TimedOut { removed, .. }
            | Unremoved::Moved { removed, .. }
            | Unremoved::Refused { removed, .. } => *removed,
        }
    }
}

/// Removes `path` (a directory with everything in it, or a file or symlink) within `budget`;
/// a path that is not there is removed already. Returns how many entries went.
pub fn remove_tree(path: &Path, budget: Duration) -> Result<u64, Unremoved> {
    let shown = || path.display().to_string();
    let (Some(parent), Some(name)) = (path.parent(), path.file_name()) else {
        return Err(Unremoved::Refused {
            path: shown(),
            what: "not a removable path".into(),
            removed: 0,
        });
    };
    let parent = if parent.as_os_str().is_empty() {
        Path::new(".")
    } else {
        parent
    };
    let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC;
    let parent_fd = match nix::fcntl::open(parent, flags, Mode::empty()) {
        Ok(fd) => fd,
        Err(Errno::ENOENT) => return Ok(0),
        Err(e) => {
            return Err(Unremoved::Refused {
                path: shown(),
                what: format!("cannot open {}: {e}", parent.display()),
                removed: 0,
            });
        }
    };
    let real_parent = std::fs::canonicalize(parent).unwrap_or_else(|_| parent.to_path_buf());
    remove_at(&parent_fd, &real_parent.join(name), name, Instant::now() + budget)
}

/// Removes entry `name` of directory `parent` (whose path is `path`'s parent; `path` names it
/// in errors and finds the mount points below it) before `deadline`.
pub fn remove_at(
    parent: &OwnedFd,
    path: &Path,
    name: &OsStr,
    deadline: Instant,
) -> Result<u64, Unremoved> {
    let top = match stat_at(parent, name) {
        Ok(st) => st,
        Err(Errno::ENOENT) => return Ok(0),
        Err(e) => return Err(refused(path, format!("cannot look at it: {e}"), 0)),
    };
    if !is_dir(&top) {
        return match nix::unistd::unlinkat(parent, name, UnlinkatFlags::NoRemoveDir) {
            Ok(()) | Err(Errno::ENOENT) => Ok(1),
            Err(e) => Err(refused(path, e.to_string(), 0)),
        };
    }
    let mut walk = Walk {
        path,
        deadline,
        started: Instant::now(),
        dev: file_id(&top).0,
        mounts: mount_points_below(path),
        removed: 0,
        refused: 0,
        first_refusal: None,
    };
    walk.run(parent, name)
}

/// One directory on the walk's stack.
#[derive(Debug)]
struct Level {
    /// Open while the level is among the deepest [`WINDOW`].
    dir: Option<Dir>,
    /// Device and inode, to know it again when reopened through `..`.
    id: (u64, u64),
    /// Its name in its parent.
    name: OsString,
    /// Subdirectories found and not yet entered.
    pending: Vec<OsString>,
    /// Entries that stay (refused); never tried again by this walk.
    skip: HashSet<OsString>,
}

impl Level {
    fn fd(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        self.dir.as_ref().map(AsFd::as_fd)
    }
}

/// What one pass over a directory found.
struct Pass {
    files: Vec<OsString>,
    dirs: Vec<OsString>,
}

#[derive(Debug)]
struct Walk<'a> {
    path: &'a Path,
    deadline: Instant,
    started: Instant,
    /// The tree's device: the walk never leaves it.
    dev: u64,
    /// Mount points below the tree (device and inode of what is mounted there).
    mounts: HashSet<(u64, u64)>,
    removed: u64,
    refused: usize,
    first_refusal: Option<String>,
}

impl Walk<'_> {
    fn run(&mut self, parent: &OwnedFd, name: &OsStr) -> Result<u64, Unremoved> {
        let first = match self.enter(parent.as_fd(), name) {
            Ok(Some(level)) => level,
            Ok(None) => return self.outcome(),
            Err(e) => return Err(e),
        };
        let mut stack = vec![first];
        while let Some(top) = stack.last_mut() {
            if Instant::now() >= self.deadline {
                return Err(Unremoved::TimedOut {
                    path: self.path.display().to_string(),
                    removed: self.removed,
                    budget_s: self.deadline.duration_since(self.started).as_secs(),
                });
            }
            if let Some(sub) = top.pending.pop() {
                let fd = top.fd().expect("the deepest level is open");
                match self.enter(fd, &sub) {
                    Ok(Some(level)) => {
                        stack.push(level);
                        let len = stack.len();
                        if len > WINDOW {
                            stack[len - 1 - WINDOW].dir = None;
                        }
                    }
                    Ok(None) => {}
                    Err(Unremoved::Refused { what, .. }) => {
                        top.skip.insert(sub);
                        self.refuse(what)?;
                    }
                    Err(e) => return Err(e),
                }
                continue;
            }
            let batch = if stack.len() < WIDE_DEPTH { BATCH } else { 1 };
            let top = stack.last_mut().expect("not empty");
            let pass = read_pass(top, batch);
            if !pass.files.is_empty() || !pass.dirs.is_empty() {
                let fd = top.fd().expect("the deepest level is open");
                let (mut dirs, mut stays) = (pass.dirs, Vec::new());
                for file in pass.files {
                    match nix::unistd::unlinkat(fd, file.as_os_str(), UnlinkatFlags::NoRemoveDir) {
                        Ok(()) => self.removed += 1,
                        Err(Errno::ENOENT) => {}
                        // A directory after all (the entry's type was not told, or it changed):
                        // entered next.
                        Err(Errno::EISDIR | Errno::EPERM) if is_dir_at(fd, &file) => dirs.push(file),
                        Err(e) => stays.push((format!("{}: {e}", shown(&file)), file)),
                    }
                }
                for (what, file) in stays {
                    top.skip.insert(file);
                    self.refuse(what)?;
                }
                top.pending.extend(dirs);
                continue;
            }
            // Empty but for what refused: remove it from its parent.
            let done = stack.pop().expect("not empty");
            let parent_fd = match stack.last_mut() {
                None => parent.as_fd(),
                Some(up) => {
                    if up.dir.is_none() {
                        up.dir = Some(self.reopen_parent(&done, up.id)?);
                    }
                    up.fd().expect("just opened")
                }
            };
            match nix::unistd::unlinkat(parent_fd, done.name.as_os_str(), UnlinkatFlags::RemoveDir)
            {
                Ok(()) => self.removed += 1,
                Err(Errno::ENOENT) => {}
                Err(e) => {
                    let what = if done.skip.is_empty() {
                        format!("{}: {e}", shown(&done.name))
                    } else {
                        format!("{} keeps what refused removal", shown(&done.name))
                    };
                    if let Some(up) = stack.last_mut() {
                        up.skip.insert(done.name.clone());
                    }
                    self.refuse(what)?;
                }
            }
        }
        self.outcome()
    }

    /// Opens directory `name` in `parent` as a new level; `None` when it is gone or was not a
    /// directory (then removed as the file or link it is).
    fn enter(
        &mut self,
        parent: std::os::fd::BorrowedFd<'_>,
        name: &OsStr,
    ) -> Result<Option<Level>, Unremoved> {
        let fd = match open_dir_at(parent, name) {
            Ok(fd) => fd,
            Err(Errno::ENOENT) => return Ok(None),
            // Swapped for a symlink or a file since it was listed: that is removed instead.
            Err(Errno::ELOOP | Errno::ENOTDIR) => {
                match nix::unistd::unlinkat(parent, name, UnlinkatFlags::NoRemoveDir) {
                    Ok(()) => self.removed += 1,
                    Err(Errno::ENOENT) => {}
                    Err(e) => return Err(refused(self.path, format!("{}: {e}", shown(name)), 0)),
                }
                return Ok(None);
            }
            Err(e) => return Err(refused(self.path, format!("{}: {e}", shown(name)), 0)),
        };
        let st = nix::sys::stat::fstat(&fd)
            .map_err(|e| refused(self.path, format!("{}: {e}", shown(name)), 0))?;
        let id = file_id(&st);
        if id.0 != self.dev || self.mounts.contains(&id) {
            return Err(refused(
                self.path,
                format!("{} is a mount point: left in place", shown(name)),
                0,
            ));
        }
        let dir = Dir::from_fd(fd).map_err(|e| refused(self.path, e.to_string(), 0))?;
        Ok(Some(Level {
            dir: Some(dir),
            id,
            name: name.to_os_string(),
            pending: Vec::new(),
            skip: HashSet::new(),
        }))
    }

    /// The parent of `child` through its `..`, if it is still the directory `id`.
    fn reopen_parent(&self, child: &Level, id: (u64, u64)) -> Result<Dir, Unremoved> {
        let moved = || Unremoved::Moved {
            path: self.path.display().to_string(),
            removed: self.removed,
        };
        let fd = child.fd().ok_or_else(moved)?;
        let up = nix::fcntl::openat(
            fd,
            "..",
            OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .map_err(|_| moved())?;
        let st = nix::sys::stat::fstat(&up).map_err(|_| moved())?;
        if file_id(&st) != id {
            return Err(moved());
        }
        Dir::from_fd(up).map_err(|_| moved())
    }

    /// Notes an entry that stays; too many of them end the walk.
    fn refuse(&mut self, what: String) -> Result<(), Unremoved> {
        self.refused += 1;
        self.first_refusal.get_or_insert(what);
        if self.refused > MAX_REFUSED {
            return Err(self.refusal());
        }
        Ok(())
    }

    fn refusal(&self) -> Unremoved {
        Unremoved::Refused {
            path: self.path.display().to_string(),
            what: self.first_refusal.clone().unwrap_or_default(),
            removed: self.removed,
        }
    }

    fn outcome(&self) -> Result<u64, Unremoved> {
        match self.first_refusal {
            None => Ok(self.removed),
            Some(_) => Err(self.refusal()),
        }
    }
}

/// Up to `batch` entries of `level`'s directory not yet refused: files (and links, and
/// whatever else is not a directory) and subdirectories.
fn read_pass(level: &mut Level, batch: usize) -> Pass {
    let mut pass = Pass {
        files: Vec::new(),
        dirs: Vec::new(),
    };
    let Some(dir) = level.dir.as_mut() else {
        return pass;
    };
    // The iterator rewinds the directory when it is dropped: each pass reads from the start,
    // where what the last pass removed is gone.
    for entry in dir.iter() {
        let Ok(entry) = entry else { break };
        let name = OsStr::from_bytes(entry.file_name().to_bytes());
        if name == "." || name == ".." || level.skip.contains(name) {
            continue;
        }
        match entry.file_type() {
            Some(Type::Directory) => pass.dirs.push(name.to_os_string()),
            Some(_) => pass.files.push(name.to_os_string()),
            // Not told by this filesystem: unlinked as a file, entered if it is a directory.
            None => pass.files.push(name.to_os_string()),
        }
        if pass.files.len() + pass.dirs.len() >= batch {
            break;
        }
    }
    pass
}

fn stat_at(dir: impl AsFd, name: &OsStr) -> nix::Result<FileStat> {
    nix::sys::stat::fstatat(dir, name, AtFlags::AT_SYMLINK_NOFOLLOW)
}

fn is_dir(st: &FileStat) -> bool {
    SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT == SFlag::S_IFDIR
}

fn is_dir_at(dir: impl AsFd, name: &OsStr) -> bool {
    stat_at(dir, name).is_ok_and(|st| is_dir(&st))
}

/// A file's device and inode, as one width on every platform (`st_dev` is an `i32` on macOS).
#[allow(clippy::unnecessary_cast)]
fn file_id(st: &nix::sys::stat::FileStat) -> (u64, u64) {
    (st.st_dev as u64, st.st_ino as u64)
}

fn refused(path: &Path, what: String, removed: u64) -> Unremoved {
    Unremoved::Refused {
        path: path.display().to_string(),
        what,
        removed,
    }
}

fn shown(name: &OsStr) -> String {
    String::from_utf8_lossy(name.as_bytes()).into_owned()
}

/// Device and inode of every mount point strictly below `path` (bind mounts of the same
/// filesystem included, which a device check alone would miss), from the kernel's mount table.
/// Linux's: macOS has no bind mounts (nor `/proc`), so there the device check finds every
/// mount point.
fn mount_points_below(path: &Path) -> HashSet<(u64, u64)> {
    let mut found = HashSet::new();
    if !cfg!(target_os = "linux") {
        return found;
    }
    // Bounded: the table of a host with many containers is large, but not this large.
    let Ok(table) = crate::bounded::read_file("/proc/self/mountinfo", 16 << 20) else {
        return found;
    };
    for point in mount_points(&String::from_utf8_lossy(&table)) {
        if point != path
            && point.starts_with(path)
            && let Ok(st) = nix::sys::stat::stat(&point)
        {
            found.insert(file_id(&st));
        }
    }
    found
}

/// The mount points `/proc/self/mountinfo` lists (its fifth field, octal escapes undone).
pub(crate) fn mount_points(mountinfo: &str) -> Vec<PathBuf> {
    mountinfo
        .lines()
        .filter_map(|line| line.split(' ').nth(4))
        .map(|field| PathBuf::from(OsStr::from_bytes(&unescape(field))))
        .collect()
}

/// `\040` and the like, as the kernel writes a space in a path.
fn unescape(field: &str) -> Vec<u8> {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\'
            && i + 3 < bytes.len()
            && bytes[i + 1..i + 4].iter().all(|b| (b'0'..=b'7').contains(b))
        {
            let v = bytes[i + 1..i + 4]
                .iter()
                .fold(0u32, |acc, b| acc * 8 + u32::from(b - b'0'));
            out.push(u8::try_from(v).unwrap_or(b'?'));
            i += 4;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    out
}

#[cfg(test)]
mod tests;
