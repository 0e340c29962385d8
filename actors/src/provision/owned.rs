//! Removing what one uid owns from directories other users share (`/tmp`, `/run/lock`, a
//! job user's home), by directory handles.
//!
//! A walk by path can be turned: while root looks into `/tmp/a`, another user's process swaps
//! `a` for a symlink to `/etc`, and root removes `/etc/<name>`. So every directory is opened
//! relative to its parent's descriptor with `O_NOFOLLOW` (a symlink is never entered), each
//! entry is looked at with `fstatat(AT_SYMLINK_NOFOLLOW)` and removed with `unlinkat` on the
//! descriptor of the directory it was found in, as the job trees are built ([`super::jobdir`]).

use std::{
    ffi::{OsStr, OsString},
    os::{fd::OwnedFd, unix::ffi::OsStrExt},
    path::Path,
};

use super::jobdir::open_dir_at;
use nix::{
    fcntl::{AtFlags, OFlag},
    sys::stat::{Mode, SFlag},
    unistd::UnlinkatFlags,
};

/// Removes the entries `uid` owns in `dir` (whole, if directories), looking `depth`
/// directories down into the others' entries; nothing at or under a path in `keep` is
/// touched. Returns how many entries went.
pub(super) fn remove_owned(dir: &Path, uid: u32, depth: usize, keep: &[&Path]) -> usize {
    if keep.iter().any(|k| dir.starts_with(k)) {
        return 0;
    }
    let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    match nix::fcntl::open(dir, flags, Mode::empty()) {
        Ok(fd) => remove_in(&fd, dir, uid, depth, keep),
        Err(_) => 0,
    }
}

fn remove_in(fd: &OwnedFd, path: &Path, uid: u32, depth: usize, keep: &[&Path]) -> usize {
    let mut removed = 0;
    for name in names(fd) {
        let child = path.join(&name);
        if keep.iter().any(|k| child.starts_with(k)) {
            continue;
        }
        let Ok(st) = nix::sys::stat::fstatat(fd, name.as_os_str(), AtFlags::AT_SYMLINK_NOFOLLOW)
        else {
            continue;
        };
        let is_dir = SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT == SFlag::S_IFDIR;
        if st.st_uid == uid {
            removed += usize::from(remove_entry(fd, path, &name, is_dir));
        } else if is_dir
            && depth > 0
            && let Ok(sub) = open_dir_at(fd, &name)
        {
            removed += remove_in(&sub, &child, uid, depth - 1, keep);
        }
    }
    removed
}

/// Removes `name` in `fd`, the directory at `path`: a directory with everything in it,
/// whoever owns what inside, by the walk that no tree's shape can break ([`super::remove`]).
fn remove_entry(fd: &OwnedFd, path: &Path, name: &OsStr, is_dir: bool) -> bool {
    if !is_dir {
        return nix::unistd::unlinkat(fd, name, UnlinkatFlags::NoRemoveDir).is_ok();
    }
    let deadline = std::time::Instant::now() + crate::remove::TEARDOWN_BUDGET;
    match crate::remove::remove_at(fd, &path.join(name), name, deadline) {
        Ok(_) => true,
        Err(e) => {
            tracing::warn!(error = %e, "cannot remove what a job's user left; the next clearing tries again");
            false
        }
    }
}

/// The names in directory `fd` (not `.` nor `..`).
fn names(fd: &OwnedFd) -> Vec<OsString> {
    let Ok(dup) = fd.try_clone() else {
        return Vec::new();
    };
    let Ok(mut dir) = nix::dir::Dir::from_fd(dup) else {
        return Vec::new();
    };
    dir.iter()
        .flatten()
        .map(|e| OsStr::from_bytes(e.file_name().to_bytes()).to_os_string())
        .filter(|n| n != "." && n != "..")
        .collect()
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::MetadataExt;

    use super::*;

    #[test]
    fn only_the_uids_entries_go_and_links_are_never_followed() {
        let tmp = tempfile::tempdir().unwrap();
        let (shared, elsewhere) = (tmp.path().join("tmp"), tmp.path().join("etc"));
        std::fs::create_dir_all(shared.join("other/deeper")).unwrap();
        std::fs::create_dir_all(&elsewhere).unwrap();
        std::fs::write(elsewhere.join("passwd"), "root").unwrap();
        std::fs::create_dir_all(shared.join("mine/sub")).unwrap();
        std::fs::write(shared.join("mine/sub/f"), "x").unwrap();
        std::fs::write(shared.join("other/deeper/mine-too"), "x").unwrap();
        std::os::unix::fs::symlink(&elsewhere, shared.join("other/link")).unwrap();
        let me = std::fs::metadata(&shared).unwrap().uid();
        // Everything here is this test's uid: the walk takes what it owns, the links
        // themselves included, never what they lead to.
        let removed = remove_owned(&shared, me, 4, &[]);
        assert_eq!(removed, 2, "mine and other");
        assert!(std::fs::read_dir(&shared).unwrap().next().is_none());
        assert_eq!(
            std::fs::read_to_string(elsewhere.join("passwd")).unwrap(),
            "root"
        );
    }

    #[test]
    fn others_entries_are_looked_into_and_keep_is_left_alone() {
        let tmp = tempfile::tempdir().unwrap();
        let shared = tmp.path().join("tmp");
        std::fs::create_dir_all(shared.join("work/job")).unwrap();
        std::fs::write(shared.join("f"), "x").unwrap();
        let me = std::fs::metadata(&shared).unwrap().uid();
        // Not this uid's: nothing goes; its directories are looked into only.
        assert_eq!(remove_owned(&shared, me + 1, 4, &[]), 0);
        let keep = shared.join("work");
        assert_eq!(remove_owned(&shared, me, 4, &[keep.as_path()]), 1);
        assert!(shared.join("work/job").is_dir());
        assert!(!shared.join("f").exists());
    }

    #[test]
    fn a_symlink_standing_for_the_top_is_not_entered() {
        let tmp = tempfile::tempdir().unwrap();
        let target = tmp.path().join("target");
        std::fs::create_dir(&target).unwrap();
        std::fs::write(target.join("precious"), "x").unwrap();
        let link = tmp.path().join("link");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        let me = std::fs::metadata(&target).unwrap().uid();
        assert_eq!(remove_owned(&link, me, 4, &[]), 0);
        assert!(target.join("precious").exists());
    }

    /// The race the walk by path lost: while root walks another user's directory, it is
    /// swapped for a symlink to a place holding an entry of the uid being cleared.
    #[test]
    fn a_directory_swapped_for_a_symlink_mid_walk_never_leads_root_elsewhere() {
        if !nix::unistd::geteuid().is_root() {
            return crate::test_support::skip("the swap race", "other users' files need root");
        }
        let (cleared, swapper) = (65_533, 65_534);
        let tmp = tempfile::tempdir().unwrap();
        let (shared, elsewhere) = (tmp.path().join("tmp"), tmp.path().join("elsewhere"));
        std::fs::create_dir_all(&shared).unwrap();
        std::fs::create_dir_all(elsewhere.join("d")).unwrap();
        let victim = elsewhere.join("d/victim");
        std::fs::write(&victim, "not the job's to lose").unwrap();
        std::os::unix::fs::chown(&victim, Some(cleared), None).unwrap();
        let (dir, parked) = (shared.join("a"), tmp.path().join("parked"));
        std::fs::create_dir(&dir).unwrap();
        std::os::unix::fs::chown(&dir, Some(swapper), None).unwrap();
        let swap = crate::test_support::Swapper::start(dir, parked, elsewhere.join("d"));
        // A second of walks against a second of swaps (a walk by path loses within it).
        let until = std::time::Instant::now() + std::time::Duration::from_secs(1);
        while std::time::Instant::now() < until && victim.exists() {
            remove_owned(&shared, cleared, 4, &[]);
        }
        drop(swap);
        assert!(victim.exists(), "root followed the swapped-in link");
    }
}
