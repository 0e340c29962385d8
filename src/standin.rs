//! The hidden `standin-runner` command: the stand-in runner the demo's local provisioner starts
//! (the same program as the `standin-runner` crate's executable, reachable without a second
//! binary).

/// Runs the stand-in runner and returns its exit code.
pub fn run() -> std::process::ExitCode {
    let code = standin_runner::run();
    std::process::ExitCode::from(u8::try_from(code).unwrap_or(1))
}
