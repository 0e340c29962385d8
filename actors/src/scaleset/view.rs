//! A listener as `status` shows it.

use actix::{Context, Handler};

use super::listener::ScaleSetListener;
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
    /// The pool's labels the service dropped from its scale set, as last read back: jobs
    /// asking for them do not reach the pool.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub dropped_labels: Vec<String>,
}

/// Asks a listener for its [`ListenerView`].
#[derive(Debug, Clone, Copy, actix::Message)]
#[rtype(result = "ListenerView")]
pub struct GetListener;

impl Handler<GetListener> for ScaleSetListener {
    type Result = actix::MessageResult<GetListener>;

    fn handle(&mut self, _: GetListener, _: &mut Context<Self>) -> Self::Result {
        let p = self.published.borrow();
        actix::MessageResult(ListenerView {
            pool: self.pool.to_string(),
            owner: self.owner().to_string(),
            scale_set_id: p.set,
            state: p.state.as_str().to_string(),
            why: p.why.clone(),
            last_message_id: p.last_message_id,
            statistics: p.statistics,
            dropped_labels: p.dropped_labels.clone(),
        })
    }
}
