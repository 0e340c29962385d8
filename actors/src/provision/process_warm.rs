//! A process pool's warm environments: the runner's directory (the install's copy, owned by
//! its `run_as` user, with its own `HOME` and `TMPDIR`) prepared before the claim. At the
//! claim the directory is renamed to the runner's name and the runner starts in it, with the
//! JIT config in its environment as always; nothing secret is in the directory before.

use super::{
    ProvisionError, RunnerSpec, RunningRunner,
    process::{Prepared, ProcessBackend},
};

impl ProcessBackend {
    /// Prepares warm directory `name`.
    pub(super) async fn boot_warm(&self, name: String) -> Result<(), ProvisionError> {
        let prepared: Prepared = self.prepare(&self.s.work_root.join(&name), false).await?;
        self.warm.borrow_mut().insert(name, prepared);
        Ok(())
    }

    /// Whether warm directory `name` is still there, made from the install new jobs use.
    pub(super) fn check_warm(&self, name: &str) -> Result<(), &'static str> {
        let warm = self.warm.borrow();
        let Some(prepared) = warm.get(name) else {
            return Err("dead");
        };
        if !self.s.work_root.join(name).is_dir() {
            return Err("dead");
        }
        if self.user_wanted(prepared.user.as_deref()) {
            return Err("user");
        }
        if let (Some(lease), Some(current)) = (
            &prepared.lease,
            self.managed.as_ref().and_then(|m| m.current()),
        ) && lease.version != current
        {
            return Err("stale");
        }
        Ok(())
    }

    /// Starts `spec`'s runner in warm directory `warm`, renamed to the runner's name.
    pub(super) async fn start_warm(
        &self,
        warm: String,
        spec: RunnerSpec,
    ) -> Result<RunningRunner, ProvisionError> {
        let prepared = self.warm.borrow_mut().remove(&warm).ok_or_else(|| {
            ProvisionError::EnvironmentFailed(format!("{warm} was not prepared by this run"))
        })?;
        // Its user was given long before the claim: still its alone? Else a new directory.
        self.recheck_user(&warm, prepared.user.as_deref())?;
        let root = &self.s.work_root;
        let dir = root.join(&spec.name);
        tokio::fs::rename(root.join(&warm), &dir)
            .await
            .map_err(|e| {
                ProvisionError::EnvironmentFailed(format!(
                    "cannot hand the warm directory {warm} to the runner: {e}"
                ))
            })?;
        super::users::rename(&warm, &spec.name);
        self.launch(spec, dir, prepared).await
    }
}
