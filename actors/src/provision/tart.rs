//! `TartBackend`: one cloned macOS VM per job, driven by the `tart` CLI.
//!
//! Per job: `tart clone <base_image> <name>`, `tart run --no-graphics <name>` kept as a child
//! (it lives as long as the VM), `tart ip --wait <boot_timeout> <name>`, then the runner over
//! ssh with the JIT config on stdin (never argv). At the end, or on any failure, `tart stop` and
//! `tart delete` (both idempotent); at start-up the same for every VM named with our prefix. The
//! pool is capped at two VMs by config validation: Apple's limit per host.

use std::{path::PathBuf, process::Stdio, rc::Rc, time::Duration};

use tokio::{io::AsyncWriteExt, process::Command};

use super::RunnerEnv;
use super::{
    Backend, LocalFuture, ProvisionError, RunnerSpec, RunningRunner, check_executable, spawn_error,
};
use crate::config::{PoolName, ProviderKind};

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
    /// The pinned host keys of the base images (`state.dir/tart-known-hosts`).
    pub known_hosts: PathBuf,
}

/// Runs runners in tart VMs.
#[derive(Debug, Clone)]
pub struct TartBackend {
    s: Rc<TartSettings>,
}

impl TartBackend {
    /// Its settings.
    pub fn settings(&self) -> &TartSettings {
        &self.s
    }

    /// A backend with these settings.
    pub fn new(settings: TartSettings) -> Self {
        TartBackend {
            s: Rc::new(settings),
        }
    }

    async fn tart(&self, args: &[&str]) -> Result<String, ProvisionError> {
        let out = Command::new(&self.s.tart)
            .args(args)
            .stdin(Stdio::null())
            .output()
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

    async fn start_runner(self, spec: RunnerSpec) -> Result<RunningRunner, ProvisionError> {
        let name = spec.name.clone();
        let result = self.boot_and_run(spec).await;
        if result.is_err() {
            self.clone().stop_runner(name).await;
        }
        result
    }

    async fn boot_and_run(&self, spec: RunnerSpec) -> Result<RunningRunner, ProvisionError> {
        let name = &spec.name;
        let failed = |what: &str| ProvisionError::EnvironmentFailed(what.to_string());
        let dup = |log: &std::fs::File| {
            log.try_clone().map_err(|e| {
                ProvisionError::HostUnavailable(format!("cannot share the runner log: {e}"))
            })
        };
        self.tart(&["clone", &self.s.base_image, name]).await?;
        let log = self.log(name)?;
        let mut vm = Command::new(&self.s.tart)
            .args(["run", "--no-graphics", name])
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
        let alias = self.pin_host_key(&ip).await?;
        // The pool's variables, the CA and the JIT config go on stdin; the remote shell reads
        // them into the runner's environment.
        let remote = remote_command(&self.s.runner_command);
        let mut ssh = Command::new(&self.s.ssh)
            .args(["-o", "StrictHostKeyChecking=yes", "-o"])
            .arg(format!(
                "UserKnownHostsFile={}",
                self.s.known_hosts.display()
            ))
            .arg("-o")
            .arg(format!("HostKeyAlias={alias}"))
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
        tracing::info!(runner = %name, %ip, "runner started in its VM");
        Ok(RunningRunner {
            exited: Box::pin(async move {
                tokio::select! {
                    status = ssh.wait() => status.ok().and_then(|s| s.code()),
                    _ = vm.wait() => None,
                }
            }),
        })
    }

    /// The host key every clone of the base image carries (clones share the image's disk, so
    /// its keys): learned from the first VM booted from it (`ssh-keyscan`, once, on tart's
    /// host-only network), kept in `known_hosts` under an alias named after the image, and
    /// required of every later VM, so the JIT config never crosses an ssh connection to a host
    /// whose key was not checked. Returns the alias.
    async fn pin_host_key(&self, ip: &str) -> Result<String, ProvisionError> {
        let alias = host_alias(&self.s.base_image);
        let known = std::fs::read_to_string(&self.s.known_hosts).unwrap_or_default();
        if known.lines().any(|l| l.starts_with(&format!("{alias} "))) {
            return Ok(alias);
        }
        let out = Command::new(keyscan_path(&self.s.ssh))
            .args(["-T", "10", ip])
            .stdin(Stdio::null())
            .output()
            .await
            .map_err(|e| spawn_error("cannot run ssh-keyscan", &e))?;
        let keys: Vec<String> = String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter(|l| !l.trim().is_empty() && !l.starts_with('#'))
            .filter_map(|l| l.split_once(' ').map(|(_, key)| format!("{alias} {key}")))
            .collect();
        if keys.is_empty() {
            return Err(ProvisionError::EnvironmentFailed(format!(
                "cannot learn the host key of the VM at {ip} (ssh-keyscan found none)"
            )));
        }
        let mut file = crate::harden::private_file(&self.s.known_hosts, true).map_err(|e| {
            ProvisionError::HostUnavailable(format!(
                "cannot write {}: {e}",
                self.s.known_hosts.display()
            ))
        })?;
        for key in &keys {
            std::io::Write::write_all(&mut file, format!("{key}\n").as_bytes()).map_err(|e| {
                ProvisionError::HostUnavailable(format!("cannot pin the host key: {e}"))
            })?;
        }
        tracing::info!(image = %self.s.base_image, alias = %alias, "pinned the base image's ssh host key");
        Ok(alias)
    }

    async fn stop_runner(self, name: String) {
        if let Err(e) = self.tart(&["stop", "--timeout", "30", &name]).await {
            tracing::debug!(runner = %name, error = %e, "tart stop");
        }
        if let Err(e) = self.tart(&["delete", &name]).await {
            tracing::debug!(runner = %name, error = %e, "tart delete");
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

    async fn reap(self, keep: Vec<String>) -> Vec<String> {
        let listed = self.vm_names().await.unwrap_or_else(|e| {
            tracing::warn!(error = %e, "cannot list VMs to remove leftovers");
            Vec::new()
        });
        let names: Vec<String> = listed
            .into_iter()
            .filter(|n| n.starts_with(&self.s.name_prefix) && !keep.contains(n))
            .collect();
        for name in &names {
            self.clone().stop_runner(name.clone()).await;
        }
        names
    }
}

impl Backend for TartBackend {
    fn kind(&self) -> ProviderKind {
        ProviderKind::VmMacos
    }

    fn pool(&self) -> &PoolName {
        &self.s.pool
    }

    fn start(&self, spec: RunnerSpec) -> LocalFuture<Result<RunningRunner, ProvisionError>> {
        Box::pin(self.clone().start_runner(spec))
    }

    fn stop(&self, name: String) -> LocalFuture<()> {
        Box::pin(self.clone().stop_runner(name))
    }

    fn probe(&self) -> LocalFuture<Result<(), ProvisionError>> {
        let s = self.s.clone();
        Box::pin(async move {
            check_executable(&s.tart, "tart")?;
            check_executable(&s.ssh, "ssh")?;
            check_executable(&keyscan_path(&s.ssh), "ssh-keyscan")
        })
    }

    fn reap_leftovers(&self, keep: Vec<String>) -> LocalFuture<Vec<String>> {
        Box::pin(self.clone().reap(keep))
    }

    /// `doctor`: is the base image in tart's list (a local VM, or an OCI image pulled
    /// before)? An OCI name not pulled yet is pulled by the first clone.
    fn doctor_checks(&self) -> LocalFuture<Vec<super::Finding>> {
        let this = self.clone();
        Box::pin(async move {
            use super::Finding;
            let image = this.s.base_image.clone();
            let names = match this.vm_names().await {
                Ok(names) => names,
                Err(e) => return vec![Finding::Fail(format!("tart list failed: {e}"))],
            };
            let oci = image.contains('/');
            vec![if names.contains(&image) {
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
            }]
        })
    }

    /// The `tart run` child that held the VM died with the old daemon, so a VM cannot be
    /// watched again: it is reported lost and cleaned up (the job is dispatched again if it
    /// had not started).
    fn adopt(&self, _name: String) -> LocalFuture<Option<RunningRunner>> {
        Box::pin(async { None })
    }
}

/// `ssh-keyscan` beside the configured `ssh` (on `PATH` when `ssh` is a bare name).
fn keyscan_path(ssh: &std::path::Path) -> PathBuf {
    if ssh.components().count() == 1 {
        PathBuf::from("ssh-keyscan")
    } else {
        ssh.with_file_name("ssh-keyscan")
    }
}

/// The known-hosts name of a base image's VMs: `ephemer-` and the image with every character
/// outside `[A-Za-z0-9.-]` as `-`.
fn host_alias(image: &str) -> String {
    let clean: String = image
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '.' || c == '-' {
                c
            } else {
                '-'
            }
        })
        .collect();
    format!("ephemer-{clean}")
}

/// The guest's file for the CA bundle.
const GUEST_CA: &str = "$HOME/.ephemer-actors-ca.pem";

/// The remote shell command: reads `NAME=<base64>` lines up to an empty one into the
/// environment (`_CA` into [`GUEST_CA`], pointed at by the CA variables), then the JIT config
/// (the rest of stdin), then runs the runner. Nothing secret is on the command line.
pub(super) fn remote_command(runner_command: &str) -> String {
    let ca_vars: String = super::CA_VARS
        .iter()
        .map(|v| format!("export {v}=\"{GUEST_CA}\"; "))
        .collect();
    format!(
        "umask 077; while IFS= read -r l && [ -n \"$l\" ]; do n=${{l%%=*}}; \
         v=$(printf %s \"${{l#*=}}\" | base64 -d) || exit 1; \
         if [ \"$n\" = _CA ]; then printf '%s\\n' \"$v\" > \"{GUEST_CA}\"; {ca_vars}\
         else export \"$n=$v\"; fi; done; \
         c=$(cat) && ACTIONS_RUNNER_INPUT_JITCONFIG=\"$c\" RUNNER_MANUALLY_TRAP_SIG=1 exec {runner_command}"
    )
}

/// What [`remote_command`] reads on stdin.
pub(super) fn stdin_payload(env: &RunnerEnv, jit_config: &str) -> Vec<u8> {
    use base64::Engine;
    let b64 = |v: &[u8]| base64::engine::general_purpose::STANDARD.encode(v);
    let mut out = String::new();
    for (name, value) in &env.vars {
        out.push_str(&format!("{name}={}\n", b64(value.expose().as_bytes())));
    }
    if let Some(ca) = env.ca_bundle.as_ref().and_then(|p| std::fs::read(p).ok()) {
        out.push_str(&format!("_CA={}\n", b64(&ca)));
    }
    out.push('\n');
    out.push_str(jit_config);
    out.into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Secret;

    /// The guest side runs in a POSIX shell; this one is the host's, which reads the same.
    #[test]
    fn the_guest_shell_gets_the_variables_the_ca_and_the_jit_config_from_stdin() {
        let dir = tempfile::tempdir().unwrap();
        let ca = dir.path().join("ca.pem");
        std::fs::write(
            &ca,
            "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n",
        )
        .unwrap();
        let env = RunnerEnv {
            vars: vec![
                ("https_proxy".into(), Secret::new("http://u:p@proxy:3128")),
                ("TEAM".into(), Secret::new("a b $c \"d\"")),
            ],
            ca_bundle: Some(ca),
        };
        let out = dir.path().join("env");
        let script = remote_command(&format!("env > {}", out.display()));
        let mut child = std::process::Command::new("sh")
            .args(["-c", &script])
            .env_clear()
            .env("HOME", dir.path())
            .env("PATH", std::env::var("PATH").unwrap())
            .stdin(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        use std::io::Write;
        child
            .stdin
            .take()
            .unwrap()
            .write_all(&stdin_payload(&env, "JIT-123"))
            .unwrap();
        assert!(child.wait().unwrap().success());
        let seen = std::fs::read_to_string(&out).unwrap();
        assert!(
            seen.contains("https_proxy=http://u:p@proxy:3128\n"),
            "{seen}"
        );
        assert!(seen.contains("TEAM=a b $c \"d\"\n"), "{seen}");
        assert!(
            seen.contains("ACTIONS_RUNNER_INPUT_JITCONFIG=JIT-123\n"),
            "{seen}"
        );
        let guest_ca = dir.path().join(".ephemer-actors-ca.pem");
        assert!(
            seen.contains(&format!("SSL_CERT_FILE={}", guest_ca.display())),
            "{seen}"
        );
        assert!(std::fs::read_to_string(guest_ca).unwrap().contains("AAAA"));
    }
}
