//! Parsing what the network settings name: a proxy URL (`github.proxy`, `HTTPS_PROXY`) and a
//! PEM bundle (`github.ca_file`). Pure: the GitHub client uses these, and check-config.

use std::path::Path;

use base64::Engine;
use rustls_pki_types::{CertificateDer, pem::PemObject};

use super::Secret;

/// A parsed `http://[user:password@]host[:port]` proxy URL.
#[derive(Clone)]
pub(crate) struct ProxyUrl {
    /// `host:port` to connect to.
    pub authority: String,
    /// `Proxy-Authorization: Basic ...` value, when the URL has credentials.
    auth: Option<Secret>,
}

impl std::fmt::Debug for ProxyUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The credentials never show.
        f.debug_struct("ProxyUrl")
            .field("authority", &self.authority)
            .field("auth", &self.auth.as_ref().map(|_| "***"))
            .finish()
    }
}

impl ProxyUrl {
    /// Parses a proxy URL. Errors never quote the credentials.
    pub(crate) fn parse(url: &str) -> Result<ProxyUrl, ProxyUrlError> {
        let rest = match url.split_once("://") {
            Some(("http", rest)) => rest,
            Some((scheme, _)) => return Err(ProxyUrlError::Scheme(scheme.to_string())),
            // `HTTPS_PROXY=host:3128` is common; curl reads it as http.
            None => url,
        };
        let rest = rest.trim_end_matches('/');
        let (userinfo, hostport) = match rest.rsplit_once('@') {
            Some((u, h)) => (Some(u), h),
            None => (None, rest),
        };
        if hostport.is_empty() || hostport.contains('/') {
            return Err(ProxyUrlError::Shape);
        }
        let has_port = match hostport.strip_prefix('[') {
            Some(v6) => v6.contains("]:"),
            None => hostport.contains(':'),
        };
        let authority = if has_port {
            hostport.to_string()
        } else {
            format!("{hostport}:80")
        };
        let auth = userinfo.map(|u| {
            let decoded = percent_decode(u);
            Secret::new(format!(
                "Basic {}",
                base64::engine::general_purpose::STANDARD.encode(decoded)
            ))
        });
        Ok(ProxyUrl { authority, auth })
    }

    /// The `Proxy-Authorization` value, when the URL has credentials.
    pub(crate) fn authorization(&self) -> Option<&str> {
        self.auth.as_ref().map(Secret::expose)
    }
}

fn percent_decode(s: &str) -> Vec<u8> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%'
            && let Some(b) = s
                .get(i + 1..i + 3)
                .and_then(|h| u8::from_str_radix(h, 16).ok())
        {
            out.push(b);
            i += 3;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    out
}

/// Why a proxy URL cannot be used (never quoting its credentials).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum ProxyUrlError {
    /// Not an http:// proxy.
    #[error(
        "a {0}:// proxy is not supported: use http://host:port (HTTPS to GitHub still goes end \
         to end through the CONNECT tunnel)"
    )]
    Scheme(String),
    /// Not `[user:password@]host[:port]`.
    #[error("must be http://[user:password@]host[:port]")]
    Shape,
}

/// The certificates of a PEM file; an error when it has none or cannot be read.
pub(crate) fn read_pem_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, CertError> {
    let shown = || path.display().to_string();
    let bytes = std::fs::read(path).map_err(|e| CertError::Unreadable(shown(), e.to_string()))?;
    let certs: Vec<_> = CertificateDer::pem_slice_iter(&bytes)
        .collect::<Result<_, _>>()
        .map_err(|e| CertError::NotPem(shown(), e.to_string()))?;
    if certs.is_empty() {
        return Err(CertError::Empty(shown()));
    }
    Ok(certs)
}

/// Why a CA bundle cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum CertError {
    /// It cannot be read.
    #[error("cannot read {0}: {1}")]
    Unreadable(String, String),
    /// It is not PEM.
    #[error("{0} is not a PEM bundle: {1}")]
    NotPem(String, String),
    /// It holds no certificate.
    #[error("{0} holds no certificate (-----BEGIN CERTIFICATE-----)")]
    Empty(String),
    /// A certificate of it rustls cannot use.
    #[error("{0}: a certificate rustls cannot use: {1}")]
    Unusable(String, String),
    /// The TLS library refused its own defaults (a build without the ring provider).
    #[error("the TLS library: {0}")]
    Library(String),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proxy_urls_parse_without_showing_credentials() {
        let p = ProxyUrl::parse("http://alice:s%40cret@proxy.corp:3128/").unwrap();
        assert_eq!(p.authority, "proxy.corp:3128");
        assert_eq!(
            p.authorization().unwrap(),
            format!(
                "Basic {}",
                base64::engine::general_purpose::STANDARD.encode("alice:s@cret")
            )
        );
        assert!(!format!("{p:?}").contains("alice"));
        assert_eq!(
            ProxyUrl::parse("proxy:8080").unwrap().authority,
            "proxy:8080"
        );
        assert_eq!(
            ProxyUrl::parse("http://proxy").unwrap().authority,
            "proxy:80"
        );
        assert!(ProxyUrl::parse("https://proxy:443").is_err());
        assert!(ProxyUrl::parse("socks5://proxy:1080").is_err());
    }
}
