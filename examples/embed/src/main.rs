//! Embedding ephemer-actors in a host actix-web app: the host keeps its own routes, mounts one
//! instance's intake, health, metrics and admin routes under a scope of its choosing, starts
//! the actors with `system::start`, reads the instance's status in code with `Admin::status`,
//! and shuts the instance down with `Handles::shutdown` while the host keeps serving.
//!
//! A crate of its own that names only the embedding API (docs/embedding.md): it depends on
//! `ephemer-actors-core` without the `daemon` feature, so it compiles only while that API is
//! enough.
//!
//! ```sh
//! cargo run --example embed -- ephemer.toml
//! ```
//!
//! The host answers `GET /hello`; the instance answers under `/ci` (`POST /ci/webhook/github`,
//! `/ci/healthz`, `/ci/readyz`, `/ci/metrics`, `/ci/api/v1/...`). Ctrl-C shuts the instance
//! down, then the host.

use actix_web::{App, HttpResponse, HttpServer, web};
use ephemer_actors_core::{
    admin::Admin,
    clock::Clock,
    config::{Config, Environment},
    http::{Health, configure_metrics},
    metrics::Metrics,
    system::{self, Handles, StartOptions},
    webhook::WebhookIntake,
};

/// Mounts one instance's routes under `scope` (e.g. `/ci`) in a host app.
pub fn mount(cfg: &mut web::ServiceConfig, scope: &str, handles: &Handles, webhook_path: &str) {
    cfg.service(
        web::scope(scope)
            .app_data(web::Data::new(handles.metrics.clone()))
            .app_data(handles.health.clone())
            .app_data(web::Data::new(Admin::new(handles)))
            .configure(Health::configure)
            .configure(configure_metrics)
            .configure(Admin::configure)
            .service(WebhookIntake::resource(
                handles.intake.clone(),
                webhook_path,
            )),
    );
}

/// The host's own route.
pub async fn hello() -> HttpResponse {
    HttpResponse::Ok().body("hello from the host app")
}

/// Starts an instance of `config` in the current actix System, ready to be mounted.
pub fn start_instance(config: &Config) -> Result<Handles, system::StartError> {
    let handles = system::start(
        config,
        Metrics::new(),
        Clock::real(),
        StartOptions::default(),
    )?;
    handles.health.set_ready();
    Ok(handles)
}

/// One line on how the instance stands, read in code (the admin API answers the same).
pub async fn observe(handles: &Handles) -> String {
    match Admin::new(handles).status().await {
        Some(status) => {
            let s = &status.scheduler;
            format!(
                "{} pools, {} jobs waiting, {} runners, {} claims so far",
                s.providers.len(),
                s.pending,
                s.runners,
                s.stats.claims
            )
        }
        None => "the instance is not running".to_string(),
    }
}

#[actix_web::main]
async fn main() -> anyhow::Result<()> {
    let path = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "ephemer.toml".into());
    let config = Config::load(path.as_ref(), &Environment::from_process())?;
    let handles = start_instance(&config)?;

    let (instance, webhook_path) = (handles.clone(), config.webhook.path.clone());
    let server = HttpServer::new(move || {
        App::new()
            .route("/hello", web::get().to(hello))
            .configure(|cfg| mount(cfg, "/ci", &instance, &webhook_path))
    })
    .bind(config.webhook.listen)?
    .run();
    let host = server.handle();
    actix_rt::spawn(server);

    println!(
        "ephemer-actors instance under /ci: {}",
        observe(&handles).await
    );
    tokio::signal::ctrl_c().await?;
    // The instance drains and stops; the host app is still serving `/hello` meanwhile.
    handles.shutdown(config.runner.shutdown_timeout).await;
    host.stop(true).await;
    Ok(())
}
