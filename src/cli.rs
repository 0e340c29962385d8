//! The command line: `serve`, `check-config`, and their shared `--config` argument.
//!
//! This is the binary's edge: `anyhow` is allowed here and nowhere in the library. Exit codes
//! are the documented ones (docs/operations.md): 0 ok, 1 runtime failure, 2 usage or config error.

use std::{path::PathBuf, process::ExitCode};

use clap::{Parser, Subcommand};
use ephemer_actors_core::config::{Config, ConfigErrors, Environment};

/// `--version`: the package version and the commit it was built from.
pub const VERSION: &str = concat!(env!("CARGO_PKG_VERSION"), " (", env!("EPHEMER_COMMIT"), ")");

/// Exit code for usage and configuration errors.
const EXIT_CONFIG: u8 = 2;
/// Exit code for failures while running.
pub(crate) const EXIT_RUNTIME: u8 = 1;

/// A fresh, disposable GitHub Actions runner for every job.
#[derive(Debug, Parser)]
#[command(name = "ephemer-actors", version = VERSION, about, long_about = None)]
struct Cli {
    /// Path of the TOML config file.
    #[arg(
        long,
        short = 'c',
        global = true,
        env = "EPHEMER_CONFIG",
        value_name = "PATH"
    )]
    config: Option<PathBuf>,
    #[command(subcommand)]
    command: Command,
}

/// `--config` when neither the flag nor `EPHEMER_CONFIG` names one: `/etc` on Linux,
/// `/usr/local/etc` on a Mac (where `/etc` belongs to the system).
pub const DEFAULT_CONFIG: &str = if cfg!(target_os = "macos") {
    "/usr/local/etc/ephemer-actors/config.toml"
} else {
    "/etc/ephemer-actors/config.toml"
};

/// The config file a command reads, and whether the operator named it.
#[derive(Debug, Clone)]
pub struct ConfigPath {
    /// The path.
    pub path: PathBuf,
    /// Named by `--config` or `EPHEMER_CONFIG` (not the default).
    pub explicit: bool,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the daemon until SIGTERM or SIGINT, then drain and exit 0.
    Serve,
    /// Validate a config file; print every problem with its key path (exit 0 valid, 2 invalid).
    CheckConfig,
    /// Check config, credentials, webhook, pools and host: one ok/warn/fail line each, with
    /// what to do (exit 0 nothing failed, 1 something did, 2 invalid config).
    Doctor {
        /// Print the report as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Show a running daemon's status: capacity per pool, retry queue, rate budget (exit 1
    /// when a pool is down or the daemon is shutting down).
    Status(crate::ctl::Target),
    /// List the jobs a running daemon knows, or show one job's timeline (jobs ID).
    Jobs {
        /// A job id, or its URL (https://github.com/OWNER/REPO/actions/runs/RUN/job/ID): show
        /// every decision taken about it.
        #[arg(value_parser = crate::ctl::job_id)]
        id: Option<u64>,
        /// Only jobs in this state (pending, claiming, retrying, active, ...).
        #[arg(long)]
        state: Option<String>,
        /// Only jobs of this repo.
        #[arg(long)]
        repo: Option<String>,
        #[command(flatten)]
        target: crate::ctl::Target,
    },
    /// Runner-minutes, jobs, failed claims and pickup per repo, pool or target, from the
    /// daemon's usage records (kept for state.usage_retention).
    Usage {
        /// How far back: 30d, 12h, 90days.
        #[arg(long, default_value = "30d")]
        since: String,
        /// What each line is per: repo, pool or target.
        #[arg(long, default_value = "repo", value_parser = usage_by)]
        by: ephemer_actors_core::usage::UsageBy,
        /// CSV, for a spreadsheet.
        #[arg(long)]
        csv: bool,
        #[command(flatten)]
        target: crate::ctl::Target,
    },
    /// The names a pool's jobs looked up (egress mode "audit" or "allow-list"), how often,
    /// and which its allow-list refuses: what an allow-list is written from.
    Egress {
        /// The pool (`[providers.NAME]`).
        #[arg(long)]
        pool: String,
        /// How far back: 7d, 12h.
        #[arg(long, default_value = "7d")]
        since: String,
        #[command(flatten)]
        target: crate::ctl::Target,
    },
    /// Stop claiming (running jobs continue; no new retries).
    Cordon(crate::ctl::Target),
    /// Resume claiming.
    Uncordon(crate::ctl::Target),
    /// Scale-set mode: list each pool's scale set, or delete one on GitHub.
    Scaleset {
        /// What to do.
        #[command(subcommand)]
        action: crate::scaleset::Action,
    },
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell) to stdout.
    Completions {
        /// The shell.
        shell: clap_complete::Shell,
    },
    /// Print the man page (roff) to stdout, e.g. ephemer-actors man > ephemer-actors.1
    Man,
    /// Stop claiming, like cordon; with --wait, return once no runner is left (for upgrades).
    Drain {
        /// Wait until the last running job has finished.
        #[arg(long)]
        wait: bool,
        /// Give up waiting after this long (exit 1), e.g. "30m".
        #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
        timeout: Option<std::time::Duration>,
        #[command(flatten)]
        target: crate::ctl::Target,
    },
    /// Run everything offline: a stand-in GitHub, signed webhooks, the local provisioner and
    /// stand-in runners, with a live view and a summary (exit 0 when every job ran).
    #[cfg(feature = "demo")]
    Demo(crate::demo::DemoArgs),
    /// The stand-in runner the demo starts (reads ACTIONS_RUNNER_INPUT_JITCONFIG; --root DIR
    /// names its install root, default the current directory).
    #[cfg(feature = "demo")]
    #[command(hide = true)]
    StandinRunner {
        /// Everything after the command, as a real `run.sh` passes it on.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
}

/// Parses the command line and runs the chosen command.
pub fn run() -> ExitCode {
    let cli = Cli::parse();
    let config_path = match cli.config {
        Some(path) => ConfigPath {
            path,
            explicit: true,
        },
        None => ConfigPath {
            path: DEFAULT_CONFIG.into(),
            explicit: false,
        },
    };
    match cli.command {
        #[cfg(feature = "demo")]
        Command::StandinRunner { args } => crate::standin::run(args),
        Command::Completions { shell } => {
            use clap::CommandFactory;
            let mut cmd = Cli::command();
            clap_complete::generate(shell, &mut cmd, "ephemer-actors", &mut std::io::stdout());
            ExitCode::SUCCESS
        }
        Command::Man => {
            use clap::CommandFactory;
            match clap_mangen::Man::new(Cli::command()).render(&mut std::io::stdout()) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("error: {e}");
                    ExitCode::from(EXIT_RUNTIME)
                }
            }
        }
        Command::Status(t) => ctl_result(crate::ctl::status(&t.with(&config_path))),
        Command::Jobs {
            id,
            state,
            repo,
            target,
        } => {
            let filter = crate::ctl::JobFilter { state, repo };
            ctl_result(crate::ctl::jobs(&target.with(&config_path), id, &filter))
        }
        Command::Usage {
            since,
            by,
            csv,
            target,
        } => ctl_result(crate::usage::usage(
            &target.with(&config_path),
            &since,
            by,
            csv,
        )),
        Command::Egress {
            pool,
            since,
            target,
        } => ctl_result(crate::egress::egress(
            &target.with(&config_path),
            &pool,
            &since,
        )),
        Command::Cordon(t) => ctl_result(crate::ctl::cordon(&t.with(&config_path), true)),
        Command::Uncordon(t) => ctl_result(crate::ctl::cordon(&t.with(&config_path), false)),
        Command::Drain {
            wait,
            timeout,
            target,
        } => ctl_result(crate::ctl::drain(&target.with(&config_path), wait, timeout)),
        #[cfg(feature = "demo")]
        Command::Demo(args) => {
            let level = ephemer_actors_core::config::LogConfig {
                level: "error".into(),
                format: ephemer_actors_core::config::LogFormat::Text,
            };
            if let Err(e) = crate::logging::init(&level) {
                eprintln!("error: {e:#}");
                return ExitCode::from(EXIT_CONFIG);
            }
            match crate::demo::run(args) {
                Ok(true) => ExitCode::SUCCESS,
                Ok(false) => ExitCode::from(EXIT_RUNTIME),
                Err(e) => {
                    eprintln!("error: {e:#}");
                    ExitCode::from(EXIT_RUNTIME)
                }
            }
        }
        Command::Scaleset { action } => match load(&config_path.path) {
            Ok(config) => crate::scaleset::run(&config, action),
            Err(code) => code,
        },
        Command::Doctor { json } => match load(&config_path.path) {
            Ok(config) => crate::doctor::run(&config, json),
            Err(code) => code,
        },
        Command::CheckConfig => match load(&config_path.path) {
            Ok(config) => {
                for warning in config.warnings() {
                    eprintln!("warning: {warning}");
                }
                let unreachable = runner_paths(&config);
                if !unreachable.is_empty() {
                    eprintln!("{}: runners cannot start:", config_path.path.display());
                    for (key, problem) in &unreachable {
                        eprintln!("  {key}: {problem}");
                    }
                    return ExitCode::from(EXIT_CONFIG);
                }
                let providers: Vec<_> = config
                    .providers
                    .enabled()
                    .iter()
                    .map(|p| {
                        let kind = p.kind();
                        if p.name == kind.as_str() {
                            format!("{} ({} slots)", p.name, p.common.max_concurrent)
                        } else {
                            format!("{} ({kind}, {} slots)", p.name, p.common.max_concurrent)
                        }
                    })
                    .collect();
                println!(
                    "{}: ok; providers: {}; webhook on {}{}",
                    config_path.path.display(),
                    providers.join(", "),
                    config.webhook.listen,
                    config.webhook.path
                );
                ExitCode::SUCCESS
            }
            Err(code) => code,
        },
        Command::Serve => {
            let config = match load(&config_path.path) {
                Ok(config) => config,
                Err(code) => return code,
            };
            if let Err(e) = crate::logging::init(&config.log) {
                eprintln!("error: {e:#}");
                return ExitCode::from(EXIT_CONFIG);
            }
            match crate::serve::run(config) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    tracing::error!(error = %format!("{e:#}"), "daemon failed");
                    eprintln!("error: {e:#}");
                    ExitCode::from(EXIT_RUNTIME)
                }
            }
        }
    }
}

/// On the host the config is for (as root, with its `run_as` users and its runner install
/// present), proves that each process pool's `run_as` users can reach and start their runners,
/// as `doctor` does: `(key, problem)` for each that cannot. Elsewhere (a laptop, CI's package
/// check without the users) nothing can be proved and nothing is said.
fn runner_paths(config: &Config) -> Vec<(String, String)> {
    use ephemer_actors_core::config::RunnerProgram;
    use ephemer_actors_core::provision::{
        build::{PoolSettings, pool_settings},
        reach,
        runner_env::write_ca_bundle,
    };
    let mut out = Vec::new();
    let managed = ephemer_actors_core::release::installs::ManagedInstalls::for_config(config);
    for pool in config.providers.enabled() {
        let settings = pool_settings(config, pool, "check", None, std::env::temp_dir());
        if let PoolSettings::Qemu(q) = &settings {
            // The image, kernel and initrd root hands to QEMU: the operator's alone.
            out.extend(ephemer_actors_core::provision::qemu::file_problems(
                pool.name.as_str(),
                &q.vm,
            ));
            continue;
        }
        let PoolSettings::Process(s) = settings else {
            continue;
        };
        // An operator's install no job user may change (docs/security.md). One not there yet
        // is for `doctor` and `serve` to find; one that is there is judged here.
        if let RunnerProgram::Install(dir) = &s.program
            && dir.exists()
            && let Err(e) = ephemer_actors_core::provision::trust::check_trusted(dir)
        {
            out.push((format!("providers.{}.runner_dir", pool.name), e.to_string()));
            continue;
        }
        // The daemon-managed install as it is on disk; none yet: nothing to prove.
        let Some(s) = s.on_current_install(managed.as_ref()) else {
            continue;
        };
        if reach::skipped(&s).is_some() {
            continue;
        }
        let ca = match write_ca_bundle(config) {
            Ok(ca) => ca,
            Err(e) => {
                out.push(("github.ca_file".into(), e.to_string()));
                continue;
            }
        };
        for found in reach::probe(&s, ca.as_deref()) {
            if let Err(e) = found {
                out.push((format!("providers.{}.work_root", pool.name), e.to_string()));
            }
        }
    }
    out
}

fn ctl_result(r: anyhow::Result<()>) -> ExitCode {
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            if e.downcast_ref::<crate::ctl::BadConfig>().is_some() {
                ExitCode::from(EXIT_CONFIG)
            } else {
                ExitCode::from(EXIT_RUNTIME)
            }
        }
    }
}

/// Loads and validates the config; on failure prints every problem and returns exit code 2.
fn load(path: &std::path::Path) -> Result<Config, ExitCode> {
    Config::load(path, &Environment::from_process()).map_err(|ConfigErrors(problems)| {
        eprintln!(
            "{}: {} problem{}",
            path.display(),
            problems.len(),
            if problems.len() == 1 { "" } else { "s" }
        );
        for p in &problems {
            eprintln!("  {p}");
        }
        ExitCode::from(EXIT_CONFIG)
    })
}

/// `--by`: repo, pool or target.
fn usage_by(s: &str) -> Result<ephemer_actors_core::usage::UsageBy, String> {
    ephemer_actors_core::usage::UsageBy::parse(s)
        .ok_or_else(|| format!("{s:?} is not repo, pool or target"))
}
