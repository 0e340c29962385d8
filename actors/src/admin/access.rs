//! Who may call the admin API, and how a request proves it.
//!
//! A job runs arbitrary code on the daemon's host, and the admin API listens there too: a job
//! that could `POST /api/v1/cordon` could stop all admission. So every mutating call needs
//! `Authorization: Bearer <token>`; reads stay open on a loopback listener (on any other listener
//! every call needs the token). Requests whose `Host` is not the listener's own address are
//! refused (421), so a web page cannot reach the API through DNS rebinding, and a mutating call
//! may not carry a content type a browser form can send (`application/x-www-form-urlencoded`,
//! `multipart/form-data`, `text/plain`): JSON, or no body at all.
//!
//! The daemon's token is `EPHEMER_ADMIN_TOKEN`, else `state.dir/admin.token` (created at first
//! start, mode 0600 from its creation), which `ephemer-actors cordon` reads.

use std::{
    io::Write,
    net::SocketAddr,
    os::unix::fs::OpenOptionsExt,
    path::Path,
    sync::{Arc, OnceLock},
};

use actix_web::{HttpRequest, HttpResponse, http::header};

use super::api::ErrorAnswer;
use crate::config::Secret;

/// The admin token's file in `state.dir`.
pub const TOKEN_FILE: &str = "admin.token";
/// The environment variable that sets the token instead.
pub const TOKEN_ENV: &str = "EPHEMER_ADMIN_TOKEN";

/// The admin API's access rules.
#[derive(Debug, Clone)]
pub struct Access {
    token: Secret,
    /// The listener, once bound (unset: an app that embeds the API under its own listener and
    /// rules; any `Host`, reads open). Shared, so it can be set after the app factory took a
    /// copy.
    listener: Arc<OnceLock<Listener>>,
}

#[derive(Debug)]
struct Listener {
    /// The `Host` values it answers to (empty: any, for a unix socket, which no browser can
    /// reach).
    hosts: Vec<String>,
    /// Reads need the token too (a listener that is not loopback).
    reads_need_token: bool,
}

/// Why a request was refused: its status and what to do about it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused {
    /// 401, 415 or 421.
    pub status: actix_web::http::StatusCode,
    /// For the caller.
    pub error: String,
}

impl Refused {
    /// The answer to send.
    pub fn answer(self) -> HttpResponse {
        HttpResponse::build(self.status).json(ErrorAnswer { error: self.error })
    }
}

/// What a request wants to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Want {
    /// A `GET`.
    Read,
    /// A `POST` that changes the daemon.
    Change,
}

impl Access {
    /// Rules with this token; reads are open.
    pub fn new(token: Secret) -> Self {
        Access {
            token,
            listener: Arc::default(),
        }
    }

    /// The token.
    pub fn token(&self) -> &Secret {
        &self.token
    }

    /// The API listens on `addr`: only its address is a valid `Host`, and reads need the token
    /// unless it is loopback.
    /// Bound to every address (`0.0.0.0`, `::`), the listener has no one name, so any `Host`
    /// is taken: every call then needs the token, which a rebinding page cannot send.
    pub fn listening_on(&self, addr: SocketAddr) {
        let mut hosts = vec![addr.to_string()];
        if addr.ip().is_loopback() {
            hosts.push(format!("localhost:{}", addr.port()));
        }
        if addr.ip().is_unspecified() {
            hosts.clear();
        }
        let _ = self.listener.set(Listener {
            hosts,
            reads_need_token: !addr.ip().is_loopback(),
        });
    }

    /// The API listens on a unix socket: its file mode (0600) guards reads; changes still need
    /// the token; any `Host`.
    pub fn listening_on_socket(&self) {
        let _ = self.listener.set(Listener {
            hosts: Vec::new(),
            reads_need_token: false,
        });
    }

    /// `Ok` when `req` may do `want`; else the answer to send.
    pub fn check(&self, req: &HttpRequest, want: Want) -> Result<(), Refused> {
        let refuse = |status, error| Err(Refused { status, error });
        let listener = self.listener.get();
        if let Some(hosts) = listener.map(|l| &l.hosts).filter(|h| !h.is_empty()) {
            let host = req
                .headers()
                .get(header::HOST)
                .and_then(|h| h.to_str().ok())
                .unwrap_or("");
            if !hosts.iter().any(|h| h.eq_ignore_ascii_case(host)) {
                return refuse(
                    actix_web::http::StatusCode::MISDIRECTED_REQUEST,
                    format!("this API answers to {} only", hosts.join(" or ")),
                );
            }
        }
        if want == Want::Change {
            let content_type = req
                .headers()
                .get(header::CONTENT_TYPE)
                .and_then(|c| c.to_str().ok())
                .unwrap_or("")
                .to_ascii_lowercase();
            let form = [
                "application/x-www-form-urlencoded",
                "multipart/form-data",
                "text/plain",
            ]
            .iter()
            .any(|t| content_type.trim_start().starts_with(t));
            if form {
                return refuse(
                    actix_web::http::StatusCode::UNSUPPORTED_MEDIA_TYPE,
                    "a change is sent as JSON (Content-Type: application/json) or without a body, \
                     never as a form"
                        .into(),
                );
            }
        }
        if want == Want::Change || listener.is_some_and(|l| l.reads_need_token) {
            let given = req
                .headers()
                .get(header::AUTHORIZATION)
                .and_then(|a| a.to_str().ok())
                .and_then(|a| a.strip_prefix("Bearer "))
                .unwrap_or("");
            if !same(given.as_bytes(), self.token.expose().as_bytes()) {
                return refuse(
                    actix_web::http::StatusCode::UNAUTHORIZED,
                    format!(
                        "this call needs Authorization: Bearer <token> (the token is in \
                         state.dir/{TOKEN_FILE}, or {TOKEN_ENV})"
                    ),
                );
            }
        }
        Ok(())
    }
}

/// Equal without a timing that says how much of it matched.
fn same(a: &[u8], b: &[u8]) -> bool {
    !b.is_empty() && a.len() == b.len() && a.iter().zip(b).fold(0u8, |d, (x, y)| d | (x ^ y)) == 0
}

/// A fresh random token: 32 bytes, hex.
pub fn new_token() -> Secret {
    let bytes: [u8; 32] = rand::random();
    Secret::new(hex::encode(bytes))
}

/// The daemon's token: `EPHEMER_ADMIN_TOKEN` when set, else the one in `state_dir`, made (mode
/// 0600 from its creation) at first start.
pub fn load_or_create(state_dir: &Path) -> std::io::Result<Secret> {
    if let Some(t) = std::env::var(TOKEN_ENV)
        .ok()
        .filter(|t| !t.trim().is_empty())
    {
        return Ok(Secret::new(t.trim()));
    }
    let path = state_dir.join(TOKEN_FILE);
    match std::fs::read_to_string(&path) {
        Ok(t) if !t.trim().is_empty() => return Ok(Secret::new(t.trim())),
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    std::fs::create_dir_all(state_dir)?;
    let token = new_token();
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&path)?;
    writeln!(file, "{}", token.expose())?;
    file.sync_all()?;
    Ok(token)
}

#[cfg(test)]
mod tests {
    use actix_web::test::TestRequest;

    use super::*;

    fn access(listen: &str) -> Access {
        let a = Access::new(Secret::new("s3cret"));
        a.listening_on(listen.parse().unwrap());
        a
    }

    fn status(r: Result<(), Refused>) -> u16 {
        r.map_or_else(|refused| refused.status.as_u16(), |()| 200)
    }

    #[test]
    fn changes_need_the_token_json_and_the_right_host() {
        let a = access("127.0.0.1:9091");
        let base = || {
            TestRequest::post()
                .insert_header((header::HOST, "127.0.0.1:9091"))
                .insert_header((header::CONTENT_TYPE, "application/json"))
        };
        let ok = base().insert_header((header::AUTHORIZATION, "Bearer s3cret"));
        assert_eq!(status(a.check(&ok.to_http_request(), Want::Change)), 200);
        let bare = TestRequest::post()
            .insert_header((header::HOST, "127.0.0.1:9091"))
            .insert_header((header::AUTHORIZATION, "Bearer s3cret"));
        assert_eq!(
            status(a.check(&bare.to_http_request(), Want::Change)),
            200,
            "no body is fine"
        );
        assert_eq!(
            status(a.check(&base().to_http_request(), Want::Change)),
            401
        );
        let wrong = base().insert_header((header::AUTHORIZATION, "Bearer s3cre7"));
        assert_eq!(status(a.check(&wrong.to_http_request(), Want::Change)), 401);
        let form = TestRequest::post()
            .insert_header((header::HOST, "localhost:9091"))
            .insert_header((header::CONTENT_TYPE, "application/x-www-form-urlencoded"))
            .insert_header((header::AUTHORIZATION, "Bearer s3cret"));
        assert_eq!(status(a.check(&form.to_http_request(), Want::Change)), 415);
        let rebound = TestRequest::get().insert_header((header::HOST, "evil.example:9091"));
        assert_eq!(status(a.check(&rebound.to_http_request(), Want::Read)), 421);
        let read = TestRequest::get().insert_header((header::HOST, "localhost:9091"));
        assert_eq!(status(a.check(&read.to_http_request(), Want::Read)), 200);
    }

    #[test]
    fn bound_to_every_address_any_host_is_taken_and_everything_needs_the_token() {
        let a = access("0.0.0.0:9091");
        let remote = || TestRequest::get().insert_header((header::HOST, "10.1.2.3:9091"));
        assert_eq!(
            status(a.check(&remote().to_http_request(), Want::Read)),
            401
        );
        let with_token = remote().insert_header((header::AUTHORIZATION, "Bearer s3cret"));
        assert_eq!(
            status(a.check(&with_token.to_http_request(), Want::Read)),
            200
        );
    }

    #[test]
    fn off_loopback_reads_need_the_token_too() {
        let a = access("10.0.0.5:9091");
        let read = TestRequest::get().insert_header((header::HOST, "10.0.0.5:9091"));
        assert_eq!(status(a.check(&read.to_http_request(), Want::Read)), 401);
    }

    #[test]
    fn the_token_file_is_private_from_its_creation_and_kept() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let first = load_or_create(dir.path()).unwrap();
        let mode = std::fs::metadata(dir.path().join(TOKEN_FILE))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        assert_eq!(first.expose().len(), 64);
        assert_eq!(load_or_create(dir.path()).unwrap(), first);
    }
}
