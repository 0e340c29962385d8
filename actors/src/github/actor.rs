//! `GithubActor`: owns the (non-`Send`) [`GithubClient`] and answers GitHub requests as
//! messages, so the scheduler and the sweeps reach GitHub through `Recipient`s a test can
//! replace. Each request runs as its own future; many can be in flight at once.

use actix::{Actor, Context, Handler, Message, ResponseFuture};

use super::{GithubClient, GithubError, JitRunner, RunnerInfo};
use crate::job::JobInfo;

/// Registers a JIT runner (a claim).
#[derive(Debug, Clone, Message)]
#[rtype(result = "Result<JitRunner, GithubError>")]
pub struct GenerateJitConfig {
    /// The job's repo when runners are repo-level; `None` for org-level runners.
    pub repo: Option<String>,
    /// `<name_prefix>-<provider>`; the client appends a random suffix.
    pub name_base: String,
    /// The labels the runner registers with.
    pub labels: Vec<String>,
}

/// Deletes a runner registration (404 counts as done).
#[derive(Debug, Clone, Message)]
#[rtype(result = "Result<(), GithubError>")]
pub struct DeleteRunner {
    /// Repo of a repo-level runner; `None` for org-level.
    pub repo: Option<String>,
    /// GitHub's runner id.
    pub runner_id: u64,
}

/// Fetches one runner registration (`None`: gone).
#[derive(Debug, Clone, Message)]
#[rtype(result = "Result<Option<RunnerInfo>, GithubError>")]
pub struct GetRunner {
    /// Repo, or `None` for the org.
    pub repo: Option<String>,
    /// Runner id.
    pub runner_id: u64,
}

/// Lists registered runners whose names start with a prefix, in one repo or the org.
#[derive(Debug, Clone, Message)]
#[rtype(result = "Result<Vec<RunnerInfo>, GithubError>")]
pub struct ListRunners {
    /// Repo, or `None` for the org.
    pub repo: Option<String>,
    /// Name prefix to keep.
    pub name_prefix: String,
}

/// One reconcile pass: every queued job in the polled repos (queued and in-progress runs,
/// all pages), repo by repo, starting where the last pass stopped.
#[derive(Debug, Clone, Message)]
#[rtype(result = "Result<super::reconcile::Reconciled, GithubError>")]
pub struct ListQueuedJobs;

/// Fetches one job and its status.
#[derive(Debug, Clone, Message)]
#[rtype(result = "Result<(JobInfo, String), GithubError>")]
pub struct GetJob {
    /// The job's repo.
    pub repo: String,
    /// The job id.
    pub job_id: u64,
}

/// Actor shell over [`GithubClient`].
#[derive(Debug)]
pub struct GithubActor {
    client: GithubClient,
    /// Where the next reconcile pass starts (a pass cut short by a low budget resumes there).
    reconcile_from: std::rc::Rc<std::cell::Cell<usize>>,
}

impl GithubActor {
    /// An actor owning `client`.
    pub fn new(client: GithubClient) -> Self {
        GithubActor {
            client,
            reconcile_from: std::rc::Rc::default(),
        }
    }
}

impl Actor for GithubActor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        ctx.set_mailbox_capacity(4096);
    }
}

crate::stop_on_request!(GithubActor);

impl Handler<GenerateJitConfig> for GithubActor {
    type Result = ResponseFuture<Result<JitRunner, GithubError>>;

    fn handle(&mut self, m: GenerateJitConfig, _: &mut Context<Self>) -> Self::Result {
        let client = self.client.clone();
        Box::pin(async move {
            client
                .generate_jitconfig(m.repo.as_deref(), &m.name_base, &m.labels)
                .await
        })
    }
}

impl Handler<DeleteRunner> for GithubActor {
    type Result = ResponseFuture<Result<(), GithubError>>;

    fn handle(&mut self, m: DeleteRunner, _: &mut Context<Self>) -> Self::Result {
        let client = self.client.clone();
        Box::pin(async move { client.delete_runner(m.repo.as_deref(), m.runner_id).await })
    }
}

impl Handler<GetRunner> for GithubActor {
    type Result = ResponseFuture<Result<Option<RunnerInfo>, GithubError>>;

    fn handle(&mut self, m: GetRunner, _: &mut Context<Self>) -> Self::Result {
        let client = self.client.clone();
        Box::pin(async move { client.get_runner(m.repo.as_deref(), m.runner_id).await })
    }
}

impl Handler<ListRunners> for GithubActor {
    type Result = ResponseFuture<Result<Vec<RunnerInfo>, GithubError>>;

    fn handle(&mut self, m: ListRunners, _: &mut Context<Self>) -> Self::Result {
        let client = self.client.clone();
        Box::pin(async move { client.list_runners(m.repo.as_deref(), &m.name_prefix).await })
    }
}

impl Handler<ListQueuedJobs> for GithubActor {
    type Result = ResponseFuture<Result<super::reconcile::Reconciled, GithubError>>;

    fn handle(&mut self, _: ListQueuedJobs, _: &mut Context<Self>) -> Self::Result {
        let (client, from) = (self.client.clone(), self.reconcile_from.clone());
        Box::pin(async move {
            let pass = client.reconcile(from.get()).await?;
            from.set(pass.next_start);
            Ok(pass)
        })
    }
}

impl Handler<GetJob> for GithubActor {
    type Result = ResponseFuture<Result<(JobInfo, String), GithubError>>;

    fn handle(&mut self, m: GetJob, _: &mut Context<Self>) -> Self::Result {
        let client = self.client.clone();
        Box::pin(async move { client.get_job(&m.repo, m.job_id).await })
    }
}

/// The hooks that deliver to us ([`GithubClient::find_hooks`]).
#[derive(Debug, Clone, Message)]
#[rtype(result = "Result<Vec<super::hooks::HookRef>, GithubError>")]
pub struct FindHooks {
    /// `webhook.hook_id`
    pub hook_id: Option<u64>,
    /// `webhook.public_url`
    pub public_url: Option<String>,
}

/// One page of a hook's deliveries, newest first, and the next page's cursor.
#[derive(Debug, Clone, Message)]
#[rtype(result = "Result<(Vec<super::hooks::HookDelivery>, Option<String>), GithubError>")]
pub struct ListHookDeliveries {
    /// The hook.
    pub hook: super::hooks::HookRef,
    /// Where the page starts (`None`: the newest).
    pub cursor: Option<String>,
}

/// Asks GitHub to deliver one attempt again.
#[derive(Debug, Clone, Message)]
#[rtype(result = "Result<(), GithubError>")]
pub struct Redeliver {
    /// The hook.
    pub hook: super::hooks::HookRef,
    /// The attempt's id.
    pub delivery_id: u64,
}

impl Handler<FindHooks> for GithubActor {
    type Result = ResponseFuture<Result<Vec<super::hooks::HookRef>, GithubError>>;

    fn handle(&mut self, m: FindHooks, _: &mut Context<Self>) -> Self::Result {
        let client = self.client.clone();
        Box::pin(async move { client.find_hooks(m.hook_id, m.public_url.as_deref()).await })
    }
}

impl Handler<ListHookDeliveries> for GithubActor {
    type Result =
        ResponseFuture<Result<(Vec<super::hooks::HookDelivery>, Option<String>), GithubError>>;

    fn handle(&mut self, m: ListHookDeliveries, _: &mut Context<Self>) -> Self::Result {
        let client = self.client.clone();
        Box::pin(async move { client.hook_deliveries(&m.hook, m.cursor.as_deref()).await })
    }
}

impl Handler<Redeliver> for GithubActor {
    type Result = ResponseFuture<Result<(), GithubError>>;

    fn handle(&mut self, m: Redeliver, _: &mut Context<Self>) -> Self::Result {
        let client = self.client.clone();
        Box::pin(async move { client.redeliver(&m.hook, m.delivery_id).await })
    }
}

/// One pull-mode pass ([`GithubClient::poll_pass`]): the memory goes in and comes back, with
/// what changed and the `core` reading after it.
#[derive(Debug, Message)]
#[rtype(result = "PollAnswer")]
pub struct PollPass(pub super::poll::PollMemory);

/// What a [`PollPass`] returns.
#[derive(Debug)]
pub struct PollAnswer {
    /// The memory, updated.
    pub memory: super::poll::PollMemory,
    /// What the pass found, or why it failed.
    pub outcome: Result<super::poll::PollOutcome, GithubError>,
    /// `core` (remaining, limit, reset) after it.
    pub core: Option<(u64, u64, u64)>,
}

impl Handler<PollPass> for GithubActor {
    type Result = ResponseFuture<PollAnswer>;

    fn handle(&mut self, PollPass(mut memory): PollPass, _: &mut Context<Self>) -> Self::Result {
        let client = self.client.clone();
        Box::pin(async move {
            let outcome = client.poll_pass(&mut memory).await;
            PollAnswer {
                memory,
                outcome,
                core: client.core_reading(),
            }
        })
    }
}

/// Resolves `github.runner_group` (a name) to its id now rather than at the first claim
/// ([`GithubClient::runner_group_id`]).
#[derive(Debug, Clone, Copy, Message)]
#[rtype(result = "Result<u64, GithubError>")]
pub struct ResolveRunnerGroup;

impl Handler<ResolveRunnerGroup> for GithubActor {
    type Result = ResponseFuture<Result<u64, GithubError>>;

    fn handle(&mut self, _: ResolveRunnerGroup, _: &mut Context<Self>) -> Self::Result {
        let client = self.client.clone();
        Box::pin(async move { client.runner_group_id().await })
    }
}
