//! The stand-in runner as its own (statically linkable) executable.

fn main() {
    std::process::exit(standin_runner::run());
}
