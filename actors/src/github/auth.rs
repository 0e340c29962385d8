//! GitHub credentials: a static token, or a GitHub App's installation token minted from an
//! RS256 JWT, cached, refreshed five minutes before it expires, with one exchange in flight at a
//! time (concurrent callers share it). Token length and format are never assumed.

use std::{cell::RefCell, future::Future, pin::Pin, rc::Rc, time::Duration};

use futures_util::future::{FutureExt, Shared};
use serde::{Deserialize, Serialize};

use super::error::GithubError;
use crate::clock::unix_now;
use crate::config::{AppAuth, GithubAuth, Secret};

/// Refresh an installation token once it has less than this left.
const REFRESH_MARGIN: Duration = Duration::from_secs(5 * 60);
/// JWT `iat` is set this far in the past against clock drift.
const JWT_BACKDATE: u64 = 60;
/// JWT lifetime from `iat`; GitHub allows at most 10 minutes from now.
const JWT_LIFETIME: u64 = 9 * 60;

#[derive(Serialize)]
struct Claims {
    iat: u64,
    exp: u64,
    iss: String,
}

/// Signs the App JWT that authenticates `/app/...` calls.
pub(crate) fn app_jwt(app: &AppAuth, now: u64) -> Result<String, GithubError> {
    let key = jsonwebtoken::EncodingKey::from_rsa_pem(app.private_key.expose().as_bytes())
        .map_err(|e| GithubError::Auth(format!("app private key rejected: {e}")))?;
    let iat = now.saturating_sub(JWT_BACKDATE);
    let claims = Claims {
        iat,
        exp: iat + JWT_LIFETIME,
        iss: app.app_id.to_string(),
    };
    jsonwebtoken::encode(
        &jsonwebtoken::Header::new(jsonwebtoken::Algorithm::RS256),
        &claims,
        &key,
    )
    .map_err(|e| GithubError::Auth(format!("cannot sign app jwt: {e}")))
}

#[derive(Deserialize)]
struct AccessToken {
    token: String,
    expires_at: String,
}

type Exchange = Shared<Pin<Box<dyn Future<Output = Result<(Secret, u64), GithubError>>>>>;

/// Where the `Authorization: Bearer` value comes from.
#[derive(Clone)]
pub(crate) enum Credentials {
    Token(Secret),
    App(Rc<AppTokens>),
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Credentials::Token(_) => f.write_str("Credentials::Token(***)"),
            Credentials::App(a) => write!(
                f,
                "Credentials::App(installation {})",
                a.app.installation_id
            ),
        }
    }
}

pub(crate) struct AppTokens {
    app: AppAuth,
    cached: RefCell<Option<(Secret, u64)>>,
    inflight: RefCell<Option<Exchange>>,
}

/// The key one credential's budget is kept under: GitHub counts a budget per token, or per
/// App installation, on one API ("Rate limits for the REST API": "per user or per
/// installation"). Two tokens never share a reading, whichever owners they act for. A token
/// is keyed by a hash of it, never kept.
pub(crate) fn budget_key(api_url: &str, auth: &GithubAuth) -> String {
    use sha2::Digest as _;
    match auth {
        GithubAuth::Token(token) => {
            let digest = sha2::Sha256::digest(format!("{api_url}\n{}", token.expose()).as_bytes());
            format!("token-{}", &hex::encode(digest)[..16])
        }
        GithubAuth::App(app) => format!(
            "app-{}-installation-{}@{api_url}",
            app.app_id, app.installation_id
        ),
    }
}

impl Credentials {
    pub(crate) fn new(auth: &GithubAuth) -> Self {
        match auth {
            GithubAuth::Token(t) => Credentials::Token(t.clone()),
            GithubAuth::App(app) => Credentials::App(Rc::new(AppTokens {
                app: app.clone(),
                cached: RefCell::new(None),
                inflight: RefCell::new(None),
            })),
        }
    }

    /// For an App: a fresh JWT, which `/app/...` endpoints take instead of an installation
    /// token. `None` for a token credential.
    pub(crate) fn app_jwt(&self) -> Option<Result<Secret, GithubError>> {
        match self {
            Credentials::Token(_) => None,
            Credentials::App(a) => Some(app_jwt(&a.app, unix_now()).map(Secret::new)),
        }
    }

    /// Forgets a cached installation token (after GitHub answered 401 with it).
    pub(crate) fn invalidate(&self) {
        if let Credentials::App(a) = self {
            a.cached.borrow_mut().take();
        }
    }

    /// The bearer token; for an App, from the cache or one shared exchange. `exchange` performs
    /// the POST given the JWT and returns the token and its unix expiry.
    pub(crate) async fn bearer<F, Fut>(&self, exchange: F) -> Result<Secret, GithubError>
    where
        F: FnOnce(String, u64) -> Fut,
        Fut: Future<Output = Result<(Secret, u64), GithubError>> + 'static,
    {
        let app = match self {
            Credentials::Token(t) => return Ok(t.clone()),
            Credentials::App(app) => app.clone(),
        };
        let now = unix_now();
        if let Some((token, expires)) = app.cached.borrow().as_ref()
            && *expires > now + REFRESH_MARGIN.as_secs()
        {
            return Ok(token.clone());
        }
        let shared = {
            let mut inflight = app.inflight.borrow_mut();
            match inflight.as_ref() {
                Some(f) => f.clone(),
                None => {
                    let jwt = app_jwt(&app.app, now)?;
                    let fut: Pin<Box<dyn Future<Output = _>>> =
                        Box::pin(exchange(jwt, app.app.installation_id));
                    let f = fut.shared();
                    *inflight = Some(f.clone());
                    f
                }
            }
        };
        let result = shared.clone().await;
        {
            let mut inflight = app.inflight.borrow_mut();
            if inflight.as_ref().is_some_and(|f| f.ptr_eq(&shared)) {
                inflight.take();
                if let Ok((token, expires)) = &result {
                    *app.cached.borrow_mut() = Some((token.clone(), *expires));
                }
            }
        }
        result.map(|(token, _)| token)
    }
}

/// Parses the body of a 201 from `POST /app/installations/{id}/access_tokens`.
pub(crate) fn parse_access_token(body: &[u8]) -> Result<(Secret, u64), GithubError> {
    let t: AccessToken = serde_json::from_slice(body)
        .map_err(|e| GithubError::Auth(format!("unreadable access token answer: {e}")))?;
    let expires = crate::clock::unix_of_rfc3339(&t.expires_at)
        .ok_or_else(|| GithubError::Auth(format!("bad expires_at: {:?}", t.expires_at)))?;
    if t.token.is_empty() {
        return Err(GithubError::Auth("empty installation token".into()));
    }
    Ok((Secret::new(t.token), expires))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two credentials never share a budget reading: the bug of one reading for every token
    /// (ephemerd's extra targets) made one org's empty budget stop every org's claims.
    #[test]
    fn each_token_and_installation_is_its_own_budget() {
        let token = |t: &str| GithubAuth::Token(Secret::new(t));
        let api = "https://api.github.com";
        let a = budget_key(api, &token("ghp_a"));
        assert_eq!(a, budget_key(api, &token("ghp_a")));
        assert_ne!(a, budget_key(api, &token("ghp_b")));
        assert_ne!(
            a,
            budget_key("https://ghes.example.com/api/v3", &token("ghp_a"))
        );
        assert!(!a.contains("ghp_a"), "a token is never part of its key");
        let app = |installation_id| {
            GithubAuth::App(AppAuth {
                app_id: 1,
                installation_id,
                private_key: Secret::default(),
            })
        };
        assert_ne!(budget_key(api, &app(7)), budget_key(api, &app(8)));
    }
}
