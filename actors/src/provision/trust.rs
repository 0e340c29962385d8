//! Whether an actions/runner install is out of every job's reach.
//!
//! Each job's copy of the install shares the install's files by hard link
//! ([`super::install`]), and the daemon reads the install's version. So a file of the install
//! that a job user can write is a file every later job runs, and a way into whatever reads it.
//! An install is trusted only when nobody but root and the daemon's own user can change
//! anything in it or on the path to it:
//! - every directory and file in the tree is owned by root or the daemon's user, with no group
//!   or other write bit, as `lstat` sees it (the walk never follows a link);
//! - every symlink in it is relative and stays inside the tree, judged on its text: the
//!   per-job copy recreates each link as it is, so a link that leaves the install (`bin ->
//!   /home/someone/bin`, or `../..` past its top) would lead every job's runner to files a job
//!   user can write, however trusted the link's own target looks today;
//! - every directory above it is root's or the daemon's too, except that a sticky directory
//!   (`/tmp`) may be world-writable: only an entry's owner may rename or remove it there.
//!
//! The walk keeps its directories on the heap, not the stack.

use std::{
    fs::{self, Metadata},
    os::unix::fs::{MetadataExt, PermissionsExt},
    path::Path,
};

/// Group or other write.
const SHARED_WRITE: u32 = 0o022;
/// The sticky bit.
const STICKY: u32 = 0o1000;

/// Why the install at `dir` is not safe for root to share with jobs (the first path found,
/// with what is wrong and how to fix it), or `Ok`.
pub fn check_trusted(dir: &Path) -> Result<(), TrustError> {
    if crate::weaken::off("install-trust") {
        return Ok(());
    }
    let owners = owners();
    let canonical = fs::canonicalize(dir).map_err(|e| TrustError::unreadable(dir, &e))?;
    for above in canonical.ancestors().skip(1) {
        let meta = fs::metadata(above).map_err(|e| TrustError::unreadable(above, &e))?;
        let sticky_shared = meta.mode() & STICKY != 0;
        if !owners.contains(&meta.uid()) || (meta.mode() & SHARED_WRITE != 0 && !sticky_shared) {
            return Err(refusal(dir, above, &meta, &owners));
        }
    }
    walk(dir, &canonical, &owners)
}

/// Why an operator's file that root hands to QEMU (`what`: a VM's image, kernel or initrd at
/// `path`) is not safe, or `Ok`: the file it resolves to, every directory above that, and every
/// directory above the path as given (a symlink's own directory) are root's or the daemon's,
/// with no group or other write (a sticky directory above may be world-writable).
pub fn check_file_trusted(what: &str, path: &Path) -> Result<(), TrustError> {
    let owners = owners();
    let file = |e: TrustError| match e {
        TrustError::Shared { path: p, what: w, .. } => TrustError::File {
            what: what.to_string(),
            file: path.display().to_string(),
            path: p,
            detail: w,
        },
        other => other,
    };
    let canonical = fs::canonicalize(path).map_err(|e| TrustError::unreadable(path, &e))?;
    let meta = fs::metadata(&canonical).map_err(|e| TrustError::unreadable(&canonical, &e))?;
    judge(Path::new(what), &canonical, &meta, &owners).map_err(file)?;
    let given_parent = path
        .parent()
        .and_then(|p| fs::canonicalize(p).ok())
        .unwrap_or_default();
    for above in canonical.ancestors().skip(1).chain(given_parent.ancestors()) {
        if above.as_os_str().is_empty() {
            continue;
        }
        let meta = fs::metadata(above).map_err(|e| TrustError::unreadable(above, &e))?;
        let sticky_shared = meta.mode() & STICKY != 0;
        if !owners.contains(&meta.uid()) || (meta.mode() & SHARED_WRITE != 0 && !sticky_shared) {
            return Err(file(refusal(Path::new(what), above, &meta, &owners)));
        }
    }
    Ok(())
}

fn walk(dir: &Path, root: &Path, owners: &[u32]) -> Result<(), TrustError> {
    let mut todo = vec![root.to_path_buf()];
    while let Some(path) = todo.pop() {
        let meta = fs::symlink_metadata(&path).map_err(|e| TrustError::unreadable(&path, &e))?;
        if meta.file_type().is_symlink() {
            let target = fs::read_link(&path).map_err(|e| TrustError::unreadable(&path, &e))?;
            if !stays_inside(root, &path, &target) {
                return Err(TrustError::LinkLeaves {
                    dir: dir.display().to_string(),
                    link: path.display().to_string(),
                    target: target.display().to_string(),
                });
            }
            continue;
        }
        judge(dir, &path, &meta, owners)?;
        if meta.is_dir() {
            let entries = fs::read_dir(&path).map_err(|e| TrustError::unreadable(&path, &e))?;
            for entry in entries {
                let entry = entry.map_err(|e| TrustError::unreadable(&path, &e))?;
                todo.push(entry.path());
            }
        }
    }
    Ok(())
}

/// Whether a symlink at `link` (inside `root`) with text `target` leads to a place inside
/// `root`, judged on the text alone: relative, and never climbing past the top.
pub fn stays_inside(root: &Path, link: &Path, target: &Path) -> bool {
    use std::path::Component;
    if target.is_absolute() {
        return false;
    }
    let Ok(from) = link.parent().unwrap_or(root).strip_prefix(root) else {
        return false;
    };
    let mut depth = from.components().count();
    for part in target.components() {
        match part {
            Component::Normal(_) => depth += 1,
            Component::CurDir => {}
            Component::ParentDir => match depth.checked_sub(1) {
                Some(d) => depth = d,
                None => return false,
            },
            Component::RootDir | Component::Prefix(_) => return false,
        }
    }
    true
}

/// Root and the daemon's own user: who may own an install.
fn owners() -> [u32; 2] {
    [0, nix::unistd::geteuid().as_raw()]
}

/// Owned by one of `owners`, with no group or other write.
fn trusted(meta: &Metadata, owners: &[u32]) -> bool {
    owners.contains(&meta.uid()) && meta.mode() & SHARED_WRITE == 0
}

fn judge(dir: &Path, path: &Path, meta: &Metadata, owners: &[u32]) -> Result<(), TrustError> {
    if trusted(meta, owners) {
        Ok(())
    } else {
        Err(refusal(dir, path, meta, owners))
    }
}

fn refusal(dir: &Path, path: &Path, meta: &Metadata, owners: &[u32]) -> TrustError {
    let owner = if owners.contains(&meta.uid()) {
        String::new()
    } else {
        format!("owned by uid {}", meta.uid())
    };
    let mode = if meta.mode() & SHARED_WRITE != 0 {
        format!(
            "writable by group or others (mode {:o})",
            meta.permissions().mode() & 0o7777
        )
    } else {
        String::new()
    };
    let what = [owner, mode]
        .into_iter()
        .filter(|s| !s.is_empty())
        .collect::<Vec<_>>()
        .join(", ");
    TrustError::Shared {
        dir: dir.display().to_string(),
        path: path.display().to_string(),
        what,
    }
}

/// Why an install is not trusted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TrustError {
    /// A path of it (or above it) could not be read.
    #[error("runner_dir: {path}: {error}")]
    Unreadable {
        /// The path.
        path: String,
        /// What reading it answered.
        error: String,
    },
    /// Something in it or above it that a job user could change.
    #[error(
        "runner_dir {dir} is not safe to share with jobs: {path} is {what}; a job user who can \
         change the install runs code in every later job and in the daemon's version probe \
         (fix: `chown -R root:root {dir} && chmod -R go-w {dir}`, and keep its parents root's; \
         see docs/security.md)"
    )]
    Shared {
        /// The install.
        dir: String,
        /// What in it (or above it) is not trusted.
        path: String,
        /// Who owns it or who may write it.
        what: String,
    },
    /// An operator's file for VMs (an image, a kernel, an initrd) that someone else could
    /// change.
    #[error(
        "the {what} {file} is not safe to boot jobs from: {path} is {detail}; whoever can change \
         it changes what every VM runs, and a qcow2's header can name any file on the host for \
         root to read (fix: `chown root:root` and `chmod go-w` it and the directories above \
         it; see docs/security.md)"
    )]
    File {
        /// `image`, `kernel` or `initrd`.
        what: String,
        /// The file as configured.
        file: String,
        /// What in its path is not trusted.
        path: String,
        /// Who owns it or who may write it.
        detail: String,
    },
    /// A symlink in it that leads out of it (each job's copy would follow it).
    #[error(
        "runner_dir {dir} is not safe to share with jobs: the symlink {link} leads to {target}, \
         outside the install; each job's copy keeps the link, so every job would run what is \
         there (fix: replace the link with what it points at, or a relative link inside the \
         install; see docs/security.md)"
    )]
    LinkLeaves {
        /// The install.
        dir: String,
        /// The link.
        link: String,
        /// Its text.
        target: String,
    },
}

impl TrustError {
    fn unreadable(path: &Path, e: &std::io::Error) -> Self {
        TrustError::Unreadable {
            path: path.display().to_string(),
            error: e.to_string(),
        }
    }
}

/// Whether a job user could write the file `meta` describes: the copy's own last look
/// ([`super::install::copy_install`]) never hard-links such a file into a job's tree.
pub fn shared_writable(meta: &Metadata) -> bool {
    !trusted(meta, &owners()) && !crate::weaken::off("install-trust")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn install(root: &Path) {
        fs::create_dir_all(root.join("bin")).unwrap();
        fs::set_permissions(root, fs::Permissions::from_mode(0o755)).unwrap();
        fs::set_permissions(root.join("bin"), fs::Permissions::from_mode(0o755)).unwrap();
        fs::write(root.join("bin/Runner.Listener"), "listener").unwrap();
        fs::set_permissions(
            root.join("bin/Runner.Listener"),
            fs::Permissions::from_mode(0o755),
        )
        .unwrap();
    }

    fn base() -> tempfile::TempDir {
        let tmp = tempfile::tempdir().unwrap();
        fs::set_permissions(tmp.path(), fs::Permissions::from_mode(0o755)).unwrap();
        tmp
    }

    #[test]
    fn an_install_only_root_or_the_daemon_can_change_is_trusted() {
        let tmp = base();
        install(&tmp.path().join("i"));
        check_trusted(&tmp.path().join("i")).unwrap();
    }

    #[test]
    fn a_listener_others_can_write_is_refused_with_its_path() {
        let tmp = base();
        let dir = tmp.path().join("i");
        install(&dir);
        let listener = dir.join("bin/Runner.Listener");
        fs::set_permissions(&listener, fs::Permissions::from_mode(0o757)).unwrap();
        let err = check_trusted(&dir).unwrap_err().to_string();
        assert!(err.contains(&listener.display().to_string()), "{err}");
        assert!(
            err.contains("writable by group or others (mode 757)"),
            "{err}"
        );
    }

    #[test]
    fn a_group_writable_directory_in_the_tree_or_above_it_is_refused() {
        let tmp = base();
        let dir = tmp.path().join("i");
        install(&dir);
        fs::set_permissions(dir.join("bin"), fs::Permissions::from_mode(0o775)).unwrap();
        assert!(
            check_trusted(&dir)
                .unwrap_err()
                .to_string()
                .contains("/i/bin is")
        );
        fs::set_permissions(dir.join("bin"), fs::Permissions::from_mode(0o755)).unwrap();
        // Above: whoever may rename the parent's entries may swap the install.
        fs::set_permissions(tmp.path(), fs::Permissions::from_mode(0o777)).unwrap();
        let err = check_trusted(&dir).unwrap_err().to_string();
        assert!(
            err.contains(&format!("{} is", tmp.path().display())),
            "{err}"
        );
        // Sticky (as /tmp is): only an entry's owner may rename it.
        fs::set_permissions(tmp.path(), fs::Permissions::from_mode(0o1777)).unwrap();
        check_trusted(&dir).unwrap();
    }

    /// The review's finding: a symlinked directory inside the install whose target (and what
    /// is above it) looked fine, while what is below it was a job user's to change.
    #[test]
    fn a_symlink_leaving_the_install_is_refused_whatever_it_leads_to() {
        let tmp = base();
        let dir = tmp.path().join("i");
        install(&dir);
        let outside = tmp.path().join("elsewhere");
        fs::create_dir(&outside).unwrap();
        fs::set_permissions(&outside, fs::Permissions::from_mode(0o755)).unwrap();
        std::os::unix::fs::symlink(&outside, dir.join("bin/lib")).unwrap();
        let err = check_trusted(&dir).unwrap_err();
        assert!(matches!(err, TrustError::LinkLeaves { .. }), "{err}");
        assert!(err.to_string().contains("bin/lib"), "{err}");
        fs::remove_file(dir.join("bin/lib")).unwrap();
        // Relative, but past the top.
        std::os::unix::fs::symlink("../../elsewhere", dir.join("bin/lib")).unwrap();
        assert!(check_trusted(&dir).is_err());
        fs::remove_file(dir.join("bin/lib")).unwrap();
        // Relative and inside (as `externals/node20/bin/npm` is): fine, dangling or not.
        std::os::unix::fs::symlink("../bin/Runner.Listener", dir.join("bin/alias")).unwrap();
        std::os::unix::fs::symlink("gone", dir.join("bin/dangling")).unwrap();
        check_trusted(&dir).unwrap();
    }

    #[test]
    fn a_link_s_text_is_judged_against_the_top() {
        let root = Path::new("/opt/i");
        let inside = |link: &str, t: &str| stays_inside(root, &root.join(link), Path::new(t));
        assert!(inside("current", "bin"));
        assert!(inside("bin/a", "../run.sh"));
        assert!(inside("a/b/c", "../../x/./y"));
        assert!(!inside("current", ".."));
        assert!(!inside("bin/a", "../../etc"));
        assert!(!inside("bin/a", "/etc/passwd"));
        assert!(!inside("a", "x/../../.."));
    }

    /// The review's image: world-writable, owned by a job user (item 4).
    #[test]
    fn an_image_another_user_could_change_is_refused_up_its_whole_path() {
        let tmp = base();
        let image = tmp.path().join("runner.img");
        fs::write(&image, "x").unwrap();
        fs::set_permissions(&image, fs::Permissions::from_mode(0o644)).unwrap();
        check_file_trusted("image", &image).unwrap();
        fs::set_permissions(&image, fs::Permissions::from_mode(0o666)).unwrap();
        let err = check_file_trusted("image", &image).unwrap_err().to_string();
        assert!(err.contains("the image") && err.contains("writable by group or others"), "{err}");
        fs::set_permissions(&image, fs::Permissions::from_mode(0o644)).unwrap();
        // A link to it from a directory others may write: the link could be swapped.
        let loose = tmp.path().join("loose");
        fs::create_dir(&loose).unwrap();
        fs::set_permissions(&loose, fs::Permissions::from_mode(0o777)).unwrap();
        std::os::unix::fs::symlink(&image, loose.join("img")).unwrap();
        let err = check_file_trusted("kernel", &loose.join("img")).unwrap_err().to_string();
        assert!(err.contains("/loose is"), "{err}");
    }

    /// A tree deeper than a stack would hold is walked all the same.
    #[test]
    fn a_deep_install_is_walked_without_recursion() {
        let tmp = base();
        let dir = tmp.path().join("i");
        install(&dir);
        let mut deep = dir.join("bin");
        for _ in 0..200 {
            deep.push("d");
        }
        fs::create_dir_all(&deep).unwrap();
        fs::write(deep.join("f"), "x").unwrap();
        fs::set_permissions(deep.join("f"), fs::Permissions::from_mode(0o646)).unwrap();
        let err = check_trusted(&dir).unwrap_err().to_string();
        assert!(err.contains("/d/f is writable"), "{err}");
    }

    #[test]
    fn a_file_owned_by_another_user_is_refused_when_the_daemon_can_tell() {
        if !nix::unistd::geteuid().is_root() {
            return crate::test_support::skip("the owner check", "chown needs root");
        }
        let tmp = base();
        let dir = tmp.path().join("i");
        install(&dir);
        let listener = dir.join("bin/Runner.Listener");
        std::os::unix::fs::chown(&listener, Some(65534), None).unwrap();
        let err = check_trusted(&dir).unwrap_err().to_string();
        assert!(err.contains("owned by uid 65534"), "{err}");
        assert!(shared_writable(&fs::metadata(&listener).unwrap()));
    }
}
