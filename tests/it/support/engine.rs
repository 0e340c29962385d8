//! A stub container engine: the Docker Engine API on a unix socket, answering as a Podman
//! whose container init is missing does. The answers are what podman 4.3 (Debian 12,
//! installed with `--no-install-recommends`, so without `catatonit`) really gives on
//! `POST /containers/create` with `HostConfig.Init`:
//!
//! ```text
//! 500 {"cause":"no such file or directory","message":"container create: container-init binary
//!      not found on the host: stat /usr/libexec/podman/catatonit: no such file or directory",
//!      "response":500}
//! ```
//!
//! Listing containers answers an empty list; every request is recorded.
//!
//! [`StubEngine::start_failing_starts`] is the other broken host: creates succeed (so the
//! pool's host check passes) but every start fails with 500, as an engine does when the image's
//! command is missing (`crun: executable file not found in $PATH`): the pool is up, and each
//! job's environment fails.

use std::{
    path::PathBuf,
    sync::{Arc, Mutex},
};

use actix_web::{App, HttpRequest, HttpResponse, HttpServer, web};

/// The error body podman answers a create with when catatonit is not installed.
pub const NO_INIT: &str = r#"{"cause":"no such file or directory","message":"container create: container-init binary not found on the host: stat /usr/libexec/podman/catatonit: no such file or directory","response":500}"#;

/// What podman answers a start with when the image's command does not exist.
pub const NO_COMMAND: &str = r#"{"cause":"no such file or directory","message":"crun: executable file `/home/runner/run.sh` not found: No such file or directory: OCI runtime attempted to invoke a command that was not found","response":500}"#;

/// A running stub engine.
pub struct StubEngine {
    /// `unix:///.../engine.sock`
    pub socket: String,
    calls: Arc<Mutex<Vec<String>>>,
    server: actix_web::dev::ServerHandle,
    _dir: tempfile::TempDir,
}

impl StubEngine {
    /// A Podman without its container init: every create fails.
    pub fn start_without_init() -> StubEngine {
        Self::start(false)
    }

    /// An engine whose creates succeed and whose starts all fail.
    pub fn start_failing_starts() -> StubEngine {
        Self::start(true)
    }

    /// Starts the stub on a socket in a temp dir.
    fn start(creates_work: bool) -> StubEngine {
        let dir = tempfile::tempdir().unwrap();
        let path: PathBuf = dir.path().join("engine.sock");
        let calls = Arc::new(Mutex::new(Vec::new()));
        let recorded = calls.clone();
        let server = HttpServer::new(move || {
            let recorded = recorded.clone();
            App::new().default_service(web::to(move |req: HttpRequest| {
                let recorded = recorded.clone();
                async move {
                    let path = req.path().to_string();
                    recorded
                        .lock()
                        .unwrap()
                        .push(format!("{} {path}", req.method()));
                    if path.ends_with("/containers/create") && creates_work {
                        HttpResponse::Created()
                            .json(serde_json::json!({"Id": "0123abcd", "Warnings": []}))
                    } else if path.ends_with("/containers/create") {
                        HttpResponse::InternalServerError()
                            .content_type("application/json")
                            .body(NO_INIT)
                    } else if path.ends_with("/start") {
                        HttpResponse::InternalServerError()
                            .content_type("application/json")
                            .body(NO_COMMAND)
                    } else if req.method() == actix_web::http::Method::DELETE
                        || path.ends_with("/stop")
                    {
                        HttpResponse::NoContent().finish()
                    } else if path.ends_with("/containers/json") {
                        HttpResponse::Ok().json(serde_json::json!([]))
                    } else if path.contains("/images/") && path.ends_with("/json") {
                        // The runner image is there (Engine API: GET /images/{name}/json).
                        HttpResponse::Ok().json(serde_json::json!({"Id": "sha256:0123abcd"}))
                    } else if path.ends_with("/_ping") {
                        HttpResponse::Ok().body("OK")
                    } else {
                        HttpResponse::NotFound().json(
                            serde_json::json!({"message": "no such container", "response": 404}),
                        )
                    }
                }
            }))
        })
        .workers(1)
        .bind_uds(&path)
        .expect("bind the stub engine socket")
        .run();
        let handle = server.handle();
        actix_rt::spawn(server);
        StubEngine {
            socket: format!("unix://{}", path.display()),
            calls,
            server: handle,
            _dir: dir,
        }
    }

    /// How many requests matched `needle` (e.g. `"POST /v1.47/containers/create"` or just
    /// `"/containers/create"`).
    pub fn count(&self, needle: &str) -> usize {
        self.calls
            .lock()
            .unwrap()
            .iter()
            .filter(|c| c.contains(needle))
            .count()
    }
}

impl Drop for StubEngine {
    fn drop(&mut self) {
        drop(self.server.stop(false));
    }
}
