//! One copy of the strings many tracked jobs repeat: owner, repository, label set and
//! conclusion. A job entering the core is re-pointed at the core's copies, so 100,000 jobs of
//! one repository hold one `app` and one label set between them, not 100,000 of each. Runner
//! names are not here: each is its own (the ledger's copy is shared by its notes instead).
//! Pruned with the jobs: a copy no job points at any more goes.

use std::sync::Arc;

use crate::job::JobInfo;

/// A set on a fast seeded hash: every job entering the core looks up four or five of its
/// strings here (SipHash showed in the intake's profile, docs/benchmarks.md).
type HashSet<T> = std::collections::HashSet<T, foldhash::fast::RandomState>;

/// The core's shared copies.
#[derive(Debug, Default)]
pub(super) struct Shared {
    strs: HashSet<Arc<str>>,
    labels: HashSet<Arc<[String]>>,
    /// What deliveries name: the runs of one workflow on one branch by one sender repeat it.
    abouts: HashSet<Arc<crate::job::JobAbout>>,
}

/// The set's copy of `value`, or `value` itself, now the set's.
fn one<T: ?Sized + Eq + std::hash::Hash>(set: &mut HashSet<Arc<T>>, value: &Arc<T>) -> Arc<T> {
    if let Some(have) = set.get(&**value) {
        return have.clone();
    }
    set.insert(value.clone());
    value.clone()
}

impl Shared {
    /// Re-points `job`'s repeated strings at the shared copies.
    pub(super) fn job(&mut self, job: &mut JobInfo) {
        job.key.owner = one(&mut self.strs, &job.key.owner);
        job.repo = one(&mut self.strs, &job.repo);
        job.labels = one(&mut self.labels, &job.labels);
        if let Some(c) = &job.conclusion {
            job.conclusion = Some(one(&mut self.strs, c));
        }
        if let Some(a) = &job.about {
            job.about = Some(one(&mut self.abouts, a));
        }
    }

    /// Drops the copies no job points at.
    pub(super) fn prune(&mut self) {
        self.strs.retain(|s| Arc::strong_count(s) > 1);
        self.labels.retain(|l| Arc::strong_count(l) > 1);
        self.abouts.retain(|a| Arc::strong_count(a) > 1);
    }

    /// Entries held: the shared strings and label sets.
    pub(super) fn census(&self, out: &mut super::Census) {
        out.push(("scheduler.shared_strings", self.strs.len()));
        out.push(("scheduler.shared_label_sets", self.labels.len()));
        out.push(("scheduler.shared_abouts", self.abouts.len()));
    }

    /// Copies held (for tests).
    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.strs.len() + self.labels.len() + self.abouts.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::job::JobKey;

    fn job(id: u64, owner: &str, labels: &[&str]) -> JobInfo {
        JobInfo {
            key: JobKey::new(owner, id),
            repo: "app".into(),
            labels: labels.iter().map(|l| l.to_string()).collect(),
            conclusion: Some("success".into()),
            about: crate::job::JobAbout::new("build", "CI", "main", "octocat").map(Arc::new),
            ..JobInfo::default()
        }
    }

    #[test]
    fn jobs_alike_share_one_copy_and_a_prune_drops_the_unused() {
        let mut shared = Shared::default();
        let mut a = job(1, "acme", &["self-hosted", "linux"]);
        let mut b = job(2, "ACME", &["self-hosted", "linux"]);
        shared.job(&mut a);
        shared.job(&mut b);
        assert!(Arc::ptr_eq(&a.key.owner, &b.key.owner));
        assert!(Arc::ptr_eq(&a.repo, &b.repo));
        assert!(Arc::ptr_eq(&a.labels, &b.labels));
        assert!(Arc::ptr_eq(
            a.about.as_ref().unwrap(),
            b.about.as_ref().unwrap()
        ));
        assert!(Arc::ptr_eq(
            a.conclusion.as_ref().unwrap(),
            b.conclusion.as_ref().unwrap()
        ));
        let mut other = job(3, "acme", &["self-hosted", "gpu"]);
        shared.job(&mut other);
        assert!(!Arc::ptr_eq(&a.labels, &other.labels));
        assert_eq!(
            shared.len(),
            6,
            "acme, app, success, two label sets, one account of the job"
        );
        drop((a, b));
        shared.prune();
        assert_eq!(
            shared.len(),
            5,
            "the linux set is gone; the rest is still used"
        );
        drop(other);
        shared.prune();
        assert_eq!(shared.len(), 0);
    }
}
