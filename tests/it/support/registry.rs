//! A read-only container registry (the OCI distribution API's pull side: `/v2/`, manifests and
//! blobs, GET and HEAD) serving one image from an OCI layout directory, as `podman save
//! --format oci-dir` writes it. It counts the manifest fetches, so a test can tell how many
//! pulls an engine made.

use std::{
    path::PathBuf,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
};

use actix_web::{App, HttpRequest, HttpResponse, HttpServer, web};

/// A running registry.
pub struct Registry {
    /// `127.0.0.1:port`
    pub addr: std::net::SocketAddr,
    requests: Arc<Mutex<Vec<String>>>,
    down: Arc<AtomicBool>,
}

struct Served {
    layout: PathBuf,
    tag: String,
    requests: Arc<Mutex<Vec<String>>>,
    down: Arc<AtomicBool>,
}

impl Registry {
    /// Serves the image in `layout` under any repository name, as `tag` (and its digest).
    pub fn start(layout: PathBuf, tag: &str) -> Registry {
        let requests = Arc::new(Mutex::new(Vec::new()));
        let down = Arc::new(AtomicBool::new(false));
        let served = web::Data::new(Served {
            layout,
            tag: tag.to_string(),
            requests: requests.clone(),
            down: down.clone(),
        });
        let server = HttpServer::new(move || {
            App::new()
                .app_data(served.clone())
                .default_service(web::to(answer))
        })
        .workers(1)
        .disable_signals()
        .bind(("127.0.0.1", 0))
        .unwrap();
        let addr = server.addrs()[0];
        actix_rt::spawn(server.run());
        Registry {
            addr,
            requests,
            down,
        }
    }

    /// While down, every manifest and blob is answered 503 (a registry's bad minute); `/v2/`
    /// still answers.
    pub fn set_down(&self, down: bool) {
        self.down.store(down, Ordering::SeqCst);
    }

    /// `METHOD path` of every request, in order.
    pub fn requests(&self) -> Vec<String> {
        self.requests.lock().unwrap().clone()
    }

    /// Manifest fetches (GET) of `repo`.
    pub fn manifest_gets(&self, repo: &str) -> usize {
        let prefix = format!("GET /v2/{repo}/manifests/");
        self.requests()
            .iter()
            .filter(|r| r.starts_with(&prefix))
            .count()
    }
}

async fn answer(req: HttpRequest, served: web::Data<Served>) -> HttpResponse {
    let path = req.path().to_string();
    served
        .requests
        .lock()
        .unwrap()
        .push(format!("{} {path}", req.method()));
    if path == "/v2/" || path == "/v2" {
        return HttpResponse::Ok()
            .insert_header(("Docker-Distribution-API-Version", "registry/2.0"))
            .json(serde_json::json!({}));
    }
    if served.down.load(Ordering::SeqCst) {
        return HttpResponse::ServiceUnavailable().body("down for maintenance");
    }
    let index: serde_json::Value = serde_json::from_slice(
        &std::fs::read(served.layout.join("index.json")).unwrap_or_default(),
    )
    .unwrap_or_default();
    let manifest = &index["manifests"][0];
    let digest = manifest["digest"].as_str().unwrap_or("").to_string();
    let (kind, reference) = if let Some((_, r)) = path.rsplit_once("/manifests/") {
        ("manifest", r.to_string())
    } else if let Some((_, r)) = path.rsplit_once("/blobs/") {
        ("blob", r.to_string())
    } else {
        return not_found();
    };
    let (digest_wanted, media_type) = match kind {
        "manifest" if reference == served.tag || reference == digest => (
            digest.clone(),
            manifest["mediaType"]
                .as_str()
                .unwrap_or("application/vnd.oci.image.manifest.v1+json")
                .to_string(),
        ),
        "blob" => (reference.clone(), "application/octet-stream".to_string()),
        _ => return not_found(),
    };
    let Some(hex) = digest_wanted.strip_prefix("sha256:") else {
        return not_found();
    };
    let Ok(bytes) = std::fs::read(served.layout.join("blobs/sha256").join(hex)) else {
        return not_found();
    };
    // actix answers a HEAD with this body's length and without the body.
    HttpResponse::Ok()
        .insert_header(("Content-Type", media_type))
        .insert_header(("Docker-Content-Digest", digest_wanted))
        .body(bytes)
}

fn not_found() -> HttpResponse {
    HttpResponse::NotFound().json(serde_json::json!({
        "errors": [{"code": "MANIFEST_UNKNOWN", "message": "manifest unknown"}]
    }))
}
