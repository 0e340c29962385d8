//! `[providers.NAME]` of kind `linux`: the engine socket, the image and how it is pulled, what
//! each container may use, and what it gets mounted.

use super::{
    ContainerLimits, ContainerMounts, LinuxConfig, Problems, PullPolicy, RawCommand, RawPool,
    defaults, loopback, non_empty, parse_size,
};

pub(super) fn build_linux(
    key: &str,
    mut x: RawPool,
    enabled: bool,
    p: &mut Problems,
) -> LinuxConfig {
    let k = |name: &str| format!("{key}.{name}");
    let limits = container_limits(key, &x, p);
    let socket = engine_socket(key, &x, enabled, p);
    let command = match x.command.take() {
        None => vec![defaults::LINUX_COMMAND.to_string()],
        Some(RawCommand::Many(argv)) => argv,
        Some(RawCommand::One(path)) => vec![path],
    };
    let pull = match x.pull.as_deref() {
        None | Some("missing") => PullPolicy::Missing,
        Some("always") => PullPolicy::Always,
        Some("never") => PullPolicy::Never,
        Some(other) => {
            p.push(
                k("pull"),
                format!("{other:?} must be \"missing\", \"always\" or \"never\""),
            );
            PullPolicy::Missing
        }
    };
    let mounts = container_mounts(key, &x, &socket, p);
    // Binds are judged once every pool is read (another pool's install or work root is
    // guarded too: `providers::refuse_host_paths`).
    if !mounts.allow_host_paths {
        super::host_paths::refuse_devices(key, &mounts.devices, p);
    }
    let (extra_hosts, dns) = host_names(key, x.extra_hosts, x.dns, p);
    LinuxConfig {
        limits,
        socket,
        image: if enabled {
            non_empty(&k("image"), x.image, defaults::LINUX_IMAGE, p)
        } else {
            x.image.unwrap_or_else(|| defaults::LINUX_IMAGE.into())
        },
        command,
        network: x.network.filter(|n| !n.is_empty()),
        pull,
        mounts,
        extra_hosts,
        dns,
    }
}

/// The engine's socket: unix, or tcp/http on loopback (elsewhere only with
/// `allow_insecure`: each container's JIT config crosses it).
fn engine_socket(key: &str, x: &RawPool, enabled: bool, p: &mut Problems) -> String {
    let k = |name: &str| format!("{key}.{name}");
    let socket = x
        .socket
        .clone()
        .unwrap_or_else(|| defaults::LINUX_SOCKET.into());
    if enabled && !valid_socket(&socket) {
        p.push(
            k("socket"),
            format!("{socket:?} must be unix:///path/to.sock, tcp://host:port or http://host:port"),
        );
    }
    let remote = ["tcp://", "http://"]
        .iter()
        .filter_map(|scheme| socket.strip_prefix(scheme))
        .any(|rest| !loopback(rest));
    if enabled && remote && !x.allow_insecure.unwrap_or(false) {
        p.push(
            k("socket"),
            format!(
                "{socket:?} is the engine API in clear on the network: each container's JIT \
                 config would cross it unencrypted; use a unix socket (or an ssh tunnel to one), \
                 or set {key}.allow_insecure = true"
            ),
        );
    }
    socket
}

/// `extra_hosts` (each `host:ip`) and `dns` (each an IP address), one word each.
fn host_names(
    key: &str,
    extra_hosts: Option<Vec<String>>,
    dns: Option<Vec<String>>,
    p: &mut Problems,
) -> (Vec<String>, Vec<String>) {
    let strings = |name: &str, list: Option<Vec<String>>, p: &mut Problems| {
        let list = list.unwrap_or_default();
        for (i, v) in list.iter().enumerate() {
            if v.trim().is_empty() || v.chars().any(char::is_whitespace) {
                p.push(
                    format!("{key}.{name}[{i}]"),
                    format!("{v:?} must be one word, without spaces"),
                );
            }
        }
        list
    };
    let extra_hosts = strings("extra_hosts", extra_hosts, p);
    for (i, h) in extra_hosts.iter().enumerate() {
        if !h.contains(':') {
            p.push(
                format!("{key}.extra_hosts[{i}]"),
                format!("{h:?} must be host:ip"),
            );
        }
    }
    let dns = strings("dns", dns, p);
    for (i, d) in dns.iter().enumerate() {
        if d.parse::<std::net::IpAddr>().is_err() {
            p.push(
                format!("{key}.dns[{i}]"),
                format!("{d:?} must be an IP address"),
            );
        }
    }
    (extra_hosts, dns)
}

/// `volumes`, `tmpfs`, `shm_size`, `devices`, `docker_access`.
fn container_mounts(key: &str, x: &RawPool, socket: &str, p: &mut Problems) -> ContainerMounts {
    let volumes = x.volumes.clone().unwrap_or_default();
    for (i, v) in volumes.iter().enumerate() {
        let parts: Vec<&str> = v.split(':').collect();
        let ok = match parts.as_slice() {
            [source, target] | [source, target, "ro" | "rw"] => {
                !source.is_empty()
                    && target.starts_with('/')
                    && (source.starts_with('/')
                        || source
                            .chars()
                            .all(|c| c.is_ascii_alphanumeric() || "_.-".contains(c)))
            }
            _ => false,
        };
        if !ok {
            p.push(
                format!("{key}.volumes[{i}]"),
                format!(
                    "{v:?} must be NAME:/path or /host/path:/path, with :ro or :rw after it if \
                     wanted (a NAME is a named volume, created if absent and kept between jobs)"
                ),
            );
        }
    }
    let tmpfs = x.tmpfs.clone().unwrap_or_default();
    for (i, t) in tmpfs.iter().enumerate() {
        if !t.starts_with('/') {
            p.push(
                format!("{key}.tmpfs[{i}]"),
                format!("{t:?} must be an absolute path in the container"),
            );
        }
    }
    let shm_size = x
        .shm_size
        .as_deref()
        .and_then(|text| match parse_size(text) {
            Some(n) if n >= 1024 * 1024 => Some(n as u64),
            _ => {
                p.push(
                    format!("{key}.shm_size"),
                    format!("{text:?} must be a size of at least 1MiB, like \"1GiB\""),
                );
                None
            }
        });
    let devices = x.devices.clone().unwrap_or_default();
    for (i, d) in devices.iter().enumerate() {
        // A device path, or a CDI name `vendor.com/class=name`.
        if !(d.starts_with("/dev/") || (d.contains('/') && d.contains('='))) {
            p.push(
                format!("{key}.devices[{i}]"),
                format!("{d:?} must be a /dev/ path or a CDI name like \"nvidia.com/gpu=all\""),
            );
        }
    }
    let docker_access = x.docker_access.unwrap_or(false);
    if docker_access && !socket.starts_with("unix://") {
        p.push(
            format!("{key}.docker_access"),
            "needs a unix:// socket to mount into the container",
        );
    }
    ContainerMounts {
        volumes,
        tmpfs,
        shm_size,
        devices,
        docker_access,
        allow_host_paths: x.allow_host_paths.unwrap_or(false),
    }
}

fn container_limits(key: &str, x: &RawPool, p: &mut Problems) -> ContainerLimits {
    let d = ContainerLimits::default();
    let memory = match x.memory.as_deref() {
        None => d.memory,
        Some(text) => match parse_size(text) {
            Some(n) if n >= 64 * 1024 * 1024 => n as u64,
            _ => {
                p.push(
                    format!("{key}.memory"),
                    format!("{text:?} must be a size of at least 64MiB, like \"4GiB\""),
                );
                d.memory
            }
        },
    };
    let pids_limit = match x.pids_limit {
        None => d.pids_limit,
        Some(n) if n >= 16 => n,
        Some(n) => {
            p.push(
                format!("{key}.pids_limit"),
                format!("{n} is below 16: a runner needs more"),
            );
            d.pids_limit
        }
    };
    let cpus = match x.cpus {
        None => None,
        Some(c) if c > 0.0 && c <= 1024.0 => Some(c),
        Some(c) => {
            p.push(
                format!("{key}.cpus"),
                format!("{c} must be above 0 (and at most 1024)"),
            );
            None
        }
    };
    let cap_add = x.cap_add.clone().unwrap_or(d.cap_add);
    for (i, cap) in cap_add.iter().enumerate() {
        if cap.is_empty() || !cap.chars().all(|c| c.is_ascii_uppercase() || c == '_') {
            p.push(
                format!("{key}.cap_add[{i}]"),
                format!("{cap:?} is not a capability name like \"CHOWN\""),
            );
        }
    }
    ContainerLimits {
        memory,
        pids_limit,
        cpus,
        read_only_root: x.read_only_root.unwrap_or(false),
        cap_add,
    }
}

fn valid_socket(s: &str) -> bool {
    if let Some(path) = s.strip_prefix("unix://") {
        return path.starts_with('/');
    }
    ["tcp://", "http://"]
        .iter()
        .filter_map(|scheme| s.strip_prefix(scheme))
        .any(|rest| !rest.is_empty())
}
