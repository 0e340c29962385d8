//! `[providers.*]`: the keys every pool takes, its restart policy, and each kind's own keys.

#[allow(unused_imports)]
use super::*;

struct CommonDefaults {
    enabled: bool,
    labels: &'static [&'static str],
    max_concurrent: usize,
}

#[allow(clippy::too_many_arguments)]
fn build_common(
    kind: ProviderKind,
    enabled: Option<bool>,
    labels: Option<Vec<String>>,
    max_concurrent: Option<i64>,
    restart: Option<RawRestart>,
    d: CommonDefaults,
    present: bool,
    p: &mut Problems,
) -> ProviderCommon {
    let key = format!("providers.{kind}");
    // A table that is written down is meant to be used: `enabled` defaults to true there.
    let enabled = enabled.unwrap_or(if present { true } else { d.enabled });
    let labels = labels.unwrap_or_else(|| d.labels.iter().map(|s| s.to_string()).collect());
    if enabled {
        if labels.is_empty() {
            p.push(
                format!("{key}.labels"),
                "an enabled provider needs at least one label",
            );
        }
        for (i, l) in labels.iter().enumerate() {
            if l.trim().is_empty() {
                p.push(format!("{key}.labels[{i}]"), "a label must not be empty");
            }
        }
    }
    let max_concurrent = count(
        &format!("{key}.max_concurrent"),
        max_concurrent,
        d.max_concurrent,
        1,
        p,
    );
    ProviderCommon {
        enabled,
        labels,
        max_concurrent,
        restart: build_restart(&format!("{key}.restart"), restart, p),
    }
}

fn build_restart(key: &str, raw: Option<RawRestart>, p: &mut Problems) -> RestartConfig {
    let d = RestartConfig::default();
    let Some(raw) = raw else { return d };
    let policy = match raw.policy.as_deref() {
        None | Some("permanent") => RestartPolicy::Permanent,
        Some("transient") => RestartPolicy::Transient,
        Some("never") => RestartPolicy::Never,
        Some(other) => {
            p.push(
                format!("{key}.policy"),
                format!("{other:?} must be \"permanent\", \"transient\" or \"never\""),
            );
            d.policy
        }
    };
    let max_restarts = match raw.max_restarts {
        None => d.max_restarts,
        Some(n) if (0..=i64::from(u32::MAX)).contains(&n) => n as u32,
        Some(n) => {
            p.push(
                format!("{key}.max_restarts"),
                format!("must be 0 or more, got {n}"),
            );
            d.max_restarts
        }
    };
    RestartConfig {
        policy,
        max_restarts,
        within: positive_duration(&format!("{key}.within"), raw.within, d.within, p),
        backoff: duration(&format!("{key}.backoff"), raw.backoff, d.backoff, p),
    }
}

fn absolute_or_default(
    key: &str,
    raw: Option<String>,
    default: PathBuf,
    p: &mut Problems,
) -> PathBuf {
    match raw.filter(|s| !s.is_empty()) {
        None => default,
        Some(s) => {
            let path = PathBuf::from(s);
            if !path.is_absolute() {
                p.push(key, format!("{} must be an absolute path", path.display()));
            }
            path
        }
    }
}

pub(super) fn build_providers(
    raw: crate::config::raw::RawProviders,
    state_dir: &Path,
    as_root: bool,
    p: &mut Problems,
) -> ProvidersConfig {
    let local = build_process(
        ProviderKind::Local,
        raw.local,
        CommonDefaults {
            enabled: false,
            labels: &["self-hosted", "linux", "x64"],
            max_concurrent: 2,
        },
        state_dir.join("work"),
        as_root,
        p,
    );

    let linux_present = raw.linux.is_some();
    let x = raw.linux.unwrap_or_default();
    let limits = container_limits(&x, p);
    let linux_common = build_common(
        ProviderKind::Linux,
        x.enabled,
        x.labels,
        x.max_concurrent,
        x.restart,
        CommonDefaults {
            enabled: false,
            labels: &["self-hosted", "linux", "x64"],
            max_concurrent: 4,
        },
        linux_present,
        p,
    );
    let socket = x.socket.unwrap_or_else(|| defaults::LINUX_SOCKET.into());
    if linux_common.enabled && !valid_socket(&socket) {
        p.push(
            "providers.linux.socket",
            format!("{socket:?} must be unix:///path/to.sock, tcp://host:port or http://host:port"),
        );
    }
    let remote = ["tcp://", "http://"]
        .iter()
        .filter_map(|scheme| socket.strip_prefix(scheme))
        .any(|rest| !loopback(rest));
    if linux_common.enabled && remote && !x.allow_insecure.unwrap_or(false) {
        p.push(
            "providers.linux.socket",
            format!(
                "{socket:?} is the engine API in clear on the network: each container's JIT \
                 config would cross it unencrypted; use a unix socket (or an ssh tunnel to one), \
                 or set providers.linux.allow_insecure = true"
            ),
        );
    }
    let linux = LinuxConfig {
        limits,
        socket,
        image: if linux_common.enabled {
            non_empty("providers.linux.image", x.image, defaults::LINUX_IMAGE, p)
        } else {
            x.image.unwrap_or_else(|| defaults::LINUX_IMAGE.into())
        },
        command: x
            .command
            .unwrap_or_else(|| vec![defaults::LINUX_COMMAND.to_string()]),
        network: x.network.filter(|n| !n.is_empty()),
        common: linux_common,
    };

    let vm_present = raw.vm_macos.is_some();
    let v = raw.vm_macos.unwrap_or_default();
    let vm_common = build_common(
        ProviderKind::VmMacos,
        v.enabled,
        v.labels,
        v.max_concurrent,
        v.restart,
        CommonDefaults {
            enabled: false,
            labels: &["self-hosted", "macos", "arm64"],
            max_concurrent: defaults::MACOS_MAX_VMS,
        },
        vm_present,
        p,
    );
    if vm_common.enabled && vm_common.max_concurrent > defaults::MACOS_MAX_VMS {
        p.push(
            "providers.vm_macos.max_concurrent",
            format!(
                "{} exceeds {}: Apple's licence and Virtualization.framework allow two macOS guests per host",
                vm_common.max_concurrent,
                defaults::MACOS_MAX_VMS
            ),
        );
    }
    let vm_macos = VmMacosConfig {
        base_image: non_empty(
            "providers.vm_macos.base_image",
            v.base_image,
            defaults::MACOS_BASE_IMAGE,
            p,
        ),
        ssh_user: non_empty("providers.vm_macos.ssh_user", v.ssh_user, "admin", p),
        runner_command: non_empty(
            "providers.vm_macos.runner_command",
            v.runner_command,
            "~/actions-runner/run.sh",
            p,
        ),
        tart_path: PathBuf::from(v.tart_path.unwrap_or_else(|| "tart".into())),
        ssh_path: PathBuf::from(v.ssh_path.unwrap_or_else(|| "ssh".into())),
        boot_timeout: positive_duration(
            "providers.vm_macos.boot_timeout",
            v.boot_timeout,
            defaults::MACOS_BOOT_TIMEOUT,
            p,
        ),
        common: vm_common,
    };

    let native_macos = build_process(
        ProviderKind::NativeMacos,
        raw.native_macos,
        CommonDefaults {
            enabled: false,
            labels: &["self-hosted", "macos", "arm64", "native"],
            max_concurrent: 1,
        },
        state_dir.join("native-work"),
        as_root,
        p,
    );

    let providers = ProvidersConfig {
        local,
        linux,
        vm_macos,
        native_macos,
    };
    if providers.enabled().is_empty() {
        p.push(
            "providers",
            "no provider is enabled: enable at least one of providers.local, providers.linux, \
             providers.vm_macos, providers.native_macos",
        );
    }
    providers
}

/// A process pool (`local`, `native_macos`): exactly one of `runner_dir` and `command`.
fn build_process(
    kind: ProviderKind,
    raw: Option<RawProcess>,
    d: CommonDefaults,
    default_work_root: PathBuf,
    as_root: bool,
    p: &mut Problems,
) -> ProcessPoolConfig {
    let present = raw.is_some();
    let r = raw.unwrap_or_default();
    let common = build_common(
        kind,
        r.enabled,
        r.labels,
        r.max_concurrent,
        r.restart,
        d,
        present,
        p,
    );
    let key = |k: &str| format!("providers.{kind}.{k}");
    let work_root = absolute_or_default(&key("work_root"), r.work_root, default_work_root, p);
    let runner_dir = r.runner_dir.filter(|s| !s.trim().is_empty());
    let command = r.command.filter(|s| !s.trim().is_empty());
    let program = match (runner_dir, command) {
        (Some(dir), None) => {
            let dir = PathBuf::from(dir);
            if common.enabled {
                if !dir.is_absolute() {
                    p.push(
                        key("runner_dir"),
                        format!("{} must be an absolute path", dir.display()),
                    );
                } else if work_root.starts_with(&dir) {
                    p.push(
                        key("work_root"),
                        format!(
                            "{} is inside runner_dir {}: each job's copy of the install would \
                             copy the copies",
                            work_root.display(),
                            dir.display()
                        ),
                    );
                }
            }
            RunnerProgram::Install(dir)
        }
        (None, Some(command)) => RunnerProgram::Command(PathBuf::from(command)),
        (Some(dir), Some(_)) => {
            if common.enabled {
                p.push(
                    key("runner_dir"),
                    "set runner_dir or command, not both: runner_dir is an actions/runner \
                     install (each job runs run.sh from its own copy), command an executable \
                     that keeps no state beside itself",
                );
            }
            RunnerProgram::Install(PathBuf::from(dir))
        }
        (None, None) => {
            if common.enabled {
                p.push(
                    key("runner_dir"),
                    "an enabled process provider needs runner_dir (an actions/runner install) \
                     or command (an executable that keeps no state beside itself)",
                );
            }
            RunnerProgram::Command(PathBuf::new())
        }
    };
    let run_as: Vec<String> = match r.run_as {
        None => Vec::new(),
        Some(RawUsers::One(user)) => vec![user],
        Some(RawUsers::Many(users)) => users,
    }
    .into_iter()
    .filter(|u| !u.trim().is_empty())
    .collect();
    if common.enabled {
        if let Some(dup) = run_as
            .iter()
            .enumerate()
            .find_map(|(i, u)| run_as[..i].contains(u).then_some(u))
        {
            p.push(key("run_as"), format!("lists the user {dup} twice"));
        }
        if run_as.len() > 1 && run_as.len() < common.max_concurrent {
            p.push(
                key("run_as"),
                format!(
                    "lists {} users for max_concurrent = {}: each concurrent runner needs its \
                     own user (list at least {}, or one user that all runners share)",
                    run_as.len(),
                    common.max_concurrent,
                    common.max_concurrent
                ),
            );
        }
    }
    let allow_root = r.allow_root.unwrap_or(false);
    if common.enabled && as_root && run_as.is_empty() && !allow_root {
        // The actions runner itself refuses to run as root unless RUNNER_ALLOW_RUNASROOT is set
        // (actions/runner src/Misc/layoutroot/run-helper.sh.template); a job as root could read the daemon's
        // token, config and store.
        p.push(
            key("run_as"),
            "the daemon runs as root, so its runners would too, with the daemon's GitHub \
             credential and state in reach of every job: set run_as to a dedicated user, or \
             allow_root = true to accept that",
        );
    }
    ProcessPoolConfig {
        program,
        args: r.args.unwrap_or_default(),
        work_root,
        run_as,
        allow_root,
        common,
    }
}

fn container_limits(x: &RawLinux, p: &mut Problems) -> ContainerLimits {
    let d = ContainerLimits::default();
    let memory = match x.memory.as_deref() {
        None => d.memory,
        Some(text) => match parse_size(text) {
            Some(n) if n >= 64 * 1024 * 1024 => n as u64,
            _ => {
                p.push(
                    "providers.linux.memory",
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
                "providers.linux.pids_limit",
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
                "providers.linux.cpus",
                format!("{c} must be above 0 (and at most 1024)"),
            );
            None
        }
    };
    let cap_add = x.cap_add.clone().unwrap_or(d.cap_add);
    for (i, cap) in cap_add.iter().enumerate() {
        if cap.is_empty() || !cap.chars().all(|c| c.is_ascii_uppercase() || c == '_') {
            p.push(
                format!("providers.linux.cap_add[{i}]"),
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
