//! Real fleets on a real engine (podman): named pools of one kind with their own images and
//! labels beside an old-style table; a container's environment, named volumes and tmpfs.

use std::{path::Path, time::Duration};

use crate::support::{
    daemon::Daemon,
    podman::{IMAGE, Podman},
};

/// The stand-in runner in a container, on the host network (it calls the stand-in).
const RUNNER: &str =
    "command = [\"/usr/local/bin/ephemer-actors\", \"standin-runner\"]\nnetwork = \"host\"";

/// Two linux pools (a slim and a "gpu" image, different labels) and the old-style local table:
/// check-config passes, each job runs in the pool whose labels fit it best, and `status` and
/// the metrics name the pools.
#[actix_rt::test]
async fn jobs_go_to_the_named_pool_whose_labels_fit() {
    let Some(podman) = Podman::start().await else {
        return;
    };
    let run = std::process::id();
    let (slim, gpu) = (
        format!("localhost/ephemer-runner-slim:{run}"),
        format!("localhost/ephemer-runner-gpu:{run}"),
    );
    let _untag = (podman.untag_on_drop(&slim), podman.untag_on_drop(&gpu));
    podman.build_variant(&slim, "slim").await;
    podman.build_variant(&gpu, "gpu").await;
    let standin = crate::support::standin(200);
    let socket = &podman.socket;
    let providers = format!(
        r#"
[providers.linux-slim]
kind = "linux"
socket = "{socket}"
image = "{slim}"
labels = ["self-hosted", "linux", "x64"]
max_concurrent = 2
{RUNNER}

[providers.linux-gpu]
kind = "linux"
socket = "{socket}"
image = "{gpu}"
labels = ["self-hosted", "linux", "gpu"]
max_concurrent = 1
{RUNNER}

{local}
"#,
        local = crate::support::daemon::local_provider(1)
            .replace("\"linux\", \"x64\"]", "\"linux\", \"local\"]"),
    );
    let daemon = Daemon::start(&standin, "", &providers).await;
    let out = crate::support::daemon()
        .args(["check-config", "--config"])
        .arg(&daemon.config)
        .output()
        .await
        .unwrap();
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{said}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(said.contains("linux-gpu (linux, 1 slots)"), "{said}");

    let x64 = standin.queue_jobs("app", &["self-hosted", "linux", "x64"], 2);
    let gpus = standin.queue_jobs("app", &["self-hosted", "linux", "gpu"], 2);
    let local = standin.queue_jobs("app", &["self-hosted", "local"], 1);
    daemon
        .wait_completed(&standin, 5, Duration::from_secs(120))
        .await;
    let prefix = daemon.prefix();
    let ran_on = |job: u64| {
        standin
            .jobs()
            .into_iter()
            .find(|j| j.id == job)
            .and_then(|j| j.runner_name)
            .unwrap()
    };
    for (jobs, pool) in [
        (&x64, "linux-slim"),
        (&gpus, "linux-gpu"),
        (&local, "local"),
    ] {
        for &job in jobs {
            let runner = ran_on(job);
            assert!(
                runner.starts_with(&format!("{prefix}-{pool}-")),
                "job {job} ran on {runner}, not in pool {pool}"
            );
        }
    }

    let status = daemon.ctl_json(&["status"]).await;
    let pools: Vec<(String, String)> = status["providers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            (
                p["provider"].as_str().unwrap().to_string(),
                p["kind"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    for (name, kind) in [
        ("linux-gpu", "linux"),
        ("linux-slim", "linux"),
        ("local", "local"),
    ] {
        assert!(
            pools.contains(&(name.to_string(), kind.to_string())),
            "{pools:?}"
        );
    }
    let metrics = daemon.metrics().await;
    assert!(
        metrics.contains(r#"ephemerd_jobs_total{conclusion="success",provider="linux-gpu"} 2"#),
        "{metrics}"
    );
    assert!(
        metrics.contains(r#"ephemerd_jobs_total{conclusion="success",provider="linux-slim"} 2"#),
        "{metrics}"
    );
    daemon.wait_no_runner_left(&standin).await;
    assert_eq!(daemon.stop(Duration::from_secs(30)).await.0, Some(0));
}

/// A container's view, written to a bind-mounted directory by a wrapper around the stand-in
/// runner: its environment, and whether the named volume and the tmpfs held a mark from an
/// earlier job.
const PROBE: &str = "id=$(cat /proc/sys/kernel/random/uuid); env > /out/$id.env; \
    { if [ -e /cache/mark ]; then echo cache=kept; else echo cache=new; fi; \
      if [ -e /scratch/mark ]; then echo scratch=kept; else echo scratch=new; fi; \
      while read dev at fs rest; do if [ $at = /scratch ]; then echo scratch_fs=$fs; fi; done < /proc/mounts; \
    } > /out/$id.seen; \
    { while read dev at fs opts rest; do if [ $at = /dev/shm ]; then echo shm=$opts; fi; done < /proc/mounts; \
      while read ip name rest; do if [ \\\"$name\\\" = ghe.internal ]; then echo host=$ip; fi; done < /etc/hosts; \
    } > /out/$id.extra; \
    echo x > /cache/mark; echo x > /scratch/mark; \
    exec /usr/local/bin/ephemer-actors standin-runner";

/// Two jobs one after the other in one pool: the named volume keeps what the first wrote, the
/// tmpfs does not; each container sees the proxy, the CA bundle (mounted) and the pool's `env`,
/// and no variable of the daemon's own.
#[actix_rt::test]
async fn a_named_volume_outlives_a_job_and_a_tmpfs_does_not() {
    let Some(podman) = Podman::start().await else {
        return;
    };
    let standin = crate::support::standin(100);
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    std::fs::create_dir_all(&out).unwrap();
    let ca = dir.path().join("ca.pem");
    std::fs::write(&ca, crate::support::tls::test_ca().ca_pem).unwrap();
    let volume = format!("ephemer-test-cache-{}", std::process::id());
    let github = format!(
        "proxy = \"http://127.0.0.1:9\"\nno_proxy = [\"127.0.0.1\", \"localhost\"]\nca_file = \"{}\"\n",
        ca.display()
    );
    let providers = format!(
        r#"
[providers.linux]
socket = "{socket}"
image = "{IMAGE}"
labels = ["self-hosted", "linux", "x64"]
max_concurrent = 1
network = "host"
command = ["/bin/sh", "-c", "{PROBE}"]
volumes = ["{volume}:/cache", "{out}:/out"]
tmpfs = ["/scratch"]
shm_size = "64MiB"
extra_hosts = ["ghe.internal:10.0.0.5"]
env = {{ TEAM_TOKEN = "${{TEST_TEAM_TOKEN}}" }}
"#,
        socket = podman.socket,
        out = out.display(),
    );
    let daemon = Daemon::start_with_env(
        &standin,
        &github,
        &providers,
        &[
            ("TEST_TEAM_TOKEN", "team-7f3a"),
            ("CANARY_NOT_FOR_RUNNERS", "leak"),
        ],
    )
    .await;
    standin.queue_jobs("app", &["self-hosted", "linux", "x64"], 2);
    daemon
        .wait_completed(&standin, 2, Duration::from_secs(120))
        .await;
    daemon.wait_no_runner_left(&standin).await;

    let mut seen = files(&out, "seen");
    seen.sort();
    assert_eq!(
        seen,
        [
            "cache=kept\nscratch=new\nscratch_fs=tmpfs\n",
            "cache=new\nscratch=new\nscratch_fs=tmpfs\n"
        ],
        "the first job found nothing; the second found the volume's mark and no tmpfs mark"
    );
    assert_eq!(files(&out, "extra").len(), 2);
    assert_eq!(files(&out, "env").len(), 2);
    for extra in files(&out, "extra") {
        assert!(extra.contains("host=10.0.0.5\n"), "extra_hosts: {extra}");
        assert!(
            extra
                .lines()
                .any(|l| l.starts_with("shm=") && l.contains("size=65536k")),
            "shm_size: {extra}"
        );
    }
    for env in files(&out, "env") {
        // What the engine itself sets in every container.
        let engine = ["HOSTNAME", "container", "TERM"];
        crate::support::check_runner_env(
            &env,
            &engine,
            &[
                "HTTPS_PROXY=http://127.0.0.1:9",
                "NO_PROXY=127.0.0.1,localhost",
                "SSL_CERT_FILE=/etc/ephemer-actors/ca-bundle.pem",
                "TEAM_TOKEN=team-7f3a",
            ],
        );
        assert!(!env.contains("leak"), "{env}");
    }
    assert_eq!(daemon.stop(Duration::from_secs(30)).await.0, Some(0));
    let _ = podman
        .cli()
        .args(["--url", &podman.socket, "volume", "rm", "-f", &volume])
        .status()
        .await;
}

/// The contents of the files in `dir` whose names end in `.ext`.
fn files(dir: &Path, ext: &str) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == ext))
        .map(|p| std::fs::read_to_string(p).unwrap())
        .collect()
}

/// A linux pool whose image the engine lacks: three jobs at once wait for one pull (from a
/// registry the test serves), then run; a pool with `pull = "never"` and a missing image fails
/// its job at once, for good, and says why in `status`; a pull the registry fails with a 503
/// puts its job on the ladder, and the job runs once the registry is back.
#[actix_rt::test]
async fn a_missing_image_is_pulled_once_for_concurrent_jobs() {
    use crate::support::registry::Registry;
    let layout = tempfile::tempdir().unwrap();
    let tag = format!("t{}", std::process::id());
    let registry = Registry::start(layout.path().join("oci"), &tag);
    let registries = format!(
        "[[registry]]\nlocation = \"{}\"\ninsecure = true\n",
        registry.addr
    );
    let Some(podman) = Podman::start_with_registries(&registries).await else {
        return;
    };
    let saved = podman
        .cli()
        .args(["save", "--format", "oci-dir", "-o"])
        .arg(layout.path().join("oci"))
        .arg(IMAGE)
        .output()
        .await
        .unwrap();
    assert!(
        saved.status.success(),
        "{}",
        String::from_utf8_lossy(&saved.stderr)
    );
    let image = format!("{}/ephemer/pulltest:{tag}", registry.addr);
    let absent = format!("{}/ephemer/absent:{tag}", registry.addr);
    podman.untag(&image).await;
    let _untag = podman.untag_on_drop(&image);

    let standin = crate::support::standin(300);
    let providers = format!(
        r#"
[providers.pulled]
kind = "linux"
socket = "{socket}"
image = "{image}"
labels = ["self-hosted", "linux", "x64"]
max_concurrent = 3
{RUNNER}

[providers.never]
kind = "linux"
socket = "{socket}"
image = "{absent}"
pull = "never"
labels = ["self-hosted", "linux", "never"]
max_concurrent = 1
{RUNNER}

[providers.always]
kind = "linux"
socket = "{socket}"
image = "{image}"
pull = "always"
labels = ["self-hosted", "linux", "always"]
max_concurrent = 1
{RUNNER}
"#,
        socket = podman.socket,
    );
    // A retry would come a second after a retryable failure.
    let ladder = "[runner.claim_retry]\nschedule = [\"1s\"]\njitter = 0.0\n";
    let daemon = Daemon::start(&standin, ladder, &providers).await;
    standin.queue_jobs("app", &["self-hosted", "linux", "x64"], 3);
    daemon
        .wait_completed(&standin, 3, Duration::from_secs(120))
        .await;
    let logs = daemon.logs();
    assert_eq!(
        logs.matches("pulling the runner image").count(),
        1,
        "one pull for three jobs:\n{logs}"
    );
    assert_eq!(
        registry.manifest_gets("ephemer/pulltest"),
        1,
        "{:?}",
        registry.requests()
    );
    assert_eq!(
        daemon.ctl_json(&["jobs", "1001"]).await["retry"],
        serde_json::Value::Null
    );

    let never = standin.queue_jobs("app", &["self-hosted", "linux", "never"], 1)[0];
    let failed = || async {
        let status = daemon.ctl_json(&["status"]).await;
        status["providers"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["provider"] == "never")
            .and_then(|p| p["last_environment_failure"].as_str().map(String::from))
            .is_some_and(|why| why.contains("pull = \"never\""))
    };
    crate::support::provision::eventually_async(
        "the never pool's failure in status",
        Duration::from_secs(30),
        failed,
    )
    .await;
    // Non-retryable: one environment, no second attempt on the ladder, and the engine never
    // asked the registry for the image.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let metrics = daemon.metrics().await;
    assert!(
        metrics.contains(r#"ephemerd_environment_failures_total{provider="never"} 1"#),
        "{metrics}"
    );
    let jobs = daemon.ctl_json(&["jobs", &never.to_string()]).await;
    assert!(jobs["retry"].is_null(), "{jobs}");
    assert_eq!(registry.manifest_gets("ephemer/absent"), 0);

    // The registry's bad minute: a 503 may pass, so the job climbs the ladder (a second apart
    // here) instead of ending its attempts, and runs once the registry answers again.
    registry.set_down(true);
    let always = standin.queue_jobs("app", &["self-hosted", "linux", "always"], 1)[0];
    // The stand-in sends its deliveries on their own tasks, so the daemon may not know the job
    // yet at the first look: `jobs` then answers 404 and the look is simply not yet true.
    let on_the_ladder = || async {
        let (code, out, _) = daemon.ctl(&["jobs", &always.to_string(), "--json"]).await;
        let job: serde_json::Value = match code {
            0 => serde_json::from_str(&out).unwrap(),
            _ => return false,
        };
        !job["retry"].is_null() && job.to_string().contains("503")
    };
    crate::support::provision::eventually_async(
        "the job of a failed pull on the ladder",
        Duration::from_secs(60),
        on_the_ladder,
    )
    .await;
    let status = |id| {
        standin
            .jobs()
            .into_iter()
            .find(|j| j.id == id)
            .map(|j| j.status)
    };
    assert_eq!(status(always).as_deref(), Some("queued"));
    registry.set_down(false);
    daemon
        .wait_completed(&standin, 4, Duration::from_secs(60))
        .await;
    let logs = daemon.logs();
    assert!(logs.contains("runner image pull failed"), "{logs}");
    daemon.wait_no_runner_left(&standin).await;
    assert_eq!(daemon.stop(Duration::from_secs(30)).await.0, Some(0));
}
