//! `serve`: the daemon's composition root. It reads top to bottom in start order.
//!
//! 1. the actix `System` and the shared values (metrics, health);
//! 2. the state directory;
//! 3. the HTTP listeners: webhook (with `/healthz`, `/readyz`, and `/metrics` unless it has a
//!    listener of its own) and metrics;
//! 4. readiness, then wait for SIGTERM or SIGINT;
//! 5. on the signal: mark draining, stop the listeners gracefully, return (exit 0).

use std::time::Duration;

use actix_web::{App, HttpServer, web};
use anyhow::Context;
use ephemer_actors_core::{config::Config, http::Health, metrics::Metrics};
use tokio::signal::unix::{SignalKind, signal};

/// How long the HTTP listeners wait for in-flight requests when stopping.
const HTTP_SHUTDOWN: Duration = Duration::from_secs(2);

/// Runs the daemon on a fresh actix `System` until a shutdown signal.
pub fn run(config: Config) -> anyhow::Result<()> {
    actix_rt::System::new().block_on(serve(config))
}

async fn serve(config: Config) -> anyhow::Result<()> {
    let metrics = web::Data::new(Metrics::new());
    let health = web::Data::new(Health::default());
    metrics
        .concurrent_capacity
        .set(config.runner.max_concurrent.try_into().unwrap_or(i64::MAX));
    for (kind, _) in config.providers.enabled() {
        metrics.init_provider(kind.as_str());
    }

    std::fs::create_dir_all(&config.state.dir)
        .with_context(|| format!("cannot create state.dir {}", config.state.dir.display()))?;

    let metrics_on_webhook = config.metrics.listen.is_none();
    let webhook_server = {
        let (metrics, health) = (metrics.clone(), health.clone());
        HttpServer::new(move || {
            let app = App::new()
                .app_data(health.clone())
                .app_data(metrics.clone())
                .configure(Health::configure);
            if metrics_on_webhook {
                app.configure(ephemer_actors_core::http::configure_metrics)
            } else {
                app
            }
        })
        .disable_signals()
        .shutdown_timeout(HTTP_SHUTDOWN.as_secs())
        .bind(config.webhook.listen)
        .with_context(|| format!("cannot bind webhook.listen {}", config.webhook.listen))?
        .run()
    };
    let mut servers = vec![webhook_server];
    if let Some(listen) = config.metrics.listen {
        let metrics = metrics.clone();
        let server = HttpServer::new(move || {
            App::new()
                .app_data(metrics.clone())
                .configure(ephemer_actors_core::http::configure_metrics)
        })
        .workers(1)
        .disable_signals()
        .shutdown_timeout(HTTP_SHUTDOWN.as_secs())
        .bind(listen)
        .with_context(|| format!("cannot bind metrics.listen {listen}"))?
        .run();
        servers.push(server);
    }
    let handles: Vec<_> = servers.iter().map(|s| s.handle()).collect();
    for server in servers {
        actix_rt::spawn(server);
    }

    health.set_ready();
    tracing::info!(
        webhook = %config.webhook.listen,
        path = %config.webhook.path,
        metrics = %config.metrics.listen.map_or("webhook listener".to_string(), |a| a.to_string()),
        version = env!("CARGO_PKG_VERSION"),
        "ephemer-actors serving"
    );

    let signal_name = wait_for_shutdown_signal().await?;
    tracing::info!(signal = signal_name, "shutdown signal received; draining");
    health.set_draining(true);
    metrics.draining.set(1);

    for handle in handles {
        handle.stop(true).await;
    }
    tracing::info!("stopped cleanly");
    Ok(())
}

/// Resolves with the name of the first SIGTERM or SIGINT.
async fn wait_for_shutdown_signal() -> anyhow::Result<&'static str> {
    let mut term = signal(SignalKind::terminate()).context("cannot listen for SIGTERM")?;
    let mut int = signal(SignalKind::interrupt()).context("cannot listen for SIGINT")?;
    Ok(tokio::select! {
        _ = term.recv() => "SIGTERM",
        _ = int.recv() => "SIGINT",
    })
}
