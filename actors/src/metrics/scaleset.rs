//! Scale-set mode's series, per pool (labels bounded: pools are configured, message types and
//! results are fixed words). Part of the daemon's `Metrics`, registered with them.

use prometheus::{IntCounterVec, IntGaugeVec, Opts, Registry};

/// The statistics' names, the `stat` label.
pub(crate) const STATS: [&str; 7] = [
    "available",
    "acquired",
    "assigned",
    "running",
    "registered",
    "busy",
    "idle",
];

/// The session's states, the `state` label.
pub(crate) const SESSION_STATES: [&str; 3] = ["listening", "held_elsewhere", "reconnecting"];

/// The series.
#[derive(Debug, Clone)]
pub struct ScaleSetMetrics {
    /// `ephemerd_scaleset_statistics{pool,stat}`: the service's statistics of each scale set
    /// as its last message said (`assigned` is the runners the scale set needs).
    pub statistics: IntGaugeVec,
    /// `ephemerd_scaleset_messages_total{pool,type}`: job messages handled, by type
    /// (`JobAvailable`, `JobAssigned`, `JobStarted`, `JobCompleted`, `unreadable`).
    pub messages: IntCounterVec,
    /// `ephemerd_scaleset_acquire_total{pool,result}`: jobs asked for with `acquirejobs`:
    /// `acquired`, `lost` (taken or cancelled meanwhile), `error`.
    pub acquire: IntCounterVec,
    /// `ephemerd_scaleset_session{pool,state}`: 1 for the state the pool's listener is in
    /// (`listening`, `held_elsewhere`: another owner holds the session, `reconnecting`).
    pub session: IntGaugeVec,
    /// `ephemerd_scaleset_reckoned_total{pool,action}`: what the reckoning of a scale set's
    /// `totalAssignedJobs` against the jobs this daemon holds did: `fill` (a placeholder
    /// claimed a runner for an assigned job the daemon never heard of), `withdraw` (a
    /// placeholder or a job of a re-created scale set dropped, GitHub no longer assigning it).
    pub reckoned: IntCounterVec,
    /// `ephemerd_scaleset_labels_dropped{pool}`: the pool's labels its scale set lacks, as
    /// read back after it was found, made or changed (jobs asking for them do not reach it).
    pub labels_dropped: IntGaugeVec,
}

use super::register;

impl ScaleSetMetrics {
    /// The series, registered in `registry`.
    pub fn new(registry: &Registry) -> Self {
        let gauges = |name: &str, help: &str, labels: &[&str]| {
            super::must(IntGaugeVec::new(Opts::new(name, help), labels))
        };
        let counters = |name: &str, help: &str, labels: &[&str]| {
            super::must(IntCounterVec::new(Opts::new(name, help), labels))
        };
        ScaleSetMetrics {
            statistics: register(
                registry,
                gauges(
                    "ephemerd_scaleset_statistics",
                    "A scale set's statistics as its last message said (assigned: the runners it needs).",
                    &["pool", "stat"],
                ),
            ),
            messages: register(
                registry,
                counters(
                    "ephemerd_scaleset_messages_total",
                    "Scale-set job messages handled, by type.",
                    &["pool", "type"],
                ),
            ),
            acquire: register(
                registry,
                counters(
                    "ephemerd_scaleset_acquire_total",
                    "Jobs asked for with acquirejobs: acquired, lost (taken or cancelled meanwhile), error.",
                    &["pool", "result"],
                ),
            ),
            session: register(
                registry,
                gauges(
                    "ephemerd_scaleset_session",
                    "1 for the state of a pool's message session: listening, held_elsewhere, reconnecting.",
                    &["pool", "state"],
                ),
            ),
            reckoned: register(
                registry,
                counters(
                    "ephemerd_scaleset_reckoned_total",
                    "The reckoning of a scale set's assigned jobs against the daemon's: fill (a runner for an assigned job never heard of), withdraw (a job no longer assigned dropped).",
                    &["pool", "action"],
                ),
            ),
            labels_dropped: register(
                registry,
                gauges(
                    "ephemerd_scaleset_labels_dropped",
                    "The pool's labels its scale set lacks, as read back from the service (jobs asking for them do not reach the pool).",
                    &["pool"],
                ),
            ),
        }
    }

    /// Touches a pool's series so they show zeros before its first message.
    pub fn init_pool(&self, pool: &str) {
        for stat in STATS {
            self.statistics.with_label_values(&[pool, stat]);
        }
        for kind in [
            "JobAvailable",
            "JobAssigned",
            "JobStarted",
            "JobCompleted",
            "unreadable",
        ] {
            self.messages.with_label_values(&[pool, kind]);
        }
        for result in ["acquired", "lost", "error"] {
            self.acquire.with_label_values(&[pool, result]);
        }
        for action in ["fill", "withdraw"] {
            self.reckoned.with_label_values(&[pool, action]);
        }
        self.labels_dropped.with_label_values(&[pool]);
        self.set_session(pool, "reconnecting");
    }

    /// Sets the pool's session state.
    pub fn set_session(&self, pool: &str, state: &str) {
        for s in SESSION_STATES {
            self.session
                .with_label_values(&[pool, s])
                .set(i64::from(s == state));
        }
    }

    /// Records a message's statistics, in the order of [`STATS`].
    pub fn observe(&self, pool: &str, values: [u64; 7]) {
        for (stat, v) in STATS.iter().zip(values) {
            self.statistics
                .with_label_values(&[pool, stat])
                .set(i64::try_from(v).unwrap_or(i64::MAX));
        }
    }
}
