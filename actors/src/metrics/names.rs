//! The words of the metrics: the names the contract promises, and the bounded values their
//! labels take.

/// The five error classes, as they appear in the `class` label.
pub const ERROR_CLASSES: [&str; 5] = [
    "non_retryable",
    "rate_limit",
    "server_side",
    "network",
    "unknown_retryable",
];

/// Why a job was ignored, the `reason` of `ephemerd_webhook_ignored_total`.
pub const IGNORE_REASONS: [&str; 3] = ["owner", "repo", "installation"];

/// The `workflow_job` actions counted in `ephemerd_github_webhook_events_total`.
pub const WEBHOOK_ACTIONS: [&str; 5] = ["queued", "in_progress", "completed", "waiting", "other"];

/// The `version` label of a pool whose runner version is not known (yet).
pub const UNKNOWN_VERSION: &str = "unknown";

/// The metric names the daemon promises to every deployment (kept from the original daemon,
/// so its dashboards work); docs/metrics.md lists them with the rest.
pub const CONTRACT_METRICS: [&str; 23] = [
    "ephemerd_github_api_rate_remaining",
    "ephemerd_github_api_rate_limit",
    "ephemerd_github_api_rate_reset_seconds",
    "ephemerd_github_api_rate_updated_seconds",
    "ephemerd_github_api_requests_total",
    "ephemerd_github_webhook_events_total",
    "ephemerd_github_jit_registration_errors_total",
    "ephemerd_jobs_total",
    "ephemerd_jobs_active",
    "ephemerd_job_queue_wait_seconds",
    "ephemerd_job_startup_seconds",
    "ephemerd_job_duration_seconds",
    "ephemerd_claim_retry_queue_depth",
    "ephemerd_claim_retry_attempts_total",
    "ephemerd_claim_retry_given_up_total",
    "ephemerd_provisioner_restarts_total",
    "ephemerd_concurrent_capacity",
    "ephemerd_draining",
    "ephemerd_uptime_seconds",
    "ephemerd_reconcile_readmitted_total",
    "ephemerd_runner_version_info",
    "ephemerd_runner_release_behind_seconds",
    "ephemerd_warm_available",
];

#[cfg(test)]
mod tests {
    use crate::vocab::ErrorClass;

    #[test]
    fn class_names_match_the_contract() {
        let names: Vec<_> = ErrorClass::ALL.iter().map(|c| c.as_str()).collect();
        assert_eq!(names, super::ERROR_CLASSES);
    }
}
