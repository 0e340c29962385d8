//! The `linux` pool's image and mounts: pulling the runner image as the pool's `pull` policy
//! says (one pull at a time, shared by every job that waits for it), and what each container
//! gets mounted.

use std::{cell::RefCell, collections::HashMap, rc::Rc};

use bollard::{
    Docker,
    models::{DeviceMapping, DeviceRequest, HostConfig},
    query_parameters::CreateImageOptionsBuilder,
};
use futures_util::{
    FutureExt, StreamExt,
    future::{LocalBoxFuture, Shared},
};

use super::{CONTAINER_CA_PATH, ProvisionError, container::ContainerSettings};
use crate::config::PullPolicy;

/// How often a pull's progress is logged, in engine status lines (podman and Docker send one
/// per layer step).
const PROGRESS_EVERY: usize = 25;

/// A pull's outcome: the failure says what the engine said and whether pulling again can help.
type PullResult = Result<(), PullFailure>;

/// Why a pull failed.
#[derive(Debug, Clone, PartialEq, Eq)]
struct PullFailure {
    message: String,
    /// The registry or the engine said the image cannot be had as configured (no such image or
    /// tag, no access, a malformed name, no build for this platform): pulling again fails the
    /// same until an operator changes something. Anything else (a refused or dropped
    /// connection, a timeout, a 5xx, a registry's rate limit) may pass.
    lasting: bool,
}

impl PullFailure {
    /// Sorts what the engine said. Only what names the image or its access as wrong lasts:
    /// a failure that is not known to last is worth the ladder, since a job whose attempts end
    /// on a registry's bad minute would sit queued.
    fn from_message(message: String) -> PullFailure {
        const LASTING: [&str; 9] = [
            "manifest unknown",
            "name unknown",
            "repository does not exist",
            "unauthorized",
            "authentication required",
            "denied",
            "invalid reference format",
            "no image found in manifest list",
            "no matching manifest",
        ];
        let lower = message.to_ascii_lowercase();
        let lasting = LASTING.iter().any(|m| lower.contains(m));
        PullFailure { message, lasting }
    }
}

/// The pull in flight, if any: jobs that need the image while it is pulled wait for that one
/// pull instead of starting their own.
#[derive(Clone, Default)]
pub(super) struct ImageGate {
    inflight: Rc<RefCell<Option<Shared<LocalBoxFuture<'static, PullResult>>>>>,
}

impl std::fmt::Debug for ImageGate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ImageGate")
    }
}

impl ImageGate {
    /// Makes sure the image is on the engine before a job's container is created. A missing
    /// image with `pull = "never"`, or a pull that fails, ends this job's attempts (the same
    /// image would fail the same way); the pool stays up and `status` shows the failure.
    pub(super) async fn ready(
        &self,
        docker: &Docker,
        s: &ContainerSettings,
    ) -> Result<(), ProvisionError> {
        let engine = |e: bollard::errors::Error| {
            ProvisionError::HostUnavailable(format!(
                "cannot reach the container engine at {}: {e}",
                s.socket
            ))
        };
        match s.pull {
            PullPolicy::Never => {
                if present(docker, &s.image).await.map_err(engine)? {
                    Ok(())
                } else {
                    Err(ProvisionError::Rejected(format!(
                        "the runner image {} is not on the engine and the pool's pull = \"never\"; \
                         load it (podman pull / docker pull) or set pull = \"missing\"",
                        s.image
                    )))
                }
            }
            PullPolicy::Missing if present(docker, &s.image).await.map_err(engine)? => Ok(()),
            PullPolicy::Missing | PullPolicy::Always => {
                let pull = self.join(docker, &s.image);
                pull.await.map_err(|e| {
                    let what = format!("cannot pull the runner image {}: {}", s.image, e.message);
                    if e.lasting {
                        ProvisionError::Rejected(what)
                    } else {
                        ProvisionError::EnvironmentFailed(what)
                    }
                })
            }
        }
    }

    /// The pull in flight, or a new one.
    fn join(&self, docker: &Docker, image: &str) -> Shared<LocalBoxFuture<'static, PullResult>> {
        if let Some(pull) = self.inflight.borrow().as_ref() {
            return pull.clone();
        }
        let (docker, image_name, slot) = (docker.clone(), image.to_string(), self.inflight.clone());
        let pull = async move {
            let result = pull(&docker, &image_name).await;
            slot.borrow_mut().take();
            result
        }
        .boxed_local()
        .shared();
        *self.inflight.borrow_mut() = Some(pull.clone());
        pull
    }
}

/// `doctor`'s look at the pool's image: on the engine, or (unless `pull = "never"`) known to
/// its registry (`GET /distribution/{name}/json`, which reads the manifest without pulling).
pub(super) async fn doctor(docker: &Docker, s: &ContainerSettings) -> super::Finding {
    use super::Finding;
    let image = &s.image;
    match present(docker, image).await {
        Ok(true) => return Finding::Ok(format!("image {image} is on the engine")),
        Ok(false) => {}
        Err(e) => return Finding::Fail(format!("cannot ask the engine for image {image}: {e}")),
    }
    if s.pull == PullPolicy::Never {
        return Finding::Fail(format!(
            "image {image} is not on the engine and pull = \"never\": pull or load it \
             (podman pull {image}), or set pull = \"missing\""
        ));
    }
    match docker.inspect_registry_image(image, None).await {
        Ok(_) => Finding::Ok(format!(
            "image {image} is not on the engine yet; its registry has it (the first job pulls it)"
        )),
        Err(e) => Finding::Fail(format!(
            "image {image} is not on the engine and cannot be pulled ({e}): check the name and \
             the registry's credentials, or load it (podman pull {image})"
        )),
    }
}

/// Whether the engine has the image.
pub(super) async fn present(docker: &Docker, image: &str) -> Result<bool, bollard::errors::Error> {
    match docker.inspect_image(image).await {
        Ok(_) => Ok(true),
        Err(bollard::errors::Error::DockerResponseServerError {
            status_code: 404, ..
        }) => Ok(false),
        Err(e) => Err(e),
    }
}

/// Pulls `image`, logging its progress and how it ended.
async fn pull(docker: &Docker, image: &str) -> PullResult {
    let result = pull_once(docker, image).await;
    if let Err(e) = &result {
        tracing::warn!(%image, problem = %e.message, lasting = e.lasting, "runner image pull failed");
    }
    result
}

async fn pull_once(docker: &Docker, image: &str) -> PullResult {
    let failed = PullFailure::from_message;
    let (repo, tag) = split_reference(image);
    tracing::info!(%image, "pulling the runner image");
    let options = CreateImageOptionsBuilder::new()
        .from_image(repo)
        .tag(tag)
        .build();
    let mut stream = docker.create_image(Some(options), None, None);
    let mut lines = 0usize;
    while let Some(item) = stream.next().await {
        let info = item.map_err(|e| failed(e.to_string()))?;
        if let Some(detail) = info.error_detail.and_then(|d| d.message) {
            return Err(failed(detail));
        }
        lines += 1;
        if lines % PROGRESS_EVERY == 1
            && let Some(status) = info.status
        {
            tracing::info!(%image, progress = %status, "runner image pull progress");
        }
    }
    if !present(docker, image)
        .await
        .map_err(|e| failed(e.to_string()))?
    {
        return Err(failed(
            "the engine finished the pull without the image".into(),
        ));
    }
    tracing::info!(%image, "runner image pulled");
    Ok(())
}

/// `registry/repo:tag` or `repo@sha256:...` into the Engine API's `fromImage` and `tag`.
fn split_reference(image: &str) -> (&str, &str) {
    if image.contains('@') {
        // Pinned by digest: `fromImage` carries it whole.
        return (image, "");
    }
    let last_slash = image.rfind('/').map_or(0, |i| i + 1);
    match image[last_slash..].rfind(':') {
        Some(i) => (&image[..last_slash + i], &image[last_slash + i + 1..]),
        None => (image, "latest"),
    }
}

/// What a runner container gets mounted: named volumes and binds, tmpfs, `/dev/shm`'s size,
/// devices (paths, or CDI names through Docker's `cdi` device driver), the engine socket when
/// `docker_access` is on, the CA bundle when there is one, and `extra_hosts` and `dns`.
pub(super) fn mounts(s: &ContainerSettings) -> HostConfig {
    let m = &s.mounts;
    let mut binds = m.volumes.clone();
    if m.docker_access
        && let Some(path) = s.socket.strip_prefix("unix://")
    {
        binds.push(format!("{path}:/var/run/docker.sock"));
    }
    if let Some(ca) = &s.env.ca_bundle {
        binds.push(format!("{}:{CONTAINER_CA_PATH}:ro", ca.display()));
    }
    let (paths, cdi): (Vec<&String>, Vec<&String>) =
        m.devices.iter().partition(|d| d.starts_with("/dev/"));
    HostConfig {
        binds: (!binds.is_empty()).then_some(binds),
        tmpfs: (!m.tmpfs.is_empty()).then(|| {
            m.tmpfs
                .iter()
                .map(|t| (t.clone(), String::new()))
                .collect::<HashMap<_, _>>()
        }),
        shm_size: m.shm_size.and_then(|n| i64::try_from(n).ok()),
        devices: (!paths.is_empty()).then(|| {
            paths
                .iter()
                .map(|d| DeviceMapping {
                    path_on_host: Some(d.to_string()),
                    path_in_container: Some(d.to_string()),
                    cgroup_permissions: Some("rwm".into()),
                })
                .collect()
        }),
        device_requests: (!cdi.is_empty()).then(|| {
            vec![DeviceRequest {
                driver: Some("cdi".into()),
                device_ids: Some(cdi.iter().map(|d| d.to_string()).collect()),
                ..DeviceRequest::default()
            }]
        }),
        extra_hosts: (!s.extra_hosts.is_empty()).then(|| s.extra_hosts.clone()),
        dns: (!s.dns.is_empty()).then(|| s.dns.clone()),
        ..HostConfig::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ContainerMounts;

    #[test]
    fn a_pull_that_may_pass_next_time_is_not_taken_as_lasting() {
        // What podman 4.3 and Docker say, word for word.
        let passing = [
            "initializing source docker://r:5000/x:y: pinging container registry r:5000: Get \"https://r:5000/v2/\": dial tcp r:5000: connect: connection refused",
            "initializing source docker://r/x:y: reading manifest y in r/x: received unexpected HTTP status: 503 Service Unavailable",
            "initializing source docker://r/x:y: reading manifest y in r/x: toomanyrequests: You have reached your pull rate limit",
            "Get \"https://r/v2/\": net/http: TLS handshake timeout",
            "error pulling image configuration: download failed after attempts=6: unexpected EOF",
            "the engine finished the pull without the image",
        ];
        for m in passing {
            assert!(!PullFailure::from_message(m.into()).lasting, "{m}");
        }
        let lasting = [
            "initializing source docker://r/x:y: reading manifest y in r/x: manifest unknown",
            "initializing source docker://r/x:y: reading manifest y in r/x: unauthorized",
            "pull access denied for x, repository does not exist or may require 'docker login': denied: requested access to the resource is denied",
            "invalid reference format",
            "choosing an image from manifest list docker://r/x:y: no image found in manifest list for architecture arm64",
        ];
        for m in lasting {
            assert!(PullFailure::from_message(m.into()).lasting, "{m}");
        }
    }

    #[test]
    fn mounts_carry_volumes_devices_the_socket_and_the_ca() {
        let mut s = ContainerSettings::new(
            "gpu".into(),
            "unix:///run/podman/podman.sock".into(),
            "img".into(),
            "p-gpu-".into(),
            "/tmp".into(),
        );
        s.mounts = ContainerMounts {
            volumes: vec!["cache:/cache".into(), "/srv/data:/data:ro".into()],
            tmpfs: vec!["/scratch".into()],
            shm_size: Some(1 << 30),
            devices: vec!["/dev/nvidia0".into(), "nvidia.com/gpu=all".into()],
            docker_access: true,
            allow_host_paths: false,
        };
        s.env.ca_bundle = Some("/var/lib/ephemer-actors/ca-bundle.pem".into());
        s.extra_hosts = vec!["ghe.internal:10.0.0.5".into()];
        let h = mounts(&s);
        assert_eq!(
            h.binds.unwrap(),
            [
                "cache:/cache",
                "/srv/data:/data:ro",
                "/run/podman/podman.sock:/var/run/docker.sock",
                "/var/lib/ephemer-actors/ca-bundle.pem:/etc/ephemer-actors/ca-bundle.pem:ro",
            ]
        );
        assert!(h.tmpfs.unwrap().contains_key("/scratch"));
        assert_eq!(h.shm_size, Some(1 << 30));
        let devices = h.devices.unwrap();
        assert_eq!(devices.len(), 1);
        assert_eq!(devices[0].path_on_host.as_deref(), Some("/dev/nvidia0"));
        let cdi = &h.device_requests.unwrap()[0];
        assert_eq!(cdi.driver.as_deref(), Some("cdi"));
        assert_eq!(
            cdi.device_ids.as_deref(),
            Some(&["nvidia.com/gpu=all".to_string()][..])
        );
        assert_eq!(h.extra_hosts.unwrap(), ["ghe.internal:10.0.0.5"]);
        assert!(h.dns.is_none());

        s.mounts = ContainerMounts::default();
        s.env.ca_bundle = None;
        let h = mounts(&s);
        assert!(h.binds.is_none(), "no engine socket unless docker_access");
    }

    #[test]
    fn references_split_into_repo_and_tag() {
        assert_eq!(
            split_reference("ghcr.io/actions/actions-runner:2.330.0"),
            ("ghcr.io/actions/actions-runner", "2.330.0")
        );
        assert_eq!(
            split_reference("localhost:5000/runner"),
            ("localhost:5000/runner", "latest")
        );
        assert_eq!(
            split_reference("localhost:5000/runner:gpu"),
            ("localhost:5000/runner", "gpu")
        );
        assert_eq!(split_reference("busybox"), ("busybox", "latest"));
    }
}
