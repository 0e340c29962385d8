//! `ContainerBackend`: one container per job through the Docker Engine API (Docker, or Podman's
//! compatible service), with bollard.
//!
//! The container is named after the runner, runs the configured image with an init process
//! (`--init`: signals reach the runner and stop takes a fraction of a second), is never
//! privileged, carries labels marking it ours, gets the JIT config only in its environment, and
//! is removed at the end (its logs are saved to `<log_dir>/<name>.log` first). At start-up every
//! container labelled with our prefix is removed: no job owns it any more.
//!
//! Before the pool takes runners, [`Backend::probe`] creates (and removes, never starts) one
//! container the way a job's is made, init included. An engine that cannot (podman without
//! `catatonit`, a missing image, no engine on the socket) answers that create with the same
//! error it would give every job, so the pool is reported down with the cause instead.

use std::{collections::HashMap, io::Write, path::PathBuf, rc::Rc};

use bollard::{
    Docker,
    models::{ContainerCreateBody, HostConfig},
    query_parameters::{
        CreateContainerOptionsBuilder, LogsOptionsBuilder,
        RemoveContainerOptionsBuilder, StopContainerOptionsBuilder,
    },
};
use futures_util::StreamExt;

use super::RunnerEnv;
use super::{Backend, ProvisionError, RunnerSpec, RunningRunner};
use crate::config::{PoolName, ProviderKind};

/// Label marking a container as ours, with our runner-name prefix as its value.
pub const PREFIX_LABEL: &str = "io.ephemer-actors.prefix";
/// Label carrying the runner name.
pub const RUNNER_LABEL: &str = "io.ephemer-actors.runner";
/// Seconds a container gets after SIGTERM before SIGKILL.
const STOP_GRACE_SECS: i32 = 10;
/// Listings of the leftovers asked before the reaper gives up (see `reap_leftovers`).
const LIST_TRIES: u32 = 3;
/// The pause between two of them.
const LIST_AGAIN_AFTER: std::time::Duration = std::time::Duration::from_millis(300);

/// Settings of the container backend.
#[derive(Debug, Clone)]
pub struct ContainerSettings {
    /// The pool (`[providers.NAME]`).
    pub pool: PoolName,
    /// What the runner gets in its environment besides its JIT config.
    pub env: RunnerEnv,
    /// When the image is pulled.
    pub pull: crate::config::PullPolicy,
    /// Volumes, tmpfs, shm, devices, the engine socket.
    pub mounts: crate::config::ContainerMounts,
    /// `host:ip` lines for `/etc/hosts`.
    pub extra_hosts: Vec<String>,
    /// Name servers.
    pub dns: Vec<String>,
    /// `unix:///path.sock`, `tcp://host:port` or `http://host:port`.
    pub socket: String,
    /// Runner image.
    pub image: String,
    /// Command (empty: the image's own).
    pub command: Vec<String>,
    /// Network mode; `None` = the engine's default.
    pub network: Option<String>,
    /// Runner names of this provider start with this.
    pub name_prefix: String,
    /// Where container logs are saved.
    pub log_dir: PathBuf,
    /// What each container may use and do.
    pub limits: crate::config::ContainerLimits,
    /// A container's saved log stops at this many bytes ([`LOG_CAP`] unless a test says).
    pub log_cap: u64,
    /// The host paths no bind may reach (empty with `allow_host_paths`): judged again at every
    /// start, as the host resolves each bind then.
    pub guarded: Vec<crate::config::Guarded>,
}

impl ContainerSettings {
    /// Settings with the config's defaults for everything but where the engine is, which image
    /// runs, what runner names start with and where logs go.
    pub fn new(
        pool: PoolName,
        socket: String,
        image: String,
        name_prefix: String,
        log_dir: PathBuf,
    ) -> Self {
        ContainerSettings {
            pool,
            env: RunnerEnv::default(),
            pull: crate::config::PullPolicy::default(),
            mounts: crate::config::ContainerMounts::default(),
            extra_hosts: Vec::new(),
            dns: Vec::new(),
            socket,
            image,
            command: Vec::new(),
            network: None,
            name_prefix,
            log_dir,
            limits: crate::config::ContainerLimits::default(),
            log_cap: LOG_CAP,
            guarded: Vec::new(),
        }
    }
}

/// A container's saved log stops at this many bytes (a job that floods stdout cannot fill the
/// disk, and the log is streamed to the file, never held whole in memory).
pub const LOG_CAP: u64 = 16 * 1024 * 1024;

/// Runs runners in containers.
#[derive(Debug, Clone)]
pub struct ContainerBackend {
    pub(super) docker: Docker,
    pub(super) s: Rc<ContainerSettings>,
    pub(super) images: super::image::ImageGate,
    versions: super::container_version::VersionCache,
}

impl ContainerBackend {
    /// Connects (lazily) to the engine at `settings.socket`.
    pub fn new(settings: ContainerSettings) -> Result<Self, super::BackendError> {
        let version = bollard::API_DEFAULT_VERSION;
        let docker = if settings.socket.starts_with("unix://") {
            Docker::connect_with_unix(&settings.socket, 120, version)
        } else {
            Docker::connect_with_http(&settings.socket, 120, version)
        }
        .map_err(|e| super::BackendError::Engine(settings.socket.clone(), e.to_string()))?;
        Ok(ContainerBackend {
            docker,
            s: Rc::new(settings),
            images: super::image::ImageGate::default(),
            versions: Default::default(),
        })
    }

    /// Its settings.
    pub fn settings(&self) -> &ContainerSettings {
        &self.s
    }

    pub(super) fn docker(&self) -> &Docker {
        &self.docker
    }

    pub(super) fn versions(&self) -> &super::container_version::VersionCache {
        &self.versions
    }

    /// A container like every runner's: our labels, the init, never privileged.
    pub(super) fn body(
        &self,
        name: &str,
        cmd: Option<Vec<String>>,
        env: Option<Vec<String>>,
    ) -> ContainerCreateBody {
        ContainerCreateBody {
            image: Some(self.s.image.clone()),
            cmd,
            env,
            labels: Some(HashMap::from([
                (PREFIX_LABEL.to_string(), self.s.name_prefix.clone()),
                (RUNNER_LABEL.to_string(), name.to_string()),
            ])),
            host_config: Some(self.host_config()),
            ..ContainerCreateBody::default()
        }
    }

    /// The limits every runner container runs under: memory (swap included), processes, CPUs,
    /// no new privileges, only the capabilities kept, and a read-only root if asked.
    fn host_config(&self) -> HostConfig {
        let l = &self.s.limits;
        let memory = i64::try_from(l.memory).unwrap_or(i64::MAX);
        HostConfig {
            init: Some(true),
            privileged: Some(false),
            network_mode: self.s.network.clone(),
            memory: Some(memory),
            memory_swap: Some(memory),
            pids_limit: Some(l.pids_limit),
            nano_cpus: l.cpus.map(|c| (c * 1e9) as i64),
            security_opt: Some(vec!["no-new-privileges".into()]),
            cap_drop: Some(vec!["ALL".into()]),
            cap_add: Some(l.cap_add.clone()),
            readonly_rootfs: Some(l.read_only_root),
            ..super::image::mounts(&self.s)
        }
    }

    /// What an engine's answer means for the pool, in words an operator can act on: the
    /// engine's own, and what to install or do about it.
    pub(super) fn engine_error(&self, e: &bollard::errors::Error) -> ProvisionError {
        use bollard::errors::Error as E;
        let (socket, image) = (&self.s.socket, &self.s.image);
        match e {
            E::DockerResponseServerError {
                status_code,
                message,
            } => {
                let lower = message.to_ascii_lowercase();
                if lower.contains("container-init") || lower.contains("init binary") {
                    // Podman: "container create: container-init binary not found on the host:
                    // stat /usr/libexec/podman/catatonit: ..." (the init of `--init`, a
                    // Recommends of Debian's podman that `--no-install-recommends` leaves out).
                    ProvisionError::HostUnavailable(format!(
                        "the container engine cannot run the container init (--init): {message}; \
                         install catatonit for Podman (apt-get install catatonit) or tini/docker-init for Docker"
                    ))
                } else if *status_code == 404 && lower.contains("image") {
                    ProvisionError::HostUnavailable(format!(
                        "the runner image {image} is not on the engine: {message}; pull it first (podman pull {image})"
                    ))
                } else if *status_code == 400 {
                    // The Engine API's "bad parameter": the spec itself is invalid, and would be
                    // refused again.
                    ProvisionError::Rejected(format!(
                        "the container engine rejected the runner's container spec (400): {message}"
                    ))
                } else {
                    ProvisionError::EnvironmentFailed(format!(
                        "the container engine refused the runner's container ({status_code}): {message}"
                    ))
                }
            }
            other => ProvisionError::HostUnavailable(format!(
                "cannot reach the container engine at {socket}: {other}; is podman system service (podman.socket) or dockerd running?"
            )),
        }
    }

    /// Streams the container's output to its log file, up to its cap.
    async fn save_logs(&self, name: &str) {
        let options = LogsOptionsBuilder::new().stdout(true).stderr(true).build();
        self.write_log(name, self.docker.logs(name, Some(options)))
            .await;
    }

    /// Writes `output` to `<log_dir>/<name>.log`, up to its cap; makes the file only when
    /// there is output.
    pub(super) async fn write_log(
        &self,
        name: &str,
        mut output: impl futures_util::Stream<
            Item = Result<bollard::container::LogOutput, bollard::errors::Error>,
        > + Unpin,
    ) {
        let mut file = None;
        let mut written = 0u64;
        while let Some(Ok(chunk)) = output.next().await {
            let bytes = chunk.into_bytes();
            if file.is_none() {
                let _ = std::fs::create_dir_all(&self.s.log_dir);
                let path = self.s.log_dir.join(format!("{name}.log"));
                match crate::harden::private_file(&path, false) {
                    Ok(f) => file = Some(f),
                    Err(_) => return,
                }
            }
            let Some(f) = file.as_mut() else { return };
            let cap = self.s.log_cap;
            let room = cap.saturating_sub(written);
            let take = bytes.len().min(usize::try_from(room).unwrap_or(usize::MAX));
            let _ = f.write_all(&bytes[..take]);
            written += take as u64;
            if written >= cap {
                let _ = writeln!(f, "\n[ephemer-actors: log truncated at {cap} bytes]");
                return;
            }
        }
    }

    /// The runner's environment: the pool's `env` (the CA bundle at its container path), the
    /// JIT config, and the runner's own switches. Given at the runner's start only.
    pub(super) fn job_env(&self, spec: &RunnerSpec) -> Vec<String> {
        let mut env: Vec<String> = self
            .s
            .env
            .with_ca_at(super::CONTAINER_CA_PATH)
            .into_iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        env.extend([
            format!(
                "ACTIONS_RUNNER_INPUT_JITCONFIG={}",
                spec.jit_config.expose()
            ),
            "RUNNER_ALLOW_RUNASROOT=1".into(),
            "RUNNER_MANUALLY_TRAP_SIG=1".into(),
            format!("{}=1", crate::vocab::runner_vars::VERSION_EXIT),
        ]);
        env
    }

    /// Each bind of the pool as this host resolves it now: a symlink put on the host after
    /// check-config (`/srv/cache -> /etc`) would be followed by the engine at this start.
    fn check_binds(&self) -> Result<(), ProvisionError> {
        if crate::weaken::off("bind-recheck") {
            return Ok(());
        }
        let key = format!("providers.{}", self.s.pool);
        for (i, volume) in self.s.mounts.volumes.iter().enumerate() {
            if let Some(why) =
                crate::config::host_paths::refused_bind(&key, volume, &self.s.guarded)
            {
                return Err(ProvisionError::Misconfigured(format!(
                    "{key}.volumes[{i}] {why} (judged again at this start)"
                )));
            }
        }
        Ok(())
    }

    /// Creates container `name` from `body`; one left over under that name is removed first.
    pub(super) async fn create(
        &self,
        name: &str,
        body: ContainerCreateBody,
    ) -> Result<(), ProvisionError> {
        self.check_binds()?;
        let options = CreateContainerOptionsBuilder::new().name(name).build();
        let created = self
            .docker
            .create_container(Some(options.clone()), body.clone())
            .await;
        if let Err(bollard::errors::Error::DockerResponseServerError {
            status_code: 409, ..
        }) = created
        {
            // A container of that name is left over: remove it and try once more.
            self.clone().stop(name.to_string()).await;
            self.docker
                .create_container(Some(options), body)
                .await
                .map_err(|e| self.engine_error(&e))?;
        } else {
            created.map_err(|e| self.engine_error(&e))?;
        }
        self.docker
            .start_container(
                name,
                None::<bollard::query_parameters::StartContainerOptions>,
            )
            .await
            .map_err(|e| self.engine_error(&e))
    }
}

/// Resolves with the container's exit code when it stops.
pub(super) fn watch(docker: Docker, name: String) -> super::LocalFuture<Option<i32>> {
    Box::pin(async move {
        let mut wait = docker.wait_container(
            &name,
            None::<bollard::query_parameters::WaitContainerOptions>,
        );
        match wait.next().await {
            Some(Ok(r)) => i32::try_from(r.status_code).ok(),
            Some(Err(bollard::errors::Error::DockerContainerWaitError { code, .. })) => {
                i32::try_from(code).ok()
            }
            _ => None,
        }
    })
}

impl Backend for ContainerBackend {
    fn kind(&self) -> ProviderKind {
        ProviderKind::Linux
    }

    fn pool(&self) -> &PoolName {
        &self.s.pool
    }

    async fn start(self, spec: RunnerSpec) -> Result<RunningRunner, ProvisionError> {
        let name = spec.name.clone();
        self.images.ready(&self.docker, &self.s).await?;
        let cmd = (!self.s.command.is_empty()).then(|| self.s.command.clone());
        let body = self.body(&name, cmd, Some(self.job_env(&spec)));
        self.create(&name, body).await?;
        tracing::info!(runner = %name, image = %self.s.image, "runner container started");
        let docker = self.docker.clone();
        Ok(RunningRunner {
            exited: watch(docker, name),
        })
    }

    async fn warm_boot(self, name: String) -> Result<(), ProvisionError> {
        self.boot_warm(&name).await
    }

    async fn warm_ready(self, name: String) -> Result<(), &'static str> {
        self.check_warm(&name).await
    }

    async fn warm_start(
        self,
        warm: String,
        spec: RunnerSpec,
    ) -> Result<RunningRunner, ProvisionError> {
        self.start_warm(&warm, spec).await
    }

    async fn stop(self, name: String) {
        let stop = StopContainerOptionsBuilder::new()
            .t(STOP_GRACE_SECS)
            .build();
        let _ = self.docker.stop_container(&name, Some(stop)).await;
        self.save_logs(&name).await;
        let remove = RemoveContainerOptionsBuilder::new()
            .force(true)
            .v(true)
            .build();
        match self.docker.remove_container(&name, Some(remove)).await {
            Ok(())
            | Err(bollard::errors::Error::DockerResponseServerError {
                status_code: 404, ..
            }) => {}
            Err(e) => {
                tracing::warn!(runner = %name, error = %e, "cannot remove the runner container")
            }
        }
    }

    async fn reap_leftovers(self, keep: Vec<String>) -> Vec<String> {
        // Names only, not bollard's typed listing: that fails whole on a container in a state
        // its enum lacks (podman's `stopped`, which every exiting container passes through).
        // The engine's listing can fail whole while a container is being removed under it
        // (podman answers 500 for one gone mid-listing): asked again, a little later.
        let label = format!("{PREFIX_LABEL}={}", self.s.name_prefix);
        let mut tries = 0;
        let listed = loop {
            tries += 1;
            match super::engine_api::container_names(&self.s.socket, &label).await {
                Err(e) if tries < LIST_TRIES => {
                    tracing::debug!(error = %e, tries, "listing containers failed; asking again");
                    tokio::time::sleep(LIST_AGAIN_AFTER).await;
                }
                other => break other,
            }
        };
        let names: Vec<String> = match listed {
            Ok(names) => names.into_iter().filter(|n| !keep.contains(n)).collect(),
            Err(e) => {
                tracing::warn!(error = %e, tries, "cannot list containers to remove leftovers");
                return Vec::new();
            }
        };
        for name in &names {
            self.clone().stop(name.clone()).await;
        }
        names
    }

    async fn adopt(self, name: String) -> Option<RunningRunner> {
        let inspect = self
            .docker
            .inspect_container(
                &name,
                None::<bollard::query_parameters::InspectContainerOptions>,
            )
            .await
            .ok()?;
        if !inspect.state.and_then(|s| s.running).unwrap_or(false) {
            return None;
        }
        tracing::info!(runner = %name, "adopted a runner container from before the restart");
        let docker = self.docker.clone();
        Some(RunningRunner {
            exited: watch(docker, name),
        })
    }

    /// Creates and removes one container like a job's (with the init), so a host that cannot
    /// run any is found before a job is claimed for it.
    async fn probe(self) -> Result<(), ProvisionError> {
        self.check_binds()?;
        if !super::image::present(&self.docker, &self.s.image)
            .await
            .map_err(|e| self.engine_error(&e))?
        {
            // The image comes with the first job (pulled, or that job fails as the pool's
            // `pull` says); the engine answered, which is what this check can know now.
            return Ok(());
        }
        let name = format!(
            "{}-probe-{}",
            self.s.name_prefix,
            crate::vocab::random_suffix()
        );
        let body = self.body(&name, Some(vec!["true".into()]), None);
        let options = CreateContainerOptionsBuilder::new().name(&name).build();
        let created = self.docker.create_container(Some(options), body).await;
        if created.is_ok() {
            let remove = RemoveContainerOptionsBuilder::new().force(true).build();
            if let Err(e) = self.docker.remove_container(&name, Some(remove)).await {
                tracing::warn!(container = %name, error = %e, "cannot remove the probe container");
            }
        }
        created.map(|_| ()).map_err(|e| self.engine_error(&e))
    }

    async fn doctor_checks(self) -> Vec<super::Finding> {
        vec![super::image::doctor(&self.docker, &self.s).await]
    }

    async fn runner_version(self) -> Result<Option<crate::release::Version>, super::VersionError> {
        self.image_runner_version().await
    }
}
