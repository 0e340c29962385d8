//! The runner in a container pool's image: its version is learned from the image (a short run
//! of its listener), shown in `/metrics`, and an image older than `runner.min_version` fails
//! `doctor` and raises the below-minimum gauge its alert watches. Two local images of the
//! stand-in runner, one old, one current.

use std::{path::Path, time::Duration};

use crate::support::{
    self,
    daemon::Daemon,
    podman::{IMAGE, Podman},
    provision::eventually_async,
};

/// An image `tag` with a stand-in runner install of `version` at `/runner` (`run.sh`,
/// `bin/Runner.Listener`).
async fn runner_image(podman: &Podman, tag: &str, version: &str) {
    use std::os::unix::fs::PermissionsExt;
    let ctx = podman.dir().join(format!("image-{version}"));
    let bin = ctx.join("runner/bin");
    std::fs::create_dir_all(&bin).unwrap();
    let script = |path: &Path, text: &str| {
        std::fs::write(path, text).unwrap();
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
    };
    script(
        &bin.join("Runner.Listener"),
        &format!("#!/bin/sh\n[ \"$1\" = --version ] && echo {version}\n"),
    );
    script(
        &ctx.join("runner/run.sh"),
        "#!/bin/sh\nexec /usr/local/bin/ephemer-actors standin-runner --root /runner\n",
    );
    std::fs::write(
        ctx.join("Containerfile"),
        format!("FROM {IMAGE}\nCOPY runner /runner\n"),
    )
    .unwrap();
    podman.build(tag, &ctx).await;
}

#[actix_rt::test]
async fn an_image_below_the_minimum_fails_doctor_and_raises_its_gauge() {
    let Some(podman) = Podman::start().await else {
        return;
    };
    let (old, new) = (
        "localhost/ephemer-runner-old:test",
        "localhost/ephemer-runner-new:test",
    );
    let _untag = (podman.untag_on_drop(old), podman.untag_on_drop(new));
    runner_image(&podman, old, "2.300.0").await;
    runner_image(&podman, new, "2.330.0").await;
    let standin = support::standin(300);
    let archive = standin_runner::release_archive(
        "2.330.0",
        Path::new(env!("CARGO_BIN_EXE_ephemer-actors")),
        &["standin-runner"],
    )
    .unwrap();
    standin.publish_release("2.330.0", archive);
    let pools = format!(
        r#"
[providers.old]
kind = "linux"
socket = "{socket}"
image = "{old}"
command = ["/runner/run.sh"]
network = "host"
labels = ["self-hosted", "linux", "old"]
max_concurrent = 1

[providers.new]
kind = "linux"
socket = "{socket}"
image = "{new}"
command = ["/runner/run.sh"]
network = "host"
labels = ["self-hosted", "linux", "new"]
max_concurrent = 1
"#,
        socket = podman.socket
    );
    let daemon = Daemon::start(&standin, "[runner]\nmin_version = \"2.320.0\"\n", &pools).await;
    eventually_async(
        "both images' versions in /metrics",
        Duration::from_secs(60),
        || {
            let daemon = &daemon;
            async move {
                let m = daemon.metrics().await;
                m.contains("ephemerd_runner_version_info{pool=\"old\",version=\"2.300.0\"} 1")
                    && m.contains(
                        "ephemerd_runner_version_info{pool=\"new\",version=\"2.330.0\"} 1",
                    )
            }
        },
    )
    .await;
    let m = daemon.metrics().await;
    assert!(
        m.contains("ephemerd_runner_below_minimum{pool=\"old\"} 1"),
        "{m}"
    );
    assert!(
        m.contains("ephemerd_runner_below_minimum{pool=\"new\"} 0"),
        "{m}"
    );
    assert!(
        m.contains("ephemerd_runner_release_behind_seconds{pool=\"new\"} 0"),
        "{m}"
    );
    assert!(
        !m.contains("ephemerd_runner_release_behind_seconds{pool=\"old\"} -1"),
        "the old image's lag is known: {m}"
    );
    assert!(
        !m.contains("version=\"unknown\""),
        "no pool's version is unknown any more: {m}"
    );
    // The alert's expression holds for the old pool only.
    let rules = std::fs::read_to_string(support::repo_root().join("contrib/alerts.yml")).unwrap();
    assert!(rules.contains("expr: ephemerd_runner_below_minimum == 1"));

    let (code, out, _) = daemon.ctl(&["doctor"]).await;
    assert_eq!(code, 1, "{out}");
    assert!(
        out.lines().any(|l| l.starts_with("FAIL pool.old.runner:")
            && l.contains("runner 2.300.0 is below runner.min_version 2.320.0")),
        "{out}"
    );
    assert!(
        out.lines()
            .any(|l| l.starts_with("ok   pool.new.runner:") && l.contains("runner 2.330.0")),
        "{out}"
    );
    // The status page shows each pool's version and its age against the latest release.
    let (status, page) = support::http_get(&daemon.admin_addr(), "/").await.unwrap();
    assert_eq!(status, 200);
    let runner = page
        .split(r#"id="h-runner""#)
        .nth(1)
        .expect("the page's runner section");
    for want in ["2.300.0", "2.330.0", "current", "behind by"] {
        assert!(runner.contains(want), "{want}: {runner}");
    }
    // A job still runs on the current image.
    let job = standin.queue_jobs("app", &["self-hosted", "linux", "new"], 1)[0];
    daemon
        .wait_completed(&standin, 1, Duration::from_secs(60))
        .await;
    assert!(
        standin
            .jobs()
            .iter()
            .any(|j| j.id == job && j.status == "completed")
    );
    assert_eq!(daemon.stop(Duration::from_secs(30)).await.0, Some(0));
}
