//! The runner version in a container pool's image: learned once per image id by a short run of
//! the image's own listener (`<dir of command>/bin/Runner.Listener --version`, no network,
//! removed at once), then cached until the image behind the name changes (a re-pull).

use std::{cell::RefCell, collections::HashMap, rc::Rc};

use bollard::{
    models::{ContainerCreateBody, HostConfig},
    query_parameters::{
        CreateContainerOptionsBuilder, LogsOptionsBuilder, RemoveContainerOptionsBuilder,
    },
};
use futures_util::StreamExt;

use super::container::{ContainerBackend, PREFIX_LABEL};
use crate::release::Version;

/// Versions by image id.
pub(super) type VersionCache = Rc<RefCell<HashMap<String, Version>>>;

impl ContainerBackend {
    /// The pool's image's runner version; `None` when the image is not on the engine yet or
    /// runs its own entrypoint (no `command` to find the install by).
    pub(super) async fn image_runner_version(self) -> Result<Option<Version>, super::VersionError> {
        let s = self.settings();
        let Some(run) = s.command.first() else {
            return Ok(None);
        };
        let Some(dir) = std::path::Path::new(run).parent() else {
            return Ok(None);
        };
        let listener = dir.join("bin/Runner.Listener").display().to_string();
        let docker = self.docker();
        let id = match docker.inspect_image(&s.image).await {
            Ok(image) => image.id.unwrap_or_default(),
            Err(bollard::errors::Error::DockerResponseServerError {
                status_code: 404, ..
            }) => return Ok(None),
            Err(e) => return Err(super::VersionError::Inspect(s.image.clone(), e.to_string())),
        };
        if let Some(v) = self.versions().borrow().get(&id) {
            return Ok(Some(v.clone()));
        }
        let name = format!(
            "{}-version-{}",
            s.name_prefix,
            crate::vocab::random_suffix()
        );
        let body = version_container(&s.image, &listener, &s.name_prefix);
        let options = CreateContainerOptionsBuilder::new().name(&name).build();
        let said = async {
            docker
                .create_container(Some(options), body)
                .await
                .map_err(|e| e.to_string())?;
            docker
                .start_container(
                    &name,
                    None::<bollard::query_parameters::StartContainerOptions>,
                )
                .await
                .map_err(|e| e.to_string())?;
            let mut wait = docker.wait_container(
                &name,
                None::<bollard::query_parameters::WaitContainerOptions>,
            );
            while wait.next().await.is_some() {}
            let logs = LogsOptionsBuilder::new().stdout(true).stderr(true).build();
            let mut out = String::new();
            let mut stream = docker.logs(&name, Some(logs));
            while let Some(Ok(chunk)) = stream.next().await {
                out.push_str(&chunk.to_string());
            }
            Ok::<_, String>(out)
        };
        let said = tokio::time::timeout(std::time::Duration::from_secs(60), said)
            .await
            .unwrap_or_else(|_| Err("no answer within 60 s".into()));
        let remove = RemoveContainerOptionsBuilder::new().force(true).build();
        let _ = docker.remove_container(&name, Some(remove)).await;
        let said =
            said.map_err(|e| super::VersionError::Run(listener.clone(), s.image.clone(), e))?;
        let version = said.lines().find_map(Version::parse).ok_or_else(|| {
            super::VersionError::Said(listener.clone(), s.image.clone(), said.trim().to_string())
        })?;
        self.versions().borrow_mut().insert(id, version.clone());
        Ok(Some(version))
    }
}

/// A container of `image` that runs `listener --version` and nothing else: labelled as the
/// pool's (so a crash leaves nothing the start-up sweep misses), no network, no capability.
fn version_container(image: &str, listener: &str, name_prefix: &str) -> ContainerCreateBody {
    ContainerCreateBody {
        image: Some(image.to_string()),
        entrypoint: Some(vec![listener.to_string()]),
        cmd: Some(vec!["--version".into()]),
        labels: Some(HashMap::from([(
            PREFIX_LABEL.to_string(),
            name_prefix.to_string(),
        )])),
        host_config: Some(HostConfig {
            network_mode: Some("none".into()),
            privileged: Some(false),
            cap_drop: Some(vec!["ALL".into()]),
            security_opt: Some(vec!["no-new-privileges".into()]),
            ..HostConfig::default()
        }),
        ..ContainerCreateBody::default()
    }
}
