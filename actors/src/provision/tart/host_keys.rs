//! Whose ssh host key a VM must present before the JIT config crosses the connection.
//!
//! Every clone of a base image starts with the image's host keys, and a job has root in its
//! guest: it can read them and, on a shared network, answer for a sibling that is booting and
//! receive that sibling's JIT config. So by default (`host_keys = "per_vm"`) each clone makes
//! keys of its own right after boot, and the daemon learns the public half through `tart exec`:
//! tart's guest agent, reached through the VM's own control socket, not the network. Only that
//! VM holds the private half; the pin is kept in a file of its own and removed with the VM.
//!
//! `host_keys = "image"` keeps the older, weaker pin (for images without the guest agent): the
//! image's keys, learned once from the first VM booted from it with `ssh-keyscan`.

use std::{path::PathBuf, time::Duration};

use tokio::process::Command;

use super::TartBackend;
use crate::{
    config::HostKeys,
    provision::{ProvisionError, spawn_error},
};

/// How long one `tart exec` may take (ssh-keygen of three key types, well under a second).
const EXEC_TIMEOUT: Duration = Duration::from_secs(30);
/// The pause between tries while the guest agent is not up yet.
const EXEC_RETRY: Duration = Duration::from_secs(1);

/// The pinned key a VM is held to: `UserKnownHostsFile` and `HostKeyAlias` for ssh.
#[derive(Debug, Clone)]
pub(super) struct Pin {
    pub file: PathBuf,
    pub alias: String,
}

impl TartBackend {
    /// The key `name` (booted, at `ip`) must present, by the pool's `host_keys`.
    pub(super) async fn pin_for(&self, name: &str, ip: &str) -> Result<Pin, ProvisionError> {
        match self.s.host_keys {
            HostKeys::PerVm => self.pin_own_key(name).await,
            HostKeys::Image => self.pin_image_key(ip).await,
        }
    }

    /// The file holding the pin of VM `name` (`host_keys = "per_vm"`).
    pub(super) fn vm_pin_file(&self, name: &str) -> PathBuf {
        self.s.vm_hosts.join(name)
    }

    /// Removes the pin of a VM that is gone.
    pub(super) fn forget_pin(&self, name: &str) {
        match std::fs::remove_file(self.vm_pin_file(name)) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => tracing::warn!(vm = %name, error = %e, "cannot remove the VM's host-key pin"),
        }
    }

    /// The pins of VMs with our prefix that are not in `keep` (left by a daemon that died).
    pub(super) fn stale_pins(&self, keep: &[String]) -> Vec<String> {
        let Ok(dir) = std::fs::read_dir(&self.s.vm_hosts) else {
            return Vec::new();
        };
        dir.filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with(&self.s.name_prefix) && !keep.contains(n))
            .collect()
    }

    /// Has the VM make host keys of its own and learns the public ones through `tart exec`,
    /// retried until the boot deadline while the guest agent comes up.
    async fn pin_own_key(&self, name: &str) -> Result<Pin, ProvisionError> {
        let script = regenerate_script("");
        let deadline = tokio::time::Instant::now() + self.s.boot_timeout;
        let keys = loop {
            let tried = self
                .exec(name, &["sudo", "-n", "/bin/sh", "-c", &script])
                .await;
            let error = match tried.map(|out| parse_public_keys(&out)) {
                Ok(keys) if !keys.is_empty() => break keys,
                Ok(_) => "it printed no public host key".to_string(),
                Err(e) => e,
            };
            if tokio::time::Instant::now() + EXEC_RETRY >= deadline {
                return Err(ProvisionError::EnvironmentFailed(format!(
                    "cannot give the VM host keys of its own through `tart exec` ({error}); the \
                     image needs the Tart Guest Agent and passwordless sudo for its user, or set \
                     host_keys = \"image\" (docs/providers.md)"
                )));
            }
            tokio::time::sleep(EXEC_RETRY).await;
        };
        let host = |e: std::io::Error| {
            ProvisionError::HostUnavailable(format!(
                "cannot write the VM's host-key pin in {}: {e}",
                self.s.vm_hosts.display()
            ))
        };
        crate::harden::private_dir(&self.s.vm_hosts).map_err(host)?;
        let file = self.vm_pin_file(name);
        let mut out = crate::harden::private_file(&file, false).map_err(host)?;
        let text: String = keys.iter().map(|k| format!("{name} {k}\n")).collect();
        std::io::Write::write_all(&mut out, text.as_bytes()).map_err(host)?;
        tracing::info!(vm = %name, keys = keys.len(), "pinned the VM's own ssh host key");
        Ok(Pin {
            file,
            alias: name.to_string(),
        })
    }

    /// `tart exec NAME ARGS...`: its standard output, or why not.
    pub(super) async fn exec(&self, name: &str, args: &[&str]) -> Result<String, String> {
        // The guest answers: what it prints is kept to its head.
        let mut command = Command::new(&self.s.tart);
        command.arg("exec").arg(name).args(args).kill_on_drop(true);
        let child = crate::bounded::output(&mut command, super::TOOL_OUTPUT);
        match tokio::time::timeout(EXEC_TIMEOUT, child).await {
            Err(_) => Err(format!("no answer in {}s", EXEC_TIMEOUT.as_secs())),
            Ok(Err(e)) => Err(spawn_error("cannot run tart exec", &e).to_string()),
            Ok(Ok(out)) if out.status.success() => Ok(String::from_utf8_lossy(&out.stdout).into()),
            Ok(Ok(out)) => Err(format!(
                "tart exec {}: {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            )),
        }
    }

    /// The host key every clone of the base image carries (`host_keys = "image"`): learned from
    /// the first VM booted from it (`ssh-keyscan`, once, on tart's host-only network), kept in
    /// `known_hosts` under an alias named after the image, and required of every later VM.
    async fn pin_image_key(&self, ip: &str) -> Result<Pin, ProvisionError> {
        let alias = host_alias(&self.s.base_image);
        let pin = Pin {
            file: self.s.known_hosts.clone(),
            alias: alias.clone(),
        };
        let known = std::fs::read_to_string(&self.s.known_hosts).unwrap_or_default();
        if known.lines().any(|l| l.starts_with(&format!("{alias} "))) {
            return Ok(pin);
        }
        let out = crate::bounded::output(
            Command::new(keyscan_path(&self.s.ssh)).args(["-T", "10", ip]),
            super::TOOL_OUTPUT,
        )
        .await
        .map_err(|e| spawn_error("cannot run ssh-keyscan", &e))?;
        let keys: Vec<String> = String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter(|l| !l.trim().is_empty() && !l.starts_with('#'))
            .filter_map(|l| l.split_once(' ').map(|(_, key)| format!("{alias} {key}")))
            .collect();
        if keys.is_empty() {
            return Err(ProvisionError::EnvironmentFailed(format!(
                "cannot learn the host key of the VM at {ip} (ssh-keyscan found none)"
            )));
        }
        let mut file = crate::harden::private_file(&self.s.known_hosts, true).map_err(|e| {
            ProvisionError::HostUnavailable(format!(
                "cannot write {}: {e}",
                self.s.known_hosts.display()
            ))
        })?;
        for key in &keys {
            std::io::Write::write_all(&mut file, format!("{key}\n").as_bytes()).map_err(|e| {
                ProvisionError::HostUnavailable(format!("cannot pin the host key: {e}"))
            })?;
        }
        tracing::info!(image = %self.s.base_image, alias = %alias, "pinned the base image's ssh host key");
        Ok(pin)
    }
}

/// The guest-side script (run as root) that replaces the host keys the clone inherited with
/// new ones and prints their public halves. `root` prefixes every path (empty in a guest; a
/// directory in tests). Where systemd runs sshd (a Linux guest) it is restarted to load them;
/// macOS starts `sshd -i` per connection, which reads them anew.
pub(super) fn regenerate_script(root: &str) -> String {
    let keygen = if root.is_empty() {
        "ssh-keygen -q -A".to_string()
    } else {
        format!("ssh-keygen -q -A -f '{root}'")
    };
    let restart = if root.is_empty() {
        "if command -v systemctl >/dev/null 2>&1; then \
         systemctl try-restart ssh.service sshd.service >/dev/null 2>&1 || true; fi; "
    } else {
        ""
    };
    format!(
        "set -e; umask 077; rm -f '{root}'/etc/ssh/ssh_host_*_key '{root}'/etc/ssh/ssh_host_*_key.pub; \
         {keygen}; {restart}cat '{root}'/etc/ssh/ssh_host_*_key.pub"
    )
}

/// The `TYPE BASE64` public keys in `out` (one per line, comments dropped); lines that are not
/// a key of a type ssh takes are ignored.
pub(super) fn parse_public_keys(out: &str) -> Vec<String> {
    use base64::Engine;
    const TYPES: [&str; 5] = [
        "ssh-ed25519",
        "ecdsa-sha2-nistp256",
        "ecdsa-sha2-nistp384",
        "ecdsa-sha2-nistp521",
        "ssh-rsa",
    ];
    out.lines()
        .filter_map(|line| {
            let mut parts = line.split_ascii_whitespace();
            let (kind, key) = (parts.next()?, parts.next()?);
            let blob = base64::engine::general_purpose::STANDARD.decode(key).ok()?;
            // The blob names its own type first: a length, then the name.
            let named = blob.get(4..4 + kind.len()) == Some(kind.as_bytes());
            (TYPES.contains(&kind) && named).then(|| format!("{kind} {key}"))
        })
        .collect()
}

/// `ssh-keyscan` beside the configured `ssh` (on `PATH` when `ssh` is a bare name).
pub(super) fn keyscan_path(ssh: &std::path::Path) -> PathBuf {
    if ssh.components().count() == 1 {
        PathBuf::from("ssh-keyscan")
    } else {
        ssh.with_file_name("ssh-keyscan")
    }
}

/// The known-hosts name of a base image's VMs: `ephemer-` and the image with every character
/// outside `[A-Za-z0-9.-]` as `-`.
fn host_alias(image: &str) -> String {
    let clean: String = image
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '.' || c == '-' {
                c
            } else {
                '-'
            }
        })
        .collect();
    format!("ephemer-{clean}")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The script, run on this host against a directory standing for the guest's root: the
    /// inherited keys are gone, new ones are printed, and what it prints parses as keys.
    #[test]
    fn the_clone_replaces_its_inherited_keys_and_prints_the_new_ones() {
        if std::process::Command::new("ssh-keygen")
            .arg("-?")
            .output()
            .is_err()
        {
            return crate::test_support::skip(
                "the host-key script test",
                "there is no ssh-keygen on this host",
            );
        }
        let root = tempfile::tempdir().unwrap();
        let etc = root.path().join("etc/ssh");
        std::fs::create_dir_all(&etc).unwrap();
        let keygen = |out: &std::path::Path| {
            let ok = std::process::Command::new("ssh-keygen")
                .args(["-q", "-t", "ed25519", "-N", "", "-f"])
                .arg(out)
                .status()
                .unwrap()
                .success();
            assert!(ok);
        };
        let inherited = etc.join("ssh_host_ed25519_key");
        keygen(&inherited);
        let old = std::fs::read_to_string(etc.join("ssh_host_ed25519_key.pub")).unwrap();
        let old = parse_public_keys(&old);
        let out = std::process::Command::new("sh")
            .args(["-c", &regenerate_script(&root.path().display().to_string())])
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        let new = parse_public_keys(&String::from_utf8_lossy(&out.stdout));
        assert!(new.iter().any(|k| k.starts_with("ssh-ed25519 ")), "{new:?}");
        assert!(!new.contains(&old[0]), "the inherited key is still there");
        let mode = std::os::unix::fs::PermissionsExt::mode(
            &std::fs::metadata(&inherited).unwrap().permissions(),
        );
        assert_eq!(mode & 0o077, 0, "private keys stay private");
    }

    #[test]
    fn only_keys_of_a_type_ssh_takes_are_read() {
        // A blob naming ssh-ed25519, then 32 bytes.
        let mut blob = vec![0, 0, 0, 11];
        blob.extend_from_slice(b"ssh-ed25519");
        blob.extend_from_slice(&[0, 0, 0, 32]);
        blob.extend_from_slice(&[7; 32]);
        use base64::Engine;
        let key = base64::engine::general_purpose::STANDARD.encode(&blob);
        let out = format!(
            "ssh-ed25519 {key} root@guest\n\
             ssh-rsa {key}\n\
             ssh-ed25519 not*base64\n\
             @cert-authority * ssh-ed25519 {key}\n\
             \n"
        );
        assert_eq!(parse_public_keys(&out), vec![format!("ssh-ed25519 {key}")]);
    }
}
