//! `[webhook]` validation of push and pull mode and of the redelivery keys.

use std::time::Duration;

use super::*;
use crate::config::WebhookMode;

/// A config with `webhook` as its `[webhook]` table.
fn load(webhook: &str) -> Result<Config, ConfigErrors> {
    let text = format!(
        "[github]\nowner = \"acme\"\ntoken = \"t\"\n[webhook]\n{webhook}\n[providers.local]\nenabled = true\nrunner_dir = \"/opt/actions-runner\"\nallow_same_user = true\n"
    );
    Config::from_toml_str(&text, None, &Environment::default())
}

fn keys(webhook: &str) -> Vec<String> {
    match load(webhook) {
        Ok(_) => Vec::new(),
        Err(e) => e.0.into_iter().map(|p| p.key).collect(),
    }
}

#[test]
fn push_mode_with_redelivery_is_the_default() {
    let c = load("secret = \"s\"").unwrap();
    let w = c.webhook;
    assert_eq!(w.mode, WebhookMode::Push);
    assert_eq!(w.poll_interval, Duration::from_secs(5));
    assert_eq!(w.poll_idle_interval, Duration::from_secs(30));
    assert!((w.poll_budget - 0.2).abs() < f64::EPSILON);
    assert_eq!(w.redeliver, None);
    assert_eq!(w.redeliver_interval, Duration::from_secs(120));
    assert_eq!((w.hook_id, w.public_url), (None, None));
}

#[test]
fn pull_mode_needs_no_secret_and_takes_a_percentage_budget() {
    let c = load("mode = \"pull\"\npoll_budget = \"35%\"\npoll_interval = \"2s\"").unwrap();
    assert!(c.webhook.pull());
    assert!((c.webhook.poll_budget - 0.35).abs() < 1e-9);
    assert_eq!(c.webhook.poll_idle_interval, Duration::from_secs(30));
    // Push mode still refuses to start without one.
    assert_eq!(keys(""), vec!["webhook.secret"]);
}

#[test]
fn every_bad_key_is_listed() {
    let bad = "secret = \"s\"\nmode = \"poll\"\npoll_interval = \"10s\"\npoll_idle_interval = \"5s\"\n\
               poll_budget = 1.5\nredeliver_interval = \"5s\"\nhook_id = -3\npublic_url = \"ci.example.com/hook\"";
    assert_eq!(
        keys(bad),
        vec![
            "webhook.poll_idle_interval",
            "webhook.poll_budget",
            "webhook.mode",
            "webhook.redeliver_interval",
            "webhook.hook_id",
            "webhook.public_url",
        ]
    );
}
