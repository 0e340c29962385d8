//! The daemon-managed runner installs: `<state.dir>-work/runners/<version>`, one directory per
//! verified release (root-owned, readable by the `run_as` users, on the work root's filesystem
//! so a job's copy is hard links), and which one new jobs use.
//!
//! A release is unpacked into `.partial-<version>` and renamed into place only when complete,
//! with a `.ephemer-verified` file holding the archive's SHA-256: a directory without it (a
//! crash mid-unpack) is never used and is removed. A running job holds a [`Lease`] on the
//! version it was copied from; an old version is removed once it is not the current one and no
//! lease holds it.

use std::{
    cell::RefCell,
    collections::HashMap,
    io,
    os::unix::fs::PermissionsExt,
    path::{Path, PathBuf},
    rc::Rc,
    time::Duration,
};

use super::Version;

/// Marks a complete, verified install; holds `sha256:<hex>` of its archive.
const VERIFIED: &str = ".ephemer-verified";

/// The managed installs of one daemon (shared by the process pools that use them and the
/// `ReleaseActor` that fills them; one thread, so `Rc`).
#[derive(Debug, Clone)]
pub struct ManagedInstalls(Rc<RefCell<Inner>>);

#[derive(Debug)]
struct Inner {
    root: PathBuf,
    current: Option<Version>,
    leases: HashMap<Version, usize>,
    /// The first look at the releases is over (an install is there, or it said why not).
    settled: bool,
    /// Why there is no install, or why the last update failed.
    problem: Option<String>,
    waiters: Vec<tokio::sync::oneshot::Sender<()>>,
}

/// A running job's hold on the version its copy came from.
#[derive(Debug)]
pub struct Lease {
    installs: ManagedInstalls,
    /// The version.
    pub version: Version,
    /// Its directory.
    pub dir: PathBuf,
}

impl Drop for Lease {
    fn drop(&mut self) {
        {
            let mut inner = self.installs.0.borrow_mut();
            if let Some(n) = inner.leases.get_mut(&self.version) {
                *n = n.saturating_sub(1);
            }
        }
        self.installs.prune();
    }
}

impl ManagedInstalls {
    /// The installs of `config`'s daemon, when an enabled process pool uses them (it has
    /// neither `runner_dir` nor `command`, and `runner.auto_update` is on):
    /// `<state.dir>-work/runners`.
    pub fn for_config(config: &crate::config::Config) -> Option<ManagedInstalls> {
        let used = config.providers.enabled().iter().any(|p| {
            p.process()
                .is_some_and(|p| p.program == crate::config::RunnerProgram::Managed)
        });
        let pinned = config
            .runner
            .update
            .version
            .as_deref()
            .and_then(Version::parse);
        (used && config.runner.update.auto_update).then(|| {
            ManagedInstalls::open(&config.state.runner_dir().join("runners"), pinned.as_ref())
        })
    }

    /// The installs under `root`: the newest verified one is current (or, with a pinned
    /// `version`, that one if it is there). Partial unpacks and downloads are removed.
    pub fn open(root: &Path, pinned: Option<&Version>) -> ManagedInstalls {
        let installs = ManagedInstalls(Rc::new(RefCell::new(Inner {
            root: root.to_path_buf(),
            current: None,
            leases: HashMap::new(),
            settled: false,
            problem: None,
            waiters: Vec::new(),
        })));
        let found = installs.installed();
        let current = match pinned {
            Some(v) => found.into_iter().find(|f| f == v),
            None => found.into_iter().max(),
        };
        installs.0.borrow_mut().current = current;
        if let Ok(dir) = std::fs::read_dir(root) {
            for entry in dir.flatten() {
                let name = entry.file_name().to_string_lossy().into_owned();
                if name.starts_with(".partial-") {
                    let _ = crate::remove::remove_tree(&entry.path(), crate::remove::TEARDOWN_BUDGET);
                } else if name.starts_with(".download-") {
                    // A download a stop cut short.
                    let _ = std::fs::remove_file(entry.path());
                }
            }
        }
        installs
    }

    /// Where the installs live.
    pub fn root(&self) -> PathBuf {
        self.0.borrow().root.clone()
    }

    /// The directory of `version`.
    pub fn dir_of(&self, version: &Version) -> PathBuf {
        self.0.borrow().root.join(version.to_string())
    }

    /// The verified versions on disk.
    pub fn installed(&self) -> Vec<Version> {
        let root = self.root();
        let Ok(dir) = std::fs::read_dir(&root) else {
            return Vec::new();
        };
        dir.flatten()
            .filter_map(|e| Version::parse(&e.file_name().to_string_lossy()))
            .filter(|v| root.join(v.to_string()).join(VERIFIED).is_file())
            .collect()
    }

    /// The version new jobs use.
    pub fn current(&self) -> Option<Version> {
        self.0.borrow().current.clone()
    }

    /// A lease on the current install for a job about to be copied from it.
    pub fn lease(&self) -> Option<Lease> {
        let version = self.current()?;
        *self
            .0
            .borrow_mut()
            .leases
            .entry(version.clone())
            .or_default() += 1;
        Some(Lease {
            installs: self.clone(),
            dir: self.dir_of(&version),
            version,
        })
    }

    /// New jobs use `version` from now on (it is installed and verified); old versions no job
    /// holds are removed.
    pub fn switch_to(&self, version: Version) {
        self.0.borrow_mut().current = Some(version);
        self.prune();
    }

    /// Removes every installed version other than the current one that no lease holds; returns
    /// them.
    pub fn prune(&self) -> Vec<Version> {
        let (current, held) = {
            let inner = self.0.borrow();
            let held: Vec<Version> = inner
                .leases
                .iter()
                .filter(|(_, n)| **n > 0)
                .map(|(v, _)| v.clone())
                .collect();
            (inner.current.clone(), held)
        };
        let Some(current) = current else {
            return Vec::new();
        };
        let mut removed = Vec::new();
        for v in self.installed() {
            if v != current && !held.contains(&v) {
                match crate::remove::remove_tree(&self.dir_of(&v), crate::remove::TEARDOWN_BUDGET) {
                    Ok(_) => {
                        tracing::info!(version = %v, "removed the runner install no job uses any more");
                        removed.push(v);
                    }
                    Err(e) => {
                        tracing::warn!(version = %v, error = %e, "cannot remove an old runner install")
                    }
                }
            }
        }
        self.0.borrow_mut().leases.retain(|_, n| *n > 0);
        removed
    }

    /// The first look is over; `problem` says why there is no install (or why the update
    /// failed), `None` when all is well.
    pub fn settle(&self, problem: Option<String>) {
        let waiters = {
            let mut inner = self.0.borrow_mut();
            inner.settled = true;
            inner.problem = problem;
            std::mem::take(&mut inner.waiters)
        };
        for w in waiters {
            let _ = w.send(());
        }
    }

    /// What went wrong last, if anything.
    pub fn problem(&self) -> Option<String> {
        self.0.borrow().problem.clone()
    }

    /// Waits (at most `within`) for the first look at the releases to be over.
    pub async fn settled(&self, within: Duration) {
        let rx = {
            let mut inner = self.0.borrow_mut();
            if inner.settled {
                return;
            }
            let (tx, rx) = tokio::sync::oneshot::channel();
            inner.waiters.push(tx);
            rx
        };
        let _ = tokio::time::timeout(within, rx).await;
    }
}

/// Unpacks a verified archive (`.tar.gz`) as `root/<version>`: into a partial directory first,
/// every directory `0755` and every file `0644` or `0755` (root's, readable by the runners,
/// whatever the archive or the umask say), then the marker, then the rename. Entries that would
/// land outside the directory are refused by the unpacker. Blocking: run it off the actor.
pub fn unpack(
    archive: &Path,
    root: &Path,
    version: &Version,
    sha256: &[u8; 32],
) -> io::Result<PathBuf> {
    std::fs::create_dir_all(root)?;
    std::fs::set_permissions(root, std::fs::Permissions::from_mode(0o755))?;
    let partial = root.join(format!(".partial-{version}"));
    let _ = crate::remove::remove_tree(&partial, crate::remove::TEARDOWN_BUDGET);
    std::fs::create_dir(&partial)?;
    let file = std::fs::File::open(archive)?;
    let mut tar = tar::Archive::new(flate2::read::GzDecoder::new(io::BufReader::new(file)));
    tar.set_preserve_permissions(false);
    tar.set_preserve_ownerships(false);
    tar.set_unpack_xattrs(false);
    tar.set_overwrite(false);
    let unpacked = tar
        .unpack(&partial)
        .and_then(|()| normalize_modes(&partial));
    if let Err(e) = unpacked {
        let _ = crate::remove::remove_tree(&partial, crate::remove::TEARDOWN_BUDGET);
        return Err(e);
    }
    std::fs::write(
        partial.join(VERIFIED),
        format!("sha256:{}\n", hex::encode(sha256)),
    )?;
    let dest = root.join(version.to_string());
    let _ = crate::remove::remove_tree(&dest, crate::remove::TEARDOWN_BUDGET);
    std::fs::rename(&partial, &dest)?;
    Ok(dest)
}

/// Directories `0755`, files `0755` when any execute bit is set, else `0644`; links untouched.
fn normalize_modes(dir: &Path) -> io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let kind = entry.file_type()?;
        let path = entry.path();
        if kind.is_dir() {
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755))?;
            normalize_modes(&path)?;
        } else if kind.is_file() {
            let mode = entry.metadata()?.permissions().mode();
            let want = if mode & 0o111 != 0 { 0o755 } else { 0o644 };
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(want))?;
        }
    }
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn archive(dir: &Path, files: &[(&str, &str, u32)]) -> PathBuf {
        let mut builder = tar::Builder::new(flate2::write::GzEncoder::new(
            Vec::new(),
            flate2::Compression::fast(),
        ));
        for (name, text, mode) in files {
            let mut header = tar::Header::new_gnu();
            header.set_size(text.len() as u64);
            header.set_mode(*mode);
            header.set_cksum();
            builder
                .append_data(&mut header, name, text.as_bytes())
                .unwrap();
        }
        let path = dir.join("a.tar.gz");
        std::fs::write(&path, builder.into_inner().unwrap().finish().unwrap()).unwrap();
        path
    }

    #[test]
    fn an_install_is_unpacked_whole_with_modes_runners_can_use_and_marked() {
        let tmp = tempfile::tempdir().unwrap();
        let a = archive(
            tmp.path(),
            &[("run.sh", "#!/bin/sh\n", 0o700), ("bin/lib.so", "x", 0o600)],
        );
        let root = tmp.path().join("runners");
        let v = Version::parse("2.331.0").unwrap();
        let dir = unpack(&a, &root, &v, &[1; 32]).unwrap();
        let mode = |p: &str| std::fs::metadata(dir.join(p)).unwrap().permissions().mode() & 0o7777;
        assert_eq!(
            (mode("run.sh"), mode("bin/lib.so"), mode("bin")),
            (0o755, 0o644, 0o755)
        );
        let installs = ManagedInstalls::open(&root, None);
        assert_eq!(installs.current(), Some(v));
        assert!(!root.join(".partial-2.331.0").exists());
    }

    #[test]
    fn old_versions_go_once_no_job_holds_them_and_partial_ones_are_never_used() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("runners");
        let a = archive(tmp.path(), &[("run.sh", "#!/bin/sh\n", 0o755)]);
        let (old, new) = (
            Version::parse("2.330.0").unwrap(),
            Version::parse("2.331.0").unwrap(),
        );
        unpack(&a, &root, &old, &[1; 32]).unwrap();
        // A crash mid-unpack of a newer one: no marker, never current, removed at open.
        std::fs::create_dir_all(root.join("2.332.0")).unwrap();
        std::fs::create_dir_all(root.join(".partial-2.333.0")).unwrap();
        std::fs::write(root.join(".download-2.334.0.tar.gz"), "cut short").unwrap();
        let installs = ManagedInstalls::open(&root, None);
        assert_eq!(installs.current(), Some(old.clone()));
        assert!(!root.join(".partial-2.333.0").exists());
        assert!(!root.join(".download-2.334.0.tar.gz").exists());
        let lease = installs.lease().unwrap();
        assert_eq!(lease.dir, root.join("2.330.0"));
        unpack(&a, &root, &new, &[2; 32]).unwrap();
        installs.switch_to(new.clone());
        assert!(
            root.join("2.330.0").exists(),
            "a running job still holds it"
        );
        assert_eq!(
            installs.lease().map(|l| l.version.clone()),
            Some(new.clone())
        );
        drop(lease);
        assert!(!root.join("2.330.0").exists(), "unused once the job ended");
        assert_eq!(installs.installed(), vec![new]);
    }

    #[test]
    fn a_pinned_version_is_used_only_if_it_is_there() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("runners");
        let a = archive(tmp.path(), &[("run.sh", "#!/bin/sh\n", 0o755)]);
        let v = |s| Version::parse(s).unwrap();
        unpack(&a, &root, &v("2.330.0"), &[1; 32]).unwrap();
        unpack(&a, &root, &v("2.331.0"), &[1; 32]).unwrap();
        let pinned = ManagedInstalls::open(&root, Some(&v("2.330.0")));
        assert_eq!(pinned.current(), Some(v("2.330.0")));
        assert_eq!(
            ManagedInstalls::open(&root, Some(&v("2.329.0"))).current(),
            None
        );
    }
}
