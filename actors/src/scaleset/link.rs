//! `Link`: what one listener's loop owns while it runs: the connection to the Actions
//! service, the mark it keeps in the store, the open session, the statistics of the last
//! message and the reckoning's last reading. Owned values, changed only by the loop (no shared
//! cells): the lease, the reckoning and the scale set's record take it as `&mut Link`.

use super::{Mark, reckoning::Reckoner};
use crate::{
    cluster::Ledger,
    config::PoolName,
    durable::Op,
    github::actions::{
        ActionsClient,
        types::{Session, Statistics},
    },
    metrics::Metrics,
    scheduler::SchedulerActor,
    store::Store,
    webhook::Deliver,
};
use actix::Recipient;

/// What a listener serves.
#[derive(Debug, Clone)]
pub struct ScaleSetSettings {
    /// The pool (its scale set has the pool's name, which is also its first label).
    pub pool: PoolName,
    /// The pool's labels: the scale set's labels after its name.
    pub labels: Vec<String>,
    /// What the pool can run at once: its `max_concurrent`, bounded by the host's
    /// `runner.max_concurrent`. Sent as `X-ScaleSetMaxCapacity` on every poll.
    pub max: usize,
    /// The daemon keeps the pool's runner install current: the scale set's runners are
    /// registered with their own updates off (`RunnerSetting.disableUpdate`).
    pub disable_update: bool,
    /// `github.runner_group` (a name), if set.
    pub runner_group: Option<String>,
    /// `github.runner_group_id`.
    pub runner_group_id: u64,
    /// The session's owner name (`<host>-<install id>`): who listens, as the service shows it.
    pub owner_name: String,
    /// What the store held for this pool at start.
    pub mark: Mark,
}

/// Who a listener talks to.
#[derive(Debug, Clone)]
pub struct ScaleSetWiring {
    /// The intake's gate (dedup, durable record, fleet ledger).
    pub intake: Recipient<Deliver>,
    /// The scheduler, for the jobs it holds (the reckoning).
    pub scheduler: actix::WeakAddr<SchedulerActor>,
    /// The store, for the mark.
    pub store: Option<Store>,
    /// Fleet mode: the ledger, whose lease says which host listens.
    pub ledger: Option<Ledger>,
}

/// What the listener's loop owns.
#[derive(Debug)]
pub(super) struct Link {
    pub(super) client: ActionsClient,
    pub(super) settings: ScaleSetSettings,
    pub(super) wiring: ScaleSetWiring,
    pub(super) metrics: Metrics,
    pub(super) mark: Mark,
    /// The open session (its queue URL and token).
    pub(super) session: Option<Session>,
    /// The statistics the last message carried.
    pub(super) statistics: Option<Statistics>,
    /// The reckoning's last reading.
    pub(super) reckoner: Reckoner,
    /// The labels warning was given (once per run).
    pub(super) said_dropped: bool,
    /// The pool's labels the service's scale set lacks, as last read back (`status`).
    pub(super) dropped_now: Vec<String>,
}

impl Link {
    /// A link for `settings.pool`, from the mark the store held.
    pub(super) fn new(
        client: ActionsClient,
        settings: ScaleSetSettings,
        wiring: ScaleSetWiring,
        metrics: Metrics,
    ) -> Self {
        Link {
            client,
            mark: settings.mark.clone(),
            settings,
            wiring,
            metrics,
            session: None,
            statistics: None,
            reckoner: Reckoner::default(),
            said_dropped: false,
            dropped_now: Vec::new(),
        }
    }

    /// The pool's name.
    pub(super) fn pool(&self) -> &str {
        self.settings.pool.as_str()
    }

    /// Records a message's statistics, in the gauges and for `status`.
    pub(super) fn observe(&mut self, stats: &Statistics) {
        self.metrics
            .scaleset
            .observe(self.settings.pool.as_str(), values(stats));
        self.statistics = Some(*stats);
    }

    /// Writes the mark (best effort: a lost write costs a message seen twice, which dedups).
    pub(super) async fn save_mark(&self) {
        let Some(store) = &self.wiring.store else {
            return;
        };
        let name = super::mark_of(self.client.owner(), self.pool());
        let value = serde_json::to_value(&self.mark).unwrap_or_default();
        if let Err(e) = store.write(vec![Op::PutMark(name, value)]).await {
            tracing::warn!(error = %e, "scale set: cannot keep the message id in the store");
        }
    }
}

/// The ledger's key of a pool's scale set: `<owner>/<pool>`.
pub(super) fn lease_key(client: &ActionsClient, pool: &str) -> String {
    format!("{}/{pool}", client.owner().to_ascii_lowercase())
}

/// The statistics in the order of the gauge's `stat` label.
fn values(s: &Statistics) -> [u64; 7] {
    [
        s.total_available_jobs,
        s.total_acquired_jobs,
        s.total_assigned_jobs,
        s.total_running_jobs,
        s.total_registered_runners,
        s.total_busy_runners,
        s.total_idle_runners,
    ]
}
