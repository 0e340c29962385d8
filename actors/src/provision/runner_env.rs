//! What every runner of a pool gets in its environment besides its JIT config: the pool's
//! `env`, and the proxy and CA the daemon uses for GitHub (the runner talks to the same
//! GitHub, through the same network).

use std::path::PathBuf;

use super::RunnerEnv;
use crate::{
    config::{Config, PoolConfig, Secret},
    vocab::runner_vars,
};

/// Writes `ca-bundle.pem` in the runners' directory (`StateConfig::runner_dir`: the state
/// directory is the daemon's alone), the system's roots followed by `github.ca_file`, when a
/// CA file is configured: runners point `SSL_CERT_FILE` at it, which replaces OpenSSL's
/// default bundle, so it must keep the public roots too. `None` without a CA file.
pub fn write_ca_bundle(config: &Config) -> Result<Option<PathBuf>, CaBundleError> {
    let Some(ca_file) = &config.github.ca_file else {
        return Ok(None);
    };
    let extra = std::fs::read(ca_file).map_err(|e| CaBundleError::at(ca_file, &e))?;
    let mut bundle = crate::tls::system_bundle().unwrap_or_default();
    if !bundle.is_empty() && !bundle.ends_with(b"\n") {
        bundle.push(b'\n');
    }
    bundle.extend_from_slice(&extra);
    let dir = config.state.runner_dir();
    crate::harden::passable_dir(&dir).map_err(|e| CaBundleError::at(&dir, &e))?;
    let path = dir.join("ca-bundle.pem");
    let tmp = path.with_extension("pem.tmp");
    std::fs::write(&tmp, &bundle)
        .and_then(|()| {
            use std::os::unix::fs::PermissionsExt;
            // Runners run as other users (`run_as`) and in containers: they must read it.
            std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o644))
        })
        .and_then(|()| std::fs::rename(&tmp, &path))
        .map_err(|e| CaBundleError::at(&path, &e))?;
    Ok(Some(path))
}

/// Why the runners' CA bundle could not be written: the path and what it answered.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{path}: {error}")]
pub struct CaBundleError {
    /// The file or directory.
    pub path: String,
    /// What it answered.
    pub error: String,
}

impl CaBundleError {
    fn at(path: &std::path::Path, e: &dyn std::fmt::Display) -> Self {
        CaBundleError {
            path: path.display().to_string(),
            error: e.to_string(),
        }
    }
}

/// The pool's runner environment: the proxy variables ([`runner_vars::PROXY`],
/// [`runner_vars::NO_PROXY`]), then the pool's own `env` (check-config refused any name the
/// daemon sets).
pub fn runner_env(config: &Config, pool: &PoolConfig, ca_bundle: Option<PathBuf>) -> RunnerEnv {
    let mut vars = Vec::new();
    if let Some(proxy) = &config.github.proxy {
        for name in runner_vars::PROXY {
            vars.push((name.to_string(), proxy.url.clone()));
        }
        if !proxy.no_proxy.is_empty() {
            let list = Secret::new(proxy.no_proxy.join(","));
            for name in runner_vars::NO_PROXY {
                vars.push((name.to_string(), list.clone()));
            }
        }
    }
    vars.extend(pool.common.env.iter().cloned());
    RunnerEnv { vars, ca_bundle }
}
