//! Config validation: every problem with its key path, defaults, secrets never quoted.

use super::*;
use std::path::PathBuf;

fn env() -> Environment {
    Environment::default()
}

pub(super) const MINIMAL: &str = r#"
    [github]
    owner = "acme"
    token = "ghp_filetoken"
    [webhook]
    secret = "hooksecret"
    [providers.local]
    allow_same_user = true
    runner_dir = "/opt/actions-runner"
"#;

fn problems(text: &str) -> Vec<ConfigError> {
    match Config::from_toml_str(text, None, &env()) {
        Ok(_) => Vec::new(),
        Err(e) => e.0,
    }
}

fn keys(text: &str) -> Vec<String> {
    problems(text).into_iter().map(|e| e.key).collect()
}

#[test]
fn minimal_config_gets_the_contract_defaults() {
    let c = Config::from_toml_str(MINIMAL, None, &env()).unwrap();
    assert_eq!(c.github.api_url, "https://api.github.com");
    assert_eq!(c.github.max_claims_per_minute, 150);
    assert_eq!(c.webhook.listen.to_string(), "0.0.0.0:8080");
    assert_eq!(c.webhook.path, "/webhook/github");
    assert_eq!(
        c.webhook.reconcile_interval,
        Some(Duration::from_secs(1800))
    );
    assert_eq!(c.runner.max_concurrent, 4);
    assert_eq!(c.runner.job_timeout, Some(Duration::from_secs(7200)));
    assert_eq!(c.state.retention, Duration::from_secs(3600));
    assert_eq!(c.state.usage_retention, Duration::from_secs(100 * 86_400));
    assert_eq!(c.runner.claim_retry, ClaimRetryConfig::default());
    assert_eq!(c.runner.claim_retry.schedule.len(), 5);
    assert_eq!(c.admin.listen.to_string(), "127.0.0.1:9091");
    assert_eq!(c.metrics.listen, None);
    assert!(c.providers.get("local").unwrap().common.enabled);
    assert!(!c.providers.get("linux").is_some_and(|p| p.common.enabled));
    assert_eq!(
        c.providers
            .get("local")
            .unwrap()
            .process()
            .unwrap()
            .work_root,
        PathBuf::from("/var/lib/ephemer-actors-work")
    );
    assert_eq!(
        c.providers.get("local").unwrap().common.restart,
        RestartConfig::default()
    );
    assert_eq!(
        c.providers.get("local").unwrap().process().unwrap().program,
        RunnerProgram::Install(PathBuf::from("/opt/actions-runner"))
    );
}

/// A process pool runs an actions/runner install (`runner_dir`) or a stateless `command`:
/// exactly one, and the work root must not be inside the install it copies.
#[test]
fn a_process_pool_takes_exactly_one_of_runner_dir_and_command() {
    let with = |keys: &str| {
        format!(
            "[github]\nowner = \"acme\"\ntoken = \"t\"\n[webhook]\nsecret = \"s\"\n\
             [providers.local]\n{keys}\n[providers.native_macos]\n{keys}\n"
        )
    };
    let both = problems(&with(
        "runner_dir = \"/opt/r\"\ncommand = \"/opt/r/run.sh\"",
    ));
    // Neither: the daemon-managed install, which needs runner.auto_update.
    let neither = problems(&format!(
        "[runner]\nauto_update = false\n{}",
        with("labels = [\"x\"]")
    ));
    let managed = Config::from_toml_str(&with("allow_same_user = true"), None, &env()).unwrap();
    assert_eq!(
        managed
            .providers
            .get("local")
            .unwrap()
            .process()
            .unwrap()
            .program,
        RunnerProgram::Managed
    );
    for (errs, says) in [(&both, "not both"), (&neither, "needs runner_dir")] {
        for kind in ["local", "native_macos"] {
            let key = format!("providers.{kind}.runner_dir");
            assert!(
                errs.iter().any(|e| e.key == key && e.reason.contains(says)),
                "{key}: {errs:?}"
            );
        }
    }
    let inside = keys(&with(
        "runner_dir = \"/opt/r\"\nwork_root = \"/opt/r/work\"",
    ));
    assert!(
        inside.contains(&"providers.local.work_root".into()),
        "{inside:?}"
    );
    let relative = keys(&with("runner_dir = \"opt/r\""));
    assert!(
        relative.contains(&"providers.local.runner_dir".into()),
        "{relative:?}"
    );
    let c = Config::from_toml_str(
        &with("command = \"/usr/bin/runner\"\nrun_as = \"ci\""),
        None,
        &env(),
    )
    .unwrap();
    assert_eq!(
        c.providers.get("local").unwrap().process().unwrap().program,
        RunnerProgram::Command(PathBuf::from("/usr/bin/runner"))
    );
    assert_eq!(
        c.providers.get("local").unwrap().process().unwrap().run_as,
        ["ci"]
    );
}

/// `run_as` is one user, or one per concurrent runner so that siblings cannot read each
/// other's environment; one user shared by concurrent runners is allowed but warned about.
#[test]
fn run_as_lists_one_user_per_concurrent_runner() {
    let with = |keys: &str| {
        format!(
            "[github]\nowner = \"acme\"\ntoken = \"t\"\n[webhook]\nsecret = \"s\"\n\
             [providers.local]\ncommand = \"/usr/bin/runner\"\n{keys}\n"
        )
    };
    let c = Config::from_toml_str(
        &with("max_concurrent = 2\nrun_as = [\"ci1\", \"ci2\", \"ci3\"]"),
        None,
        &env(),
    )
    .unwrap();
    assert_eq!(
        c.providers.get("local").unwrap().process().unwrap().run_as,
        ["ci1", "ci2", "ci3"]
    );
    assert!(
        !c.warnings().iter().any(|w| w.contains(".run_as")),
        "{:?}",
        c.warnings()
    );
    for bad in [
        "max_concurrent = 3\nrun_as = [\"ci1\", \"ci2\"]",
        "max_concurrent = 2\nrun_as = [\"ci1\", \"ci1\"]",
    ] {
        let keys = keys(&with(bad));
        assert!(
            keys.contains(&"providers.local.run_as".to_string()),
            "{bad}: {keys:?}"
        );
    }
    let shared =
        Config::from_toml_str(&with("max_concurrent = 2\nrun_as = \"ci\""), None, &env()).unwrap();
    assert!(
        shared
            .warnings()
            .iter()
            .any(|w| w.contains("providers.local.run_as")),
        "{:?}",
        shared.warnings()
    );
}

#[test]
fn unknown_key_bad_duration_and_missing_owner_are_reported_together() {
    let text = r#"
        [github]
        token = "t"
        colour = "blue"
        [webhook]
        secret = "s"
        reconcile_interval = "soon"
        [providers.local]
        allow_same_user = true
        command = "/bin/true"
        [providers.local.restart]
        policy = "never"
        extra = 1
    "#;
    let keys = keys(text);
    assert!(keys.contains(&"github.colour".to_string()), "{keys:?}");
    assert!(
        keys.contains(&"providers.local.restart.extra".to_string()),
        "{keys:?}"
    );
    assert!(
        keys.contains(&"webhook.reconcile_interval".to_string()),
        "{keys:?}"
    );
    assert!(keys.contains(&"github.owner".to_string()), "{keys:?}");
}

#[test]
fn ladder_jitter_and_reset_window_are_checked() {
    let text = format!(
        "{MINIMAL}\n[runner.claim_retry]\nschedule = [\"1m\", \"30s\", \"0s\", \"x\"]\njitter = 1.5\nrate_reset_jitter = [\"25s\", \"5s\"]\n"
    );
    let keys = keys(&text);
    for k in [
        "runner.claim_retry.schedule[1]",
        "runner.claim_retry.schedule[2]",
        "runner.claim_retry.schedule[3]",
        "runner.claim_retry.jitter",
        "runner.claim_retry.rate_reset_jitter",
    ] {
        assert!(keys.contains(&k.to_string()), "missing {k} in {keys:?}");
    }
    let empty = format!("{MINIMAL}\n[runner.claim_retry]\nschedule = []\n");
    assert_eq!(keys_of(&empty), vec!["runner.claim_retry.schedule"]);
}

fn keys_of(text: &str) -> Vec<String> {
    keys(text)
}

#[test]
fn equal_rungs_and_zero_jitter_are_fine() {
    let text = format!(
        "{MINIMAL}\n[runner.claim_retry]\nschedule = [\"1s\", \"1s\", \"2s\"]\njitter = 0.0\n"
    );
    let c = Config::from_toml_str(&text, None, &env()).unwrap();
    assert_eq!(c.runner.claim_retry.jitter, 0.0);
    assert_eq!(c.runner.claim_retry.schedule[2], Duration::from_secs(2));
}

#[test]
fn addresses_providers_and_state_dir_are_checked() {
    let text = r#"
        [github]
        owner = "acme"
        token = "t"
        [webhook]
        secret = "s"
        listen = "everywhere"
        [metrics]
        listen = "127.0.0.1"
        [state]
        dir = "relative/dir"
        retention = "10s"
        usage_retention = "30s"
        [providers.local]
        allow_same_user = true
        enabled = false
        [providers.linux]
        enabled = true
        labels = []
        max_concurrent = 0
        socket = "/run/podman.sock"
        [providers.vm_macos]
        max_concurrent = 3
    "#;
    let keys = keys(text);
    for k in [
        "webhook.listen",
        "metrics.listen",
        "state.dir",
        "state.retention",
        "state.usage_retention",
        "providers.linux.labels",
        "providers.linux.max_concurrent",
        "providers.linux.socket",
        "providers.vm_macos.max_concurrent",
    ] {
        assert!(keys.contains(&k.to_string()), "missing {k} in {keys:?}");
    }
    let none = r#"
        [github]
        owner = "acme"
        token = "t"
        [webhook]
        secret = "s"
    "#;
    assert_eq!(keys_of(none), vec!["providers"]);
}

#[test]
fn secrets_may_come_from_the_environment() {
    let text = r#"
        [github]
        owner = "acme"
        [providers.local]
        allow_same_user = true
        command = "/bin/true"
    "#;
    assert_eq!(keys(text), vec!["github.token", "webhook.secret"]);
    let env = Environment {
        github_token: Some(Secret::new("from-env")),
        webhook_secret: Some(Secret::new("hook-env")),
        ..Environment::default()
    };
    let c = Config::from_toml_str(text, None, &env).unwrap();
    assert!(matches!(&c.github.auth, GithubAuth::Token(t) if t.expose() == "from-env"));
    assert_eq!(c.webhook.secret.expose(), "hook-env");
}

#[test]
fn half_configured_app_auth_names_each_missing_key() {
    let text = r#"
        [github]
        owner = "acme"
        app_id = 12
        [webhook]
        secret = "s"
        [providers.local]
        allow_same_user = true
        command = "/bin/true"
    "#;
    assert_eq!(
        keys(text),
        vec!["github.installation_id", "github.private_key_path"]
    );
    let unreadable = r#"
        [github]
        owner = "acme"
        app_id = 12
        installation_id = 34
        private_key_path = "/nonexistent/app.pem"
        [webhook]
        secret = "s"
        [providers.local]
        allow_same_user = true
        command = "/bin/true"
    "#;
    assert_eq!(keys(unreadable), vec!["github.private_key_path"]);
}

#[test]
fn no_problem_message_quotes_a_secret() {
    let dir = tempfile::tempdir().unwrap();
    let pem = dir.path().join("bad.pem");
    std::fs::write(
        &pem,
        "-----BEGIN RSA PRIVATE KEY-----\nTOPSECRETKEYDATA\n-----END RSA PRIVATE KEY-----\n",
    )
    .unwrap();
    let text = format!(
        r#"
        [github]
        owner = "acme"
        token = "ghp_TOPSECRETTOKEN"
        app_id = 1
        installation_id = 2
        private_key_path = "{}"
        [webhook]
        secret = "TOPSECRETHOOK"
        reconcile_interval = "nope"
        [providers.local]
        allow_same_user = true
        command = "/bin/true"
        "#,
        pem.display()
    );
    let err = Config::from_toml_str(&text, None, &env()).unwrap_err();
    assert!(!err.0.is_empty());
    let shown = format!("{err}\n{err:?}");
    assert!(!shown.contains("TOPSECRET"), "{shown}");
}

#[test]
fn debug_of_a_whole_config_shows_no_secret() {
    let env = Environment::default();
    let text = MINIMAL
        .replace("ghp_filetoken", "ghp_TOPSECRETTOKEN")
        .replace("hooksecret", "TOPSECRETHOOK");
    let c = Config::from_toml_str(&text, None, &env).unwrap();
    let shown = format!("{c:?} {c:#?}");
    assert!(shown.contains("Secret(***)"));
    assert!(!shown.contains("TOPSECRET"), "{shown}");
}

#[test]
fn a_type_error_names_its_key() {
    let text = format!("{MINIMAL}\n[runner]\nmax_concurrent = \"four\"\n");
    assert_eq!(keys(&text), vec!["runner.max_concurrent"]);
    let broken = "[github\nowner = 1";
    assert_eq!(keys(broken), vec!["<file>"]);
}

#[test]
fn durations_accept_the_contract_spellings() {
    for (s, secs) in [
        ("30s", 30),
        ("1m", 60),
        ("90m", 5400),
        ("2h", 7200),
        ("0s", 0),
    ] {
        assert_eq!(parse_duration(s).unwrap(), Duration::from_secs(secs));
    }
    assert!(parse_duration("10").is_err());
    assert!(parse_duration("-1s").is_err());
}

/// A JIT config is a runner's credential: plain http or an engine socket on the network is
/// refused unless `allow_insecure` says so; loopback is fine.
#[test]
fn clear_text_to_another_host_needs_allow_insecure() {
    let with = |github: &str, linux: &str| {
        keys(&format!(
            "[github]\nowner = \"acme\"\ntoken = \"t\"\n{github}\n[webhook]\nsecret = \"s\"\n\
             [providers.linux]\n{linux}\n"
        ))
    };
    let remote = with(
        "api_url = \"http://ghes.example.com/api/v3\"",
        "socket = \"tcp://10.0.0.5:2375\"",
    );
    assert!(remote.contains(&"github.api_url".into()), "{remote:?}");
    assert!(
        remote.contains(&"providers.linux.socket".into()),
        "{remote:?}"
    );
    let allowed = with(
        "api_url = \"http://ghes.example.com/api/v3\"\nallow_insecure = true",
        "socket = \"tcp://10.0.0.5:2375\"\nallow_insecure = true",
    );
    assert!(allowed.is_empty(), "{allowed:?}");
    let local = with(
        "api_url = \"http://127.0.0.1:8080\"",
        "socket = \"http://[::1]:2375\"",
    );
    assert!(local.is_empty(), "{local:?}");
}

#[test]
fn container_limits_have_defaults_and_bounds() {
    let with = |linux: &str| {
        format!(
            "[github]\nowner = \"acme\"\ntoken = \"t\"\n[webhook]\nsecret = \"s\"\n\
             [providers.linux]\n{linux}\n"
        )
    };
    let c = Config::from_toml_str(&with(""), None, &env()).unwrap();
    assert_eq!(
        c.providers.get("linux").unwrap().linux().unwrap().limits,
        ContainerLimits::default()
    );
    let c = Config::from_toml_str(
        &with("memory = \"512MiB\"\npids_limit = 256\ncpus = 1.5\nread_only_root = true"),
        None,
        &env(),
    )
    .unwrap();
    let l = &c.providers.get("linux").unwrap().linux().unwrap().limits;
    assert_eq!(
        (l.memory, l.pids_limit, l.cpus),
        (512 << 20, 256, Some(1.5))
    );
    assert!(l.read_only_root);
    let bad = keys(&with(
        "memory = \"1MiB\"\npids_limit = 2\ncpus = 0.0\ncap_add = [\"sys admin\"]",
    ));
    for k in [
        "providers.linux.memory",
        "providers.linux.pids_limit",
        "providers.linux.cpus",
        "providers.linux.cap_add[0]",
    ] {
        assert!(bad.contains(&k.to_string()), "{k}: {bad:?}");
    }
}

#[test]
fn an_admin_listener_off_loopback_is_valid_but_warned_about() {
    let text = format!("{MINIMAL}\n[admin]\nlisten = \"0.0.0.0:9091\"\n");
    let c = Config::from_toml_str(&text, None, &env()).unwrap();
    assert!(
        c.warnings().iter().any(|w| w.contains("admin.listen")),
        "{:?}",
        c.warnings()
    );
    let c = Config::from_toml_str(MINIMAL, None, &env()).unwrap();
    assert!(!c.warnings().iter().any(|w| w.contains("admin.listen")));
    let unix = format!("{MINIMAL}\n[admin]\nlisten = \"unix:/run/e/admin.sock\"\n");
    let c = Config::from_toml_str(&unix, None, &env()).unwrap();
    assert_eq!(
        c.admin.listen,
        AdminListen::Unix("/run/e/admin.sock".into())
    );
    assert!(
        keys(&format!("{MINIMAL}\n[admin]\nlisten = \"unix:rel.sock\"\n"))
            .contains(&"admin.listen".into())
    );
}

#[test]
fn a_runner_group_by_name_is_org_level_and_excludes_an_id() {
    let org = "[github]\nowner = \"acme\"\ntoken = \"t\"\nrunner_group = \"ci-linux\"\n[webhook]\nsecret = \"s\"\n[providers.local]\nrunner_dir = \"/opt/actions-runner\"\nallow_same_user = true\n";
    let c = Config::from_toml_str(org, None, &env()).unwrap();
    assert_eq!(c.github.runner_group.as_deref(), Some("ci-linux"));
    let both = org.replace("runner_group = ", "runner_group_id = 3\nrunner_group = ");
    assert_eq!(keys(&both), vec!["github.runner_group"]);
    let repo_level = org.replace("token = \"t\"\n", "token = \"t\"\nrepos = [\"app\"]\n");
    assert_eq!(keys(&repo_level), vec!["github.runner_group"]);
}

#[test]
fn an_enterprise_is_a_slug_and_not_repo_level() {
    let base = "[github]\nowner = \"acme\"\ntoken = \"t\"\nenterprise = \"acme-corp\"\n[webhook]\nsecret = \"s\"\n[providers.local]\nrunner_dir = \"/opt/actions-runner\"\nallow_same_user = true\n";
    let c = Config::from_toml_str(base, None, &env()).unwrap();
    assert_eq!(c.github.enterprise.as_deref(), Some("acme-corp"));
    let bad = base
        .replace("acme-corp", "enterprises/acme corp")
        .replace("token = \"t\"\n", "token = \"t\"\nrepos = [\"app\"]\n");
    assert_eq!(keys(&bad), vec!["github.enterprise", "github.enterprise"]);
}

#[test]
fn jobs_as_the_daemons_own_user_need_run_as_or_an_explicit_yes() {
    let pool = |extra: &str| {
        format!(
            "[github]\nowner = \"acme\"\ntoken = \"t\"\n[webhook]\nsecret = \"s\"\n\
             [providers.local]\ncommand = \"/bin/true\"\n{extra}\n"
        )
    };
    // Not root (the tests' environment): the job would be the daemon's own uid.
    let errors = problems(&pool(""));
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert_eq!(errors[0].key, "providers.local.run_as");
    assert!(errors[0].reason.contains("allow_same_user"), "{errors:?}");
    for fine in [
        "allow_same_user = true",
        "run_as = \"nobody\"",
        "allow_root = true",
    ] {
        assert!(problems(&pool(fine)).is_empty(), "{fine}");
    }
    // As root, saying yes to the same user is not saying yes to root.
    let root = Environment {
        as_root: true,
        ..Environment::default()
    };
    let errors = Config::from_toml_str(&pool("allow_same_user = true"), None, &root)
        .unwrap_err()
        .0;
    assert!(errors[0].reason.contains("allow_root"), "{errors:?}");
}

/// What the contract's defaults expose is said: /metrics on a webhook listener bound to every
/// address, and loopback admin reads where jobs run on the host as other users. A loopback
/// webhook, a metrics listener of its own or an admin socket silence them.
#[test]
fn what_the_defaults_expose_is_warned_about() {
    let with = |extra: &str| {
        let (hook, extra) = extra.split_once('|').unwrap_or(("", extra));
        let text = format!(
            "[github]\nowner = \"acme\"\ntoken = \"t\"\n[webhook]\nsecret = \"s\"\n{hook}\n\
             [providers.local]\ncommand = \"/usr/bin/runner\"\nmax_concurrent = 1\n\
             run_as = \"ci1\"\n{extra}"
        );
        Config::from_toml_str(&text, None, &env())
            .unwrap()
            .warnings()
    };
    let w = with("");
    assert!(w.iter().any(|w| w.starts_with("metrics.listen")), "{w:?}");
    assert!(
        w.iter()
            .any(|w| w.starts_with("admin.listen") && w.contains("providers.local")),
        "{w:?}"
    );
    let w = with(
        "[metrics]\nlisten = \"127.0.0.1:9090\"\n[admin]\nlisten = \"unix:/run/e/admin.sock\"\n",
    );
    assert!(
        !w.iter()
            .any(|w| w.starts_with("metrics.listen") || w.starts_with("admin.listen")),
        "{w:?}"
    );
    let w = with("listen = \"127.0.0.1:8080\"|");
    assert!(!w.iter().any(|w| w.starts_with("metrics.listen")), "{w:?}");
}

#[test]
fn release_checks_more_often_than_hourly_on_github_com_are_warned_about() {
    let with = |runner: &str| {
        let text = format!("{MINIMAL}\n[runner]\n{runner}\n");
        Config::from_toml_str(&text, None, &env())
            .unwrap()
            .warnings()
    };
    let said = |w: Vec<String>| {
        w.iter()
            .any(|w| w.starts_with("runner.release_check_interval"))
    };
    assert!(said(with("release_check_interval = \"5m\"")));
    assert!(!said(with("release_check_interval = \"1h\"")));
    assert!(!said(with(
        "release_check_interval = \"5m\"\nreleases_url = \"https://mirror.example/runner/releases\""
    )));
}

/// `runner.releases_url` over plain http to another host is refused (the archive and its
/// checksum come on the same path); loopback, https, or `github.allow_insecure` pass.
#[test]
fn the_runner_s_releases_come_over_https_or_loopback() {
    let base = "[github]\nowner = \"acme\"\ntoken = \"t\"\n{github}\n[webhook]\nsecret = \"s\"\n\
                [runner]\nreleases_url = \"{url}\"\n";
    for (url, github, ok) in [
        ("http://mirror.example/runner/releases", "", false),
        ("https://mirror.example/runner/releases", "", true),
        ("http://127.0.0.1:8080/releases", "", true),
        ("http://localhost/releases", "", true),
        (
            "http://mirror.example/runner/releases",
            "allow_insecure = true",
            true,
        ),
    ] {
        let text = base.replace("{url}", url).replace("{github}", github);
        let bad: Vec<_> = match Config::from_toml_str(&text, None, &env()) {
            Ok(_) => Vec::new(),
            Err(e) => {
                e.0.into_iter()
                    .filter(|p| p.key == "runner.releases_url")
                    .collect()
            }
        };
        assert_eq!(bad.is_empty(), ok, "{url} {github}: {bad:?}");
    }
}

/// A pinned `runner.runner_version` older than the oldest runner GitHub registers (2.329.0
/// since 2026) is refused with its key; 2.329.0 and later, or `latest`, pass.
#[test]
fn a_pinned_runner_github_would_refuse_is_refused() {
    for (pin, ok) in [
        ("2.328.0", false),
        ("v2.300.1", false),
        ("2.329.0", true),
        ("latest", true),
    ] {
        let text = format!(
            "[github]\nowner = \"acme\"\ntoken = \"t\"\n[webhook]\nsecret = \"s\"\n\
             [runner]\nrunner_version = \"{pin}\"\n"
        );
        let bad: Vec<_> = problems(&text)
            .into_iter()
            .filter(|p| p.key == "runner.runner_version")
            .collect();
        assert_eq!(bad.is_empty(), ok, "{pin}: {bad:?}");
        if !ok {
            assert!(bad[0].reason.contains("older than 2.329.0"), "{bad:?}");
        }
    }
}
