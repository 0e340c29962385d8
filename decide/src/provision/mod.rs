//! What the scheduler's core says about runners and their environments: the spec of a runner
//! to start, how one ended, why one could not be made, and warm keeping's decisions.

mod error;
pub mod tart_cli;
pub mod warm_keeping;

pub use error::ProvisionError;

use crate::{config::Secret, job::JobKey};

/// The exit code of a runner GitHub refused as too old (actions/runner's
/// `ReturnCode.RunnerVersionDeprecated`, with
/// [`crate::vocab::runner_vars::VERSION_EXIT`] set): the pool's install needs the newest
/// release, and the job it was made for is claimed again on it, never counted as a failure.
pub const RUNNER_VERSION_DEPRECATED: i32 = 7;

/// Everything a provisioner needs to start one runner.
#[derive(Clone, PartialEq, Eq)]
pub struct RunnerSpec {
    /// Runner name (unique; also the environment's name).
    pub name: String,
    /// GitHub's runner id.
    pub runner_id: u64,
    /// The JIT config: goes into `ACTIONS_RUNNER_INPUT_JITCONFIG`, never argv, never a log.
    pub jit_config: Secret,
    /// The job the runner was created for (GitHub may give it another).
    pub intent: JobKey,
    /// Labels it registered with.
    pub labels: Vec<String>,
}

impl std::fmt::Debug for RunnerSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunnerSpec")
            .field("name", &self.name)
            .field("runner_id", &self.runner_id)
            .field("intent", &self.intent)
            .finish_non_exhaustive()
    }
}

/// How a runner ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ExitReason {
    /// The runner process exited by itself.
    Exited,
    /// Torn down on request.
    TornDown,
    /// Killed after `job_timeout`.
    TimedOut,
    /// Its provisioner died; the environment was cleaned up.
    ProvisionerDied,
    /// It was gone (or could not be re-attached) when the daemon came back after a restart.
    Lost,
}

impl ExitReason {
    /// How it ended, in words.
    pub fn words(self) -> &'static str {
        match self {
            ExitReason::Exited => "its process exited",
            ExitReason::TornDown => "torn down",
            ExitReason::TimedOut => "killed after the job timeout",
            ExitReason::ProvisionerDied => "its provisioner died",
            ExitReason::Lost => "lost over a restart",
        }
    }
}

/// What happened to a runner.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RunnerEventKind {
    /// The environment is up and the runner process started.
    Started {
        /// In a warm environment (booted before the claim).
        warm: bool,
    },
    /// The runner is gone and its environment removed.
    Exited {
        /// Exit code, if there was a process.
        code: Option<i32>,
        /// Why it ended.
        reason: ExitReason,
        /// How its environment ended, in words, where the backend can tell (a VM: its runner
        /// exited and the guest powered off, or the VM stopped first).
        detail: Option<String>,
    },
    /// What the job's egress met while it ran (names and addresses refused, or audited),
    /// told once, before its `Exited`.
    Egress {
        /// The refusals.
        seen: crate::egress::seen::Seen,
    },
    /// GitHub refused the runner as too old, and its install is the newest release `version`
    /// (a look since the pool's refusals began found nothing newer): GitHub's outage, not an old
    /// install. Told once, before its `Exited` with code [`RUNNER_VERSION_DEPRECATED`].
    RefusedNewest {
        /// The release GitHub refuses.
        version: String,
    },
    /// The environment could not be created; nothing is left of it.
    Failed {
        /// What went wrong, and whether it is worth retrying.
        error: ProvisionError,
    },
}

impl RunnerEventKind {
    /// Gone without an exit code of its own (torn down, lost, its provisioner died).
    pub fn gone(reason: ExitReason) -> Self {
        RunnerEventKind::Exited {
            code: None,
            reason,
            detail: None,
        }
    }
}

/// A pool's warm environments, as `status` shows them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct WarmView {
    /// Booted and waiting for a claim.
    pub available: usize,
    /// Booting.
    pub booting: usize,
    /// How many the pool keeps now (its count or window, within its free slots; 0 while
    /// cordoned, draining or down).
    pub target: usize,
}
