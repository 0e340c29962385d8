//! `linux_vm` pools when things go wrong: a job cancelled, a job past `job_timeout`, a guest
//! that powers itself off mid-job, a guest that never boots, and `kill -9` of the daemon while
//! a VM runs. After each, nothing of the VM is left on the host: no QEMU, no overlay, no
//! console socket (the run directory holds all three), no registration at GitHub. One daemon,
//! one VM at a time (TCG guests take a whole core each).

use std::{
    io::{Read, Write},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use github_standin::{RunnerBehavior, Standin};

use crate::{
    linux_vm::{KillVms, qemus_of, run_dirs, standin},
    support::{daemon::Daemon, provision::eventually, vm},
};

const LABELS: &[&str] = &["self-hosted", "linux", "vm"];
const NEVER: &[&str] = &["self-hosted", "linux", "vmhang"];

/// The test's off switch: a guest's runner polls it (`VM_TEST_OFF_URL`) and powers the guest
/// off when it answers `off` (once per flip).
fn off_switch(on: &crate::support::netns::TestHost) -> (u16, Arc<AtomicBool>) {
    let listener = on.listen(0);
    let port = listener.local_addr().unwrap().port();
    let flag = Arc::new(AtomicBool::new(false));
    let on = flag.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let mut stream = stream;
            let mut buf = [0u8; 1024];
            let _ = stream.read(&mut buf);
            let body = if on.swap(false, Ordering::SeqCst) {
                "off"
            } else {
                "wait"
            };
            let _ = write!(
                stream,
                "HTTP/1.0 200 OK\r\nContent-Length: {}\r\n\r\n{body}",
                body.len()
            );
        }
    });
    (port, flag)
}

fn hanging(standin: &Standin) {
    standin.set_behavior(RunnerBehavior {
        hang: true,
        ..RunnerBehavior::default()
    });
}

/// The job's one runner is running it: its id.
async fn running(standin: &Standin, job: u64) {
    eventually("the job to run in its VM", Duration::from_secs(240), || {
        standin
            .jobs()
            .iter()
            .any(|j| j.id == job && j.status == "in_progress")
    })
    .await;
}

/// Nothing of the pool's VMs is left: no QEMU, no run directory (overlay, socket, pid file).
async fn nothing_left(daemon: &Daemon, what: &str) {
    eventually(what, Duration::from_secs(60), || {
        qemus_of(daemon).is_empty() && run_dirs(daemon).is_empty()
    })
    .await;
}

/// GitHub fails a job whose runner vanished, some minutes on, and removes the runner's
/// registration with it (a JIT runner is ephemeral): the stand-in is told so.
fn github_gives_up(standin: &Standin, job: u64) {
    standin.cancel_job(job);
}

#[actix_rt::test]
async fn cancelled_timed_out_powered_off_never_booted_and_killed_vms_leave_nothing() {
    let (Some(image), Some(hang_image)) = (vm::image(), vm::hanging_image()) else {
        return;
    };
    let Some((standin, internet)) = standin(200) else {
        return;
    };
    let (port, off) = off_switch(&internet);
    let pools = vm::pool(
        "linux_vm",
        &image,
        1,
        "180s",
        &format!(
            "env = {{ VM_TEST_OFF_URL = \"http://{}:{port}/\" }}",
            internet.addr
        ),
    ) + &vm::pool("vmhang", &hang_image, 1, "20s", "");
    let daemon = Daemon::start(&standin, "[runner]\njob_timeout = \"45s\"\n", &pools).await;
    let _vms = KillVms(daemon.prefix());

    // Cancelled while it runs.
    hanging(&standin);
    let job = standin.queue_jobs("app", LABELS, 1)[0];
    running(&standin, job).await;
    standin.cancel_job(job);
    nothing_left(&daemon, "the cancelled job's VM gone").await;
    daemon.wait_no_runner_left(&standin).await;

    // Past job_timeout: the hanging runner's VM is stopped.
    let job = standin.queue_jobs("app", LABELS, 1)[0];
    running(&standin, job).await;
    eventually("the timeout to be said", Duration::from_secs(120), || {
        daemon.logs().contains("job_timeout")
    })
    .await;
    nothing_left(&daemon, "the timed-out job's VM gone").await;
    github_gives_up(&standin, job);
    daemon.wait_no_runner_left(&standin).await;

    // The guest powers itself off mid-job.
    let job = standin.queue_jobs("app", LABELS, 1)[0];
    running(&standin, job).await;
    off.store(true, Ordering::SeqCst);
    nothing_left(&daemon, "the powered-off VM gone").await;
    let (_, view, _) = daemon.ctl(&["jobs", &job.to_string()]).await;
    assert!(
        view.contains("the VM stopped before its runner said it exited"),
        "{view}"
    );
    assert_eq!(
        daemon.logs().matches("job_timeout reached").count(),
        1,
        "the powered-off VM ended by itself, not at job_timeout:\n{}",
        daemon.logs()
    );
    github_gives_up(&standin, job);
    daemon.wait_no_runner_left(&standin).await;

    // A guest that never says hello: stopped at boot_timeout, its job back on the ladder.
    let job = standin.queue_jobs("app", NEVER, 1)[0];
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    while !daemon.logs().contains("did not say hello within 20 s") {
        assert!(
            tokio::time::Instant::now() < deadline,
            "no boot timeout:\n{}",
            daemon.logs()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    nothing_left(&daemon, "the VM that never booted gone").await;
    daemon.wait_no_runner_left(&standin).await;
    assert!(
        standin
            .jobs()
            .iter()
            .any(|j| j.id == job && j.status == "queued"),
        "the job is kept"
    );
    standin.cancel_job(job);

    // kill -9 of the daemon with a VM running: the next start stops it and runs the job.
    let job = standin.queue_jobs("app", LABELS, 1)[0];
    running(&standin, job).await;
    // The job's VM (a retry of the other pool's may be on its way out).
    let orphans: Vec<_> = qemus_of(&daemon)
        .into_iter()
        .filter(|(_, cmdline)| cmdline.contains("-linux-vm-"))
        .collect();
    assert_eq!(orphans.len(), 1, "{orphans:?}");
    let left = daemon.kill9().await;
    assert!(
        std::path::Path::new(&format!("/proc/{}", orphans[0].0)).exists(),
        "the VM outlives its daemon until the next start"
    );
    standin.set_behavior(RunnerBehavior {
        job_ms: 200,
        ..RunnerBehavior::default()
    });
    github_gives_up(&standin, job);
    let daemon = Daemon::resume(&standin, left).await;
    eventually("the orphaned VM stopped", Duration::from_secs(60), || {
        !std::path::Path::new(&format!("/proc/{}", orphans[0].0)).exists()
    })
    .await;
    let job = standin.queue_jobs("app", LABELS, 1)[0];
    eventually("a job after the restart", Duration::from_secs(240), || {
        standin
            .jobs()
            .iter()
            .any(|j| j.id == job && j.status == "completed")
    })
    .await;
    nothing_left(&daemon, "every VM gone after the restart").await;
    daemon.wait_no_runner_left(&standin).await;
    let (code, logs) = daemon.stop(Duration::from_secs(30)).await;
    assert_eq!(code, Some(0), "{logs}");
}
