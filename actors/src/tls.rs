//! The TLS roots the daemon trusts for every connection it makes (GitHub, the fleet's
//! PostgreSQL ledger) and hands its runners as a CA bundle: the bundled Mozilla roots, the
//! system's bundle, and `github.ca_file` (a GHES or proxy behind a private CA).

use std::{path::Path, sync::Arc};

use rustls::{ClientConfig, RootCertStore};
use rustls_pki_types::{CertificateDer, pem::PemObject};

use crate::config::net::{CertError, read_pem_certs};

/// Where Linux distributions and macOS keep the system's PEM bundle (Debian/Ubuntu,
/// RHEL/Fedora, openSUSE, Alpine and macOS), as OpenSSL's own probe looks for it.
const SYSTEM_BUNDLES: [&str; 4] = [
    "/etc/ssl/certs/ca-certificates.crt",
    "/etc/pki/tls/certs/ca-bundle.crt",
    "/etc/ssl/ca-bundle.pem",
    "/etc/ssl/cert.pem",
];

/// The system's PEM bundle, if this host has one where distributions keep it.
pub(crate) fn system_bundle() -> Option<Vec<u8>> {
    SYSTEM_BUNDLES.iter().find_map(|p| std::fs::read(p).ok())
}

/// A rustls client config trusting the bundled roots, the system's and `ca_file`'s.
pub(crate) fn client_config(ca_file: Option<&Path>) -> Result<Arc<ClientConfig>, CertError> {
    let mut roots = RootCertStore {
        roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
    };
    if let Some(bundle) = system_bundle() {
        for cert in CertificateDer::pem_slice_iter(&bundle).flatten() {
            // A system bundle may carry a certificate rustls cannot use; skip it alone.
            let _ = roots.add(cert);
        }
    }
    if let Some(path) = ca_file {
        for cert in read_pem_certs(path)? {
            roots
                .add(cert)
                .map_err(|e| CertError::Unusable(path.display().to_string(), e.to_string()))?;
        }
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| CertError::Library(e.to_string()))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(Arc::new(config))
}
