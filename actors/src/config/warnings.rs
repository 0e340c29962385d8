//! `Config::warnings`: what is valid but worth a second look (check-config prints these, serve
//! logs them, doctor lists them).

use super::{Config, defaults};

impl Config {
    /// What is valid but worth a second look: check-config prints these, serve logs them.
    pub fn warnings(&self) -> Vec<String> {
        let mut w = Vec::new();
        if let Some(addr) = self.admin.listen.tcp()
            && !addr.ip().is_loopback()
        {
            w.push(format!(
                "admin.listen {addr} is reachable from other hosts: every call needs the admin \
                 token there, but keep it on loopback or a unix: socket unless you need it"
            ));
        }
        if self.metrics.listen.is_none() && !self.webhook.listen.ip().is_loopback() {
            w.push(format!(
                "metrics.listen is not set, so /metrics is served on the webhook listener {}: \
                 whoever can send webhooks can read queued jobs' label sets, pool and target \
                 names and the version; set metrics.listen = \"127.0.0.1:9090\"",
                self.webhook.listen
            ));
        }
        if let Some(every) = self.runner.update.check_interval
            && every < defaults::RELEASE_CHECK_INTERVAL
            && self.runner.update.releases_url == defaults::RELEASES_URL
        {
            w.push(format!(
                "runner.release_check_interval {}: github.com answers 60 unauthenticated requests \
                 an hour per address, shared with everything else on this host; hourly is \
                 enough (GitHub allows 30 days to update)",
                humantime::format_duration(every)
            ));
        }
        let isolated = self
            .providers
            .enabled()
            .into_iter()
            .find(|p| p.process().is_some_and(|p| !p.run_as.is_empty()));
        if let (Some(pool), Some(addr)) = (isolated, self.admin.listen.tcp())
            && addr.ip().is_loopback()
        {
            w.push(format!(
                "admin.listen {addr}: reads are open on loopback, and providers.{}'s jobs run on \
                 this host as run_as users, so a job can list every job of every target; set \
                 admin.listen = \"unix:{}\" (a 0600 socket)",
                pool.name,
                self.state.dir.join("admin.sock").display()
            ));
        }
        w.extend(self.pool_warnings());
        w
    }

    /// What each pool's settings are worth a second look for.
    fn pool_warnings(&self) -> Vec<String> {
        let mut w = Vec::new();
        // One user, one job, host-wide: pools that list the same users take turns with them.
        let mut listed: std::collections::BTreeMap<&str, Vec<&str>> = Default::default();
        for pool in self.providers.enabled() {
            for user in pool
                .process()
                .map(|p| p.run_as.as_slice())
                .unwrap_or_default()
            {
                listed.entry(user).or_default().push(pool.name.as_str());
            }
        }
        for (user, pools) in listed.iter().filter(|(_, pools)| pools.len() > 1) {
            w.push(format!(
                "providers.{}.run_as: user {user} is also listed by {}; the daemon gives a \
                 user to one job at a time across all pools, so these pools take turns with it \
                 (list each pool its own users for their full max_concurrent)",
                pools[0],
                pools[1..]
                    .iter()
                    .map(|p| format!("providers.{p}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
        for pool in self.providers.enabled() {
            let key = format!("providers.{}", pool.name);
            if let Some(p) = pool.process()
                && !p.run_as.is_empty()
                && !nix::unistd::geteuid().is_root()
            {
                w.push(format!(
                    "{key}.run_as: the daemon is not root, so it cannot give job directories to \
                     the run_as users (that needs CAP_CHOWN) nor clear what their jobs leave; \
                     see docs/security.md"
                ));
            }
            if let Some(p) = pool.process()
                && p.run_as.len() == 1
                && pool.common.max_concurrent > 1
            {
                w.push(format!(
                    "{key}.run_as: the {} concurrent runners share the user {}, so a job can read \
                     a sibling's environment (its JIT config) and take its job; list one user \
                     per runner in run_as where that matters",
                    pool.common.max_concurrent, p.run_as[0]
                ));
            }
            if let Some(l) = pool.linux() {
                let dangerous: Vec<&str> = l
                    .limits
                    .cap_add
                    .iter()
                    .map(String::as_str)
                    .filter(|c| DANGEROUS_CAPS.contains(c))
                    .collect();
                if !dangerous.is_empty() {
                    w.push(format!(
                        "{key}.cap_add: {} lets every job out of its container (mounts, other \
                         processes, raw devices or the kernel); keep it for pools whose jobs \
                         you trust with the host",
                        dangerous.join(", ")
                    ));
                }
            }
            if let Some(l) = pool.linux()
                && l.mounts.docker_access
            {
                w.push(format!(
                    "{key}.docker_access: every job gets the engine's socket, and with it every \
                     other container on this host (and root on it with a rootful engine); a \
                     Docker-in-Docker sidecar or a rootless engine keeps jobs apart \
                     (docs/providers.md)"
                ));
            }
        }
        w
    }
}

/// Capabilities that let a container's process out of its container.
const DANGEROUS_CAPS: [&str; 8] = [
    "SYS_ADMIN",
    "SYS_PTRACE",
    "SYS_MODULE",
    "SYS_RAWIO",
    "DAC_READ_SEARCH",
    "NET_ADMIN",
    "SYS_BOOT",
    "MAC_ADMIN",
];
