//! GitHub client errors and the five error classes every retry decision is made on.
//!
//! Classification reads the typed error (status, rate headers, the body's message and
//! `documentation_url`), never a formatted string, except for the one thing GitHub only says in
//! words: that a 403/429 is a *secondary* rate limit.

use std::time::Duration;

pub use crate::vocab::ErrorClass;

/// What a non-2xx answer said.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpFailure {
    /// The endpoint template (`generate_jitconfig`, `list_runners`, ...).
    pub endpoint: &'static str,
    /// HTTP status.
    pub status: u16,
    /// GitHub's `message`, or the start of the body.
    pub message: String,
    /// GitHub's `documentation_url`, if any.
    pub documentation_url: Option<String>,
    /// `X-RateLimit-Remaining` of this answer.
    pub rate_remaining: Option<u64>,
    /// `X-RateLimit-Resource` of this answer: the bucket it spent.
    pub rate_bucket: Option<crate::vocab::RateBucket>,
    /// `X-RateLimit-Reset` of this answer (unix seconds).
    pub rate_reset: Option<u64>,
    /// `Retry-After` of this answer.
    pub retry_after: Option<Duration>,
}

impl HttpFailure {
    /// A 403/429 whose text says it is a secondary (formerly "abuse") rate limit.
    pub fn is_secondary_rate_limit(&self) -> bool {
        if !matches!(self.status, 403 | 429) {
            return false;
        }
        let msg = self.message.to_ascii_lowercase();
        let doc = self
            .documentation_url
            .as_deref()
            .unwrap_or("")
            .to_ascii_lowercase();
        msg.contains("secondary rate limit")
            || msg.contains("abuse")
            || doc.contains("secondary-rate-limits")
            || doc.contains("abuse-rate-limits")
    }
}

/// Everything a GitHub call can fail with.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GithubError {
    /// GitHub answered with a non-success status.
    #[error("{} answered {}: {}", .0.endpoint, .0.status, .0.message)]
    Http(HttpFailure),
    /// The request never got an answer (connect, send, timeout, reset).
    #[error("{endpoint}: network error: {detail}")]
    Network {
        /// The endpoint template.
        endpoint: &'static str,
        /// What the transport said.
        detail: String,
    },
    /// The answer arrived but its body could not be read or decoded.
    #[error("{endpoint}: unreadable answer: {detail}")]
    Decode {
        /// The endpoint template.
        endpoint: &'static str,
        /// What failed.
        detail: String,
    },
    /// GitHub registered a runner under another name than the one asked for. The name becomes
    /// a directory, a removal as root, log, pid and cgroup paths and an argv: an answer that
    /// changes it is refused (the registration is deleted), never followed.
    #[error(
        "generate_jitconfig: asked for runner {asked:?}, the answer named it {answered:?}: refused and deleted"
    )]
    RenamedRunner {
        /// The name asked for.
        asked: String,
        /// The name in the answer.
        answered: String,
    },
    /// Three fresh runner names in a row were taken (409 each time).
    #[error("generate_jitconfig: runner name conflict {attempts} times in a row")]
    NameConflict {
        /// How many names were tried.
        attempts: u32,
    },
    /// Credentials could not be produced locally (a bad App key, a JWT that cannot be signed,
    /// an unreadable token answer).
    #[error("github auth: {0}")]
    Auth(String),
    /// `github.runner_group` names no runner group of the org.
    #[error("github.runner_group: the org has no runner group named {name:?} (it has: {known})")]
    NoRunnerGroup {
        /// The name configured.
        name: String,
        /// The groups there are, comma-separated.
        known: String,
    },
    /// Minting the App installation token failed; it fails the way the inner call did (a
    /// network blip or a 5xx is retried, a 401/404 is not).
    #[error("github app token exchange failed: {0}")]
    TokenExchange(Box<GithubError>),
}

impl GithubError {
    /// The class that decides whether and when to retry (original-daemon.md §2, typed).
    pub fn class(&self) -> ErrorClass {
        match self {
            GithubError::Http(f) => {
                if f.status == 429 || f.is_secondary_rate_limit() {
                    return ErrorClass::RateLimit;
                }
                if f.status == 403 && f.rate_remaining == Some(0) {
                    return ErrorClass::RateLimit;
                }
                match f.status {
                    400 | 401 | 403 | 404 | 422 => ErrorClass::NonRetryable,
                    500..=599 => ErrorClass::ServerSide,
                    _ => ErrorClass::UnknownRetryable,
                }
            }
            GithubError::Network { .. } => ErrorClass::Network,
            GithubError::Decode { .. } | GithubError::NameConflict { .. } => {
                ErrorClass::UnknownRetryable
            }
            GithubError::Auth(_) | GithubError::NoRunnerGroup { .. } => ErrorClass::NonRetryable,
            // An odd answer is the server's fault, not the operator's config: the registration
            // was deleted, and the claim climbs the ladder like a 5xx.
            GithubError::RenamedRunner { .. } => ErrorClass::ServerSide,
            GithubError::TokenExchange(inner) => inner.class(),
        }
    }

    /// `Retry-After` carried by the failed answer, if any.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            GithubError::Http(f) => f.retry_after,
            GithubError::TokenExchange(inner) => inner.retry_after(),
            _ => None,
        }
    }

    /// How long every claim of this credential should hold back after this answer, when it is
    /// a secondary rate limit (a 403/429 that says so, or that carries `Retry-After`): its
    /// `Retry-After`, else a minute, as GitHub's docs ask ("wait at least one minute"), capped
    /// at an hour whatever the header says.
    pub fn secondary_limit_wait(&self) -> Option<Duration> {
        match self {
            GithubError::Http(f)
                if f.is_secondary_rate_limit()
                    || (matches!(f.status, 403 | 429) && f.retry_after.is_some()) =>
            {
                let wait = f.retry_after.unwrap_or(Duration::from_secs(60));
                Some(wait.min(Duration::from_secs(3600)))
            }
            GithubError::TokenExchange(inner) => inner.secondary_limit_wait(),
            _ => None,
        }
    }

    /// The reading the failed answer itself carried: the bucket it spent, its remaining and
    /// its reset (unix seconds).
    pub fn rate_reading(&self) -> Option<(crate::vocab::RateBucket, u64, u64)> {
        match self {
            GithubError::Http(f) => Some((f.rate_bucket?, f.rate_remaining?, f.rate_reset?)),
            GithubError::TokenExchange(inner) => inner.rate_reading(),
            _ => None,
        }
    }

    /// The rate-limit bucket the failed answer spent, when it said.
    pub fn rate_bucket(&self) -> Option<crate::vocab::RateBucket> {
        match self {
            GithubError::Http(f) => f.rate_bucket,
            GithubError::TokenExchange(inner) => inner.rate_bucket(),
            _ => None,
        }
    }

    /// GitHub refused to delete a runner because it is running a job (422 "Runner ... is
    /// still running a job"): the deletion and the job's assignment exclude each other, so
    /// this is the reliable "busy".
    pub fn is_runner_busy(&self) -> bool {
        matches!(self, GithubError::Http(f)
            if f.status == 422 && f.message.to_ascii_lowercase().contains("running a job"))
    }

    /// The HTTP status, when GitHub answered.
    pub fn status(&self) -> Option<u16> {
        match self {
            GithubError::Http(f) => Some(f.status),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn http(status: u16, message: &str, remaining: Option<u64>) -> GithubError {
        GithubError::Http(HttpFailure {
            endpoint: "generate_jitconfig",
            status,
            message: message.into(),
            documentation_url: None,
            rate_remaining: remaining,
            rate_bucket: None,
            rate_reset: None,
            retry_after: None,
        })
    }

    /// Every row of the classification table.
    #[test]
    fn classification_table() {
        use ErrorClass::*;
        let rows: Vec<(GithubError, ErrorClass)> = vec![
            (http(429, "Too Many Requests", Some(10)), RateLimit),
            (http(429, "whatever", None), RateLimit),
            (http(403, "API rate limit exceeded", Some(0)), RateLimit),
            (
                http(403, "You have exceeded a secondary rate limit. Please wait.", Some(4000)),
                RateLimit,
            ),
            (
                GithubError::Http(HttpFailure {
                    documentation_url: Some(
                        "https://docs.github.com/rest/overview/rate-limits-for-the-rest-api#about-secondary-rate-limits".into(),
                    ),
                    ..match http(403, "Forbidden", Some(12)) {
                        GithubError::Http(f) => f,
                        _ => unreachable!(),
                    }
                }),
                RateLimit,
            ),
            (http(403, "You have triggered an abuse detection mechanism", None), RateLimit),
            (http(403, "Resource not accessible by integration", Some(4000)), NonRetryable),
            (http(400, "Bad Request", None), NonRetryable),
            (http(401, "Bad credentials", Some(59)), NonRetryable),
            (http(404, "Not Found", Some(4999)), NonRetryable),
            (http(422, "Validation Failed", Some(4999)), NonRetryable),
            (http(500, "Internal Server Error", None), ServerSide),
            (http(502, "Bad Gateway", None), ServerSide),
            (http(503, "Service Unavailable", None), ServerSide),
            (http(504, "Gateway Timeout", None), ServerSide),
            (http(409, "Conflict", Some(4999)), UnknownRetryable),
            (http(410, "Gone", None), UnknownRetryable),
            (
                GithubError::Network { endpoint: "get_job", detail: "connection refused".into() },
                Network,
            ),
            (
                GithubError::Network { endpoint: "get_job", detail: "timeout".into() },
                Network,
            ),
            (
                GithubError::Decode { endpoint: "list_runners", detail: "eof".into() },
                UnknownRetryable,
            ),
            (GithubError::NameConflict { attempts: 3 }, UnknownRetryable),
            (
                GithubError::RenamedRunner { asked: "a".into(), answered: "../..".into() },
                ServerSide,
            ),
            (GithubError::Auth("private key rejected".into()), NonRetryable),
            (
                GithubError::TokenExchange(Box::new(http(502, "Bad Gateway", None))),
                ServerSide,
            ),
            (
                GithubError::TokenExchange(Box::new(http(429, "slow down", None))),
                RateLimit,
            ),
            (
                GithubError::TokenExchange(Box::new(GithubError::Network {
                    endpoint: "access_tokens",
                    detail: "connection reset".into(),
                })),
                Network,
            ),
            (
                GithubError::TokenExchange(Box::new(http(401, "Bad credentials", None))),
                NonRetryable,
            ),
        ];
        for (err, class) in rows {
            assert_eq!(err.class(), class, "{err}");
        }
    }

    #[test]
    fn only_the_non_retryable_class_is_not_retried() {
        assert!(!ErrorClass::NonRetryable.is_retryable());
        assert!(ErrorClass::UnknownRetryable.is_retryable());
    }
}
