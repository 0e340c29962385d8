//! `GET /api/v1/census`: how many entries each in-memory collection of the daemon holds, by
//! name, and the tasks alive on the instance's arbiter. What the soak samples to see that no
//! collection grows with the jobs done (docs/benchmarks.md, "Soak"); ARCHITECTURE.md, "Bounded
//! by design", names each one's bound.

use std::collections::BTreeMap;

use actix_web::{HttpRequest, HttpResponse, web};

use super::{Admin, access::Want, unavailable};
use crate::{scheduler::messages::GetCensus, webhook::IntakeCensus};

pub(super) async fn census(admin: web::Data<Admin>, req: HttpRequest) -> HttpResponse {
    if let Err(refused) = admin.access.check(&req, Want::Read) {
        return refused.answer();
    }
    let Ok(mut entries) = admin.scheduler.send(GetCensus).await else {
        return unavailable("scheduler");
    };
    match admin.webhook.send(IntakeCensus).await {
        Ok(intake) => entries.extend(intake),
        Err(_) => return unavailable("webhook intake"),
    }
    let by_name: BTreeMap<&str, usize> = entries.into_iter().collect();
    HttpResponse::Ok().json(by_name)
}
