//! HTTP endpoints that every deployment shares: `/healthz`, `/readyz` and `/metrics`.
//!
//! [`Health`] is the one readiness flag the composition root flips: ready once the scheduler
//! and providers are up, draining from the first shutdown signal. Named checks join it (the
//! store writes, each core actor is alive): `/readyz` is 503 while any fails, so an instance
//! never says ready while a part of it is dead. The handlers only read it.

use std::{
    sync::atomic::{AtomicBool, Ordering},
    time::Instant,
};

use actix_web::{HttpResponse, web};
use serde_json::json;

use crate::metrics::Metrics;

/// A named readiness check.
type Check = (String, Box<dyn Fn() -> bool + Send + Sync>);

/// Liveness and readiness of one daemon instance.
pub struct Health {
    started: Instant,
    ready: AtomicBool,
    draining: AtomicBool,
    checks: std::sync::Mutex<Vec<Check>>,
}

impl std::fmt::Debug for Health {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Health")
            .field("ready", &self.ready)
            .field("draining", &self.draining)
            .field("failing", &self.failing())
            .finish()
    }
}

impl Default for Health {
    fn default() -> Self {
        Health {
            started: Instant::now(),
            ready: AtomicBool::new(false),
            draining: AtomicBool::new(false),
            checks: std::sync::Mutex::default(),
        }
    }
}

impl Health {
    /// Adds a check `/readyz` asks: the instance is not ready while `ok` says false.
    pub fn add_check(
        &self,
        name: impl Into<String>,
        ok: impl Fn() -> bool + Send + Sync + 'static,
    ) {
        self.checks
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((name.into(), Box::new(ok)));
    }

    /// The checks that fail now.
    pub fn failing(&self) -> Vec<String> {
        self.checks
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .filter(|(_, ok)| !ok())
            .map(|(name, _)| name.clone())
            .collect()
    }

    /// Marks the scheduler and providers as up.
    pub fn set_ready(&self) {
        self.ready.store(true, Ordering::SeqCst);
    }

    /// Marks the instance as draining (or not): `/readyz` answers 503 while it is.
    pub fn set_draining(&self, draining: bool) {
        self.draining.store(draining, Ordering::SeqCst);
    }

    /// True while draining.
    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::SeqCst)
    }

    /// Adds `GET /healthz` and `GET /readyz` to an app or scope.
    pub fn configure(cfg: &mut web::ServiceConfig) {
        cfg.route("/healthz", web::get().to(healthz))
            .route("/readyz", web::get().to(readyz));
    }
}

async fn healthz(health: web::Data<Health>) -> HttpResponse {
    HttpResponse::Ok().json(json!({
        "status": "ok",
        "version": env!("CARGO_PKG_VERSION"),
        "uptime_seconds": health.started.elapsed().as_secs(),
        "draining": health.is_draining(),
    }))
}

async fn readyz(health: web::Data<Health>) -> HttpResponse {
    let status = if health.is_draining() {
        "draining"
    } else if !health.ready.load(Ordering::SeqCst) {
        "starting"
    } else {
        let failing = health.failing();
        if failing.is_empty() {
            return HttpResponse::Ok().json(json!({ "status": "ready" }));
        }
        return HttpResponse::ServiceUnavailable()
            .json(json!({ "status": "unhealthy", "failing": failing }));
    };
    HttpResponse::ServiceUnavailable().json(json!({ "status": status }))
}

/// Adds `GET /metrics` (Prometheus text) to an app or scope.
pub fn configure_metrics(cfg: &mut web::ServiceConfig) {
    cfg.route("/metrics", web::get().to(metrics));
}

async fn metrics(metrics: web::Data<Metrics>) -> HttpResponse {
    HttpResponse::Ok()
        .content_type("text/plain; version=0.0.4; charset=utf-8")
        .body(metrics.encode())
}

#[cfg(test)]
mod tests {
    use actix_web::{App, test};

    use super::*;

    #[actix_web::test]
    async fn readyz_follows_the_lifecycle() {
        let health = web::Data::new(Health::default());
        let app = test::init_service(
            App::new()
                .app_data(health.clone())
                .configure(Health::configure),
        )
        .await;
        let get = |path: &'static str| test::TestRequest::get().uri(path).to_request();
        assert_eq!(
            test::call_service(&app, get("/healthz")).await.status(),
            200
        );
        assert_eq!(test::call_service(&app, get("/readyz")).await.status(), 503);
        health.set_ready();
        assert_eq!(test::call_service(&app, get("/readyz")).await.status(), 200);
        let store_ok = std::sync::Arc::new(AtomicBool::new(false));
        let ok = store_ok.clone();
        health.add_check("store", move || ok.load(Ordering::SeqCst));
        assert_eq!(test::call_service(&app, get("/readyz")).await.status(), 503);
        assert_eq!(health.failing(), ["store"]);
        store_ok.store(true, Ordering::SeqCst);
        assert_eq!(test::call_service(&app, get("/readyz")).await.status(), 200);
        health.set_draining(true);
        assert_eq!(test::call_service(&app, get("/readyz")).await.status(), 503);
        assert_eq!(
            test::call_service(&app, get("/healthz")).await.status(),
            200
        );
    }
}
