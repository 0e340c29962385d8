//! A job's directory, built by root so that no link a job's user plants can turn root's hand.
//!
//! A process of the job's uid (a sibling under a shared `run_as`, a job's leftover) could swap
//! a freshly made subdirectory for a symlink between root's `mkdir` and its `chown`, and root
//! would then chown the link's target (an install file, the state directory) to that user.
//! So the tree is built while its top is root's and `0700` (no other uid can reach inside),
//! every child is made and changed through the file descriptor of its parent (`mkdirat`,
//! `openat(O_NOFOLLOW)`, `fchown`, `fchmod`, `linkat`, `symlinkat`), and the top is handed to
//! the user last. Removal walks by descriptor too, with its depth on the heap
//! ([`crate::remove`]).

use std::{
    ffi::OsStr,
    io,
    os::{
        fd::OwnedFd,
        unix::ffi::OsStrExt,
    },
    path::Path,
};

use nix::{
    fcntl::{AtFlags, OFlag},
    sys::stat::Mode,
    unistd::{Gid, Uid},
};

/// A directory being built: its descriptor, and whom it will belong to.
#[derive(Debug)]
pub(crate) struct Tree {
    fd: OwnedFd,
    owner: Option<(Uid, Gid)>,
}

fn os(e: nix::Error, what: &Path) -> io::Error {
    let e = io::Error::from(e);
    io::Error::new(e.kind(), format!("{}: {e}", what.display()))
}

pub(super) use crate::remove::open_dir_at;

impl Tree {
    /// Makes `dir` (which must not exist), root's and `0700` whatever the umask, in a parent
    /// the daemon owns; it goes to `owner` at [`Tree::hand_over`].
    pub(crate) fn create(dir: &Path, owner: Option<(Uid, Gid)>) -> io::Result<Tree> {
        let (parent, name) = match (dir.parent(), dir.file_name()) {
            (Some(p), Some(n)) => (p, n),
            _ => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("{}: not a directory name", dir.display()),
                ));
            }
        };
        let parent_fd = nix::fcntl::open(
            parent,
            OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| os(e, parent))?;
        let fd = mkdir_at(&parent_fd, name, 0o700).map_err(|e| os(e, dir))?;
        Ok(Tree { fd, owner })
    }

    /// A subdirectory `name` with exactly `mode`, already the owner's (nobody but root can
    /// reach it before the top is handed over).
    pub(crate) fn dir(&self, name: &OsStr, mode: u32) -> io::Result<Tree> {
        let fd = mkdir_at(&self.fd, name, mode).map_err(|e| named(e, name))?;
        if let Some((uid, gid)) = self.owner {
            nix::unistd::fchown(&fd, Some(uid), Some(gid)).map_err(|e| named(e, name))?;
        }
        Ok(Tree {
            fd,
            owner: self.owner,
        })
    }

    /// A hard link `name` to the file at `from` (the install's; it stays the install's).
    pub(crate) fn link(&self, from: &Path, name: &OsStr) -> io::Result<()> {
        nix::unistd::linkat(nix::fcntl::AT_FDCWD, from, &self.fd, name, AtFlags::empty())
            .map_err(io::Error::from)
    }

    /// A copy `name` of the file at `from`, with its mode (root's: it is only read).
    pub(crate) fn copy(&self, from: &Path, name: &OsStr, mode: u32) -> io::Result<()> {
        let fd = nix::fcntl::openat(
            &self.fd,
            name,
            OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::from_bits_truncate(0o600),
        )
        .map_err(|e| named(e, name))?;
        let mut to = std::fs::File::from(fd);
        io::copy(&mut std::fs::File::open(from)?, &mut to)?;
        nix::sys::stat::fchmod(&to, permissions(mode))
            .map_err(|e| named(e, name))
    }

    /// A symlink `name` to `target` (a link the install itself has).
    pub(crate) fn symlink(&self, target: &Path, name: &OsStr) -> io::Result<()> {
        nix::unistd::symlinkat(target, &self.fd, name).map_err(|e| named(e, name))
    }

    /// Gives the top directory to its owner: from now on the user can enter it.
    pub(crate) fn hand_over(self) -> io::Result<()> {
        if let Some((uid, gid)) = self.owner {
            nix::unistd::fchown(&self.fd, Some(uid), Some(gid)).map_err(io::Error::from)?;
        }
        Ok(())
    }
}

/// The permission bits of a `st_mode` (a `u32` from std) as nix's `Mode`, whose width is the
/// platform's `mode_t`: 32 bits on Linux, 16 on macOS. The bits kept fit in 12.
#[allow(clippy::unnecessary_cast)]
fn permissions(mode: u32) -> Mode {
    Mode::from_bits_truncate((mode & 0o7777) as nix::libc::mode_t)
}

/// `mkdirat` then open it, without following a link, and set its mode exactly (the umask may
/// have narrowed it).
fn mkdir_at(parent: &OwnedFd, name: &OsStr, mode: u32) -> nix::Result<OwnedFd> {
    let mode = permissions(mode);
    nix::sys::stat::mkdirat(parent, name, mode)?;
    let fd = open_dir_at(parent, name)?;
    nix::sys::stat::fchmod(&fd, mode)?;
    Ok(fd)
}

fn named(e: impl Into<io::Error>, name: &OsStr) -> io::Error {
    let e = e.into();
    io::Error::new(
        e.kind(),
        format!("{}: {e}", String::from_utf8_lossy(name.as_bytes())),
    )
}

/// The directory of a `command` runner: empty but for its own `HOME` and `TMPDIR`, handed to
/// `owner` last.
pub(crate) fn command_dir(dir: &Path, owner: Option<(Uid, Gid)>) -> io::Result<()> {
    let top = Tree::create(dir, owner)?;
    for sub in ["_home", "_tmp"] {
        top.dir(OsStr::new(sub), 0o700)?;
    }
    top.hand_over()
}
