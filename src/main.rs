//! `ephemer-actors`: the daemon binary. Thin on purpose: parse the command line, hand over to
//! [`cli::run`], turn its outcome into an exit code (0 ok, 1 runtime failure, 2 usage or
//! config error).

mod alloc;
mod cli;
mod ctl;
#[cfg(feature = "demo")]
mod demo;
mod doctor;
mod egress;
mod job_text;
mod logging;
mod notify;
mod scaleset;
mod serve;
#[cfg(feature = "demo")]
mod standin;
mod term;
mod usage;

fn main() -> std::process::ExitCode {
    alloc::settle();
    cli::run()
}
