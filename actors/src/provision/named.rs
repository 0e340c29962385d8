//! The five provisioners of the design card, as types: each is the one generic
//! [`ProvisionerSupervisor`] (restart policy, host check) over the one generic
//! [`ProvisionerActor`] (watch, timeout, teardown), statically bound to its backend:
//!
//! | provisioner | backend | each runner in |
//! |---|---|---|
//! | [`LinuxProvisioner`] | [`ContainerBackend`] | its own container on a Docker-compatible engine |
//! | [`VmMacosProvisioner`] | [`TartBackend`] | its own cloned macOS VM, driven by `tart` |
//! | [`LinuxVmProvisioner`] | [`QemuBackend`] | its own QEMU microVM: a kernel of its own, a fresh disk |
//! | [`LocalProvisioner`] | [`ProcessBackend`] | a process on this host, from its own directory |
//! | [`NativeMacosProvisioner`] | [`ProcessBackend`] | a process directly on a macOS host |
//!
//! `native_macos` and `local` share a backend on purpose: both run the runner as a process
//! under a `run_as` user, with a per-job `HOME` and `TMPDIR`, in a directory only that user can
//! enter. What `native_macos` does not do is documented in docs/providers.md: no launchd GUI
//! session and no per-job keychain (jobs that need either belong in a `vm_macos` pool); its
//! start-up warning says jobs share the host.

use std::time::Duration;

use actix::{Actor, WeakRecipient};

use super::{
    Backend, ProviderStatus, ProvisionerHandle, ProvisionerSupervisor, RunnerEvent,
    container::{ContainerBackend, ContainerSettings},
    process::{ProcessBackend, ProcessSettings},
    qemu::{QemuBackend, QemuSettings},
    tart::{TartBackend, TartSettings},
};
use crate::{clock::Clock, config::RestartConfig, metrics::Metrics};

/// `LinuxProvisioner`: each runner in its own container on a Docker-compatible engine.
pub type LinuxProvisioner = ProvisionerSupervisor<ContainerBackend>;
/// `VmMacosProvisioner`: each runner in its own cloned macOS VM, driven by `tart`.
pub type VmMacosProvisioner = ProvisionerSupervisor<TartBackend>;
/// `LinuxVmProvisioner`: each runner in its own QEMU microVM.
pub type LinuxVmProvisioner = ProvisionerSupervisor<QemuBackend>;
/// `LocalProvisioner`: each runner a process on this host, from its own work directory.
pub type LocalProvisioner = ProvisionerSupervisor<ProcessBackend>;
/// `NativeMacosProvisioner`: each runner a process directly on a macOS host (weak isolation,
/// opt-in; see the module's notes for what it shares with `local`).
pub type NativeMacosProvisioner = ProvisionerSupervisor<ProcessBackend>;

/// What every provisioner is wired to, whatever it runs runners in.
#[derive(Debug, Clone)]
pub struct PoolWiring {
    /// The pool's restart policy and budget.
    pub restart: RestartConfig,
    /// `runner.job_timeout`.
    pub job_timeout: Option<Duration>,
    /// Runner events go here (the scheduler, held weakly: it owns the pool).
    pub events: WeakRecipient<RunnerEvent>,
    /// Up/down reports go here (the scheduler, held weakly).
    pub status: WeakRecipient<ProviderStatus>,
    /// Metrics (restarts).
    pub metrics: Metrics,
    /// The clock (restart budget).
    pub clock: Clock,
    /// Runners an earlier run started (from the ledger): adopted, not reaped.
    pub adopt: Vec<String>,
    /// The daemon-managed runner installs, for process pools that use them.
    pub managed: Option<crate::release::installs::ManagedInstalls>,
    /// Where a runner version the backend can tell goes (the `ReleaseActor`).
    pub versions: Option<WeakRecipient<crate::release::actor::RunnerVersionSeen>>,
    /// Where a runner GitHub refused as too old is said (the `ReleaseActor`, which fetches
    /// the newest release at once).
    pub refused: Option<WeakRecipient<crate::release::actor::RunnerRefused>>,
    /// What the pool keeps warm (`None`: nothing).
    pub warm: Option<super::warm::WarmSettings>,
}

impl PoolWiring {
    /// Starts a supervisor over `backend` that re-creates its provisioner per the policy;
    /// returns how to reach it, whatever its backend.
    pub fn start<B: Backend>(self, backend: B) -> ProvisionerHandle {
        let supervisor = ProvisionerSupervisor::new(
            backend,
            self.job_timeout,
            self.restart,
            self.events,
            self.status,
            self.metrics,
            self.clock,
        )
        .with_adopted(self.adopt)
        .with_versions(self.versions, self.refused)
        .with_warm(self.warm)
        .start();
        ProvisionerHandle::of(&supervisor)
    }
}

/// Starts a `local` or `native_macos` pool (a `LocalProvisioner` or a
/// `NativeMacosProvisioner`: one type, see the module's notes), on the managed installs when
/// the pool uses them.
pub fn start_process(mut settings: ProcessSettings, wiring: PoolWiring) -> ProvisionerHandle {
    settings.left_gauge = Some(
        wiring
            .metrics
            .teardown_unremoved
            .with_label_values(&[settings.pool.as_str()]),
    );
    let backend = ProcessBackend::new(settings).with_managed(wiring.managed.as_ref());
    wiring.start(backend)
}

/// Starts a `linux` pool; fails when the engine address cannot be used at all.
pub fn start_linux(
    settings: ContainerSettings,
    wiring: PoolWiring,
) -> Result<ProvisionerHandle, super::BackendError> {
    Ok(wiring.start(ContainerBackend::new(settings)?))
}

/// Starts a `linux_vm` pool.
pub fn start_linux_vm(mut settings: QemuSettings, wiring: PoolWiring) -> ProvisionerHandle {
    settings.egress.refused = Some(wiring.metrics.egress_refused.clone());
    // The pool's boot histogram is there (empty) from the start, for dashboards.
    settings.boot_seconds = Some(
        wiring
            .metrics
            .vm
            .boot
            .with_label_values(&[settings.pool.as_str()]),
    );
    settings.left_gauge = Some(
        wiring
            .metrics
            .teardown_unremoved
            .with_label_values(&[settings.pool.as_str()]),
    );
    wiring.start(QemuBackend::new(settings))
}

/// Starts a `vm_macos` pool.
pub fn start_vm_macos(settings: TartSettings, wiring: PoolWiring) -> ProvisionerHandle {
    wiring.start(TartBackend::new(settings))
}
