//! What an operator reads on the status page, tried as an attacker and as a user would: a job
//! whose name, workflow, branch and trigger carry markup shows them as text in a real browser
//! and runs none of it; the job list filters and searches; and a change reaches an open page's
//! event stream, and the page a browser keeps open, within a second of the decision, with no
//! reload.

use std::time::Duration;

use ephemer_actors_core::job::JobAbout;
use futures_util::StreamExt as _;

use crate::{
    status_page::{artefacts, browse, chromium_for},
    support::{
        self,
        daemon::{Daemon, local_provider},
    },
};

const LABELS: &[&str] = &["self-hosted", "linux"];

/// Markup that, if run, renames the page: the dumped DOM would say so.
const RUNS: &str =
    "<img src=x onerror=\"document.title='pwned'\"><script>document.title='pwned'</script>";

#[actix_rt::test]
async fn a_job_s_names_show_as_text_and_the_job_list_filters_and_searches() {
    let Some(browser) = chromium_for("job names and the job list in a browser") else {
        return;
    };
    let standin = support::standin(100);
    standin.add_repos(&["web"]);
    let daemon = Daemon::start_with_github(
        &standin,
        "repos = [\"app\", \"web\"]",
        "",
        &local_provider(2),
    )
    .await;
    let hostile = standin.queue_job_about(
        "app",
        LABELS,
        JobAbout {
            name: format!("build {RUNS}"),
            workflow: format!("ci {RUNS}"),
            branch: format!("feature/{RUNS}"),
            sender: format!("mallory{RUNS}"),
        },
    );
    let plain = standin.queue_jobs("web", LABELS, 1)[0];
    daemon
        .wait_completed(&standin, 2, Duration::from_secs(30))
        .await;
    let admin = daemon.admin_addr();
    let dir = artefacts();

    let job = browse(
        &browser,
        &format!("http://{admin}/jobs/{hostile}"),
        &dir.join("job-named.png"),
        (1280, 900),
    )
    .await;
    assert!(
        !job.contains("<title>pwned"),
        "the name's markup ran: {job}"
    );
    assert!(
        !job.contains("<img src=\"x\""),
        "the name became markup: {job}"
    );
    for shown in [
        "build &lt;img src=x",
        "ci &lt;img",
        "feature/&lt;img",
        "mallory&lt;img",
        "Triggered by",
        "attempt 1",
    ] {
        assert!(job.contains(shown), "{shown} is not on the page: {job}");
    }

    let all = browse(
        &browser,
        &format!("http://{admin}/jobs"),
        &dir.join("jobs.png"),
        (1280, 900),
    )
    .await;
    assert!(!all.contains("<title>pwned"), "{all}");
    assert!(!all.contains("<img src=\"x\""), "{all}");
    for id in [hostile, plain] {
        assert!(all.contains(&format!("href=\"/jobs/{id}\"")), "{id}: {all}");
    }
    let (_, web_only) = support::http_get(&admin, "/jobs?repo=web").await.unwrap();
    assert!(
        web_only.contains(&format!("href=\"/jobs/{plain}\"")),
        "{web_only}"
    );
    assert!(
        !web_only.contains(&format!("href=\"/jobs/{hostile}\"")),
        "{web_only}"
    );
    let (_, found) = support::http_get(&admin, &format!("/jobs?q={hostile}"))
        .await
        .unwrap();
    assert!(
        found.contains(&format!("href=\"/jobs/{hostile}\"")),
        "{found}"
    );
    assert!(
        !found.contains(&format!("href=\"/jobs/{plain}\"")),
        "{found}"
    );
    let (_, none) = support::http_get(&admin, "/jobs?pool=local&state=pending")
        .await
        .unwrap();
    assert!(none.contains("0 of 2 jobs"), "both are done: {none}");
    let (_, done) = support::http_get(&admin, "/jobs?pool=local&state=done")
        .await
        .unwrap();
    assert!(done.contains("2 of 2 jobs"), "{done}");

    // The pool's hour: both jobs in its buckets, on the page and in `status --json` alike.
    let overview = browse(
        &browser,
        &format!("http://{admin}/"),
        &dir.join("overview-hour.png"),
        (1280, 1600),
    )
    .await;
    assert!(overview.contains("<figure class=\"hour\">"), "{overview}");
    assert!(
        overview.contains("2 jobs started, 2 claims, 0 failed"),
        "{overview}"
    );
    let (_, status) = support::http_get(&admin, "/api/v1/status").await.unwrap();
    let status: serde_json::Value = serde_json::from_str(&status).unwrap();
    let hour = &status["last_hour"][0];
    assert_eq!(hour["pool"], "local", "{status}");
    let buckets = hour["buckets"].as_array().unwrap();
    assert_eq!(buckets.len(), 12);
    let started: u64 = buckets.iter().map(|b| b["started"].as_u64().unwrap()).sum();
    assert_eq!(started, 2, "{hour}");
    let with_jobs = buckets.iter().filter(|b| b["started"].as_u64() > Some(0));
    assert!(
        with_jobs.clone().all(|b| b["pickup_p50_ms"].is_u64()),
        "{hour}"
    );
    let (code, cli, _) = daemon.ctl(&["status", "--json"]).await;
    assert_eq!(code, 0);
    assert!(cli.contains("\"last_hour\""), "{cli}");
    assert_eq!(daemon.stop(Duration::from_secs(30)).await.0, Some(0));
}

/// The next `change` event on `events`, and when it came.
async fn next_change(
    events: &mut awc::ClientResponse<
        impl futures_util::Stream<Item = Result<actix_web::web::Bytes, awc::error::PayloadError>>
        + Unpin,
    >,
    within: Duration,
) -> Option<std::time::SystemTime> {
    let deadline = tokio::time::Instant::now() + within;
    while let Ok(Some(Ok(chunk))) = tokio::time::timeout_at(deadline, events.next()).await {
        if String::from_utf8_lossy(&chunk).contains("event: change") {
            return Some(std::time::SystemTime::now());
        }
    }
    None
}

/// How long after `job`'s first note (by the daemon's clock) `at` was.
async fn since_first_note(admin: &str, job: u64, at: std::time::SystemTime) -> Duration {
    let (_, body) = support::http_get(admin, &format!("/api/v1/jobs/{job}"))
        .await
        .unwrap();
    let answer: serde_json::Value = serde_json::from_str(&body).unwrap();
    let first_ms = answer["job"]["timeline"][0]["at_ms"].as_u64().unwrap();
    let first = std::time::UNIX_EPOCH + Duration::from_millis(first_ms);
    at.duration_since(first).unwrap_or_default()
}

/// An open page's event stream says `change` within a second of a decision about a job (the
/// job's first note, by the daemon's clock), each time.
#[actix_rt::test]
async fn a_change_reaches_an_open_page_s_stream_within_a_second() {
    let standin = support::standin(100);
    let daemon = Daemon::start(&standin, "", &local_provider(2)).await;
    let admin = daemon.admin_addr();
    let mut events = awc::Client::builder()
        .timeout(Duration::from_secs(60))
        .finish()
        .get(format!("http://{admin}/events"))
        .send()
        .await
        .expect("the event stream opens");
    assert_eq!(events.status().as_u16(), 200);
    assert_eq!(
        events.headers().get("content-type").unwrap(),
        "text/event-stream"
    );
    // The stream's first event says where the page stands.
    next_change(&mut events, Duration::from_secs(5))
        .await
        .expect("the first event");
    for round in 0..3 {
        let job = standin.queue_jobs("app", LABELS, 1)[0];
        let came = next_change(&mut events, Duration::from_secs(10))
            .await
            .unwrap_or_else(|| panic!("round {round}: no change event for job {job}"));
        let lag = since_first_note(&admin, job, came).await;
        assert!(
            lag <= Duration::from_secs(1),
            "round {round}: the change came {lag:?} after the job's first note"
        );
        daemon
            .wait_completed(&standin, round + 1, Duration::from_secs(30))
            .await;
        // Let the stream say everything about this job before the next.
        while next_change(&mut events, Duration::from_millis(600))
            .await
            .is_some()
        {}
    }
    drop(events);
    assert_eq!(daemon.stop(Duration::from_secs(30)).await.0, Some(0));
}

/// A page left open in a browser (driven over the DevTools protocol) shows each new job within
/// a second of the job's first note (by the daemon's clock), and never reloads to do it: a mark
/// set in the page's own state stays.
#[actix_rt::test]
async fn a_page_left_open_shows_each_new_job_within_a_second_without_a_reload() {
    let Some(browser) = chromium_for("live updates of an open page") else {
        return;
    };
    let standin = support::standin(100);
    let daemon = Daemon::start(&standin, "", &local_provider(2)).await;
    let admin = daemon.admin_addr();
    let mut page = support::cdp::Browser::start(&browser).await;
    // The job list, which keeps finished jobs (the overview shows the open ones).
    page.navigate(&format!("http://{admin}/jobs")).await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while page
        .eval("document.getElementById('live').textContent")
        .await
        != "live"
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the page never went live"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    page.eval("window.kept = 'this page'").await;
    for round in 0..3 {
        let job = standin.queue_jobs("app", LABELS, 1)[0];
        let shown = format!("document.getElementById('main').innerHTML.includes('/jobs/{job}\"')");
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        let seen = loop {
            if page.eval(&shown).await == true {
                break std::time::SystemTime::now();
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "round {round}: job {job} never shown"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        let lag = since_first_note(&admin, job, seen).await;
        eprintln!("round {round}: job {job} shown {lag:?} after its first note");
        assert!(
            lag <= Duration::from_secs(1),
            "round {round}: job {job} shown {lag:?} after its first note"
        );
        assert_eq!(
            page.eval("window.kept").await,
            "this page",
            "round {round}: the page reloaded"
        );
        daemon
            .wait_completed(&standin, round + 1, Duration::from_secs(30))
            .await;
    }
    drop(page);
    assert_eq!(daemon.stop(Duration::from_secs(30)).await.0, Some(0));
}
