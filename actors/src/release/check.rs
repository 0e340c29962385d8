//! The releases API of `actions/runner` and the archive download, through the GitHub client's
//! own HTTP stack (the first target's `github.proxy` and `github.ca_file`).

use std::{path::Path, time::Duration};

use futures_util::StreamExt;
use sha2::Digest;
use tokio::io::AsyncWriteExt;

use super::{Archive, Release, Version};
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
    ) -> Result<Looked, String> {
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
            .map_err(|e| format!("cannot reach {url}: {e}"))?;
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
                    .map_err(|e| format!("reading {url}: {e}"))?;
                Release::from_json(&body, &self.platform).map(|r| Looked::Found(r, etag))
            }
            other => Err(format!("{url} answered {other}")),
        }
    }

    /// Downloads `archive` to `dest`, hashing it as it streams; returns its SHA-256.
    pub async fn download(&self, archive: &Archive, dest: &Path) -> Result<[u8; 32], String> {
        let fetch = async {
            let mut answer = self
                .http
                .get(&archive.url)
                .insert_header(("Accept", "application/octet-stream"))
                .send()
                .await
                .map_err(|e| format!("cannot download {}: {e}", archive.url))?;
            if !answer.status().is_success() {
                return Err(format!("{} answered {}", archive.url, answer.status()));
            }
            let mut file = tokio::fs::File::create(dest)
                .await
                .map_err(|e| format!("cannot write {}: {e}", dest.display()))?;
            let mut hash = sha2::Sha256::new();
            let mut size = 0u64;
            while let Some(chunk) = answer.next().await {
                let chunk = chunk.map_err(|e| format!("downloading {}: {e}", archive.name))?;
                size += chunk.len() as u64;
                if size > MAX_ARCHIVE {
                    return Err(format!(
                        "{} is larger than {MAX_ARCHIVE} bytes",
                        archive.name
                    ));
                }
                hash.update(&chunk);
                file.write_all(&chunk)
                    .await
                    .map_err(|e| format!("cannot write {}: {e}", dest.display()))?;
            }
            file.flush()
                .await
                .map_err(|e| format!("cannot write {}: {e}", dest.display()))?;
            Ok(hash.finalize().into())
        };
        tokio::time::timeout(DOWNLOAD_TIMEOUT, fetch)
            .await
            .map_err(|_| {
                format!(
                    "downloading {} took over {DOWNLOAD_TIMEOUT:?}",
                    archive.name
                )
            })?
    }
}
