//! TLS to the database: the same roots the GitHub client trusts (the bundled Mozilla set, the
//! system's bundle, `github.ca_file`). `sslmode` in `cluster.url` decides whether it is used
//! (`prefer`, the default, uses it when the server offers it; `require` insists).

use tokio_postgres_rustls::MakeRustlsConnect;

use super::LedgerError;
use crate::config::Config;

/// The connector every ledger connection is made with.
#[derive(Clone)]
pub(super) struct Tls(pub(super) MakeRustlsConnect);

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Tls(rustls)")
    }
}

/// The connector for `config`'s roots.
pub(super) fn tls(config: &Config) -> Result<Tls, LedgerError> {
    let tls = crate::tls::client_config(config.github.ca_file.as_deref())
        .map_err(|e| LedgerError::Pool(format!("TLS roots: {e}")))?;
    Ok(Tls(MakeRustlsConnect::new((*tls).clone())))
}
