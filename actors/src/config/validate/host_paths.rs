//! What a container pool may take from the host: binds and devices, judged on the path they
//! resolve to, not on their text.
//!
//! `/tmp/../etc:/x` is `/etc`; `/srv/link:/x` is wherever `link` leads. So each path is first
//! made lexical (`.` and `..` gone), then resolved through the symlinks that exist on this host
//! (the longest existing prefix is canonicalized, the rest appended), and both forms are
//! compared with the guarded paths, themselves resolved the same way (`/var/run` is `/run` on
//! most hosts). Devices come from an allow-list (GPUs, `/dev/kvm`, `/dev/fuse`) after the same
//! resolution (`/dev/disk/by-id/...` is a disk). `allow_host_paths = true` accepts any.
//!
//! A bind is judged again at every container start ([`refused_bind`]): a symlink added on the
//! host after check-config (`/srv/cache -> /etc`) is followed by the engine at the start, so
//! what the bind resolves to then is what counts.

use std::path::{Component, Path, PathBuf};

use super::Problems;

/// A host path no job's container may reach.
#[derive(Debug, Clone)]
pub struct Guarded {
    path: PathBuf,
    /// A bind of a path inside it is refused too (not for `/`, which holds everything: only
    /// a bind of `/` itself is).
    inside: bool,
    /// A read-only bind of it is fine (an operator's runner install).
    read_only_ok: bool,
}

/// The host's own trees and the engine's sockets, whatever the config says. `/var` holds the
/// cron and at spools, every daemon's state and the engines' stores; `/opt` and `/srv` hold
/// other software and data a job has no business in.
const SYSTEM: [&str; 22] = [
    "/etc",
    "/usr",
    "/var",
    "/opt",
    "/srv",
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
pub(crate) fn guarded(
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

/// The guarded paths for a container pool on engine `socket`, with every process pool of
/// `providers` (their work roots, and their installs, which may be bound read-only).
pub(crate) fn guarded_for(
    providers: &crate::config::ProvidersConfig,
    state_dir: &Path,
    socket: &str,
) -> Vec<Guarded> {
    let process = providers.pools.iter().filter_map(|pool| pool.process());
    let work_roots: Vec<PathBuf> = process.clone().map(|x| x.work_root.clone()).collect();
    let installs: Vec<PathBuf> = process
        .filter_map(|x| match &x.program {
            crate::config::RunnerProgram::Install(dir) => Some(dir.clone()),
            _ => None,
        })
        .collect();
    guarded(socket, state_dir, &work_roots, &installs)
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

/// The guarded path a bind of `source` reaches, if any. A read-only bind of an operator's
/// install (or of a path inside it) is fine wherever the install lives (`/opt` included).
fn reaches<'a>(source: &Path, read_only: bool, guarded: &'a [Guarded]) -> Option<&'a Path> {
    let forms = [lexical(source), resolved(source)];
    let in_install = |g: &Guarded| {
        let g_forms = [lexical(&g.path), resolved(&g.path)];
        forms
            .iter()
            .all(|s| g_forms.iter().any(|gf| s.starts_with(gf)))
    };
    if read_only && guarded.iter().any(|g| g.read_only_ok && in_install(g)) {
        return None;
    }
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

/// Why bind `volume` (`/host:/path[:ro]`) may not be given to a job, if it may not: it
/// reaches a guarded path, as this host resolves it now. A named volume is no host path.
pub(crate) fn refused_bind(key: &str, volume: &str, guarded: &[Guarded]) -> Option<String> {
    let source = volume.split(':').next().filter(|s| s.starts_with('/'))?;
    let hit = reaches(Path::new(source), volume.ends_with(":ro"), guarded)?;
    Some(format!(
        "binds {} into every job's container, which reaches {}: the engine's socket, the \
         daemon's state and work, a runner install (except read-only) or the host's own trees \
         (/etc, /usr, /var, /opt, /srv, ...) are no job's; use a named volume, or set \
         {key}.allow_host_paths = true to accept that",
        shown(source),
        hit.display()
    ))
}

/// Refuses each bind in `volumes` that reaches a guarded path, naming its key.
pub(super) fn refuse_binds(key: &str, volumes: &[String], guarded: &[Guarded], p: &mut Problems) {
    for (i, v) in volumes.iter().enumerate() {
        if let Some(why) = refused_bind(key, v, guarded) {
            p.push(format!("{key}.volumes[{i}]"), why);
        }
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

    /// A bind that was fine at check-config, made to lead into `/etc` by a symlink put on
    /// the host afterwards: judged again (as each container start does), it is refused.
    #[test]
    fn a_bind_is_judged_on_what_it_resolves_to_at_the_time_of_asking() {
        let tmp = tempfile::tempdir().unwrap();
        let cache = tmp.path().join("cache");
        std::fs::create_dir(&cache).unwrap();
        let guarded = guarded(
            "unix:///run/podman/podman.sock",
            Path::new("/var/lib/e"),
            &[],
            &[],
        );
        let volume = format!("{}:/cache", cache.display());
        assert_eq!(refused_bind("providers.linux", &volume, &guarded), None);
        std::fs::remove_dir(&cache).unwrap();
        std::os::unix::fs::symlink("/etc", &cache).unwrap();
        let why = refused_bind("providers.linux", &volume, &guarded).expect("refused now");
        assert!(
            why.contains("(that is /etc)") && why.contains("reaches /etc"),
            "{why}"
        );
        assert_eq!(
            refused_bind("providers.linux", "named:/cache", &guarded),
            None
        );
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
