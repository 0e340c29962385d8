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

use super::{
    link::Link,
    reckoning::{Amend, to_withdraw},
};
use crate::{
    job::{JobAction, JobInfo, JobKey},
    scheduler::{
        JobEvent,
        core::PoolDemand,
        messages::{EventSource, GetPoolDemand},
    },
    webhook::{Deliver, Verdict},
};

/// What this daemon holds of the pool's jobs (`None`: the scheduler is gone).
pub(super) async fn demand(link: &Link) -> Option<PoolDemand> {
    let scheduler = link.wiring.scheduler.upgrade()?;
    scheduler
        .send(GetPoolDemand {
            owner: link.client.owner().to_string(),
            pin: crate::config::scaleset_pin(&link.settings.pool),
        })
        .await
        .ok()
}

/// A reading, when one is due: the session refreshed for fresh statistics (it returns with a
/// new queue token), the gap taken, and acted on when it held since the last reading.
pub(super) async fn reckon(link: &mut Link, set: u64) -> Result<(), crate::github::GithubError> {
    let now = crate::clock::mono_now();
    let due = link.reckoner.due(now);
    let id = match &link.session {
        Some(s) if due => s.session_id.clone(),
        _ => return Ok(()),
    };
    let fresh = link.client.refresh_session(set, &id).await?;
    let stats = fresh.statistics;
    link.session = Some(fresh);
    let Some(stats) = stats else {
        return Ok(());
    };
    link.observe(&stats);
    let Some(held) = demand(link).await else {
        return Ok(());
    };
    let assigned = i64::try_from(stats.total_assigned_jobs).unwrap_or(i64::MAX);
    let ours = i64::try_from(held.waiting.len() + held.running).unwrap_or(i64::MAX);
    let gap = assigned - ours;
    let step = link.reckoner.read(now, gap);
    // The orphans still waiting; the rest ran or ended.
    link.mark.orphans.retain(|id| {
        held.waiting
            .iter()
            .any(|k| k.job_id == *id && !k.is_reckoned())
    });
    act(link, step, &held, assigned, ours).await;
    link.save_mark().await;
    Ok(())
}

/// Withdraws `jobs` (a `completed`, cancelled, for each); answers the job ids whose withdrawal
/// the intake did not take, for the reckoning to withdraw later.
pub(super) async fn withdraw(link: &Link, jobs: &[JobKey]) -> Vec<u64> {
    let mut left = Vec::new();
    for key in jobs {
        if !deliver(link, JobAction::Completed, key.clone(), "withdrawn").await {
            left.push(key.job_id);
        }
    }
    left
}

/// Hands a placeholder's `queued`, or a withdrawal's `completed` (cancelled), to the intake;
/// false when the intake did not take it.
async fn deliver(link: &Link, action: JobAction, key: JobKey, why: &str) -> bool {
    let info = JobInfo {
        key: key.clone(),
        labels: vec![crate::config::scaleset_pin(&link.settings.pool)].into(),
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
    match link.wiring.intake.send(Deliver(event)).await {
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
async fn act(link: &mut Link, step: Amend, held: &PoolDemand, assigned: i64, ours: i64) {
    let pool = link.settings.pool.clone();
    let pool = pool.as_str();
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
            let n = n.min(link.settings.max.max(1));
            let base = crate::clock::unix_now() * 100_000;
            for i in 0..n as u64 {
                let key = JobKey::reckoned(link.client.owner(), base + i);
                deliver(link, JobAction::Queued, key, "reckoned").await;
            }
            link.metrics
                .scaleset
                .reckoned
                .with_label_values(&[pool, "fill"])
                .inc_by(n as u64);
            // The next reading waits for these to be claimed and taken.
            link.reckoner.acted();
        }
        Amend::Withdraw(n) => {
            let orphans = link.mark.orphans.clone();
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
                    deliver(link, JobAction::Completed, key.clone(), "withdrawn").await;
                }
                link.metrics
                    .scaleset
                    .reckoned
                    .with_label_values(&[pool, "withdraw"])
                    .inc_by(gone.len() as u64);
                link.reckoner.acted();
            }
        }
    }
}
