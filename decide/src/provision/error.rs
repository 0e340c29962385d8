//! `ProvisionError`: why a runner environment could not be made, and what that means for the
//! job and the pool.

use crate::vocab::ErrorClass;

/// Why a provisioner could not make a runner's environment.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProvisionError {
    /// The host cannot make any environment right now: the engine is not answering, its init
    /// or the image is missing, a directory cannot be written. The pool goes down until its
    /// host check passes again; the job waits for it (or goes to another covering pool).
    #[error("the host cannot make runner environments: {0}")]
    HostUnavailable(String),
    /// The pool's settings cannot work as they are (a runner command that does not exist or
    /// is not executable, a `run_as` user that does not exist). Like `HostUnavailable`, the
    /// pool goes down until its host check passes; retrying on it as it is would fail the same.
    #[error("the pool's settings cannot work: {0}")]
    Misconfigured(String),
    /// This one environment failed to come up (a VM that did not boot, a start the engine
    /// refused once): worth retrying with a new runner, on the claim retry ladder.
    #[error("{0}")]
    EnvironmentFailed(String),
    /// The engine refused this runner's environment as invalid (a container spec it rejects
    /// with 400): trying again would be refused the same, so the job's attempts end at once.
    /// The pool stays up; other jobs may be fine.
    #[error("the runner's environment was refused as invalid: {0}")]
    Rejected(String),
}

impl ProvisionError {
    /// Whether trying again on this pool, as it is, is worth it.
    pub fn is_retryable(&self) -> bool {
        matches!(self, ProvisionError::EnvironmentFailed(_))
    }

    /// Whether the pool as a whole cannot run jobs until its host check passes.
    pub fn takes_pool_down(&self) -> bool {
        matches!(
            self,
            ProvisionError::HostUnavailable(_) | ProvisionError::Misconfigured(_)
        )
    }

    /// The class for logs and the `class` label of the retry metrics.
    pub fn class(&self) -> ErrorClass {
        match self {
            ProvisionError::EnvironmentFailed(_) | ProvisionError::HostUnavailable(_) => {
                ErrorClass::UnknownRetryable
            }
            ProvisionError::Misconfigured(_) | ProvisionError::Rejected(_) => {
                ErrorClass::NonRetryable
            }
        }
    }
}
