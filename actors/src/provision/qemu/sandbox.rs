//! What QEMU runs as, and what it may do: decided here in plain functions, carried out by the
//! backend.
//!
//! QEMU parses a guest's every device access; a guest that escapes it has what QEMU has. So
//! (when the daemon is root) each VM's QEMU
//! - drops to a uid of its own once its files are open (`-run-with user=UID:GID`): a uid no
//!   account and no other process has, picked from [`UID_BASE`]..+[`UID_SPAN`] (a range
//!   systemd leaves to no one: above its container ranges, below the "foreign" and signed
//!   ones), so no two VMs share one and an escaped QEMU reaches none of the others, nor the
//!   daemon's files (its run directory is root's and `0700`: it holds its descriptors only);
//! - has no capabilities after the drop (a uid change from root clears them) and
//!   `no_new_privs`;
//! - runs under QEMU's seccomp filter (`-sandbox on,obsolete=deny,spawn=deny,
//!   resourcecontrol=deny`): no `execve`/`fork` of helpers, no obsolete calls, no scheduler or
//!   CPU affinity changes. `elevateprivileges=deny` is left out: QEMU installs the filter
//!   before it drops to its uid, and that option refuses the drop itself ("Bad system call",
//!   QEMU 10.0); once dropped, no set*id call can give back what was given up;
//! - leads a process group of its own (a signal to the daemon's group never reaches it, and
//!   the drain stops each VM itself), in a cgroup of its own.
//!
//! `-run-with` came with QEMU 9.1: an older QEMU is refused by the host check.

use std::hash::{Hash, Hasher};

/// The first uid a VM's QEMU may run as.
pub(super) const UID_BASE: u32 = 1_900_000_000;
/// How many uids the range holds.
pub(super) const UID_SPAN: u32 = 1 << 20;

/// QEMU's seccomp filter, as `-sandbox` takes it.
pub(super) const SANDBOX: &str = "on,obsolete=deny,spawn=deny,resourcecontrol=deny";

/// The uid VM `name` runs as: its place in the range by its name, moved on past every uid
/// `busy` says is taken (a process runs as it, or an account has it).
pub(super) fn vm_uid(name: &str, busy: impl Fn(u32) -> bool) -> Option<u32> {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    name.hash(&mut h);
    let start = (h.finish() % u64::from(UID_SPAN)) as u32;
    (0..UID_SPAN.min(4096))
        .map(|i| UID_BASE + (start + i) % UID_SPAN)
        .find(|uid| !busy(*uid))
}

/// QEMU's arguments that put it in its sandbox, dropping to `user` (uid, gid) when given.
pub(super) fn args(user: Option<(u32, u32)>) -> Vec<String> {
    let mut a = vec!["-sandbox".to_string(), SANDBOX.to_string()];
    if let Some((uid, gid)) = user {
        a.push("-run-with".into());
        a.push(format!("user={uid}:{gid}"));
    }
    a
}

/// What QEMU's `-help` says it lacks for the sandbox, if anything.
pub(super) fn missing_from_help(help: &str) -> Option<&'static str> {
    if !help.contains("-run-with") {
        Some("-run-with (QEMU 9.1 or later: each VM's QEMU drops to a uid of its own)")
    } else if !help.contains("-sandbox") {
        Some("-sandbox (a QEMU built with seccomp)")
    } else {
        None
    }
}

/// Why a qcow2 image whose header is `header` (its first 104 bytes at least) may not be a
/// base image: it names a backing file or an external data file, so an overlay on it would
/// read another file through the chain (the host's shadow file, say). Raw images have no
/// header to follow.
pub(super) fn chain_in_header(header: &[u8]) -> Option<&'static str> {
    let be64 = |at: usize| {
        header
            .get(at..at + 8)
            .map(|b| u64::from_be_bytes(b.try_into().expect("8 bytes")))
    };
    let be32 = |at: usize| {
        header
            .get(at..at + 4)
            .map(|b| u32::from_be_bytes(b.try_into().expect("4 bytes")))
    };
    if !header.starts_with(b"QFI\xfb") {
        return None;
    }
    if be64(8).is_none_or(|offset| offset != 0) {
        return Some("it names a backing file");
    }
    // Version 3 headers carry feature bits; bit 2 of the incompatible ones is an external
    // data file (named in a header extension).
    if be32(4).is_some_and(|v| v >= 3) && be64(72).is_none_or(|f| f & (1 << 2) != 0) {
        return Some("it keeps its data in an external file");
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_vm_gets_a_free_uid_of_the_range_by_its_name() {
        let a = vm_uid("ephemer-vm-a", |_| false).unwrap();
        assert!((UID_BASE..UID_BASE + UID_SPAN).contains(&a));
        assert_eq!(vm_uid("ephemer-vm-a", |_| false), Some(a), "stable by name");
        assert_ne!(vm_uid("ephemer-vm-b", |_| false), Some(a));
        let next = vm_uid("ephemer-vm-a", |uid| uid == a).unwrap();
        assert_ne!(next, a, "a taken uid is passed over");
        assert_eq!(vm_uid("x", |_| true), None);
    }

    #[test]
    fn the_sandbox_is_always_on_and_the_drop_is_said_when_root() {
        assert_eq!(args(None), ["-sandbox", SANDBOX]);
        assert_eq!(
            args(Some((1_900_000_007, 1_900_000_007))).join(" "),
            format!("-sandbox {SANDBOX} -run-with user=1900000007:1900000007")
        );
        assert!(!SANDBOX.contains("elevateprivileges"), "it refuses the drop");
        assert_eq!(missing_from_help("-sandbox on\n-run-with [user=...]"), None);
        assert!(missing_from_help("-sandbox on\n-runas user").unwrap().contains("9.1"));
    }

    fn qcow2(version: u32, backing: u64, incompatible: u64) -> Vec<u8> {
        let mut h = b"QFI\xfb".to_vec();
        h.extend(version.to_be_bytes());
        h.extend(backing.to_be_bytes());
        h.resize(72, 0);
        h.extend(incompatible.to_be_bytes());
        h.resize(112, 0);
        h
    }

    /// The review's image: a qcow2 whose backing file is the host's shadow file.
    #[test]
    fn a_base_image_that_chains_to_another_file_is_refused() {
        assert_eq!(chain_in_header(&qcow2(3, 0, 0)), None);
        assert_eq!(chain_in_header(&qcow2(2, 0, 0)), None);
        assert!(chain_in_header(&qcow2(3, 112, 0)).unwrap().contains("backing"));
        assert!(chain_in_header(&qcow2(3, 0, 1 << 2)).unwrap().contains("external"));
        assert_eq!(chain_in_header(b"\0\0\0\0raw"), None, "raw: no chain");
        assert!(chain_in_header(b"QFI\xfb\0\0").is_some(), "a cut header is refused");
    }
}
