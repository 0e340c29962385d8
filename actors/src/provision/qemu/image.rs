//! The image each VM boots from, a job's overlay on it, and whether KVM works here.

use std::{path::Path, process::Stdio};

use tokio::process::Command;

use crate::provision::{ProvisionError, spawn_error};

/// The format of `image`, by its first bytes: qcow2's magic, else raw.
fn format_of(image: &Path) -> std::io::Result<&'static str> {
    use std::io::Read;
    let mut magic = [0u8; 4];
    let mut f = std::fs::File::open(image)?;
    let n = f.read(&mut magic)?;
    Ok(if n == 4 && magic == *b"QFI\xfb" {
        "qcow2"
    } else {
        "raw"
    })
}

/// The image can be read (the overlay reads it; nothing writes it), no one but root or the
/// daemon's user can change it or the directories above it, and it chains to no other file.
pub(super) fn check(image: &Path) -> Result<(), ProvisionError> {
    format_of(image).map_err(|e| {
        ProvisionError::HostUnavailable(format!("cannot read the image {}: {e}", image.display()))
    })?;
    if crate::weaken::off("image-check") {
        return Ok(());
    }
    trusted("image", image)?;
    let mut header = Vec::new();
    {
        use std::io::Read;
        std::fs::File::open(image)
            .and_then(|f| f.take(112).read_to_end(&mut header))
            .map_err(|e| {
                ProvisionError::HostUnavailable(format!(
                    "cannot read the image {}: {e}",
                    image.display()
                ))
            })?;
    }
    match super::sandbox::chain_in_header(&header) {
        None => Ok(()),
        Some(why) => Err(ProvisionError::Misconfigured(format!(
            "the image {} is refused: {why}, and every VM's overlay would read that file through \
             it as root; convert it to a standalone image (qemu-img convert -O qcow2 {} new.img)",
            image.display(),
            image.display()
        ))),
    }
}

/// `path` (the VMs' `what`) is the operator's alone ([`crate::provision::trust`]).
pub(super) fn trusted(what: &str, path: &Path) -> Result<(), ProvisionError> {
    if crate::weaken::off("image-check") {
        return Ok(());
    }
    crate::provision::trust::check_file_trusted(what, path)
        .map_err(|e| ProvisionError::Misconfigured(e.to_string()))
}

/// Makes `overlay`, a qcow2 file of `size` bytes (at least the image's) whose reads fall
/// through to `image`, which it never writes.
pub(super) async fn overlay(
    qemu_img: &Path,
    image: &Path,
    overlay: &Path,
    size: u64,
) -> Result<(), ProvisionError> {
    let format = format_of(image).map_err(|e| {
        ProvisionError::HostUnavailable(format!("cannot read the image {}: {e}", image.display()))
    })?;
    let size = size.max(virtual_size(image, format));
    let out = Command::new(qemu_img)
        .args(["create", "-q", "-f", "qcow2", "-F", format, "-b"])
        .arg(image)
        .arg(overlay)
        .arg(size.to_string())
        .stdin(Stdio::null())
        .output()
        .await
        .map_err(|e| spawn_error(&format!("cannot run {}", qemu_img.display()), &e))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(ProvisionError::EnvironmentFailed(format!(
            "qemu-img create failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        )))
    }
}

/// The disk size `image` gives a guest: a raw file's length, a qcow2's header field.
fn virtual_size(image: &Path, format: &str) -> u64 {
    use std::io::{Read, Seek, SeekFrom};
    match format {
        "qcow2" => (|| {
            let mut f = std::fs::File::open(image).ok()?;
            let mut size = [0u8; 8];
            f.seek(SeekFrom::Start(24)).ok()?;
            f.read_exact(&mut size).ok()?;
            Some(u64::from_be_bytes(size))
        })()
        .unwrap_or(0),
        _ => std::fs::metadata(image).map_or(0, |m| m.len()),
    }
}

/// Whether this host can run a KVM guest: QEMU opens `/dev/kvm` and makes a VM with it (a
/// module loaded but a BIOS with virtualization off fails there). It is started paused with no
/// machine and stopped once it got that far.
pub(super) async fn kvm_works(qemu: &Path) -> Result<(), String> {
    let mut child = Command::new(qemu)
        .args(["-machine", "none,accel=kvm", "-nodefaults", "-nographic", "-S"])
        .args(["-monitor", "none", "-serial", "none"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| format!("cannot run {}: {e}", qemu.display()))?;
    match tokio::time::timeout(std::time::Duration::from_secs(2), child.wait()).await {
        // Still running, paused with its accelerator up.
        Err(_) => {
            let _ = child.kill().await;
            Ok(())
        }
        Ok(_) => {
            let said = match child.stderr.take() {
                Some(mut stderr) => {
                    use tokio::io::AsyncReadExt;
                    let mut s = String::new();
                    let _ = stderr.read_to_string(&mut s).await;
                    s
                }
                None => String::new(),
            };
            Err(format!(
                "QEMU cannot use KVM here ({}): load kvm_intel or kvm_amd, give the daemon's \
                 user the kvm group, or set accel = \"tcg\" (slow)",
                said.trim()
            ))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn qcow2_is_told_by_its_magic_and_its_size_read_from_the_header() {
        let dir = tempfile::tempdir().unwrap();
        let raw = dir.path().join("raw.img");
        std::fs::write(&raw, vec![0u8; 4096]).unwrap();
        assert_eq!(format_of(&raw).unwrap(), "raw");
        assert_eq!(virtual_size(&raw, "raw"), 4096);
        let qcow = dir.path().join("q.qcow2");
        let mut header = b"QFI\xfb".to_vec();
        header.extend([0u8; 20]);
        header.extend((5u64 << 30).to_be_bytes());
        std::fs::write(&qcow, header).unwrap();
        assert_eq!(format_of(&qcow).unwrap(), "qcow2");
        assert_eq!(virtual_size(&qcow, "qcow2"), 5 << 30);
        assert!(check(&dir.path().join("none")).is_err());
    }
}
