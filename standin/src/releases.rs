//! GitHub's releases API for `actions/runner`, as the daemon reads it to keep its runner current:
//! `GET /repos/actions/runner/releases/latest` and `.../releases/tags/v<version>` (with an `ETag`;
//! `If-None-Match` gets 304), each asset with its `digest` (`sha256:<hex>`) and a
//! `browser_download_url` this server also answers (`/_releases/download/<tag>/<name>`).
//! These live on github.com, not on the GHES whose budget the rest of the stand-in keeps: no
//! budget, no record in `calls` (requests are counted here instead).

use actix_web::{HttpRequest, HttpResponse};
use serde_json::json;

/// One published release of the runner.
#[derive(Debug, Clone)]
pub struct Release {
    /// `2.331.0` (the tag is `v2.331.0`).
    pub version: String,
    /// Unix seconds.
    pub published_at: u64,
    /// The archive (`actions-runner-linux-x64-<version>.tar.gz`, also served for other
    /// platforms' names).
    pub archive: Vec<u8>,
    /// The digest the API states for the asset (normally the archive's own SHA-256).
    pub digest: String,
}

/// The releases and what was asked of them.
#[derive(Debug, Default)]
pub struct Releases {
    /// Oldest first; the last is the latest.
    pub published: Vec<Release>,
    /// API requests (latest or by tag), answered 200 or 304.
    pub api_requests: usize,
    /// Of those, answered 304.
    pub not_modified: usize,
    /// Archive downloads.
    pub downloads: usize,
    /// While true, every releases request answers 503 (github.com out of reach).
    pub unreachable: bool,
}

/// The platforms an asset is published for.
const PLATFORMS: [&str; 5] = [
    "linux-x64",
    "linux-arm64",
    "linux-arm",
    "osx-x64",
    "osx-arm64",
];

impl Releases {
    fn find(&self, version: &str) -> Option<&Release> {
        self.published.iter().find(|r| r.version == version)
    }

    fn json(&self, base: &str, r: &Release) -> serde_json::Value {
        let tag = format!("v{}", r.version);
        let assets: Vec<_> = PLATFORMS
            .iter()
            .map(|p| {
                let name = format!("actions-runner-{p}-{}.tar.gz", r.version);
                json!({
                    "name": name,
                    "size": r.archive.len(),
                    "digest": r.digest,
                    "content_type": "application/gzip",
                    "browser_download_url": format!("{base}/_releases/download/{tag}/{name}"),
                })
            })
            .collect();
        json!({
            "tag_name": tag,
            "name": tag,
            "draft": false,
            "prerelease": false,
            "published_at": humantime::format_rfc3339_seconds(
                std::time::UNIX_EPOCH + std::time::Duration::from_secs(r.published_at)
            )
            .to_string(),
            "assets": assets,
        })
    }
}

/// The stand-in's endpoint name for a releases path, if it is one.
pub(crate) fn endpoint(method: &str, segs: &[&str]) -> Option<&'static str> {
    match (method, segs) {
        ("GET", ["repos", "actions", "runner", "releases", "latest"]) => Some("release_latest"),
        ("GET", ["repos", "actions", "runner", "releases", "tags", _]) => Some("release_tag"),
        ("GET", ["_releases", "download", _, _]) => Some("release_download"),
        _ => None,
    }
}

/// Answers a releases request.
pub(crate) fn answer(
    releases: &mut Releases,
    base: &str,
    req: &HttpRequest,
    endpoint: &str,
    segs: &[&str],
) -> HttpResponse {
    if releases.unreachable {
        return HttpResponse::ServiceUnavailable().finish();
    }
    let release = match endpoint {
        "release_download" => {
            let version = segs[2].trim_start_matches('v');
            return match releases.find(version).map(|r| r.archive.clone()) {
                Some(archive) => {
                    releases.downloads += 1;
                    HttpResponse::Ok()
                        .content_type("application/octet-stream")
                        .body(archive)
                }
                None => HttpResponse::NotFound().finish(),
            };
        }
        "release_latest" => releases.published.last(),
        _ => releases.find(segs[5].trim_start_matches('v')),
    };
    let Some(release) = release.cloned() else {
        return HttpResponse::NotFound().json(
            json!({ "message": "Not Found", "documentation_url": "https://docs.github.com/rest" }),
        );
    };
    releases.api_requests += 1;
    let etag = format!("\"{}-{}\"", release.version, &release.digest);
    let unchanged = req
        .headers()
        .get("if-none-match")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v == etag);
    if unchanged {
        releases.not_modified += 1;
        return HttpResponse::NotModified()
            .insert_header(("ETag", etag))
            .finish();
    }
    HttpResponse::Ok()
        .insert_header(("ETag", etag))
        .json(releases.json(base, &release))
}
