//! `TartBackend`: one cloned macOS VM per job, driven by the `tart` CLI.
//!
//! Per job: `tart clone <base_image> <name>`, `tart run --no-graphics <name>` kept as a child
//! (it lives as long as the VM), `tart ip --wait <boot_timeout> <name>`, the VM's host key
//! pinned ([`host_keys`]), then the runner over ssh with the JIT config on stdin (never argv;
//! [`guest`]). At the end, or on any failure, `tart stop` and `tart delete` (both idempotent);
//! at start-up the same for every VM named with our prefix. The pool is capped at two VMs by
//! config validation: Apple's limit per host.

pub(super) mod guest;
mod host_keys;

use std::{path::PathBuf, process::Stdio, rc::Rc, time::Duration};

use tokio::{io::AsyncWriteExt, process::Command};

use super::RunnerEnv;
use super::{Backend, ProvisionError, RunnerSpec, RunningRunner, check_executable, spawn_error};
use crate::config::{HostKeys, PoolName, ProviderKind};
use guest::{remote_command, stdin_payload};
use host_keys::keyscan_path;

/// Settings of the tart backend.
#[derive(Debug, Clone)]
pub struct TartSettings {
    /// The pool (`[providers.NAME]`).
    pub pool: PoolName,
    /// What the runner gets in its environment besides its JIT config.
    pub env: RunnerEnv,
    /// The `tart` executable.
    pub tart: PathBuf,
    /// The `ssh` executable.
    pub ssh: PathBuf,
    /// Image each VM is cloned from.
    pub base_image: String,
    /// Guest user.
    pub ssh_user: String,
    /// Runner start script in the guest.
    pub runner_command: String,
    /// How long a VM may take to get an address.
    pub boot_timeout: Duration,
    /// VM names of this provider start with this.
    pub name_prefix: String,
    /// Where `tart run` and ssh output go.
    pub log_dir: PathBuf,
    /// Whose host key a VM must present: its own (made at boot) or the base image's.
    pub host_keys: HostKeys,
    /// Extra arguments of `tart run` (`run_args`, e.g. `--net-softnet`).
    pub run_args: Vec<String>,
    /// The pinned host keys of the base images (`host_keys = "image"`;
    /// `state.dir/tart-known-hosts`).
    pub known_hosts: PathBuf,
    /// One pin file per running VM (`host_keys = "per_vm"`; `state.dir/tart-hosts`, 0700).
    pub vm_hosts: PathBuf,
}

/// A VM up and reachable, no runner in it yet.
#[derive(Debug)]
struct Booted {
    /// The `tart run` child (it lives as long as the VM).
    vm: tokio::process::Child,
    ip: String,
    pin: host_keys::Pin,
    log: std::fs::File,
}

/// Shares the runner log with a child process.
fn dup(log: &std::fs::File) -> Result<std::fs::File, ProvisionError> {
    log.try_clone()
        .map_err(|e| ProvisionError::HostUnavailable(format!("cannot share the runner log: {e}")))
}

/// Runs runners in tart VMs.
#[derive(Debug, Clone)]
pub struct TartBackend {
    s: Rc<TartSettings>,
    /// Warm VMs booted before their claims, by VM name.
    warm: Rc<std::cell::RefCell<std::collections::HashMap<String, Booted>>>,
    /// A runner started in a warm VM, by runner name: its VM's name (a running VM cannot
    /// be renamed).
    vm_of: Rc<std::cell::RefCell<std::collections::HashMap<String, String>>>,
    /// The runner version of the base image, as its last VM said, and when.
    version: Rc<std::cell::RefCell<Option<(crate::release::Version, std::time::Instant)>>>,
}

/// How long the base image's runner version is trusted before a VM is asked again (the base
/// may have been rebuilt or pulled anew).
const VERSION_FOR: Duration = Duration::from_secs(3600);

/// The most of a `tart` command's output (each stream) the daemon reads.
pub(super) const TOOL_OUTPUT: usize = 1 << 20;

impl TartBackend {
    /// Its settings.
    pub fn settings(&self) -> &TartSettings {
        &self.s
    }

    /// A backend with these settings.
    pub fn new(settings: TartSettings) -> Self {
        TartBackend {
            s: Rc::new(settings),
            version: Rc::default(),
            warm: Rc::default(),
            vm_of: Rc::default(),
        }
    }

    async fn tart(&self, args: &[&str]) -> Result<String, ProvisionError> {
        // A guest can make tart print a lot (`tart ip` of a VM, a clone's progress): each
        // stream is kept to its head.
        let out = crate::bounded::output(Command::new(&self.s.tart).args(args), TOOL_OUTPUT)
            .await
            .map_err(|e| spawn_error(&format!("cannot run {}", self.s.tart.display()), &e))?;
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
        } else {
            Err(ProvisionError::EnvironmentFailed(format!(
                "tart {} failed ({}): {}",
                args.first().unwrap_or(&""),
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            )))
        }
    }

    fn log(&self, name: &str) -> Result<std::fs::File, ProvisionError> {
        let host = |what: &str, e: std::io::Error| {
            ProvisionError::HostUnavailable(format!("cannot {what}: {e}"))
        };
        std::fs::create_dir_all(&self.s.log_dir)
            .map_err(|e| host("create the log directory", e))?;
        crate::harden::private_file(&self.s.log_dir.join(format!("{name}.log")), true)
            .map_err(|e| host("open the runner log", e))
    }

    async fn boot_and_run(&self, spec: RunnerSpec) -> Result<RunningRunner, ProvisionError> {
        let booted = self.boot(&spec.name).await?;
        let vm = spec.name.clone();
        self.run_in(&vm, booted, spec).await
    }

    /// Clones VM `name`, runs it, waits for its address and pins its host key.
    async fn boot(&self, name: &str) -> Result<Booted, ProvisionError> {
        let failed = |what: &str| ProvisionError::EnvironmentFailed(what.to_string());
        self.tart(&["clone", &self.s.base_image, name]).await?;
        let log = self.log(name)?;
        let vm = Command::new(&self.s.tart)
            .args(["run", "--no-graphics"])
            .args(&self.s.run_args)
            .arg(name)
            .stdin(Stdio::null())
            .stdout(dup(&log)?)
            .stderr(dup(&log)?)
            .kill_on_drop(false)
            .spawn()
            .map_err(|e| spawn_error("cannot run the VM", &e))?;
        let wait = self.s.boot_timeout.as_secs().max(1).to_string();
        let ip = match self.tart(&["ip", "--wait", &wait, name]).await {
            Ok(ip) if !ip.is_empty() => ip,
            Ok(_) => return Err(failed("the VM did not report an address")),
            Err(e) => return Err(failed(&format!("the VM did not boot: {e}"))),
        };
        let pin = self.pin_for(name, &ip).await?;
        self.learn_version(name).await;
        Ok(Booted { vm, ip, pin, log })
    }

    /// Starts `spec`'s runner over ssh in VM `vm_name`, booted by [`TartBackend::boot`].
    async fn run_in(
        &self,
        vm_name: &str,
        booted: Booted,
        spec: RunnerSpec,
    ) -> Result<RunningRunner, ProvisionError> {
        let failed = |what: &str| ProvisionError::EnvironmentFailed(what.to_string());
        let Booted {
            mut vm,
            ip,
            pin,
            log,
        } = booted;
        // The pool's variables, the CA and the JIT config go on stdin; the remote shell reads
        // them into the runner's environment.
        let remote = remote_command(&self.s.runner_command);
        let mut ssh = Command::new(&self.s.ssh)
            .args(["-o", "StrictHostKeyChecking=yes", "-o"])
            .arg(format!("UserKnownHostsFile={}", pin.file.display()))
            .args(["-o", "GlobalKnownHostsFile=/dev/null", "-o"])
            .arg(format!("HostKeyAlias={}", pin.alias))
            .args(["-o", "BatchMode=yes", "-o", "ServerAliveInterval=15"])
            .arg(format!("{}@{ip}", self.s.ssh_user))
            .arg(remote)
            .stdin(Stdio::piped())
            .stdout(dup(&log)?)
            .stderr(log)
            .kill_on_drop(false)
            .spawn()
            .map_err(|e| spawn_error("cannot run ssh", &e))?;
        if let Some(mut stdin) = ssh.stdin.take() {
            stdin
                .write_all(&stdin_payload(&self.s.env, spec.jit_config.expose()))
                .await
                .map_err(|e| failed(&format!("cannot hand the JIT config over ssh: {e}")))?;
        }
        tracing::info!(runner = %spec.name, vm = %vm_name, %ip, "runner started in its VM");
        Ok(RunningRunner {
            exited: Box::pin(async move {
                tokio::select! {
                    status = ssh.wait() => status.ok().and_then(|s| s.code()),
                    _ = vm.wait() => None,
                }
            }),
        })
    }

    /// `doctor`: can this tart reach a guest's agent (`tart exec`), which the per-VM host keys
    /// need; a pool that trusts the image's key is told what that costs.
    async fn host_key_finding(&self) -> super::Finding {
        use super::Finding;
        match self.s.host_keys {
            HostKeys::Image => Finding::Warn(
                "host_keys = \"image\": every VM of the image presents the same ssh host key, \
                 so a job with root in its guest could pose as a booting sibling; use \"per_vm\" \
                 with an image that runs the Tart Guest Agent (docs/security.md)"
                    .to_string(),
            ),
            HostKeys::PerVm => match self.tart(&["exec", "--help"]).await {
                Ok(_) => Finding::Ok(
                    "tart exec is available: each VM gets host keys of its own at boot (the \
                     image needs the Tart Guest Agent and passwordless sudo)"
                        .to_string(),
                ),
                Err(e) => Finding::Fail(format!(
                    "this tart has no `exec` ({e}): update tart (2.x), or set host_keys = \
                     \"image\" and accept a shared host key (docs/providers.md)"
                )),
            },
        }
    }

    /// The base image's runner version, read from this VM (`tart exec`, the install beside
    /// `runner_command`) when not known or older than [`VERSION_FOR`]; a failure only logs.
    async fn learn_version(&self, name: &str) {
        let fresh = self
            .version
            .borrow()
            .as_ref()
            .is_some_and(|(_, at)| at.elapsed() < VERSION_FOR);
        if fresh {
            return;
        }
        let dir = self
            .s
            .runner_command
            .rsplit_once('/')
            .map_or(".", |(dir, _)| dir)
            .to_string();
        let ask = format!("{dir}/bin/Runner.Listener --version");
        match self.exec(name, &["/bin/sh", "-c", &ask]).await {
            Ok(out) => match out.lines().find_map(crate::release::Version::parse) {
                Some(v) => {
                    *self.version.borrow_mut() = Some((v, std::time::Instant::now()));
                }
                None => {
                    tracing::debug!(vm = %name, said = %out.trim(), "the VM did not tell its runner version")
                }
            },
            Err(e) => {
                tracing::debug!(vm = %name, error = %e, "cannot ask the VM for its runner version")
            }
        }
    }

    /// The names `tart list` shows (VMs and pulled OCI images).
    async fn vm_names(&self) -> Result<Vec<String>, ProvisionError> {
        #[derive(serde::Deserialize)]
        struct Vm {
            #[serde(rename = "Name")]
            name: String,
        }
        let json = self.tart(&["list", "--format", "json"]).await?;
        Ok(serde_json::from_str::<Vec<Vm>>(&json)
            .unwrap_or_default()
            .into_iter()
            .map(|v| v.name)
            .collect())
    }
}

impl Backend for TartBackend {
    fn kind(&self) -> ProviderKind {
        ProviderKind::VmMacos
    }

    fn pool(&self) -> &PoolName {
        &self.s.pool
    }

    async fn start(self, spec: RunnerSpec) -> Result<RunningRunner, ProvisionError> {
        let name = spec.name.clone();
        let result = self.boot_and_run(spec).await;
        super::stopped_on_failure(self, name, result).await
    }

    async fn stop(self, name: String) {
        // A runner in a warm VM: the VM has its own name.
        let name = self.vm_of.borrow_mut().remove(&name).unwrap_or(name);
        self.warm.borrow_mut().remove(&name);
        if let Err(e) = self.tart(&["stop", "--timeout", "30", &name]).await {
            tracing::debug!(runner = %name, error = %e, "tart stop");
        }
        if let Err(e) = self.tart(&["delete", &name]).await {
            tracing::debug!(runner = %name, error = %e, "tart delete");
        }
        self.forget_pin(&name);
    }

    async fn probe(self) -> Result<(), ProvisionError> {
        let s = &self.s;
        check_executable(&s.tart, "tart")?;
        check_executable(&s.ssh, "ssh")?;
        match s.host_keys {
            HostKeys::Image => check_executable(&keyscan_path(&s.ssh), "ssh-keyscan"),
            HostKeys::PerVm => Ok(()),
        }
    }

    async fn reap_leftovers(self, keep: Vec<String>) -> Vec<String> {
        let listed = self.vm_names().await.unwrap_or_else(|e| {
            tracing::warn!(error = %e, "cannot list VMs to remove leftovers");
            Vec::new()
        });
        let names: Vec<String> = listed
            .into_iter()
            .filter(|n| n.starts_with(&self.s.name_prefix) && !keep.contains(n))
            .collect();
        for name in &names {
            self.clone().stop(name.clone()).await;
        }
        for name in self.stale_pins(&keep) {
            self.forget_pin(&name);
        }
        names
    }

    /// `doctor`: is the base image in tart's list (a local VM, or an OCI image pulled
    /// before)? An OCI name not pulled yet is pulled by the first clone.
    async fn doctor_checks(self) -> Vec<super::Finding> {
        use super::Finding;
        let image = self.s.base_image.clone();
        let names = match self.vm_names().await {
            Ok(names) => names,
            Err(e) => return vec![Finding::Fail(format!("tart list failed: {e}"))],
        };
        let oci = image.contains('/');
        let keys = self.host_key_finding().await;
        let image = if names.contains(&image) {
            Finding::Ok(format!("base image {image} is in tart's list"))
        } else if oci {
            Finding::Warn(format!(
                "base image {image} is not pulled yet: the first job's clone pulls it \
                 (minutes; tart pull {image} beforehand)"
            ))
        } else {
            Finding::Fail(format!(
                "no VM named {image} in tart's list: build it (docs/providers.md) or fix \
                 base_image"
            ))
        };
        vec![image, keys]
    }

    /// What the base image's last VM said (none before the first job).
    async fn runner_version(self) -> Result<Option<crate::release::Version>, super::VersionError> {
        Ok(self.version.borrow().as_ref().map(|(v, _)| v.clone()))
    }

    async fn warm_boot(self, name: String) -> Result<(), ProvisionError> {
        match self.boot(&name).await {
            Ok(booted) => {
                self.warm.borrow_mut().insert(name, booted);
                Ok(())
            }
            Err(e) => Err(e),
        }
    }

    /// A warm VM whose `tart run` ended is dead.
    async fn warm_ready(self, name: String) -> Result<(), &'static str> {
        match self
            .warm
            .borrow_mut()
            .get_mut(&name)
            .map(|b| b.vm.try_wait())
        {
            Some(Ok(None)) => Ok(()),
            _ => Err("dead"),
        }
    }

    /// The runner over ssh in warm VM `warm`, the config on stdin as for a cold one.
    async fn warm_start(
        self,
        warm: String,
        spec: RunnerSpec,
    ) -> Result<RunningRunner, ProvisionError> {
        let booted = self.warm.borrow_mut().remove(&warm).ok_or_else(|| {
            ProvisionError::EnvironmentFailed(format!("{warm} was not booted by this run"))
        })?;
        let runner = spec.name.clone();
        let started = self.run_in(&warm, booted, spec).await;
        if started.is_ok() {
            self.vm_of.borrow_mut().insert(runner, warm);
        }
        started
    }

    /// The `tart run` child that held the VM died with the old daemon, so a VM cannot be
    /// watched again: it is reported lost and cleaned up (the job is dispatched again if it
    /// had not started).
    async fn adopt(self, _name: String) -> Option<RunningRunner> {
        None
    }
}
