//! The real process provisioner against the stand-in GitHub and its stand-in runner (tart VMs:
//! `tart.rs`).

use std::{path::Path, time::Duration};

use ephemer_actors_core::{
    config::{ProviderKind, RunnerProgram},
    provision::{
        Backend, ExitReason, Provision, RunnerEventKind, Teardown,
        process::{ProcessBackend, ProcessSettings},
    },
};

use crate::support::provision::{alive, claim, eventually, spec, supervise, wait_clean_exit};

pub(crate) const LABELS: &[&str] = &["self-hosted", "linux", "x64"];

fn process_backend(work: &Path, command: &Path, args: &[&str], grace: Duration) -> ProcessBackend {
    ProcessBackend::new(ProcessSettings {
        kind: ProviderKind::Local,
        pool: "local".into(),
        env: Default::default(),
        program: RunnerProgram::Command(command.to_path_buf()),
        args: args.iter().map(|a| a.to_string()).collect(),
        work_root: work.join("work"),
        log_dir: work.join("logs"),
        run_as: Vec::new(),
        name_prefix: "ephemer-local-".into(),
        grace,
        peers: Vec::new(),
        left_record: None,
        left_gauge: None,
        allow_root: false,
        allow_same_user: true,
    })
}

pub(crate) fn is_exit(k: &RunnerEventKind) -> bool {
    matches!(k, RunnerEventKind::Exited { .. })
}

/// A job runs end to end with the stand-in runner as a local process; the JIT config is in its
/// environment and never in its command line; its directory is gone afterwards.
#[actix_rt::test]
async fn local_runner_runs_a_job_and_leaves_nothing_behind() {
    let standin = crate::support::standin(500);
    let job = standin.add_jobs("app", &["self-hosted", "linux"], 1)[0];
    let runner = claim(&standin, "ephemer-local-", LABELS).await;
    let tmp = tempfile::tempdir().unwrap();
    let daemon = Path::new(env!("CARGO_BIN_EXE_ephemer-actors"));
    let (sup, events) = supervise(
        process_backend(
            tmp.path(),
            daemon,
            &["standin-runner"],
            Duration::from_secs(5),
        ),
        None,
    );
    sup.send(Provision::now(spec(&runner, job))).await.unwrap();

    events
        .wait_for(&runner.name, Duration::from_secs(20), |k| {
            matches!(k, RunnerEventKind::Started { .. })
        })
        .await;
    eventually("the runner to connect", Duration::from_secs(20), || {
        standin.state().runner_pids.contains_key(&runner.name)
    })
    .await;
    let pid = standin.state().runner_pids[&runner.name];
    let jit = runner.encoded_jit_config.expose();
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
    assert!(!cmdline.is_empty(), "read the runner's command line");
    assert!(
        !String::from_utf8_lossy(&cmdline).contains(jit),
        "the JIT config is never on argv"
    );
    assert!(
        String::from_utf8_lossy(&environ).contains(jit),
        "the JIT config is in the environment"
    );
    assert!(
        !String::from_utf8_lossy(&environ).contains("EPHEMER_WEBHOOK_SECRET"),
        "no daemon secret leaks in"
    );
    assert!(
        tmp.path().join("work").join(&runner.name).is_dir(),
        "a fresh per-job directory"
    );

    wait_clean_exit(&events, &runner.name, Duration::from_secs(30)).await;
    assert!(
        !tmp.path().join("work").join(&runner.name).exists(),
        "the directory is removed"
    );
    assert!(
        !tmp.path()
            .join("work/.run")
            .join(format!("{}.pid", runner.name))
            .exists()
    );
    assert_eq!(standin.jobs_in("completed"), 1);
    assert!(
        standin.runners().is_empty(),
        "the JIT runner removed itself after its job"
    );
    let log = std::fs::read_to_string(tmp.path().join("logs").join(format!("{}.log", runner.name)))
        .unwrap();
    assert!(log.contains("done"), "{log}");
}

fn tree_script(dir: &Path, ignore_term: bool) -> std::path::PathBuf {
    let script = dir.join("runner.sh");
    let trap = if ignore_term { "trap '' TERM\n" } else { "" };
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\n{trap}sleep 1000 &\necho $! > {d}/child.pid\necho $$ > {d}/leader.pid\nwait\nwait\n",
            d = dir.display()
        ),
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    script
}

/// Both pid files are written and complete (the script writes them one after the other).
fn tree_started(dir: &Path) -> bool {
    let ok = |f: &str| {
        std::fs::read_to_string(dir.join(f))
            .ok()
            .is_some_and(|s| s.trim().parse::<i32>().is_ok())
    };
    ok("child.pid") && ok("leader.pid")
}

fn pids(dir: &Path) -> (i32, i32) {
    let read = |f: &str| {
        std::fs::read_to_string(dir.join(f))
            .unwrap()
            .trim()
            .parse::<i32>()
            .unwrap()
    };
    (read("leader.pid"), read("child.pid"))
}

pub(crate) fn fake_runner(name: &str) -> ephemer_actors_core::github::JitRunner {
    ephemer_actors_core::github::JitRunner {
        id: 1,
        name: name.into(),
        encoded_jit_config: ephemer_actors_core::config::Secret::new("jit"),
    }
}

/// `job_timeout` kills a runner that hangs, and the whole process tree goes with it.
#[actix_rt::test]
async fn job_timeout_kills_a_hanging_runner_and_its_tree() {
    let tmp = tempfile::tempdir().unwrap();
    let script = tree_script(tmp.path(), false);
    let (sup, events) = supervise(
        process_backend(tmp.path(), &script, &[], Duration::from_secs(5)),
        Some(Duration::from_secs(1)),
    );
    let runner = fake_runner("ephemer-local-hang");
    sup.send(Provision::now(spec(&runner, 1))).await.unwrap();
    eventually("the runner to start", Duration::from_secs(10), || {
        tree_started(tmp.path())
    })
    .await;
    let (leader, child) = pids(tmp.path());
    assert!(alive(leader) && alive(child));
    let exit = events
        .wait_for(&runner.name, Duration::from_secs(20), is_exit)
        .await;
    assert!(
        matches!(
            exit,
            RunnerEventKind::Exited {
                reason: ExitReason::TimedOut,
                ..
            }
        ),
        "{exit:?}"
    );
    assert!(!alive(leader) && !alive(child), "the whole tree is gone");
    assert!(!tmp.path().join("work").join(&runner.name).exists());
}

/// A tree script's runner under a supervisor with a 500 ms grace, started: (supervisor, events,
/// leader pid, child pid).
async fn started_tree(
    dir: &Path,
    script: &Path,
    name: &str,
) -> (
    actix::Addr<ephemer_actors_core::provision::LocalProvisioner>,
    crate::support::provision::Events,
    i32,
    i32,
) {
    let (sup, events) = supervise(
        process_backend(dir, script, &[], Duration::from_millis(500)),
        None,
    );
    sup.send(Provision::now(spec(&fake_runner(name), 1)))
        .await
        .unwrap();
    eventually("the runner to start", Duration::from_secs(10), || {
        tree_started(dir)
    })
    .await;
    let (leader, child) = pids(dir);
    (sup, events, leader, child)
}

/// Teardown of a runner that ignores SIGTERM: SIGKILL after the grace, tree gone.
#[actix_rt::test]
async fn teardown_kills_a_tree_that_ignores_sigterm() {
    let tmp = tempfile::tempdir().unwrap();
    let script = tree_script(tmp.path(), true);
    let runner = fake_runner("ephemer-local-stubborn");
    let (sup, events, leader, child) = started_tree(tmp.path(), &script, &runner.name).await;
    sup.send(Teardown {
        name: runner.name.clone(),
        reason: "test",
    })
    .await
    .unwrap();
    let exit = events
        .wait_for(&runner.name, Duration::from_secs(20), is_exit)
        .await;
    assert!(
        matches!(
            exit,
            RunnerEventKind::Exited {
                reason: ExitReason::TornDown,
                ..
            }
        ),
        "{exit:?}"
    );
    assert!(
        !alive(leader) && !alive(child),
        "SIGKILL after the grace took the whole tree"
    );
}

/// A job that double-forks into a new session (as a daemonizing tool does) has left the
/// runner's process group; teardown still kills it: it cannot leave the runner's cgroup.
#[actix_rt::test]
async fn teardown_kills_a_process_that_left_the_group_with_setsid() {
    let tmp = tempfile::tempdir().unwrap();
    let script = tmp.path().join("runner.sh");
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\nsetsid sleep 1001 &\necho $! > {d}/child.pid\necho $$ > {d}/leader.pid\nwait\nsleep 1000\n",
            d = tmp.path().display()
        ),
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    let runner = fake_runner("ephemer-local-escapee");
    let (sup, events, leader, escapee) = started_tree(tmp.path(), &script, &runner.name).await;
    eventually(
        "the escapee in a session of its own",
        Duration::from_secs(5),
        || {
            std::fs::read_to_string(format!("/proc/{escapee}/stat"))
                .ok()
                .and_then(|s| {
                    let rest = s.rsplit_once(')')?.1.to_string();
                    rest.split_whitespace().nth(2)?.parse::<i32>().ok()
                })
                .is_some_and(|pgrp| pgrp != leader)
        },
    )
    .await;
    sup.send(Teardown {
        name: runner.name.clone(),
        reason: "test",
    })
    .await
    .unwrap();
    events
        .wait_for(&runner.name, Duration::from_secs(20), is_exit)
        .await;
    eventually("the escapee gone", Duration::from_secs(10), || {
        !alive(escapee)
    })
    .await;
    assert!(!alive(leader));
}

/// A leftover runner directory and process group from an earlier run are removed at start-up.
#[actix_rt::test]
async fn leftover_local_runners_are_reaped_at_start_up() {
    let tmp = tempfile::tempdir().unwrap();
    let script = tree_script(tmp.path(), false);
    let work = tmp.path().join("work");
    let (sup, events) = supervise(
        process_backend(tmp.path(), &script, &[], Duration::from_secs(2)),
        None,
    );
    sup.send(Provision::now(spec(&fake_runner("ephemer-local-left"), 1)))
        .await
        .unwrap();
    eventually("the runner to start", Duration::from_secs(10), || {
        tree_started(tmp.path())
    })
    .await;
    let (leader, child) = pids(tmp.path());
    // A new supervisor over the same work root (as after a daemon restart) finds and reaps it.
    let _events = events;
    let (_sup2, _) = supervise(
        process_backend(tmp.path(), &script, &[], Duration::from_secs(2)),
        None,
    );
    eventually("the leftover to be reaped", Duration::from_secs(15), || {
        !alive(leader) && !alive(child) && !work.join("ephemer-local-left").exists()
    })
    .await;
}

// ----- podman --------------------------------------------------------------------------------

/// A pid file that names a live process of another incarnation (here: a reused pid, the start
/// time does not match) is neither adopted nor signalled.
#[actix_rt::test]
async fn a_stale_pid_file_never_signals_an_unrelated_process() {
    let tmp = tempfile::tempdir().unwrap();
    let backend = process_backend(
        tmp.path(),
        Path::new("/bin/true"),
        &[],
        Duration::from_secs(1),
    );
    // Leading a group of its own, as a runner would: killpg on its pid would reach it.
    let mut bystander = tokio::process::Command::new("sleep")
        .arg("30")
        .process_group(0)
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let pid = bystander.id().unwrap();
    let run = tmp.path().join("work/.run");
    std::fs::create_dir_all(&run).unwrap();
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap();
    let name = "ephemer-local-stale";
    std::fs::write(
        run.join(format!("{name}.pid")),
        format!("{pid} 1 {}", boot.trim()),
    )
    .unwrap();
    assert!(
        backend.clone().adopt(name.into()).await.is_none(),
        "not adopted"
    );
    backend.stop(name.into()).await;
    assert!(alive(pid as i32), "the unrelated process was signalled");
    let _ = bystander.kill().await;
}
