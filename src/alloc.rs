//! The daemon's allocator: mimalloc, held to a small footprint.
//!
//! Under the intake's load glibc's malloc took about 8% of the daemon's CPU: each delivery's
//! strings are allocated on an HTTP worker and freed on the actors' thread, the pattern its
//! arenas handle worst (`malloc_consolidate`; docs/benchmarks.md, "Intake, measured from
//! outside"). mimalloc's defaults trade memory for speed: it commits whole arenas at once and
//! keeps freed pages a while before giving them back, and on a host with transparent huge pages
//! set to `always` each of those becomes 2 MiB of resident memory: an idle daemon held 33 MB
//! instead of glibc's 14. mimalloc reads its options from the environment as it starts, before
//! `main`, and the house allows no `unsafe` to set them later; so on Linux the process starts
//! itself again, once, with them set ([`settle`]). It keeps its pid, name and arguments.

use std::path::PathBuf;

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// The options, as mimalloc reads them: commit arena memory as it is used, and give freed
/// pages back at once.
pub const OPTIONS: [(&str, &str); 2] = [
    ("MIMALLOC_ARENA_EAGER_COMMIT", "0"),
    ("MIMALLOC_PURGE_DELAY", "0"),
];

/// Start this program again with [`OPTIONS`] in its environment, unless one of them is there
/// already (set by the first start, or by an operator). Returns only when that is not needed or
/// not possible; the daemon then runs with mimalloc's defaults, which costs memory, not jobs.
pub fn settle() {
    // Linux only: that is where the options were measured (docs/benchmarks.md); elsewhere
    // (macOS) mimalloc keeps its defaults.
    if !cfg!(target_os = "linux") || OPTIONS.iter().any(|(k, _)| std::env::var_os(k).is_some()) {
        return;
    }
    use std::os::unix::process::CommandExt as _;
    let mut args = std::env::args_os();
    let arg0 = args.next();
    let rest: Vec<_> = args.collect();
    // By its path first, so that the process keeps its name (`ps`, `pgrep`); `/proc/self/exe`
    // if that path is gone (a package upgrade replaced the binary as it started).
    let paths = std::env::current_exe()
        .into_iter()
        .chain([PathBuf::from("/proc/self/exe")]);
    let mut err = None;
    for path in paths {
        let mut again = std::process::Command::new(path);
        if let Some(arg0) = &arg0 {
            again.arg0(arg0);
        }
        err = Some(again.args(&rest).envs(OPTIONS).exec());
    }
    let err = err.map_or_else(String::new, |e| e.to_string());
    eprintln!(
        "ephemer-actors: could not start again with mimalloc's options ({err}); \
         running with its defaults"
    );
}
