//! `github.ca_file`, `github.proxy` and `github.no_proxy` (or `HTTPS_PROXY` and `NO_PROXY`).

use std::path::Path;

use super::{Environment, Problems, ProxyConfig, Secret};

pub(super) fn check_ca_file(path: &Path) -> Result<(), crate::config::net::CertError> {
    crate::config::net::read_pem_certs(path).map(|_| ())
}

/// The proxy: `github.proxy` wins over `HTTPS_PROXY`; `github.no_proxy` over `NO_PROXY`.
pub(super) fn build_proxy(
    raw: Option<String>,
    no_proxy: Option<Vec<String>>,
    env: &Environment,
    p: &mut Problems,
) -> Option<ProxyConfig> {
    let (key, url) = match raw.filter(|u| !u.is_empty()) {
        Some(url) => ("github.proxy", Secret::new(url)),
        None => ("HTTPS_PROXY", env.https_proxy.clone()?),
    };
    if let Err(reason) = crate::config::net::ProxyUrl::parse(url.expose()) {
        // The reason never quotes the URL, which may carry credentials.
        p.push(key, reason);
    }
    let no_proxy = no_proxy.unwrap_or_else(|| {
        env.no_proxy
            .as_deref()
            .unwrap_or("")
            .split(',')
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty())
            .collect()
    });
    Some(ProxyConfig { url, no_proxy })
}
