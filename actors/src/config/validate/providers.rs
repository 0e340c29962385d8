//! `[providers.*]`: the keys every pool takes, its restart policy, and each kind's own keys.

use std::path::{Path, PathBuf};

use super::{
    Environment, HostKeys, PoolConfig, PoolName, PoolSpec, Problems, ProcessPoolConfig,
    ProviderCommon, ProviderKind, ProvidersConfig, RawCommand, RawPool, RawProviders, RawRestart,
    RawUsers, RestartConfig, RestartPolicy, RunnerProgram, VmMacosConfig, count, defaults,
    duration, non_empty, positive_duration,
};

/// What a pool of a kind has when its table leaves a key out.
struct KindDefaults {
    labels: &'static [&'static str],
    max_concurrent: usize,
}

fn kind_defaults(kind: ProviderKind) -> KindDefaults {
    match kind {
        ProviderKind::Local => KindDefaults {
            labels: &["self-hosted", "linux", "x64"],
            max_concurrent: 2,
        },
        ProviderKind::Linux => KindDefaults {
            labels: &["self-hosted", "linux", "x64"],
            max_concurrent: 4,
        },
        ProviderKind::VmMacos => KindDefaults {
            labels: &["self-hosted", "macos", "arm64"],
            max_concurrent: defaults::MACOS_MAX_VMS,
        },
        ProviderKind::NativeMacos => KindDefaults {
            labels: &["self-hosted", "macos", "arm64", "native"],
            max_concurrent: 1,
        },
        ProviderKind::LinuxVm => KindDefaults {
            labels: &["self-hosted", "linux", "x64", "vm"],
            max_concurrent: 2,
        },
    }
}

/// The longest pool name: runner names carry it, and GitHub keeps them short.
const MAX_POOL_NAME: usize = 32;

fn build_common(
    key: &str,
    kind: ProviderKind,
    r: &mut RawPool,
    env: &Environment,
    secrets: &std::collections::BTreeSet<String>,
    p: &mut Problems,
) -> ProviderCommon {
    let d = kind_defaults(kind);
    // A table that is written down is meant to be used: `enabled` defaults to true.
    let enabled = r.enabled.unwrap_or(true);
    let labels = r
        .labels
        .take()
        .unwrap_or_else(|| d.labels.iter().map(|s| s.to_string()).collect());
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
        r.max_concurrent,
        d.max_concurrent,
        1,
        p,
    );
    ProviderCommon {
        enabled,
        labels,
        max_concurrent,
        restart: build_restart(&format!("{key}.restart"), r.restart.take(), p),
        env: super::runner_env::build_env(&format!("{key}.env"), r.env.take(), env, secrets, p),
        targets: r.targets.take(),
        warm: super::warm::build_warm(
            key,
            super::warm::RawWarmKeys {
                warm: r.warm.take(),
                max_age: r.warm_max_age.take(),
                mode: r.warm_mode.take(),
            },
            max_concurrent,
            p,
        ),
        egress: super::egress::build_egress(key, kind, r.egress.take(), p),
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

/// A pool's kind: its `kind` key, else its table's name when that is a kind; `None` (said)
/// when neither tells, or the `kind` key names no kind.
fn pool_kind(
    key: &str,
    name: &str,
    kind: Option<String>,
    p: &mut Problems,
) -> Option<ProviderKind> {
    let named_kind = ProviderKind::ALL.into_iter().find(|k| k.as_str() == name);
    match (kind, named_kind) {
        (Some(text), named) => match ProviderKind::ALL.into_iter().find(|k| k.as_str() == text) {
            Some(kind) => {
                if let Some(named) = named.filter(|n| *n != kind) {
                    p.push(
                        format!("{key}.kind"),
                        format!(
                            "a table named {named} is the {named} pool; name this {text} \
                             pool otherwise"
                        ),
                    );
                }
                Some(kind)
            }
            None => {
                p.push(
                    format!("{key}.kind"),
                    format!(
                        "{text:?} must be \"local\", \"linux\", \"vm_macos\", \
                         \"native_macos\" or \"linux_vm\""
                    ),
                );
                None
            }
        },
        (None, Some(kind)) => Some(kind),
        (None, None) => {
            p.push(
                format!("{key}.kind"),
                "required for a pool not named after its kind: \"local\", \"linux\", \
                 \"vm_macos\", \"native_macos\" or \"linux_vm\"",
            );
            None
        }
    }
}

pub(super) fn build_providers(
    raw: RawProviders,
    state_dir: &Path,
    env: &Environment,
    secrets: &std::collections::BTreeSet<String>,
    p: &mut Problems,
) -> ProvidersConfig {
    let mut pools = Vec::new();
    for (name, mut r) in raw {
        let key = format!("providers.{name}");
        check_pool_name(&key, &name, p);
        let Some(kind) = pool_kind(&key, &name, r.kind.take(), p) else {
            continue;
        };
        if let Some(why) = env.host_os.refuses(kind) {
            p.push(format!("{key}.kind"), why);
        }
        for (k, kinds) in r.kind_keys() {
            if !kinds.contains(&kind.as_str()) {
                let of = kinds.join(", ");
                let why = format!("unknown key for a {kind} pool (it is a key of {of})");
                p.push(format!("{key}.{k}"), why);
            }
        }
        let common = build_common(&key, kind, &mut r, env, secrets, p);
        let enabled = common.enabled;
        let runners = crate::config::StateConfig::at(state_dir).runner_dir();
        let max = common.max_concurrent;
        let spec = match kind {
            ProviderKind::Local => {
                PoolSpec::Local(build_process(&key, r, enabled, max, runners, env, p))
            }
            ProviderKind::NativeMacos => {
                let root = runners.join("native");
                PoolSpec::NativeMacos(build_process(&key, r, enabled, max, root, env, p))
            }
            ProviderKind::Linux => {
                PoolSpec::Linux(super::containers::build_linux(&key, r, enabled, p))
            }
            ProviderKind::VmMacos => PoolSpec::VmMacos(build_vm(&key, r, &common, p)),
            ProviderKind::LinuxVm => PoolSpec::LinuxVm(super::linux_vm::build_linux_vm(&key, r, p)),
        };
        pools.push(PoolConfig {
            name: PoolName::new(&name),
            common,
            spec,
        });
    }
    let providers = ProvidersConfig { pools };
    check_pool_names(&providers, p);
    check_macos_guests(&providers, p);
    refuse_host_paths(&providers, state_dir, p);
    if providers.enabled().is_empty() {
        p.push(
            "providers",
            "no provider is enabled: add a [providers.NAME] table (e.g. providers.local, \
             providers.linux, providers.vm_macos, providers.native_macos, providers.linux_vm)",
        );
    }
    providers
}

/// The host's macOS guests at once, over every enabled `vm_macos` pool: the framework
/// refuses a third, whichever pool asks, so their `max_concurrent` may not add up past two.
fn check_macos_guests(providers: &ProvidersConfig, p: &mut Problems) {
    let mut total = 0;
    for pool in providers.pools.iter().filter(|x| x.common.enabled) {
        if !matches!(pool.spec, PoolSpec::VmMacos(_)) {
            continue;
        }
        let before = total;
        total += pool.common.max_concurrent;
        // Said once: by the pool that goes past two (a pool past two alone says so itself).
        if before <= defaults::MACOS_MAX_VMS
            && total > defaults::MACOS_MAX_VMS
            && pool.common.max_concurrent <= defaults::MACOS_MAX_VMS
        {
            p.push(
                format!("providers.{}.max_concurrent", pool.name),
                format!(
                    "the vm_macos pools add up to {total} VMs at once: Apple's licence and \
                     Virtualization.framework allow {} macOS guests per host, over all pools",
                    defaults::MACOS_MAX_VMS
                ),
            );
        }
    }
}

/// A pool's name: up to [`MAX_POOL_NAME`] letters, digits, '-' and '_' (runner names carry it).
fn check_pool_name(key: &str, name: &str, p: &mut Problems) {
    let fits = |c: char| c.is_ascii_alphanumeric() || c == '-' || c == '_';
    if name.is_empty() || name.len() > MAX_POOL_NAME || !name.chars().all(fits) {
        p.push(
            key,
            format!(
                "{name:?} is not a pool name: up to {MAX_POOL_NAME} letters, digits, '-' \
                 and '_' (runner names carry it)"
            ),
        );
    }
}

/// Pools whose runner names would share a prefix: each pool reaps leftovers by its prefix
/// (containers on its socket, directories in its work root, VMs in tart, registrations on
/// GitHub), so one would remove the other's runners.
fn check_pool_names(providers: &ProvidersConfig, p: &mut Problems) {
    for (i, a) in providers.pools.iter().enumerate() {
        for b in &providers.pools[..i] {
            if a.name.name_part() == b.name.name_part() {
                p.push(
                    format!("providers.{}", a.name),
                    format!(
                        "names its runners like pool {} ({}-...): the two would reap each \
                         other's runners; rename one",
                        b.name,
                        b.name.name_part()
                    ),
                );
            }
        }
    }
}

fn build_vm(key: &str, v: RawPool, common: &ProviderCommon, p: &mut Problems) -> VmMacosConfig {
    let k = |name: &str| format!("{key}.{name}");
    if common.enabled && common.max_concurrent > defaults::MACOS_MAX_VMS {
        p.push(
            k("max_concurrent"),
            format!(
                "{} exceeds {}: Apple's licence and Virtualization.framework allow two macOS guests per host",
                common.max_concurrent,
                defaults::MACOS_MAX_VMS
            ),
        );
    }
    let host_keys = match v.host_keys.as_deref() {
        None | Some("per_vm") => HostKeys::PerVm,
        Some("image") => HostKeys::Image,
        Some(other) => {
            p.push(
                k("host_keys"),
                format!("{other:?} must be \"per_vm\" or \"image\""),
            );
            HostKeys::PerVm
        }
    };
    let run_args = v.run_args.unwrap_or_default();
    for arg in &run_args {
        if !arg.starts_with("--") || arg.contains(char::is_whitespace) {
            p.push(
                k("run_args"),
                format!(
                    "{arg:?} is not an option of `tart run` (one `--name` or `--name=value` each)"
                ),
            );
        } else if let Err(why) = ephemer_decide::provision::tart_cli::check_run_arg(arg) {
            p.push(k("run_args"), why);
        }
    }
    VmMacosConfig {
        host_keys,
        run_args,
        base_image: non_empty(
            &k("base_image"),
            v.base_image,
            defaults::MACOS_BASE_IMAGE,
            p,
        ),
        ssh_user: non_empty(&k("ssh_user"), v.ssh_user, "admin", p),
        runner_command: non_empty(
            &k("runner_command"),
            v.runner_command,
            "~/actions-runner/run.sh",
            p,
        ),
        tart_path: PathBuf::from(v.tart_path.unwrap_or_else(|| "tart".into())),
        ssh_path: PathBuf::from(v.ssh_path.unwrap_or_else(|| "ssh".into())),
        boot_timeout: positive_duration(
            &k("boot_timeout"),
            v.boot_timeout,
            defaults::MACOS_BOOT_TIMEOUT,
            p,
        ),
    }
}

/// A process pool (`local`, `native_macos`): exactly one of `runner_dir` and `command`.
fn build_process(
    key: &str,
    r: RawPool,
    enabled: bool,
    max_concurrent: usize,
    default_work_root: PathBuf,
    env: &crate::config::Environment,
    p: &mut Problems,
) -> ProcessPoolConfig {
    let k = |name: &str| format!("{key}.{name}");
    let work_root = absolute_or_default(&k("work_root"), r.work_root, default_work_root, p);
    let program = process_program(key, r.runner_dir, r.command, enabled, &work_root, p);
    let run_as: Vec<String> = match r.run_as {
        None => Vec::new(),
        Some(RawUsers::One(user)) => vec![user],
        Some(RawUsers::Many(users)) => users,
    }
    .into_iter()
    .filter(|u| !u.trim().is_empty())
    .collect();
    let allow_root = r.allow_root.unwrap_or(false);
    let allow_same_user = r.allow_same_user.unwrap_or(false) || allow_root;
    if enabled {
        check_run_as(&k("run_as"), &run_as, max_concurrent, p);
        check_who_runs(&k("run_as"), &run_as, allow_root, allow_same_user, env, p);
    }
    ProcessPoolConfig {
        program,
        args: r.args.unwrap_or_default(),
        work_root,
        run_as,
        allow_root,
        allow_same_user,
    }
}

/// `runner_dir` or `command` (exactly one; neither: the daemon-managed install, if
/// `runner.auto_update` allows, checked once `[runner]` is read).
fn process_program(
    key: &str,
    runner_dir: Option<String>,
    command: Option<RawCommand>,
    enabled: bool,
    work_root: &Path,
    p: &mut Problems,
) -> RunnerProgram {
    let k = |name: &str| format!("{key}.{name}");
    let runner_dir = runner_dir.filter(|s| !s.trim().is_empty());
    let command = match command {
        None => None,
        Some(RawCommand::One(c)) => Some(c).filter(|s| !s.trim().is_empty()),
        Some(RawCommand::Many(_)) => {
            p.push(
                k("command"),
                "must be one executable path (its arguments go in args)",
            );
            None
        }
    };
    match (runner_dir, command) {
        (Some(dir), None) => {
            let dir = PathBuf::from(dir);
            if enabled && !dir.is_absolute() {
                p.push(
                    k("runner_dir"),
                    format!("{} must be an absolute path", dir.display()),
                );
            } else if enabled && work_root.starts_with(&dir) {
                p.push(
                    k("work_root"),
                    format!(
                        "{} is inside runner_dir {}: each job's copy of the install would \
                         copy the copies",
                        work_root.display(),
                        dir.display()
                    ),
                );
            }
            RunnerProgram::Install(dir)
        }
        (None, Some(command)) => RunnerProgram::Command(PathBuf::from(command)),
        (Some(dir), Some(_)) => {
            if enabled {
                p.push(
                    k("runner_dir"),
                    "set runner_dir or command, not both: runner_dir is an actions/runner \
                     install (each job runs run.sh from its own copy), command an executable \
                     that keeps no state beside itself",
                );
            }
            RunnerProgram::Install(PathBuf::from(dir))
        }
        (None, None) => RunnerProgram::Managed,
    }
}

/// `run_as` (key `key`): no user twice, and one per concurrent runner when there are several.
fn check_run_as(key: &str, run_as: &[String], max_concurrent: usize, p: &mut Problems) {
    if let Some(dup) = run_as
        .iter()
        .enumerate()
        .find_map(|(i, u)| run_as[..i].contains(u).then_some(u))
    {
        p.push(key, format!("lists the user {dup} twice"));
    }
    if run_as.len() > 1 && run_as.len() < max_concurrent {
        p.push(
            key,
            format!(
                "lists {} users for max_concurrent = {}: each concurrent runner needs its \
                 own user (list at least {}, or one user that all runners share)",
                run_as.len(),
                max_concurrent,
                max_concurrent
            ),
        );
    }
}

/// Who the jobs run as (key `key`): never the daemon's own user, nor root, without the
/// explicit yes (`allow_same_user`, `allow_root`).
fn check_who_runs(
    key: &str,
    run_as: &[String],
    allow_root: bool,
    allow_same_user: bool,
    env: &crate::config::Environment,
    p: &mut Problems,
) {
    if !env.as_root && run_as.is_empty() && !allow_same_user {
        // A job as the daemon's own uid can read the admin token, the store, the config and
        // its key files, signal the daemon and edit its pid files.
        p.push(
            key,
            "jobs would run as the daemon's own user, with its admin token, state, config and \
             credentials in reach of every job: set run_as to a dedicated user (the daemon then \
             needs root, or sudo rights to it), or allow_same_user = true to accept that",
        );
    }
    // A user named in run_as is trusted with nothing: root, and the daemon's own user, would
    // hand every job the daemon's credential and state.
    for user in run_as {
        let uid = env
            .uid_of(user)
            .filter(|_| !crate::weaken::off("uid-check"));
        if (user == "root" || user == "0") && !allow_root {
            p.push(
                key,
                "lists root: its jobs would run as root, with the daemon's GitHub credential \
                 and state in reach; list dedicated users, or allow_root = true to accept that",
            );
        } else if uid == Some(0) && !allow_root {
            // `useradd -o -u 0`: root under another name, judged by its uid.
            p.push(
                key,
                format!(
                    "lists {user}, whose uid is 0: root under another name, with the daemon's \
                     GitHub credential and state in reach of its jobs; list dedicated users, \
                     or allow_root = true to accept that"
                ),
            );
        } else if env.daemon_user.as_deref() == Some(user.as_str()) && !allow_same_user {
            p.push(
                key,
                format!(
                    "lists {user}, the daemon's own user: its jobs would reach the daemon's \
                     admin token, state, config and credentials; list dedicated users, or \
                     allow_same_user = true to accept that"
                ),
            );
        }
    }
    if env.as_root && run_as.is_empty() && !allow_root {
        // The actions runner itself refuses to run as root unless RUNNER_ALLOW_RUNASROOT is set
        // (actions/runner src/Misc/layoutroot/run-helper.sh.template); a job as root could read
        // the daemon's token, config and store.
        p.push(
            key,
            "the daemon runs as root, so its runners would too, with the daemon's GitHub \
             credential and state in reach of every job: set run_as to a dedicated user, or \
             allow_root = true to accept that",
        );
    }
}

/// Each container pool's binds, unless it says `allow_host_paths = true`: none may reach the
/// host's own trees, the engine's socket, the daemon's state and work, any process pool's
/// work root, or (read-write) an operator's runner install ([`super::host_paths`]).
fn refuse_host_paths(providers: &ProvidersConfig, state_dir: &Path, p: &mut Problems) {
    for pool in &providers.pools {
        let Some(l) = pool.linux().filter(|l| !l.mounts.allow_host_paths) else {
            continue;
        };
        let guarded = super::host_paths::guarded_for(providers, state_dir, &l.socket);
        let key = format!("providers.{}", pool.name);
        super::host_paths::refuse_binds(&key, &l.mounts.volumes, &guarded, p);
    }
}
