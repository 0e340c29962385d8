//! `[providers.NAME.egress]`: what a pool's jobs may reach past the fence every job has (the
//! host, the metadata services, the private ranges and other jobs are never reachable, whatever
//! the mode: docs/security.md, "The network").

use ephemer_decide::egress::allow::{AllowList, Mode, Net};

/// A pool's egress settings, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EgressConfig {
    /// `mode`: `open` (the default), `audit` or `allow-list`.
    pub mode: Mode,
    /// `allow` as written (the list is built again with a GHES target's host).
    pub entries: Vec<String>,
    /// `allow`, parsed, with the hosts a runner needs.
    pub allow: AllowList,
    /// `allow_private`: private IPv4 ranges the pool's jobs may reach (an internal registry).
    pub allow_private: Vec<Net>,
}

impl Default for EgressConfig {
    fn default() -> Self {
        EgressConfig {
            mode: Mode::Open,
            entries: Vec::new(),
            allow: AllowList::new(&[], None).unwrap_or_default(),
            allow_private: Vec::new(),
        }
    }
}

impl EgressConfig {
    /// The private ranges allowed, as `nft` writes them.
    pub fn private_ranges(&self) -> Vec<String> {
        self.allow_private.iter().map(Net::to_string).collect()
    }

    /// The list again with `ghes_host` (a GHES target's host) in place of github.com's hosts.
    pub fn for_ghes(&mut self, ghes_host: &str) {
        if let Ok(list) = AllowList::new(&self.entries, Some(ghes_host)) {
            self.allow = list;
        }
    }
}
