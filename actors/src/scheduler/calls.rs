//! The scheduler shell's GitHub calls that report back to the core: registration deletions
//! (a failed one is tried again on the core's schedule) and a parked job's look.

use actix::{ActorFutureExt, AsyncContext, Context, WrapFuture};

use super::{actor::SchedulerActor, core::Deletion};
use crate::{
    github::{
        GithubError,
        actor::{DeleteRunner, GetJob},
    },
    job::JobKey,
};

impl SchedulerActor {
    /// Deletes a registration and tells the core how it went.
    pub(super) fn delete_runner(&mut self, deletion: Deletion, ctx: &mut Context<Self>) {
        let delete = self.github(&deletion.owner).delete.clone();
        self.calls_in_flight += 1;
        let msg = DeleteRunner {
            repo: deletion.repo.clone(),
            runner_id: deletion.runner_id,
        };
        let call = async move { flatten(delete.send(msg).await, "delete_runner") };
        ctx.spawn(call.into_actor(self).map(move |result, act, ctx| {
            act.calls_in_flight -= 1;
            let now = act.clock.tick();
            let fx = act.core.on_runner_deleted(deletion, result, now);
            act.run(fx, ctx);
        }));
    }

    /// Asks GitHub for a parked job's state and tells the core.
    pub(super) fn look_at_job(&mut self, key: JobKey, repo: String, ctx: &mut Context<Self>) {
        let get = self.github(&key.owner).get_job.clone();
        self.calls_in_flight += 1;
        let msg = GetJob {
            repo,
            job_id: key.job_id,
        };
        let call = async move { flatten(get.send(msg).await, "get_job").map(|(_, status)| status) };
        ctx.spawn(call.into_actor(self).map(move |status, act, ctx| {
            act.calls_in_flight -= 1;
            let now = act.clock.tick();
            let fx = act.core.on_job_looked(&key, status, now);
            act.run(fx, ctx);
        }));
    }
}

/// A GitHub actor's answer, with its mailbox failure as a network error.
pub(super) fn flatten<T>(
    answer: Result<Result<T, GithubError>, actix::MailboxError>,
    endpoint: &'static str,
) -> Result<T, GithubError> {
    answer.unwrap_or_else(|e| {
        Err(GithubError::Network {
            endpoint,
            detail: e.to_string(),
        })
    })
}
