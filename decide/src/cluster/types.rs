//! What the ledger answers, as plain data.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::{durable::RetryRow, job::JobInfo, vocab::ErrorClass};

/// The answer to a claim request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Acquire {
    /// This host holds the job: claim it.
    Granted,
    /// Another live host holds it.
    HeldBy(String),
    /// GitHub already runs (or ran) it.
    Started,
    /// Not now: the fleet's claim window is full or the registration budget is empty.
    Paced {
        /// For how long.
        wait: Duration,
        /// Why.
        why: &'static str,
    },
}

/// Why a claim was paced: the fleet's window is full.
pub const PACED_WINDOW: &str = "the fleet sent max_claims_per_minute claims in the last 60 s";
/// Why a claim was paced: the credential's registration budget is empty.
pub const PACED_BUDGET: &str = "the registration budget is empty until its reset";
/// Why a claim was paced: the ledger did not answer.
pub const PACED_LEDGER: &str = "the cluster ledger is unreachable";

/// A job another host gave back (its lease expired, or it drained), with its ladder.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Released {
    /// The job.
    pub info: JobInfo,
    /// Failures so far.
    #[serde(default)]
    pub attempts: i32,
    /// Unix seconds of its first failure.
    pub first_failure: Option<i64>,
    /// Unix seconds of its next attempt.
    pub next_attempt: Option<i64>,
    /// Class of its first failure.
    pub class: Option<String>,
    /// The latest failure.
    pub last_error: Option<String>,
}

impl Released {
    /// Its ladder item, when it has one (a failure was recorded).
    pub fn ladder(&self) -> Option<RetryRow> {
        if self.attempts <= 0 {
            return None;
        }
        let class = self
            .class
            .as_deref()
            .and_then(|c| serde_json::from_value(serde_json::Value::String(c.into())).ok())
            .unwrap_or(ErrorClass::Network);
        let first = self.first_failure.unwrap_or(0).max(0) as u64;
        Some(RetryRow {
            job: self.info.clone(),
            attempts: self.attempts as u32,
            first_failure_unix: first,
            next_attempt_unix: self.next_attempt.unwrap_or(0).max(0) as u64,
            class,
            last_error: self.last_error.clone().unwrap_or_default(),
        })
    }
}

/// One host of the fleet, as `status` shows it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct HostView {
    /// `cluster.host`.
    pub host: String,
    /// Its lease is current.
    pub alive: bool,
    /// Seconds until its lease expires (negative: expired that long ago).
    pub lease_secs: i64,
    /// Its pools (name, kind, labels, slots) as it last reported them.
    pub pools: serde_json::Value,
    /// Runners it has.
    pub used: i32,
    /// Its slots.
    pub capacity: i32,
    /// Jobs it holds that have not started.
    pub holding: i64,
}

/// The fleet, as `status` shows it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct FleetView {
    /// This host.
    pub me: String,
    /// Every host the ledger knows.
    pub hosts: Vec<HostView>,
    /// Jobs recorded and not yet claimed by anyone.
    pub queued: i64,
}

/// Where the ledger says a job stands (`jobs ID`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct JobHolder {
    /// queued, held, running or completed.
    pub phase: String,
    /// The host holding it, if one does.
    pub holder: Option<String>,
    /// The last change, in words.
    pub why: String,
    /// Claim failures recorded on its ladder.
    pub attempts: i32,
}

/// What a host's runner names are made of: `<name_prefix>-<pool>-<install_id><random>`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RunnerIdentity {
    /// `runner.name_prefix`.
    pub name_prefix: String,
    /// The host's install id (`state.dir/install-id`).
    pub install_id: String,
}

/// A registration of a dead host that this host was given to delete.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadRegistration {
    /// Runner name.
    pub name: String,
    /// GitHub's id.
    pub runner_id: u64,
    /// Repo of a repo-level runner.
    pub repo: Option<String>,
    /// The dead host.
    pub host: String,
    /// The owner whose job it was made for (its target's credential deletes it).
    pub owner: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_released_job_without_failures_has_no_ladder() {
        let r = Released {
            info: JobInfo::default(),
            attempts: 0,
            first_failure: None,
            next_attempt: None,
            class: None,
            last_error: None,
        };
        assert!(r.ladder().is_none());
        let r = Released {
            attempts: 2,
            first_failure: Some(100),
            next_attempt: Some(160),
            class: Some("rate_limit".into()),
            ..r
        };
        let row = r.ladder().unwrap();
        assert_eq!(
            (row.attempts, row.first_failure_unix, row.next_attempt_unix),
            (2, 100, 160)
        );
        assert_eq!(row.class, ErrorClass::RateLimit);
    }
}

/// What this host reports with its lease.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Load {
    /// Its pools: name, kind, labels, slots, up.
    pub pools: serde_json::Value,
    /// Runners it has.
    pub used: usize,
    /// Its slots.
    pub capacity: usize,
}
