//! `doctor`'s checks of each pool's host, and of this host: the state directory and the
//! listeners' ports.

use ephemer_actors_core::{
    config::Config,
    provision::{
        Finding,
        build::{backend, pool_settings},
    },
};

use super::Check;

/// Free space in `state.dir` under which doctor warns.
const LOW_DISK: u64 = 1024 * 1024 * 1024;

/// Each enabled pool's own host check, and what `doctor` adds for its kind.
pub async fn pool_checks(config: &Config) -> Vec<Check> {
    let install_id = std::fs::read_to_string(config.state.dir.join("install-id"))
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "doctor".into());
    let mut out = Vec::new();
    // What serve would find on disk (doctor does not download).
    let managed = ephemer_actors_core::release::installs::ManagedInstalls::for_config(config);
    if let Some(installs) = &managed {
        installs.settle(None);
    }
    for pool in config.providers.enabled() {
        let name = format!("pool.{}", pool.name);
        // The CA bundle runners get, where serve writes it (the path probe reads it as each
        // run_as user).
        let ca_bundle = ephemer_actors_core::provision::runner_env::write_ca_bundle(config)
            .ok()
            .flatten();
        let settings = pool_settings(config, pool, &install_id, ca_bundle, std::env::temp_dir());
        let on_managed = pool
            .process()
            .is_some_and(|p| p.program == ephemer_actors_core::config::RunnerProgram::Managed);
        if on_managed && managed.as_ref().and_then(|m| m.current()).is_none() {
            out.push(Check::ok(
                &name,
                "no runner install yet: serve downloads, verifies and installs the release at \
                 start (runner.auto_update)",
            ));
            continue;
        }
        let backend = match backend(settings, managed.as_ref()) {
            Ok(b) => b,
            Err(e) => {
                out.push(Check::fail(&name, e.to_string(), "fix the pool's settings"));
                continue;
            }
        };
        match backend.probe().await {
            Ok(()) => out.push(Check::ok(
                &name,
                format!("{} host check passes", pool.kind()),
            )),
            Err(e) => out.push(Check::fail(
                &name,
                e.to_string(),
                "see the cause; docs/providers.md lists what each pool needs",
            )),
        }
        for finding in backend.doctor_checks().await {
            out.push(match finding {
                Finding::Ok(d) => Check::ok(&name, d),
                Finding::Warn(d) => Check::warn(&name, d, "see docs/providers.md"),
                Finding::Fail(d) => Check::fail(&name, d, "see the message"),
            });
        }
    }
    out
}

/// The state directory (writable, with room) and the listeners' ports.
pub fn host_checks(config: &Config) -> Vec<Check> {
    let mut out = listener_checks(config);
    let dir = &config.state.dir;
    let probe = dir.join(".doctor-probe");
    if !dir.exists() {
        let parent = dir.parent().filter(|p| p.exists());
        out.push(match parent {
            Some(p) => Check::ok(
                "state.dir",
                format!(
                    "{} does not exist yet: serve creates it (in {}); the unit's StateDirectory does too",
                    dir.display(),
                    p.display()
                ),
            ),
            None => Check::fail(
                "state.dir",
                format!("neither {} nor its parent exists", dir.display()),
                "create it, owned by the daemon's user",
            ),
        });
        return out;
    }
    let writable = std::fs::write(&probe, b"probe").and_then(|()| std::fs::remove_file(&probe));
    match writable {
        Err(e) => out.push(Check::fail(
            "state.dir",
            format!("{} is not writable: {e}", dir.display()),
            "create it, owned by the daemon's user (the unit's StateDirectory does)",
        )),
        Ok(()) => match nix::sys::statvfs::statvfs(dir) {
            Ok(s) => {
                // u64 on Linux, narrower elsewhere.
                #[allow(clippy::unnecessary_cast)]
                let free = s.blocks_available() as u64 * s.fragment_size() as u64;
                let gib = free as f64 / (1024.0 * 1024.0 * 1024.0);
                if free < LOW_DISK {
                    out.push(Check::warn(
                        "state.dir",
                        format!("{}: only {gib:.2} GiB free", dir.display()),
                        "logs, work copies and the store live here: free some space",
                    ));
                } else {
                    out.push(Check::ok(
                        "state.dir",
                        format!("{}: writable, {gib:.1} GiB free", dir.display()),
                    ));
                }
            }
            Err(e) => out.push(Check::warn(
                "state.dir",
                format!("cannot read free space: {e}"),
                "none needed",
            )),
        },
    }
    out.extend(unremoved_checks(dir));
    out
}

/// The trees teardowns could not remove (a mount inside a job's directory, a tree that took
/// longer than a teardown's budget), as the daemon wrote them down.
fn unremoved_checks(state_dir: &std::path::Path) -> Vec<Check> {
    ephemer_actors_core::provision::unremovable::recorded(state_dir)
        .into_iter()
        .map(|(pool, path, why)| {
            Check::warn(
                format!("pool.{pool}"),
                format!(
                    "{} is left after its runner's teardown: {why}",
                    path.display()
                ),
                "the daemon tries it again after each later teardown of the pool and at start; \
                 if it stays, unmount what is mounted in it and remove it by hand",
            )
        })
        .collect()
}

/// Whether the listeners' ports are free (in use is fine while the daemon runs).
fn listener_checks(config: &Config) -> Vec<Check> {
    let mut out = Vec::new();
    let mut listeners = vec![("webhook.listen", config.webhook.listen)];
    listeners.extend(config.metrics.listen.map(|a| ("metrics.listen", a)));
    listeners.extend(config.admin.listen.tcp().map(|a| ("admin.listen", a)));
    for (key, addr) in listeners {
        match std::net::TcpListener::bind(addr) {
            Ok(_) => out.push(Check::ok(key, format!("{addr} is free"))),
            Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => out.push(Check::warn(
                key,
                format!("{addr} is in use"),
                "fine if the daemon is running; otherwise another program holds the port",
            )),
            Err(e) => out.push(Check::fail(
                key,
                format!("cannot bind {addr}: {e}"),
                "choose another address",
            )),
        }
    }
    out
}
