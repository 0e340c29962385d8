//! The admin API (`admin.listen`, loopback by default): what an operator asks a running daemon.
//!
//! [`access`] says who may call it: changes need the admin token, reads are open on loopback.
//!
//! `GET /api/v1/status` (version, uptime, draining, capacity per provider, retry queue depth, the
//! rate reading), `GET /api/v1/jobs` (every job the scheduler knows), `GET /api/v1/jobs/{id}`
//! (one job with its timeline: every decision taken about it, so "why is my job still queued?"
//! has an answer), `GET /api/v1/census` (entries per in-memory collection), `GET
//! /api/v1/usage?since=30d&by=repo` (runner-minutes per repo, pool or target), `GET
//! /api/v1/egress?pool=NAME&since=7d` (the names a pool's jobs looked up), `POST
//! /api/v1/cordon` and `/uncordon`. Read-only but for cordon; it holds
//! no state of its own. Its answers are the types of [`api`], which the CLI reads back.

use std::time::Instant;

pub mod access;
pub(crate) mod api;
mod census;
pub mod egress;
mod page;
pub mod usage;

use access::{Access, Want};
use actix::Addr;
use actix_web::{HttpRequest, HttpResponse, web};
pub use api::{CordonAnswer, ErrorAnswer, JobAnswer, JobsAnswer, StatusAnswer};

use crate::{
    rate::{GetRateSnapshot, RateActor},
    retry::{GetRetryTimer, RetryActor},
    scheduler::{
        SchedulerActor,
        messages::{GetJob, GetJobs, GetStatus, SetCordon, ShuttingDown},
    },
    system::Handles,
};

/// What the admin handlers talk to.
#[derive(Debug, Clone)]
pub struct Admin {
    scheduler: Addr<SchedulerActor>,
    retry: Addr<RetryActor>,
    rate: Addr<RateActor>,
    webhook: Addr<crate::webhook::WebhookActor>,
    credential: String,
    /// Each target's credential key, in target order.
    credentials: Vec<String>,
    started: Instant,
    access: Access,
    /// Fleet mode: `status` shows the fleet, `jobs ID` who holds the job.
    ledger: Option<crate::cluster::Ledger>,
    /// The runner's releases and each pool's version.
    release: Option<Addr<crate::release::actor::ReleaseActor>>,
    /// Scale-set mode: the listeners.
    scalesets: Vec<Addr<crate::scaleset::ScaleSetListener>>,
    /// Each target's owner (lowercased) and web address, for the status page's links.
    web: Vec<(String, String)>,
    /// Where each pool's egress audit log is.
    egress_dir: std::path::PathBuf,
}

impl Admin {
    /// The admin API of one instance, with a fresh random token (see [`Admin::token`]) and
    /// reads open: for an app that embeds the routes under its own listener and rules.
    pub fn new(handles: &Handles) -> Self {
        Admin {
            scheduler: handles.scheduler.clone(),
            retry: handles.retry.clone(),
            rate: handles.rate.clone(),
            webhook: handles.webhook.clone(),
            credential: handles.credential.clone(),
            credentials: handles.credentials.clone(),
            started: Instant::now(),
            access: Access::new(access::new_token()),
            ledger: handles.ledger.clone(),
            release: handles.release.clone(),
            scalesets: handles.scalesets.clone(),
            web: handles.web.clone(),
            egress_dir: handles.egress_dir.clone(),
        }
    }

    /// The same API under these access rules (the daemon's token and listener).
    pub fn with_access(mut self, access: Access) -> Self {
        self.access = access;
        self
    }

    /// Its access rules (to tell them the listener once it is bound).
    pub fn access(&self) -> &Access {
        &self.access
    }

    /// The token a mutating call must carry.
    pub fn token(&self) -> &crate::config::Secret {
        self.access.token()
    }

    /// Adds the `/api/v1` routes and the status page (`/`, `/jobs/{id}`, `/assets/`) to an
    /// app or scope (with `web::Data<Admin>` registered).
    pub fn configure(cfg: &mut web::ServiceConfig) {
        page::configure(cfg);
        cfg.route("/api/v1/status", web::get().to(status))
            .route("/api/v1/jobs", web::get().to(jobs))
            .route("/api/v1/jobs/{id}", web::get().to(job))
            .route("/api/v1/census", web::get().to(census::census))
            .route("/api/v1/usage", web::get().to(usage::usage))
            .route("/api/v1/egress", web::get().to(egress::egress))
            .route("/api/v1/cordon", web::post().to(cordon))
            .route("/api/v1/uncordon", web::post().to(uncordon));
    }
}

fn unavailable(what: &str) -> HttpResponse {
    HttpResponse::ServiceUnavailable().json(ErrorAnswer {
        error: format!("{what} is not running"),
    })
}

async fn status(admin: web::Data<Admin>, req: HttpRequest) -> HttpResponse {
    if let Err(refused) = admin.access.check(&req, Want::Read) {
        return refused.answer();
    }
    match status_answer(&admin).await {
        Ok(answer) => HttpResponse::Ok().json(answer),
        Err(unavailable) => unavailable,
    }
}

impl Admin {
    /// The instance's status, as `GET /api/v1/status` answers it (an embedding application
    /// reads it without going through HTTP); `None` while the scheduler is not running.
    pub async fn status(&self) -> Option<StatusAnswer> {
        status_answer(self).await.ok()
    }
}

/// What `GET /api/v1/status` answers (the status page shows the same).
async fn status_answer(admin: &Admin) -> Result<StatusAnswer, HttpResponse> {
    let Ok(mut state) = admin.scheduler.send(GetStatus).await else {
        return Err(unavailable("scheduler"));
    };
    // Each target's budget is its own credential's.
    for (target, credential) in state.targets.iter_mut().zip(&admin.credentials) {
        let ask = GetRateSnapshot {
            credential: credential.clone(),
        };
        if let Ok(rates) = admin.rate.send(ask).await {
            target.rate = rates.into_iter().collect();
        }
    }
    let retry_timer = admin.retry.send(GetRetryTimer).await.ok();
    let rates = admin
        .rate
        .send(GetRateSnapshot {
            credential: admin.credential.clone(),
        })
        .await
        .map(|v| v.into_iter().collect())
        .unwrap_or_default();
    let fleet = match &admin.ledger {
        Some(ledger) => match ledger.fleet().await {
            Ok(fleet) => Some(fleet),
            Err(e) => {
                tracing::warn!(error = %e, "status: cannot read the fleet from the ledger");
                None
            }
        },
        None => None,
    };
    let runner = match &admin.release {
        Some(release) => release
            .send(crate::release::actor::GetRunnerRelease)
            .await
            .ok(),
        None => None,
    };
    let mut scalesets = Vec::with_capacity(admin.scalesets.len());
    for listener in &admin.scalesets {
        if let Ok(view) = listener.send(crate::scaleset::GetListener).await {
            scalesets.push(view);
        }
    }
    Ok(StatusAnswer {
        runner,
        scalesets,
        version: env!("CARGO_PKG_VERSION").into(),
        uptime_seconds: admin.started.elapsed().as_secs(),
        scheduler: state,
        retry_timer,
        rates,
        fleet,
    })
}

async fn jobs(admin: web::Data<Admin>, req: HttpRequest) -> HttpResponse {
    if let Err(refused) = admin.access.check(&req, Want::Read) {
        return refused.answer();
    }
    match admin.scheduler.send(GetJobs).await {
        Ok(jobs) => HttpResponse::Ok().json(jobs),
        Err(_) => unavailable("scheduler"),
    }
}

async fn job(admin: web::Data<Admin>, id: web::Path<String>, req: HttpRequest) -> HttpResponse {
    if let Err(refused) = admin.access.check(&req, Want::Read) {
        return refused.answer();
    }
    let Ok(id) = id.parse::<u64>() else {
        return HttpResponse::BadRequest().json(ErrorAnswer {
            error: "a job id is a number".into(),
        });
    };
    match admin.scheduler.send(GetJob(id)).await {
        Ok(Some(mut detail)) => {
            if let Some(ledger) = &admin.ledger {
                detail.ledger = ledger.job(&detail.job.key).await.ok().flatten();
            }
            HttpResponse::Ok().json(detail)
        }
        Ok(None) => HttpResponse::NotFound().json(ErrorAnswer {
            error: format!("job {id} is not known to the scheduler"),
        }),
        Err(_) => unavailable("scheduler"),
    }
}

async fn set_cordon(admin: web::Data<Admin>, req: HttpRequest, on: bool) -> HttpResponse {
    if let Err(refused) = admin.access.check(&req, Want::Change) {
        return refused.answer();
    }
    match admin.scheduler.send(SetCordon(on)).await {
        Ok(Ok(())) => HttpResponse::Ok().json(CordonAnswer { cordoned: on }),
        Ok(Err(ShuttingDown)) => HttpResponse::Conflict().json(ErrorAnswer {
            error: ShuttingDown.to_string(),
        }),
        Err(_) => unavailable("scheduler"),
    }
}

async fn cordon(admin: web::Data<Admin>, req: HttpRequest) -> HttpResponse {
    set_cordon(admin, req, true).await
}

async fn uncordon(admin: web::Data<Admin>, req: HttpRequest) -> HttpResponse {
    set_cordon(admin, req, false).await
}
