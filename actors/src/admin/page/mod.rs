//! The status page: `GET /` (pools, budgets, the queue by state, fleet hosts, the jobs not
//! started) and `GET /jobs/ID` (a job's timeline as a bar, then in words), server-rendered from
//! the same answers as the admin API's JSON, under the same access rules. Read-only. It does
//! nothing until asked: its script fetches a shown page again when the scheduler's state
//! changes (server-sent events, `GET /events`), or every 5 s where those cannot be had (a
//! listener that needs the token; more than a few pages open), and stops while hidden; with
//! scripts off the page refreshes itself every 5 s. `GET /jobs` lists and filters every job.
//! Its stylesheet and script are served from here (`/assets/`), never from elsewhere.

mod bar;
mod chart;
mod list;
mod live;
mod render;
#[cfg(test)]
mod tests;
mod usage;

use actix_web::{HttpRequest, HttpResponse, http::StatusCode, web};
use maud::Markup;

use super::{Admin, access::Want};
use crate::scheduler::messages::{GetJob, GetJobs};

const CSS: &str = include_str!("page.css");
const JS: &str = include_str!("page.js");

/// What the browser may load and send: this listener's own stylesheet and script, requests to
/// it, nothing framed, no form posted anywhere.
const POLICY: &str = "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'";

/// Adds the page's routes.
pub(super) fn configure(cfg: &mut web::ServiceConfig) {
    cfg.route("/", web::get().to(overview))
        .route("/jobs", web::get().to(jobs))
        .route("/events", web::get().to(live::events))
        .route("/usage", web::get().to(usage_page))
        .route("/jobs/{id}", web::get().to(job))
        .route("/assets/page.css", web::get().to(css))
        .route("/assets/page.js", web::get().to(js));
}

fn html(status: StatusCode, markup: Markup) -> HttpResponse {
    HttpResponse::build(status)
        .content_type("text/html; charset=utf-8")
        .insert_header(("Content-Security-Policy", POLICY))
        .insert_header(("X-Content-Type-Options", "nosniff"))
        .insert_header(("Referrer-Policy", "no-referrer"))
        .insert_header(("Cache-Control", "no-store"))
        .body(markup.into_string())
}

/// The access check: a request that needs the token it lacks gets the page that asks for it
/// (401); any other refusal is the API's own.
fn refused(admin: &Admin, req: &HttpRequest) -> Option<HttpResponse> {
    match admin.access.check(req, Want::Read) {
        Ok(()) => None,
        Err(r) if r.status == StatusCode::UNAUTHORIZED => {
            Some(html(StatusCode::UNAUTHORIZED, render::login()))
        }
        Err(r) => Some(r.answer()),
    }
}

/// What the overview and the job list are drawn from: the status and every job.
async fn status_and_jobs(
    admin: &Admin,
    req: &HttpRequest,
) -> Result<
    (
        crate::admin::StatusAnswer,
        Vec<crate::scheduler::core::JobView>,
    ),
    HttpResponse,
> {
    if let Some(no) = refused(admin, req) {
        return Err(no);
    }
    let status = super::status_answer(admin).await?;
    let Ok(jobs) = admin.scheduler.send(GetJobs).await else {
        return Err(super::unavailable("scheduler"));
    };
    Ok((status, jobs.jobs))
}

async fn overview(admin: web::Data<Admin>, req: HttpRequest) -> HttpResponse {
    match status_and_jobs(&admin, &req).await {
        Ok((status, jobs)) => html(
            StatusCode::OK,
            render::overview(&status, &jobs, crate::clock::unix_now()),
        ),
        Err(no) => no,
    }
}

async fn jobs(
    admin: web::Data<Admin>,
    filter: web::Query<list::Filter>,
    req: HttpRequest,
) -> HttpResponse {
    match status_and_jobs(&admin, &req).await {
        Ok((status, jobs)) => html(
            StatusCode::OK,
            list::page(&jobs, &filter, &status.scheduler, crate::clock::unix_now()),
        ),
        Err(no) => no,
    }
}

async fn usage_page(
    admin: web::Data<Admin>,
    q: web::Query<crate::admin::usage::UsageQuery>,
    req: HttpRequest,
) -> HttpResponse {
    if let Some(no) = refused(&admin, &req) {
        return no;
    }
    match crate::admin::usage::answer(&admin, &q).await {
        Ok(a) => html(StatusCode::OK, usage::page(&q, &a)),
        Err(no) => no,
    }
}

async fn job(admin: web::Data<Admin>, id: web::Path<String>, req: HttpRequest) -> HttpResponse {
    if let Some(no) = refused(&admin, &req) {
        return no;
    }
    let now_ms = crate::clock::unix_ms_now();
    let not_found = |what: String| {
        html(
            StatusCode::NOT_FOUND,
            render::layout("Not found", maud::html! { h1 { "Not found" } p { (what) } }),
        )
    };
    let Ok(id) = id.parse::<u64>() else {
        return not_found("A job id is a number.".into());
    };
    match admin.scheduler.send(GetJob(id)).await {
        Ok(Some(mut detail)) => {
            if let Some(ledger) = &admin.ledger {
                detail.ledger = ledger.job(&detail.job.key).await.ok().flatten();
            }
            let owner = detail.job.key.owner.to_ascii_lowercase();
            let web = admin
                .web
                .iter()
                .find(|(o, _)| *o == owner)
                .or(admin.web.first())
                .map(|(_, w)| w.as_str());
            html(StatusCode::OK, render::job(&detail, web, now_ms))
        }
        Ok(None) => not_found(format!("Job {id} is not known to the scheduler.")),
        Err(_) => super::unavailable("scheduler"),
    }
}

async fn css() -> HttpResponse {
    HttpResponse::Ok()
        .content_type("text/css; charset=utf-8")
        .insert_header(("X-Content-Type-Options", "nosniff"))
        .body(CSS)
}

async fn js() -> HttpResponse {
    HttpResponse::Ok()
        .content_type("text/javascript; charset=utf-8")
        .insert_header(("X-Content-Type-Options", "nosniff"))
        .body(JS)
}
