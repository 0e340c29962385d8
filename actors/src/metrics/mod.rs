//! `Metrics`: every metric docs/metrics.md lists, in one value that owns its own registry.
//!
//! The names are the original daemon's (`ephemerd_*`) so its Grafana dashboards keep working.
//! Labels are bounded: provider kind, error class, webhook action, endpoint template and HTTP
//! status. Never a job id, a repository or a runner name. A host app that embeds two instances
//! makes two `Metrics` and gets two registries; nothing registers with prometheus' global one.

mod defs;
mod names;
pub(crate) mod scaleset;
pub(crate) mod traces;
pub(crate) mod vm;
pub(crate) mod warm;

use std::time::Instant;

use prometheus::{
    Encoder, Histogram, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Registry, TextEncoder,
};

pub use names::{
    CONTRACT_METRICS, ERROR_CLASSES, IGNORE_REASONS, UNKNOWN_VERSION, WEBHOOK_ACTIONS,
};

/// The label sets named in `ephemerd_jobs_uncovered_total`, and the counter of each label list
/// seen (as a job spelled it: order and case as they came), up to [`UNCOVERED_LISTS`].
#[derive(Debug, Default)]
struct Uncovered {
    named: std::collections::BTreeSet<String>,
    counters: std::collections::HashMap<Box<[String]>, IntCounter>,
}

/// Label lists whose counter is remembered.
const UNCOVERED_LISTS: usize = 256;

/// Every metric the daemon exports. Cloning is cheap: each field is a shared handle.
#[derive(Clone, Debug)]
pub struct Metrics {
    registry: Registry,
    started: Instant,
    /// Several GitHub targets: the per-credential series (rate readings, API requests,
    /// registration errors) carry a `target` label.
    per_target: bool,
    /// `ephemerd_github_api_rate_remaining`: requests left in the window, per the last reading.
    pub rate_remaining: IntGaugeVec,
    /// `ephemerd_github_api_rate_limit`: the window's ceiling.
    pub rate_limit: IntGaugeVec,
    /// `ephemerd_github_api_rate_reset_seconds`: unix time the window resets.
    pub rate_reset_seconds: IntGaugeVec,
    /// `ephemerd_github_api_rate_updated_seconds`: unix time of the last reading.
    pub rate_updated_seconds: IntGaugeVec,
    /// `ephemerd_github_api_requests_total{endpoint,code}`
    pub api_requests: IntCounterVec,
    /// `ephemerd_github_webhook_events_total{action}`
    pub webhook_events: IntCounterVec,
    /// `ephemerd_webhook_ignored_total{reason}`: jobs outside the configured owner, repos or
    /// installation, accepted and left alone.
    pub webhook_ignored: IntCounterVec,
    /// `ephemerd_webhook_unknown_installation_total`: deliveries naming an App installation
    /// the daemon does not know (logged with their ids; the reconcile finds the owner's jobs).
    pub webhook_unknown_installation: IntCounter,
    /// `ephemerd_environment_failures_total{provider}`: runner environments that failed to come
    /// up (the pool is up, but its environments keep failing: an image or install that is broken).
    pub environment_failures: IntCounterVec,
    /// `ephemerd_teardown_unremoved{provider}`: trees (job directories, VM run directories)
    /// teardowns could not remove yet; each is tried again later and `doctor` names it.
    pub teardown_unremoved: IntGaugeVec,
    /// `ephemerd_egress_refused_total{pool,kind}`: lookups (`dns`) and addresses (`connect`,
    /// once per job) a pool's allow-list refused.
    pub egress_refused: IntCounterVec,
    /// `ephemerd_reconcile_repo_failures_total`: repos whose listing failed in a reconcile
    /// pass (the other repos' jobs were still found; this one's wait for the next pass).
    pub reconcile_repo_failures: IntCounter,
    /// `ephemerd_reconcile_readmitted_total{reason}`: jobs GitHub lists as queued that the
    /// backstop admitted: `unknown` (the daemon did not know it), `idle` (held with nothing in
    /// flight), `parked` (looked at again after its park).
    pub reconcile_readmitted: IntCounterVec,
    /// `ephemerd_reconcile_queued_idle`: jobs the last reconcile passes found queued on GitHub
    /// that the daemon holds idle (parked before their next look, or cordoned).
    pub reconcile_queued_idle: IntGauge,
    /// `ephemerd_jobs_parked_total{reason}`: jobs parked (`zombie`: its runners always reaped
    /// idle; `gave_up`: its claims failed past `max_age`; `not_retryable`).
    pub jobs_parked: IntCounterVec,
    /// `ephemerd_runner_version_info{pool,version}`: 1 for the runner version each pool starts.
    pub runner_version_info: IntGaugeVec,
    /// `ephemerd_runner_release_behind_seconds{pool}`: how long a newer runner release than the
    /// pool's has been out (0 when current, -1 when the pool's version or the latest release is
    /// unknown); GitHub wants updates within 30 days.
    pub runner_release_behind: IntGaugeVec,
    /// `ephemerd_runner_below_minimum{pool}`: 1 while the pool's runner is older than
    /// `runner.min_version`.
    pub runner_below_minimum: IntGaugeVec,
    /// `ephemerd_runner_refused_as_old_total{pool}`: runners that exited with code 7, GitHub
    /// having refused their version.
    pub runner_refused_as_old: IntCounterVec,
    /// `ephemerd_runner_refusal_outages_total{pool}`: outages in which GitHub refused the
    /// pool's newest runner release.
    pub runner_refusal_outages: IntCounterVec,
    /// `ephemerd_runner_release_refused_total{reason}`: releases downloaded and not installed
    /// (`digest`: the archive does not match its published SHA-256; `no_checksum`; `unpack`).
    pub runner_release_refused: IntCounterVec,
    /// `ephemerd_runner_release_check_failures_total`: release lookups that failed.
    pub runner_release_check_failures: IntCounter,
    /// `ephemerd_store_healthy`: 1 while the state store's writes reach the disk, 0 while it
    /// holds changes in memory that the disk refused.
    pub store_healthy: IntGauge,
    /// `ephemerd_ledger_up`: fleet mode: 1 while the cluster ledger answers, 0 while it does
    /// not (deliveries are answered 503 then).
    pub ledger_up: IntGauge,
    /// `ephemerd_ledger_round_trips_total`: fleet mode: round trips to the ledger (the
    /// statements of one pipelined batch are one).
    pub ledger_round_trips: IntCounter,
    /// `ephemerd_orphan_sweep_checks_total{result}`: the sweep's busy checks on GitHub before a
    /// reap (`idle`, `busy`, `error`), each one GET.
    pub sweep_checks: IntCounterVec,
    /// `ephemerd_github_jit_registration_errors_total{class}`
    pub jit_registration_errors: IntCounterVec,
    /// `ephemerd_jobs_total{provider,conclusion}`
    pub jobs_total: IntCounterVec,
    /// `ephemerd_jobs_active{provider}`: runners alive, bound or not.
    pub jobs_active: IntGaugeVec,
    /// `ephemerd_job_queue_wait_seconds`: queued webhook to runner started.
    pub job_queue_wait: Histogram,
    /// `ephemerd_job_startup_seconds`: claim to runner started.
    pub job_startup: Histogram,
    /// `ephemerd_job_duration_seconds`: runner started to torn down.
    pub job_duration: Histogram,
    /// `ephemerd_claim_retry_queue_depth`
    pub retry_queue_depth: IntGauge,
    /// `ephemerd_claim_retry_attempts_total{class}`
    pub retry_attempts: IntCounterVec,
    /// `ephemerd_claim_retry_given_up_total`
    pub retry_given_up: IntCounter,
    /// `ephemerd_provisioner_restarts_total{provider}`
    pub provisioner_restarts: IntCounterVec,
    /// `ephemerd_concurrent_capacity`: `runner.max_concurrent`.
    pub concurrent_capacity: IntGauge,
    /// `ephemerd_draining`: 1 while cordoned or draining.
    pub draining: IntGauge,
    /// `ephemerd_uptime_seconds`
    pub uptime_seconds: IntGauge,
    /// `ephemerd_webhook_refused_total{reason}`: deliveries refused (`bad_signature`,
    /// `bad_payload`, `wrong_shape`, `too_large`, `slow_body`, `mailbox_full`): a wrong secret
    /// or a hook of another content type shows here first.
    pub webhook_refused: IntCounterVec,
    /// `ephemerd_webhook_redeliveries_total{outcome}`: failed deliveries GitHub was asked to
    /// deliver again (`requested`), those that then came in (`recovered`), and asks GitHub
    /// refused (`failed`).
    pub webhook_redeliveries: IntCounterVec,
    /// Scale-set mode's series.
    pub scaleset: scaleset::ScaleSetMetrics,
    /// Warm pools' series.
    pub warm: warm::WarmMetrics,
    /// `linux_vm` pools' series.
    pub vm: vm::VmMetrics,
    /// The trace exporter's series.
    pub traces: traces::TraceMetrics,
    /// `ephemerd_pull_polls_total{result}`: pull mode's requests: `changed` (an answer with a
    /// body, which counts against the `core` rate limit), `unchanged` (a free 304), `error`.
    pub pull_polls: IntCounterVec,
    /// `ephemerd_jobs_uncovered_total{labels}`: queued jobs no enabled pool covers, by label
    /// set (the first [`UNCOVERED_SETS`] sets seen; `other` after): a label typo shows here.
    pub jobs_uncovered: IntCounterVec,
    uncovered_sets: std::sync::Arc<std::sync::Mutex<Uncovered>>,
    /// `ephemerd_pool_up{provider}`: 1 while a pool takes runners, 0 while it is down.
    pub pool_up: IntGaugeVec,
    /// `ephemerd_build_info{version,commit}`: always 1.
    pub build_info: IntGaugeVec,
    /// `process_resident_memory_bytes`, `process_cpu_seconds_total`, `process_open_fds`:
    /// this process, read at each scrape (Linux: `/proc/self`; macOS: `getrusage`, `/dev/fd`
    /// and `ps` for the resident size).
    process: ProcessGauges,
}

/// How many distinct label sets `ephemerd_jobs_uncovered_total` names before `other`.
pub const UNCOVERED_SETS: usize = 20;

#[derive(Clone, Debug)]
struct ProcessGauges {
    rss: IntGauge,
    cpu: prometheus::Gauge,
    fds: IntGauge,
}

impl ProcessGauges {
    /// Reads this process's figures, the macOS way: CPU from `getrusage`, open fds from
    /// `/dev/fd`, the resident size from `ps` (in KiB; macOS has no `/proc`, and its own calls
    /// for it need `unsafe`, which this library forbids).
    #[cfg(not(target_os = "linux"))]
    fn refresh(&self) {
        use nix::sys::resource::{UsageWho, getrusage};
        if let Ok(usage) = getrusage(UsageWho::RUSAGE_SELF) {
            let secs = |t: nix::sys::time::TimeVal| t.tv_sec() as f64 + t.tv_usec() as f64 / 1e6;
            self.cpu
                .set(secs(usage.user_time()) + secs(usage.system_time()));
        }
        if let Ok(dir) = std::fs::read_dir("/dev/fd") {
            // Less the descriptor of the listing itself.
            self.fds.set(dir.count().saturating_sub(1) as i64);
        }
        if let Some(kib) = std::process::Command::new("ps")
            .args(["-o", "rss=", "-p", &std::process::id().to_string()])
            .stdin(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .output()
            .ok()
            .and_then(|o| parse_ps_rss(&o.stdout))
        {
            self.rss.set(kib * 1024);
        }
    }

    /// Reads `/proc/self`: resident pages (`statm`), user + system ticks (`stat`), open fds.
    #[cfg(target_os = "linux")]
    fn refresh(&self) {
        let page = 4096;
        if let Some(pages) = std::fs::read_to_string("/proc/self/statm")
            .ok()
            .and_then(|s| s.split_whitespace().nth(1)?.parse::<i64>().ok())
        {
            self.rss.set(pages * page);
        }
        if let Some(ticks) = std::fs::read_to_string("/proc/self/stat")
            .ok()
            .and_then(|s| {
                // Fields after the command (which may hold spaces) start after its `)`.
                let rest = s.rsplit_once(')')?.1;
                let f: Vec<&str> = rest.split_whitespace().collect();
                // utime and stime are fields 14 and 15 of stat(5): 11 and 12 after the `)`.
                Some(f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?)
            })
        {
            // USER_HZ is 100 on every Linux the daemon targets.
            self.cpu.set(ticks as f64 / 100.0);
        }
        if let Ok(dir) = std::fs::read_dir("/proc/self/fd") {
            self.fds.set(dir.count() as i64);
        }
    }
}

/// The resident size `ps -o rss=` prints (KiB), if that is what it printed.
#[cfg_attr(target_os = "linux", allow(dead_code))]
fn parse_ps_rss(out: &[u8]) -> Option<i64> {
    std::str::from_utf8(out.get(..64.min(out.len()))?)
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// Registering a fresh metric in a fresh registry only fails on a programming error (a
/// duplicate or malformed name), which the unit test below catches.
/// Registers `c` in `registry` and hands it back (the per-mode series' modules use it).
fn register<C: prometheus::core::Collector + Clone + 'static>(registry: &Registry, c: C) -> C {
    must(registry.register(Box::new(c.clone())));
    c
}

fn must<T>(r: prometheus::Result<T>) -> T {
    r.unwrap_or_else(|e| panic!("metric definition is invalid: {e}"))
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// A fresh set of metrics in a fresh registry, with every bounded label value touched so
    /// each series exists from the first scrape.
    pub fn new() -> Self {
        Self::build(false)
    }

    /// Metrics for `config`: with several targets (`[[github.targets]]`), the rate gauges,
    /// `ephemerd_github_api_requests_total` and `ephemerd_github_jit_registration_errors_total`
    /// carry a `target` label; with one, the label sets are the contract's.
    pub fn for_config(config: &crate::config::Config) -> Self {
        Self::build(config.multi_target())
    }

    /// The label values of a per-credential series: `base`, then the target's name when the
    /// series carry a `target` label.
    pub fn target_labels<'a>(&self, base: &[&'a str], target: &'a str) -> Vec<&'a str> {
        let mut labels = base.to_vec();
        if self.per_target {
            labels.push(target);
        }
        labels
    }

    fn build(per_target: bool) -> Self {
        let registry = Registry::new();
        let r = defs::Registrar {
            registry: &registry,
            per_target,
        };
        let m = Metrics {
            started: Instant::now(),
            per_target,
            rate_remaining: r.gauge_vec("ephemerd_github_api_rate_remaining"),
            rate_limit: r.gauge_vec("ephemerd_github_api_rate_limit"),
            rate_reset_seconds: r.gauge_vec("ephemerd_github_api_rate_reset_seconds"),
            rate_updated_seconds: r.gauge_vec("ephemerd_github_api_rate_updated_seconds"),
            api_requests: r.counter_vec("ephemerd_github_api_requests_total"),
            webhook_events: r.counter_vec("ephemerd_github_webhook_events_total"),
            webhook_ignored: r.counter_vec("ephemerd_webhook_ignored_total"),
            webhook_unknown_installation: r.counter("ephemerd_webhook_unknown_installation_total"),
            environment_failures: r.counter_vec("ephemerd_environment_failures_total"),
            teardown_unremoved: r.gauge_vec("ephemerd_teardown_unremoved"),
            egress_refused: r.counter_vec("ephemerd_egress_refused_total"),
            reconcile_repo_failures: r.counter("ephemerd_reconcile_repo_failures_total"),
            reconcile_readmitted: r.counter_vec("ephemerd_reconcile_readmitted_total"),
            reconcile_queued_idle: r.gauge("ephemerd_reconcile_queued_idle"),
            jobs_parked: r.counter_vec("ephemerd_jobs_parked_total"),
            runner_version_info: r.gauge_vec("ephemerd_runner_version_info"),
            runner_release_behind: r.gauge_vec("ephemerd_runner_release_behind_seconds"),
            runner_below_minimum: r.gauge_vec("ephemerd_runner_below_minimum"),
            runner_refused_as_old: r.counter_vec("ephemerd_runner_refused_as_old_total"),
            runner_refusal_outages: r.counter_vec("ephemerd_runner_refusal_outages_total"),
            runner_release_refused: r.counter_vec("ephemerd_runner_release_refused_total"),
            runner_release_check_failures: r
                .counter("ephemerd_runner_release_check_failures_total"),
            ledger_round_trips: r.counter("ephemerd_ledger_round_trips_total"),
            store_healthy: r.gauge("ephemerd_store_healthy"),
            ledger_up: r.gauge("ephemerd_ledger_up"),
            sweep_checks: r.counter_vec("ephemerd_orphan_sweep_checks_total"),
            jit_registration_errors: r.counter_vec("ephemerd_github_jit_registration_errors_total"),
            jobs_total: r.counter_vec("ephemerd_jobs_total"),
            jobs_active: r.gauge_vec("ephemerd_jobs_active"),
            job_queue_wait: r.histogram("ephemerd_job_queue_wait_seconds"),
            job_startup: r.histogram("ephemerd_job_startup_seconds"),
            job_duration: r.histogram("ephemerd_job_duration_seconds"),
            retry_queue_depth: r.gauge("ephemerd_claim_retry_queue_depth"),
            retry_attempts: r.counter_vec("ephemerd_claim_retry_attempts_total"),
            retry_given_up: r.counter("ephemerd_claim_retry_given_up_total"),
            provisioner_restarts: r.counter_vec("ephemerd_provisioner_restarts_total"),
            concurrent_capacity: r.gauge("ephemerd_concurrent_capacity"),
            draining: r.gauge("ephemerd_draining"),
            uptime_seconds: r.gauge("ephemerd_uptime_seconds"),
            webhook_refused: r.counter_vec("ephemerd_webhook_refused_total"),
            webhook_redeliveries: r.counter_vec("ephemerd_webhook_redeliveries_total"),
            scaleset: scaleset::ScaleSetMetrics::new(&registry),
            warm: warm::WarmMetrics::new(&registry),
            vm: vm::VmMetrics::new(&registry),
            traces: traces::TraceMetrics::new(&registry),
            pull_polls: r.counter_vec("ephemerd_pull_polls_total"),
            jobs_uncovered: r.counter_vec("ephemerd_jobs_uncovered_total"),
            uncovered_sets: std::sync::Arc::default(),
            pool_up: r.gauge_vec("ephemerd_pool_up"),
            build_info: r.gauge_vec("ephemerd_build_info"),
            process: ProcessGauges {
                rss: r.gauge("process_resident_memory_bytes"),
                cpu: r.float_gauge("process_cpu_seconds_total"),
                fds: r.gauge("process_open_fds"),
            },
            registry,
        };
        m.touch_bounded_labels();
        m
    }

    /// Touches every series whose label values are bounded and known, so each exists (at 0)
    /// from the first scrape.
    fn touch_bounded_labels(&self) {
        let (m, per_target) = (self, self.per_target);
        for reason in [
            "bad_signature",
            "bad_payload",
            "wrong_shape",
            "too_large",
            "slow_body",
            "mailbox_full",
            "overloaded",
            "ledger_down",
        ] {
            m.webhook_refused.with_label_values(&[reason]);
        }
        for class in ERROR_CLASSES {
            if !per_target {
                m.jit_registration_errors.with_label_values(&[class]);
            }
            m.retry_attempts.with_label_values(&[class]);
        }
        for action in WEBHOOK_ACTIONS {
            m.webhook_events.with_label_values(&[action]);
        }
        // With a `target` label, a target's series appear with its first reading.
        let buckets = [
            crate::vocab::RateBucket::Core,
            crate::vocab::RateBucket::ActionsRunnerRegistration,
        ];
        for bucket in buckets.into_iter().filter(|_| !per_target) {
            for g in [
                &m.rate_remaining,
                &m.rate_limit,
                &m.rate_reset_seconds,
                &m.rate_updated_seconds,
            ] {
                g.with_label_values(&[bucket.as_str()]);
            }
        }
        for reason in IGNORE_REASONS {
            m.webhook_ignored.with_label_values(&[reason]);
        }
        for result in ["idle", "busy", "error"] {
            m.sweep_checks.with_label_values(&[result]);
        }
        for reason in ["unknown", "idle", "parked"] {
            m.reconcile_readmitted.with_label_values(&[reason]);
        }
        for reason in ["digest", "no_checksum", "unpack"] {
            m.runner_release_refused.with_label_values(&[reason]);
        }
        for reason in ["zombie", "gave_up", "not_retryable"] {
            m.jobs_parked.with_label_values(&[reason]);
        }
        for outcome in ["requested", "recovered", "failed"] {
            m.webhook_redeliveries.with_label_values(&[outcome]);
        }
        for result in ["changed", "unchanged", "error"] {
            m.pull_polls.with_label_values(&[result]);
        }
    }

    /// Touches every per-provider series, so an enabled provider shows zeros before its
    /// first job.
    pub fn init_provider(&self, provider: &str) {
        self.jobs_active.with_label_values(&[provider]);
        self.environment_failures.with_label_values(&[provider]);
        self.teardown_unremoved.with_label_values(&[provider]);
        self.provisioner_restarts.with_label_values(&[provider]);
        self.jobs_total.with_label_values(&[provider, "success"]);
        self.pool_up.with_label_values(&[provider]);
        self.warm.available.with_label_values(&[provider]);
    }

    /// A pool whose runner version is not known yet: `version="unknown"` at 0, and -1 behind
    /// (the `ReleaseActor` replaces both once it knows).
    pub fn init_runner_version(&self, pool: &str) {
        self.runner_version_info
            .with_label_values(&[pool, UNKNOWN_VERSION])
            .set(0);
        self.runner_release_behind
            .with_label_values(&[pool])
            .set(-1);
        self.runner_below_minimum.with_label_values(&[pool]).set(0);
        self.runner_refused_as_old.with_label_values(&[pool]);
        self.runner_refusal_outages.with_label_values(&[pool]);
    }

    /// The registry, for a host app that wants to serve or merge it itself.
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// Sets `ephemerd_build_info{version,commit}` (the binary knows its commit; an embedding
    /// application names its own).
    pub fn set_build_info(&self, version: &str, commit: &str) {
        self.build_info.reset();
        self.build_info.with_label_values(&[version, commit]).set(1);
    }

    /// Counts a queued job no pool covers under its label set (sorted, lowercase, joined by
    /// `,`), or `other` once [`UNCOVERED_SETS`] sets have been named. A label list seen before
    /// goes straight to its counter (a flood of one typo costs one lookup a job).
    pub fn job_uncovered(&self, labels: &[String]) {
        let mut u = self
            .uncovered_sets
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if let Some(counter) = u.counters.get(labels) {
            counter.inc();
            return;
        }
        let mut set: Vec<String> = labels.iter().map(|l| l.to_ascii_lowercase()).collect();
        set.sort();
        set.dedup();
        let key = set.join(",");
        let label = if u.named.contains(&key) || u.named.len() < UNCOVERED_SETS {
            u.named.insert(key.clone());
            key
        } else {
            "other".to_string()
        };
        let counter = self.jobs_uncovered.with_label_values(&[&label]);
        counter.inc();
        if u.counters.len() < UNCOVERED_LISTS {
            u.counters.insert(labels.into(), counter);
        }
    }

    /// Prometheus text exposition of every metric, with uptime and the process gauges
    /// refreshed.
    pub fn encode(&self) -> String {
        self.process.refresh();
        self.uptime_seconds.set(
            self.started
                .elapsed()
                .as_secs()
                .try_into()
                .unwrap_or(i64::MAX),
        );
        let mut buf = Vec::new();
        // Encoding into a Vec cannot fail for the text format.
        let _ = TextEncoder::new().encode(&self.registry.gather(), &mut buf);
        String::from_utf8(buf).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The macOS resident size comes from `ps -o rss=`: its answer is read as KiB, and on this
    /// host `ps` gives this process a size (the same call macOS takes).
    #[test]
    fn the_resident_size_is_read_from_ps() {
        assert_eq!(parse_ps_rss(b"  12345\n"), Some(12345));
        assert_eq!(parse_ps_rss(b""), None);
        assert_eq!(parse_ps_rss(b"RSS\n"), None);
        if let Ok(out) = std::process::Command::new("ps")
            .args(["-o", "rss=", "-p", &std::process::id().to_string()])
            .output()
        {
            assert!(
                parse_ps_rss(&out.stdout).is_some_and(|kib| kib > 0),
                "{out:?}"
            );
        }
    }

    #[test]
    fn every_contract_metric_is_registered_and_instances_are_independent() {
        let a = Metrics::new();
        let b = Metrics::new();
        a.init_provider("local");
        a.init_runner_version("local");
        a.api_requests
            .with_label_values(&["generate_jitconfig", "201"])
            .inc();
        a.draining.set(1);
        let text = a.encode();
        for name in CONTRACT_METRICS {
            assert!(text.contains(&format!("# TYPE {name} ")), "{name} missing");
        }
        assert!(text.contains("ephemerd_draining 1"));
        assert!(b.encode().contains("ephemerd_draining 0"));
    }

    #[test]
    fn uncovered_label_sets_are_bounded_and_the_process_is_measured() {
        let m = Metrics::new();
        m.job_uncovered(&["Linux".into(), "self-hosted".into()]);
        m.job_uncovered(&["self-hosted".into(), "linux".into()]);
        for i in 0..30 {
            m.job_uncovered(&[format!("gpu{i}")]);
        }
        let text = m.encode();
        assert!(
            text.contains(r#"ephemerd_jobs_uncovered_total{labels="linux,self-hosted"} 2"#),
            "{text}"
        );
        let named = text
            .lines()
            .filter(|l| l.starts_with("ephemerd_jobs_uncovered_total{"))
            .count();
        assert_eq!(named, UNCOVERED_SETS + 1, "20 sets and other");
        assert!(
            text.contains(r#"ephemerd_jobs_uncovered_total{labels="other"} 11"#),
            "{text}"
        );
        let rss: i64 = text
            .lines()
            .find_map(|l| l.strip_prefix("process_resident_memory_bytes "))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        assert!(rss > 1024 * 1024, "{rss}");
    }
}
