//! Names the commit this binary was built from (`--version`, `ephemerd_build_info`), from git
//! when the source is a checkout, else `EPHEMER_COMMIT` from the environment, else "unknown".

fn main() {
    let commit = std::env::var("EPHEMER_COMMIT").ok().or_else(|| {
        let out = std::process::Command::new("git")
            .args(["rev-parse", "--short=12", "HEAD"])
            .output()
            .ok()?;
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
            .filter(|c| !c.is_empty())
    });
    println!(
        "cargo:rustc-env=EPHEMER_COMMIT={}",
        commit.as_deref().unwrap_or("unknown")
    );
    println!("cargo:rerun-if-env-changed=EPHEMER_COMMIT");
    // A new commit moves HEAD's ref; a checkout moves HEAD.
    println!("cargo:rerun-if-changed=.git/HEAD");
    if let Ok(head) = std::fs::read_to_string(".git/HEAD")
        && let Some(r) = head.trim().strip_prefix("ref: ")
    {
        println!("cargo:rerun-if-changed=.git/{r}");
    }
}
