//! A private Podman service for the container tests: `podman system service` on a socket in a
//! temp dir, with the containers.conf these machines need (runc, ulimits podman may set), and a
//! tiny runner image built from busybox-static plus the daemon binary (for `standin-runner`).
//!
//! When podman or runc is missing, the tests using this skip with a loud message, unless
//! `EPHEMER_REQUIRE_ENGINES` is set (`.ci/run` sets it after installing them): then a test that
//! cannot start the engine fails instead.

use std::{
    path::{Path, PathBuf},
    process::Stdio,
    time::Duration,
};

use tokio::process::{Child, Command};

use super::which;

/// The image the container tests run.
pub const IMAGE: &str = "localhost/ephemer-standin-runner:test";

/// What makes podman work on these machines (cgroup v1 hybrid, no CAP_SYS_RESOURCE).
pub const CONTAINERS_CONF: &str = r#"[containers]
default_ulimits = ["nofile=20000:20000", "nproc=32768:32768"]

[engine]
runtime = "runc"
"#;

/// A running private podman service.
pub struct Podman {
    /// `unix:///.../podman.sock`
    pub socket: String,
    dir: tempfile::TempDir,
    service: Child,
}

impl Podman {
    /// Starts the service and builds the image; `None` (after a loud message) when podman
    /// cannot run here.
    pub async fn start() -> Option<Podman> {
        Self::start_with_registries("").await
    }

    /// Like [`Podman::start`], with this `registries.conf` (a test's own registry, say).
    pub async fn start_with_registries(registries: &str) -> Option<Podman> {
        Self::start_with(registries, None).await
    }

    /// Like [`Podman::start`], every container taking `boot` more to start: an OCI prestart
    /// hook that sleeps, as an image whose container is slow to become ready (large layers,
    /// a per-container network set-up) makes every start wait. An exec in a running container
    /// does not run it.
    pub async fn start_with_boot_delay(boot: Duration) -> Option<Podman> {
        Self::start_with("", Some(boot)).await
    }

    async fn start_with(registries: &str, boot: Option<Duration>) -> Option<Podman> {
        for tool in ["podman", "runc", "tar", "ldd"] {
            if which(tool).is_none() {
                container_skip(&format!(
                    "`{tool}` is not installed (bash .ci/run installs podman, runc and catatonit)"
                ));
                return None;
            }
        }
        let dir = tempfile::tempdir().expect("temp dir");
        let conf = dir.path().join("containers.conf");
        let mut conf_text = CONTAINERS_CONF.to_string();
        if let Some(boot) = boot {
            let hooks = dir.path().join("hooks.d");
            std::fs::create_dir_all(&hooks).unwrap();
            let hook = serde_json::json!({
                "version": "1.0.0",
                "hook": { "path": "/bin/sleep", "args": ["sleep", format!("{}", boot.as_secs_f64())] },
                "when": { "always": true },
                "stages": ["prestart"],
            });
            std::fs::write(hooks.join("boot-delay.json"), hook.to_string()).unwrap();
            conf_text.push_str(&format!("hooks_dir = [\"{}\"]\n", hooks.display()));
        }
        std::fs::write(&conf, conf_text).unwrap();
        std::fs::write(dir.path().join("registries.conf"), registries).unwrap();
        let sock = dir.path().join("podman.sock");
        let socket = format!("unix://{}", sock.display());
        let service = Command::new("podman")
            .args(["system", "service", "--time=0", &socket])
            .env("CONTAINERS_CONF", &conf)
            .env(
                "CONTAINERS_REGISTRIES_CONF",
                dir.path().join("registries.conf"),
            )
            // conmon writes an `oom` marker into its working directory when a container is
            // OOM-killed: keep it in the temp dir, not the checkout.
            .current_dir(dir.path())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .expect("start podman system service");
        let podman = Podman {
            socket,
            dir,
            service,
        };
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        while !podman.answers().await {
            if tokio::time::Instant::now() > deadline {
                container_skip(&format!(
                    "podman system service did not answer on {}",
                    podman.socket
                ));
                return None;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        podman.build_image().await;
        Some(podman)
    }

    async fn answers(&self) -> bool {
        let path = self.socket.trim_start_matches("unix://").to_string();
        let Ok(mut s) = tokio::net::UnixStream::connect(&path).await else {
            return false;
        };
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        if s.write_all(b"GET /_ping HTTP/1.1\r\nHost: d\r\nConnection: close\r\n\r\n")
            .await
            .is_err()
        {
            return false;
        }
        let mut buf = Vec::new();
        let _ = s.read_to_end(&mut buf).await;
        String::from_utf8_lossy(&buf).contains(" 200 ")
    }

    /// `podman` with this service's config.
    pub fn cli(&self) -> Command {
        let mut c = Command::new("podman");
        c.envs(self.env());
        c
    }

    /// What points a `podman` command at this service's configuration.
    fn env(&self) -> [(&'static str, PathBuf); 2] {
        [
            ("CONTAINERS_CONF", self.dir.path().join("containers.conf")),
            (
                "CONTAINERS_REGISTRIES_CONF",
                self.dir.path().join("registries.conf"),
            ),
        ]
    }

    /// busybox-static + the daemon binary and the shared libraries it links. Imported once
    /// per build of the binary (a label says which), and the images it replaces are pruned:
    /// every test starts a service, and an import per test filled the disk.
    async fn build_image(&self) {
        // One import at a time on this machine: two tests importing at once each prune the
        // other's fresh image before it is tagged.
        let lock = std::fs::File::create(std::env::temp_dir().join("ephemer-test-image.lock"))
            .expect("image lock file");
        lock.lock().expect("image lock");
        let daemon = PathBuf::from(env!("CARGO_BIN_EXE_ephemer-actors"));
        let meta = std::fs::metadata(&daemon).unwrap();
        let build = format!(
            "{}-{}",
            meta.len(),
            meta.modified()
                .unwrap()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos()
        );
        let current = self
            .cli()
            .args([
                "image",
                "inspect",
                "--format",
                "{{index .Labels \"ephemer.build\"}}",
                IMAGE,
            ])
            .output()
            .await
            .unwrap();
        if String::from_utf8_lossy(&current.stdout).trim() == build {
            return;
        }
        let root = self.dir.path().join("rootfs");
        std::fs::create_dir_all(root.join("bin")).unwrap();
        std::fs::create_dir_all(root.join("usr/local/bin")).unwrap();
        std::fs::create_dir_all(root.join("tmp")).unwrap();
        let busybox = ["/bin/busybox", "/usr/bin/busybox"]
            .into_iter()
            .map(PathBuf::from)
            .find(|p| p.exists());
        if let Some(bb) = busybox {
            std::fs::copy(bb, root.join("bin/busybox")).unwrap();
            for applet in [
                "sh", "sleep", "cat", "ls", "head", "tail", "yes", "echo", "env",
            ] {
                let _ = std::os::unix::fs::symlink("busybox", root.join("bin").join(applet));
            }
        }
        let inside = root.join("usr/local/bin/ephemer-actors");
        std::fs::copy(&daemon, &inside).unwrap();
        // A debug build is mostly debug info (some 270 MB of 350): without it every import, save
        // and layer copy of the image moves a fifth of the bytes. `strip` comes with the
        // linker's binutils; without it the image is only bigger.
        if which("strip").is_some() {
            let _ = Command::new("strip")
                .arg("--strip-debug")
                .arg(&inside)
                .status()
                .await;
        }
        for lib in shared_libs(&daemon).await {
            let target = root.join(lib.strip_prefix("/").unwrap());
            std::fs::create_dir_all(target.parent().unwrap()).unwrap();
            std::fs::copy(&lib, &target).unwrap();
        }
        let tar = self.dir.path().join("rootfs.tar");
        let ok = Command::new("tar")
            .arg("-C")
            .arg(&root)
            .arg("-cf")
            .arg(&tar)
            .arg(".")
            .status()
            .await
            .unwrap();
        assert!(ok.success(), "tar the runner rootfs");
        let out = self
            .cli()
            .arg("import")
            .arg("--change")
            .arg(format!("LABEL=ephemer.build={build}"))
            .arg(&tar)
            .arg(IMAGE)
            .output()
            .await
            .unwrap();
        assert!(
            out.status.success(),
            "podman import: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        // The image this one replaced, unless a container still uses it.
        let _ = self
            .cli()
            .args(["image", "prune", "-f"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .await;
    }

    /// An image `tag` built from [`IMAGE`] with a label of its own (a distinct image, as a
    /// pool's own image would be); removed with [`Podman::untag`].
    pub async fn build_variant(&self, tag: &str, label: &str) {
        let ctx = self.dir.path().join(format!("build-{label}"));
        std::fs::create_dir_all(&ctx).unwrap();
        std::fs::write(
            ctx.join("Containerfile"),
            format!("FROM {IMAGE}\nLABEL ephemer.variant={label}\n"),
        )
        .unwrap();
        self.build(tag, &ctx).await;
    }

    /// Builds the `Containerfile` in `ctx` as `tag` (no pulls: from [`IMAGE`] and local files).
    pub async fn build(&self, tag: &str, ctx: &Path) {
        let out = self
            .cli()
            .args(["build", "--pull=never", "-t", tag])
            .arg(ctx)
            .output()
            .await
            .unwrap();
        assert!(
            out.status.success(),
            "podman build {tag}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// Removes an image name (the image goes when no other name or container holds it).
    pub async fn untag(&self, tag: &str) {
        let _ = self
            .cli()
            .args(["rmi", "--force", tag])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .await;
    }

    /// A guard that removes `tag` from the engine's storage when it is dropped, so a test
    /// that fails half-way leaves no tag of its own behind. Declare it after the `Podman` (it
    /// uses its configuration, so it must go first).
    pub fn untag_on_drop(&self, tag: &str) -> Untag {
        Untag {
            env: self.env(),
            tag: tag.to_string(),
        }
    }

    /// Names of every container the service holds.
    pub async fn container_names(&self) -> String {
        let out = self
            .cli()
            .args(["--url", &self.socket, "ps", "-a", "--format", "{{.Names}}"])
            .output()
            .await
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// A temp dir that lives as long as the service.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for Podman {
    fn drop(&mut self) {
        let _ = self.service.start_kill();
    }
}

/// See [`Podman::untag_on_drop`].
pub struct Untag {
    env: [(&'static str, PathBuf); 2],
    tag: String,
}

impl Drop for Untag {
    fn drop(&mut self) {
        let _ = std::process::Command::new("podman")
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .args(["rmi", "--force", &self.tag])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

/// The shared libraries (and the loader) `binary` needs, as absolute host paths.
async fn shared_libs(binary: &Path) -> Vec<PathBuf> {
    let out = Command::new("ldd").arg(binary).output().await.unwrap();
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .filter(|w| w.starts_with('/'))
        .map(PathBuf::from)
        .filter(|p| p.exists())
        .collect()
}

fn container_skip(why: &str) {
    super::skip("container", why);
}
