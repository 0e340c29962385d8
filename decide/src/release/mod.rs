//! A runner release as the daemon reads it (version, archive, checksum) and the release
//! policy ([`policy`]): pure, from what the look-ups answered and the clock passed in.

pub mod policy;

use std::fmt;

use base64::Engine;
use serde::{Deserialize, Serialize};

/// A runner version, `major.minor.patch`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct Version([u64; 3]);

impl Version {
    /// `2.330.0` or `v2.330.0`.
    pub fn parse(text: &str) -> Option<Version> {
        let text = text.trim();
        let text = text.strip_prefix('v').unwrap_or(text);
        let mut parts = text.split('.').map(|p| p.parse::<u64>().ok());
        let v = [parts.next()??, parts.next()??, parts.next()??];
        parts.next().is_none().then_some(Version(v))
    }
}

/// The oldest runner GitHub registers since its 2026 enforcement (actions/runner: 2.329.0,
/// final on 2026-09-25): a pool whose install is older is refused at its host check, before
/// any registration is made for it.
pub const GITHUB_OLDEST: Version = Version([2, 329, 0]);

/// GitHub refuses a runner that did not take a release within 30 days of it (enforced since
/// 2026-09-25): past this many seconds behind, `status`, `doctor` and the
/// `EphemerRunnerNearCutoff` alert say so before that happens.
pub const BEHIND_CUTOFF_WARN: u64 = 21 * 86_400;

/// Why GitHub would refuse a runner of `version` (`None`: it registers).
pub fn refused_by_github(version: &Version) -> Option<String> {
    (version < &GITHUB_OLDEST).then(|| {
        format!(
            "runner {version} is older than {GITHUB_OLDEST}, the oldest GitHub registers since 2026"
        )
    })
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{}", self.0[0], self.0[1], self.0[2])
    }
}

impl TryFrom<String> for Version {
    type Error = ReleaseError;
    fn try_from(s: String) -> Result<Self, ReleaseError> {
        Version::parse(&s).ok_or(ReleaseError::NotAVersion(s))
    }
}

/// Why a release answer, or a JIT config to rewrite, could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReleaseError {
    /// A version that is not `MAJOR.MINOR.PATCH`.
    #[error("{0:?} is not a version")]
    NotAVersion(String),
    /// The releases API answered something else than a release.
    #[error("an unexpected release: {0}")]
    Unexpected(String),
    /// A release whose tag names no version.
    #[error("the release tag {0:?} is not a version")]
    Tag(String),
    /// A JIT config that is not GitHub's shape (base64 of a JSON map holding `.runner`).
    #[error("the JIT config {0}")]
    JitConfig(String),
}

impl From<Version> for String {
    fn from(v: Version) -> String {
        v.to_string()
    }
}

/// This host's platform in release asset names: `linux-x64`, `osx-arm64`, ...
pub fn platform() -> String {
    let os = match std::env::consts::OS {
        "macos" => "osx",
        other => other,
    };
    let arch = match std::env::consts::ARCH {
        "x86_64" => "x64",
        "aarch64" => "arm64",
        other => other,
    };
    format!("{os}-{arch}")
}

/// What the daemon needs of one release: its version, when it came out, and this platform's
/// archive with its published SHA-256.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Release {
    /// The version (from `tag_name`).
    pub version: Version,
    /// Unix seconds of `published_at` (0 when absent).
    pub published_unix: u64,
    /// The archive for this platform, if the release has one.
    pub archive: Option<Archive>,
}

/// A release archive for one platform.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Archive {
    /// `actions-runner-<platform>-<version>.tar.gz`
    pub name: String,
    /// Where it is downloaded from.
    pub url: String,
    /// Its SHA-256, from the asset's `digest` or the checksum the release notes list; `None`:
    /// none published, and it is not installed.
    pub sha256: Option<[u8; 32]>,
}

/// The parts of GitHub's release JSON read here.
#[derive(Debug, Deserialize)]
struct RawRelease {
    tag_name: String,
    #[serde(default)]
    published_at: Option<String>,
    #[serde(default)]
    body: Option<String>,
    #[serde(default)]
    assets: Vec<RawAsset>,
}

#[derive(Debug, Deserialize)]
struct RawAsset {
    name: String,
    browser_download_url: String,
    #[serde(default)]
    digest: Option<String>,
}

impl Release {
    /// Reads GitHub's answer for a release, keeping the archive of `platform`.
    pub fn from_json(body: &[u8], platform: &str) -> Result<Release, ReleaseError> {
        let raw: RawRelease =
            serde_json::from_slice(body).map_err(|e| ReleaseError::Unexpected(e.to_string()))?;
        let version =
            Version::parse(&raw.tag_name).ok_or_else(|| ReleaseError::Tag(raw.tag_name.clone()))?;
        let published_unix = raw
            .published_at
            .as_deref()
            .and_then(crate::clock::unix_of_rfc3339)
            .unwrap_or(0);
        let name = format!("actions-runner-{platform}-{version}.tar.gz");
        let archive = raw.assets.iter().find(|a| a.name == name).map(|a| Archive {
            name: name.clone(),
            url: a.browser_download_url.clone(),
            sha256: a
                .digest
                .as_deref()
                .and_then(|d| d.strip_prefix("sha256:"))
                .and_then(hex32)
                .or_else(|| {
                    raw.body
                        .as_deref()
                        .and_then(|b| notes_checksum(b, platform))
                }),
        });
        Ok(Release {
            version,
            published_unix,
            archive,
        })
    }
}

/// 64 hex digits as bytes.
fn hex32(text: &str) -> Option<[u8; 32]> {
    hex::decode(text.trim()).ok()?.try_into().ok()
}

/// The checksum actions/runner's release notes list for a platform:
/// `<!-- BEGIN SHA linux-x64 -->HEX<!-- END SHA linux-x64 -->`.
fn notes_checksum(body: &str, platform: &str) -> Option<[u8; 32]> {
    let begin = format!("<!-- BEGIN SHA {platform} -->");
    let end = format!("<!-- END SHA {platform} -->");
    let start = body.find(&begin)? + begin.len();
    let len = body[start..].find(&end)?;
    hex32(&body[start..start + len])
}

/// The JIT config with the runner's own updates turned off (`DisableUpdate` in its `.runner`
/// settings), for runners whose install the daemon keeps current. The config is base64 of a
/// JSON map of file name to base64 content, as GitHub mints it; one that is not is returned as
/// an error and left to the caller.
pub fn without_self_update(jit_config: &str) -> Result<String, ReleaseError> {
    let bad = |what: &str, e: &dyn fmt::Display| ReleaseError::JitConfig(format!("{what}: {e}"));
    let b64 = base64::engine::general_purpose::STANDARD;
    let raw = b64
        .decode(jit_config.trim())
        .map_err(|e| bad("is not base64", &e))?;
    let mut files: serde_json::Map<String, serde_json::Value> =
        serde_json::from_slice(&raw).map_err(|e| bad("is not JSON", &e))?;
    let runner = files
        .get(".runner")
        .and_then(|v| v.as_str())
        .ok_or_else(|| ReleaseError::JitConfig("has no .runner".into()))?;
    let settings = b64
        .decode(runner)
        .map_err(|e| bad("holds a .runner that is not base64", &e))?;
    // The runner writes its settings with a byte-order mark; it reads them either way.
    let text = String::from_utf8_lossy(&settings);
    let mut settings: serde_json::Map<String, serde_json::Value> =
        serde_json::from_str(text.trim_start_matches('\u{feff}'))
            .map_err(|e| bad("holds a .runner that is not JSON", &e))?;
    settings.insert("DisableUpdate".into(), serde_json::Value::Bool(true));
    let settings = serde_json::to_vec(&settings).map_err(|e| bad("cannot be written", &e))?;
    files.insert(".runner".into(), b64.encode(settings).into());
    let files = serde_json::to_vec(&files).map_err(|e| bad("cannot be written", &e))?;
    Ok(b64.encode(files))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_compare_as_numbers() {
        let v = |s| Version::parse(s).unwrap();
        assert!(v("2.330.0") < v("2.331.0"));
        assert!(v("2.99.9") < v("2.100.0"));
        assert_eq!(v("v2.330.0"), v("2.330.0"));
        assert_eq!(v("2.330.0").to_string(), "2.330.0");
        for bad in ["2.330", "2.330.0.1", "latest", "2.x.0", ""] {
            assert_eq!(Version::parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn github_refuses_runners_older_than_2_329_0() {
        let v = |s| Version::parse(s).unwrap();
        assert!(
            refused_by_github(&v("2.328.9"))
                .unwrap()
                .contains("older than 2.329.0")
        );
        assert!(refused_by_github(&v("1.999.0")).is_some());
        assert_eq!(refused_by_github(&v("2.329.0")), None);
        assert_eq!(refused_by_github(&v("2.330.1")), None);
    }

    #[test]
    fn a_release_gives_this_platforms_archive_and_its_checksum() {
        let hex = "ab".repeat(32);
        let json = format!(
            r#"{{"tag_name":"v2.331.0","published_at":"2026-11-20T10:00:00Z",
               "body":"notes <!-- BEGIN SHA osx-arm64 -->{}<!-- END SHA osx-arm64 -->",
               "assets":[
                 {{"name":"actions-runner-linux-x64-2.331.0.tar.gz","browser_download_url":"https://x/l","digest":"sha256:{hex}"}},
                 {{"name":"actions-runner-osx-arm64-2.331.0.tar.gz","browser_download_url":"https://x/o"}},
                 {{"name":"actions-runner-linux-arm-2.331.0.tar.gz","browser_download_url":"https://x/a"}}
               ]}}"#,
            "cd".repeat(32)
        );
        let r = Release::from_json(json.as_bytes(), "linux-x64").unwrap();
        assert_eq!(r.version.to_string(), "2.331.0");
        assert_eq!(r.published_unix, 1_795_168_800);
        let a = r.archive.unwrap();
        assert_eq!(
            (a.url.as_str(), a.sha256),
            ("https://x/l", Some([0xab; 32]))
        );
        // From the release notes when the asset states no digest.
        let r = Release::from_json(json.as_bytes(), "osx-arm64").unwrap();
        assert_eq!(r.archive.unwrap().sha256, Some([0xcd; 32]));
        // Neither: no checksum, so it will not be installed.
        let r = Release::from_json(json.as_bytes(), "linux-arm").unwrap();
        assert_eq!(r.archive.unwrap().sha256, None);
        assert!(
            Release::from_json(json.as_bytes(), "linux-s390x")
                .unwrap()
                .archive
                .is_none()
        );
    }

    #[test]
    fn the_runner_is_told_not_to_update_itself_and_keeps_its_identity() {
        let b64 = base64::engine::general_purpose::STANDARD;
        let runner = "\u{feff}{\"AgentName\":\"r1\",\"ServerUrl\":\"https://x\"}";
        let files = serde_json::json!({
            ".runner": b64.encode(runner),
            ".credentials": b64.encode("{\"Data\":{\"token\":\"t\"}}"),
        });
        let jit = b64.encode(files.to_string());
        let out = without_self_update(&jit).unwrap();
        let files: serde_json::Value = serde_json::from_slice(&b64.decode(out).unwrap()).unwrap();
        let runner: serde_json::Value =
            serde_json::from_slice(&b64.decode(files[".runner"].as_str().unwrap()).unwrap())
                .unwrap();
        assert_eq!(runner["DisableUpdate"], true);
        assert_eq!(runner["AgentName"], "r1");
        assert_eq!(
            b64.decode(files[".credentials"].as_str().unwrap()).unwrap(),
            b"{\"Data\":{\"token\":\"t\"}}"
        );
        assert!(without_self_update("not base64 !").is_err());
    }
}
