//! A listener as `status` shows it, and the one place its state and statistics are set (the
//! gauges and the view together).

use actix::{Context, Handler};

use super::listener::{ScaleSetListener, Shared};
use crate::github::actions::types::Statistics;

/// One listener, as `status` shows it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ListenerView {
    /// The pool.
    pub pool: String,
    /// The owner (target) it listens for.
    pub owner: String,
    /// Its scale set, once known.
    pub scale_set_id: Option<u64>,
    /// `listening`, `held_elsewhere` or `reconnecting`.
    pub state: String,
    /// Why (who holds the session, what failed), when not listening.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub why: String,
    /// The last message acknowledged.
    pub last_message_id: u64,
    /// The statistics of the last message.
    pub statistics: Option<Statistics>,
}

/// Asks a listener for its [`ListenerView`].
#[derive(Debug, Clone, Copy, actix::Message)]
#[rtype(result = "ListenerView")]
pub struct GetListener;

impl Handler<GetListener> for ScaleSetListener {
    type Result = actix::MessageResult<GetListener>;

    fn handle(&mut self, _: GetListener, _: &mut Context<Self>) -> Self::Result {
        let s = &self.shared;
        let (state, why) = self.machine.state();
        actix::MessageResult(ListenerView {
            pool: s.settings.pool.to_string(),
            owner: s.client.owner().to_string(),
            scale_set_id: self.machine.set(),
            state: state.as_str().to_string(),
            why: why.to_string(),
            last_message_id: s.mark.borrow().last_message_id,
            statistics: *s.statistics.borrow(),
        })
    }
}

/// Records a message's statistics, in the gauges and for `status`.
pub(super) fn observe(shared: &Shared, stats: &Statistics) {
    shared
        .metrics
        .scaleset
        .observe(shared.settings.pool.as_str(), values(stats));
    *shared.statistics.borrow_mut() = Some(*stats);
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
