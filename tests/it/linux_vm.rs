//! `linux_vm` pools end to end: the real daemon, the stand-in GitHub, and each job's stand-in
//! runner in a QEMU microVM of its own (TCG: nested KVM does not boot guests here), booted from
//! an image the test builds (`support::vm`).

use std::time::Duration;

use github_standin::Standin;

use crate::support::{
    daemon::Daemon,
    netns::TestHost,
    provision::{eventually, eventually_async},
    series, vm,
};

const LABELS: &[&str] = &["self-hosted", "linux", "vm"];

/// The stand-in, with runners handed its address on a test host of the "internet": each VM
/// lives in a network namespace of its own that reaches nothing of this host (so not the
/// stand-in on loopback), only the outside, through the host (issue 65, item 2).
pub(crate) fn standin(job_ms: u64) -> Option<(Standin, TestHost)> {
    let internet = TestHost::internet()?;
    let standin = crate::support::netns::standin_on(&internet, job_ms);
    Some((standin, internet))
}

/// The daemon's VM run directories left (`state.dir/vms`).
pub(crate) fn run_dirs(daemon: &Daemon) -> Vec<String> {
    let state = daemon.config.parent().unwrap();
    walk_for_vms(state)
}

fn walk_for_vms(dir: &std::path::Path) -> Vec<String> {
    let mut found = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = e.path();
        if path.is_dir() {
            if path.file_name().is_some_and(|n| n == "vms") {
                found.extend(
                    std::fs::read_dir(&path)
                        .into_iter()
                        .flatten()
                        .flatten()
                        .map(|e| e.file_name().to_string_lossy().to_string()),
                );
            } else {
                found.extend(walk_for_vms(&path));
            }
        }
    }
    found
}

/// How long after `since` job `job` was taken by a runner (looked at every 50 ms).
async fn taken_after(standin: &Standin, job: u64, since: std::time::Instant) -> Duration {
    eventually("the job to be taken", Duration::from_secs(240), || {
        standin
            .jobs()
            .iter()
            .any(|j| j.id == job && j.status != "queued")
    })
    .await;
    since.elapsed()
}

/// Every file under `dir`.
fn files_under(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut found = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = e.path();
        if path.is_dir() {
            found.extend(files_under(&path));
        } else {
            found.push(path);
        }
    }
    found
}

/// What the daemon's VMs printed on their consoles, a log per VM (`state.dir/logs`).
pub(crate) fn vm_logs(daemon: &Daemon) -> Vec<String> {
    let logs = daemon.state_dir().join("logs");
    std::fs::read_dir(logs)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .starts_with(&daemon.prefix())
        })
        .filter_map(|e| std::fs::read_to_string(e.path()).ok())
        .collect()
}

/// The QEMU processes of `daemon`'s runners.
pub(crate) fn qemus_of(daemon: &Daemon) -> Vec<(u32, String)> {
    let prefix = daemon.prefix();
    vm::qemus()
        .into_iter()
        .filter(|(_, cmdline)| cmdline.contains(&prefix))
        .collect()
}

/// Kills `prefix`'s QEMU processes when the test ends, passed or not: a failed test drops its
/// daemon with SIGKILL, and a VM outlives it (the next start would reap it; a test's state
/// directory is gone by then), taking a core from every later test.
pub(crate) struct KillVms(pub(crate) String);

impl Drop for KillVms {
    fn drop(&mut self) {
        for (pid, cmdline) in vm::qemus() {
            if cmdline.contains(&self.0) {
                let _ = std::process::Command::new("kill")
                    .args(["-9", &pid.to_string()])
                    .status();
            }
        }
    }
}

#[actix_rt::test]
async fn jobs_run_each_in_a_vm_of_their_own_with_the_jit_config_never_on_the_host() {
    let Some(image) = vm::image() else { return };
    let before = std::fs::read(&image).unwrap();
    let Some((standin, _internet)) = standin(3000) else {
        return;
    };
    // One VM at a time: two TCG guests take both cores of these machines for half a minute,
    // which other tests running beside this one feel.
    let daemon = Daemon::start(&standin, "", &vm::provider(&image, 1)).await;
    let _vms = KillVms(daemon.prefix());
    let queued = std::time::Instant::now();
    let first = standin.queue_jobs("app", LABELS, 2)[0];

    // While the VMs run: no QEMU's command line or environment holds a runner's token.
    eventually("a VM to run", Duration::from_secs(240), || {
        !qemus_of(&daemon).is_empty()
    })
    .await;
    let taken = taken_after(&standin, first, queued).await;
    eprintln!(
        "figures: cold VM, queued -> job taken by its runner {:.2} s",
        taken.as_secs_f64()
    );
    let mut looked = 0;
    let mut sandboxed = Vec::new();
    while standin.jobs_in("completed") < 2 && looked < 600 {
        for (pid, cmdline) in qemus_of(&daemon) {
            let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
            let environ = String::from_utf8_lossy(&environ).to_string();
            for secret in standin.secrets_issued() {
                assert!(
                    !cmdline.contains(&secret) && !environ.contains(&secret),
                    "a runner's token or JIT config on QEMU's command line or in its environment"
                );
            }
            assert!(!cmdline.contains("JITCONFIG") && !environ.contains("JITCONFIG"));
            // Sandboxed (issue 65, item 3): once booted, a uid of its own range with no
            // capability, no_new_privs, seccomp filtering, a process group of its own.
            let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
            sandboxed.extend(vm::sandbox_of(pid, &status));
            // In a cgroup of its own, which the teardown kills.
            let cgroup = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap_or_default();
            if !cgroup.is_empty() {
                assert!(
                    cgroup.contains("ephemer-runners/"),
                    "QEMU {pid} in no VM cgroup: {cgroup}"
                );
            }
        }
        looked += 1;
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert!(!sandboxed.is_empty(), "no QEMU was seen running");
    if nix::unistd::geteuid().is_root() {
        let loose: Vec<&str> = sandboxed
            .iter()
            .filter(|s| !(s.dropped && s.sealed))
            .map(|s| s.uids.as_str())
            .collect();
        assert!(
            loose.is_empty(),
            "QEMUs outside their sandbox (uids {loose:?}): {sandboxed:#?}"
        );
    }
    daemon
        .wait_completed(&standin, 2, Duration::from_secs(300))
        .await;
    daemon.wait_no_runner_left(&standin).await;
    // Torn down at `completed`, a moment before its runner exits: the VM is given the grace to
    // say so (issue 65, item 10), and its log says what happened in words.
    eventually("both VMs to end", Duration::from_secs(60), || {
        daemon.logs().matches("VM ended:").count() >= 2
    })
    .await;
    let logs = daemon.logs();
    assert_eq!(
        logs.matches("its runner exited with code 0, then the guest powered off")
            .count(),
        2,
        "{logs}"
    );
    eventually("every VM gone", Duration::from_secs(30), || {
        qemus_of(&daemon).is_empty() && run_dirs(&daemon).is_empty()
    })
    .await;
    assert_eq!(
        std::fs::read(&image).unwrap(),
        before,
        "a job wrote the image"
    );
    // No runner's token in any file the daemon keeps (its store, the VMs' logs).
    for file in files_under(&daemon.state_dir()) {
        let bytes = std::fs::read(&file).unwrap_or_default();
        let text = String::from_utf8_lossy(&bytes);
        for secret in standin.secrets_issued() {
            assert!(
                !text.contains(&secret),
                "a runner's token or JIT config in {}",
                file.display()
            );
        }
    }
    // Each job's runner looked for the mark the one before it left on its disk.
    let consoles = vm_logs(&daemon);
    let fresh = consoles
        .iter()
        .filter(|l| l.contains("EPHEMER-TEST FRESH-DISK"))
        .count();
    assert_eq!(fresh, 2, "two jobs, each on a fresh disk: {consoles:?}");
    assert!(
        !consoles.iter().any(|l| l.contains("SAW-EARLIER-JOB")),
        "a job saw an earlier job's file: {consoles:?}"
    );
    // Each boot measured; the pool's accel said where an operator looks.
    let metrics = daemon.metrics().await;
    assert!(
        metrics.contains("ephemerd_vm_boot_seconds_count{pool=\"linux_vm\"} 2"),
        "{}",
        metrics
            .lines()
            .filter(|l| l.contains("vm_boot"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    let sum = |name: &str| series(&metrics, &format!("{name}{{pool=\"linux_vm\"}}"));
    eprintln!(
        "figures: cold VM boot (QEMU start to agent hello) {:.2} s mean of {}",
        sum("ephemerd_vm_boot_seconds_sum") / 2.0,
        sum("ephemerd_vm_boot_seconds_count")
    );
    let status = daemon.ctl_json(&["status"]).await;
    assert_eq!(status["providers"][0]["accel"], "tcg", "{status}");
    let (_, text, _) = daemon.ctl(&["status"]).await;
    assert!(text.contains("accel: tcg"), "{text}");
    let (code, logs) = daemon.stop(Duration::from_secs(30)).await;
    assert_eq!(code, Some(0), "{logs}");
    for secret in standin.secrets_issued() {
        assert!(
            !logs.contains(&secret),
            "a runner's token or JIT config in the log"
        );
    }
}

#[actix_rt::test]
async fn a_job_queued_while_a_warm_vm_waits_is_taken_without_a_boot() {
    let Some(image) = vm::image() else { return };
    let Some((standin, _internet)) = standin(500) else {
        return;
    };
    let pool = vm::pool("linux_vm", &image, 1, "180s", "warm = 1");
    let daemon = Daemon::start(&standin, "", &pool).await;
    let _vms = KillVms(daemon.prefix());
    let available = "ephemerd_warm_available{pool=\"linux_vm\"}";
    eventually_async("a warm VM booted", Duration::from_secs(240), || async {
        series(&daemon.metrics().await, available) == 1.0
    })
    .await;
    assert!(
        standin.runners().is_empty(),
        "a warm VM is never registered"
    );
    let queued = std::time::Instant::now();
    let job = standin.queue_jobs("app", LABELS, 1)[0];
    let taken = taken_after(&standin, job, queued).await;
    eprintln!(
        "figures: warm VM, queued -> job taken by its runner {:.2} s",
        taken.as_secs_f64()
    );
    daemon
        .wait_completed(&standin, 1, Duration::from_secs(120))
        .await;
    let (_, view, _) = daemon.ctl(&["jobs", &job.to_string()]).await;
    assert!(
        view.contains("started in a warm environment, booted before the claim"),
        "{view}\n{}",
        daemon.logs()
    );
    let metrics = daemon.metrics().await;
    assert_eq!(
        series(
            &metrics,
            "ephemerd_warm_claims_total{outcome=\"hit\",pool=\"linux_vm\"}"
        ),
        1.0,
        "{metrics}"
    );
    let pickup = |what: &str| {
        series(
            &metrics,
            &format!("ephemerd_pickup_seconds_{what}{{pool=\"linux_vm\",warm=\"hit\"}}"),
        )
    };
    eprintln!(
        "figures: warm VM pickup (queued to runner started) {:.3} s over {} job",
        pickup("sum"),
        pickup("count")
    );
    daemon.wait_no_runner_left(&standin).await;
    let (code, logs) = daemon.stop(Duration::from_secs(60)).await;
    assert_eq!(code, Some(0), "{logs}");
    assert!(
        logs.contains("warm VM handed to its runner: no boot"),
        "{logs}"
    );
    eventually(
        "every VM gone after the stop",
        Duration::from_secs(30),
        || {
            vm::qemus()
                .iter()
                .all(|(_, cmdline)| !cmdline.contains(&_vms.0))
        },
    )
    .await;
}
