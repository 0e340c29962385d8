//! The four provisioners by the names the design card gives them: [`LocalProvisioner`],
//! [`LinuxProvisioner`], [`VmMacosProvisioner`] and [`NativeMacosProvisioner`]. Each is a thin
//! named shell: it builds its backend and starts it under the one shared
//! [`ProvisionerSupervisor`] (restart policy, host check) over the one shared
//! [`ProvisionerActor`] (watch, timeout, teardown). What differs between them is only the
//! backend; everything else stays shared.

use std::{rc::Rc, time::Duration};

use actix::{Actor, Addr, WeakRecipient};

use super::{
    Backend, Factory, ProviderStatus, ProvisionerActor, ProvisionerSupervisor, RunnerEvent,
    container::{ContainerBackend, ContainerSettings},
    process::{ProcessBackend, ProcessSettings},
    tart::{TartBackend, TartSettings},
};
use crate::{clock::Clock, config::RestartConfig, metrics::Metrics};

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
}

impl PoolWiring {
    /// Starts `backend` under a supervisor that re-creates its provisioner per the policy.
    fn start(self, backend: Rc<dyn Backend>) -> Addr<ProvisionerSupervisor> {
        let job_timeout = self.job_timeout;
        let child_backend = backend.clone();
        let factory: Factory = Box::new(move |events, stopped, generation| {
            ProvisionerActor::new(
                child_backend.clone(),
                events,
                stopped,
                generation,
                job_timeout,
            )
            .start()
        });
        ProvisionerSupervisor::new(
            backend,
            factory,
            self.restart,
            self.events,
            self.status,
            self.metrics,
            self.clock,
        )
        .with_adopted(self.adopt)
        .with_versions(self.versions)
        .start()
    }
}

/// `LocalProvisioner`: each runner a process on this host, from its own work directory.
#[derive(Debug, Clone, Copy)]
pub struct LocalProvisioner;

impl LocalProvisioner {
    /// Starts the pool.
    pub fn start(settings: ProcessSettings, wiring: PoolWiring) -> Addr<ProvisionerSupervisor> {
        let backend = process_backend(settings, &wiring);
        wiring.start(backend)
    }
}

/// `LinuxProvisioner`: each runner in its own container on a Docker-compatible engine.
#[derive(Debug, Clone, Copy)]
pub struct LinuxProvisioner;

impl LinuxProvisioner {
    /// Starts the pool; fails when the engine address cannot be used at all.
    pub fn start(
        settings: ContainerSettings,
        wiring: PoolWiring,
    ) -> Result<Addr<ProvisionerSupervisor>, String> {
        Ok(wiring.start(Rc::new(ContainerBackend::new(settings)?)))
    }
}

/// `VmMacosProvisioner`: each runner in its own cloned macOS VM, driven by `tart`.
#[derive(Debug, Clone, Copy)]
pub struct VmMacosProvisioner;

impl VmMacosProvisioner {
    /// Starts the pool.
    pub fn start(settings: TartSettings, wiring: PoolWiring) -> Addr<ProvisionerSupervisor> {
        wiring.start(Rc::new(TartBackend::new(settings)))
    }
}

/// `NativeMacosProvisioner`: each runner a process directly on a macOS host (weak isolation,
/// opt-in).
#[derive(Debug, Clone, Copy)]
pub struct NativeMacosProvisioner;

impl NativeMacosProvisioner {
    /// Starts the pool.
    pub fn start(settings: ProcessSettings, wiring: PoolWiring) -> Addr<ProvisionerSupervisor> {
        let backend = process_backend(settings, &wiring);
        wiring.start(backend)
    }
}

/// A process backend, on the managed installs when its pool uses them.
fn process_backend(settings: ProcessSettings, wiring: &PoolWiring) -> Rc<dyn Backend> {
    let backend = ProcessBackend::new(settings);
    Rc::new(match &wiring.managed {
        Some(installs) => backend.with_managed(installs.clone()),
        None => backend,
    })
}
