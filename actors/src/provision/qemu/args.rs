//! QEMU's command line for one job's VM, and the default kernel: plain functions of the
//! settings and the job's paths. Nothing secret is ever on it (every user of the host can read
//! a process's argv): the JIT config reaches the guest over the agent's port.

use std::path::{Path, PathBuf};

use crate::config::linux_vm::{Accel, VmNetwork};

/// What one VM is made of, as QEMU is told.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct VmShape<'a> {
    pub(super) accel: Accel,
    pub(super) cpus: u32,
    /// Guest memory, bytes.
    pub(super) memory: u64,
    pub(super) kernel: &'a Path,
    pub(super) initrd: Option<&'a Path>,
    pub(super) network: VmNetwork,
    /// Under TCG, the host's TSC rate in kHz: the guest reads the host's TSC, but cannot time
    /// it against a PIT that software emulation makes late, and hangs trying
    /// (`tsc_early_khz` and a preset delay loop spare it that).
    pub(super) tsc_khz: Option<u64>,
    /// The uid and gid QEMU drops to once its files are open (when the daemon is root).
    pub(super) user: Option<(u32, u32)>,
}

/// The job's own files, all under its run directory.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct VmFiles {
    /// The copy-on-write disk over the image.
    pub(super) overlay: PathBuf,
    /// The guest's serial console, which is also the agent's port: a unix socket QEMU
    /// listens on and the daemon alone connects to. QEMU is given it relative to its working
    /// directory (the run directory) and the daemon reaches it through the directory's
    /// descriptor, so a long `state.dir` never passes a socket path's 108 bytes.
    pub(super) agent: PathBuf,
    /// QEMU's pid, for a teardown by name and the sweep of leftovers.
    pub(super) pid: PathBuf,
    /// The name QEMU was started with (`-name`): a warm VM's, after it became a runner's.
    pub(super) name: PathBuf,
}

impl VmFiles {
    /// The files of the VM whose run directory is `dir`.
    pub(super) fn in_dir(dir: &Path) -> VmFiles {
        VmFiles {
            overlay: dir.join("disk.qcow2"),
            agent: dir.join(AGENT_SOCKET),
            pid: dir.join("qemu.pid"),
            name: dir.join("qemu.name"),
        }
    }
}

/// The kernel's command line: the root is the overlay, the console the serial port (the
/// `microvm` machine has one), the agent is the init, and a panic ends the VM (QEMU exits with
/// `-no-reboot`).
const APPEND: &str = "console=ttyS0 root=/dev/vda rw panic=-1 init=/sbin/ephemer-agent quiet";

/// QEMU's arguments for a VM of `shape` over `files`, named `name` (so `ps` and the sweep
/// tell it apart).
pub(super) fn qemu_args(name: &str, shape: &VmShape<'_>, files: &VmFiles) -> Vec<String> {
    let mut a: Vec<String> = Vec::new();
    let mut push = |items: &[&str]| a.extend(items.iter().map(|s| s.to_string()));
    let cpu = match shape.accel {
        Accel::Kvm => "host",
        Accel::Tcg => "max",
    };
    push(&["-name", &format!("{name},process={name}")]);
    push(&[
        "-machine",
        &format!("microvm,accel={}", shape.accel.as_str()),
    ]);
    push(&["-cpu", cpu, "-smp", &shape.cpus.to_string()]);
    push(&["-m", &format!("{}M", shape.memory >> 20)]);
    push(&["-nodefaults", "-no-user-config", "-nographic", "-no-reboot"]);
    push(&["-kernel", &shape.kernel.display().to_string()]);
    if let Some(initrd) = shape.initrd {
        push(&["-initrd", &initrd.display().to_string()]);
    }
    let append = match (shape.accel, shape.tsc_khz) {
        // Loops per jiffy at HZ=250 on a TSC-timed delay.
        (Accel::Tcg, Some(khz)) => format!("{APPEND} tsc_early_khz={khz} lpj={}", khz * 4),
        _ => APPEND.to_string(),
    };
    push(&["-append", &append]);
    // ttyS0: the console and the agent's port, a socket the daemon connects to (it keeps
    // the guest's lines in the VM's log).
    push(&[
        "-chardev",
        &format!("socket,id=agent,path={AGENT_SOCKET},server=on,wait=off"),
        "-serial",
        "chardev:agent",
    ]);
    push(&[
        "-drive",
        &format!(
            "id=root,file={},format=qcow2,if=none,discard=unmap",
            files.overlay.display()
        ),
        "-device",
        "virtio-blk-device,drive=root",
    ]);
    match shape.network {
        VmNetwork::User => push(&[
            "-netdev",
            "user,id=net0",
            "-device",
            "virtio-net-device,netdev=net0",
        ]),
        VmNetwork::None => {}
    }
    push(&["-pidfile", &files.pid.display().to_string()]);
    a.extend(super::sandbox::args(shape.user));
    a
}

/// The agent's socket, as QEMU is told it (relative to its working directory, the VM's run
/// directory).
pub(super) const AGENT_SOCKET: &str = "agent.sock";

/// The host's TSC rate in kHz, as `/proc/cpuinfo` says it (`cpu MHz` of the first CPU).
pub(super) fn host_tsc_khz(cpuinfo: &str) -> Option<u64> {
    let mhz: f64 = cpuinfo
        .lines()
        .find(|l| l.starts_with("cpu MHz"))?
        .split(':')
        .nth(1)?
        .trim()
        .parse()
        .ok()?;
    (mhz >= 1.0).then_some((mhz * 1000.0) as u64)
}

/// The host's Debian cloud kernel: the newest `vmlinuz-*-cloud-<arch>` in `boot`.
pub(super) fn cloud_kernel(boot: &Path) -> Option<PathBuf> {
    let arch = if cfg!(target_arch = "aarch64") {
        "arm64"
    } else {
        "amd64"
    };
    let suffix = format!("-cloud-{arch}");
    let mut found: Vec<(Vec<u64>, PathBuf)> = std::fs::read_dir(boot)
        .ok()?
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            let version = name.strip_prefix("vmlinuz-")?.strip_suffix(&suffix)?;
            Some((version_key(version), e.path()))
        })
        .collect();
    found.sort();
    found.pop().map(|(_, path)| path)
}

/// The initramfs beside `kernel`: `initrd.img-<version>` for `vmlinuz-<version>`.
pub(super) fn initrd_beside(kernel: &Path) -> Option<PathBuf> {
    let name = kernel.file_name()?.to_str()?;
    let version = name.strip_prefix("vmlinuz-")?;
    let initrd = kernel.with_file_name(format!("initrd.img-{version}"));
    initrd.is_file().then_some(initrd)
}

/// `6.1.0-57` as numbers, so `6.1.0-57` sorts after `6.1.0-9`.
fn version_key(version: &str) -> Vec<u64> {
    version
        .split(|c: char| !c.is_ascii_digit())
        .filter_map(|n| n.parse().ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape<'a>(kernel: &'a Path, network: VmNetwork) -> VmShape<'a> {
        VmShape {
            accel: Accel::Kvm,
            cpus: 2,
            memory: 4 << 30,
            kernel,
            initrd: None,
            network,
            tsc_khz: Some(2_445_404),
            user: Some((1_900_000_001, 1_900_000_001)),
        }
    }

    #[test]
    fn the_command_line_boots_the_overlay_with_the_agent_on_the_console() {
        let files = VmFiles::in_dir(Path::new("/run/e/vm-1"));
        let kernel = PathBuf::from("/boot/vmlinuz-6.1.0-57-cloud-amd64");
        let a = qemu_args("vm-1", &shape(&kernel, VmNetwork::User), &files).join(" ");
        assert!(a.contains("-machine microvm,accel=kvm"), "{a}");
        assert!(a.contains("-cpu host -smp 2 -m 4096M"), "{a}");
        assert!(a.contains("-kernel /boot/vmlinuz-6.1.0-57-cloud-amd64"), "{a}");
        assert!(!a.contains("-initrd"), "{a}");
        assert!(a.contains("file=/run/e/vm-1/disk.qcow2,format=qcow2"), "{a}");
        assert!(a.contains("-serial chardev:agent"), "{a}");
        assert!(a.contains("path=agent.sock,server=on,wait=off"), "{a}");
        assert!(a.contains("-sandbox on,obsolete=deny,spawn=deny,resourcecontrol=deny"), "{a}");
        assert!(a.contains("-run-with user=1900000001:1900000001"), "{a}");
        assert!(a.contains("virtio-net-device"), "{a}");
        assert!(a.contains("-pidfile /run/e/vm-1/qemu.pid"), "{a}");
        assert!(a.contains("-no-reboot"), "a guest that stops ends QEMU: {a}");
        assert!(!a.contains("tsc_early_khz"), "KVM times its TSC itself: {a}");
    }

    #[test]
    fn tcg_no_network_and_an_initrd_are_said_when_set() {
        let files = VmFiles::in_dir(Path::new("/r"));
        let kernel = PathBuf::from("/k");
        let initrd = PathBuf::from("/i");
        let s = VmShape {
            accel: Accel::Tcg,
            initrd: Some(&initrd),
            ..shape(&kernel, VmNetwork::None)
        };
        let a = qemu_args("vm", &s, &files).join(" ");
        assert!(a.contains("accel=tcg") && a.contains("-cpu max"), "{a}");
        assert!(a.contains("tsc_early_khz=2445404 lpj=9781616"), "{a}");
        assert_eq!(
            host_tsc_khz("processor\t: 0\ncpu MHz\t\t: 2445.404\n"),
            Some(2_445_404)
        );
        assert_eq!(host_tsc_khz("processor\t: 0\n"), None);
        assert!(a.contains("-initrd /i"), "{a}");
        assert!(!a.contains("-netdev"), "{a}");
    }

    #[test]
    fn the_newest_cloud_kernel_of_this_arch_is_the_default_with_its_initrd() {
        let boot = tempfile::tempdir().unwrap();
        let arch = if cfg!(target_arch = "aarch64") {
            "arm64"
        } else {
            "amd64"
        };
        for name in [
            format!("vmlinuz-6.1.0-9-cloud-{arch}"),
            format!("vmlinuz-6.1.0-57-cloud-{arch}"),
            format!("initrd.img-6.1.0-57-cloud-{arch}"),
            "vmlinuz-6.9.0-1-amd64".to_string(),
        ] {
            std::fs::write(boot.path().join(name), b"").unwrap();
        }
        let kernel = cloud_kernel(boot.path()).unwrap();
        assert_eq!(
            kernel.file_name().unwrap().to_str().unwrap(),
            format!("vmlinuz-6.1.0-57-cloud-{arch}")
        );
        assert_eq!(
            initrd_beside(&kernel).unwrap().file_name().unwrap().to_str(),
            Some(format!("initrd.img-6.1.0-57-cloud-{arch}").as_str())
        );
        let old = boot.path().join(format!("vmlinuz-6.1.0-9-cloud-{arch}"));
        assert_eq!(initrd_beside(&old), None, "no initrd beside it");
        assert_eq!(cloud_kernel(&boot.path().join("none")), None);
    }
}
