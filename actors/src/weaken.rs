//! Defences a debug build can be told to leave out, so that the hostile-job corpus
//! (`tests/it/hostile/`) can show each attack succeeding against a weakened daemon before it
//! fails against the real one: a test of a boundary that cannot fail proves nothing.
//!
//! `EPHEMER_TEST_WEAKEN=removal,vm-network,...` names them. Only a debug build reads it: in a
//! release build (the package, `cargo run --release`, `cargo install`) [`off`] is `false`
//! whatever the environment says, and the names below are all there is.
//!
//! | name | what is left out |
//! |---|---|
//! | `removal` | the bounded tree removal: teardown recurses as `std::fs::remove_dir_all` does |
//! | `vm-network` | a VM's network namespace: QEMU's user network from the host's |
//! | `keyring` | clearing a job user's kernel keyrings |
//! | `log-cap` | cutting a process runner's log |
//! | `bind-recheck` | judging a container's binds again at each start |
//! | `uid-check` | refusing a `run_as` user by its uid (check-config and run time) |
//! | `image-check` | judging a VM's image, kernel and initrd (owners, modes, chains) |
//! | `install-trust` | judging a `runner_dir` (and a file of it at each copy) |
//! | `pids-limit` | the ceiling on a runner cgroup's processes |

/// Whether defence `name` is left out (debug builds, when the environment says so).
pub fn off(name: &str) -> bool {
    #[cfg(debug_assertions)]
    {
        std::env::var("EPHEMER_TEST_WEAKEN").is_ok_and(|v| v.split(',').any(|d| d.trim() == name))
    }
    #[cfg(not(debug_assertions))]
    {
        let _ = name;
        false
    }
}
