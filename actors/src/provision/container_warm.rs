//! A container pool's warm environments: the runner's container created and started before
//! its claim, with an idle main process instead of the runner, and no secret in it (the pool's
//! `env` and the JIT config come at the claim). At the claim the container is renamed to the
//! runner's name and the runner is started in it by an exec with the JIT config in the exec's
//! environment; when the runner exits, the idle main process exits with the runner's code, so
//! the container ends as a cold-started one does (and a restarted daemon adopts it the same
//! way). The exec's output goes to the runner's log file.

use bollard::{models::ExecConfig, query_parameters::RenameContainerOptions};

use super::{
    ProvisionError, RunnerSpec, RunningRunner,
    container::{ContainerBackend, watch},
};

/// Where the runner's exit code is left for the idle main process.
const EXIT_FILE: &str = "/tmp/.ephemer-runner-exit";

/// The idle main process: waits for the runner's exit code, then exits with it (143 on a
/// stop before any runner).
fn idle_script() -> String {
    format!(
        "trap 'exit 143' TERM INT; while [ ! -s {EXIT_FILE} ]; do sleep 0.1; done; exit \"$(cat {EXIT_FILE})\""
    )
}

/// The exec around the runner: runs it, then leaves its exit code for the main process.
fn run_script() -> String {
    format!("\"$@\"; echo $? > {EXIT_FILE}")
}

impl ContainerBackend {
    /// Creates and starts warm container `name`.
    pub(super) async fn boot_warm(&self, name: &str) -> Result<(), ProvisionError> {
        self.images.ready(&self.docker, &self.s).await?;
        let mut body = self.body(name, None, None);
        body.entrypoint = Some(vec!["sh".into(), "-c".into(), idle_script()]);
        self.create(name, body).await
    }

    /// Whether warm container `name` still runs, from the image the pool's tag names now.
    pub(super) async fn check_warm(&self, name: &str) -> Result<(), &'static str> {
        let Ok(c) = self
            .docker
            .inspect_container(
                name,
                None::<bollard::query_parameters::InspectContainerOptions>,
            )
            .await
        else {
            return Err("dead");
        };
        if !c.state.and_then(|s| s.running).unwrap_or(false) {
            return Err("dead");
        }
        let current = self.docker.inspect_image(&self.s.image).await.ok();
        match (current.and_then(|i| i.id), c.image) {
            (Some(now), Some(ran)) if now != ran => Err("stale"),
            _ => Ok(()),
        }
    }

    /// The runner's command: the pool's `command`, else the image's entrypoint and command.
    async fn runner_argv(&self) -> Result<Vec<String>, ProvisionError> {
        if !self.s.command.is_empty() {
            return Ok(self.s.command.clone());
        }
        let image = self
            .docker
            .inspect_image(&self.s.image)
            .await
            .map_err(|e| self.engine_error(&e))?;
        let config = image.config.unwrap_or_default();
        let argv: Vec<String> = config
            .entrypoint
            .unwrap_or_default()
            .into_iter()
            .chain(config.cmd.unwrap_or_default())
            .collect();
        if argv.is_empty() {
            return Err(ProvisionError::Rejected(format!(
                "the image {} names no command to run the runner: set the pool's command",
                self.s.image
            )));
        }
        Ok(argv)
    }

    /// Starts `spec`'s runner in warm container `warm`, renamed to the runner's name.
    pub(super) async fn start_warm(
        &self,
        warm: &str,
        spec: RunnerSpec,
    ) -> Result<RunningRunner, ProvisionError> {
        let name = spec.name.clone();
        self.docker
            .rename_container(warm, RenameContainerOptions { name: name.clone() })
            .await
            .map_err(|e| self.engine_error(&e))?;
        let argv = self.runner_argv().await?;
        let cmd: Vec<String> = ["sh", "-c", &run_script(), "sh"]
            .into_iter()
            .map(String::from)
            .chain(argv)
            .collect();
        let exec = self
            .docker
            .create_exec(
                &name,
                ExecConfig {
                    attach_stdout: Some(true),
                    attach_stderr: Some(true),
                    cmd: Some(cmd),
                    env: Some(self.job_env(&spec)),
                    ..ExecConfig::default()
                },
            )
            .await
            .map_err(|e| self.engine_error(&e))?;
        let started = self
            .docker
            .start_exec(&exec.id, None)
            .await
            .map_err(|e| self.engine_error(&e))?;
        if let bollard::exec::StartExecResults::Attached { output, .. } = started {
            let backend = self.clone();
            let log = name.clone();
            crate::tasks::spawn(async move { backend.write_log(&log, output).await });
        }
        tracing::info!(runner = %name, image = %self.s.image, "runner started in a warm container");
        Ok(RunningRunner {
            exited: watch(self.docker.clone(), name),
        })
    }
}
