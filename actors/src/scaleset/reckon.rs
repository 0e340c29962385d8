//! The reckoning: a scale set's `totalAssignedJobs` against the jobs this daemon holds for it.
//!
//! Runners are made per `JobAssigned`, which is exact while every message is handled before
//! it is acknowledged. The statistics are the check on that: when the queue is drained, the
//! jobs GitHub has assigned to the scale set (waiting or running) should be the jobs this
//! daemon holds for the pool (waiting for a runner, or running on one of its runners). A gap
//! seen on two readings in a row, [`RECKON_EVERY`] apart, is acted on, by the smaller of the two:
//!
//! - **more assigned than held** (a message acknowledged by another consumer, a store lost):
//!   a placeholder job per missing one claims a runner in the scale set; GitHub gives that
//!   runner one of its assigned jobs, whose `JobStarted` makes it known, and the placeholder
//!   ends ([`crate::job::Intent::Reckoned`]);
//! - **more held than assigned**: placeholders still waiting are withdrawn first, then jobs
//!   of a scale set made again (its orphans: a claim in the new scale set never gets them).
//!   A job withdrawn is completed as cancelled, and the runner made for it goes unless it
//!   took another job.
//!
//! Jobs this daemon learned from a message are never withdrawn by a count alone.

use std::time::Duration;

use crate::clock::Instant;

use super::{listener::Shared, view::observe};
use crate::{
    job::{JobAction, JobInfo, JobKey},
    scheduler::{
        JobEvent,
        core::PoolDemand,
        messages::{EventSource, GetPoolDemand},
    },
    webhook::{Deliver, Verdict},
};

/// Readings at least this far apart: a gap must outlive the messages in flight.
pub(super) const RECKON_EVERY: Duration = Duration::from_secs(15);

/// The last reading.
#[derive(Debug, Default)]
pub(super) struct Reckoner {
    at: Option<Instant>,
    gap: Option<i64>,
}

/// What a reading calls for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Amend {
    Nothing,
    /// Claim this many runners for assigned jobs never heard of.
    Fill(usize),
    /// Drop this many held jobs GitHub no longer assigns.
    Withdraw(usize),
}

/// The amend for gap `now` (assigned minus held) after gap `before`: only a gap of the same
/// sign on both readings, by the smaller of the two.
pub(super) fn amend(before: Option<i64>, now: i64) -> Amend {
    match before {
        Some(b) if b > 0 && now > 0 => Amend::Fill(usize::try_from(b.min(now)).unwrap_or(0)),
        Some(b) if b < 0 && now < 0 => {
            Amend::Withdraw(usize::try_from((-b).min(-now)).unwrap_or(0))
        }
        _ => Amend::Nothing,
    }
}

/// The jobs to withdraw, `n` at most: placeholders (newest first), then `orphans` (oldest
/// first), among those still waiting.
pub(super) fn to_withdraw(waiting: &[JobKey], orphans: &[u64], n: usize) -> Vec<JobKey> {
    let placeholders = waiting.iter().rev().filter(|k| k.is_reckoned());
    let orphaned = waiting
        .iter()
        .filter(|k| !k.is_reckoned() && orphans.contains(&k.job_id));
    placeholders.chain(orphaned).take(n).cloned().collect()
}

/// What this daemon holds of the pool's jobs (`None`: the scheduler is gone).
pub(super) async fn demand(shared: &Shared) -> Option<PoolDemand> {
    let scheduler = shared.wiring.scheduler.upgrade()?;
    scheduler
        .send(GetPoolDemand {
            owner: shared.client.owner().to_string(),
            pin: crate::config::scaleset_pin(&shared.settings.pool),
        })
        .await
        .ok()
}

/// A reading, when one is due: the session refreshed for fresh statistics (it returns with a
/// new queue token), the gap taken, and acted on when it held since the last reading.
pub(super) async fn reckon(shared: &Shared, set: u64) -> Result<(), crate::github::GithubError> {
    let now = crate::clock::mono_now();
    let due = shared
        .reckoner
        .borrow()
        .at
        .is_none_or(|at| now.duration_since(at) >= RECKON_EVERY);
    let id = match shared.session.borrow().as_ref() {
        Some(s) if due => s.session_id.clone(),
        _ => return Ok(()),
    };
    let fresh = shared.client.refresh_session(set, &id).await?;
    let stats = fresh.statistics;
    *shared.session.borrow_mut() = Some(fresh);
    let Some(stats) = stats else {
        return Ok(());
    };
    observe(shared, &stats);
    let Some(held) = demand(shared).await else {
        return Ok(());
    };
    let assigned = i64::try_from(stats.total_assigned_jobs).unwrap_or(i64::MAX);
    let ours = i64::try_from(held.waiting.len() + held.running).unwrap_or(i64::MAX);
    let gap = assigned - ours;
    let step = amend(shared.reckoner.borrow().gap, gap);
    *shared.reckoner.borrow_mut() = Reckoner {
        at: Some(now),
        gap: Some(gap),
    };
    // The orphans still waiting; the rest ran or ended.
    shared.mark.borrow_mut().orphans.retain(|id| {
        held.waiting
            .iter()
            .any(|k| k.job_id == *id && !k.is_reckoned())
    });
    act(shared, step, &held, assigned, ours).await;
    super::listener::save_mark(shared).await;
    Ok(())
}

/// Withdraws `jobs` (a `completed`, cancelled, for each); answers the job ids whose withdrawal
/// the intake did not take, for the reckoning to withdraw later.
pub(super) async fn withdraw(shared: &Shared, jobs: &[JobKey]) -> Vec<u64> {
    let mut left = Vec::new();
    for key in jobs {
        if !deliver(shared, JobAction::Completed, key.clone(), "withdrawn").await {
            left.push(key.job_id);
        }
    }
    left
}

/// Hands a placeholder's `queued`, or a withdrawal's `completed` (cancelled), to the intake;
/// false when the intake did not take it.
async fn deliver(shared: &Shared, action: JobAction, key: JobKey, why: &str) -> bool {
    let info = JobInfo {
        key: key.clone(),
        labels: vec![crate::config::scaleset_pin(&shared.settings.pool)].into(),
        conclusion: (action == JobAction::Completed).then(|| "cancelled".into()),
        run_attempt: 1,
        ..JobInfo::default()
    };
    let event = JobEvent {
        delivery_id: Some(format!("scaleset-{why}-{}", key.job_id)),
        action,
        job: info,
        received: crate::clock::mono_now(),
        source: EventSource::ScaleSet,
    };
    match shared.wiring.intake.send(Deliver(event)).await {
        Ok(Verdict::Accepted | Verdict::IgnoredAction | Verdict::Replayed) => true,
        Ok(refused) => {
            tracing::warn!(job_id = key.job_id, verdict = %refused, "scale set: the intake refused a reckoned job; the next reading tries again");
            false
        }
        Err(e) => {
            tracing::warn!(job_id = key.job_id, error = %e, "scale set: the intake did not answer for a reckoned job; the next reading tries again");
            false
        }
    }
}

/// Carries out what the reading decided: runners claimed for jobs never heard of, or jobs
/// the service no longer assigns withdrawn.
async fn act(shared: &Shared, step: Amend, held: &PoolDemand, assigned: i64, ours: i64) {
    let pool = shared.settings.pool.as_str();
    match step {
        Amend::Nothing => {}
        Amend::Fill(n) => {
            tracing::warn!(
                pool,
                assigned,
                held = ours,
                runners = n,
                "scale set: GitHub assigned jobs this daemon never heard of; claiming runners for them"
            );
            // At most a pool's worth at a time; the next reading fills the rest.
            let n = n.min(shared.settings.max.max(1));
            let base = crate::clock::unix_now() * 100_000;
            for i in 0..n as u64 {
                let key = JobKey::reckoned(shared.client.owner(), base + i);
                deliver(shared, JobAction::Queued, key, "reckoned").await;
            }
            shared
                .metrics
                .scaleset
                .reckoned
                .with_label_values(&[pool, "fill"])
                .inc_by(n as u64);
            // The next reading waits for these to be claimed and taken.
            shared.reckoner.borrow_mut().gap = None;
        }
        Amend::Withdraw(n) => {
            let orphans = shared.mark.borrow().orphans.clone();
            let gone = to_withdraw(&held.waiting, &orphans, n);
            if !gone.is_empty() {
                tracing::info!(
                    pool,
                    assigned,
                    held = ours,
                    jobs = ?gone.iter().map(|k| k.job_id).collect::<Vec<_>>(),
                    "scale set: jobs GitHub no longer assigns to the scale set withdrawn"
                );
                for key in &gone {
                    deliver(shared, JobAction::Completed, key.clone(), "withdrawn").await;
                }
                shared
                    .metrics
                    .scaleset
                    .reckoned
                    .with_label_values(&[pool, "withdraw"])
                    .inc_by(gone.len() as u64);
                shared.reckoner.borrow_mut().gap = None;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_gap_seen_twice_is_acted_on_by_the_smaller_reading() {
        assert_eq!(amend(None, 3), Amend::Nothing);
        assert_eq!(amend(Some(0), 3), Amend::Nothing);
        assert_eq!(amend(Some(-2), 3), Amend::Nothing);
        assert_eq!(amend(Some(5), 3), Amend::Fill(3));
        assert_eq!(amend(Some(2), 3), Amend::Fill(2));
        assert_eq!(amend(Some(-1), -4), Amend::Withdraw(1));
        assert_eq!(amend(Some(3), -4), Amend::Nothing);
        assert_eq!(amend(Some(0), 0), Amend::Nothing);
    }

    #[test]
    fn placeholders_go_first_then_orphans_and_never_a_job_from_a_message() {
        let k = |id| JobKey::new("acme", id);
        let p = |n| JobKey::reckoned("acme", n);
        let waiting = vec![k(10), k(11), p(1), k(12), p(2)];
        assert_eq!(to_withdraw(&waiting, &[12, 10], 3), [p(2), p(1), k(10)]);
        assert_eq!(to_withdraw(&waiting, &[], 5).len(), 2);
        assert!(to_withdraw(&[k(10), k(11)], &[], 2).is_empty());
    }
}
