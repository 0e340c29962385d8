//! `doctor`'s checks for a Mac: what this host runs (and how a runner's processes are reached
//! without cgroups), each tart pool's tart and its version, the host's macOS guests against
//! Apple's two, and tart as root. The decisions are plain functions of what was found, tested
//! on any host; only [`checks`] asks the OS.

use std::{path::PathBuf, time::Duration};

use ephemer_actors_core::config::{Config, HostOs, PoolSpec, defaults};

use super::Check;

/// What the Mac checks are made from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Found {
    /// The host's OS.
    pub host: HostOs,
    /// The daemon runs as root.
    pub as_root: bool,
    /// Each enabled tart pool: its name, `max_concurrent` and what `tart --version` said
    /// (`None`: it did not run).
    pub tart_pools: Vec<(String, usize, Option<String>)>,
}

/// The checks of `found`.
pub fn judge(found: &Found) -> Vec<Check> {
    let mut out = Vec::new();
    if found.host == HostOs::Macos {
        out.push(Check::ok(
            "host.macos",
            "macOS: process pools and tart VMs run here (linux and linux_vm pools need a Linux \
             host); no cgroups, so teardown reaches a runner's processes by its process group \
             and, for a run_as user, by every process of that user",
        ));
    }
    if found.tart_pools.is_empty() {
        return out;
    }
    if found.host != HostOs::Macos {
        out.push(Check::warn(
            "host.macos",
            "vm_macos pools are meant for a Mac: tart drives Apple's Virtualization framework, \
             which exists only on macOS (here a tart stand-in answers)",
            "run vm_macos pools on a Mac (docs/macos.md)",
        ));
    }
    for (pool, _, version) in &found.tart_pools {
        let name = format!("pool.{pool}.tart");
        out.push(match version {
            Some(v) => Check::ok(&name, format!("tart {v}")),
            None => Check::fail(
                &name,
                "tart --version did not answer",
                "install tart (brew install cirruslabs/cli/tart) or set tart_path",
            ),
        });
    }
    let guests: usize = found.tart_pools.iter().map(|(_, n, _)| n).sum();
    out.push(Check::ok(
        "host.macos_guests",
        format!(
            "{guests} of {} macOS guests at once over the vm_macos pools: Apple's macOS licence \
             allows up to two macOS VMs beside the host's own system, on Apple hardware, and \
             Virtualization.framework refuses a third",
            defaults::MACOS_MAX_VMS
        ),
    ));
    if found.as_root && found.host == HostOs::Macos {
        out.push(Check::warn(
            "host.tart_user",
            "the daemon runs as root, so tart does: macOS 15 guests fail to start as root \
             (\"The virtual machine failed to start\", cirruslabs/tart#921), and tart keeps root's \
             VMs in /var/root/.tart",
            "run the daemon as the user that owns the VMs (UserName in the launchd plist, \
             docs/macos.md); native_macos pools with run_as then go to a daemon of their own",
        ));
    }
    out
}

/// What this host has, asked of the OS, then judged.
pub async fn checks(config: &Config) -> Vec<Check> {
    let mut tart_pools = Vec::new();
    for pool in config.providers.enabled() {
        if let PoolSpec::VmMacos(v) = &pool.spec {
            let version = tart_version(v.tart_path.clone()).await;
            tart_pools.push((pool.name.to_string(), pool.common.max_concurrent, version));
        }
    }
    judge(&Found {
        host: HostOs::this(),
        as_root: nix::unistd::geteuid().is_root(),
        tart_pools,
    })
}

/// `tart --version`'s first line, within 10 s and 4 KiB.
async fn tart_version(tart: PathBuf) -> Option<String> {
    let mut command = tokio::process::Command::new(tart);
    command
        .arg("--version")
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true);
    let out = tokio::time::timeout(
        Duration::from_secs(10),
        ephemer_actors_core::bounded::output(&mut command, 4096),
    )
    .await
    .ok()?
    .ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text.lines().next()?.trim();
    (out.status.success() && !line.is_empty()).then(|| line.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::doctor::Level;

    fn found(host: HostOs, as_root: bool, pools: &[(&str, usize, Option<&str>)]) -> Found {
        Found {
            host,
            as_root,
            tart_pools: pools
                .iter()
                .map(|(n, m, v)| (n.to_string(), *m, v.map(str::to_string)))
                .collect(),
        }
    }

    fn line<'a>(checks: &'a [Check], name: &str) -> &'a Check {
        checks
            .iter()
            .find(|c| c.name == name)
            .unwrap_or_else(|| panic!("no {name} in {checks:?}"))
    }

    #[test]
    fn a_mac_with_tart_pools_says_each_version_and_counts_guests() {
        let checks = judge(&found(
            HostOs::Macos,
            false,
            &[("xcode15", 1, Some("2.22.4")), ("xcode16", 1, None)],
        ));
        assert_eq!(line(&checks, "host.macos").status, Level::Ok);
        assert_eq!(line(&checks, "pool.xcode15.tart").detail, "tart 2.22.4");
        assert_eq!(line(&checks, "pool.xcode16.tart").status, Level::Fail);
        assert!(
            line(&checks, "host.macos_guests")
                .detail
                .starts_with("2 of 2 macOS guests")
        );
        assert!(!checks.iter().any(|c| c.name == "host.tart_user"));
    }

    #[test]
    fn tart_as_root_on_a_mac_is_warned_about() {
        let checks = judge(&found(HostOs::Macos, true, &[("xcode", 2, Some("2.22.4"))]));
        let root = line(&checks, "host.tart_user");
        assert_eq!(root.status, Level::Warn);
        assert!(root.detail.contains("tart#921"), "{}", root.detail);
        // No tart pool: nothing about tart at all.
        let checks = judge(&found(HostOs::Macos, true, &[]));
        assert_eq!(checks.len(), 1, "{checks:?}");
    }

    #[test]
    fn a_tart_pool_off_a_mac_is_warned_and_linux_alone_says_nothing() {
        let checks = judge(&found(
            HostOs::Linux,
            true,
            &[("xcode", 1, Some("stand-in"))],
        ));
        assert_eq!(line(&checks, "host.macos").status, Level::Warn);
        assert!(!checks.iter().any(|c| c.name == "host.tart_user"));
        assert!(judge(&found(HostOs::Linux, true, &[])).is_empty());
    }
}
