//! A pool's provisioner settings from the config: what `system::start` hands each named
//! provisioner, and what `doctor` probes without starting one.

use std::path::PathBuf;

use super::{
    Backend, Finding, ProvisionError,
    container::{ContainerBackend, ContainerSettings},
    process::{KILL_GRACE, ProcessBackend, ProcessSettings},
    qemu::{QemuBackend, QemuSettings},
    tart::{TartBackend, TartSettings},
};
use crate::config::{Config, PoolConfig, PoolSpec};

/// One pool's settings, by the backend that runs its runners.
#[derive(Debug, Clone)]
pub enum PoolSettings {
    /// `local` and `native_macos`.
    Process(ProcessSettings),
    /// `linux`.
    Container(ContainerSettings),
    /// `vm_macos`.
    Tart(TartSettings),
    /// `linux_vm`.
    Qemu(QemuSettings),
}

/// Every enabled process pool's work root and runner name prefix: `run_as` users are handed
/// out host-wide ([`super::users`]).
pub fn process_work_roots(config: &Config, install_id: &str) -> Vec<super::users::WorkRoot> {
    config
        .providers
        .enabled()
        .into_iter()
        .filter_map(|pool| {
            Some(super::users::WorkRoot {
                pool: pool.name.clone(),
                dir: pool.process()?.work_root.clone(),
                prefix: crate::vocab::runner_prefix(
                    &config.runner.name_prefix,
                    &pool.name,
                    install_id,
                ),
            })
        })
        .collect()
}

/// The settings of `pool`: its runner names start with this install's prefix for it, its
/// runners get the pool's environment (and `ca_bundle`, when written), logs go to `log_dir`.
pub fn pool_settings(
    config: &Config,
    pool: &PoolConfig,
    install_id: &str,
    ca_bundle: Option<PathBuf>,
    log_dir: PathBuf,
) -> PoolSettings {
    let name = pool.name.clone();
    let name_str = pool.name.as_str();
    let name_prefix = crate::vocab::runner_prefix(&config.runner.name_prefix, &name, install_id);
    let env = super::runner_env::runner_env(config, pool, ca_bundle);
    match &pool.spec {
        PoolSpec::Local(p) | PoolSpec::NativeMacos(p) => PoolSettings::Process(ProcessSettings {
            kind: pool.kind(),
            pool: name,
            env,
            program: p.program.clone(),
            args: p.args.clone(),
            work_root: p.work_root.clone(),
            log_dir,
            run_as: p.run_as.clone(),
            name_prefix,
            grace: KILL_GRACE,
            peers: process_work_roots(config, install_id),
            left_record: Some(super::unremovable::record_path(&config.state.dir, name_str)),
            left_gauge: None,
            allow_root: p.allow_root,
            allow_same_user: p.allow_same_user,
        }),
        PoolSpec::Linux(l) => PoolSettings::Container(ContainerSettings {
            pool: name,
            env,
            socket: l.socket.clone(),
            image: l.image.clone(),
            command: l.command.clone(),
            network: l.network.clone(),
            limits: l.limits.clone(),
            pull: l.pull,
            mounts: l.mounts.clone(),
            extra_hosts: l.extra_hosts.clone(),
            dns: l.dns.clone(),
            log_cap: super::container::LOG_CAP,
            name_prefix,
            log_dir,
            guarded: if l.mounts.allow_host_paths {
                Vec::new()
            } else {
                crate::config::host_paths::guarded_for(&config.providers, &config.state.dir, &l.socket)
            },
        }),
        PoolSpec::VmMacos(v) => PoolSettings::Tart(TartSettings {
            pool: name,
            env,
            tart: v.tart_path.clone(),
            ssh: v.ssh_path.clone(),
            base_image: v.base_image.clone(),
            ssh_user: v.ssh_user.clone(),
            runner_command: v.runner_command.clone(),
            boot_timeout: v.boot_timeout,
            name_prefix,
            log_dir,
            host_keys: v.host_keys,
            run_args: v.run_args.clone(),
            known_hosts: config.state.dir.join("tart-known-hosts"),
            vm_hosts: config.state.dir.join("tart-hosts"),
        }),
        PoolSpec::LinuxVm(v) => PoolSettings::Qemu(QemuSettings {
            pool: name,
            env,
            vm: v.clone(),
            name_prefix,
            run_dir: config.state.dir.join("vms"),
            log_dir,
            boot_seconds: None,
            left_record: Some(super::unremovable::record_path(&config.state.dir, name_str)),
            left_gauge: None,
            egress: crate::netns::Egress::of(
                &pool.name,
                &pool.common.egress,
                Some(&config.state.dir.join("egress")),
                None,
            ),
        }),
    }
}

/// One pool's backend, unsupervised: for checks (`doctor`), not for running jobs.
#[derive(Debug, Clone)]
pub enum PoolBackend {
    /// `local` and `native_macos`.
    Process(ProcessBackend),
    /// `linux`.
    Container(ContainerBackend),
    /// `vm_macos`.
    Tart(TartBackend),
    /// `linux_vm`.
    Qemu(QemuBackend),
}

impl PoolBackend {
    /// See [`Backend::probe`].
    pub async fn probe(&self) -> Result<(), ProvisionError> {
        match self {
            PoolBackend::Process(b) => b.clone().probe().await,
            PoolBackend::Container(b) => b.clone().probe().await,
            PoolBackend::Tart(b) => b.clone().probe().await,
            PoolBackend::Qemu(b) => b.clone().probe().await,
        }
    }

    /// See [`Backend::doctor_checks`].
    pub async fn doctor_checks(&self) -> Vec<Finding> {
        match self {
            PoolBackend::Process(b) => b.clone().doctor_checks().await,
            PoolBackend::Container(b) => b.clone().doctor_checks().await,
            PoolBackend::Tart(b) => b.clone().doctor_checks().await,
            PoolBackend::Qemu(b) => b.clone().doctor_checks().await,
        }
    }

    /// See [`Backend::runner_version`].
    pub async fn runner_version(
        &self,
    ) -> Result<Option<crate::release::Version>, super::VersionError> {
        match self {
            PoolBackend::Process(b) => b.clone().runner_version().await,
            PoolBackend::Container(b) => b.clone().runner_version().await,
            PoolBackend::Tart(b) => b.clone().runner_version().await,
            PoolBackend::Qemu(b) => b.clone().runner_version().await,
        }
    }
}

/// The backend for `settings`, unsupervised. A process pool on the daemon-managed installs
/// sees `managed` (as they are on disk).
pub fn backend(
    settings: PoolSettings,
    managed: Option<&crate::release::installs::ManagedInstalls>,
) -> Result<PoolBackend, super::BackendError> {
    Ok(match settings {
        PoolSettings::Process(s) => {
            PoolBackend::Process(ProcessBackend::new(s).with_managed(managed))
        }
        PoolSettings::Container(s) => PoolBackend::Container(ContainerBackend::new(s)?),
        PoolSettings::Tart(s) => PoolBackend::Tart(TartBackend::new(s)),
        PoolSettings::Qemu(s) => PoolBackend::Qemu(QemuBackend::new(s)),
    })
}
