//! What the process's environment supplies a config: secrets instead of the file (or systemd
//! credential files), the proxy, the daemon's user, the host's OS and user database.

use std::path::{Path, PathBuf};

use super::{HostOs, Secret};

/// Secret values the environment may supply instead of the file.
#[derive(Debug, Clone, Default)]
pub struct Environment {
    /// `GITHUB_TOKEN`
    pub github_token: Option<Secret>,
    /// `EPHEMER_WEBHOOK_SECRET`
    pub webhook_secret: Option<Secret>,
    /// `EPHEMER_APP_PRIVATE_KEY` (PEM text)
    pub app_private_key: Option<Secret>,
    /// The daemon runs as root: a process pool then needs `run_as` or `allow_root`.
    pub as_root: bool,
    /// The name of the user the daemon runs as: refused in `run_as` (a job as that user
    /// reaches the daemon's token and state) unless `allow_same_user`.
    pub daemon_user: Option<String>,
    /// `HTTPS_PROXY` (or `https_proxy`): the proxy when `github.proxy` is not set.
    pub https_proxy: Option<Secret>,
    /// `NO_PROXY` (or `no_proxy`).
    pub no_proxy: Option<String>,
    /// `EPHEMER_CLUSTER_URL`: `cluster.url` when the file leaves it out.
    pub cluster_url: Option<Secret>,
    /// The daemon's environment, which pools' `env` values reference as `${NAME}`.
    pub vars: std::collections::BTreeMap<String, Secret>,
    /// Where a `run_as` user's uid is looked up: a second uid-0 account is root under
    /// another name, and refused as root is.
    pub users: UserDb,
    /// The host's operating system: a pool of a kind it cannot run is refused
    /// (`providers.X.kind`). Linux unless read from this process.
    pub host_os: HostOs,
}

/// How the uids of users named in the config are found.
#[derive(Debug, Clone, Default)]
pub enum UserDb {
    /// These names only (tests): any other is unknown.
    #[default]
    Fixed,
    /// These names and uids (tests).
    Listed(std::collections::BTreeMap<String, u32>),
    /// This host's user database.
    Host,
}

impl Environment {
    /// The uid of user `name`, when it is known.
    pub fn uid_of(&self, name: &str) -> Option<u32> {
        match &self.users {
            UserDb::Fixed => None,
            UserDb::Listed(users) => users.get(name).copied(),
            UserDb::Host => nix::unistd::User::from_name(name)
                .ok()
                .flatten()
                .map(|u| u.uid.as_raw()),
        }
    }
}

impl Environment {
    /// Reads the three variables from this process; an empty variable counts as unset. A
    /// secret the environment lacks is read from the file of its name in
    /// `$CREDENTIALS_DIRECTORY` (systemd's `LoadCredential=GITHUB_TOKEN:/path`), trailing
    /// newline dropped.
    pub fn from_process() -> Self {
        let credentials = std::env::var_os("CREDENTIALS_DIRECTORY").map(PathBuf::from);
        let var = |name: &str| {
            std::env::var(name)
                .ok()
                .filter(|v| !v.is_empty())
                .or_else(|| credential(credentials.as_deref(), name))
                .map(Secret::new)
        };
        Environment {
            github_token: var("GITHUB_TOKEN"),
            webhook_secret: var("EPHEMER_WEBHOOK_SECRET"),
            app_private_key: var("EPHEMER_APP_PRIVATE_KEY"),
            as_root: nix::unistd::geteuid().is_root(),
            daemon_user: nix::unistd::User::from_uid(nix::unistd::geteuid())
                .ok()
                .flatten()
                .map(|u| u.name),
            https_proxy: var("HTTPS_PROXY").or_else(|| var("https_proxy")),
            cluster_url: var("EPHEMER_CLUSTER_URL"),
            no_proxy: std::env::var("NO_PROXY")
                .or_else(|_| std::env::var("no_proxy"))
                .ok()
                .filter(|v| !v.is_empty()),
            vars: std::env::vars_os()
                .filter_map(|(k, v)| {
                    Some((k.into_string().ok()?, Secret::new(v.into_string().ok()?)))
                })
                .collect(),
            users: UserDb::Host,
            host_os: HostOs::this(),
        }
    }
}

/// The credential file `name` in systemd's credentials directory, if there is one.
fn credential(dir: Option<&Path>, name: &str) -> Option<String> {
    let text = std::fs::read_to_string(dir?.join(name)).ok()?;
    let text = text.strip_suffix('\n').unwrap_or(&text);
    (!text.is_empty()).then(|| text.to_string())
}
