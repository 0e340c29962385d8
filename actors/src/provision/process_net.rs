//! A process runner's network on Linux: a namespace of its own per runner ([`crate::netns`]),
//! made before the runner starts and entered by it (`nsenter --net`, run by the daemon's gate
//! as root, before `sudo` drops to the `run_as` user), with its pool's egress and a relay to
//! a GitHub this host serves on its loopback. Removed at teardown, after the process group;
//! served again after a restart for a runner that outlived the daemon.
//!
//! A daemon that is not root cannot make one: an `open` pool's runners then share the host's
//! network (said once, loudly: docs/security.md); an `audit` or `allow-list` pool's are not
//! started, since nothing would enforce the list.

use std::path::PathBuf;

use ephemer_decide::egress::{Slot, allow::Mode};

use super::{ProvisionError, process::ProcessBackend};
use crate::netns::{JobNet, NetError};

impl ProcessBackend {
    /// Where runner `name`'s slot is written down (read by a teardown after a restart), beside
    /// its pid file.
    fn net_record(&self, name: &str) -> PathBuf {
        self.s.work_root.join(".run").join(format!("{name}.net"))
    }

    /// The namespace runner `name` (whose directory is `dir`, whose JIT config is `jit`) runs
    /// in, or `None` where it shares the host's network.
    pub(super) async fn job_net(
        &self,
        name: &str,
        dir: &std::path::Path,
        jit: &str,
    ) -> Result<Option<JobNet>, ProvisionError> {
        if !cfg!(target_os = "linux") || crate::weaken::off("job-network") {
            return Ok(None);
        }
        if !nix::unistd::geteuid().is_root() {
            if self.s.egress.mode != Mode::Open {
                return Err(ProvisionError::HostUnavailable(format!(
                    "pool {}'s egress mode \"{}\" needs a network namespace per job, which only a \
                     daemon running as root can make",
                    self.s.pool,
                    self.s.egress.mode.as_str()
                )));
            }
            if !self.said_shared_net.replace(true) {
                tracing::warn!(pool = self.s.pool.as_str(), "the daemon is not root: this pool's jobs share the host's network (its loopback services, the metadata address); run it as root for a namespace per job (docs/security.md)");
            }
            return Ok(None);
        }
        let mut net = JobNet::create(name, dir, self.s.egress.clone(), self.upstreams.clone())
            .await
            .map_err(net_error)?;
        for to in relayed(&self.s.github_loopback, jit) {
            if let Err(e) = net.relay(to).await {
                net.remove().await;
                return Err(net_error(e));
            }
        }
        let record = self.net_record(name);
        let written = std::fs::write(&record, net.slot().0.to_string());
        if let Err(e) = written {
            net.remove().await;
            return Err(ProvisionError::HostUnavailable(format!(
                "cannot write down the runner's network namespace: {e}"
            )));
        }
        Ok(Some(net))
    }

    /// Removes runner `name`'s namespace: the one this run made, or the one its record names.
    pub(super) async fn drop_net(&self, name: &str) {
        let record = self.net_record(name);
        if !self.nets.remove(name).await
            && let Some(slot) = read_slot(&record)
        {
            crate::netns::forget_fence(slot).await;
            crate::netns::remove_slot(slot, &self.s.egress.allow_private).await;
        }
        let _ = std::fs::remove_file(&record);
    }

    /// Serves again the namespace of runner `name`, adopted from before a restart.
    pub(super) async fn reattach_net(&self, name: &str) {
        let Some(slot) = read_slot(&self.net_record(name)) else {
            return;
        };
        match JobNet::reattach(slot, self.s.egress.clone(), self.upstreams.clone()).await {
            Ok(mut net) => {
                for to in &self.s.github_loopback {
                    if let Err(e) = net.relay(*to).await {
                        tracing::warn!(runner = %name, error = %e, "cannot relay the adopted runner's GitHub again");
                    }
                }
                self.nets.insert(name, net);
            }
            Err(e) => {
                tracing::warn!(runner = %name, error = %e, "cannot serve the adopted runner's network again: its lookups go unanswered until it ends");
            }
        }
    }
}

/// What a runner is told to reach on this host's loopback: the pool's (its GitHub's API, its
/// proxy) and the URLs its JIT config names (its GitHub as the runner sees it), once each.
fn relayed(pool: &[std::net::SocketAddr], jit: &str) -> Vec<std::net::SocketAddr> {
    let mut all = pool.to_vec();
    for url in ephemer_decide::release::runner_urls(jit) {
        if let Some(at) = ephemer_decide::egress::loopback_endpoint(&url)
            && !all.contains(&at)
        {
            all.push(at);
        }
    }
    all
}

fn read_slot(record: &std::path::Path) -> Option<Slot> {
    let text = crate::bounded::read_file(record, 64).ok()?;
    String::from_utf8_lossy(&text).trim().parse().ok().map(Slot)
}

fn net_error(e: NetError) -> ProvisionError {
    match e {
        NetError::Host(_) => ProvisionError::HostUnavailable(e.to_string()),
        NetError::Failed(_) => ProvisionError::EnvironmentFailed(e.to_string()),
    }
}

/// `doctor`'s word on the pool's network: a namespace per job, or why not (a failure where the
/// pool's egress needs one, a warning where its jobs would share the host's network).
pub(super) async fn net_finding(mode: Mode) -> super::Finding {
    use super::Finding;
    if !nix::unistd::geteuid().is_root() {
        let why = "the daemon is not root: no namespace per job";
        return match mode {
            Mode::Open => Finding::Warn(format!(
                "{why}; this pool's jobs share the host's network (its loopback services, the \
                 metadata address): run the daemon as root (docs/security.md, \"The network\")"
            )),
            _ => Finding::Fail(format!(
                "{why}, and egress mode \"{}\" needs one",
                mode.as_str()
            )),
        };
    }
    match crate::netns::host_check().await {
        Ok(ok) => Finding::Ok(format!("{ok}; egress \"{}\"", mode.as_str())),
        Err(e) => Finding::Fail(e),
    }
}
