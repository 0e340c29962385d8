//! `[providers.NAME.egress]`: every problem named by its key, a good table read as written, no
//! table an open pool (the fence still holds), a GHES target's host on the list.

use super::{pool_tests::HEAD, *};
use crate::config::HostOs;
use ephemer_decide::egress::allow::Mode;

fn load(pools: &str, os: HostOs) -> Result<Config, Vec<ConfigError>> {
    let env = Environment {
        host_os: os,
        ..Environment::default()
    };
    Config::from_toml_str(&format!("{HEAD}{pools}"), None, &env).map_err(|e| e.0)
}

#[test]
fn every_bad_egress_key_is_named_with_its_index() {
    let errs = load(
        r#"
        [providers.vm]
        kind = "linux_vm"
        enabled = false
        kernel = ""
        image = "/var/lib/ephemer-actors-images/runner.img"
        egress = { mode = "strict", allow = ["github.com", "*.*.example.com", "exa mple.com", "10.1.0.1/16"], allow_private = ["169.254.169.254", "8.8.8.0/24", "fd00::/8", "10.20.0.0/16"] }
        [providers.local]
        command = "/bin/true"
        allow_same_user = true
        "#,
        HostOs::Linux,
    )
    .unwrap_err();
    let keys: Vec<&str> = errs.iter().map(|e| e.key.as_str()).collect();
    assert_eq!(
        keys,
        [
            "providers.vm.egress.mode",
            "providers.vm.egress.allow[1]",
            "providers.vm.egress.allow[2]",
            "providers.vm.egress.allow[3]",
            "providers.vm.egress.allow_private[0]",
            "providers.vm.egress.allow_private[1]",
            "providers.vm.egress.allow_private[2]",
        ],
        "{errs:?}"
    );
    assert!(
        errs[0].reason.contains("\"allow-list\""),
        "{}",
        errs[0].reason
    );
    assert!(errs[4].reason.contains("metadata"), "{}", errs[4].reason);
}

#[test]
fn a_good_table_is_read_and_no_table_is_an_open_pool() {
    let c = load(
        r#"
        [providers.vm]
        kind = "linux_vm"
        enabled = false
        kernel = ""
        image = "/var/lib/ephemer-actors-images/runner.img"
        [providers.vm.egress]
        mode = "allow-list"
        allow = ["registry.npmjs.org", "*.pypi.org", "203.0.113.7"]
        allow_private = ["10.20.0.0/16"]
        [providers.other]
        kind = "local"
        command = "/bin/true"
        allow_same_user = true
        "#,
        HostOs::Linux,
    )
    .unwrap();
    let e = &c.providers.get("vm").unwrap().common.egress;
    assert_eq!(e.mode, Mode::AllowList);
    assert!(e.allow.allows_name("registry.npmjs.org"));
    assert!(e.allow.allows_name("files.pypi.org"));
    assert!(
        e.allow.allows_name("api.github.com"),
        "the runner's own hosts are added"
    );
    assert!(!e.allow.allows_name("evil.example"));
    assert!(e.allow.lists("203.0.113.7".parse().unwrap()));
    assert_eq!(e.private_ranges(), ["10.20.0.0/16"]);
    let open = &c.providers.get("other").unwrap().common.egress;
    assert_eq!(open.mode, Mode::Open);
    assert!(open.private_ranges().is_empty());
}

#[test]
fn a_list_with_no_mode_is_a_problem_and_a_mac_pool_stays_open() {
    let errs = load(
        r#"
        [providers.local]
        command = "/bin/true"
        allow_same_user = true
        egress = { allow = ["github.com"] }
        "#,
        HostOs::Linux,
    )
    .unwrap_err();
    assert_eq!(errs[0].key, "providers.local.egress.allow", "{errs:?}");
    let errs = load(
        r#"
        [providers.native_macos]
        command = "/bin/true"
        allow_same_user = true
        egress = { mode = "allow-list", allow = ["github.com"] }
        "#,
        HostOs::Macos,
    )
    .unwrap_err();
    assert_eq!(errs.len(), 1, "{errs:?}");
    assert_eq!(errs[0].key, "providers.native_macos.egress");
    assert!(
        errs[0].reason.contains("stays \"open\""),
        "{}",
        errs[0].reason
    );
    let errs = load(
        r#"
        [providers.linux]
        image = "localhost/runner:1"
        egress = { mode = "audit" }
        "#,
        HostOs::Linux,
    )
    .unwrap_err();
    assert_eq!(errs.len(), 1, "{errs:?}");
    assert_eq!(errs[0].key, "providers.linux.egress");
    for (pool, key) in [
        (
            "[providers.local]\ncommand = \"/bin/true\"\nallow_same_user = true",
            "providers.local.egress",
        ),
        (
            "[providers.linux]\nimage = \"localhost/runner:1\"",
            "providers.linux.egress",
        ),
    ] {
        let errs = load(
            &format!("{pool}\negress = {{ mode = \"audit\" }}\n"),
            HostOs::Linux,
        )
        .unwrap_err();
        assert_eq!(errs.len(), 1, "{errs:?}");
        assert_eq!(errs[0].key, key);
        assert!(
            errs[0].reason.contains("only linux_vm pools enforce it"),
            "{}",
            errs[0].reason
        );
    }
    let ok = load(
        r#"
        [providers.native_macos]
        command = "/bin/true"
        allow_same_user = true
        egress = { mode = "open" }
        "#,
        HostOs::Macos,
    );
    assert!(ok.is_ok(), "{ok:?}");
}

#[test]
fn a_ghes_target_s_host_is_allowed_in_place_of_github_com() {
    let c = Config::from_toml_str(
        r#"
        [github]
        owner = "acme"
        token = "ghp_filetoken"
        api_url = "https://ghes.corp.example/api/v3"
        [webhook]
        secret = "hooksecret"
        [providers.vm]
        kind = "linux_vm"
        enabled = false
        kernel = ""
        image = "/var/lib/ephemer-actors-images/runner.img"
        egress = { mode = "allow-list", allow = ["registry.npmjs.org"] }
        [providers.local]
        command = "/bin/true"
        allow_same_user = true
        "#,
        None,
        &Environment::default(),
    )
    .unwrap();
    let e = &c.providers.get("vm").unwrap().common.egress;
    assert!(e.allow.allows_name("ghes.corp.example"));
    assert!(e.allow.allows_name("registry.npmjs.org"));
    assert!(!e.allow.allows_name("github.com"));
}
