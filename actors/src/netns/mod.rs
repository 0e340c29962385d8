//! A job's own network namespace, made and removed by the daemon (root, outside the job's
//! reach), with what [`ephemer_decide::egress`] decides: a veth pair to the host, the host's
//! fence (`nft` table `inet ephemer`), the namespace's DNS rule, and the daemon's DNS forwarder
//! bound at `127.0.0.1:53` inside it ([`dns`]).
//!
//! The tools are the host's own: `ip` (iproute2) and `nft` (nftables), run with a fixed
//! environment, never a shell; a process enters the namespace through `nsenter` (util-linux).
//! Each namespace is written down in `/run/ephemer-actors/netns/<slot>` with the directory that
//! owns it (a VM's run directory), so a start-up finds the ones whose owner is gone, whoever
//! made them, and removes them.

pub mod dns;
pub mod watch;

use std::{
    path::{Path, PathBuf},
    process::Stdio,
};

use ephemer_decide::egress::{self, Slot, allow::Mode, fence};
pub use watch::{Egress, Watch};
use tokio::process::Command;

/// Where each namespace's owner is written down.
const RECORDS: &str = "/run/ephemer-actors/netns";
/// Where iproute2 keeps named namespaces.
const NETNS_DIR: &str = "/run/netns";
/// What a tool's output is read up to.
const TOOL_OUTPUT: usize = 64 << 10;

/// Why a job's network could not be made.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NetError {
    /// The host cannot give jobs a namespace (not root, a tool missing, forwarding off).
    #[error("cannot give the job a network of its own: {0}")]
    Host(String),
    /// This one failed; the next may not.
    #[error("cannot make the job's network: {0}")]
    Failed(String),
}

/// A job's namespace, while it lives.
#[derive(Debug)]
pub struct JobNet {
    slot: Slot,
    watch: std::sync::Arc<Watch>,
    forwarder: Option<tokio::task::JoinHandle<()>>,
}

/// A namespace dropped without [`JobNet::remove`] (a panic, a shutdown cut short) stays for
/// the next start's reap, as a crash leaves it; its forwarder ends with it.
impl Drop for JobNet {
    fn drop(&mut self) {
        if let Some(f) = self.forwarder.take() {
            f.abort();
        }
    }
}

impl JobNet {
    /// Its slot.
    pub fn slot(&self) -> Slot {
        self.slot
    }

    /// The namespace's path, for `nsenter --net=`.
    pub fn path(&self) -> PathBuf {
        netns_path(self.slot)
    }

    /// The argv that runs a command inside it.
    pub fn enter_argv(&self) -> Vec<std::ffi::OsString> {
        let mut net = std::ffi::OsString::from("--net=");
        net.push(self.path());
        vec!["nsenter".into(), net, "--".into()]
    }

    /// Makes a namespace for the job whose directory is `owner` (named `name`), with its
    /// pool's `egress` (the private ranges it may reach, its allow-list or audit), its DNS
    /// answered through `upstreams`.
    pub async fn create(
        name: &str,
        owner: &Path,
        egress: Egress,
        upstreams: std::sync::Arc<Vec<std::net::SocketAddr>>,
    ) -> Result<JobNet, NetError> {
        ensure_host().await?;
        let slot = take_slot(name).await?;
        let mut net = JobNet {
            slot,
            watch: std::sync::Arc::new(Watch::new(slot, egress)),
            forwarder: None,
        };
        match net.fill(owner, upstreams).await {
            Ok(()) => Ok(net),
            Err(e) => {
                net.remove().await;
                Err(e)
            }
        }
    }

    async fn fill(
        &mut self,
        owner: &Path,
        upstreams: std::sync::Arc<Vec<std::net::SocketAddr>>,
    ) -> Result<(), NetError> {
        let failed = |e: String| NetError::Failed(e);
        record(self.slot, owner).map_err(|e| failed(format!("cannot write its record: {e}")))?;
        run("ip", &["-batch", "-"], Some(&egress::host_link_commands(self.slot)))
            .await
            .map_err(failed)?;
        let ns = self.slot.netns();
        run("ip", &["-n", &ns, "-batch", "-"], Some(&egress::ns_link_commands(self.slot)))
            .await
            .map_err(failed)?;
        let net = format!("--net={}", self.path().display());
        run("nsenter", &[&net, "--", "nft", "-f", "-"], Some(&egress::job_table()))
            .await
            .map_err(failed)?;
        let e = self.watch.egress();
        // A slot's allowances from before (a daemon that crashed, a namespace removed by
        // hand) go first: this job gets its own pool's, and no other's.
        forget_allowances(self.slot, &[]).await;
        let allow = egress::allow_commands(self.slot, &e.allow_private);
        if !allow.is_empty() {
            run("nft", &["-f", "-"], Some(&allow)).await.map_err(failed)?;
        }
        if e.mode != Mode::Open {
            // A crashed daemon's chain and sets of this slot (its pins with them) go first.
            let pins = format!("pins_{}", self.slot.0);
            let left = ["list", "set", "inet", egress::HOST_TABLE, pins.as_str()];
            if run("nft", &left, None).await.is_ok() {
                forget_fence(self.slot).await;
            }
            let chain = fence::job_commands(self.slot, e.mode, e.allow.nets());
            run("nft", &["-f", "-"], Some(&chain)).await.map_err(failed)?;
        }
        let sockets = dns::bind_in(&self.path())
            .await
            .map_err(|e| failed(format!("cannot bind its DNS forwarder: {e}")))?;
        self.forwarder = Some(actix_rt::spawn(dns::serve(
            sockets,
            upstreams,
            self.watch.clone(),
        )));
        Ok(())
    }

    /// What the job's egress met (its refused addresses are read by [`JobNet::remove`]).
    pub fn seen(&self) -> ephemer_decide::egress::seen::Seen {
        self.watch.seen()
    }

    /// Removes the namespace (its veth pair goes with it), its allowances, its chain and sets
    /// (the addresses it was refused read first) and its record.
    pub async fn remove(&mut self) {
        if let Some(f) = self.forwarder.take() {
            f.abort();
        }
        let e = self.watch.egress();
        if e.mode != Mode::Open {
            self.watch.read_refused().await;
            forget_fence(self.slot).await;
        }
        remove_slot(self.slot, &e.allow_private).await;
    }
}

/// Takes slot `slot`'s chain and sets away, whichever of them are there.
pub async fn forget_fence(slot: Slot) {
    let lines = fence::forget_job_commands(slot);
    if run("nft", &["-f", "-"], Some(&lines.join("\n"))).await.is_ok() {
        return;
    }
    for line in &lines {
        let _ = run("nft", &["-f", "-"], Some(line)).await;
    }
}

/// The namespaces a backend's runners live in, by runner name, and what each one's egress met
/// once it is gone (taken once, for its job's timeline).
#[derive(Debug, Clone, Default)]
pub struct Nets {
    live: std::rc::Rc<std::cell::RefCell<std::collections::BTreeMap<String, JobNet>>>,
    met: std::rc::Rc<std::cell::RefCell<std::collections::BTreeMap<String, ephemer_decide::egress::seen::Seen>>>,
}

impl Nets {
    /// Runner `name`'s namespace, while it lives.
    pub fn insert(&self, name: &str, net: JobNet) {
        self.live.borrow_mut().insert(name.to_string(), net);
    }

    /// The namespace of warm environment `from` is runner `to`'s now.
    pub fn rename(&self, from: &str, to: &str) {
        let mut live = self.live.borrow_mut();
        if let Some(net) = live.remove(from) {
            live.insert(to.to_string(), net);
        }
    }

    /// Removes runner `name`'s namespace, if this run made it; whether it did.
    pub async fn remove(&self, name: &str) -> bool {
        let held = self.live.borrow_mut().remove(name);
        let Some(mut net) = held else {
            return false;
        };
        net.remove().await;
        let seen = net.seen();
        if !seen.is_empty() {
            self.met.borrow_mut().insert(name.to_string(), seen);
        }
        true
    }

    /// What runner `name`'s egress met, once its namespace is gone (taken: asked once).
    pub fn take_met(&self, name: &str) -> Option<ephemer_decide::egress::seen::Seen> {
        self.met.borrow_mut().remove(name)
    }
}

/// Removes slot `slot`'s namespace and what goes with it, whoever made it: every allowance
/// the host's set holds for it, not only `allow_private` (a reaped slot's are not known).
pub async fn remove_slot(slot: Slot, allow_private: &[String]) {
    forget_allowances(slot, allow_private).await;
    if let Err(e) = run("ip", &["netns", "delete", &slot.netns()], None).await
        && netns_path(slot).exists()
    {
        tracing::warn!(netns = %slot.netns(), error = %e, "cannot remove a job's network namespace");
        return;
    }
    let _ = std::fs::remove_file(Path::new(RECORDS).join(slot.0.to_string()));
}

/// Takes every allowance of slot `slot` out of the host's set: those the set holds (read back),
/// else `known` when it cannot be read.
async fn forget_allowances(slot: Slot, known: &[String]) {
    let held = match run("nft", &egress::LIST_ALLOWED_ARGS, None).await {
        Ok(json) => egress::allowances_in(&json, slot),
        Err(_) => known.to_vec(),
    };
    let forget = egress::forget_commands(slot, &held);
    if !forget.is_empty()
        && let Err(e) = run("nft", &["-f", "-"], Some(&forget)).await
    {
        tracing::warn!(netns = %slot.netns(), error = %e, "cannot take a job slot's private-range allowances away");
    }
}

/// Removes every job namespace whose owner (as its record says) is gone: a daemon killed with
/// its state directory, a test's. Returns how many went.
pub async fn reap_orphans() -> usize {
    let mut removed = 0;
    for entry in std::fs::read_dir(RECORDS).into_iter().flatten().flatten() {
        let Some(slot) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse().ok())
            .map(Slot)
        else {
            continue;
        };
        let owner = crate::bounded::read_file(entry.path(), 4096).unwrap_or_default();
        let owner = PathBuf::from(String::from_utf8_lossy(&owner).trim());
        if owner.as_os_str().is_empty() || !owner.exists() {
            forget_fence(slot).await;
            remove_slot(slot, &[]).await;
            removed += 1;
        }
    }
    removed
}

fn netns_path(slot: Slot) -> PathBuf {
    Path::new(NETNS_DIR).join(slot.netns())
}

fn record(slot: Slot, owner: &Path) -> std::io::Result<()> {
    crate::harden::private_dir(Path::new(RECORDS))?;
    let mut f = crate::harden::private_file(&Path::new(RECORDS).join(slot.0.to_string()), false)?;
    std::io::Write::write_all(&mut f, owner.as_os_str().as_encoded_bytes())
}

/// Takes a free slot host-wide: the first whose namespace this call made.
async fn take_slot(name: &str) -> Result<Slot, NetError> {
    for slot in Slot::candidates(name).take(4096) {
        if netns_path(slot).exists() {
            continue;
        }
        match run("ip", &["netns", "add", &slot.netns()], None).await {
            Ok(_) => return Ok(slot),
            Err(e) if e.contains("File exists") => continue,
            Err(e) => return Err(NetError::Host(e)),
        }
    }
    Err(NetError::Failed("no free slot for a job's namespace".into()))
}

/// The host's part, once per process: IPv4 forwarding on, the fence in place.
pub async fn ensure_host() -> Result<(), NetError> {
    static DONE: tokio::sync::OnceCell<Result<(), NetError>> = tokio::sync::OnceCell::const_new();
    DONE.get_or_init(|| async {
        if !nix::unistd::geteuid().is_root() {
            return Err(NetError::Host(
                "the daemon is not root: a job's network namespace, its veth pair and its \
                 nftables fence need root"
                    .into(),
            ));
        }
        forwarding_on()?;
        run("nft", &["-f", "-"], Some(&egress::host_table()))
            .await
            .map_err(NetError::Host)?;
        Ok(())
    })
    .await
    .clone()
}

/// IPv4 forwarding, which a job's traffic to the outside needs: turned on if it is off and
/// this process may (as Docker, Podman and libvirt do); else what to do.
fn forwarding_on() -> Result<(), NetError> {
    const KNOB: &str = "/proc/sys/net/ipv4/ip_forward";
    let on = std::fs::read_to_string(KNOB).is_ok_and(|v| v.trim() == "1");
    if on {
        return Ok(());
    }
    std::fs::write(KNOB, "1").map_err(|e| {
        NetError::Host(format!(
            "IPv4 forwarding is off and cannot be turned on here ({e}): jobs reach the outside \
             through the host; set net.ipv4.ip_forward = 1 (the Debian package ships \
             /usr/share/doc/ephemer-actors/examples/60-ephemer-actors-sysctl.conf: copy it to \
             /etc/sysctl.d/ and run sysctl --system)"
        ))
    })?;
    tracing::info!("turned IPv4 forwarding on: each job's network reaches the outside through the host");
    Ok(())
}

/// Runs tool `program` with `args` (and `stdin`), its output bounded; its stderr when it fails.
pub(crate) async fn run(program: &str, args: &[&str], stdin: Option<&str>) -> Result<String, String> {
    let mut cmd = Command::new(program);
    cmd.args(args)
        .env_clear()
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let mut child = cmd
        .spawn()
        .map_err(|e| format!("cannot run {program} (is it installed?): {e}"))?;
    if let (Some(text), Some(mut pipe)) = (stdin, child.stdin.take()) {
        use tokio::io::AsyncWriteExt;
        pipe.write_all(text.as_bytes())
            .await
            .map_err(|e| format!("{program}: {e}"))?;
    }
    let (out, err) = (child.stdout.take(), child.stderr.take());
    let (out, err, status) = tokio::join!(
        read_some(out),
        read_some(err),
        child.wait()
    );
    let status = status.map_err(|e| format!("{program}: {e}"))?;
    if status.success() {
        Ok(out)
    } else {
        Err(format!("{program} {}: {}", args.join(" "), err.trim()))
    }
}

async fn read_some(pipe: Option<impl tokio::io::AsyncRead + Unpin>) -> String {
    let head = crate::bounded::keep_head(pipe, TOOL_OUTPUT)
        .await
        .unwrap_or_default();
    String::from_utf8_lossy(&head).into_owned()
}

/// The host's name servers, for the forwarders (from `/etc/resolv.conf`).
pub fn host_upstreams() -> Vec<std::net::SocketAddr> {
    let text = crate::bounded::read_file("/etc/resolv.conf", 64 << 10).unwrap_or_default();
    egress::nameservers(&String::from_utf8_lossy(&text))
        .into_iter()
        .map(|ip| std::net::SocketAddr::new(ip, 53))
        .collect()
}
