//! After a restart: this install's registrations on GitHub that no ledger runner names.

use actix::{ActorFutureExt, AsyncContext, Context, Recipient, WrapFuture};

use super::actor::{CLEANUP_WAITS, SchedulerActor};
use crate::github::actor::{DeleteRunner, ListRunners};

impl SchedulerActor {
    /// After a restart: registrations on GitHub of this install (its id in their names) that
    /// no ledger runner names belong to environments that are gone; delete those that are not
    /// busy. Another host's runners carry another id and are never touched. The ledger is
    /// checked again when the list is back, with no claim of ours in flight (a claim answered
    /// meanwhile is in the ledger by then; one still in flight could be in the list and not
    /// yet in the ledger, so the check waits for it).
    pub(super) fn delete_unledgered_runners(&mut self, ctx: &mut Context<Self>) {
        let prefix = format!("{}-", self.core.setup().name_prefix());
        // Every target's scopes: its repos, else its org (or enterprise).
        let scopes: Vec<(String, Recipient<ListRunners>, Option<String>)> = self
            .core
            .setup()
            .targets()
            .iter()
            .zip(&self.deps.github)
            .flat_map(|(t, gh)| {
                t.scopes()
                    .into_iter()
                    .map(|repo| (t.owner.clone(), gh.list_runners.clone(), repo))
            })
            .collect();
        ctx.spawn(
            async move {
                let mut found = Vec::new();
                for (owner, list, repo) in scopes {
                    let listed = list
                        .send(ListRunners {
                            repo: repo.clone(),
                            name_prefix: prefix.clone(),
                        })
                        .await;
                    match listed {
                        Ok(Ok(runners)) => found.extend(
                            runners
                                .into_iter()
                                .filter(|r| !r.busy)
                                .map(|r| (owner.clone(), repo.clone(), r.id, r.name)),
                        ),
                        _ => {
                            tracing::warn!(%owner, repo = repo.as_deref().unwrap_or("(the owner's runners)"), "cannot list runners to clean up after a restart")
                        }
                    }
                }
                found
            }
            .into_actor(self)
            .map(|found, act, ctx| {
                let found = found
                    .into_iter()
                    .filter(|(_, _, _, n)| act.core.setup().is_ours(n))
                    .collect();
                act.delete_unledgered(found, CLEANUP_WAITS, ctx);
            }),
        );
    }

    /// Deletes the listed registrations the ledger does not name, once no claim is in flight
    /// (asked again every second, `waits` more times, else left for the next start).
    fn delete_unledgered(
        &mut self,
        found: Vec<(String, Option<String>, u64, String)>,
        waits: u32,
        ctx: &mut Context<Self>,
    ) {
        if self.claims_in_flight > 0 {
            if waits == 0 {
                tracing::info!("claims kept going; left leftover registrations for the next start");
                return;
            }
            ctx.run_later(std::time::Duration::from_secs(1), move |act, ctx| {
                act.delete_unledgered(found, waits - 1, ctx);
            });
            return;
        }
        let known: std::collections::HashSet<String> =
            self.core.view().runners().map(|r| r.name.clone()).collect();
        let gone: Vec<_> = found
            .into_iter()
            .filter(|(_, _, _, n)| !known.contains(n))
            .map(|(owner, repo, id, _)| (self.github(&owner).delete.clone(), repo, id))
            .collect();
        if gone.is_empty() {
            return;
        }
        ctx.spawn(
            async move {
                let mut deleted = 0;
                for (delete, repo, runner_id) in gone {
                    if let Ok(Ok(())) = delete.send(DeleteRunner { repo, runner_id }).await {
                        deleted += 1;
                    }
                }
                if deleted > 0 {
                    tracing::info!(
                        deleted,
                        "deleted this install's runner registrations that no ledger runner names"
                    );
                }
            }
            .into_actor(self),
        );
    }
}
