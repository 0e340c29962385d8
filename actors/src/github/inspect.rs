//! `inspect`: one GET answered as it came, for `doctor`.

use actix_web::http::Method;

use super::{GithubClient, GithubError};

/// A GET's answer as it came ([`GithubClient::inspect`]).
#[derive(Debug, Clone)]
pub struct Inspection {
    /// The HTTP status.
    pub status: u16,
    /// The `Date` header (GitHub's clock).
    pub date: Option<String>,
    /// `X-OAuth-Scopes`: a classic PAT's scopes (absent for fine-grained tokens and Apps).
    pub scopes: Option<String>,
    /// The JSON body (`Null` when it is not JSON).
    pub body: serde_json::Value,
}

impl GithubClient {
    /// One authenticated GET whose answer is returned as it came, whatever its status: for
    /// `doctor`, which reads 401s, 403s and 404s as findings, and the `Date` and
    /// `X-OAuth-Scopes` headers. A credential that cannot be had (an App token exchange that
    /// fails) is the error.
    pub async fn inspect(&self, path: &str) -> Result<Inspection, GithubError> {
        let token = self.bearer().await?;
        let answer = self
            .send("doctor", (Method::GET, path), &token, None, None, true)
            .await?;
        let header = |name: &str| {
            answer
                .headers
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_string)
        };
        Ok(Inspection {
            status: answer.status.as_u16(),
            date: header("date"),
            scopes: header("x-oauth-scopes"),
            body: serde_json::from_slice(&answer.body).unwrap_or(serde_json::Value::Null),
        })
    }
}
