//! The census: how many entries each of the scheduler's collections holds, by name. What a
//! soak samples to see that none of them grows with the jobs done (docs/benchmarks.md,
//! "Soak"); ARCHITECTURE.md names each one's bound.

use super::View;

/// Entries per collection, by a stable name (`scheduler.jobs`, `ladder.items`, ...).
pub type Census = Vec<(&'static str, usize)>;

impl<'a> View<'a> {
    /// Every collection the scheduler keeps, with its entries now.
    pub fn census(&self) -> Census {
        let mut out = Census::new();
        self.state.jobs.census(&mut out);
        self.state.admission.census(&mut out);
        self.state.capacity.census(&mut out);
        self.state.book.census(&mut out);
        out.extend(self.state.ladder.queue().census());
        out.push(("scheduler.held_notices", self.state.held_notices.len()));
        out.push(("scheduler.offers", self.state.offers.len()));
        out.push(("scheduler.unanswerable", self.state.unanswerable.len()));
        out.push(("scheduler.observed", self.state.observed.len()));
        out.push(("scheduler.ops", self.state.ops.len()));
        self.state.warm.census(&mut out);
        out
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use crate::{
        job::{JobAction, JobInfo, JobKey},
        scheduler::core::tests::{at, core_with, settings},
    };

    use super::*;

    fn count(c: &Census, name: &str) -> usize {
        c.iter().find(|(n, _)| *n == name).map_or(0, |(_, v)| *v)
    }

    /// A job's whole life (queued, claimed, started, completed, its runner gone), then the
    /// retention: the job, its runner and its store row are forgotten.
    #[test]
    fn a_job_run_here_is_forgotten_with_its_row_once_its_retention_has_passed() {
        use crate::{durable::Op, scheduler::core::driver::Driver};
        let mut s = settings();
        s.seen_ttl = Duration::from_secs(60);
        s.retention = Duration::from_secs(60);
        let mut d = Driver::with(s);
        let labels = ["self-hosted", "linux"];
        d.queued(1, &labels);
        let runner = d.runner_of(1);
        let job = |conclusion: Option<&str>| JobInfo {
            runner_name: Some(runner.clone()),
            conclusion: conclusion.map(std::sync::Arc::from),
            ..crate::scheduler::fixtures::job(1, &labels)
        };
        d.send(JobAction::InProgress, job(None));
        d.send(JobAction::Completed, job(Some("success")));
        d.exited(&runner, 0);
        d.s.take_ops();
        d.advance(130);
        let now = d.state_now();
        d.s.prune(now);
        let census = d.s.view().census();
        assert_eq!(count(&census, "scheduler.jobs"), 0, "{census:?}");
        assert_eq!(count(&census, "scheduler.runners"), 0, "{census:?}");
        assert!(
            d.s.take_ops()
                .iter()
                .any(|op| matches!(op, Op::DeleteJob(k) if k.job_id == 1)),
            "its store row goes too"
        );
    }

    /// A restart does not start a finished job's windows again: one restored from the store
    /// goes at the first prune past its retention, with its row.
    #[test]
    fn a_finished_job_restored_from_the_store_keeps_its_own_windows() {
        use crate::durable::{JobRow, Snapshot};
        let mut s = settings();
        s.seen_ttl = Duration::from_secs(60);
        s.retention = Duration::from_secs(60);
        let (mut sched, t0, _) = core_with(s);
        let now = at(t0, 1_000);
        let row = |id: u64, received: u64, started: Option<u64>| JobRow {
            info: crate::scheduler::fixtures::job(id, &["self-hosted", "linux"]),
            received_unix: now.unix - received,
            started_unix: started.map(|ago| now.unix - ago),
        };
        let snapshot = Snapshot {
            jobs: vec![row(1, 120, Some(100)), row(2, 30, Some(20))],
            ..Snapshot::default()
        };
        sched.restore(&snapshot, now);
        sched.take_ops();
        sched.prune(now);
        let census = sched.view().census();
        assert_eq!(count(&census, "scheduler.jobs"), 1, "{census:?}");
        assert!(
            sched
                .take_ops()
                .iter()
                .any(|op| matches!(op, crate::durable::Op::DeleteJob(k) if k.job_id == 1))
        );
    }

    #[test]
    fn a_finished_job_leaves_the_census_once_its_retention_has_passed() {
        let mut s = settings();
        s.seen_ttl = Duration::from_secs(60);
        s.retention = Duration::from_secs(60);
        let (mut sched, t0, _) = core_with(s);
        let info = JobInfo {
            key: JobKey::new("acme", 1),
            repo: "app".into(),
            labels: vec!["self-hosted".into(), "linux".into()].into(),
            ..JobInfo::default()
        };
        let now = |secs| at(t0, secs);
        let before = sched.view().census();
        // Heard of only once it was done (its runner was another host's).
        sched.on_job_event(JobAction::Completed, info, None, t0, now(1));
        assert_eq!(count(&sched.view().census(), "scheduler.jobs"), 1);
        sched.prune(now(60));
        assert_eq!(
            count(&sched.view().census(), "scheduler.jobs"),
            1,
            "inside its retention"
        );
        sched.prune(now(62));
        // What the shell takes after each message; the deletion it wrote held the job's key
        // (its owner's shared copy) until then, so the next pass lets that copy go.
        sched.take_observations();
        sched.take_ops();
        sched.prune(now(63));
        let after = sched.view().census();
        for name in [
            "scheduler.jobs",
            "scheduler.timeline_notes",
            "scheduler.shared_strings",
            "scheduler.shared_label_sets",
            "scheduler.shared_abouts",
        ] {
            assert_eq!(
                count(&after, name),
                count(&before, name),
                "{name}: {after:?}"
            );
        }
    }
}
