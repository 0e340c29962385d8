//! The pools wing: the `ReleaseActor` that keeps the daemon-managed runner installs current,
//! and a supervised provisioner per enabled pool (`LocalProvisioner`, `LinuxProvisioner`,
//! `VmMacosProvisioner`, `NativeMacosProvisioner`): each removes leftovers, checks the host,
//! then runs its provisioner under the pool's restart policy, reporting to the scheduler.

use std::collections::HashMap;

use actix::{Actor, Addr};

use super::StartError;
use crate::{
    clock::Clock,
    config::{Config, PoolName},
    durable::RunnerRow,
    metrics::Metrics,
    provision::{
        PoolWiring, ProviderStatus, ProvisionerHandle, RunnerEvent,
        build::{PoolSettings, pool_settings},
        start_linux, start_linux_vm, start_process, start_vm_macos,
    },
    release::{actor::ReleaseActor, installs::ManagedInstalls},
};

/// What the pools wing started.
pub(super) struct PoolsWing {
    /// One supervisor per enabled pool.
    pub(super) provisioners: HashMap<PoolName, ProvisionerHandle>,
    /// The runner's releases, when a pool's runner version can be told or checks are on.
    pub(super) release: Option<Addr<ReleaseActor>>,
}

/// Where every pool reports: the scheduler, held weakly (it owns the pools).
pub(super) struct PoolReports {
    pub(super) events: actix::WeakRecipient<RunnerEvent>,
    pub(super) status: actix::WeakRecipient<ProviderStatus>,
    pub(super) warm: actix::WeakRecipient<crate::provision::warm::WarmStatus>,
}

/// Starts the release actor and every enabled pool of `config`; `ledger_runners` are the
/// runners an earlier run started (each pool adopts its own).
pub(super) fn start(
    config: &Config,
    install_id: &str,
    reports: PoolReports,
    ledger_runners: &[RunnerRow],
    metrics: &Metrics,
    clock: Clock,
) -> Result<PoolsWing, StartError> {
    // The daemon-managed runner installs (pools with neither runner_dir nor command), filled
    // and kept current by the ReleaseActor.
    let managed = ManagedInstalls::for_config(config);
    for pool in config.providers.enabled() {
        metrics.init_runner_version(pool.name.as_str());
    }
    let release = ReleaseActor::wanted(config)
        .then(|| ReleaseActor::new(config, managed.clone(), metrics.clone()).start());
    let log_dir = config.state.dir.join("logs");
    let ca_bundle = crate::provision::runner_env::write_ca_bundle(config).map_err(|e| {
        StartError::CaBundle {
            detail: e.to_string(),
        }
    })?;
    let mut provisioners = HashMap::new();
    for pool in config.providers.enabled() {
        let name = pool.name.clone();
        let wired = PoolWiring {
            warm: Some(crate::provision::warm::WarmSettings {
                config: pool.common.warm.clone(),
                max: pool.common.max_concurrent,
                prefix: crate::vocab::runner_prefix(&config.runner.name_prefix, &name, install_id),
                report: Some(reports.warm.clone()),
            }),
            managed: managed.clone(),
            versions: release.as_ref().map(|r| r.downgrade().recipient()),
            refused: release.as_ref().map(|r| r.downgrade().recipient()),
            restart: pool.common.restart.clone(),
            job_timeout: config.runner.job_timeout,
            events: reports.events.clone(),
            status: reports.status.clone(),
            metrics: metrics.clone(),
            clock,
            adopt: ledger_runners
                .iter()
                .filter(|r| r.provider == name)
                .map(|r| r.name.clone())
                .collect(),
        };
        let settings = pool_settings(config, pool, install_id, ca_bundle.clone(), log_dir.clone());
        let supervisor = match settings {
            PoolSettings::Process(s) => start_process(s, wired),
            PoolSettings::Container(s) => {
                start_linux(s, wired).map_err(|detail| StartError::Provider {
                    provider: name.clone(),
                    detail: detail.to_string(),
                })?
            }
            PoolSettings::Tart(s) => start_vm_macos(s, wired),
            PoolSettings::Qemu(s) => start_linux_vm(s, wired),
        };
        provisioners.insert(name, supervisor);
    }
    Ok(PoolsWing {
        provisioners,
        release,
    })
}
