//! The releases API of `actions/runner` and the archive download, through the GitHub client's
//! own HTTP stack (the first target's `github.proxy` and `github.ca_file`).

use std::{path::Path, time::Duration};

use futures_util::StreamExt;
use sha2::Digest;
use tokio::io::AsyncWriteExt;

use super::{Archive, Release, ReleaseError, Version};
use crate::config::GithubConfig;

/// The most an archive may weigh (a real one is about 200 MB).
const MAX_ARCHIVE: u64 = 1 << 30;
/// How long a download may take in all.
const DOWNLOAD_TIMEOUT: Duration = Duration::from_secs(30 * 60);

pub use super::policy::Looked;

/// A client of the releases API.
#[derive(Clone)]
pub struct ReleaseClient {
    http: awc::Client,
    url: String,
    platform: String,
}

impl std::fmt::Debug for ReleaseClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReleaseClient")
            .field("url", &self.url)
            .field("platform", &self.platform)
            .finish()
    }
}

impl ReleaseClient {
    /// A client of `releases_url` (`.../repos/actions/runner/releases`) for `platform`'s
    /// archives, through `github`'s proxy and CA.
    pub fn new(github: &GithubConfig, releases_url: &str, platform: &str) -> ReleaseClient {
        // GitHub's own stack (proxy, trusted roots, timeouts, user agent); the archive is
        // served through redirects to its storage.
        let http = crate::github::client::http_client(github, Duration::from_secs(60))
            .max_redirects(5)
            .finish();
        ReleaseClient {
            http,
            url: releases_url.trim_end_matches('/').to_string(),
            platform: platform.to_string(),
        }
    }

    /// The latest release (or the pinned one), conditionally on `etag`.
    pub async fn look(
        &self,
        pinned: Option<&Version>,
        etag: Option<&str>,
    ) -> Result<Looked, CheckError> {
        let url = match pinned {
            Some(v) => format!("{}/tags/v{v}", self.url),
            None => format!("{}/latest", self.url),
        };
        let mut request = self
            .http
            .get(&url)
            .insert_header(("Accept", "application/vnd.github+json"));
        if let Some(etag) = etag {
            request = request.insert_header(("If-None-Match", etag));
        }
        let mut answer = request
            .send()
            .await
            .map_err(|e| CheckError::Unreachable(url.clone(), e.to_string()))?;
        let status = answer.status().as_u16();
        match status {
            304 => Ok(Looked::Unchanged),
            404 => Ok(Looked::NotFound),
            200 => {
                let etag = answer
                    .headers()
                    .get("etag")
                    .and_then(|v| v.to_str().ok())
                    .map(str::to_string);
                let body = answer
                    .body()
                    .limit(4 << 20)
                    .await
                    .map_err(|e| CheckError::Read(url.clone(), e.to_string()))?;
                Ok(Looked::Found(
                    Release::from_json(&body, &self.platform)?,
                    etag,
                ))
            }
            other => Err(CheckError::Status(url, other)),
        }
    }

    /// Downloads `archive` to `dest`, hashing it as it streams; returns its SHA-256.
    pub async fn download(&self, archive: &Archive, dest: &Path) -> Result<[u8; 32], CheckError> {
        let write =
            |e: std::io::Error| CheckError::Write(dest.display().to_string(), e.to_string());
        let fetch = async {
            let mut answer = self
                .http
                .get(&archive.url)
                .insert_header(("Accept", "application/octet-stream"))
                .send()
                .await
                .map_err(|e| CheckError::Unreachable(archive.url.clone(), e.to_string()))?;
            if !answer.status().is_success() {
                let status = answer.status().as_u16();
                return Err(CheckError::Status(archive.url.clone(), status));
            }
            let mut file = tokio::fs::File::create(dest).await.map_err(write)?;
            let mut hash = sha2::Sha256::new();
            let mut size = 0u64;
            while let Some(chunk) = answer.next().await {
                let chunk =
                    chunk.map_err(|e| CheckError::Read(archive.name.clone(), e.to_string()))?;
                size += chunk.len() as u64;
                if size > MAX_ARCHIVE {
                    return Err(CheckError::TooLarge(archive.name.clone()));
                }
                hash.update(&chunk);
                file.write_all(&chunk).await.map_err(write)?;
            }
            file.flush().await.map_err(write)?;
            Ok(hash.finalize().into())
        };
        tokio::time::timeout(DOWNLOAD_TIMEOUT, fetch)
            .await
            .map_err(|_| CheckError::Slow(archive.name.clone()))?
    }
}

/// Why a look-up or a download failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CheckError {
    /// No answer from the URL.
    #[error("cannot reach {0}: {1}")]
    Unreachable(String, String),
    /// An answer that is not a success.
    #[error("{0} answered {1}")]
    Status(String, u16),
    /// The answer's body broke off.
    #[error("reading {0}: {1}")]
    Read(String, String),
    /// The archive could not be written to disk.
    #[error("cannot write {0}: {1}")]
    Write(String, String),
    /// An archive over the size any runner release has.
    #[error("{0} is larger than {MAX_ARCHIVE} bytes")]
    TooLarge(String),
    /// A download slower than the time it is given.
    #[error("downloading {0} took over {DOWNLOAD_TIMEOUT:?}")]
    Slow(String),
    /// The answer was not a release.
    #[error(transparent)]
    Release(#[from] ReleaseError),
}
