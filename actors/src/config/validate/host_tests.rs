//! What a Mac host refuses: pools of the Linux kinds (each with its key), and macOS guests
//! past Apple's two over all `vm_macos` pools.

use super::{pool_tests::HEAD, *};
use crate::config::HostOs;

fn problems(pools: &str, os: HostOs) -> Vec<ConfigError> {
    let env = Environment {
        host_os: os,
        ..Environment::default()
    };
    Config::from_toml_str(&format!("{HEAD}{pools}"), None, &env)
        .err()
        .map(|e| e.0)
        .unwrap_or_default()
}

const EVERY_KIND: &str = r#"
    [providers.local]
    command = "/bin/true"
    allow_same_user = true
    [providers.native_macos]
    command = "/bin/true"
    allow_same_user = true
    [providers.vm_macos]
    [providers.linux]
    image = "localhost/runner:1"
    [providers.linux_vm]
    kernel = "/var/lib/ephemer-actors-images/vmlinuz"
    image = "/var/lib/ephemer-actors-images/runner.img"
"#;

#[test]
fn a_mac_refuses_the_linux_kinds_by_their_kind_key_and_keeps_the_rest() {
    let errs = problems(EVERY_KIND, HostOs::Macos);
    let kinds: Vec<(&str, &str)> = errs
        .iter()
        .filter(|e| e.key.ends_with(".kind"))
        .map(|e| (e.key.as_str(), e.reason.as_str()))
        .collect();
    assert_eq!(kinds.len(), 2, "{errs:?}");
    assert!(
        kinds.iter().any(|(k, m)| *k == "providers.linux_vm.kind"
            && m.starts_with("linux_vm pools need a Linux host")),
        "{errs:?}"
    );
    assert!(
        kinds
            .iter()
            .any(|(k, m)| *k == "providers.linux.kind"
                && m.starts_with("linux pools need a Linux host")),
        "{errs:?}"
    );
    // The same file on Linux: no kind is refused.
    let linux = problems(EVERY_KIND, HostOs::Linux);
    assert!(!linux.iter().any(|e| e.key.ends_with(".kind")), "{linux:?}");
}

#[test]
fn macos_guests_are_counted_over_every_vm_macos_pool() {
    let two_pools = |a: usize, b: usize| {
        format!(
            "[providers.xcode15]\nkind = \"vm_macos\"\nmax_concurrent = {a}\n\
             [providers.xcode16]\nkind = \"vm_macos\"\nmax_concurrent = {b}\n"
        )
    };
    let keys = |text: &str| -> Vec<String> {
        problems(text, HostOs::Macos)
            .into_iter()
            .filter(|e| e.key.ends_with("max_concurrent"))
            .map(|e| e.key)
            .collect()
    };
    assert_eq!(keys(&two_pools(1, 1)), Vec::<String>::new());
    assert_eq!(keys(&two_pools(2, 1)), ["providers.xcode16.max_concurrent"]);
    // One pool past two is its own problem, said once.
    assert_eq!(keys(&two_pools(3, 1)), ["providers.xcode15.max_concurrent"]);
    // A disabled pool runs no VM.
    let off = two_pools(2, 2).replace(
        "[providers.xcode16]\n",
        "[providers.xcode16]\nenabled = false\n",
    );
    assert_eq!(keys(&off), Vec::<String>::new());
}
