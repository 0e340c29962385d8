//! A cgroup per process runner, so teardown reaches every process a job started.
//!
//! A process group is not enough: a job that double-forks into a new session (`setsid`, as a
//! daemonizing tool does) leaves the group, and killing the group misses it. A cgroup cannot be
//! left by its own processes: everything the runner forks stays in it, and teardown kills the
//! whole cgroup (`cgroup.kill` on cgroup v2, else every pid in `cgroup.procs`, until empty).
//!
//! Where: under the daemon's own cgroup in the v2 hierarchy when there is one (a hybrid host
//! mounts it at `/sys/fs/cgroup/unified`), else in the v1 `pids` hierarchy, in a directory
//! `ephemer-runners/<runner-name>`, so any later incarnation finds it by name. Where no cgroup
//! can be made (no permission, no cgroupfs, macOS) the process-group kill stays and the log says
//! so once. The runner enters its cgroup before it runs anything: it is started through
//! `sh -c 'echo $$ > …/cgroup.procs && exec "$@"'`.

use std::{
    io,
    path::{Path, PathBuf},
    time::Duration,
};

use nix::{
    sys::signal::{Signal, kill},
    unistd::Pid,
};

/// The directory all runner cgroups live in, under the daemon's own cgroup.
#[cfg(target_os = "linux")]
const PARENT: &str = "ephemer-runners";

/// Where runner cgroups are made on this host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct CgroupRoot {
    dir: PathBuf,
    v2: bool,
}

/// Why this host gives runners no cgroup.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(super) enum CgroupError {
    /// The kernel's account of the mounts or this process's cgroup cannot be read.
    #[cfg(target_os = "linux")]
    #[error("cannot read {0}: {1}")]
    Unreadable(&'static str, String),
    /// Neither cgroup v2 nor a v1 pids hierarchy is mounted.
    #[cfg(target_os = "linux")]
    #[error("no cgroup2 or v1 pids hierarchy is mounted")]
    NoHierarchy,
    /// The daemon may not make its directory there.
    #[cfg(target_os = "linux")]
    #[error("cannot create {0}: {1}")]
    NotWritable(String, String),
    /// This OS has none (macOS): teardown reaches a runner's processes by its process group
    /// and, for a `run_as` user, by everything that user runs.
    #[cfg(not(target_os = "linux"))]
    #[error("this OS has no cgroups")]
    Unsupported,
}

impl CgroupRoot {
    /// This host's place for runner cgroups, if it has one the daemon may write.
    #[cfg(not(target_os = "linux"))]
    pub(super) fn detect() -> Result<CgroupRoot, CgroupError> {
        Err(CgroupError::Unsupported)
    }

    /// This host's place for runner cgroups, if it has one the daemon may write.
    #[cfg(target_os = "linux")]
    pub(super) fn detect() -> Result<CgroupRoot, CgroupError> {
        let mounts = std::fs::read_to_string("/proc/self/mountinfo")
            .map_err(|e| CgroupError::Unreadable("/proc/self/mountinfo", e.to_string()))?;
        let own = std::fs::read_to_string("/proc/self/cgroup")
            .map_err(|e| CgroupError::Unreadable("/proc/self/cgroup", e.to_string()))?;
        let candidates = find_mount(&mounts, "cgroup2", None)
            .zip(own_path(&own, "0", ""))
            .map(|(m, p)| (m, p, true))
            .into_iter()
            .chain(
                find_mount(&mounts, "cgroup", Some("pids"))
                    .zip(own_path(&own, "", "pids"))
                    .map(|(m, p)| (m, p, false)),
            );
        let mut why = CgroupError::NoHierarchy;
        // A v2 hierarchy without the pids controller (a hybrid host's `unified`) is kept for
        // last: there a runner's processes could not be limited, nor stopped from forking at
        // teardown, and a v1 pids hierarchy can do both.
        let mut bare = None;
        for (mount, own, v2) in candidates {
            let dir = mount.join(own.trim_start_matches('/')).join(PARENT);
            match std::fs::create_dir_all(&dir) {
                Ok(()) if v2 && !enable_pids(&dir) => bare = Some(CgroupRoot { dir, v2 }),
                Ok(()) => return Ok(CgroupRoot { dir, v2 }),
                Err(e) => why = CgroupError::NotWritable(dir.display().to_string(), e.to_string()),
            }
        }
        bare.ok_or(why)
    }

    /// The cgroup of runner `name` (it may not exist yet).
    pub(super) fn runner(&self, name: &str) -> RunnerCgroup {
        RunnerCgroup {
            dir: self.dir.join(name),
            v2: self.v2,
        }
    }
}

/// The processes (and threads) a process runner's job may have at once: a container's
/// default `pids_limit` too.
pub(super) const RUNNER_PIDS: u64 = crate::config::defaults::CONTAINER_PIDS as u64;
/// A VM's QEMU: its vCPU, I/O and worker threads, with room.
pub(super) const QEMU_PIDS: u64 = 512;

/// Turns the pids controller on for the children of v2 cgroup `dir`; whether they have it.
#[cfg(target_os = "linux")]
fn enable_pids(dir: &Path) -> bool {
    let _ = std::fs::write(dir.join("cgroup.subtree_control"), "+pids");
    std::fs::read_to_string(dir.join("cgroup.subtree_control"))
        .is_ok_and(|c| c.split_whitespace().any(|c| c == "pids"))
}

/// One runner's cgroup.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct RunnerCgroup {
    dir: PathBuf,
    v2: bool,
}

impl RunnerCgroup {
    /// Makes it (empty).
    pub(super) fn create(&self) -> io::Result<()> {
        match std::fs::create_dir(&self.dir) {
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(()),
            other => other,
        }
    }

    /// At most `n` processes (and threads) in it at once, where the pids controller is on it:
    /// a job's fork bomb stops at its own ceiling, never at the host's.
    pub(super) fn limit_pids(&self, n: u64) -> io::Result<()> {
        let pids_max = self.dir.join("pids.max");
        if crate::weaken::off("pids-limit") || !pids_max.exists() {
            return Ok(());
        }
        std::fs::write(pids_max, n.to_string())
    }

    /// The file a process writes its pid to in order to enter.
    pub(super) fn procs(&self) -> PathBuf {
        self.dir.join("cgroup.procs")
    }

    /// Kills every process in it until none is left, then removes it. First the cgroup may
    /// not fork any more (`pids.max` = 0, where the pids controller is on it): a fork bomb
    /// then cannot outrun the kill, on cgroup v1 too, where there is no `cgroup.kill` and each
    /// pid is signalled alone. Gives up only after [`KILL_FOR`], loudly.
    pub(super) async fn kill_and_remove(&self) {
        if !self.dir.exists() {
            return;
        }
        let pids_max = self.dir.join("pids.max");
        if pids_max.exists()
            && let Err(e) = std::fs::write(&pids_max, "0")
        {
            tracing::debug!(cgroup = %self.dir.display(), error = %e, "cannot stop forks");
        }
        let kill_file = self.dir.join("cgroup.kill");
        let deadline = tokio::time::Instant::now() + KILL_FOR;
        let left = loop {
            let pids = members(&self.procs());
            if pids.is_empty() || tokio::time::Instant::now() >= deadline {
                break pids.len();
            }
            if self.v2 && kill_file.exists() {
                let _ = std::fs::write(&kill_file, "1");
            } else {
                for pid in pids {
                    let _ = kill(pid, Signal::SIGKILL);
                }
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        if left > 0 {
            tracing::error!(
                cgroup = %self.dir.display(),
                left,
                "processes of a runner survived {}s of SIGKILL",
                KILL_FOR.as_secs()
            );
        }
        if let Err(e) = std::fs::remove_dir(&self.dir)
            && e.kind() != io::ErrorKind::NotFound
        {
            tracing::warn!(cgroup = %self.dir.display(), error = %e, "cannot remove a runner's cgroup");
        }
    }

    /// How many processes it holds.
    #[cfg(all(test, target_os = "linux"))]
    fn count(&self) -> usize {
        members(&self.procs()).len()
    }
}

/// How long teardown goes on killing a runner's processes before it gives up.
const KILL_FOR: Duration = Duration::from_secs(60);

fn members(procs: &Path) -> Vec<Pid> {
    std::fs::read_to_string(procs)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .map(Pid::from_raw)
        .collect()
}

/// The mount point of a filesystem of `fstype` (with `option` among its super options).
#[cfg(target_os = "linux")]
fn find_mount(mountinfo: &str, fstype: &str, option: Option<&str>) -> Option<PathBuf> {
    mountinfo.lines().find_map(|line| {
        let (left, right) = line.split_once(" - ")?;
        let mut r = right.split_whitespace();
        let (fs, _source, options) = (r.next()?, r.next()?, r.next().unwrap_or(""));
        let wanted = fs == fstype && option.is_none_or(|o| options.split(',').any(|x| x == o));
        let point = left.split_whitespace().nth(4)?;
        wanted.then(|| PathBuf::from(point))
    })
}

/// This process's path in the hierarchy with id `id` (v2: "0") or controller `controller`.
#[cfg(target_os = "linux")]
fn own_path(cgroup: &str, id: &str, controller: &str) -> Option<String> {
    cgroup.lines().find_map(|line| {
        let mut f = line.splitn(3, ':');
        let (hid, controllers, path) = (f.next()?, f.next()?, f.next()?);
        let matches = if controller.is_empty() {
            hid == id && controllers.is_empty()
        } else {
            controllers.split(',').any(|c| c == controller)
        };
        matches.then(|| path.to_string())
    })
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    #[test]
    fn finds_the_hierarchies_of_a_hybrid_host() {
        let mounts = "39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids\n\
                      41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n";
        assert_eq!(
            find_mount(mounts, "cgroup2", None),
            Some(PathBuf::from("/sys/fs/cgroup/unified"))
        );
        assert_eq!(
            find_mount(mounts, "cgroup", Some("pids")),
            Some(PathBuf::from("/sys/fs/cgroup/pids"))
        );
        let own = "8:pids:/system.slice/ephemer.service\n0::/system.slice/ephemer.service\n";
        assert_eq!(
            own_path(own, "0", "").as_deref(),
            Some("/system.slice/ephemer.service")
        );
        assert_eq!(
            own_path(own, "", "pids").as_deref(),
            Some("/system.slice/ephemer.service")
        );
    }

    /// A fork bomb in a cgroup v1 runner cgroup (every process forks as fast as it can, capped
    /// at 64 so the host survives the test) is gone after one teardown: no fork outruns the
    /// kill.
    #[actix_rt::test]
    async fn a_fork_bomb_does_not_outlive_its_teardown() {
        let required =
            std::env::var_os("EPHEMER_REQUIRE_ENGINES").is_some_and(|v| !v.is_empty() && v != "0");
        // The v1 pids hierarchy, where each pid is killed alone (no `cgroup.kill`).
        let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        let own = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
        let v1 = find_mount(&mounts, "cgroup", Some("pids"))
            .zip(own_path(&own, "", "pids"))
            .map(|(mount, own)| CgroupRoot {
                dir: mount.join(own.trim_start_matches('/')).join(PARENT),
                v2: false,
            })
            .filter(|root| std::fs::create_dir_all(&root.dir).is_ok());
        let root = match v1 {
            Some(root) if nix::unistd::geteuid().is_root() => root,
            _ => {
                assert!(
                    !required,
                    "EPHEMER_REQUIRE_ENGINES is set, but no v1 pids cgroup can be made"
                );
                eprintln!(
                    "\n!!! SKIPPING the fork-bomb test: no v1 pids cgroup can be made here\n"
                );
                return;
            }
        };
        let cgroup = root.runner(&format!("ephemer-test-bomb-{}", std::process::id()));
        cgroup.create().unwrap();
        cgroup
            .limit_pids(64)
            .unwrap_or_else(|e| panic!("{}: {e}", cgroup.dir.display()));
        let bomb = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n";
        let mut leader = tokio::process::Command::new("sh")
            .args(["-c", "echo $$ > \"$0\" && exec python3 -c \"$1\""])
            .arg(cgroup.procs())
            .arg(bomb)
            .spawn()
            .unwrap();
        let start = tokio::time::Instant::now();
        while cgroup.count() < 64 && start.elapsed() < Duration::from_secs(10) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(
            cgroup.count() >= 32,
            "the bomb did not go off: {}",
            cgroup.count()
        );
        cgroup.kill_and_remove().await;
        let _ = leader.wait().await;
        assert!(
            !cgroup.dir.exists(),
            "the cgroup is still there: {} in it",
            cgroup.count()
        );
    }
}
