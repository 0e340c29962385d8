//! What a container pool may take from the host: binds and devices, judged on the path they
//! resolve to, not on their text.
//!
//! `/tmp/../etc:/x` is `/etc`; `/srv/link:/x` is wherever `link` leads. So each path is first
//! made lexical (`.` and `..` gone), then resolved through the symlinks that exist on this host
//! (the longest existing prefix is canonicalized, the rest appended), and both forms are
//! compared with the guarded paths, themselves resolved the same way (`/var/run` is `/run` on
//! most hosts). Devices come from an allow-list (GPUs, `/dev/kvm`, `/dev/fuse`) after the same
//! resolution (`/dev/disk/by-id/...` is a disk). `allow_host_paths = true` accepts any.

use std::path::{Component, Path, PathBuf};

use super::Problems;

/// A host path no job's container may reach.
#[derive(Debug, Clone)]
pub(super) struct Guarded {
    path: PathBuf,
    /// A bind of a path inside it is refused too (not for `/`, which holds everything: only
    /// a bind of `/` itself is).
    inside: bool,
    /// A read-only bind of it is fine (an operator's runner install).
    read_only_ok: bool,
}

/// The host's own trees and the engine's sockets, whatever the config says.
const SYSTEM: [&str; 19] = [
    "/etc",
    "/usr",
    "/var/run",
    "/run",
    "/proc",
    "/sys",
    "/dev",
    "/home",
    "/root",
    "/boot",
    "/var/run/docker.sock",
    "/run/docker.sock",
    "/run/podman",
    "/var/run/podman",
    "/run/containerd",
    "/var/lib/docker",
    "/var/lib/containers",
    "/etc/ephemer-actors",
    "/var/lib/ephemer-actors",
];

/// Whether a job may be given host device `path`: a GPU (NVIDIA's `/dev/nvidia*` and
/// `/dev/nvidia-caps/*`, DRM's `/dev/dri/*`, AMD's `/dev/kfd`), `/dev/kvm` or `/dev/fuse`.
fn allowed_device(path: &Path) -> bool {
    let text = path.to_string_lossy();
    matches!(
        text.as_ref(),
        "/dev/kvm" | "/dev/fuse" | "/dev/kfd" | "/dev/dri"
    ) || text.starts_with("/dev/dri/")
        || text
            .strip_prefix("/dev/nvidia")
            .is_some_and(|rest| !rest.contains('/') || rest.starts_with("-caps/"))
}

/// The guarded paths for a container pool: the system's, the engine `socket`'s, the daemon's
/// `state_dir` and its work directory, every process pool's `work_roots`, and the operators'
/// `installs` (read-only binds of those are fine).
pub(super) fn guarded(
    socket: &str,
    state_dir: &Path,
    work_roots: &[PathBuf],
    installs: &[PathBuf],
) -> Vec<Guarded> {
    let state = crate::config::StateConfig::at(state_dir);
    let plain = |path: PathBuf| Guarded {
        path,
        inside: true,
        read_only_ok: false,
    };
    let mut out = vec![Guarded {
        path: PathBuf::from("/"),
        inside: false,
        read_only_ok: false,
    }];
    out.extend(SYSTEM.iter().map(|p| plain(PathBuf::from(p))));
    out.extend(
        socket
            .strip_prefix("unix://")
            .map(|s| plain(PathBuf::from(s))),
    );
    out.push(plain(state.dir.clone()));
    out.push(plain(state.runner_dir()));
    out.extend(work_roots.iter().cloned().map(plain));
    out.extend(installs.iter().map(|path| Guarded {
        path: path.clone(),
        inside: true,
        read_only_ok: true,
    }));
    out
}

/// `path` without `.` and `..` (a `..` at the root stays at the root), by its text alone.
pub(super) fn lexical(path: &Path) -> PathBuf {
    let mut out = PathBuf::from("/");
    for part in path.components() {
        match part {
            Component::Normal(name) => out.push(name),
            Component::ParentDir => {
                out.pop();
            }
            Component::RootDir | Component::CurDir | Component::Prefix(_) => {}
        }
    }
    out
}

/// `path` as this host resolves it: its longest existing prefix canonicalized (symlinks
/// followed), the rest appended; lexical first.
pub(super) fn resolved(path: &Path) -> PathBuf {
    let plain = lexical(path);
    let mut rest = Vec::new();
    let mut at = plain.as_path();
    loop {
        if let Ok(real) = std::fs::canonicalize(at) {
            return rest.iter().rev().fold(real, |acc, part| acc.join(part));
        }
        match (at.parent(), at.file_name()) {
            (Some(parent), Some(name)) => {
                rest.push(name.to_os_string());
                at = parent;
            }
            _ => return plain,
        }
    }
}

/// The guarded path a bind of `source` reaches, if any.
fn reaches<'a>(source: &Path, read_only: bool, guarded: &'a [Guarded]) -> Option<&'a Path> {
    let forms = [lexical(source), resolved(source)];
    guarded.iter().find_map(|g| {
        if read_only && g.read_only_ok {
            return None;
        }
        let guard_forms = [lexical(&g.path), resolved(&g.path)];
        let hit = forms.iter().any(|s| {
            guard_forms
                .iter()
                .any(|g_form| g_form.starts_with(s) || (g.inside && s.starts_with(g_form)))
        });
        hit.then_some(g.path.as_path())
    })
}

/// Refuses each bind in `volumes` that reaches a guarded path, naming its key.
pub(super) fn refuse_binds(key: &str, volumes: &[String], guarded: &[Guarded], p: &mut Problems) {
    for (i, v) in volumes.iter().enumerate() {
        let mut parts = v.split(':');
        let Some(source) = parts.next().filter(|s| s.starts_with('/')) else {
            continue;
        };
        let read_only = v.ends_with(":ro");
        let Some(hit) = reaches(Path::new(source), read_only, guarded) else {
            continue;
        };
        let shown = shown(source);
        p.push(
            format!("{key}.volumes[{i}]"),
            format!(
                "binds {shown} into every job's container, which reaches {}: the engine's \
                 socket, the daemon's state and work, a runner install (except read-only) or the \
                 host's own trees are no job's; use a named volume, or set \
                 {key}.allow_host_paths = true to accept that",
                hit.display()
            ),
        );
    }
}

/// `path`, and what it resolves to when that is another path.
fn shown(path: &str) -> String {
    let real = resolved(Path::new(path));
    if real.as_path() == Path::new(path) {
        path.to_string()
    } else {
        format!("{path} (that is {})", real.display())
    }
}

/// Refuses each host device in `devices` (after resolution) that is not on the allow-list;
/// CDI names (`nvidia.com/gpu=all`) are the vendor's own description and pass.
pub(super) fn refuse_devices(key: &str, devices: &[String], p: &mut Problems) {
    for (i, d) in devices.iter().enumerate() {
        let Some(host) = d.split(':').next().filter(|h| h.starts_with('/')) else {
            continue;
        };
        let real = resolved(Path::new(host));
        if !(allowed_device(&lexical(Path::new(host))) && allowed_device(&real)) {
            p.push(
                format!("{key}.devices[{i}]"),
                format!(
                    "{} is not a device jobs may get: only GPUs (/dev/nvidia*, /dev/dri/*, \
                     /dev/kfd), /dev/kvm and /dev/fuse are (docs/security.md); set \
                     {key}.allow_host_paths = true to accept it",
                    shown(host)
                ),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dots_go_by_text_and_links_by_the_host() {
        assert_eq!(lexical(Path::new("/tmp/../etc")), Path::new("/etc"));
        assert_eq!(lexical(Path::new("/../../etc/./x")), Path::new("/etc/x"));
        let tmp = tempfile::tempdir().unwrap();
        let real = std::fs::canonicalize(tmp.path()).unwrap();
        std::os::unix::fs::symlink("/etc", tmp.path().join("link")).unwrap();
        assert_eq!(
            resolved(&tmp.path().join("link/passwd")),
            Path::new("/etc/passwd")
        );
        assert_eq!(resolved(&tmp.path().join("not/yet")), real.join("not/yet"));
    }

    #[test]
    fn a_device_is_judged_by_what_it_resolves_to() {
        let mut p = Problems::default();
        let devices: Vec<String> = [
            "/dev/nvidia0",
            "/dev/nvidiactl",
            "/dev/dri/renderD128",
            "/dev/kvm",
            "/dev/fuse:/dev/fuse:rwm",
            "nvidia.com/gpu=all",
            "/dev/sda",
            "/dev/mem",
            "/dev/dri/../mem",
            "/dev/kvm2",
        ]
        .map(String::from)
        .to_vec();
        refuse_devices("providers.gpu", &devices, &mut p);
        let keys: Vec<&str> = p.0.iter().map(|e| e.key.as_str()).collect();
        assert_eq!(
            keys,
            [
                "providers.gpu.devices[6]",
                "providers.gpu.devices[7]",
                "providers.gpu.devices[8]",
                "providers.gpu.devices[9]",
            ]
        );
    }
}
