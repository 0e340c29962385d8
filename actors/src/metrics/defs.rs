//! Every metric of [`super::Metrics`] as data: its name, help, labels and buckets, in one
//! table, and the registrar that makes each series from its row. A row's name is the contract's
//! (docs/metrics.md); the unit tests check that every row is made once and every contract name
//! has a row.

use prometheus::{
    Gauge, Histogram, HistogramOpts, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts,
    Registry,
};

use super::{must, register};

/// One metric.
pub(super) struct Def {
    /// Its name.
    pub(super) name: &'static str,
    /// Its help text.
    pub(super) help: &'static str,
    /// Its labels (none: a single series).
    pub(super) labels: &'static [&'static str],
    /// A per-credential series: with several targets it carries a `target` label too.
    pub(super) per_target: bool,
    /// A histogram's buckets.
    pub(super) buckets: &'static [f64],
}

/// A row of [`DEFS`] with the usual defaults.
const fn def(name: &'static str, help: &'static str, labels: &'static [&'static str]) -> Def {
    Def {
        name,
        help,
        labels,
        per_target: false,
        buckets: &[],
    }
}

/// A per-credential row ([`Def::per_target`]).
const fn per_target(
    name: &'static str,
    help: &'static str,
    labels: &'static [&'static str],
) -> Def {
    Def {
        per_target: true,
        ..def(name, help, labels)
    }
}

/// A histogram's row.
const fn histogram(name: &'static str, help: &'static str, buckets: &'static [f64]) -> Def {
    Def {
        buckets,
        ..def(name, help, &[])
    }
}

/// The daemon's own metrics (the scale-set and warm families have theirs in their modules).
pub(super) const DEFS: &[Def] = &[
    def(
        "ephemerd_jobs_active",
        "Runners alive per provider, bound to a job or not.",
        &["provider"],
    ),
    def(
        "ephemerd_claim_retry_given_up_total",
        "Jobs whose claim retries were given up after max_age.",
        &[],
    ),
    def(
        "ephemerd_reconcile_repo_failures_total",
        "Repos whose listing failed in a reconcile pass (their jobs wait for the next pass).",
        &[],
    ),
    def(
        "ephemerd_runner_release_check_failures_total",
        "Runner release lookups (the releases API, a download) that failed.",
        &[],
    ),
    def(
        "ephemerd_ledger_round_trips_total",
        "Fleet mode: round trips to the cluster ledger (statements sent together are one).",
        &[],
    ),
    per_target(
        "ephemerd_github_api_rate_remaining",
        "GitHub API requests left in the current window of each bucket (last reading).",
        &["resource"],
    ),
    per_target(
        "ephemerd_github_api_rate_limit",
        "GitHub API requests allowed per window.",
        &["resource"],
    ),
    per_target(
        "ephemerd_github_api_rate_reset_seconds",
        "Unix time at which the GitHub API window resets.",
        &["resource"],
    ),
    per_target(
        "ephemerd_github_api_rate_updated_seconds",
        "Unix time of the last rate-limit reading; compare with time() for staleness.",
        &["resource"],
    ),
    per_target(
        "ephemerd_github_api_requests_total",
        "GitHub API requests by endpoint and HTTP status (\"error\" when no response).",
        &["endpoint", "code"],
    ),
    def(
        "ephemerd_github_webhook_events_total",
        "workflow_job webhook deliveries accepted, by action.",
        &["action"],
    ),
    def(
        "ephemerd_webhook_ignored_total",
        "workflow_job events outside the configured owner, repos or installation, by reason.",
        &["reason"],
    ),
    def(
        "ephemerd_webhook_unknown_installation_total",
        "workflow_job deliveries naming an App installation this daemon does not know: logged with their ids, not acted on; the reconcile admits the owner's jobs.",
        &[],
    ),
    def(
        "ephemerd_environment_failures_total",
        "Runner environments that failed to come up or exited before their job started, by provider.",
        &["provider"],
    ),
    def(
        "ephemerd_teardown_unremoved",
        "Trees (job directories, VM run directories) teardowns could not remove yet, by provider; each is tried again later and doctor names it.",
        &["provider"],
    ),
    def(
        "ephemerd_egress_refused_total",
        "Egress a pool's allow-list refused, by pool and kind (dns: a lookup; connect: an address a job tried, once per job).",
        &["pool", "kind"],
    ),
    def(
        "ephemerd_reconcile_readmitted_total",
        "Jobs GitHub lists as queued that the backstop admitted, by reason (unknown, idle, parked).",
        &["reason"],
    ),
    def(
        "ephemerd_reconcile_queued_idle",
        "Jobs the last reconcile passes found queued on GitHub that the daemon holds idle (parked or cordoned).",
        &[],
    ),
    def(
        "ephemerd_jobs_parked_total",
        "Jobs parked until a later look, by reason (zombie, gave_up, not_retryable).",
        &["reason"],
    ),
    def(
        "ephemerd_runner_version_info",
        "1 for the actions/runner version each pool starts.",
        &["pool", "version"],
    ),
    def(
        "ephemerd_runner_release_behind_seconds",
        "Seconds since a runner release newer than the pool's came out (0: current).",
        &["pool"],
    ),
    def(
        "ephemerd_runner_below_minimum",
        "1 while the pool's runner is older than runner.min_version.",
        &["pool"],
    ),
    def(
        "ephemerd_runner_refused_as_old_total",
        "Runners that exited with code 7: GitHub refused their version as too old (the pool's install is updated at once when the daemon manages it).",
        &["pool"],
    ),
    def(
        "ephemerd_runner_refusal_outages_total",
        "Outages in which GitHub refused a pool's runner although its install is the newest release: its jobs waited for the service, one probing it at a time.",
        &["pool"],
    ),
    def(
        "ephemerd_runner_release_refused_total",
        "Runner releases downloaded and not installed, by reason (digest, no_checksum, unpack).",
        &["reason"],
    ),
    def(
        "ephemerd_store_healthy",
        "1 while the state store's writes reach the disk; 0 while it holds changes in memory.",
        &[],
    ),
    def(
        "ephemerd_ledger_up",
        "Fleet mode: 1 while the cluster ledger answers; 0 while it does not (deliveries get 503).",
        &[],
    ),
    def(
        "ephemerd_orphan_sweep_checks_total",
        "Busy checks the orphan sweep asked GitHub before reaping an unbound runner, by result.",
        &["result"],
    ),
    per_target(
        "ephemerd_github_jit_registration_errors_total",
        "Failed generate-jitconfig claims, by error class.",
        &["class"],
    ),
    def(
        "ephemerd_jobs_total",
        "Jobs finished on our runners, by provider and conclusion.",
        &["provider", "conclusion"],
    ),
    histogram(
        "ephemerd_job_queue_wait_seconds",
        "Time from the queued webhook to the runner process started.",
        &[
            0.1, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0,
        ],
    ),
    histogram(
        "ephemerd_job_startup_seconds",
        "Time from a successful claim to the runner process started.",
        &[
            0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0,
        ],
    ),
    histogram(
        "ephemerd_job_duration_seconds",
        "Time from runner started to torn down.",
        &[
            1.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0, 7200.0,
        ],
    ),
    def(
        "ephemerd_claim_retry_queue_depth",
        "Jobs waiting on the claim retry ladder.",
        &[],
    ),
    def(
        "ephemerd_claim_retry_attempts_total",
        "Claim retries scheduled, by the class of the failure that caused each.",
        &["class"],
    ),
    def(
        "ephemerd_provisioner_restarts_total",
        "Provisioner actors re-created by their restart policy.",
        &["provider"],
    ),
    def(
        "ephemerd_concurrent_capacity",
        "runner.max_concurrent: runners allowed at once across providers.",
        &[],
    ),
    def(
        "ephemerd_draining",
        "1 while cordoned or draining, else 0.",
        &[],
    ),
    def(
        "ephemerd_uptime_seconds",
        "Seconds since this instance started.",
        &[],
    ),
    def(
        "ephemerd_webhook_refused_total",
        "Webhook deliveries refused, by reason (bad_signature, bad_payload, wrong_shape, too_large, slow_body, mailbox_full, ledger_down, overloaded).",
        &["reason"],
    ),
    def(
        "ephemerd_webhook_redeliveries_total",
        "Failed webhook deliveries GitHub was asked to redeliver (requested), that then arrived (recovered), or whose ask GitHub refused (failed).",
        &["outcome"],
    ),
    def(
        "ephemerd_pull_polls_total",
        "Pull mode's GitHub requests: changed (a body, counted against core), unchanged (a free 304), error.",
        &["result"],
    ),
    def(
        "ephemerd_jobs_uncovered_total",
        "Queued jobs no enabled pool covers, by label set (the first 20 sets; other after).",
        &["labels"],
    ),
    def(
        "ephemerd_pool_up",
        "1 while a pool takes runners, 0 while it is down.",
        &["provider"],
    ),
    def(
        "ephemerd_build_info",
        "Always 1; the version and commit of this build.",
        &["version", "commit"],
    ),
    def(
        "process_resident_memory_bytes",
        "Resident memory of this process.",
        &[],
    ),
    def(
        "process_open_fds",
        "Open file descriptors of this process.",
        &[],
    ),
    def(
        "process_cpu_seconds_total",
        "User and system CPU time of this process.",
        &[],
    ),
];

/// Makes the series of [`DEFS`] in one registry.
pub(super) struct Registrar<'a> {
    pub(super) registry: &'a Registry,
    /// Several targets: per-credential rows get a `target` label.
    pub(super) per_target: bool,
}

impl Registrar<'_> {
    /// `name`'s row; a name with none is a programming error the unit tests catch.
    fn row(&self, name: &str) -> &'static Def {
        DEFS.iter()
            .find(|d| d.name == name)
            .unwrap_or_else(|| panic!("no metric definition named {name}"))
    }

    fn labels(&self, d: &Def) -> Vec<&'static str> {
        let mut labels = d.labels.to_vec();
        if d.per_target && self.per_target {
            labels.push("target");
        }
        labels
    }

    pub(super) fn gauge(&self, name: &str) -> IntGauge {
        let d = self.row(name);
        register(self.registry, must(IntGauge::new(d.name, d.help)))
    }

    pub(super) fn float_gauge(&self, name: &str) -> Gauge {
        let d = self.row(name);
        register(self.registry, must(Gauge::new(d.name, d.help)))
    }

    pub(super) fn counter(&self, name: &str) -> IntCounter {
        let d = self.row(name);
        register(self.registry, must(IntCounter::new(d.name, d.help)))
    }

    pub(super) fn gauge_vec(&self, name: &str) -> IntGaugeVec {
        let d = self.row(name);
        let opts = Opts::new(d.name, d.help);
        register(self.registry, must(IntGaugeVec::new(opts, &self.labels(d))))
    }

    pub(super) fn counter_vec(&self, name: &str) -> IntCounterVec {
        let d = self.row(name);
        let opts = Opts::new(d.name, d.help);
        register(
            self.registry,
            must(IntCounterVec::new(opts, &self.labels(d))),
        )
    }

    pub(super) fn histogram(&self, name: &str) -> Histogram {
        let d = self.row(name);
        let opts = HistogramOpts::new(d.name, d.help).buckets(d.buckets.to_vec());
        register(self.registry, must(Histogram::with_opts(opts)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_row_is_made_once_and_names_are_unique() {
        let m = super::super::Metrics::new();
        for d in DEFS {
            // A name already taken cannot be registered again: each row was made.
            let probe = IntGauge::new(d.name, d.help).unwrap();
            assert!(
                m.registry.register(Box::new(probe)).is_err(),
                "{} is not registered",
                d.name
            );
        }
        let mut names: Vec<&str> = DEFS.iter().map(|d| d.name).collect();
        names.sort_unstable();
        let before = names.len();
        names.dedup();
        assert_eq!(before, names.len(), "a name has two rows");
    }
}
