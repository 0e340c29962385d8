//! Trees a pool's teardowns could not remove: counted, written down, tried again.
//!
//! A removal that runs out of its budget or meets a mount point ([`super::remove`]) leaves a
//! tree behind. That is never a crash and never a loop: the tree is noted here with why, the
//! pool's gauge (`ephemerd_teardown_unremoved{provider}`) counts it, the job's timeline says
//! it, and a record in `state.dir/unremoved/<pool>` lets `doctor` name it (and survives a
//! restart, whose reaping tries it first). Each later teardown of the pool tries the trees
//! whose time has come again, after 1, 2, 4, ... minutes (at most an hour), until one goes.

use std::{
    cell::RefCell,
    collections::BTreeMap,
    path::{Path, PathBuf},
    rc::Rc,
    time::{Duration, Instant},
};

use crate::remove::{TEARDOWN_BUDGET, Unremoved, remove_tree};
use crate::retry::Doubling;

/// The first wait before a tree is tried again, and the longest.
const RETRY: Doubling = Doubling::new(Duration::from_secs(60), Duration::from_secs(3600));

#[derive(Debug, Clone)]
struct Stuck {
    why: String,
    tries: u32,
    next: Instant,
}

/// A pool's trees that are still there.
#[derive(Debug, Clone, Default)]
pub struct Unremovable {
    trees: Rc<RefCell<BTreeMap<PathBuf, Stuck>>>,
    /// What each runner's teardown left, in words, until the provisioner takes it.
    said: Rc<RefCell<BTreeMap<String, String>>>,
    gauge: Option<prometheus::IntGauge>,
    record: Option<PathBuf>,
}

impl Unremovable {
    /// Trees noted in `record` (a file the daemon writes, read at start), counted in `gauge`.
    pub fn new(record: Option<PathBuf>, gauge: Option<prometheus::IntGauge>) -> Self {
        let now = Instant::now();
        let trees = record
            .as_deref()
            .map(recorded_in)
            .unwrap_or_default()
            .into_iter()
            .map(|(path, why)| {
                (
                    path,
                    Stuck {
                        why,
                        tries: 1,
                        next: now,
                    },
                )
            })
            .collect();
        let me = Unremovable {
            trees: Rc::new(RefCell::new(trees)),
            said: Rc::default(),
            gauge,
            record,
        };
        me.publish();
        me
    }

    /// Removes `path`, runner `name`'s, on a blocking thread within the teardown's budget;
    /// what stays is noted (and said for the runner's timeline).
    pub async fn remove(&self, name: &str, path: &Path) -> Result<u64, Unremoved> {
        let result = remove_blocking(path.to_path_buf()).await;
        match &result {
            Ok(_) => self.gone(path),
            Err(e) => {
                self.note(path, e);
                self.said.borrow_mut().insert(
                    name.to_string(),
                    format!("its teardown could not remove everything: {e}"),
                );
            }
        }
        result
    }

    /// Tries again each tree whose time has come.
    pub async fn retry_due(&self) {
        let now = Instant::now();
        let due: Vec<PathBuf> = self
            .trees
            .borrow()
            .iter()
            .filter(|(_, s)| s.next <= now)
            .map(|(p, _)| p.clone())
            .collect();
        for path in due {
            match remove_blocking(path.clone()).await {
                Ok(removed) => {
                    tracing::info!(dir = %path.display(), removed, "a tree an earlier teardown left is removed now");
                    self.gone(&path);
                }
                Err(e) => self.note(&path, &e),
            }
        }
    }

    /// What runner `name`'s teardown left, in words (taken: asked once).
    pub fn take_said(&self, name: &str) -> Option<String> {
        self.said.borrow_mut().remove(name)
    }

    /// The trees still there and why.
    pub fn trees(&self) -> Vec<(PathBuf, String)> {
        self.trees
            .borrow()
            .iter()
            .map(|(p, s)| (p.clone(), s.why.clone()))
            .collect()
    }

    fn note(&self, path: &Path, e: &Unremoved) {
        let tries = {
            let mut trees = self.trees.borrow_mut();
            let stuck = trees.entry(path.to_path_buf()).or_insert(Stuck {
                why: String::new(),
                tries: 0,
                next: Instant::now(),
            });
            stuck.tries += 1;
            stuck.why = e.to_string();
            stuck.next = Instant::now() + RETRY.after(stuck.tries, 0.0);
            stuck.tries
        };
        tracing::warn!(dir = %path.display(), error = %e, tries, "a tree is left after its teardown; it is tried again later (doctor lists it)");
        self.publish();
    }

    fn gone(&self, path: &Path) {
        if self.trees.borrow_mut().remove(path).is_some() {
            self.publish();
        }
    }

    /// The gauge and the record, after a change.
    fn publish(&self) {
        let trees = self.trees();
        if let Some(g) = &self.gauge {
            g.set(trees.len() as i64);
        }
        let Some(record) = &self.record else { return };
        let written = if trees.is_empty() {
            match std::fs::remove_file(record) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
                _ => Ok(()),
            }
        } else {
            record
                .parent()
                .map_or(Ok(()), crate::harden::private_dir)
                .and_then(|()| {
                    let text: String = trees
                        .iter()
                        .map(|(p, why)| format!("{}\t{}\n", p.display(), one_line(why)))
                        .collect();
                    let mut f = crate::harden::private_file(record, false)?;
                    std::io::Write::write_all(&mut f, text.as_bytes())
                })
        };
        if let Err(e) = written {
            tracing::warn!(record = %record.display(), error = %e, "cannot write down the trees teardowns left");
        }
    }
}

async fn remove_blocking(path: PathBuf) -> Result<u64, Unremoved> {
    let shown = path.display().to_string();
    tokio::task::spawn_blocking(move || {
        if crate::weaken::off("removal") {
            // What teardown did before: a recursion as deep as the tree.
            return match std::fs::remove_dir_all(&path) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(Unremoved::Refused {
                    path: path.display().to_string(),
                    what: e.to_string(),
                    removed: 0,
                }),
                _ => Ok(0),
            };
        }
        remove_tree(&path, TEARDOWN_BUDGET)
    })
        .await
        .unwrap_or_else(|e| {
            Err(Unremoved::Refused {
                path: shown,
                what: format!("the removal did not finish: {e}"),
                removed: 0,
            })
        })
}

fn one_line(s: &str) -> String {
    s.chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect()
}

/// The trees a record names, and why (lines of `path<TAB>why`).
pub fn recorded_in(record: &Path) -> Vec<(PathBuf, String)> {
    let Ok(text) = crate::bounded::read_file(record, 1 << 20) else {
        return Vec::new();
    };
    String::from_utf8_lossy(&text)
        .lines()
        .filter_map(|l| {
            let (path, why) = l.split_once('\t')?;
            Some((PathBuf::from(path), why.to_string()))
        })
        .collect()
}

/// Where pool `pool`'s record is kept in `state_dir`.
pub fn record_path(state_dir: &Path, pool: &str) -> PathBuf {
    state_dir.join("unremoved").join(pool)
}

/// Every pool's trees that teardowns left, as the records in `state_dir` say (for `doctor`).
pub fn recorded(state_dir: &Path) -> Vec<(String, PathBuf, String)> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(state_dir.join("unremoved"))
        .into_iter()
        .flatten()
        .flatten()
    {
        let pool = entry.file_name().to_string_lossy().into_owned();
        out.extend(
            recorded_in(&entry.path())
                .into_iter()
                .map(|(p, why)| (pool.clone(), p, why)),
        );
    }
    out.sort();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_tree_that_stays_is_counted_recorded_said_and_removed_later() {
        if !nix::unistd::geteuid().is_root() {
            return crate::test_support::skip("an unremovable tree", "mounting needs root");
        }
        let tmp = tempfile::tempdir().unwrap();
        let (job, record) = (tmp.path().join("job"), record_path(tmp.path(), "pool"));
        std::fs::create_dir_all(job.join("mnt")).unwrap();
        let mounted = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "tmpfs"])
            .arg(job.join("mnt"))
            .status();
        if !mounted.is_ok_and(|s| s.success()) {
            return crate::test_support::skip("an unremovable tree", "cannot mount a tmpfs");
        }
        let gauge = prometheus::IntGauge::new("g", "g").unwrap();
        let left = Unremovable::new(Some(record.clone()), Some(gauge.clone()));
        let err = left.remove("runner-1", &job).await.unwrap_err();
        assert!(err.to_string().contains("mount point"), "{err}");
        assert_eq!(gauge.get(), 1);
        assert!(left.take_said("runner-1").unwrap().contains("could not remove"));
        assert_eq!(left.take_said("runner-1"), None, "said once");
        assert_eq!(recorded(tmp.path()).len(), 1, "doctor finds it");
        // A restart reads the record: still counted.
        let again = Unremovable::new(Some(record.clone()), Some(gauge.clone()));
        assert_eq!(again.trees().len(), 1);
        std::process::Command::new("umount")
            .arg(job.join("mnt"))
            .status()
            .unwrap();
        again.retry_due().await;
        assert!(!job.exists());
        assert_eq!(gauge.get(), 0);
        assert!(!record.exists(), "nothing left to name");
    }
}
