//! The last hour of each pool at a glance: per five-minute bucket, how long its jobs waited
//! from queued to running (p50, p90), its claims, its claim failures by class, and its warm
//! hits. Read from the jobs' own timelines (the scheduler keeps them for `state.retention`,
//! an hour by default), so it costs nothing until asked.

use super::View;
use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::{JobRecord, Note, Phase};
use crate::{config::PoolName, job::JobAction};

/// A bucket's width, seconds.
pub const BUCKET_SECS: u64 = 300;
/// Buckets in the hour.
pub const BUCKETS: usize = 12;

/// One pool's last hour.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct PoolHour {
    /// The pool.
    pub pool: String,
    /// Oldest first; the last is the bucket now runs in.
    pub buckets: Vec<HourBucket>,
}

/// Five minutes of a pool.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct HourBucket {
    /// Where the bucket starts, unix seconds (a multiple of [`BUCKET_SECS`]).
    pub start_unix: u64,
    /// Jobs seen to start running in it.
    pub started: u32,
    /// Their queued -> running wait, median, milliseconds.
    pub pickup_p50_ms: Option<u64>,
    /// The same, 90th percentile.
    pub pickup_p90_ms: Option<u64>,
    /// Runners claimed.
    pub claims: u32,
    /// Claims that failed, by error class.
    pub retries: BTreeMap<String, u32>,
    /// Jobs whose runner started in a warm environment (booted before the claim).
    pub warm_hits: u32,
}

/// The pool a job was routed to last: its phase's, or its timeline's latest claim.
pub(super) fn pool_of(r: &JobRecord) -> Option<&PoolName> {
    match &r.phase() {
        Phase::Claiming { provider } | Phase::Active { provider, .. } => Some(provider),
        _ => r.timeline().iter().rev().find_map(|e| match &e.note {
            Note::Claiming { provider } | Note::Claimed { provider, .. } => Some(provider),
            _ => None,
        }),
    }
}

use crate::usage::nearest_rank as quantile;

/// What one job's timeline adds to its pool's hour.
fn add(r: &JobRecord, first: u64, buckets: &mut [HourBucket], pickups: &mut [Vec<u64>]) {
    let Some(queued_ms) = r.timeline().first().map(|e| e.at_ms) else {
        return;
    };
    let slot = |at_ms: u64| -> Option<usize> {
        let at = at_ms / 1000;
        (at >= first)
            .then(|| ((at - first) / BUCKET_SECS) as usize)
            .filter(|i| *i < BUCKETS)
    };
    let mut started = false;
    for e in r.timeline() {
        let Some(i) = slot(e.at_ms) else { continue };
        let b = &mut buckets[i];
        match &e.note {
            Note::Claimed { .. } => b.claims += 1,
            Note::ClaimFailed { class, .. } => {
                *b.retries.entry(class.as_str().to_string()).or_default() += 1;
            }
            Note::RunnerStarted { warm: true, .. } => b.warm_hits += 1,
            Note::Observed {
                action: JobAction::InProgress | JobAction::Completed,
                ..
            } if !started => {
                started = true;
                b.started += 1;
                pickups[i].push(e.at_ms.saturating_sub(queued_ms));
            }
            _ => {}
        }
    }
}

impl<'a> View<'a> {
    /// Every pool's last hour up to `now_unix`, pools in config order.
    pub fn last_hour(&self, now_unix: u64) -> Vec<PoolHour> {
        let first = (now_unix / BUCKET_SECS + 1).saturating_sub(BUCKETS as u64) * BUCKET_SECS;
        let mut hours: Vec<(PoolHour, Vec<Vec<u64>>)> = self
            .setup
            .settings
            .providers
            .iter()
            .map(|p| {
                let buckets = (0..BUCKETS)
                    .map(|i| HourBucket {
                        start_unix: first + i as u64 * BUCKET_SECS,
                        ..HourBucket::default()
                    })
                    .collect();
                let hour = PoolHour {
                    pool: p.name.to_string(),
                    buckets,
                };
                (hour, vec![Vec::new(); BUCKETS])
            })
            .collect();
        for r in self.state.jobs.records() {
            let Some(pool) = pool_of(r) else { continue };
            if let Some((hour, pickups)) = hours.iter_mut().find(|(h, _)| h.pool == pool.as_str()) {
                add(r, first, &mut hour.buckets, pickups);
            }
        }
        hours
            .into_iter()
            .map(|(mut hour, mut pickups)| {
                for (b, p) in hour.buckets.iter_mut().zip(&mut pickups) {
                    p.sort_unstable();
                    b.pickup_p50_ms = quantile(p, 0.5);
                    b.pickup_p90_ms = quantile(p, 0.9);
                }
                hour
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        github::ErrorClass,
        job::{JobInfo, JobKey},
    };

    fn record(id: u64, notes: Vec<(u64, Note)>) -> Box<JobRecord> {
        let mut r = JobRecord::in_phase(
            JobInfo {
                key: JobKey::new("acme", id),
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
    fn a_job_counts_in_the_buckets_its_notes_fall_in() {
        let pool = PoolName::new("linux");
        let hour_start = 1_800_000_000 - 1_800_000_000 % BUCKET_SECS;
        let t = |secs: u64| (hour_start + secs) * 1000;
        let r = record(
            1,
            vec![
                (t(10), Note::Admitted),
                (
                    t(11),
                    Note::Claiming {
                        provider: pool.clone(),
                    },
                ),
                (
                    t(12),
                    Note::ClaimFailed {
                        class: ErrorClass::ServerSide,
                        error: "502".into(),
                    },
                ),
                (
                    t(301),
                    Note::Claimed {
                        runner: "r".into(),
                        runner_id: 1,
                        provider: pool.clone(),
                    },
                ),
                (
                    t(302),
                    Note::RunnerStarted {
                        runner: "r".into(),
                        after: std::time::Duration::ZERO,
                        warm: true,
                    },
                ),
                (
                    t(305),
                    Note::Observed {
                        action: JobAction::InProgress,
                        runner: None,
                    },
                ),
                (
                    t(900),
                    Note::Observed {
                        action: JobAction::Completed,
                        runner: None,
                    },
                ),
            ],
        );
        let mut buckets: Vec<HourBucket> = (0..BUCKETS)
            .map(|i| HourBucket {
                start_unix: hour_start + i as u64 * BUCKET_SECS,
                ..HourBucket::default()
            })
            .collect();
        let mut pickups = vec![Vec::new(); BUCKETS];
        assert_eq!(pool_of(&r), Some(&pool));
        add(&r, hour_start, &mut buckets, &mut pickups);
        assert_eq!(buckets[0].retries.get("server_side"), Some(&1));
        assert_eq!(buckets[0].claims, 0);
        assert_eq!(
            (buckets[1].claims, buckets[1].warm_hits, buckets[1].started),
            (1, 1, 1)
        );
        assert_eq!(pickups[1], [295_000]);
        assert_eq!(buckets[3].started, 0, "a job starts once");
    }

    #[test]
    fn the_quantiles_are_nearest_rank() {
        let v: Vec<u64> = (1..=10).collect();
        assert_eq!(quantile(&v, 0.5), Some(5));
        assert_eq!(quantile(&v, 0.9), Some(9));
        assert_eq!(quantile(&[7], 0.9), Some(7));
        assert_eq!(quantile(&[], 0.5), None);
    }
}
