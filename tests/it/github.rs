//! The GitHub client, its auth and rate tracking, against the stand-in GitHub over real HTTP.

use std::time::Duration;

use actix::Actor;
use base64::Engine as _;
use ephemer_actors_core::{
    config::{AppAuth, GithubAuth, GithubConfig, Secret},
    github::{ErrorClass, GithubClient, GithubError},
    metrics::Metrics,
    rate::{GetRateSnapshot, RateActor},
    vocab::RateBucket,
};
use github_standin::{Fault, Standin, StandinConfig};

struct Setup {
    standin: Standin,
    client: GithubClient,
    rate: actix::Addr<RateActor>,
    metrics: Metrics,
}

fn config(standin: &Standin, auth: GithubAuth, repos: &[&str]) -> GithubConfig {
    GithubConfig {
        api_url: standin.url(),
        owner: "acme".into(),
        repos: repos.iter().map(|r| r.to_string()).collect(),
        auth,
        runner_group_id: 1,
        runner_group: None,
        enterprise: None,
        max_claims_per_minute: 150,
        ca_file: None,
        proxy: None,
    }
}

fn setup_with(standin_config: StandinConfig, auth: Option<GithubAuth>) -> Setup {
    let standin = Standin::start(standin_config).unwrap();
    let metrics = Metrics::new();
    let rate = RateActor::new(Default::default(), metrics.clone()).start();
    let auth = auth.unwrap_or_else(|| GithubAuth::Token(Secret::new("ghp_standin_token")));
    let client = GithubClient::new(
        &config(&standin, auth, &["app"]),
        metrics.clone(),
        Some(rate.clone().recipient()),
    );
    Setup {
        standin,
        client,
        rate,
        metrics,
    }
}

fn setup() -> Setup {
    setup_with(StandinConfig::default(), None)
}

fn labels() -> Vec<String> {
    vec!["self-hosted".into(), "linux".into()]
}

fn app_auth() -> (GithubAuth, String) {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    let private = std::fs::read_to_string(root.join("app-key.pem")).unwrap();
    let public = std::fs::read_to_string(root.join("app-key.pub.pem")).unwrap();
    let auth = GithubAuth::App(AppAuth {
        app_id: 4242,
        installation_id: 77,
        private_key: Secret::new(private),
    });
    (auth, public)
}

#[actix_rt::test]
async fn a_claim_is_one_call_with_the_contract_headers() {
    let s = setup();
    let runner = s
        .client
        .generate_jitconfig(Some("app"), "ephemer-local-", &labels())
        .await
        .unwrap();
    assert!(runner.name.starts_with("ephemer-local-"), "{}", runner.name);
    assert_eq!(runner.name.len(), "ephemer-local-".len() + 8);
    let calls = s.standin.calls();
    assert_eq!(calls.len(), 1);
    let call = &calls[0];
    assert_eq!(
        call.path,
        "/repos/acme/app/actions/runners/generate-jitconfig"
    );
    assert_eq!(call.status, 201);
    assert_eq!(call.api_version.as_deref(), Some("2022-11-28"));
    assert_eq!(call.accept.as_deref(), Some("application/vnd.github+json"));
    assert!(call.bearer);
    // The JIT config is base64 JSON of the runner's files, naming the runner.
    let outer = base64::engine::general_purpose::STANDARD
        .decode(runner.encoded_jit_config.expose())
        .unwrap();
    let files: serde_json::Value = serde_json::from_slice(&outer).unwrap();
    let dot_runner = base64::engine::general_purpose::STANDARD
        .decode(files[".runner"].as_str().unwrap())
        .unwrap();
    let dot_runner: serde_json::Value = serde_json::from_slice(&dot_runner).unwrap();
    assert_eq!(dot_runner["AgentName"], runner.name.as_str());
    assert!(!format!("{runner:?}").contains(runner.encoded_jit_config.expose()));

    // Org-level runners use the org path.
    let org = GithubClient::new(
        &config(
            &s.standin,
            GithubAuth::Token(Secret::new("ghp_standin_token")),
            &[],
        ),
        Metrics::new(),
        None,
    );
    org.generate_jitconfig(None, "ephemer-linux-", &labels())
        .await
        .unwrap();
    assert_eq!(
        s.standin.calls()[1].path,
        "/orgs/acme/actions/runners/generate-jitconfig"
    );
    assert_eq!(s.standin.runners().len(), 2);
}

#[actix_rt::test]
async fn a_taken_name_is_retried_with_a_fresh_one_up_to_three_times() {
    let s = setup();
    s.standin.fail_status("generate_jitconfig", 409, 2);
    s.client
        .generate_jitconfig(None, "ephemer-local-", &labels())
        .await
        .unwrap();
    assert_eq!(s.standin.count("generate_jitconfig"), 3);
    let names: std::collections::HashSet<_> =
        s.standin.calls().iter().map(|c| c.path.clone()).collect();
    assert_eq!(names.len(), 1, "same endpoint");

    s.standin.fail_status("generate_jitconfig", 409, 3);
    let err = s
        .client
        .generate_jitconfig(None, "ephemer-local-", &labels())
        .await
        .unwrap_err();
    assert_eq!(err, GithubError::NameConflict { attempts: 3 });
    assert_eq!(err.class(), ErrorClass::UnknownRetryable);
    assert_eq!(s.standin.count("generate_jitconfig"), 6);
}

/// A runner registered under another name than the one asked (`../../..`, from a hostile
/// server or a proxy trusted through `ca_file`) is refused and its registration deleted: the
/// name would become a path for root (a directory removed recursively, log and pid files).
#[actix_rt::test]
async fn a_jit_answer_that_renames_the_runner_is_refused_and_deleted() {
    let s = setup();
    s.standin.rename_next_runner("../../..");
    let err = s
        .client
        .generate_jitconfig(None, "ephemer-local-", &labels())
        .await
        .unwrap_err();
    assert!(
        matches!(&err, GithubError::RenamedRunner { answered, .. } if answered == "../../.."),
        "{err:?}"
    );
    assert_eq!(
        err.class(),
        ErrorClass::ServerSide,
        "the server's fault: the claim goes on the ladder"
    );
    assert!(
        s.standin.runners().is_empty(),
        "the registration is deleted"
    );
    assert_eq!(s.standin.count("delete_runner"), 1);
}

/// The claim's bucket: a JIT config spends `actions_runner_registration`.
const REGISTRATION: RateBucket = RateBucket::ActionsRunnerRegistration;

async fn snapshot(s: &Setup) -> ephemer_actors_core::rate::RateSnapshot {
    let credential = s.client.rate_key();
    let all = s.rate.send(GetRateSnapshot { credential }).await.unwrap();
    all.into_iter()
        .find(|(b, _)| *b == REGISTRATION)
        .map(|(_, r)| r)
        .unwrap_or_default()
}

async fn gauges(m: &Metrics) -> [i64; 4] {
    let bucket = [REGISTRATION.as_str()];
    [
        m.rate_remaining.with_label_values(&bucket).get(),
        m.rate_limit.with_label_values(&bucket).get(),
        m.rate_reset_seconds.with_label_values(&bucket).get(),
        m.rate_updated_seconds.with_label_values(&bucket).get(),
    ]
}

#[actix_rt::test]
async fn rate_gauges_follow_every_answer_with_headers_and_only_those() {
    let s = setup();
    let reset = github_standin::unix_now() + 1800;
    s.standin.set_budget(4321, 5000, reset);
    s.client
        .generate_jitconfig(None, "ephemer-local-", &labels())
        .await
        .unwrap();
    let snap = snapshot(&s).await;
    assert_eq!(snap.remaining, Some(4320));
    let [remaining, limit, reset_g, updated] = gauges(&s.metrics).await;
    assert_eq!((remaining, limit, reset_g), (4320, 5000, reset as i64));
    assert!(updated > 0);

    // A 429 carries rate headers too: they are read.
    s.standin.fail_status("generate_jitconfig", 429, 1);
    let err = s
        .client
        .generate_jitconfig(None, "ephemer-local-", &labels())
        .await
        .unwrap_err();
    assert_eq!(err.class(), ErrorClass::RateLimit);
    snapshot(&s).await;
    let after_429 = gauges(&s.metrics).await;
    assert_eq!(after_429[0], 4319);

    // A 502 without rate headers changes none of the four gauges, not even "updated".
    actix_rt::time::sleep(Duration::from_millis(1100)).await;
    let fault = Fault::Status {
        status: 502,
        message: "Bad Gateway".into(),
        retry_after: None,
        rate_headers: false,
    };
    s.standin.fail_next("generate_jitconfig", 1, fault);
    let err = s
        .client
        .generate_jitconfig(None, "ephemer-local-", &labels())
        .await
        .unwrap_err();
    assert_eq!(err.class(), ErrorClass::ServerSide);
    let snap = snapshot(&s).await;
    assert_eq!(gauges(&s.metrics).await, after_429);
    assert_eq!(snap.updated as i64, after_429[3]);

    let text = s.metrics.encode();
    assert!(
        text.contains(
            r#"ephemerd_github_api_requests_total{code="201",endpoint="generate_jitconfig"} 1"#
        ),
        "{text}"
    );
    assert!(text.contains(
        r#"ephemerd_github_api_requests_total{code="502",endpoint="generate_jitconfig"} 1"#
    ));
}

#[actix_rt::test]
async fn error_classes_from_real_answers() {
    let s = setup();
    let wanted = labels();
    let claim = || s.client.generate_jitconfig(None, "ephemer-local-", &wanted);
    for (status, class) in [
        (500, ErrorClass::ServerSide),
        (502, ErrorClass::ServerSide),
        (503, ErrorClass::ServerSide),
        (504, ErrorClass::ServerSide),
        (400, ErrorClass::NonRetryable),
        (401, ErrorClass::NonRetryable),
        (403, ErrorClass::NonRetryable),
        (404, ErrorClass::NonRetryable),
        (422, ErrorClass::NonRetryable),
        (429, ErrorClass::RateLimit),
        (418, ErrorClass::UnknownRetryable),
    ] {
        s.standin.fail_status("generate_jitconfig", status, 1);
        assert_eq!(claim().await.unwrap_err().class(), class, "status {status}");
    }
    let secondary = Fault::Status {
        status: 403,
        message: "You have exceeded a secondary rate limit. Please wait a few minutes before you try again.".into(),
        retry_after: Some(7),
        rate_headers: true,
    };
    s.standin.fail_next("generate_jitconfig", 1, secondary);
    let err = claim().await.unwrap_err();
    assert_eq!(err.class(), ErrorClass::RateLimit);
    assert_eq!(err.retry_after(), Some(Duration::from_secs(7)));

    s.standin.exhaust_for(Duration::from_secs(60));
    let err = claim().await.unwrap_err();
    assert_eq!(
        (err.status(), err.class()),
        (Some(403), ErrorClass::RateLimit)
    );
    s.standin
        .set_budget(100, 5000, github_standin::unix_now() + 600);

    s.standin.fail_next("generate_jitconfig", 1, Fault::Drop);
    assert_eq!(claim().await.unwrap_err().class(), ErrorClass::Network);

    let nowhere = GithubConfig {
        api_url: "http://127.0.0.1:9".into(),
        ..config(&s.standin, GithubAuth::Token(Secret::new("x")), &[])
    };
    let dead = GithubClient::new(&nowhere, Metrics::new(), None);
    let err = dead
        .generate_jitconfig(None, "ephemer-local-", &labels())
        .await
        .unwrap_err();
    assert_eq!(err.class(), ErrorClass::Network, "{err}");

    let bad_token = GithubClient::new(
        &config(&s.standin, GithubAuth::Token(Secret::new("wrong")), &[]),
        Metrics::new(),
        None,
    );
    let err = bad_token
        .generate_jitconfig(None, "ephemer-local-", &labels())
        .await
        .unwrap_err();
    assert_eq!(
        (err.status(), err.class()),
        (Some(401), ErrorClass::NonRetryable)
    );
    assert!(
        !err.to_string().contains("wrong"),
        "no token in errors: {err}"
    );
}

#[actix_rt::test]
async fn app_token_is_exchanged_once_for_twenty_concurrent_callers() {
    let (auth, public) = app_auth();
    let s = setup_with(
        StandinConfig {
            app_public_key: Some(public),
            ..StandinConfig::default()
        },
        Some(auth),
    );
    let calls = (0..20).map(|_| s.client.list_runners(None, "ephemer"));
    let results = futures_util::future::join_all(calls).await;
    assert!(results.iter().all(Result::is_ok), "{results:?}");
    assert_eq!(s.standin.count("access_tokens"), 1);
    assert_eq!(s.standin.count("list_runners"), 20);
    // Cached afterwards.
    s.client.list_runners(None, "ephemer").await.unwrap();
    assert_eq!(s.standin.count("access_tokens"), 1);
    // The budget is the installation's, on this API.
    assert_eq!(
        s.client.rate_key(),
        format!("app-4242-installation-77@{}", s.standin.url())
    );
}

#[actix_rt::test]
async fn app_token_is_refreshed_before_it_expires_and_after_a_401() {
    let (auth, public) = app_auth();
    // A token that lives 4 minutes is always inside the 5-minute refresh margin.
    let config = StandinConfig {
        app_public_key: Some(public),
        installation_token_ttl: Duration::from_secs(240),
        ..StandinConfig::default()
    };
    let s = setup_with(config, Some(auth));
    s.client.list_runners(None, "ephemer").await.unwrap();
    s.client.list_runners(None, "ephemer").await.unwrap();
    assert_eq!(s.standin.count("access_tokens"), 2);

    // A revoked token: the 401 drops it and the next call mints a new one.
    s.standin.state().installation_tokens.clear();
    let (auth, public) = app_auth();
    let long = setup_with(
        StandinConfig {
            app_public_key: Some(public),
            ..StandinConfig::default()
        },
        Some(auth),
    );
    long.client.list_runners(None, "ephemer").await.unwrap();
    long.standin.state().installation_tokens.clear();
    let err = long.client.list_runners(None, "ephemer").await.unwrap_err();
    assert_eq!(err.status(), Some(401));
    long.client.list_runners(None, "ephemer").await.unwrap();
    assert_eq!(long.standin.count("access_tokens"), 2);
}

#[actix_rt::test]
async fn a_bad_app_key_is_an_auth_error_without_the_key() {
    let s = setup();
    let auth = GithubAuth::App(AppAuth {
        app_id: 1,
        installation_id: 2,
        private_key: Secret::new(
            "-----BEGIN RSA PRIVATE KEY-----\nSECRETSTUFF\n-----END RSA PRIVATE KEY-----",
        ),
    });
    let client = GithubClient::new(&config(&s.standin, auth, &["app"]), Metrics::new(), None);
    let err = client.list_runners(None, "x").await.unwrap_err();
    assert_eq!(err.class(), ErrorClass::NonRetryable);
    assert!(!err.to_string().contains("SECRETSTUFF"));
}

#[actix_rt::test]
async fn listings_follow_every_page() {
    let s = setup();
    for _ in 0..230 {
        s.client
            .generate_jitconfig(Some("app"), "ephemer-local-", &labels())
            .await
            .unwrap();
    }
    s.standin.state().calls.clear();
    let runners = s
        .client
        .list_runners(Some("app"), "ephemer-local")
        .await
        .unwrap();
    assert_eq!(runners.len(), 230);
    assert_eq!(s.standin.count("list_runners"), 3, "100 + 100 + 30");
    assert!(
        s.client
            .list_runners(Some("app"), "other-")
            .await
            .unwrap()
            .is_empty()
    );

    // A run already in progress can still hold queued jobs; 150 of them span two pages.
    let ids = s.standin.queue_jobs("app", &["self-hosted", "linux"], 151);
    {
        let mut st = s.standin.state();
        let first = st.jobs.get_mut(&ids[0]).unwrap();
        first.status = "in_progress".into();
        first.runner_name = Some("someone".into());
    }
    let queued_run_ids = s.standin.queue_jobs("app", &["self-hosted"], 2);
    let jobs = s.client.list_queued_jobs("app").await.unwrap();
    assert_eq!(jobs.len(), 152);
    assert!(!jobs.iter().any(|j| j.key.job_id == ids[0]));
    assert!(jobs.iter().any(|j| j.key.job_id == queued_run_ids[1]));
    assert_eq!(s.client.repos().await.unwrap(), vec!["app"]);
}

#[actix_rt::test]
async fn deleting_a_runner_is_idempotent() {
    let s = setup();
    let r = s
        .client
        .generate_jitconfig(None, "ephemer-local-", &labels())
        .await
        .unwrap();
    s.client.delete_runner(None, r.id).await.unwrap();
    assert!(s.standin.runners().is_empty());
    s.client.delete_runner(None, r.id).await.unwrap();
    assert_eq!(s.standin.calls().last().unwrap().status, 404);
    let (job, status) = {
        let id = s.standin.queue_jobs("app", &["self-hosted"], 1)[0];
        s.client.get_job("app", id).await.unwrap()
    };
    assert_eq!(status, "queued");
    assert_eq!(*job.labels, ["self-hosted"]);
}

/// Ten repos (and an archived one) with a queued job each; one repo answers 500. The pass
/// still finds the other nine jobs and names the failed repo; the archived repo is never asked
/// about. A second pass over unchanged repos costs only 304s, which leave the budget as it was.
#[actix_rt::test]
async fn a_reconcile_pass_isolates_a_failing_repo_and_an_unchanged_pass_costs_only_304s() {
    let standin = Standin::start(StandinConfig {
        repos: Vec::new(),
        ..StandinConfig::default()
    })
    .unwrap();
    let repos: Vec<String> = (0..10).map(|i| format!("repo{i}")).collect();
    standin.add_repos(&repos.iter().map(String::as_str).collect::<Vec<_>>());
    standin.add_archived_repo("old");
    for repo in &repos {
        standin.add_jobs(repo, &["self-hosted"], 1);
    }
    standin.fail_repo("repo3", 500, 100);
    let metrics = Metrics::new();
    let client = GithubClient::new(
        &config(
            &standin,
            GithubAuth::Token(Secret::new("ghp_standin_token")),
            &[],
        ),
        metrics.clone(),
        None,
    );
    let first = client.reconcile(0).await.unwrap();
    let found: Vec<&str> = first.jobs.iter().map(|j| &*j.repo).collect();
    assert_eq!(found.len(), 9, "{found:?}");
    assert!(!found.contains(&"repo3"));
    assert_eq!(first.failed.len(), 1);
    assert_eq!(first.failed[0].0, "repo3");
    assert!(
        !standin
            .calls()
            .iter()
            .any(|c| c.path.contains("/repos/acme/old/")),
        "an archived repo was listed"
    );

    standin.fail_repo("repo3", 500, 0);
    let second = client.reconcile(first.next_start).await.unwrap();
    assert_eq!(
        second.jobs.len(),
        10,
        "repo3's job is found once it answers"
    );
    let budget = standin.state().budget.remaining;
    let before = standin.calls().len();
    let third = client.reconcile(second.next_start).await.unwrap();
    assert_eq!(third.jobs.len(), 10);
    let calls = standin.calls();
    let statuses: Vec<u16> = calls[before..].iter().map(|c| c.status).collect();
    assert!(!statuses.is_empty());
    assert!(statuses.iter().all(|s| *s == 304), "{statuses:?}");
    assert_eq!(standin.state().budget.remaining, budget, "304s are free");
}

/// A pass stops once the `core` budget runs low and the next pass resumes where it stopped.
#[actix_rt::test]
async fn a_reconcile_pass_leaves_the_rest_for_later_when_the_budget_runs_low() {
    let standin = Standin::start(StandinConfig {
        repos: Vec::new(),
        ..StandinConfig::default()
    })
    .unwrap();
    let repos: Vec<String> = (0..6).map(|i| format!("repo{i}")).collect();
    standin.add_repos(&repos.iter().map(String::as_str).collect::<Vec<_>>());
    for repo in &repos {
        standin.add_jobs(repo, &["self-hosted"], 1);
    }
    let client = GithubClient::new(
        &config(
            &standin,
            GithubAuth::Token(Secret::new("ghp_standin_token")),
            &[],
        ),
        Metrics::new(),
        None,
    );
    // Low means under a tenth of the limit (500 of 5000): the org listing and three repos (3
    // calls each) spend the 8 above it.
    let reset = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
        + 3600;
    standin.set_budget(508, 5000, reset);
    let first = client.reconcile(0).await.unwrap();
    assert!(first.deferred > 0, "{first:?}");
    assert!(first.listed < 6);
    standin.set_budget(5000, 5000, reset);
    let second = client.reconcile(first.next_start).await.unwrap();
    let mut seen: Vec<&str> = first
        .jobs
        .iter()
        .chain(second.jobs.iter())
        .map(|j| &*j.repo)
        .collect();
    seen.sort_unstable();
    seen.dedup();
    assert_eq!(
        seen.len(),
        6,
        "the second pass picked up where the first stopped"
    );
}

/// The Actions service words its errors `{typeName, message}`; the error keeps the type (so
/// callers match it by a part of the name, as both Go clients do), and closing a session that
/// lapsed, which the service answers 400 `RunnerScaleSetSessionExpiredException` (ARC#4285),
/// is done, not a failure.
#[actix_rt::test]
async fn closing_a_lapsed_scale_set_session_is_done_and_service_errors_keep_their_type() {
    use ephemer_actors_core::github::actions::{
        ActionsClient, names_exception,
        types::{Label, ScaleSet},
    };
    let standin = Standin::start(StandinConfig::default()).unwrap();
    let token = GithubAuth::Token(Secret::new("ghp_standin_token"));
    let client = GithubClient::new(&config(&standin, token, &[]), Metrics::new(), None);
    let actions = ActionsClient::new(client);
    let set = actions
        .create_scale_set(&ScaleSet {
            name: "alpha".into(),
            runner_group_id: 1,
            labels: vec![Label {
                kind: "System".into(),
                name: "alpha".into(),
            }],
            ..ScaleSet::default()
        })
        .await
        .unwrap();
    let first = actions.create_session(set.id, "host-a").await.unwrap();
    let held = actions.create_session(set.id, "host-b").await.unwrap_err();
    assert!(
        names_exception(&held, "RunnerScaleSetSessionConflictException"),
        "{held}"
    );
    standin.state().scalesets.evict_session(set.id);
    actions
        .delete_session(set.id, &first.session_id)
        .await
        .expect("a lapsed session is already closed");
    let closes = standin.calls_to("actions_delete_session");
    assert_eq!(closes.last().map(|c| c.status), Some(400));
}
