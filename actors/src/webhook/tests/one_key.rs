//! One HMAC per unverified body, however many targets (issue 52, item 7). Before, a body
//! naming an owner no target has was hashed with every target's secret: 128 targets and 1 MB
//! bodies cost the daemon 600 ms of CPU per 8 bodies.

use super::*;
use crate::webhook::{HookIds, TargetKey};

/// 128 targets, each with a hook the redelivery pass found and one an App's: a flood of
/// bodies naming no target's owner costs no hash; a body of a known hook, App or owner costs
/// exactly one, and is accepted only with that target's secret.
#[actix_web::test]
async fn many_targets_cost_one_hash_per_body_at_most() {
    let (addr, seen) = recorder(256);
    let actor = WebhookActor::new(addr.clone().recipient(), None, Metrics::new()).start();
    let keys: Vec<TargetKey> = (0..128u64)
        .map(|i| {
            let mut key = TargetKey::new(Some(format!("org{i}")), Secret::new(format!("s{i}")));
            key.hooks = HookIds::with([1000 + i]);
            key.app_id = (i == 7).then_some(4242);
            key
        })
        .collect();
    let intake = web::Data::new(
        WebhookIntake::for_target_keys(keys, actor.clone(), Metrics::new()).unwrap(),
    );
    let app = web_test::init_service(
        App::new().service(WebhookIntake::resource(intake.clone(), "/webhook/github")),
    )
    .await;
    let naming = |owner: &str, id: u64| queued_body(id, "queued").replace("acme", owner);
    let post = |secret: &str, body: &str, id: &str, headers: &[(&'static str, String)]| {
        let sig = sign(secret.as_bytes(), body.as_bytes());
        let mut r = delivery("workflow_job", id, body, Some(sig));
        for (name, value) in headers {
            r = r.insert_header((*name, value.clone()));
        }
        r.to_request()
    };

    // The flood: unknown owners, unknown hooks, an App no target has.
    for n in 0..40u64 {
        let body = naming("stranger", n);
        let headers = [
            ("X-GitHub-Hook-ID", (50_000 + n).to_string()),
            (
                "X-GitHub-Hook-Installation-Target-Type",
                "integration".to_string(),
            ),
            ("X-GitHub-Hook-Installation-Target-ID", "9".to_string()),
        ];
        let r = web_test::call_service(&app, post("s0", &body, &format!("x{n}"), &headers)).await;
        assert_eq!(r.status(), 401);
    }
    assert_eq!(
        intake.hmacs(),
        0,
        "no target claims them: nothing is hashed"
    );

    // A known hook picks its target (whatever owner the body names), the App's id its
    // target, else the owner named: one hash each.
    let hook = [("X-GitHub-Hook-ID", "1005".to_string())];
    let r = web_test::call_service(&app, post("s5", &naming("org5", 1), "h1", &hook)).await;
    assert_eq!(r.status(), 202);
    let r = web_test::call_service(&app, post("s5", &naming("org6", 2), "h2", &hook)).await;
    assert_eq!(r.status(), 401, "target 5's hook cannot speak for org6");
    let app_hook = [
        (
            "X-GitHub-Hook-Installation-Target-Type",
            "integration".to_string(),
        ),
        ("X-GitHub-Hook-Installation-Target-ID", "4242".to_string()),
    ];
    let r = web_test::call_service(&app, post("s7", &naming("org7", 3), "a1", &app_hook)).await;
    assert_eq!(r.status(), 202);
    let r = web_test::call_service(&app, post("s9", &naming("org9", 4), "o1", &[])).await;
    assert_eq!(r.status(), 202);
    let r = web_test::call_service(&app, post("s8", &naming("org9", 5), "o2", &[])).await;
    assert_eq!(r.status(), 401, "another target's secret");
    assert_eq!(intake.hmacs(), 5, "one per claimed body");
    assert_eq!(job_ids(&seen), vec![1, 3, 4]);
}
