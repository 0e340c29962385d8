//! The hidden `standin-runner` command: the stand-in runner the demo's local provisioner starts
//! (the same program as the `standin-runner` crate's executable, reachable without a second
//! binary).

/// Runs the stand-in runner with its command-line `args` and returns its exit code.
pub fn run(args: Vec<String>) -> std::process::ExitCode {
    let code = standin_runner::run_in(&standin_runner::root_from_args(args));
    std::process::ExitCode::from(u8::try_from(code).unwrap_or(1))
}
