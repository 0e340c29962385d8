//! How a process runner is spawned: its argv (the gate, its namespace, `sudo` to its user,
//! the program), its environment (nothing of the daemon's but a few variables; values never on
//! argv), its output to its log.

use std::{
    ffi::OsString,
    path::{Path, PathBuf},
    process::Stdio,
};

use tokio::process::Command;

use super::{ProvisionError, RunnerSpec, process::ProcessBackend, procgroup, spawn::spawn_error};
use crate::{config::RunnerProgram, vocab::runner_vars};

/// Variables a runner inherits from the daemon; everything else is dropped. `HOME` and `TMPDIR`
/// are the runner's own, inside its directory.
const INHERITED_ENV: [&str; 5] = ["PATH", "USER", "LANG", "LC_ALL", "TZ"];

impl ProcessBackend {
    pub(super) fn command(
        &self,
        spec: &RunnerSpec,
        jit_config: &str,
        dir: &Path,
        user: Option<&str>,
        log: std::fs::File,
        entered: Option<&[OsString]>,
    ) -> std::io::Result<Command> {
        let s = &self.s;
        let program = match &s.program {
            RunnerProgram::Install(_) | RunnerProgram::Managed => dir.join("run.sh"),
            RunnerProgram::Command(command) => command.clone(),
        };
        let (home, tmp) = (dir.join("_home"), dir.join("_tmp"));
        let extra = s.env.on_host();
        // The runner enters its cgroup first; one that cannot be entered leaves the
        // process-group kill alone to work.
        let mut argv = procgroup::gated(self.cgroup(&spec.name).map(|c| c.procs()));
        // Then into its network namespace, as root, before any user change.
        if let Some(entered) = entered {
            argv.extend(entered.iter().cloned());
        }
        if let Some(user) = user {
            // sudo resets HOME to the user's own; `env` sets the job's after it. Values travel
            // in the environment, never on argv (where any user could read them).
            let mut keep = format!(
                "ACTIONS_RUNNER_INPUT_JITCONFIG,RUNNER_MANUALLY_TRAP_SIG,{}",
                runner_vars::VERSION_EXIT
            );
            for (name, _) in &extra {
                keep.push(',');
                keep.push_str(name);
            }
            argv.extend(["sudo", "-n", "-u", user].map(OsString::from));
            argv.push(format!("--preserve-env={keep}").into());
            argv.extend(["--", "env"].map(OsString::from));
            argv.push(env_assignment("HOME", &home));
            argv.push(env_assignment("TMPDIR", &tmp));
        }
        argv.push(program.into_os_string());
        argv.extend(s.args.iter().map(OsString::from));
        let mut cmd = Command::new(&argv[0]);
        cmd.args(&argv[1..])
            .current_dir(dir)
            .env_clear()
            .envs(
                INHERITED_ENV
                    .iter()
                    .filter_map(|k| std::env::var_os(k).map(|v| (k, v))),
            )
            .envs(extra)
            .env("HOME", &home)
            .env("TMPDIR", &tmp)
            .env("ACTIONS_RUNNER_INPUT_JITCONFIG", jit_config)
            .env("RUNNER_MANUALLY_TRAP_SIG", "1")
            .env(runner_vars::VERSION_EXIT, "1")
            .stdin(Stdio::piped())
            .stdout(log.try_clone()?)
            .stderr(log)
            .process_group(0)
            .kill_on_drop(false);
        if user.is_none() && nix::unistd::geteuid().is_root() {
            cmd.env("RUNNER_ALLOW_RUNASROOT", "1");
        }
        Ok(cmd)
    }

    /// Spawns `spec`'s runner (gated: it waits for its pid file), its output to its log.
    pub(super) async fn spawn_runner(
        &self,
        spec: &RunnerSpec,
        jit: &str,
        dir: &Path,
        user: Option<&str>,
        entered: Option<Vec<std::ffi::OsString>>,
    ) -> Result<(tokio::process::Child, PathBuf), ProvisionError> {
        let fail =
            |what: &str, e: std::io::Error| ProvisionError::HostUnavailable(format!("{what}: {e}"));
        let log_path = self.s.log_dir.join(format!("{}.log", spec.name));
        // Appended to, so the daemon can cut it while the runner writes (see `watch_log`).
        let log = crate::harden::private_file(&log_path, true)
            .map_err(|e| fail(&format!("cannot create {}", log_path.display()), e))?;
        let child = self
            .command(spec, jit, dir, user, log, entered.as_deref())
            .and_then(|mut c| c.spawn())
            .map_err(|e| {
                let program = self.s.program.executable();
                spawn_error(&format!("cannot start {}", program.display()), &e)
            })?;
        Ok((child, log_path))
    }
}

/// `NAME=value` for `env`.
fn env_assignment(name: &str, value: &Path) -> std::ffi::OsString {
    let mut a = std::ffi::OsString::from(format!("{name}="));
    a.push(value);
    a
}
