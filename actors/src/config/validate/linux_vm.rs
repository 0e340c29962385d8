//! `kind = "linux_vm"`: each key of a microVM pool, checked.

use std::path::PathBuf;

use super::{Problems, RawPool, parse_size, positive_duration};
use crate::config::{
    defaults,
    linux_vm::{Accel, LinuxVmConfig, VmNetwork, default_qemu},
};

/// The least memory a guest boots a runner in.
const MIN_MEMORY: u64 = 256 << 20;
/// The least writable layer a job gets.
const MIN_DISK: u64 = 1 << 30;
/// The most virtual CPUs a pool's VM may ask for.
const MAX_CPUS: i64 = 64;

/// The pool's VM settings from its table, every problem said with its key.
pub(super) fn build_linux_vm(key: &str, v: RawPool, p: &mut Problems) -> LinuxVmConfig {
    let k = |name: &str| format!("{key}.{name}");
    let path = |name: &str, raw: Option<String>, p: &mut Problems| -> Option<PathBuf> {
        let raw = raw.filter(|s| !s.is_empty())?;
        let path = PathBuf::from(raw);
        if !path.is_absolute() {
            p.push(
                k(name),
                format!("{} must be an absolute path", path.display()),
            );
        }
        Some(path)
    };
    let kernel = path("kernel", v.kernel, p);
    let initrd = path("initrd", v.initrd, p);
    let image = path("image", v.image, p).unwrap_or_else(|| defaults::LINUX_VM_IMAGE.into());
    let cpus = match v.cpus {
        None => 2,
        Some(n) if n.fract() == 0.0 && (1.0..=MAX_CPUS as f64).contains(&n) => n as u32,
        Some(n) => {
            p.push(
                k("cpus"),
                format!("{n} must be a whole number of CPUs from 1 to {MAX_CPUS}"),
            );
            2
        }
    };
    LinuxVmConfig {
        kernel,
        initrd,
        image,
        cpus,
        memory: size(&k("memory"), v.memory, 4 << 30, MIN_MEMORY, "256MiB", p),
        disk: size(&k("disk"), v.disk, 20 << 30, MIN_DISK, "1GiB", p),
        network: match v.network.as_deref() {
            None | Some("user") => VmNetwork::User,
            Some("none") => VmNetwork::None,
            Some(other) => {
                p.push(
                    k("network"),
                    format!("{other:?} must be \"user\" or \"none\""),
                );
                VmNetwork::User
            }
        },
        accel: match v.accel.as_deref() {
            None | Some("kvm") => Accel::Kvm,
            Some("tcg") => Accel::Tcg,
            Some(other) => {
                p.push(k("accel"), format!("{other:?} must be \"kvm\" or \"tcg\""));
                Accel::Kvm
            }
        },
        boot_timeout: positive_duration(
            &k("boot_timeout"),
            v.boot_timeout,
            defaults::LINUX_VM_BOOT_TIMEOUT,
            p,
        ),
        qemu_path: PathBuf::from(v.qemu_path.unwrap_or_else(|| default_qemu().into())),
        qemu_img_path: PathBuf::from(v.qemu_img_path.unwrap_or_else(|| "qemu-img".into())),
        runner_command: v
            .runner_command
            .filter(|c| !c.trim().is_empty())
            .unwrap_or_else(|| defaults::LINUX_VM_RUNNER.into()),
    }
}

/// A size key (`"4GiB"`), at least `min` bytes.
fn size(
    key: &str,
    raw: Option<String>,
    default: u64,
    min: u64,
    min_text: &str,
    p: &mut Problems,
) -> u64 {
    let Some(text) = raw else { return default };
    match parse_size(&text) {
        Some(n) if n as u64 >= min => n as u64,
        _ => {
            p.push(
                key,
                format!("{text:?} must be a size of at least {min_text}, like \"4GiB\""),
            );
            default
        }
    }
}
