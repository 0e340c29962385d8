//! The GitHub App's endpoints: the installation token exchange, and the App's own webhook's
//! delivery log. Both take the App's JWT (RS256, `iss` = the App id, at most 10 minutes), never
//! an installation token ("Authenticating as a GitHub App", docs.github.com).

use actix_web::{HttpRequest, HttpResponse};
use base64::Engine as _;
use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::routes::{Shared, bearer, error, random};
use crate::state::State;

/// `GET /app/hook/deliveries` and `POST /app/hook/deliveries/{id}/attempts`: the App's own
/// webhook ("REST API endpoints for GitHub App webhooks": a JWT is required), which delivers
/// to `State::app_hook`.
pub(crate) fn hook(
    s: &mut State,
    shared: &Shared,
    req: &HttpRequest,
    endpoint: &str,
    segs: &[&str],
    now: u64,
) -> (u16, HttpResponse) {
    if let Err(refused) = verify(shared, req, now) {
        return *refused;
    }
    let Some(url) = s.app_hook.clone() else {
        return error(404, "Not Found");
    };
    crate::hook_log::answer(s, req, endpoint, segs, &url, now)
}

/// Checks the App's JWT (RS256 against the App's public key when the stand-in has one; else
/// its claims only), as GitHub does for every `/app/...` endpoint.
fn verify(shared: &Shared, req: &HttpRequest, now: u64) -> Result<(), Box<(u16, HttpResponse)>> {
    let Some(jwt) = bearer(req) else {
        return Err(Box::new(error(
            401,
            "A JSON web token could not be decoded",
        )));
    };
    let claims = match &shared.app_public_key {
        Some(pem) => {
            let key = match jsonwebtoken::DecodingKey::from_rsa_pem(pem.as_bytes()) {
                Ok(k) => k,
                Err(_) => return Err(Box::new(error(500, "stand-in has a bad public key"))),
            };
            let mut v = jsonwebtoken::Validation::new(jsonwebtoken::Algorithm::RS256);
            v.required_spec_claims = ["exp", "iat", "iss"]
                .iter()
                .map(|c| c.to_string())
                .collect();
            match jsonwebtoken::decode::<AppClaims>(jwt, &key, &v) {
                Ok(d) => d.claims,
                Err(_) => {
                    return Err(Box::new(error(
                        401,
                        "A JSON web token could not be decoded",
                    )));
                }
            }
        }
        None => match jwt
            .split('.')
            .nth(1)
            .and_then(|p| {
                base64::engine::general_purpose::URL_SAFE_NO_PAD
                    .decode(p)
                    .ok()
            })
            .and_then(|b| serde_json::from_slice::<AppClaims>(&b).ok())
        {
            Some(c) => c,
            None => {
                return Err(Box::new(error(
                    401,
                    "A JSON web token could not be decoded",
                )));
            }
        },
    };
    if claims.iat > now + 5 || claims.exp <= now || claims.exp - claims.iat > 600 {
        return Err(Box::new(error(
            401,
            "'Expiration time' claim ('exp') is too far in the future",
        )));
    }
    Ok(())
}

#[derive(Debug, Serialize, Deserialize)]
struct AppClaims {
    iat: u64,
    exp: u64,
    iss: String,
}

pub(crate) fn access_token(
    s: &mut State,
    shared: &Shared,
    req: &HttpRequest,
    segs: &[&str],
    now: u64,
) -> (u16, HttpResponse) {
    if let Err(refused) = verify(shared, req, now) {
        return *refused;
    }
    if segs.get(2).and_then(|x| x.parse::<u64>().ok()).is_none() {
        return error(404, "Not Found");
    }
    let token = format!("ghs_{}", random(36));
    let expires = now + s.installation_token_ttl.as_secs();
    s.installation_tokens.insert(token.clone(), expires);
    let expires_at = humantime::format_rfc3339_seconds(
        std::time::UNIX_EPOCH + std::time::Duration::from_secs(expires),
    )
    .to_string();
    (201, HttpResponse::Created().json(json!({
        "token": token,
        "expires_at": expires_at,
        "permissions": { "administration": "write", "actions": "read", "organization_self_hosted_runners": "write" },
        "repository_selection": "all",
    })))
}
