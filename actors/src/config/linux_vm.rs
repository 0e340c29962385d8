//! `[providers.NAME]` with `kind = "linux_vm"`: one QEMU microVM per job.

use std::{path::PathBuf, time::Duration};

/// `kind = "linux_vm"`: what each job's VM boots and gets.
#[derive(Debug, Clone, PartialEq)]
pub struct LinuxVmConfig {
    /// The kernel booted directly (no firmware); `None`: the host's Debian cloud kernel
    /// (the newest `/boot/vmlinuz-*-cloud-<arch>`).
    pub kernel: Option<PathBuf>,
    /// The initramfs booted with it; `None`: the one beside the kernel
    /// (`/boot/initrd.img-<version>` for `/boot/vmlinuz-<version>`), if there is one.
    pub initrd: Option<PathBuf>,
    /// The root filesystem image (raw or qcow2), never written: each job gets a
    /// copy-on-write overlay on it.
    pub image: PathBuf,
    /// Virtual CPUs.
    pub cpus: u32,
    /// Guest memory, bytes.
    pub memory: u64,
    /// The job's writable layer, bytes (the overlay's virtual size).
    pub disk: u64,
    /// The guest's network.
    pub network: VmNetwork,
    /// How QEMU runs the guest.
    pub accel: Accel,
    /// How long a VM may take from start to its agent's hello.
    pub boot_timeout: Duration,
    /// The QEMU system emulator.
    pub qemu_path: PathBuf,
    /// `qemu-img`, which makes each job's overlay.
    pub qemu_img_path: PathBuf,
    /// The runner's start script in the guest.
    pub runner_command: String,
}

/// A VM's network.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VmNetwork {
    /// QEMU's user-mode networking: outbound connections through the QEMU process, no
    /// privileges, nothing reaches the guest from outside.
    User,
    /// No network device.
    None,
}

impl VmNetwork {
    /// The config spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            VmNetwork::User => "user",
            VmNetwork::None => "none",
        }
    }
}

/// How QEMU runs a guest.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Accel {
    /// Hardware virtualization (`/dev/kvm`).
    Kvm,
    /// Software emulation: 10-50x slower, for tests and hosts without KVM, only when said.
    Tcg,
}

impl Accel {
    /// The config spelling, and QEMU's.
    pub fn as_str(self) -> &'static str {
        match self {
            Accel::Kvm => "kvm",
            Accel::Tcg => "tcg",
        }
    }
}

/// The QEMU system emulator of this host's architecture.
pub fn default_qemu() -> &'static str {
    if cfg!(target_arch = "aarch64") {
        "qemu-system-aarch64"
    } else {
        "qemu-system-x86_64"
    }
}
