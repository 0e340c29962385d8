//! The status page in a real headless browser (Debian's `chromium`), against a daemon whose
//! first claim is refused and against the demo: the overview shows the pools and a job on the
//! retry ladder, a job's page draws its timeline bar; screenshots of each (and of the overview
//! at a phone's width) are kept under `target/test-artefacts/status-page/`.

use std::{
    path::{Path, PathBuf},
    time::Duration,
};

use crate::support::{
    self,
    daemon::{Daemon, local_provider},
};

const LABELS: &[&str] = &["self-hosted", "linux", "x64"];

/// The browser, if one is installed.
fn chromium() -> Option<PathBuf> {
    ["chromium", "chromium-browser", "google-chrome"]
        .iter()
        .find_map(|name| {
            std::env::var_os("PATH").and_then(|paths| {
                std::env::split_paths(&paths)
                    .map(|p| p.join(name))
                    .find(|p| p.is_file())
            })
        })
}

/// The browser for the test of `what`; `None` after a loud skip (a failure in CI) when none is
/// installed.
pub(crate) fn chromium_for(what: &str) -> Option<PathBuf> {
    let browser = chromium();
    if browser.is_none() {
        support::skip(what, "no chromium on the PATH (apt-get install chromium)");
    }
    browser
}

/// Where the screenshots go.
pub(crate) fn artefacts() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("target"));
    let dir = target.join("test-artefacts/status-page");
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// With `EPHEMER_DOCS_SCREENSHOTS=1`, copies the screenshot `shot` to `docs/img/NAME`: how the
/// pictures in docs/operations.md are made again (docs/operations.md, "The status page").
pub(crate) fn publish(shot: &Path, name: &str) {
    if std::env::var_os("EPHEMER_DOCS_SCREENSHOTS").is_some() {
        let docs = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("docs/img")
            .join(name);
        std::fs::copy(shot, &docs)
            .unwrap_or_else(|e| panic!("{} -> {}: {e}", shot.display(), docs.display()));
    }
}

/// Loads `url` in the headless browser: the page's DOM once loaded (its script run), and a
/// screenshot of `width` x `height` at `shot`.
pub(crate) async fn browse(browser: &Path, url: &str, shot: &Path, size: (u32, u32)) -> String {
    browse_with(browser, url, shot, size, &[]).await
}

/// Like [`browse`], letting the page's scripts and their requests run for 8 s of the browser's
/// virtual time (it waits for requests in flight) before the DOM and the screenshot are taken.
pub(crate) async fn browse_a_while(browser: &Path, url: &str, shot: &Path) -> String {
    let budget = ["--virtual-time-budget=8000".to_string()];
    browse_with(browser, url, shot, (1280, 900), &budget).await
}

async fn browse_with(
    browser: &Path,
    url: &str,
    shot: &Path,
    (width, height): (u32, u32),
    common: &[String],
) -> String {
    let run = |extra: Vec<String>| {
        let profile = tempfile::tempdir().unwrap();
        let mut args = vec![
            "--headless".to_string(),
            "--no-sandbox".into(),
            "--disable-gpu".into(),
            "--disable-dev-shm-usage".into(),
            "--no-first-run".into(),
            "--hide-scrollbars".into(),
            format!("--user-data-dir={}", profile.path().display()),
            format!("--window-size={width},{height}"),
        ];
        args.extend(common.iter().cloned());
        args.extend(extra);
        args.push(url.to_string());
        let browser = browser.to_path_buf();
        async move {
            let out = tokio::time::timeout(
                Duration::from_secs(90),
                tokio::process::Command::new(browser).args(&args).output(),
            )
            .await
            .expect("the browser answered within 90 s")
            .expect("the browser ran");
            drop(profile);
            out
        }
    };
    let dom = run(vec!["--dump-dom".into()]).await;
    let shot_out = run(vec![format!("--screenshot={}", shot.display())]).await;
    let png = std::fs::read(shot).unwrap_or_else(|e| {
        panic!(
            "no screenshot at {} ({e}): {}",
            shot.display(),
            String::from_utf8_lossy(&shot_out.stderr)
        )
    });
    assert!(
        png.starts_with(b"\x89PNG") && png.len() > 5_000,
        "{}",
        shot.display()
    );
    String::from_utf8_lossy(&dom.stdout).into_owned()
}

#[actix_rt::test]
async fn the_status_page_shows_pools_a_retrying_job_and_its_timeline_in_a_browser() {
    let Some(browser) = chromium_for("status page in a browser") else {
        return;
    };
    let standin = support::standin(100);
    // The first claim is refused: the job goes on the retry ladder (30 s, jittered).
    standin.fail_status("generate_jitconfig", 502, 1);
    let daemon = Daemon::start(&standin, "", &local_provider(2)).await;
    standin.queue_jobs("app", LABELS, 1);
    let admin = daemon.admin_addr();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let job_id = loop {
        let page = support::http_get(&admin, "/")
            .await
            .map(|a| a.1)
            .unwrap_or_default();
        let jobs = page.split(r#"id="h-jobs""#).nth(1).unwrap_or_default();
        if let Some(row) = jobs.split(r#"<tr class="q-retrying">"#).nth(1)
            && let Some(id) = row
                .split(r#"href="/jobs/"#)
                .nth(1)
                .and_then(|r| r.split('"').next())
        {
            break id.to_string();
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no retrying job on the page:\n{page}\n{}",
            daemon.logs()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };

    let dir = artefacts();
    let overview = browse(
        &browser,
        &format!("http://{admin}/"),
        &dir.join("overview.png"),
        (1280, 1400),
    )
    .await;
    assert!(
        overview.contains("<h2 id=\"h-pools\">Pools</h2>"),
        "{overview}"
    );
    assert!(overview.contains("LocalProvisioner"), "{overview}");
    assert!(
        overview.contains(&format!(
            r#"<a href="/jobs/{job_id}">job-{job_id} <small>({job_id})</small></a>"#
        )),
        "{overview}"
    );
    assert!(
        overview.contains(r#"<tr class="q-retrying">"#),
        "{overview}"
    );
    assert!(
        overview.contains("runner registrations"),
        "the budget bars: {overview}"
    );
    // Readable on a phone: the same page at 390 px wide.
    browse(
        &browser,
        &format!("http://{admin}/"),
        &dir.join("overview-phone.png"),
        (390, 1800),
    )
    .await;

    let job = browse(
        &browser,
        &format!("http://{admin}/jobs/{job_id}"),
        &dir.join("job.png"),
        (1280, 900),
    )
    .await;
    assert!(job.contains("<svg"), "{job}");
    assert!(
        job.contains(r#"class="s-ladder""#),
        "the ladder wait: {job}"
    );
    assert!(job.contains(r#"class="m-fail""#), "the failed claim: {job}");
    assert!(job.contains("claim failed"), "the text timeline: {job}");
    // The assets are the listener's own: nothing is fetched from elsewhere.
    for page in [&overview, &job] {
        assert!(!page.contains(r#"src="http"#), "{page}");
        assert!(!page.contains(r#"rel="stylesheet" href="http"#), "{page}");
    }
    let (code, _) = daemon.stop(Duration::from_secs(30)).await;
    assert_eq!(code, Some(0));
}

/// The same pages against the demo itself (`ephemer-actors demo`, which prints the page's
/// address): the overview shows its pool, and the page of a job whose claim the demo's
/// 502 burst refused draws the refusal and the ladder wait on its bar.
#[actix_rt::test]
async fn the_demo_s_status_page_in_a_browser() {
    use tokio::io::AsyncBufReadExt;
    let Some(browser) = chromium_for("the demo's status page in a browser") else {
        return;
    };
    let mut cmd = support::daemon();
    cmd.args(["demo", "--jobs", "120", "--seed", "7"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true);
    let mut demo = cmd.spawn().expect("the demo starts");
    let mut lines = tokio::io::BufReader::new(demo.stdout.take().unwrap()).lines();
    let admin = loop {
        let line = tokio::time::timeout(Duration::from_secs(60), lines.next_line())
            .await
            .expect("the demo prints its status page's address")
            .unwrap()
            .expect("the demo printed its status page's address");
        if let Some(url) = line.trim().strip_prefix("status page") {
            break url
                .trim()
                .trim_start_matches("http://")
                .trim_end_matches('/')
                .to_string();
        }
    };
    // The rest of its output is read (and dropped), so the demo never blocks on it.
    actix_rt::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });

    let deadline = tokio::time::Instant::now() + Duration::from_secs(90);
    let job_id = loop {
        let jobs = support::http_get(&admin, "/api/v1/jobs").await;
        let retrying = jobs
            .and_then(|(_, body)| serde_json::from_str::<serde_json::Value>(&body).ok())
            .and_then(|v| {
                v["jobs"].as_array()?.iter().find_map(|j| {
                    (j["phase"]["state"] == "retrying").then(|| j["key"]["job_id"].as_u64())?
                })
            });
        if let Some(id) = retrying {
            break id;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no job of the demo went on the ladder"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let dir = artefacts();
    let job = browse(
        &browser,
        &format!("http://{admin}/jobs/{job_id}"),
        &dir.join("demo-job.png"),
        (1280, 900),
    )
    .await;
    assert!(job.contains("<svg"), "{job}");
    assert!(
        job.contains(r#"class="m-fail""#),
        "the refused claim: {job}"
    );
    assert!(job.contains("claim failed"), "{job}");
    let overview = browse(
        &browser,
        &format!("http://{admin}/"),
        &dir.join("demo-overview.png"),
        (1280, 1400),
    )
    .await;
    assert!(overview.contains("LocalProvisioner"), "{overview}");
    assert!(overview.contains(r#"id="h-queue""#), "{overview}");
    assert!(overview.contains(r#"<figure class="hour">"#), "{overview}");
    publish(&dir.join("demo-overview.png"), "status-overview.png");
    publish(&dir.join("demo-job.png"), "status-job.png");
    let list = browse(
        &browser,
        &format!("http://{admin}/jobs?state=done"),
        &dir.join("demo-jobs.png"),
        (1280, 900),
    )
    .await;
    assert!(list.contains(r#"<table id="job-list">"#), "{list}");
    publish(&dir.join("demo-jobs.png"), "status-jobs.png");
    let status = tokio::time::timeout(Duration::from_secs(180), demo.wait())
        .await
        .expect("the demo ends")
        .unwrap();
    assert!(status.success(), "the demo ran every job");
}

/// A daemon with one local pool whose admin listener is not loopback, and its port.
async fn off_loopback(standin: &github_standin::Standin) -> (Daemon, u16) {
    let port = support::daemon::free_port();
    let admin = format!("[admin]\nlisten = \"0.0.0.0:{port}\"\n");
    (
        Daemon::start(standin, &admin, &local_provider(2)).await,
        port,
    )
}

/// `GET path` with the admin token: (status, body).
async fn get_with_token(addr: &str, path: &str, token: &str) -> (u16, String) {
    let mut answer = awc::Client::default()
        .get(format!("http://{addr}{path}"))
        .insert_header(("Authorization", format!("Bearer {token}")))
        .send()
        .await
        .expect("the admin listener answers");
    let body = answer.body().await.unwrap();
    (
        answer.status().as_u16(),
        String::from_utf8_lossy(&body).into_owned(),
    )
}

/// On a listener that is not loopback every read needs the admin token: without it the pages
/// answer 401 with the form that asks for it and nothing of the daemon's state; with it, the
/// page. The stylesheet and script carry no state and load without it (the form needs them).
#[actix_rt::test]
async fn off_loopback_the_page_asks_for_the_token_and_shows_nothing_without_it() {
    let standin = support::standin(100);
    let (daemon, port) = off_loopback(&standin).await;
    standin.queue_jobs("app", LABELS, 1);
    daemon
        .wait_completed(&standin, 1, Duration::from_secs(30))
        .await;
    let addr = format!("127.0.0.1:{port}");
    for path in ["/", "/jobs/1001"] {
        let (code, page) = support::http_get(&addr, path).await.unwrap();
        assert_eq!(code, 401, "{path}: {page}");
        assert!(
            page.contains(r#"<form id="login" method="post" aria-label="Admin token">"#),
            "{path}: the form is shown: {page}"
        );
        assert!(!page.contains("LocalProvisioner"), "{path}: {page}");
        assert!(!page.contains("acme/app"), "{path}: {page}");
    }
    for asset in ["/assets/page.css", "/assets/page.js"] {
        assert_eq!(support::http_get(&addr, asset).await.unwrap().0, 200);
    }
    let token = std::fs::read_to_string(daemon.state_dir().join("admin.token")).unwrap();
    let (code, page) = get_with_token(&addr, "/", token.trim()).await;
    assert_eq!(code, 200, "{page}");
    assert!(page.contains("LocalProvisioner"), "{page}");
    let (code, page) = get_with_token(&addr, "/jobs/1001", token.trim()).await;
    assert_eq!(code, 200, "{page}");
    assert!(page.contains("acme/app"), "{page}");
    let (code, _) = get_with_token(&addr, "/", "not-the-token").await;
    assert_eq!(code, 401);
    assert_eq!(daemon.stop(Duration::from_secs(30)).await.0, Some(0));
}

/// What the browser test adds to every page it is shown, as a user's hands: once the page has
/// loaded, type `token` into the form and send it; once the daemon's page is shown in place,
/// follow its first job link; then write down, on `<body>`, where it got and what the browser
/// kept (the token must be in neither storage nor the field).
fn hands(token: &str) -> String {
    let token = serde_json::to_string(token).unwrap();
    format!(
        r#"<script>
addEventListener('load', () => {{
  const mark = (k, v) => document.body.setAttribute('data-hands-' + k, String(v));
  const form = document.getElementById('login');
  form.elements.token.value = {token};
  form.requestSubmit();
  let clicked = false;
  const look = setInterval(() => {{
    mark('field', form.elements.token.value === '' ? 'empty' : 'kept');
    mark('stored', localStorage.length + sessionStorage.length);
    mark('form', form.hidden ? 'hidden' : 'shown');
    mark('path', location.pathname);
    if (!clicked && document.getElementById('h-pools')) {{
      const a = document.querySelector('#main a[href^="/jobs/"]');
      if (a) {{ clicked = true; mark('clicked', a.pathname); a.click(); }}
    }}
    if (document.querySelector('#main figure.bar svg')) {{ mark('step', 'job'); clearInterval(look); }}
  }}, 50);
}});
</script>"#
    )
}

/// A same-origin stand-in for the browser's way to the admin listener that adds [`hands`] to
/// each HTML page: the page's own script, not a copy, then runs as it would for a user.
async fn with_hands(admin: String, token: String) -> (String, actix_web::dev::ServerHandle) {
    use actix_web::{App, HttpRequest, HttpResponse, HttpServer, web};
    let forward = move |req: HttpRequest| {
        let (admin, token) = (admin.clone(), token.clone());
        async move {
            let mut ask = awc::Client::default().get(format!("http://{admin}{}", req.uri()));
            if let Some(auth) = req.headers().get("authorization") {
                ask = ask.insert_header(("Authorization", auth.clone()));
            }
            let mut answer = ask.send().await.expect("the admin listener answers");
            let body = answer.body().limit(8 << 20).await.unwrap();
            let kind = answer
                .headers()
                .get("content-type")
                .and_then(|v| v.to_str().ok())
                .unwrap_or("")
                .to_string();
            let mut body = String::from_utf8_lossy(&body).into_owned();
            // Only what the browser navigates to gets the hands, not what the script fetches.
            if kind.starts_with("text/html") && req.headers().get("authorization").is_none() {
                body = body.replace("</body>", &format!("{}</body>", hands(&token)));
            }
            HttpResponse::build(answer.status())
                .content_type(kind)
                .body(body)
        }
    };
    let server = HttpServer::new(move || App::new().default_service(web::to(forward.clone())))
        .workers(1)
        .bind("127.0.0.1:0")
        .unwrap();
    let addr = server.addrs()[0].to_string();
    let server = server.run();
    let handle = server.handle();
    actix_rt::spawn(server);
    (addr, handle)
}

/// Opens the overview on `admin` in the browser with [`hands`] typing `token`: the DOM at the
/// end, and the `<body>` tag with the marks the hands left.
async fn type_token(browser: &Path, admin: &str, token: &str, shot: &Path) -> (String, String) {
    let (addr, proxy) = with_hands(admin.to_string(), token.to_string()).await;
    let dom = browse_a_while(browser, &format!("http://{addr}/"), shot).await;
    proxy.stop(false).await;
    let body = dom.split("<body").nth(1).unwrap_or_default();
    let tag = body.split('>').next().unwrap_or_default().to_string();
    (dom, tag)
}

/// The token form as a user meets it, in the browser: on a listener off loopback the overview
/// asks for the token; typed in, the page shows in place, a job link inside it is followed with
/// the token (the job's timeline bar), and the browser keeps the token nowhere. A wrong token
/// shows nothing and the form again.
#[actix_rt::test]
async fn the_token_typed_into_the_form_shows_the_pages_and_is_kept_nowhere() {
    let Some(browser) = chromium_for("the token form in a browser") else {
        return;
    };
    let standin = support::standin(100);
    let (daemon, port) = off_loopback(&standin).await;
    // The first claim is refused, so the overview lists the job (on the ladder) with its link.
    standin.fail_status("generate_jitconfig", 502, 1);
    let job = standin.queue_jobs("app", LABELS, 1)[0];
    let admin = format!("127.0.0.1:{port}");
    let token = std::fs::read_to_string(daemon.state_dir().join("admin.token")).unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while !get_with_token(&admin, "/", token.trim())
        .await
        .1
        .contains(r#"<tr class="q-retrying">"#)
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "no retrying job:\n{}",
            daemon.logs()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let dir = artefacts();

    let (dom, body) =
        type_token(&browser, &admin, token.trim(), &dir.join("token-typed.png")).await;
    assert!(
        body.contains(r#"data-hands-step="job""#),
        "the job page was reached: {dom}"
    );
    assert!(
        body.contains(&format!(r#"data-hands-clicked="/jobs/{job}""#)),
        "{dom}"
    );
    assert!(
        body.contains(&format!(r#"data-hands-path="/jobs/{job}""#)),
        "{dom}"
    );
    assert!(body.contains(r#"data-hands-form="hidden""#), "{dom}");
    assert!(body.contains(r#"data-hands-field="empty""#), "{dom}");
    assert!(body.contains(r#"data-hands-stored="0""#), "{dom}");
    assert!(dom.contains("acme/app"), "the job's page: {dom}");

    let (dom, body) = type_token(
        &browser,
        &admin,
        "not-the-token",
        &dir.join("token-wrong.png"),
    )
    .await;
    assert!(
        body.contains(r#"data-hands-form="shown""#),
        "the form again: {dom}"
    );
    assert!(!body.contains("data-hands-clicked"), "{dom}");
    assert!(dom.contains("the token was refused"), "said so: {dom}");
    assert!(
        !dom.contains("LocalProvisioner"),
        "nothing of the daemon: {dom}"
    );
    assert!(!dom.contains("acme/app"), "nothing of the daemon: {dom}");
    assert_eq!(daemon.stop(Duration::from_secs(30)).await.0, Some(0));
}
