//! The container pool against a real engine: a private Podman service (`support/podman.rs`),
//! a job end to end in a container, and the limits every runner container runs under.

use std::time::Duration;

use ephemer_actors_core::{
    config::ContainerLimits,
    provision::{
        Backend, Provision, RunnerEventKind,
        container::{ContainerBackend, ContainerSettings, PREFIX_LABEL},
        engine_api,
    },
};
use github_standin::RunnerBehavior;

use crate::{
    provision::{LABELS, fake_runner, is_exit},
    support::{
        podman::{IMAGE, Podman},
        provision::{claim, eventually, eventually_async, spec, supervise, wait_clean_exit},
    },
};

/// A job runs end to end in a Podman container; the container is gone afterwards and the JIT
/// config was only in its environment. A leftover container labelled ours is removed at start.
#[actix_rt::test]
async fn linux_container_runs_a_job_and_is_removed() {
    let Some(podman) = Podman::start().await else {
        return;
    };
    let docker =
        bollard::Docker::connect_with_unix(&podman.socket, 60, bollard::API_DEFAULT_VERSION)
            .unwrap();
    let leftover = bollard::models::ContainerCreateBody {
        image: Some(IMAGE.into()),
        cmd: Some(vec!["/bin/sleep".into(), "1000".into()]),
        labels: Some([(PREFIX_LABEL.to_string(), "ptest-linux-".to_string())].into()),
        ..Default::default()
    };
    let name = bollard::query_parameters::CreateContainerOptionsBuilder::new()
        .name("ptest-linux-leftover")
        .build();
    docker
        .create_container(Some(name), leftover)
        .await
        .expect("create a leftover container");

    let standin = crate::support::standin(300);
    let job = standin.add_jobs("app", &["self-hosted", "linux"], 1)[0];
    let runner = claim(&standin, "ptest-linux-", LABELS).await;
    let backend = ContainerBackend::new(ContainerSettings {
        command: vec![
            "/usr/local/bin/ephemer-actors".into(),
            "standin-runner".into(),
        ],
        network: Some("host".into()),
        ..settings(&podman, "ptest-linux-")
    })
    .unwrap();
    // The runner is held from its job until it has been inspected: a job that ends first
    // would leave a container in podman's `stopped`, or none.
    standin.set_behavior(RunnerBehavior {
        hold: true,
        ..Default::default()
    });
    let (sup, events) = supervise(backend, None);
    sup.send(Provision::now(spec(&runner, job))).await.unwrap();
    events
        .wait_for(&runner.name, Duration::from_secs(60), |k| {
            matches!(k, RunnerEventKind::Started { .. })
        })
        .await;
    // Read as JSON: bollard's typed inspect fails whole on a podman state it does not know.
    let inspect: serde_json::Value = serde_json::from_slice(
        &engine_api::get(&podman.socket, &format!("/containers/{}/json", runner.name))
            .await
            .expect("inspect the runner container"),
    )
    .unwrap();
    standin.set_behavior(RunnerBehavior::default());
    assert_eq!(inspect["State"]["Running"], true, "{}", inspect["State"]);
    let config = &inspect["Config"];
    let jit = runner.encoded_jit_config.expose();
    assert!(
        !format!("{} {}", config["Cmd"], config["Entrypoint"]).contains(jit),
        "not on argv"
    );
    assert!(
        config["Env"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|e| e.as_str().is_some_and(|e| e.contains(jit))),
        "in the environment"
    );
    assert!(
        config["Env"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|e| e == "ACTIONS_RUNNER_RETURN_VERSION_DEPRECATED_EXIT_CODE=1"),
        "a version GitHub refuses exits 7: {}",
        config["Env"]
    );
    let host = &inspect["HostConfig"];
    assert_eq!(host["Privileged"], false);
    assert_eq!(host["Init"], true);
    assert_eq!(host["Memory"], 4 * 1024 * 1024 * 1024_i64);
    assert_eq!(host["PidsLimit"], 4096);
    let strings = |v: &serde_json::Value| -> Vec<String> {
        v.as_array()
            .into_iter()
            .flatten()
            .filter_map(|x| x.as_str().map(str::to_string))
            .collect()
    };
    assert!(
        strings(&host["SecurityOpt"])
            .iter()
            .any(|o| o.contains("no-new-privileges")),
        "no new privileges: {}",
        host["SecurityOpt"]
    );
    let caps = strings(&host["CapDrop"]);
    assert!(!caps.is_empty(), "capabilities dropped: {caps:?}");

    wait_clean_exit(&events, &runner.name, Duration::from_secs(60)).await;
    assert_eq!(standin.jobs_in("completed"), 1);
    // Other tests share the engine's storage: a container they remove while this lists can
    // fail the listing ("container not known"); ask again.
    let mut attempts = 0;
    let names = loop {
        let listed = engine_api::container_names(&podman.socket, PREFIX_LABEL).await;
        attempts += 1;
        match listed {
            Ok(names) => break names,
            Err(e) if attempts < 10 => eprintln!("listing containers: {e}; again"),
            Err(e) => panic!("cannot list containers: {e}"),
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    };
    assert!(
        !names.iter().any(|n| n.contains("ptest-linux-")),
        "no container of ours left: {names:?}"
    );
}

/// The start-up reaper finds its leftovers while containers of its prefix pass through
/// podman's `stopped` (exited, not yet cleaned up), a state bollard's typed listing cannot
/// read: short containers churn beside it (kept, as adopted runners are, and removed by the
/// engine once they exit), and every round's leftover must be removed.
#[actix_rt::test]
async fn leftovers_are_reaped_while_other_containers_are_exiting() {
    const ROUNDS: usize = 20;
    const CHURNERS: usize = 3;
    const EACH: usize = 2_000;
    let Some(podman) = Podman::start().await else {
        return;
    };
    let docker =
        bollard::Docker::connect_with_unix(&podman.socket, 60, bollard::API_DEFAULT_VERSION)
            .unwrap();
    let create = {
        let docker = docker.clone();
        move |name: String, cmd: &str, auto_remove: bool| {
            let docker = docker.clone();
            let body = bollard::models::ContainerCreateBody {
                image: Some(IMAGE.into()),
                entrypoint: Some(vec!["sh".into(), "-c".into(), cmd.into()]),
                labels: Some([(PREFIX_LABEL.to_string(), "ptest-churn-".to_string())].into()),
                host_config: Some(bollard::models::HostConfig {
                    auto_remove: Some(auto_remove),
                    ..Default::default()
                }),
                ..Default::default()
            };
            let options = bollard::query_parameters::CreateContainerOptionsBuilder::new()
                .name(&name)
                .build();
            async move {
                docker
                    .create_container(Some(options), body)
                    .await
                    .unwrap_or_else(|e| panic!("create {name}: {e}"));
                name
            }
        }
    };
    let backend = ContainerBackend::new(settings(&podman, "ptest-churn-")).unwrap();
    // The engine's storage is shared with other tests and earlier runs: start from none.
    backend.clone().reap_leftovers(Vec::new()).await;
    let churned = |first: usize, i: usize| format!("ptest-churn-c{first}-{i}");
    let stop = std::rc::Rc::new(std::cell::Cell::new(false));
    // Several at a time, so one is often between its exit and its cleanup.
    let churn: Vec<_> = (0..CHURNERS)
        .map(|first| {
            let (docker, create, stop) = (docker.clone(), create.clone(), stop.clone());
            actix_rt::spawn(async move {
                for i in (0..EACH).take_while(|_| !stop.get()) {
                    let name = create(churned(first, i), "sleep 0.05", true).await;
                    docker
                        .start_container(
                            &name,
                            None::<bollard::query_parameters::StartContainerOptions>,
                        )
                        .await
                        .unwrap_or_else(|e| panic!("start {name}: {e}"));
                }
            })
        })
        .collect();
    let keep: Vec<String> = (0..CHURNERS)
        .flat_map(|first| (0..EACH).map(move |i| churned(first, i)))
        .collect();
    let label = format!("{PREFIX_LABEL}=ptest-churn-");
    let typed = bollard::query_parameters::ListContainersOptionsBuilder::new()
        .all(true)
        .filters(&std::collections::HashMap::from([(
            "label",
            vec![label.clone()],
        )]))
        .build();
    let mut typed_failed = 0;
    for round in 0..ROUNDS {
        let leftover = create(format!("ptest-churn-left{round}"), "sleep 1000", false).await;
        let listed = docker.list_containers(Some(typed.clone())).await;
        typed_failed += usize::from(listed.is_err_and(|e| e.to_string().contains("stopped")));
        let reaped = backend.clone().reap_leftovers(keep.clone()).await;
        assert!(
            reaped == [leftover.clone()],
            "round {round}: reaped {reaped:?}, not {leftover}"
        );
    }
    stop.set(true);
    for task in churn {
        task.await.expect("the churn ran");
    }
    eprintln!(
        "bollard's typed listing failed on `stopped` in {typed_failed} of {ROUNDS} rounds; \
         the reaper's own listing held in all"
    );
    eventually_async("the churn gone", Duration::from_secs(30), || async {
        engine_api::container_names(&podman.socket, &label)
            .await
            .is_ok_and(|left| left.is_empty())
    })
    .await;
}

/// A pool named `linux` on the test's engine, running [`IMAGE`].
fn settings(podman: &Podman, name_prefix: &str) -> ContainerSettings {
    ContainerSettings::new(
        "linux".into(),
        podman.socket.clone(),
        IMAGE.into(),
        name_prefix.into(),
        podman.dir().join("logs"),
    )
}

/// The log cap of the limit tests (small, so the flood is quick).
const FLOOD_CAP: u64 = 1024 * 1024;

/// A container that runs `script` (busybox `sh -c`) under `limits`, started and run to its end:
/// its exit and the saved log.
async fn container_run(
    podman: &Podman,
    name: &str,
    script: &str,
    limits: ContainerLimits,
) -> (RunnerEventKind, std::path::PathBuf) {
    let backend = ContainerBackend::new(ContainerSettings {
        command: vec!["/bin/sh".into(), "-c".into(), script.into()],
        network: Some("none".into()),
        limits,
        log_cap: FLOOD_CAP,
        ..settings(podman, "plim-linux-")
    })
    .unwrap();
    let (sup, events) = supervise(backend, None);
    sup.send(Provision::now(spec(&fake_runner(name), 1)))
        .await
        .unwrap();
    let exit = events
        .wait_for(name, Duration::from_secs(120), is_exit)
        .await;
    let log = podman.dir().join("logs").join(format!("{name}.log"));
    eventually("the log saved", Duration::from_secs(30), || log.exists()).await;
    (exit, log)
}

/// A job that eats memory is OOM-killed inside its container's limit; the daemon is untouched.
#[actix_rt::test]
async fn a_memory_hog_is_killed_inside_its_containers_limit() {
    let Some(podman) = Podman::start().await else {
        return;
    };
    let limits = ContainerLimits {
        memory: 64 * 1024 * 1024,
        ..ContainerLimits::default()
    };
    let script = "echo hogging; yes | tail -c 500000000 > /dev/null; echo survived";
    // (Without a limit `tail` would hold 500 MB and `yes` never end: the run would time out.)
    let (exit, log) = container_run(&podman, "plim-linux-hog", script, limits).await;
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(text.contains("hogging"), "{text}");
    assert!(
        matches!(exit, RunnerEventKind::Exited { .. }),
        "the runner ended: {exit:?}"
    );
    let pressure_killed = !text.contains("survived") || text.contains("Killed");
    assert!(
        pressure_killed,
        "the hog was not stopped by the limit: {text}"
    );
}

/// A job that floods stdout leaves a log capped at the cap (LOG_CAP in the daemon), streamed to
/// disk.
#[actix_rt::test]
async fn a_flood_of_output_leaves_a_capped_log() {
    let Some(podman) = Podman::start().await else {
        return;
    };
    // Long lines: the engine's log driver stores a line at a time.
    let script = "head -c 4194304 /dev/zero; echo; echo done";
    let (_, log) = container_run(
        &podman,
        "plim-linux-flood",
        script,
        ContainerLimits::default(),
    )
    .await;
    let cap = FLOOD_CAP;
    let size = std::fs::metadata(&log).unwrap().len();
    assert!(size <= cap + 100, "{size} bytes");
    assert!(
        size >= cap,
        "{size} bytes: the log holds the output up to the cap"
    );
    let tail = std::fs::read(&log).unwrap();
    assert!(String::from_utf8_lossy(&tail[tail.len() - 80..]).contains("log truncated"));
}

/// The largest resident set of `pid` seen while `until` runs, in bytes: all of it, and its
/// anonymous part (the heap and stacks: what the process holds, without the pages of its own
/// binary, which in a debug build are most of it); and what `until` gave.
async fn peak_rss_while<T>(
    pid: u32,
    until: impl std::future::Future<Output = T>,
) -> ((u64, u64), T) {
    let rss = || {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
        let kib = |key: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(key))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
                .unwrap_or(0)
                * 1024
        };
        (kib("VmRSS:"), kib("RssAnon:"))
    };
    let max = |(a, b): (u64, u64), (c, d): (u64, u64)| (a.max(c), b.max(d));
    let mut peak = rss();
    tokio::pin!(until);
    loop {
        tokio::select! {
            out = &mut until => return (max(peak, rss()), out),
            () = tokio::time::sleep(Duration::from_millis(100)) => peak = max(peak, rss()),
        }
    }
}

/// A job that writes 1 GiB to stdout, run by the daemon: its saved log stops at the cap and the
/// daemon's memory stays small throughout (the output is streamed, never held).
#[actix_rt::test]
async fn a_job_writing_a_gigabyte_leaves_a_capped_log_and_a_small_daemon() {
    let Some(podman) = Podman::start().await else {
        return;
    };
    let standin = crate::support::standin(100);
    let flood =
        "head -c 1073741824 /dev/zero; echo; exec /usr/local/bin/ephemer-actors standin-runner";
    let providers = crate::support::daemon::linux_provider(
        &podman.socket,
        IMAGE,
        1,
        &format!("command = [\"/bin/sh\", \"-c\", \"{flood}\"]\nnetwork = \"host\""),
    );
    let daemon = crate::support::daemon::Daemon::start(&standin, "", &providers).await;
    let logs = daemon.state_dir().join("logs");
    let started = std::time::Instant::now();
    standin.queue_jobs("app", crate::provision::LABELS, 1);
    let saved = || -> Option<(u64, bool)> {
        let entry = std::fs::read_dir(&logs).ok()?.flatten().next()?;
        let text = std::fs::read(entry.path()).ok()?;
        let tail = String::from_utf8_lossy(&text[text.len().saturating_sub(100)..]).into_owned();
        Some((text.len() as u64, tail.contains("log truncated")))
    };
    let run = async {
        daemon
            .wait_completed(&standin, 1, Duration::from_secs(600))
            .await;
        eventually("the log saved to its cap", Duration::from_secs(600), || {
            saved().is_some_and(|(_, truncated)| truncated)
        })
        .await;
    };
    let ((peak, anon), ()) = peak_rss_while(daemon.pid(), run).await;
    let (size, _) = saved().unwrap();
    let cap = ephemer_actors_core::provision::container::LOG_CAP;
    eprintln!(
        "1 GiB flood: saved log {size} bytes, daemon peak RSS {} KiB ({} KiB anonymous), {:?}",
        peak / 1024,
        anon / 1024,
        started.elapsed()
    );
    assert!(size <= cap + 100, "the saved log is {size} bytes");
    // What the daemon holds, not the pages of its (debug) binary, which change with its code:
    // the saved log's 16 MiB held in memory would be over this by itself.
    assert!(
        anon < 16 * 1024 * 1024,
        "the daemon's anonymous memory reached {anon} bytes"
    );
    assert_eq!(daemon.stop(Duration::from_secs(60)).await.0, Some(0));
}
