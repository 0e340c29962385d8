//! The provisioner interface: the messages every provisioner answers (`Provision`, `Teardown`)
//! and the events it reports (`RunnerEvent`), whatever it runs the runner in.
//!
//! A provisioner never calls GitHub and never decides about jobs: it starts the runner it is
//! given, reports when it started and when it exited, and tears it down on request.

mod actor;
pub mod build;
mod cgroup;
pub mod container;
mod container_version;
mod container_warm;
pub mod engine_api;
mod image;
pub mod install;
pub(crate) mod jobdir;
pub mod leftovers;
mod named;
mod owned;
pub mod process;
mod process_users;
mod process_warm;
mod procgroup;
pub mod reach;
pub mod unremovable;
pub mod runner_env;
mod runner_log;
mod spawn;
mod supervisor;
pub mod qemu;
pub mod tart;
pub mod trust;
pub(crate) mod users;
pub mod warm;

use std::pin::Pin;

use actix::{Message, Recipient};
pub use actor::{Adopt, ChildStopped, ProvisionerActor, StartIn};
pub use ephemer_decide::provision::{
    ExitReason, ProvisionError, RUNNER_VERSION_DEPRECATED, RunnerEventKind, RunnerSpec, WarmView,
    warm_keeping,
};
pub use named::{
    LinuxProvisioner, LinuxVmProvisioner, LocalProvisioner, NativeMacosProvisioner, PoolWiring,
    VmMacosProvisioner, start_linux, start_linux_vm, start_process, start_vm_macos,
};
pub use spawn::{check_executable, spawn_error};

/// Why a pool's runner version could not be told.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VersionError {
    /// The engine would not describe the pool's image.
    #[error("cannot inspect image {0}: {1}")]
    Inspect(String, String),
    /// The listener could not be run in the image.
    #[error("cannot run {0} --version in {1}: {2}")]
    Run(String, String, String),
    /// It answered no version.
    #[error("{0} --version in {1} said {2:?}")]
    Said(String, String, String),
}

/// Why a pool's backend could not be made.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BackendError {
    /// The container engine's address cannot be used.
    #[error("cannot use container engine at {0}: {1}")]
    Engine(String, String),
}
pub use supervisor::ProvisionerSupervisor;

use crate::config::{PoolName, ProviderKind, Secret};

/// A future on the provisioner's arbiter (backends are not `Send`).
pub type LocalFuture<T> = Pin<Box<dyn Future<Output = T>>>;

/// A runner whose environment is up: resolves with its exit code when it ends.
pub struct RunningRunner {
    /// Resolves when the runner process (or VM, or container) exits.
    pub exited: LocalFuture<Option<i32>>,
}

impl std::fmt::Debug for RunningRunner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RunningRunner")
    }
}

/// What a pool adds to its runners' environment besides the JIT config: the pool's `env`
/// (already expanded), and the proxy and CA the daemon itself uses for GitHub.
#[derive(Debug, Clone, Default)]
pub struct RunnerEnv {
    /// Name and value, in order; values may be secrets.
    pub vars: Vec<(String, Secret)>,
    /// The CA bundle on this host (system roots and `github.ca_file`), when one is
    /// configured: a container gets it mounted at [`CONTAINER_CA_PATH`].
    pub ca_bundle: Option<std::path::PathBuf>,
}

/// Where a container finds the CA bundle.
pub const CONTAINER_CA_PATH: &str = "/etc/ephemer-actors/ca-bundle.pem";

/// The variables that point a runner's tools at the CA bundle.
pub use crate::vocab::runner_vars::CA as CA_VARS;

impl RunnerEnv {
    /// `vars`, with the CA variables pointing at `ca_path` (the bundle's path where the runner
    /// runs) when there is a bundle.
    pub fn with_ca_at(&self, ca_path: &str) -> Vec<(String, String)> {
        let mut out: Vec<(String, String)> = self
            .vars
            .iter()
            .map(|(k, v)| (k.clone(), v.expose().to_string()))
            .collect();
        if self.ca_bundle.is_some() {
            out.extend(CA_VARS.iter().map(|k| (k.to_string(), ca_path.to_string())));
        }
        out
    }

    /// [`RunnerEnv::with_ca_at`] the bundle's path on this host.
    pub fn on_host(&self) -> Vec<(String, String)> {
        let path = self
            .ca_bundle
            .as_ref()
            .map(|p| p.display().to_string())
            .unwrap_or_default();
        self.with_ca_at(&path)
    }
}

/// One `doctor` finding about a pool.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Finding {
    /// As it should be.
    Ok(String),
    /// Works, but worth a look.
    Warn(String),
    /// Will not work: what is wrong and what to do.
    Fail(String),
}

/// How one kind of environment is made and destroyed. Stateless by runner name, so a freshly
/// re-created provisioner (or a restarted daemon) can tear down what an earlier one started.
///
/// Each pool's supervisor and provisioner are generic over their backend (static dispatch).
/// Every operation takes the backend by value (it is cheap to clone) so its future owns what it
/// needs and the actor can spawn it on its context.
pub trait Backend: Clone + Unpin + std::fmt::Debug + 'static {
    /// Which kind of provisioner this is.
    fn kind(&self) -> ProviderKind;
    /// The pool it serves (`[providers.NAME]`).
    fn pool(&self) -> &PoolName;
    /// Creates the environment and starts the runner in it.
    fn start(self, spec: RunnerSpec)
    -> impl Future<Output = Result<RunningRunner, ProvisionError>>;
    /// Stops the runner and removes its environment. Idempotent; never fails (it logs).
    fn stop(self, name: String) -> impl Future<Output = ()>;
    /// Removes environments of ours left from an earlier run (named or labelled with our
    /// prefix), except those in `keep` (adopted); returns the names removed.
    fn reap_leftovers(self, keep: Vec<String>) -> impl Future<Output = Vec<String>>;
    /// Re-attaches to a runner an earlier run started: `Some` while its environment is still
    /// alive (resolving when it ends), `None` when it is gone or cannot be re-attached.
    fn adopt(self, name: String) -> impl Future<Output = Option<RunningRunner>>;
    /// Boots a warm environment named `name` (a runner-like name, so the reaping of
    /// leftovers finds it): everything a runner needs except the runner itself. No runner
    /// runs in it, nothing is registered with GitHub, and no secret is put in it; that waits
    /// for [`Backend::warm_start`]. Only kinds that keep warm environments answer `Ok`.
    fn warm_boot(self, name: String) -> impl Future<Output = Result<(), ProvisionError>> {
        async move {
            Err(ProvisionError::EnvironmentFailed(format!(
                "{name}: a {} pool keeps no warm environment",
                self.kind().as_str()
            )))
        }
    }
    /// Whether warm environment `name` is still ready for a runner: alive, and built from
    /// what a new environment would be built from now (else it is replaced).
    fn warm_ready(self, _name: String) -> impl Future<Output = Result<(), &'static str>> {
        async { Err("dead") }
    }
    /// Starts the runner of `spec` in warm environment `warm`, which becomes the runner's
    /// (named `spec.name` from then on, so [`Backend::stop`] finds it by the runner's name).
    /// On `Err` the caller removes `warm` and starts `spec` the cold way.
    fn warm_start(
        self,
        warm: String,
        _spec: RunnerSpec,
    ) -> impl Future<Output = Result<RunningRunner, ProvisionError>> {
        async move {
            Err(ProvisionError::EnvironmentFailed(format!(
                "{warm}: not a warm environment"
            )))
        }
    }
    /// A line to warn operators with at start-up, if this backend deserves one.
    fn startup_warning(&self) -> Option<String> {
        None
    }
    /// How runner `name`'s environment ended, in words, once its exit resolved (taken: asked
    /// once). `None` where the backend cannot tell more than the exit code.
    fn end_words(&self, _name: &str) -> Option<String> {
        None
    }
    /// What runner `name`'s teardown could not remove, in words (taken: asked once), for its
    /// job's timeline ([`unremovable`]).
    fn left_behind(&self, _name: &str) -> Option<String> {
        None
    }
    /// What runner `name`'s egress met (names and addresses refused, or audited), once its
    /// environment is gone (taken: asked once), for its job's timeline.
    fn egress_met(&self, _name: &str) -> Option<ephemer_decide::egress::seen::Seen> {
        None
    }
    /// The runner version the pool's new jobs start, where the backend can tell (a container
    /// pool's image); `Ok(None)`: it cannot (yet).
    fn runner_version(
        self,
    ) -> impl Future<Output = Result<Option<crate::release::Version>, VersionError>> {
        async { Ok(None) }
    }
    /// What `doctor` checks beyond [`Backend::probe`] (the container pool: is its image there,
    /// or can it be pulled).
    fn doctor_checks(self) -> impl Future<Output = Vec<Finding>> {
        async { Vec::new() }
    }
    /// Checks that the host can make an environment at all (engine reachable, its init
    /// installed, the image present), before any job is claimed for this pool. `Err` carries
    /// the cause and what to install; the pool stays down and is probed again later.
    fn probe(self) -> impl Future<Output = Result<(), ProvisionError>> {
        async { Ok(()) }
    }
}

/// `result` of starting runner `name`; a start that failed half-way leaves nothing: what it
/// made (a VM, its disk) is stopped and removed before the failure is reported.
pub(crate) async fn stopped_on_failure<B: Backend>(
    backend: B,
    name: String,
    result: Result<RunningRunner, ProvisionError>,
) -> Result<RunningRunner, ProvisionError> {
    if result.is_err() {
        backend.stop(name).await;
    }
    result
}

/// Resolves when a runner's row is in the store. A restart removes every environment the
/// store does not name as a leftover; a runner started before its row was committed, killed
/// with the daemon in between, could take a job and then be removed with it. Starting only
/// after the commit closes that window (a group commit, about a millisecond).
#[derive(Clone, Default)]
pub struct Durable(Option<futures_util::future::Shared<Pin<Box<dyn Future<Output = ()> + Send>>>>);

impl Durable {
    /// Resolves when `committed` does; a refused write is logged and the runner starts
    /// anyway (the store already says it is failing; holding the runner would strand its
    /// registration too).
    pub fn after<E: std::fmt::Display>(
        committed: impl Future<Output = Result<(), E>> + Send + 'static,
    ) -> Self {
        use futures_util::FutureExt;
        let fut: Pin<Box<dyn Future<Output = ()> + Send>> = Box::pin(async move {
            if let Err(error) = committed.await {
                tracing::warn!(%error, "a runner's record could not be stored; starting it anyway (a restart may remove it as a leftover)");
            }
        });
        Self(Some(fut.shared()))
    }

    /// Waits for the commit (at once when there is none to wait for).
    pub async fn wait(&self) {
        if let Some(f) = &self.0 {
            f.clone().await;
        }
    }
}

impl std::fmt::Debug for Durable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() {
            "Durable(pending)"
        } else {
            "Durable(now)"
        })
    }
}

/// Durability is not part of what a runner is: two specs that name the same runner are equal.
impl PartialEq for Durable {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl Eq for Durable {}

/// Start a runner.
#[derive(Debug, Clone, Message)]
#[rtype(result = "()")]
pub struct Provision {
    /// The runner.
    pub spec: RunnerSpec,
    /// When the scheduler's record of it is durable: its environment starts only then.
    pub durable: Durable,
}

impl Provision {
    /// Start `spec` as soon as it can (nothing to wait for: tests, tools).
    pub fn now(spec: RunnerSpec) -> Self {
        Provision {
            spec,
            durable: Durable::default(),
        }
    }
}

/// Stop a runner and remove its environment (idempotent).
#[derive(Debug, Clone, Message)]
#[rtype(result = "()")]
pub struct Teardown {
    /// Runner name.
    pub name: String,
    /// Why, for logs.
    pub reason: &'static str,
}

/// A provisioner's report about one runner.
#[derive(Debug, Clone, Message)]
#[rtype(result = "()")]
pub struct RunnerEvent {
    /// Which provider.
    pub provider: PoolName,
    /// Runner name.
    pub name: String,
    /// What happened.
    pub kind: RunnerEventKind,
}

/// A provider went down (its host check failed, its restart budget is spent, or its policy is
/// `never`) or came up.
#[derive(Debug, Clone, Message)]
#[rtype(result = "()")]
pub struct ProviderStatus {
    /// Which provider.
    pub provider: PoolName,
    /// Whether it accepts runners now.
    pub up: bool,
    /// Why it is down (for `status` and the log); `None` when up.
    pub cause: Option<String>,
}

/// How the scheduler and the instance reach one pool's supervisor, whatever its backend.
#[derive(Debug, Clone)]
pub struct ProvisionerHandle {
    /// Start runners.
    pub provision: Recipient<Provision>,
    /// Stop runners.
    pub teardown: Recipient<Teardown>,
    /// Stop the supervisor (and its provisioner).
    pub stop: Recipient<crate::lifecycle::Stop>,
    /// Make the supervisor panic (fault tests).
    pub crash: Recipient<crate::lifecycle::Crash>,
    /// Make its current provisioner panic (fault tests).
    pub crash_child: Recipient<crate::lifecycle::CrashProvisioner>,
    /// Stop keeping environments warm (cordon, drain) and remove the warm ones, or resume.
    pub warm: Recipient<warm::WarmHold>,
}

impl ProvisionerHandle {
    /// The handle of `supervisor`.
    pub fn of<B: Backend>(supervisor: &actix::Addr<ProvisionerSupervisor<B>>) -> Self {
        ProvisionerHandle {
            provision: supervisor.clone().recipient(),
            teardown: supervisor.clone().recipient(),
            stop: supervisor.clone().recipient(),
            crash: supervisor.clone().recipient(),
            crash_child: supervisor.clone().recipient(),
            warm: supervisor.clone().recipient(),
        }
    }

    /// Whether the supervisor still runs.
    pub fn connected(&self) -> bool {
        self.stop.connected()
    }
}

#[cfg(test)]
mod tests;
#[cfg(test)]
mod warm_tests;
