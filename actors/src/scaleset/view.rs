//! A listener as `status` shows it, and the one place its state and statistics are set (the
//! gauges and the view together).

use actix::{Context, Handler};

use super::listener::{ScaleSetListener, Shared, values};
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
        let (state, why) = s.state.borrow().clone();
        actix::MessageResult(ListenerView {
            pool: s.settings.pool.to_string(),
            owner: s.client.owner().to_string(),
            scale_set_id: *s.set_id.borrow(),
            state: state.to_string(),
            why,
            last_message_id: s.mark.borrow().last_message_id,
            statistics: *s.statistics.borrow(),
        })
    }
}

/// Sets the session's state, in the gauge and for `status`.
pub(super) fn set_state(shared: &Shared, state: &'static str, why: impl Into<String>) {
    shared
        .metrics
        .scaleset
        .set_session(shared.settings.pool.as_str(), state);
    *shared.state.borrow_mut() = (state, why.into());
}

/// Records a message's statistics, in the gauges and for `status`.
pub(super) fn observe(shared: &Shared, stats: &Statistics) {
    shared
        .metrics
        .scaleset
        .observe(shared.settings.pool.as_str(), values(stats));
    *shared.statistics.borrow_mut() = Some(*stats);
}
