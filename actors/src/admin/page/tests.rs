//! The page escapes what it did not write: a repo, a label, a pool's down cause and a job's
//! timeline carrying `<script>` come out as text; and a retrying job shows in the overview.

use super::render;
use crate::{
    admin::api::{JobAnswer, StatusAnswer},
    scheduler::core::{DeliveryId, JobView, Note, TimelineEntry},
};

const HOSTILE: &str = "<script>alert(1)</script>";

fn status() -> StatusAnswer {
    serde_json::from_value(serde_json::json!({
        "version": "0.1.0",
        "uptime_seconds": 75,
        "draining": false,
        "capacity": { "max_concurrent": 4, "used": 1 },
        "providers": [{
            "provider": "local",
            "kind": "local",
            "provisioner": "LocalProvisioner",
            "up": false,
            "down_cause": HOSTILE,
            "used": 1,
            "max": 4,
            "labels": ["self-hosted", HOSTILE],
        }],
        "pending": 0,
        "runners": 1,
        "retry_queue_depth": 1,
        "stats": crate::scheduler::core::Stats::default(),
        "targets": [{
            "name": "acme", "owner": "acme", "weight": 1, "held": 1, "pending": 0,
            "rate": { "actions_runner_registration": { "remaining": 0, "limit": 10000, "reset": 1_000_060, "updated": 1_000_000 } }
        }],
        "retry_timer": null,
        "rates": {},
    }))
    .expect("a status answer")
}

fn job(phase: serde_json::Value) -> JobView {
    serde_json::from_value(serde_json::json!({
        "key": { "owner": "acme", "job_id": 42 },
        "repo": HOSTILE,
        "labels": ["self-hosted", HOSTILE],
        "phase": phase,
        "pending": true,
        "seen": true,
        "started": false,
        "admissions": 1,
        "idle_reaps": 0,
        "retry_attempts": 2,
        "error_class": "server_side",
        "next_attempt_unix": 1_000_030,
        "runner_name": null,
        "run_id": 7,
        "arrived_unix": 999_900,
        "timeline": [],
    }))
    .map(|mut view: JobView| {
        view.timeline = timeline();
        view
    })
    .expect("a job view")
}

/// Queued by a delivery whose id is hostile, a claim refused, on the ladder.
fn timeline() -> Vec<TimelineEntry> {
    let at = |at: u64, note: Note| TimelineEntry {
        at_ms: at * 1000,
        note,
    };
    vec![
        at(
            999_900,
            Note::Queued {
                delivery: Some(DeliveryId::new(HOSTILE)),
            },
        ),
        at(999_900, Note::Admitted),
        at(
            999_910,
            Note::Claiming {
                provider: crate::config::PoolName::from("local"),
            },
        ),
        at(
            999_911,
            Note::ClaimFailed {
                class: crate::github::ErrorClass::ServerSide,
                error: HOSTILE.into(),
            },
        ),
        at(
            999_911,
            Note::RetryScheduled {
                attempt: 2,
                due_unix: 1_000_030,
                delay: std::time::Duration::from_secs(119),
                reason: crate::retry::DelayReason::Ladder { rung: 1 },
                class: crate::github::ErrorClass::ServerSide,
            },
        ),
    ]
}

/// No `<script>` but the page's own (its one `<script src=...>` tag) survives rendering.
fn only_own_script(page: &str) {
    assert_eq!(page.matches("<script").count(), 1, "{page}");
    assert!(
        page.contains(r#"<script src="/assets/page.js" defer></script>"#),
        "{page}"
    );
    assert!(
        page.contains("&lt;script&gt;alert(1)&lt;/script&gt;"),
        "{page}"
    );
}

#[test]
fn the_overview_escapes_every_value_and_shows_a_retrying_job() {
    let jobs = [job(serde_json::json!({ "state": "retrying" }))];
    let page = render::overview(&status(), &jobs, 1_000_000).into_string();
    only_own_script(&page);
    assert!(page.contains(r#"<tr class="q-retrying">"#), "{page}");
    assert!(page.contains(r#"href="/jobs/42""#));
    assert!(page.contains("retry in 30s"), "{page}");
    assert!(page.contains("0 of 10000 left, resets in 1m 0s"), "{page}");
    assert!(page.contains("down"));
}

#[test]
fn a_job_page_escapes_every_value_and_draws_its_bar() {
    let mut detail: JobAnswer = serde_json::from_value(serde_json::json!({
        "job": job(serde_json::json!({ "state": "retrying" })),
        "retry": null,
        "runners": [],
    }))
    .unwrap();
    // In the daemon the page reads the notes themselves, not their sentences.
    detail.job.timeline = timeline();
    let page = render::job(&detail, Some("https://github.com"), 1_000_000_000).into_string();
    only_own_script(&page);
    assert!(page.contains("<svg"), "{page}");
    assert!(page.contains(r#"class="s-wait""#), "{page}");
    assert!(page.contains(r#"class="s-ladder""#), "{page}");
    assert!(page.contains(r#"class="m-fail""#), "{page}");
    // The link to GitHub is built from escaped parts too.
    assert!(
        page.contains(
            "https://github.com/acme/&lt;script&gt;alert(1)&lt;/script&gt;/actions/runs/7/job/42"
        ),
        "{page}"
    );
}

#[test]
fn a_span_under_ten_seconds_is_said_in_tenths() {
    assert_eq!(render::span_age(270), "0.2s");
    assert_eq!(render::span_age(9_950), "9.9s");
    assert_eq!(render::span_age(10_000), "10s");
    assert_eq!(render::span_age(125_000), "2m 5s");
}

/// The page's text, tags stripped and entities read back.
fn text_of(page: &str) -> String {
    let mut text = String::new();
    let mut in_tag = false;
    for c in page.chars() {
        match c {
            '<' => in_tag = true,
            '>' => {
                in_tag = false;
                text.push(' ');
            }
            c if !in_tag => text.push(c),
            _ => {}
        }
    }
    text.replace("&quot;", "\"")
        .replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&amp;", "&")
}

/// Every kind of note, with every end reason and class, on a job page: words only, and each
/// phase's page too.
#[test]
fn a_job_page_says_every_note_kind_in_words() {
    use crate::scheduler::core::timeline_words::{every_kind, kind_of, reads_as_code};
    for phase in [
        serde_json::json!({ "state": "retrying" }),
        serde_json::json!({ "state": "parked", "reason": "gave_up", "look_unix": 1_000_100 }),
        serde_json::json!({ "state": "active", "provider": "local", "runner": "r1" }),
        serde_json::json!({ "state": "done" }),
        serde_json::json!({ "state": "unroutable" }),
    ] {
        let mut detail: JobAnswer = serde_json::from_value(serde_json::json!({
            "job": job(phase),
            "retry": null,
            "runners": [],
        }))
        .unwrap();
        detail.job.repo = "app".into();
        detail.job.labels = vec!["linux".into()];
        for note in every_kind() {
            detail.job.timeline = vec![TimelineEntry {
                at_ms: 999_900_000,
                note: note.clone(),
            }];
            let page = render::job(&detail, None, 1_000_000_000).into_string();
            let text = text_of(&page);
            assert_eq!(
                reads_as_code(&text),
                None,
                "{} reads as code on the page:\n{text}",
                kind_of(&note)
            );
        }
    }
}

/// A job's name, workflow, branch and trigger come from whoever pushed the workflow: shown,
/// as text, on its page, in the overview and in the list.
#[test]
fn a_job_s_name_workflow_and_branch_are_shown_escaped() {
    let mut view = job(serde_json::json!({ "state": "pending" }));
    view.about = Some(std::sync::Arc::new(crate::job::JobAbout {
        name: format!("build {HOSTILE}"),
        workflow: format!("ci {HOSTILE}"),
        branch: format!("main{HOSTILE}"),
        sender: format!("octo{HOSTILE}"),
    }));
    let detail: JobAnswer = serde_json::from_value(serde_json::json!({
        "job": view.clone(),
        "retry": null,
        "runners": [],
    }))
    .unwrap();
    let page = render::job(&detail, None, 1_000_000_000).into_string();
    only_own_script(&page);
    for shown in ["build ", "ci ", "Triggered by", "attempt 1"] {
        assert!(page.contains(shown), "{shown}: {page}");
    }
    let overview =
        render::overview(&status(), std::slice::from_ref(&view), 1_000_000).into_string();
    only_own_script(&overview);
    assert!(overview.contains("build &lt;script&gt;"), "{overview}");
}

/// With scripts off the browser submits the token form itself: as a POST, the token never
/// lands in the URL, the history or a server's log (issue 65, item 9).
#[test]
fn the_token_form_posts() {
    let page = render::login().into_string();
    assert!(page.contains(r#"<form id="login" method="post""#), "{page}");
}

/// Each pool's runner version and how long it has been behind: past three weeks it is marked
/// with what GitHub will do at 30 days; a pool with no install yet says so.
#[test]
fn the_overview_shows_each_pool_s_runner_version_and_age() {
    let mut s = status();
    s.runner = Some(
        serde_json::from_value(serde_json::json!({
            "latest": "2.331.0",
            "latest_published_unix": 3_000_000 - 25 * 86_400,
            "checked_unix": 2_999_000,
            "problem": HOSTILE,
            "auto_update": false,
            "pools": [
                { "pool": "fresh", "version": "2.331.0", "managed": true, "behind_seconds": 0 },
                { "pool": "late", "version": "2.330.0", "managed": false, "behind_seconds": 25 * 86_400 },
                { "pool": "lagging", "version": "2.330.0", "managed": false, "behind_seconds": 3 * 86_400 },
                { "pool": HOSTILE, "version": null, "managed": true, "behind_seconds": null },
            ],
        }))
        .expect("a runner view"),
    );
    let page = render::overview(&s, &[], 3_000_000).into_string();
    only_own_script(&page);
    let text = text_of(&page);
    let squeezed = text.split_whitespace().collect::<Vec<_>>().join(" ");
    for want in [
        "Latest release 2.331.0 , published 25d 0h ago; auto_update off.",
        "fresh 2.331.0 current the daemon",
        "late 2.330.0 behind by 25d 0h GitHub refuses it 30 days after the newer release: update it now the operator",
        "lagging 2.330.0 behind by 3d 0h the operator",
        "none yet latest unknown the daemon",
    ] {
        assert!(squeezed.contains(want), "{want:?} not in {squeezed}");
    }
    assert_eq!(page.matches("update it now").count(), 1, "{page}");

    // No release view (the releases are not looked at): no section.
    let page = render::overview(&status(), &[], 1_000_000).into_string();
    assert!(!page.contains("h-runner"), "{page}");
}
