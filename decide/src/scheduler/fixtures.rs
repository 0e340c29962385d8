//! What the scheduler's core tests and its actor tests both build from.

use std::time::Duration;

use crate::{
    github::{GithubError, error::HttpFailure},
    job::{JobInfo, JobKey},
    vocab::RateBucket,
};

/// The unix time both harnesses start at.
pub const UNIX0: u64 = 1_800_000_000;

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

/// A claim answer: `status`, with a registration reading of `remaining` when given (a claim's
/// answer with rate headers names the registration bucket), and `Retry-After` when given.
pub fn http(status: u16, remaining: Option<u64>, retry_after: Option<u64>) -> GithubError {
    GithubError::Http(HttpFailure {
        endpoint: "generate_jitconfig",
        status,
        message: "scripted".into(),
        documentation_url: None,
        rate_remaining: remaining,
        rate_bucket: remaining.map(|_| RateBucket::ActionsRunnerRegistration),
        rate_reset: None,
        retry_after: retry_after.map(Duration::from_secs),
    })
}

/// A rate-limited claim answer that carries its reading: the registration bucket is empty
/// until `reset_at` seconds after `UNIX0`.
pub fn limited(status: u16, reset_at: u64) -> GithubError {
    let mut e = http(status, Some(0), None);
    if let GithubError::Http(f) = &mut e {
        f.rate_reset = Some(UNIX0 + reset_at);
    }
    e
}
