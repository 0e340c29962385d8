//! What the scheduler's core tests and its actor tests both build from.

use crate::job::{JobInfo, JobKey};

/// A job of `acme/app` with these labels.
pub fn job(id: u64, labels: &[&str]) -> JobInfo {
    JobInfo {
        key: JobKey::new("acme", id),
        repo: "app".into(),
        run_id: 1,
        run_attempt: 1,
        labels: labels.iter().map(|l| l.to_string()).collect(),
        ..JobInfo::default()
    }
}
