//! Which pool kinds a host can run. A `linux` or `linux_vm` pool needs Linux itself (network
//! namespaces, cgroups, the engine's and QEMU's use of them); `vm_macos` and `native_macos`
//! are meant for a Mac, but run on Linux too (against stand-ins in this project's tests, and
//! a `native_macos` pool is a process pool there).

use crate::vocab::ProviderKind;

/// The operating system the daemon runs on, as far as pools care.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum HostOs {
    /// Linux: every kind.
    #[default]
    Linux,
    /// macOS: process pools and tart VMs.
    Macos,
    /// Anything else a Unix build reaches (a BSD): process pools only.
    Other,
}

impl HostOs {
    /// From `std::env::consts::OS`.
    pub fn named(os: &str) -> HostOs {
        match os {
            "linux" => HostOs::Linux,
            "macos" => HostOs::Macos,
            _ => HostOs::Other,
        }
    }

    /// This build's.
    pub fn this() -> HostOs {
        HostOs::named(std::env::consts::OS)
    }

    /// Why a pool of `kind` cannot run on this host, for check-config (`providers.X.kind`).
    pub fn refuses(self, kind: ProviderKind) -> Option<String> {
        let why = match (self, kind) {
            (HostOs::Linux, _)
            | (_, ProviderKind::Local | ProviderKind::NativeMacos)
            | (HostOs::Macos, ProviderKind::VmMacos) => return None,
            (_, ProviderKind::LinuxVm) => {
                "linux_vm pools need a Linux host: each VM's QEMU runs in a network namespace \
                 and a cgroup of its own, which only Linux has"
            }
            (_, ProviderKind::Linux) => {
                "linux pools need a Linux host: on a Mac the container engine runs in a VM of \
                 its own, whose mounts, network and limits the daemon cannot see to; run Linux \
                 jobs from a Linux host's pool"
            }
            (HostOs::Other, ProviderKind::VmMacos) => {
                "vm_macos pools need a Mac: tart drives Apple's Virtualization framework"
            }
        };
        Some(format!("{} ({} here)", why, self.name()))
    }

    fn name(self) -> &'static str {
        match self {
            HostOs::Linux => "linux",
            HostOs::Macos => "macos",
            HostOs::Other => std::env::consts::OS,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mac_runs_process_pools_and_tart_and_refuses_the_linux_kinds() {
        let mac = HostOs::named("macos");
        for ok in [
            ProviderKind::Local,
            ProviderKind::NativeMacos,
            ProviderKind::VmMacos,
        ] {
            assert_eq!(mac.refuses(ok), None, "{ok}");
        }
        let vm = mac.refuses(ProviderKind::LinuxVm).unwrap();
        assert!(vm.starts_with("linux_vm pools need a Linux host"), "{vm}");
        assert!(vm.ends_with("(macos here)"), "{vm}");
        let linux = mac.refuses(ProviderKind::Linux).unwrap();
        assert!(
            linux.starts_with("linux pools need a Linux host"),
            "{linux}"
        );
    }

    #[test]
    fn linux_runs_every_kind_and_a_bsd_only_process_pools() {
        for kind in ProviderKind::ALL {
            assert_eq!(HostOs::named("linux").refuses(kind), None, "{kind}");
        }
        let bsd = HostOs::named("freebsd");
        assert_eq!(bsd, HostOs::Other);
        assert_eq!(bsd.refuses(ProviderKind::Local), None);
        assert_eq!(bsd.refuses(ProviderKind::NativeMacos), None);
        for kind in [
            ProviderKind::Linux,
            ProviderKind::LinuxVm,
            ProviderKind::VmMacos,
        ] {
            assert!(bsd.refuses(kind).is_some(), "{kind}");
        }
    }

    #[test]
    fn this_build_knows_its_own_host() {
        let this = HostOs::this();
        if cfg!(target_os = "linux") {
            assert_eq!(this, HostOs::Linux);
        } else if cfg!(target_os = "macos") {
            assert_eq!(this, HostOs::Macos);
        }
    }
}
