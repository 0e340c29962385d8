//! The admin API (`admin.listen`, loopback by default): what an operator asks a running daemon.
//!
//! `GET /api/v1/status` (version, uptime, draining, capacity per provider, retry queue depth, the
//! rate reading), `GET /api/v1/jobs` (every job the scheduler knows), `GET /api/v1/jobs/{id}`
//! (one job with its timeline: every decision taken about it, so "why is my job still queued?"
//! has an answer), `POST /api/v1/cordon` and `/uncordon`. Read-only but for cordon; it holds
//! no state of its own. Its answers are the types of [`api`], which the CLI reads back.

use std::time::Instant;

pub mod api;

use actix::Addr;
use actix_web::{HttpResponse, web};
pub use api::{CordonAnswer, ErrorAnswer, JobAnswer, JobsAnswer, StatusAnswer};

use crate::{
    rate::{GetRateSnapshot, RateActor},
    retry::{GetRetryTimer, RetryActor},
    scheduler::{
        SchedulerActor,
        messages::{GetJob, GetJobs, GetStatus, SetCordon},
    },
    system::Handles,
};

/// What the admin handlers talk to.
#[derive(Debug, Clone)]
pub struct Admin {
    scheduler: Addr<SchedulerActor>,
    retry: Addr<RetryActor>,
    rate: Addr<RateActor>,
    credential: String,
    started: Instant,
}

impl Admin {
    /// The admin API of one instance.
    pub fn new(handles: &Handles) -> Self {
        Admin {
            scheduler: handles.scheduler.clone(),
            retry: handles.retry.clone(),
            rate: handles.rate.clone(),
            credential: handles.credential.clone(),
            started: Instant::now(),
        }
    }

    /// Adds the `/api/v1` routes to an app or scope (with `web::Data<Admin>` registered).
    pub fn configure(cfg: &mut web::ServiceConfig) {
        cfg.route("/api/v1/status", web::get().to(status))
            .route("/api/v1/jobs", web::get().to(jobs))
            .route("/api/v1/jobs/{id}", web::get().to(job))
            .route("/api/v1/cordon", web::post().to(cordon))
            .route("/api/v1/uncordon", web::post().to(uncordon));
    }
}

fn unavailable(what: &str) -> HttpResponse {
    HttpResponse::ServiceUnavailable().json(ErrorAnswer {
        error: format!("{what} is not running"),
    })
}

async fn status(admin: web::Data<Admin>) -> HttpResponse {
    let Ok(state) = admin.scheduler.send(GetStatus).await else {
        return unavailable("scheduler");
    };
    let retry_timer = admin.retry.send(GetRetryTimer).await.ok();
    let rates = admin
        .rate
        .send(GetRateSnapshot {
            credential: admin.credential.clone(),
        })
        .await
        .map(|v| v.into_iter().collect())
        .unwrap_or_default();
    HttpResponse::Ok().json(StatusAnswer {
        version: env!("CARGO_PKG_VERSION").into(),
        uptime_seconds: admin.started.elapsed().as_secs(),
        scheduler: state,
        retry_timer,
        rates,
    })
}

async fn jobs(admin: web::Data<Admin>) -> HttpResponse {
    match admin.scheduler.send(GetJobs).await {
        Ok(jobs) => HttpResponse::Ok().json(jobs),
        Err(_) => unavailable("scheduler"),
    }
}

async fn job(admin: web::Data<Admin>, id: web::Path<String>) -> HttpResponse {
    let Ok(id) = id.parse::<u64>() else {
        return HttpResponse::BadRequest().json(ErrorAnswer {
            error: "a job id is a number".into(),
        });
    };
    match admin.scheduler.send(GetJob(id)).await {
        Ok(Some(detail)) => HttpResponse::Ok().json(detail),
        Ok(None) => HttpResponse::NotFound().json(ErrorAnswer {
            error: format!("job {id} is not known to the scheduler"),
        }),
        Err(_) => unavailable("scheduler"),
    }
}

async fn set_cordon(admin: web::Data<Admin>, on: bool) -> HttpResponse {
    match admin.scheduler.send(SetCordon(on)).await {
        Ok(()) => HttpResponse::Ok().json(CordonAnswer { cordoned: on }),
        Err(_) => unavailable("scheduler"),
    }
}

async fn cordon(admin: web::Data<Admin>) -> HttpResponse {
    set_cordon(admin, true).await
}

async fn uncordon(admin: web::Data<Admin>) -> HttpResponse {
    set_cordon(admin, false).await
}
