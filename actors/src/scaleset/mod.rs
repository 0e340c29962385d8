//! Scale-set mode (`webhook.mode = "scaleset"`): each pool is one of GitHub's runner scale
//! sets, and a [`ScaleSetListener`] per pool holds the scale set's message session and long-polls
//! its queue. No webhook, no inbound port, no REST polling: GitHub assigns a job to one scale
//! set, so a pool's runners never take another pool's job.
//!
//! A message's job messages go through the intake's gate as webhook deliveries do
//! (`JobAssigned` is a `queued`, `JobStarted` an `in_progress`, `JobCompleted` a `completed`;
//! the job's identity is its `jobId` and the assignment it is on, see [`inbox`]), so they meet
//! the same dedup and durable record; the message is acknowledged (deleted) only once all of
//! them are durable, and its id is kept in the store as the `lastMessageId` a restart resumes
//! from. `JobAvailable` jobs (a GHES offers before it assigns) are acquired. A message that
//! cannot be read is counted, logged and acknowledged: it never blocks the queue.
//! Claims for a pool go to its listener, which registers the runner in the scale set
//! (`generatejitconfig`): they climb the ladder as REST claims do.

mod lease;
mod link;
pub(crate) mod listener;
mod poll;
mod reckon;
pub mod record;
mod view;

pub use listener::{ScaleSetListener, ScaleSetSettings, ScaleSetWiring};
pub use view::{GetListener, ListenerView};

pub use ephemer_decide::scaleset::{
    Mark, Resolved, ack_settles, dropped_labels, inbox, machine, mark_of, reckoning,
};
