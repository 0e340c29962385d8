//! `QemuBackend`: one QEMU microVM per job (`kind = "linux_vm"`), a kernel of its own between
//! the job and the host.
//!
//! Per job, in its run directory (`state.dir/vms/<runner>`, 0700): a copy-on-write overlay on
//! the image (`qemu-img create -f qcow2 -b <image>`; the image is never written), QEMU with the
//! `microvm` machine and direct kernel boot ([`args`]), the guest agent's hello on the VM's
//! second serial port, then the runner's variables and JIT config handed over that port
//! ([`agent`]; never on QEMU's command line, in its environment or in a file). The VM ends when
//! its runner does (the agent powers it off) or at teardown (QEMU killed, the run directory
//! removed). A restart reaps every run directory of the pool's prefix, with its QEMU.

mod agent;
mod args;
mod image;
mod sandbox;
mod warm;
mod words;

use std::{
    path::{Path, PathBuf},
    process::Stdio,
    rc::Rc,
    time::Duration,
};

use tokio::process::Command;

use super::{
    Backend, Finding, ProvisionError, RunnerEnv, RunnerSpec, RunningRunner, check_executable,
    cgroup::{CgroupRoot, RunnerCgroup},
    procgroup, spawn_error,
    unremovable::Unremovable,
};
use crate::config::{
    PoolName, ProviderKind, Secret,
    linux_vm::{Accel, LinuxVmConfig, VmNetwork},
};
use agent::Agent;
use args::{VmFiles, VmShape, cloud_kernel, initrd_beside, qemu_args};

/// Settings of the QEMU backend.
#[derive(Debug, Clone)]
pub struct QemuSettings {
    /// The pool (`[providers.NAME]`).
    pub pool: PoolName,
    /// What the runner gets in its environment besides its JIT config.
    pub env: RunnerEnv,
    /// The pool's VM keys.
    pub vm: LinuxVmConfig,
    /// VM names of this pool start with this.
    pub name_prefix: String,
    /// Where each VM's run directory goes (`state.dir/vms`).
    pub run_dir: PathBuf,
    /// Where QEMU's own output and the guest's console go.
    pub log_dir: PathBuf,
    /// `ephemerd_vm_boot_seconds` of the pool, when metrics are kept.
    pub boot_seconds: Option<prometheus::Histogram>,
    /// Where the run directories its teardowns could not remove are written down.
    pub left_record: Option<PathBuf>,
    /// `ephemerd_teardown_unremoved{provider}` of the pool, when metrics are kept.
    pub left_gauge: Option<prometheus::IntGauge>,
    /// What each VM's network lets out (`network = "user"`), and where what it met is told.
    pub egress: crate::netns::Egress,
}

/// Runs runners in QEMU microVMs.
#[derive(Debug, Clone)]
pub struct QemuBackend {
    s: Rc<QemuSettings>,
    /// Booted warm VMs, their agents waiting for a runner ([`warm`]).
    warm: Rc<std::cell::RefCell<std::collections::BTreeMap<String, warm::WarmVm>>>,
    /// Where each VM's QEMU gets a cgroup, when this host lets the daemon make them.
    cgroups: Rc<Option<CgroupRoot>>,
    /// How each ended VM ended, in words, until the provisioner takes it for the timeline.
    ends: Rc<std::cell::RefCell<std::collections::BTreeMap<String, String>>>,
    /// The run directories teardowns left, tried again at each later teardown.
    left: Unremovable,
    /// VMs whose agent was handed a runner (given a grace to end by themselves at teardown).
    runs: Rc<std::cell::RefCell<std::collections::BTreeSet<String>>>,
    /// Each running VM's network namespace (`network = "user"`), by VM name.
    nets: crate::netns::Nets,
    /// The host's name servers, which each VM's DNS forwarder asks.
    upstreams: std::sync::Arc<Vec<std::net::SocketAddr>>,
    /// Whether this QEMU can sandbox each VM, once asked.
    sandbox: Rc<std::cell::RefCell<Option<Result<(), ProvisionError>>>>,
}

/// How long a guest whose runner exited may take to power off before QEMU is stopped.
const POWER_OFF_GRACE: Duration = Duration::from_secs(30);
/// The file in a VM's run directory naming its network namespace's slot.
const NETNS_FILE: &str = "netns";

/// How long a teardown lets a VM with a runner end by itself (its runner exits after its
/// job's `completed`, the agent says EXIT and powers off) before QEMU is killed.
const EXIT_GRACE: Duration = Duration::from_secs(10);

impl QemuBackend {
    /// A backend with these settings.
    pub fn new(settings: QemuSettings) -> Self {
        #[cfg(target_os = "linux")]
        let cgroups = CgroupRoot::detect().ok();
        #[cfg(not(target_os = "linux"))]
        let cgroups = None;
        let left = Unremovable::new(settings.left_record.clone(), settings.left_gauge.clone());
        QemuBackend {
            nets: crate::netns::Nets::default(),
            upstreams: std::sync::Arc::new(crate::netns::host_upstreams()),
            left,
            runs: Rc::default(),
            sandbox: Rc::default(),
            s: Rc::new(settings),
            warm: Rc::default(),
            cgroups: Rc::new(cgroups),
            ends: Rc::default(),
        }
    }

    /// Its settings.
    pub fn settings(&self) -> &QemuSettings {
        &self.s
    }

    /// The kernel and initramfs each VM boots.
    fn boot_files(&self) -> Result<(PathBuf, Option<PathBuf>), ProvisionError> {
        let kernel = match &self.s.vm.kernel {
            Some(k) => k.clone(),
            None => cloud_kernel(Path::new("/boot")).ok_or_else(|| {
                ProvisionError::HostUnavailable(
                    "no kernel: install linux-image-cloud-amd64 (or set the pool's kernel)"
                        .to_string(),
                )
            })?,
        };
        let initrd = self.s.vm.initrd.clone().or_else(|| initrd_beside(&kernel));
        image::trusted("kernel", &kernel)?;
        if let Some(initrd) = &initrd {
            image::trusted("initrd", initrd)?;
        }
        Ok((kernel, initrd))
    }

    fn vm_dir(&self, name: &str) -> PathBuf {
        self.s.run_dir.join(name)
    }

    /// Makes `name`'s overlay, starts its QEMU, and waits for the agent's hello.
    async fn boot(&self, name: &str) -> Result<(tokio::process::Child, Agent), ProvisionError> {
        let host = |what: &str, e: std::io::Error| {
            ProvisionError::HostUnavailable(format!("cannot {what}: {e}"))
        };
        let (kernel, initrd) = self.boot_files()?;
        crate::harden::private_dir(&self.s.run_dir)
            .map_err(|e| host("make the VMs' run directory", e))?;
        let dir = self.vm_dir(name);
        crate::harden::private_dir(&dir).map_err(|e| host("make the VM's run directory", e))?;
        let files = VmFiles::in_dir(&dir);
        // The name QEMU runs under, which the directory keeps when a warm VM is handed over.
        std::fs::write(&files.name, name).map_err(|e| host("name the VM", e))?;
        // Judged again at each boot: the image may have changed since the host check.
        image::check(&self.s.vm.image)?;
        image::overlay(&self.s.vm.qemu_img_path, &self.s.vm.image, &files.overlay, self.s.vm.disk).await?;
        let shape = VmShape {
            accel: self.s.vm.accel,
            cpus: self.s.vm.cpus,
            memory: self.s.vm.memory,
            kernel: &kernel,
            initrd: initrd.as_deref(),
            network: self.s.vm.network,
            tsc_khz: std::fs::read_to_string("/proc/cpuinfo")
                .ok()
                .and_then(|c| args::host_tsc_khz(&c)),
            user: vm_user(name)?,
        };
        std::fs::create_dir_all(&self.s.log_dir).map_err(|e| host("create the log directory", e))?;
        let log_path = self.s.log_dir.join(format!("{name}.log"));
        let log = crate::harden::private_file(&log_path, true)
            .map_err(|e| host("open the VM's log", e))?;
        let err = log.try_clone().map_err(|e| host("share the VM's log", e))?;
        let console = crate::bounded::CappedLog::open(&log_path, super::container::LOG_CAP)
            .map_err(|e| host("open the VM's log", e))?;
        // QEMU enters the VM's cgroup before it runs (the gate of process runners): the
        // teardown kills the cgroup, whatever QEMU left.
        let cgroup = self.cgroup(name).filter(|c| match c
            .create()
            .and_then(|()| c.limit_pids(super::cgroup::QEMU_PIDS))
        {
            Ok(()) => true,
            Err(e) => {
                tracing::warn!(vm = %name, error = %e, "cannot make the VM's cgroup; its QEMU is killed by pid only");
                false
            }
        });
        let mut argv = procgroup::gated(cgroup.as_ref().map(RunnerCgroup::procs));
        argv.extend(self.network_for(name, &dir).await?);
        argv.push(self.s.vm.qemu_path.clone().into_os_string());
        argv.extend(qemu_args(name, &shape, &files).into_iter().map(Into::into));
        let mut child = Command::new(&argv[0])
            .args(&argv[1..])
            // The agent's socket is named relative to it; QEMU leads its own group.
            .current_dir(&dir)
            .process_group(0)
            .env_clear()
            .env("PATH", "/usr/local/bin:/usr/bin:/bin")
            .stdin(Stdio::piped())
            .stdout(log)
            .stderr(err)
            .kill_on_drop(false)
            .spawn()
            .map_err(|e| spawn_error(&format!("cannot run {}", self.s.vm.qemu_path.display()), &e))?;
        procgroup::open_gate(child.stdin.take())
            .await
            .map_err(|e| host("let QEMU start", e))?;
        let pid = child.id();
        let alive = || pid.is_some_and(running);
        let started = std::time::Instant::now();
        let agent = match Agent::hello(&files.agent, self.s.vm.boot_timeout, alive, console).await {
            Ok(agent) => agent,
            // QEMU itself would not run (a bad option, a file it cannot open): the host's
            // failure, so the pool waits for its host check instead of booting VM after VM.
            Err(e) if !matches!(child.try_wait(), Ok(None)) => {
                let said = log_tail(&log_path);
                return Err(ProvisionError::HostUnavailable(format!(
                    "QEMU exited before its VM booted ({e}); it said: {said}"
                )));
            }
            Err(e) => return Err(e),
        };
        let took = started.elapsed();
        if let Some(h) = &self.s.boot_seconds {
            h.observe(took.as_secs_f64());
        }
        tracing::info!(vm = %name, pool = %self.s.pool, boot_ms = took.as_millis() as u64, "VM booted: its agent said hello");
        Ok((child, agent))
    }

    /// What the agent is handed: the pool's variables, the runner's start script, the JIT
    /// config.
    fn payload(&self, jit_config: &str) -> Vec<u8> {
        let mut env = self.s.env.clone();
        env.vars.push((
            "EPHEMER_RUNNER_COMMAND".into(),
            Secret::new(&self.s.vm.runner_command),
        ));
        let mut payload = super::tart::guest::stdin_payload(&env, jit_config);
        // The JIT config's line ends: ssh's pipe closes after it, the agent's port does not.
        payload.push(b'\n');
        payload
    }

    async fn boot_and_run(&self, spec: RunnerSpec) -> Result<RunningRunner, ProvisionError> {
        let (child, agent) = self.boot(&spec.name).await?;
        self.run(child, agent, spec).await
    }

    /// Hands `spec`'s runner to the waiting `agent` of a booted VM whose QEMU is `child`.
    async fn run(
        &self,
        mut child: tokio::process::Child,
        mut agent: Agent,
        spec: RunnerSpec,
    ) -> Result<RunningRunner, ProvisionError> {
        agent.start(&self.payload(spec.jit_config.expose())).await?;
        self.runs.borrow_mut().insert(spec.name.clone());
        tracing::info!(runner = %spec.name, pool = %self.s.pool, "runner started in its VM");
        let name = spec.name.clone();
        let ends = self.ends.clone();
        Ok(RunningRunner {
            exited: Box::pin(async move {
                let code = tokio::select! {
                    code = agent.exit() => code,
                    _ = child.wait() => None,
                };
                // The agent powers the VM off after the runner; a guest that does not is
                // stopped by the teardown that follows.
                let off = tokio::time::timeout(POWER_OFF_GRACE, child.wait()).await;
                let how = words::how_it_ended(code, off.is_ok(), POWER_OFF_GRACE);
                tracing::info!(vm = %name, "VM ended: {how}");
                ends.borrow_mut().insert(name, how);
                code
            }),
        })
    }

    /// Whether this QEMU has what the sandbox needs (`-sandbox`, `-run-with`), asked once.
    async fn sandbox_ready(&self) -> Result<(), ProvisionError> {
        if let Some(known) = self.sandbox.borrow().clone() {
            return known;
        }
        let help = crate::bounded::output(
            Command::new(&self.s.vm.qemu_path).arg("-help"),
            1 << 20,
        )
        .await
        .map_err(|e| spawn_error(&format!("cannot run {}", self.s.vm.qemu_path.display()), &e))?;
        let known = match sandbox::missing_from_help(&String::from_utf8_lossy(&help.stdout)) {
            None => Ok(()),
            Some(what) => Err(ProvisionError::HostUnavailable(format!(
                "{} lacks {what}: each VM's QEMU runs sandboxed as a uid of its own; install \
                 QEMU 9.1 or later (Debian bookworm: from bookworm-backports)",
                self.s.vm.qemu_path.display()
            ))),
        };
        *self.sandbox.borrow_mut() = Some(known.clone());
        known
    }

    /// Where VM `name`'s QEMU runs, as the start of its argv: with `network = "user"`, in a
    /// network namespace of its own ([`crate::netns`]: QEMU's user network then reaches
    /// nothing of the host, its 10.0.2.2 being the namespace's own loopback); with `"none"`,
    /// in an empty one.
    async fn network_for(&self, name: &str, dir: &Path) -> Result<Vec<std::ffi::OsString>, ProvisionError> {
        if crate::weaken::off("vm-network") {
            return Ok(Vec::new());
        }
        match self.s.vm.network {
            VmNetwork::None => Ok(["unshare", "--net", "--"].map(Into::into).to_vec()),
            VmNetwork::User => {
                let net = crate::netns::JobNet::create(name, dir, self.s.egress.clone(), self.upstreams.clone())
                    .await
                    .map_err(|e| match e {
                        crate::netns::NetError::Host(_) => ProvisionError::HostUnavailable(e.to_string()),
                        crate::netns::NetError::Failed(_) => ProvisionError::EnvironmentFailed(e.to_string()),
                    })?;
                // Read back by a teardown after a restart, which has no map.
                let _ = std::fs::write(dir.join(NETNS_FILE), net.slot().0.to_string());
                let argv = net.enter_argv();
                self.nets.insert(name, net);
                Ok(argv)
            }
        }
    }

    /// Removes VM `name`'s namespace: the one this run made, or the one its run directory
    /// names.
    async fn remove_network(&self, name: &str) {
        if !self.nets.remove(name).await {
            {
                let slot = std::fs::read_to_string(self.vm_dir(name).join(NETNS_FILE))
                    .ok()
                    .and_then(|s| s.trim().parse().ok())
                    .map(ephemer_decide::egress::Slot);
                if let Some(slot) = slot {
                    crate::netns::remove_slot(slot, &[]).await;
                }
            }
        }
    }

    /// Waits up to `grace` for VM `name`'s QEMU to end by itself.
    async fn await_power_off(&self, name: &str, grace: Duration) {
        let Some(pid) = self.qemu_pid(name) else { return };
        let until = tokio::time::Instant::now() + grace;
        while running(pid as u32) && tokio::time::Instant::now() < until {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The pid of VM `name`'s QEMU, if that pid is still its QEMU.
    fn qemu_pid(&self, name: &str) -> Option<i32> {
        let files = VmFiles::in_dir(&self.vm_dir(name));
        let qemu_name = std::fs::read_to_string(&files.name)
            .map(|n| n.trim().to_string())
            .unwrap_or_else(|_| name.to_string());
        std::fs::read_to_string(&files.pid)
            .ok()
            .and_then(|p| p.trim().parse::<i32>().ok())
            .filter(|pid| is_our_qemu(*pid, &qemu_name))
    }

    /// The cgroup of the VM QEMU runs as `qemu_name`.
    fn cgroup(&self, qemu_name: &str) -> Option<RunnerCgroup> {
        (*self.cgroups).as_ref().map(|c| c.runner(qemu_name))
    }

    /// Stops VM `name`'s QEMU (by its pid file, if that pid is still its QEMU, then by its
    /// cgroup) and waits for it to go.
    async fn kill(&self, name: &str) {
        // A warm VM handed to a runner keeps the name QEMU was started with.
        let files = VmFiles::in_dir(&self.vm_dir(name));
        let qemu_name = std::fs::read_to_string(&files.name)
            .map(|n| n.trim().to_string())
            .unwrap_or_else(|_| name.to_string());
        if let Some(pid) = self.qemu_pid(name) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
            let mut gone = false;
            for _ in 0..100 {
                if !running(pid as u32) {
                    gone = true;
                    break;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            if !gone {
                tracing::warn!(vm = %name, pid, "QEMU still runs 5 s after SIGKILL");
            }
        }
        if let Some(cgroup) = self.cgroup(&qemu_name) {
            cgroup.kill_and_remove().await;
        }
    }

    /// The run directories of this pool's VMs.
    fn vm_names(&self) -> Vec<String> {
        std::fs::read_dir(&self.s.run_dir)
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| e.file_name().into_string().ok())
            .filter(|n| n.starts_with(&self.s.name_prefix))
            .collect()
    }
}

/// What check-config says about a `linux_vm` pool's files on this host (`pool`'s keys): an
/// image, kernel or initrd someone else could change, an image chained to another file. One
/// not there yet is for `doctor` and the host check to find.
pub fn file_problems(pool: &str, vm: &LinuxVmConfig) -> Vec<(String, String)> {
    let mut out = Vec::new();
    if vm.image.exists()
        && let Err(e) = image::check(&vm.image)
    {
        out.push((format!("providers.{pool}.image"), e.to_string()));
    }
    let kernel = vm.kernel.clone().or_else(|| cloud_kernel(Path::new("/boot")));
    let initrd = vm
        .initrd
        .clone()
        .or_else(|| kernel.as_deref().and_then(initrd_beside));
    for (key, path) in [("kernel", kernel), ("initrd", initrd)] {
        if let Some(path) = path.filter(|p| p.exists())
            && let Err(e) = image::trusted(key, &path)
        {
            out.push((format!("providers.{pool}.{key}"), e.to_string()));
        }
    }
    out
}

/// The uid and gid VM `name`'s QEMU drops to ([`sandbox`]): one no process runs as and no
/// account has. None when the daemon is not root (QEMU then runs as the daemon's user).
fn vm_user(name: &str) -> Result<Option<(u32, u32)>, ProvisionError> {
    if !nix::unistd::geteuid().is_root() {
        return Ok(None);
    }
    let busy = |uid: u32| {
        !super::leftovers::processes_of(uid).is_empty()
            || nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(uid))
                .ok()
                .flatten()
                .is_some()
    };
    sandbox::vm_uid(name, busy).map(|uid| Some((uid, uid))).ok_or_else(|| {
        ProvisionError::HostUnavailable("no free uid for a VM's QEMU in its range".into())
    })
}

/// The last lines of a VM's log (QEMU's own words when it would not start), on one line.
fn log_tail(path: &Path) -> String {
    let text = crate::bounded::read_file(path, super::container::LOG_CAP * 2).unwrap_or_default();
    words::tail(&String::from_utf8_lossy(&text))
}

/// Whether process `pid` runs (and is not a zombie waiting to be reaped).
fn running(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| words::stat_runs(&stat))
}

/// Whether `pid` is VM `name`'s QEMU (a pid file can outlive its process, and pids are
/// reused): its command line names the VM.
fn is_our_qemu(pid: i32, name: &str) -> bool {
    std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| words::cmdline_is_vm(&c, name))
}

impl Backend for QemuBackend {
    fn kind(&self) -> ProviderKind {
        ProviderKind::LinuxVm
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
        // A warm VM's QEMU is a child of this backend: let go here, then killed by name.
        self.warm.borrow_mut().remove(&name);
        // A VM with a runner is torn down when its job completed, usually a moment before its
        // runner exits: the agent says EXIT and powers the guest off within a short grace.
        if self.runs.borrow_mut().remove(&name) {
            self.await_power_off(&name, EXIT_GRACE).await;
        }
        self.kill(&name).await;
        self.remove_network(&name).await;
        let dir = self.vm_dir(&name);
        if let Err(e) = self.left.remove(&name, &dir).await {
            tracing::warn!(vm = %name, dir = %dir.display(), error = %e, "cannot remove the VM's run directory");
        }
        self.left.retry_due().await;
    }

    async fn reap_leftovers(self, keep: Vec<String>) -> Vec<String> {
        let names: Vec<String> = self
            .vm_names()
            .into_iter()
            .filter(|n| !keep.contains(n))
            .collect();
        for name in &names {
            self.clone().stop(name.clone()).await;
        }
        // Namespaces whose owner is gone altogether (a daemon killed with its state).
        let orphans = crate::netns::reap_orphans().await;
        if orphans > 0 {
            tracing::info!(orphans, "removed job network namespaces whose owner is gone");
        }
        names
    }

    async fn warm_boot(self, name: String) -> Result<(), ProvisionError> {
        self.boot_warm(name).await
    }

    async fn warm_ready(self, name: String) -> Result<(), &'static str> {
        self.check_warm(&name)
    }

    async fn warm_start(
        self,
        warm: String,
        spec: RunnerSpec,
    ) -> Result<RunningRunner, ProvisionError> {
        self.start_warm(warm, spec).await
    }

    /// A VM is not re-attached: its agent's port and QEMU's exit belong to the daemon that
    /// started it. A restart reaps it, and the job's runner is claimed anew.
    async fn adopt(self, _name: String) -> Option<RunningRunner> {
        None
    }

    async fn probe(self) -> Result<(), ProvisionError> {
        check_executable(&self.s.vm.qemu_path, "the QEMU system emulator (qemu-system-x86)")?;
        self.sandbox_ready().await?;
        if self.s.vm.network == VmNetwork::User {
            crate::netns::ensure_host()
                .await
                .map_err(|e| ProvisionError::HostUnavailable(e.to_string()))?;
        }
        check_executable(&self.s.vm.qemu_img_path, "qemu-img (qemu-utils)")?;
        let (kernel, initrd) = self.boot_files()?;
        for (what, path) in [("kernel", Some(&kernel)), ("initrd", initrd.as_ref())] {
            if let Some(path) = path {
                std::fs::File::open(path).map_err(|e| {
                    ProvisionError::HostUnavailable(format!(
                        "cannot read the {what} {}: {e}",
                        path.display()
                    ))
                })?;
            }
        }
        image::check(&self.s.vm.image)?;
        if self.s.vm.accel == Accel::Kvm {
            image::kvm_works(&self.s.vm.qemu_path)
                .await
                .map_err(ProvisionError::HostUnavailable)?;
        }
        Ok(())
    }

    async fn doctor_checks(self) -> Vec<Finding> {
        let mut found = Vec::new();
        found.push(match self.sandbox_ready().await {
            Ok(()) => Finding::Ok(format!(
                "QEMU runs each VM in its seccomp sandbox{}",
                if nix::unistd::geteuid().is_root() {
                    ", dropped to a uid of its own"
                } else {
                    " (as the daemon's user: the daemon is not root)"
                }
            )),
            Err(e) => Finding::Fail(e.to_string()),
        });
        match self.boot_files() {
            Ok((kernel, initrd)) => found.push(Finding::Ok(format!(
                "kernel {}{}",
                kernel.display(),
                initrd.map_or(String::new(), |i| format!(", initrd {}", i.display()))
            ))),
            Err(e) => found.push(Finding::Fail(e.to_string())),
        }
        found.push(match image::check(&self.s.vm.image) {
            Ok(()) => Finding::Ok(format!("image {}", self.s.vm.image.display())),
            Err(e) => Finding::Fail(format!(
                "{e}: build one with contrib/linux-vm/build-image (docs/providers.md)"
            )),
        });
        found.push(match self.s.vm.accel {
            Accel::Kvm => match image::kvm_works(&self.s.vm.qemu_path).await {
                Ok(()) => Finding::Ok("/dev/kvm opens and makes a VM".into()),
                Err(e) => Finding::Fail(e),
            },
            Accel::Tcg => Finding::Warn(
                "accel = \"tcg\": software emulation, 10-50x slower than KVM (meant for tests)"
                    .into(),
            ),
        });
        found
    }

    fn end_words(&self, name: &str) -> Option<String> {
        self.ends.borrow_mut().remove(name)
    }

    fn left_behind(&self, name: &str) -> Option<String> {
        self.left.take_said(name)
    }

    fn egress_met(&self, name: &str) -> Option<ephemer_decide::egress::seen::Seen> {
        self.nets.take_met(name)
    }

    fn startup_warning(&self) -> Option<String> {
        (self.s.vm.accel == Accel::Tcg).then(|| {
            format!(
                "pool {}: accel = \"tcg\" emulates each VM in software, 10-50x slower than KVM",
                self.s.pool
            )
        })
    }
}
