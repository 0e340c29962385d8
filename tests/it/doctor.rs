//! `doctor` against the stand-in GitHub, which answers the hooks, deliveries, runner groups and
//! token scopes it reads: all ok on a sound setup, and each misconfiguration a fail line with
//! its fix and exit 1.

use github_standin::{Standin, StandinConfig, org::Hook};

use crate::support::{
    daemon::{config_with_github, free_port, local_provider},
    podman::Podman,
};

/// A stand-in whose classic token may manage runners and read hooks, with one sound hook on
/// the repo the test config names.
fn sound_standin() -> Standin {
    let standin = Standin::start(StandinConfig::default()).unwrap();
    standin.set_token_scopes(&["repo", "admin:repo_hook"]);
    standin.add_hook(hook(7, "json", |_| {}));
    // The runner's releases (the release check reads the API only, never the archive).
    standin.publish_release("2.330.0", b"not read".to_vec());
    standin
}

fn hook(id: u64, content_type: &str, edit: impl FnOnce(&mut Hook)) -> Hook {
    let mut h = Hook {
        id,
        url: "https://ci.example.com/webhook/github".into(),
        content_type: content_type.into(),
        events: vec!["workflow_job".into()],
        active: true,
        secret: true,
        deliveries: vec![(202, "OK".into()), (202, "OK".into())],
        repo: Some("app".into()),
    };
    edit(&mut h);
    h
}

/// Runs `doctor --json` on a config for `standin` with `github` keys and `providers`.
async fn doctor(standin: &Standin, github: &str, providers: &str) -> (i32, serde_json::Value) {
    doctor_edited(standin, github, providers, |text| text).await
}

/// Like [`doctor`], with the config text passed through `edit` first.
async fn doctor_edited(
    standin: &Standin,
    github: &str,
    providers: &str,
    edit: impl Fn(String) -> String,
) -> (i32, serde_json::Value) {
    let dir = tempfile::tempdir().unwrap();
    let text = config_with_github(
        standin,
        free_port(),
        &dir.path().join("state"),
        "0s",
        github,
        "",
        providers,
    );
    let path = dir.path().join("config.toml");
    std::fs::write(&path, edit(text)).unwrap();
    let mut cmd = crate::support::daemon();
    cmd.args(["doctor", "--json", "-c"]).arg(&path);
    let (code, out, err) = crate::support::output(cmd).await;
    let report = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}{err}"));
    (code, report)
}

/// The checks of `status` (`"fail"`, `"warn"`) as `name: detail (fix)` lines.
fn lines(report: &serde_json::Value, status: &str) -> Vec<String> {
    report["checks"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["status"] == status)
        .map(|c| {
            format!(
                "{}: {} ({})",
                c["name"].as_str().unwrap(),
                c["detail"],
                c["fix"]
            )
        })
        .collect()
}

fn assert_fails(code: i32, report: &serde_json::Value, name: &str, fix_says: &str) {
    assert_eq!(code, 1, "{report:#}");
    let fails = lines(report, "fail");
    assert!(
        fails
            .iter()
            .any(|l| l.starts_with(&format!("{name}:")) && l.contains(fix_says)),
        "no fail line for {name} saying {fix_says:?}: {fails:#?}"
    );
}

#[actix_rt::test]
async fn doctor_passes_a_sound_setup_and_names_each_misconfiguration() {
    let standin = sound_standin();
    let pool = local_provider(2);
    let (code, report) = doctor(&standin, "", &pool).await;
    assert_eq!(code, 0, "{report:#}");
    assert_eq!(report["fail"], 0, "{report:#}");
    assert_eq!(report["warn"], 0, "{:#?}", lines(&report, "warn"));
    for name in [
        "config",
        "github.credential",
        "github.scopes",
        "github.permission",
        "clock",
        "webhook.7",
        "pool.local",
        "state.dir",
        "webhook.listen",
    ] {
        assert!(
            report["checks"]
                .as_array()
                .unwrap()
                .iter()
                .any(|c| c["name"] == name && c["status"] == "ok"),
            "no ok line for {name}: {report:#}"
        );
    }

    // A wrong token.
    let wrong = "api_url = \"URL\"\ntoken = \"ghp_wrong\"\n".replace("URL", &standin.url());
    // The helper writes the stand-in's token first: drop it, so the wrong one is the only one.
    let helpers_token = format!("token = \"{}\"\n", crate::support::daemon::TOKEN);
    let (code, report) = doctor_edited(&standin, &wrong, &pool, |text| {
        text.replacen(&helpers_token, "", 1)
    })
    .await;
    assert_fails(code, &report, "github.credential", "github.token");

    // A token without the scope runner registration needs.
    let narrow = sound_standin();
    narrow.set_token_scopes(&["read:org", "admin:repo_hook"]);
    let (code, report) = doctor(&narrow, "", &pool).await;
    assert_fails(code, &report, "github.scopes", "repo");
    assert_fails(code, &report, "github.permission", "Administration");

    // A hook that posts another content type, one without a secret, and failed deliveries.
    let hooks = Standin::start(StandinConfig::default()).unwrap();
    hooks.set_token_scopes(&["repo", "admin:repo_hook"]);
    hooks.add_hook(hook(8, "xml", |_| {}));
    hooks.add_hook(hook(9, "json", |h| {
        h.secret = false;
        h.deliveries = vec![(401, "Unauthorized".into()), (202, "OK".into())];
    }));
    let (code, report) = doctor(&hooks, "", &pool).await;
    assert_fails(code, &report, "webhook.8", "application/json");
    assert_fails(code, &report, "webhook.9", "webhook.secret");
    assert!(
        lines(&report, "warn").iter().any(|l| l.starts_with("webhook.9:") && l.contains("1 of the last 2 deliveries failed")),
        "{:#?}",
        lines(&report, "warn")
    );

    // No hook sends workflow_job at all.
    let silent = Standin::start(StandinConfig::default()).unwrap();
    silent.set_token_scopes(&["repo", "admin:repo_hook"]);
    let (code, report) = doctor(&silent, "", &pool).await;
    assert_fails(code, &report, "webhook", "Workflow jobs");

    // A runner_dir that is not an actions/runner install.
    let empty = tempfile::tempdir().unwrap();
    let not_a_runner = format!(
        "[providers.local]\nrunner_dir = \"{}\"\nallow_root = true\n",
        empty.path().display()
    );
    let (code, report) = doctor(&standin, "", &not_a_runner).await;
    assert_fails(code, &report, "pool.local", "docs/providers.md");

    // A bad config is exit 2, before any check.
    let mut cmd = crate::support::daemon();
    cmd.args(["doctor", "-c", "/nonexistent/config.toml"]);
    assert_eq!(crate::support::output(cmd).await.0, 2);
}

/// A container pool whose image is neither on the engine nor pullable is a fail line.
#[actix_rt::test]
async fn doctor_fails_a_container_pool_whose_image_is_missing() {
    let Some(podman) = Podman::start().await else {
        return;
    };
    let standin = sound_standin();
    let pool = format!(
        "[providers.linux]\nsocket = \"{}\"\nimage = \"localhost/ephemer-absent:nope\"\n",
        podman.socket
    );
    let (code, report) = doctor(&standin, "", &pool).await;
    assert_fails(code, &report, "pool.linux", "see the message");
    let fails = lines(&report, "fail");
    assert!(
        fails
            .iter()
            .any(|l| l.contains("localhost/ephemer-absent:nope") && l.contains("cannot be pulled")),
        "{fails:#?}"
    );
}

/// A runner group by name: found is an ok line with its id; missing is a failure naming the
/// groups the org has.
#[actix_rt::test]
async fn doctor_resolves_a_runner_group_by_name() {
    let standin = sound_standin();
    // Org-level runners: the token needs admin:org (and admin:org_hook for the org's hooks).
    standin.set_token_scopes(&["admin:org", "admin:org_hook"]);
    let pool = local_provider(2);
    standin.add_runner_group("ci-linux");
    let (_, report) = doctor(&standin, "runner_group = \"ci-linux\"\nrepos = []", &pool).await;
    assert!(
        report["checks"]
            .as_array()
            .unwrap()
            .iter()
            .any(|c| c["name"] == "github.runner_group"
                && c["status"] == "ok"
                && c["detail"].as_str().unwrap().contains("is id 2")),
        "{report:#}"
    );
    let (code, report) = doctor(&standin, "runner_group = \"gpu\"\nrepos = []", &pool).await;
    assert_fails(code, &report, "github.runner_group", "create the group");
}
