//! `[[github.targets]]`: several owners, each its own credential, secret and weight.

use super::*;

const POOLS: &str =
    "[providers.local]\nrunner_dir = \"/opt/actions-runner\"\nallow_same_user = true\n";

fn load_with(text: &str, vars: &[(&str, &str)]) -> Result<Config, ConfigErrors> {
    let env = Environment {
        vars: vars
            .iter()
            .map(|(k, v)| (k.to_string(), Secret::new(*v)))
            .collect(),
        ..Environment::default()
    };
    Config::from_toml_str(&format!("{text}\n{POOLS}"), None, &env)
}

fn keys(text: &str) -> Vec<String> {
    match load_with(text, &[]) {
        Ok(_) => Vec::new(),
        Err(e) => e.0.into_iter().map(|p| p.key).collect(),
    }
}

#[test]
fn a_single_github_table_is_one_target_named_after_its_owner() {
    let c = load_with(
        "[github]\nowner = \"acme\"\ntoken = \"t\"\n[webhook]\nsecret = \"s\"",
        &[],
    )
    .unwrap();
    assert_eq!(c.targets.len(), 1);
    let t = &c.targets[0];
    assert_eq!((t.name.as_str(), t.weight), ("acme", 1));
    assert_eq!(t.webhook_secret.expose(), "s");
    assert!(!c.multi_target());
}

#[test]
fn targets_take_their_secrets_from_environment_references() {
    let text = r#"
[github]
api_url = "https://ghes.example.com/api/v3"
[[github.targets]]
owner = "acme"
token = "${ACME_TOKEN}"
webhook_secret = "${ACME_SECRET}"
weight = 3
[[github.targets]]
name = "tools"
owner = "acme-tools"
api_url = "https://api.github.com"
app_id = 1
installation_id = 2
private_key_path = "${NO_SUCH_KEY_FILE}"
[webhook]
secret = "shared"
"#;
    let err = load_with(text, &[("ACME_TOKEN", "tok-a"), ("ACME_SECRET", "sec-a")]).unwrap_err();
    let keys: Vec<&str> = err.0.iter().map(|p| p.key.as_str()).collect();
    // The key path names the target; the message names the variable, never a value.
    assert!(
        keys.contains(&"github.targets[1].private_key_path"),
        "{keys:?}"
    );
    assert!(err.to_string().contains("${NO_SUCH_KEY_FILE}"));
    assert!(!err.to_string().contains("tok-a"));

    let ok = text
        .replace("private_key_path = \"${NO_SUCH_KEY_FILE}\"\n", "")
        .replace("app_id = 1\ninstallation_id = 2\n", "token = \"tok-b\"\n");
    let c = load_with(&ok, &[("ACME_TOKEN", "tok-a"), ("ACME_SECRET", "sec-a")]).unwrap();
    assert!(c.multi_target());
    let [a, b] = &c.targets[..] else {
        panic!("two targets")
    };
    assert_eq!((a.name.as_str(), a.weight), ("acme", 3));
    assert_eq!(a.github.api_url, "https://ghes.example.com/api/v3");
    assert!(matches!(&a.github.auth, GithubAuth::Token(t) if t.expose() == "tok-a"));
    assert_eq!(a.webhook_secret.expose(), "sec-a");
    assert_eq!(
        (b.name.as_str(), b.github.owner.as_str()),
        ("tools", "acme-tools")
    );
    assert_eq!(b.github.api_url, "https://api.github.com");
    // webhook.secret is the default of a target without its own.
    assert_eq!(b.webhook_secret.expose(), "shared");
    assert_eq!(c.github.owner, "acme");
}

#[test]
fn every_target_problem_is_listed_with_its_key() {
    let text = r#"
[github]
owner = "stray"
[[github.targets]]
owner = "acme"
token = "t"
weight = 0
[[github.targets]]
owner = "ACME"
token = "t"
webhook_secret = "s"
[[github.targets]]
name = "bad name"
owner = "other"
[providers.linux]
enabled = false
targets = ["acme", "nobody"]
"#;
    assert_eq!(
        keys(text),
        vec![
            "github.owner",
            "github.targets[0].webhook_secret",
            "github.targets[0].weight",
            "github.targets[1]",
            "github.targets[2].token",
            "github.targets[2].name",
            "github.targets[2].webhook_secret",
            "providers.linux.targets[1]",
        ]
    );
}

#[test]
fn at_most_128_targets() {
    let targets = |n: usize| -> String {
        (0..n)
            .map(|i| format!("[[github.targets]]\nowner = \"org{i}\"\ntoken = \"t\"\nwebhook_secret = \"s\"\n"))
            .collect()
    };
    assert_eq!(keys(&targets(128)), Vec::<String>::new());
    assert_eq!(keys(&targets(129)), vec!["github.targets"]);
}

/// The host-wide keys of `[github]` are checked with targets too (and once, not per target).
#[test]
fn shared_network_keys_are_checked_with_targets() {
    let text = "[github]\nca_file = \"/no/such/ca.pem\"\nproxy = \"socks5://p:1080\"\n\
                [[github.targets]]\nowner = \"acme\"\ntoken = \"t\"\nwebhook_secret = \"s\"\n\
                [[github.targets]]\nowner = \"beta\"\ntoken = \"t\"\nwebhook_secret = \"s\"\n";
    assert_eq!(keys(text), vec!["github.ca_file", "github.proxy"]);
}

/// A variable a target's credential is read from is the daemon's own: a pool's `env` may
/// neither reference it (`LEAK = "${ORG_B_TOKEN}"` would hand org B's token to every job) nor
/// name it.
#[test]
fn a_pool_may_not_hand_a_targets_credential_to_its_runners() {
    let text = r#"
[[github.targets]]
owner = "acme"
token = "${ORG_A_TOKEN}"
[[github.targets]]
owner = "org-b"
token = "${ORG_B_TOKEN}"
webhook_secret = "${ORG_B_SECRET}"
[webhook]
secret = "shared"
[providers.jobs]
kind = "local"
command = "/bin/true"
allow_same_user = true
env = { LEAK = "${ORG_B_TOKEN}", HOOK = "x-${ORG_B_SECRET}", ORG_A_TOKEN = "mine", FINE = "${HOME}" }
"#;
    let vars = [
        ("ORG_A_TOKEN", "tok-a"),
        ("ORG_B_TOKEN", "tok-b"),
        ("ORG_B_SECRET", "sec-b"),
        ("HOME", "/root"),
    ];
    let err = load_with(text, &vars).unwrap_err();
    let mut keys: Vec<&str> = err.0.iter().map(|e| e.key.as_str()).collect();
    keys.sort();
    assert_eq!(
        keys,
        [
            "providers.jobs.env.HOOK",
            "providers.jobs.env.LEAK",
            "providers.jobs.env.ORG_A_TOKEN"
        ],
        "{err:?}"
    );
    assert!(
        !format!("{err:?}").contains("tok-b"),
        "the secret is never quoted"
    );
}
