//! Everything that touches GitHub: the REST client and its auth, rate headers, error classes,
//! webhook signatures and payloads, and the actor that owns the client.
//!
//! Nothing outside this module builds a GitHub URL or reads a GitHub header.

pub mod actions;
pub mod actor;
pub(crate) mod auth;
pub mod client;
pub mod event;
pub(crate) mod groups;
pub(crate) mod hooks;
mod inspect;
mod pages;
pub(crate) mod poll;
pub(crate) mod proxy;
pub(crate) mod rate;
pub(crate) mod reconcile;
pub mod signature;

pub use client::{GithubClient, RunnerInfo};
pub use ephemer_decide::github::{ErrorClass, GithubError, JitRunner, error};

/// The web address an API URL's pages are at: `https://api.github.com` (and a GHE.com
/// tenant's `https://api.TENANT.ghe.com`) drops its `api.`, a GHES `https://HOST/api/v3` drops
/// its path; anything else (a stand-in) is its own.
pub fn web_url(api_url: &str) -> String {
    let url = api_url.trim_end_matches('/');
    if let Some(host) = url.strip_prefix("https://api.") {
        return format!("https://{host}");
    }
    url.strip_suffix("/api/v3").unwrap_or(url).to_string()
}

#[cfg(test)]
mod web_url_tests {
    #[test]
    fn api_urls_become_web_urls() {
        assert_eq!(
            super::web_url("https://api.github.com"),
            "https://github.com"
        );
        assert_eq!(
            super::web_url("https://api.acme.ghe.com/"),
            "https://acme.ghe.com"
        );
        assert_eq!(
            super::web_url("https://ghes.example/api/v3"),
            "https://ghes.example"
        );
        assert_eq!(
            super::web_url("http://127.0.0.1:8080"),
            "http://127.0.0.1:8080"
        );
    }
}
