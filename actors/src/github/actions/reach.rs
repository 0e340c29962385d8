//! Where the daemon follows the Actions service with the admin or queue token.
//!
//! The service's URL, and the message queue's, come from GitHub's answers, not the config: a
//! broken or hostile answer (a GHES, a TLS-intercepting proxy trusted through `ca_file`) could
//! send the token anywhere, in clear. So a URL is followed only when:
//! - its host is the host `api_url` names, or one of GitHub's Actions hosts for github.com
//!   (`*.actions.githubusercontent.com`), or a host of the same GHE.com tenant (`api.X.ghe.com`:
//!   `*.X.ghe.com`); and
//! - it is `https`, or plain `http` to the `api_url`'s own host when `api_url` is itself plain
//!   `http` (which check-config allows only on loopback or with `github.allow_insecure`).

use awc::http::Uri;

/// Why a URL GitHub handed out is not followed with a token.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum Refused {
    /// It does not parse, or names no host.
    #[error("{0:?} is not a URL with a host")]
    NotAUrl(String),
    /// It leads to a host that is neither the API's nor GitHub's Actions hosts.
    #[error(
        "the Actions service URL GitHub handed out ({url}) is on {host}, which is neither \
         {api_host} (github.api_url) nor one of GitHub's Actions hosts: not followed with the \
         token"
    )]
    OtherHost {
        /// The URL.
        url: String,
        /// Its host.
        host: String,
        /// The host `api_url` names.
        api_host: String,
    },
    /// It is not https (nor plain http to a plain-http API's own host).
    #[error(
        "the Actions service URL GitHub handed out ({0}) is not https: the token would cross \
         the network in clear; not followed"
    )]
    InClear(String),
}

/// Whether `url` may be followed with a token, given the target's `api_url`.
pub(crate) fn check_service_url(url: &str, api_url: &str) -> Result<(), Refused> {
    let parse = |u: &str| -> Result<(String, String), Refused> {
        let uri: Uri = u.parse().map_err(|_| Refused::NotAUrl(u.to_string()))?;
        let scheme = uri.scheme_str().unwrap_or_default().to_ascii_lowercase();
        let host = uri
            .host()
            .ok_or_else(|| Refused::NotAUrl(u.to_string()))?
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_ascii_lowercase();
        Ok((scheme, host))
    };
    let (scheme, host) = parse(url)?;
    let (api_scheme, api_host) = parse(api_url)?;
    let same_host = host == api_host;
    let githubs = api_host == "api.github.com"
        && (host == "actions.githubusercontent.com"
            || host.ends_with(".actions.githubusercontent.com"));
    let tenant = api_host
        .strip_prefix("api.")
        .filter(|rest| rest.ends_with(".ghe.com"))
        .is_some_and(|tenant| host.ends_with(&format!(".{tenant}")));
    if !(same_host || githubs || tenant) {
        return Err(Refused::OtherHost {
            url: url.to_string(),
            host,
            api_host,
        });
    }
    match scheme.as_str() {
        "https" => Ok(()),
        "http" if api_scheme == "http" && same_host => Ok(()),
        _ => Err(Refused::InClear(url.to_string())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn github_coms_service_hosts_are_followed_over_https_only() {
        let api = "https://api.github.com";
        for ok in [
            "https://broker.actions.githubusercontent.com/rest/",
            "https://pipelinesghubeus2.actions.githubusercontent.com/abc/",
        ] {
            assert_eq!(check_service_url(ok, api), Ok(()), "{ok}");
        }
        for refused in [
            "http://broker.actions.githubusercontent.com/rest/",
            "https://evil.example/rest/",
            "https://actions.githubusercontent.com.evil.example/",
            "https://api.github.com.evil.example/",
            "ftp://broker.actions.githubusercontent.com/",
            "not a url",
        ] {
            assert!(check_service_url(refused, api).is_err(), "{refused}");
        }
    }

    #[test]
    fn a_ghes_or_tenant_service_stays_on_its_host_and_plain_http_only_where_the_api_is() {
        let ghes = "https://ghes.corp/api/v3";
        assert_eq!(
            check_service_url("https://ghes.corp/_services/pipelines/", ghes),
            Ok(())
        );
        assert!(check_service_url("http://ghes.corp/_services/pipelines/", ghes).is_err());
        assert!(check_service_url("https://other.corp/_services/", ghes).is_err());
        let tenant = "https://api.acme.ghe.com";
        assert_eq!(
            check_service_url("https://actions.acme.ghe.com/x/", tenant),
            Ok(())
        );
        assert!(check_service_url("https://actions.other.ghe.com/x/", tenant).is_err());
        // The stand-in on loopback, over plain http as its api_url is.
        let local = "http://127.0.0.1:8080";
        assert_eq!(
            check_service_url("http://127.0.0.1:9090/_services/", local),
            Ok(())
        );
        assert!(check_service_url("http://10.0.0.5:9090/_services/", local).is_err());
    }
}
