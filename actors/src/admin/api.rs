//! The admin API's answers, as types both sides use: the admin handlers serialize them and
//! `ephemer-actors status|jobs|cordon` deserializes them. They are the scheduler's own views;
//! a job's timeline travels as its sentences.

use serde::{Deserialize, Serialize};

use crate::scheduler::core::StatusView;
pub use crate::scheduler::core::{JobDetail as JobAnswer, JobsView as JobsAnswer};
use crate::{
    retry::RetryTimerView,
    vocab::{RateBucket, RateSnapshot},
};

/// `GET /api/v1/status`
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StatusAnswer {
    /// Daemon version.
    pub version: String,
    /// Seconds since the instance started.
    pub uptime_seconds: u64,
    /// The scheduler's summary: cordon, capacity, providers, counts.
    #[serde(flatten)]
    pub scheduler: StatusView,
    /// The ladder's one timer.
    pub retry_timer: Option<RetryTimerView>,
    /// The latest rate-limit reading of each bucket of the credential.
    pub rates: std::collections::BTreeMap<RateBucket, RateSnapshot>,
    /// Fleet mode: every host with its lease, pools and load.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fleet: Option<crate::cluster::FleetView>,
    /// The runner's latest release and each pool's version (when they are looked at).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runner: Option<crate::release::actor::RunnerReleaseView>,
    /// Scale-set mode: each pool's listener.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub scalesets: Vec<crate::scaleset::ListenerView>,
}

/// `POST /api/v1/cordon`, `/uncordon`
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub struct CordonAnswer {
    /// Cordoned now.
    pub cordoned: bool,
}

/// Any refusal.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ErrorAnswer {
    /// Why.
    pub error: String,
}
