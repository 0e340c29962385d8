//! Booted warm VMs (`warm = N` in a `linux_vm` pool): booted ahead of any claim, their agent
//! waiting on the console with nothing registered and no secret in the guest. At the claim the
//! run directory takes the runner's name and the agent gets the runner's variables and JIT
//! config, so the runner starts without a boot. A warm VM's QEMU is a child of the backend until
//! then; the keeper replaces it after `warm_max_age`, or when its QEMU is gone.

use tokio::process::Child;

use super::{QemuBackend, agent::Agent};
use crate::provision::{ProvisionError, RunnerSpec, RunningRunner};

/// A booted VM whose agent waits for a runner.
pub(super) struct WarmVm {
    child: Child,
    agent: Agent,
}

impl std::fmt::Debug for WarmVm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WarmVm").field("pid", &self.child.id()).finish()
    }
}

impl QemuBackend {
    /// Boots warm VM `name` up to its agent's hello.
    pub(super) async fn boot_warm(&self, name: String) -> Result<(), ProvisionError> {
        let (child, agent) = self.boot(&name).await?;
        self.warm.borrow_mut().insert(name, WarmVm { child, agent });
        Ok(())
    }

    /// Whether warm VM `name` still runs.
    pub(super) fn check_warm(&self, name: &str) -> Result<(), &'static str> {
        let mut warm = self.warm.borrow_mut();
        match warm.get_mut(name).map(|vm| vm.child.try_wait()) {
            Some(Ok(None)) => Ok(()),
            _ => Err("dead"),
        }
    }

    /// Starts `spec`'s runner in warm VM `warm`, whose run directory takes the runner's name
    /// (QEMU keeps its own, kept in the directory for the teardown).
    pub(super) async fn start_warm(
        &self,
        warm: String,
        spec: RunnerSpec,
    ) -> Result<RunningRunner, ProvisionError> {
        let vm = self.warm.borrow_mut().remove(&warm).ok_or_else(|| {
            ProvisionError::EnvironmentFailed(format!("{warm} was not booted by this run"))
        })?;
        let WarmVm { mut child, agent } = vm;
        if !matches!(child.try_wait(), Ok(None)) {
            return Err(ProvisionError::EnvironmentFailed(format!(
                "the warm VM {warm} is gone"
            )));
        }
        if let Err(e) = std::fs::rename(self.vm_dir(&warm), self.vm_dir(&spec.name)) {
            // Put back, so the caller's removal of `warm` finds and stops it.
            self.warm
                .borrow_mut()
                .insert(warm.clone(), WarmVm { child, agent });
            return Err(ProvisionError::EnvironmentFailed(format!(
                "cannot hand the warm VM {warm} to the runner: {e}"
            )));
        }
        self.nets.rename(&warm, &spec.name);
        tracing::info!(vm = %warm, runner = %spec.name, pool = %self.s.pool, "warm VM handed to its runner: no boot");
        self.run(child, agent, spec).await
    }
}
