//! A finished job's usage row ([`UsageRow`]): written once, when GitHub says the job
//! completed, for a job a runner was claimed for here. Its runner-minutes run from that claim
//! to the completion (the environment's boot, the job, not its teardown); its pickup from its
//! first delivery here to the first sight of it running; its retries are its failed claims.

use super::{Setup, State};
use std::time::Duration;

use super::{JobRecord, Note};
use crate::{
    clock::Now,
    durable::{Op, UsageRow},
    job::{JobAction, JobKey},
};

/// `r`'s usage at `now_ms`, or `None` when no runner was claimed for it here. `ledger` is
/// the claim time (unix ms) and pool of a runner of the ledger made for it or bound to it: a
/// job restored after a restart has no note of its claim, the ledger still has its runner.
pub(super) fn usage_of(
    r: &JobRecord,
    target: &str,
    now_ms: u64,
    ledger: Option<(u64, &str)>,
) -> Option<UsageRow> {
    let queued_ms = r.timeline().first()?.at_ms;
    let noted = r
        .timeline()
        .iter()
        .find_map(|e| matches!(e.note, Note::Claimed { .. }).then_some(e.at_ms));
    let claimed_ms = noted.or(ledger.map(|(at, _)| at))?;
    let pool = super::hour::pool_of(r)
        .map(|p| p.as_str())
        .or(ledger.map(|(_, pool)| pool))?;
    let started_ms = r.timeline().iter().find_map(|e| match e.note {
        Note::Observed {
            action: JobAction::InProgress | JobAction::Completed,
            ..
        } => Some(e.at_ms),
        _ => None,
    });
    let retries = r
        .timeline()
        .iter()
        .filter(|e| matches!(e.note, Note::ClaimFailed { .. }))
        .count();
    Some(UsageRow {
        job: r.info().key.clone(),
        repo: r.info().repo.to_string(),
        pool: pool.to_string(),
        target: target.to_string(),
        queued_unix: queued_ms / 1000,
        ended_unix: now_ms / 1000,
        runner_ms: now_ms.saturating_sub(claimed_ms),
        retries: u32::try_from(retries).unwrap_or(u32::MAX),
        pickup_ms: started_ms.map(|s| s.saturating_sub(queued_ms)),
    })
}

/// Usage rows past their retention are forgotten at most this often.
pub(super) const USAGE_PRUNE_EVERY: u64 = 3600;

/// How often rows past `retention` are pruned: a quarter of it, at most hourly, so no row
/// outlives its retention by more than a quarter and a short retention (a soak's) still bounds
/// the table.
pub(super) fn usage_prune_every(retention: Duration) -> u64 {
    (retention.as_secs() / 4).clamp(1, USAGE_PRUNE_EVERY)
}

impl State {
    /// Forgets the usage rows past `state.usage_retention`, every [`usage_prune_every`] of it
    /// (the first prune after a start does it at once).
    pub(super) fn prune_usage(&mut self, setup: &Setup, now: Now) {
        if now.unix < self.next_usage_prune {
            return;
        }
        self.next_usage_prune = now.unix + usage_prune_every(setup.settings.usage_retention);
        let before = now
            .unix
            .saturating_sub(setup.settings.usage_retention.as_secs());
        self.ops.push(Op::PruneUsage(before));
    }

    /// Writes `key`'s usage row, if a runner was claimed for it here.
    pub(super) fn record_usage(&mut self, setup: &Setup, key: &JobKey, now: Now) {
        let target = setup.target_name(&key.owner).to_string();
        let ledger = self
            .book
            .runners()
            .find(|r| r.row().intent == *key || r.row().bound.as_ref() == Some(key))
            .map(|r| (r.row().created_unix * 1000, r.row().provider.as_str()));
        let row = self
            .jobs
            .get(key)
            .and_then(|r| usage_of(r, &target, now.unix_ms, ledger));
        if let Some(row) = row {
            self.ops.push(Op::PutUsage(row));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        config::PoolName,
        github::ErrorClass,
        job::JobInfo,
        scheduler::core::{Phase, Scheduler},
    };

    fn record(notes: Vec<(u64, Note)>) -> Box<JobRecord> {
        let mut r = JobRecord::in_phase(
            JobInfo {
                key: JobKey::new("acme", 5),
                repo: "app".into(),
                ..JobInfo::default()
            },
            Phase::Done,
            crate::clock::Instant::now(),
        );
        for (at_ms, note) in notes {
            r.push_note(at_ms, note);
        }
        r
    }

    #[test]
    fn a_job_s_minutes_run_from_its_claim_to_its_completion() {
        let pool = PoolName::new("linux");
        let r = record(vec![
            (1_000, Note::Admitted),
            (
                2_000,
                Note::ClaimFailed {
                    class: ErrorClass::ServerSide,
                    error: "502".into(),
                },
            ),
            (
                32_000,
                Note::Claimed {
                    runner: "r".into(),
                    runner_id: 1,
                    provider: pool,
                },
            ),
            (
                40_000,
                Note::Observed {
                    action: JobAction::InProgress,
                    runner: None,
                },
            ),
        ]);
        let row = usage_of(&r, "main", 152_000, None).unwrap();
        assert_eq!(row.runner_ms, 120_000);
        assert_eq!(row.pickup_ms, Some(39_000));
        assert_eq!(
            (row.retries, row.pool.as_str(), row.repo.as_str()),
            (1, "linux", "app")
        );
        assert_eq!((row.queued_unix, row.ended_unix), (1, 152));
    }

    /// Through the core: queued, claimed, running, completed (and the `completed` delivered
    /// again): one row, its minutes from the claim; and the hourly prune of old rows.
    #[test]
    fn a_completed_job_writes_one_row_and_old_rows_are_pruned_hourly() {
        use crate::scheduler::core::tests::{at, core};
        let (mut s, t0) = core();
        let key = JobKey::new("acme", 1);
        let job = crate::scheduler::fixtures::job(1, &["self-hosted", "linux"]);
        s.on_job_event(
            JobAction::Queued,
            job.clone(),
            Some("d1"),
            at(t0, 0).mono,
            at(t0, 0),
        );
        let runner = crate::github::JitRunner {
            id: 7,
            name: "ephemer-local-abc".into(),
            encoded_jit_config: crate::config::Secret::new("jit"),
        };
        s.on_claim_result(key.clone(), PoolName::from("local"), Ok(runner), at(t0, 2));
        let mut running = job.clone();
        running.runner_name = Some("ephemer-local-abc".into());
        s.on_job_event(
            JobAction::InProgress,
            running.clone(),
            Some("d2"),
            at(t0, 10).mono,
            at(t0, 10),
        );
        let mut done = running;
        done.conclusion = Some("success".into());
        for (d, t) in [("d3", 122), ("d4", 130)] {
            s.on_job_event(
                JobAction::Completed,
                done.clone(),
                Some(d),
                at(t0, t).mono,
                at(t0, t),
            );
        }
        let rows: Vec<UsageRow> = s
            .take_ops()
            .into_iter()
            .filter_map(|op| match op {
                Op::PutUsage(row) => Some(row),
                _ => None,
            })
            .collect();
        assert_eq!(rows.len(), 1, "{rows:?}");
        assert_eq!(rows[0].runner_ms, 120_000);
        assert_eq!(rows[0].pickup_ms, Some(10_000));
        assert_eq!(
            (rows[0].pool.as_str(), rows[0].target.as_str()),
            ("local", "acme")
        );

        let prunes = |s: &mut Scheduler| -> Vec<u64> {
            s.take_ops()
                .into_iter()
                .filter_map(|op| match op {
                    Op::PruneUsage(before) => Some(before),
                    _ => None,
                })
                .collect()
        };
        s.prune(at(t0, 200));
        let first = prunes(&mut s);
        assert_eq!(first, [(at(t0, 200).unix).saturating_sub(86_400)]);
        s.prune(at(t0, 200 + USAGE_PRUNE_EVERY - 1));
        assert_eq!(
            prunes(&mut s),
            Vec::<u64>::new(),
            "not again within the hour"
        );
        s.prune(at(t0, 200 + USAGE_PRUNE_EVERY));
        assert_eq!(prunes(&mut s).len(), 1);
    }

    #[test]
    fn a_short_retention_is_pruned_every_quarter_of_it_and_a_long_one_hourly() {
        assert_eq!(usage_prune_every(Duration::from_secs(60)), 15);
        assert_eq!(usage_prune_every(Duration::from_secs(2)), 1);
        assert_eq!(usage_prune_every(Duration::from_secs(4 * 3600)), 3600);
        assert_eq!(usage_prune_every(Duration::from_secs(100 * 86_400)), 3600);
    }

    #[test]
    fn a_job_no_runner_was_claimed_for_here_used_nothing() {
        let r = record(vec![
            (1_000, Note::Admitted),
            (
                2_000,
                Note::Observed {
                    action: JobAction::Completed,
                    runner: None,
                },
            ),
        ]);
        assert_eq!(usage_of(&r, "main", 3_000, None), None);
        // Restored after a restart: no note of the claim, but the ledger's runner for it.
        let row = usage_of(&r, "main", 63_000, Some((3_000, "linux"))).unwrap();
        assert_eq!((row.runner_ms, row.pool.as_str()), (60_000, "linux"));
    }
}
