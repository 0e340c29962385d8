//! A certificate authority made for one test, and a server certificate it signed.

use github_standin::TlsIdentity;

/// A test CA and a certificate it signed for `127.0.0.1`, `localhost` and `github.test` (a
/// name only the test proxy resolves).
pub struct TestCa {
    /// The CA's certificate, PEM.
    pub ca_pem: String,
    /// The server's certificate and key.
    pub server: TlsIdentity,
}

pub fn test_ca() -> TestCa {
    use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
    let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.distinguished_name
        .push(rcgen::DnType::CommonName, "ephemer-actors test CA");
    let ca_key = KeyPair::generate().unwrap();
    let ca_cert = ca.self_signed(&ca_key).unwrap();
    let server = CertificateParams::new(vec![
        "127.0.0.1".to_string(),
        "localhost".to_string(),
        "github.test".to_string(),
    ])
    .unwrap();
    let server_key = KeyPair::generate().unwrap();
    let issuer = Issuer::from_params(&ca, &ca_key);
    let server_cert = server.signed_by(&server_key, &issuer).unwrap();
    TestCa {
        ca_pem: ca_cert.pem(),
        server: TlsIdentity {
            cert_pem: server_cert.pem(),
            key_pem: server_key.serialize_pem(),
        },
    }
}
