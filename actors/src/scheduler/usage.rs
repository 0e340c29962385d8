//! `GetUsage`: the usage rows the store holds, read after every change the scheduler made
//! before the question (so a job just completed is counted).

use actix::{Context, Handler, ResponseFuture};

use super::{actor::SchedulerActor, messages::GetUsage};
use crate::durable::UsageRow;

impl Handler<GetUsage> for SchedulerActor {
    type Result = ResponseFuture<Result<Vec<UsageRow>, String>>;

    fn handle(&mut self, m: GetUsage, _: &mut Context<Self>) -> Self::Result {
        self.persist();
        let store = self.deps.store.clone();
        Box::pin(async move {
            match store {
                Some(store) => store
                    .usage_since(m.since_unix)
                    .await
                    .map_err(|e| e.to_string()),
                None => Err("this instance keeps no state store, where usage is kept".into()),
            }
        })
    }
}
