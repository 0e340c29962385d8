//! What a Mac operator installs, checked here short of the link (docs/macos.md): the release
//! archive's recipe gathers every file it names, laid out as they install; the launchd plist is
//! well-formed XML with what launchd needs to run, restart and drain the daemon; the Mac config
//! it ships passes check-config.

use std::{collections::BTreeMap, path::Path, process::Command};

use crate::support;

/// A `<dict>`'s keys and their value nodes.
fn dict<'a, 'i>(node: roxmltree::Node<'a, 'i>) -> BTreeMap<String, roxmltree::Node<'a, 'i>> {
    let children: Vec<_> = node.children().filter(|n| n.is_element()).collect();
    assert!(children.len() % 2 == 0, "a dict of key and value pairs");
    children
        .chunks(2)
        .map(|kv| {
            assert_eq!(kv[0].tag_name().name(), "key");
            (kv[0].text().unwrap_or_default().to_string(), kv[1])
        })
        .collect()
}

fn text(node: roxmltree::Node<'_, '_>) -> String {
    assert_eq!(node.tag_name().name(), "string", "{node:?}");
    node.text().unwrap_or_default().to_string()
}

fn integer(node: roxmltree::Node<'_, '_>) -> u64 {
    assert_eq!(node.tag_name().name(), "integer", "{node:?}");
    node.text().unwrap_or_default().parse().unwrap()
}

#[test]
fn the_launchd_plist_runs_restarts_and_drains_the_daemon() {
    let xml =
        std::fs::read_to_string(support::repo_root().join("contrib/macos/ephemer-actors.plist"))
            .unwrap();
    // Apple's plists carry a DOCTYPE (a reference to Apple's DTD, no entities of its own).
    let options = roxmltree::ParsingOptions {
        allow_dtd: true,
        ..roxmltree::ParsingOptions::default()
    };
    let doc = roxmltree::Document::parse_with_options(&xml, options).expect("well-formed XML");
    assert!(xml.contains(r#"<!DOCTYPE plist PUBLIC "-//Apple//DTD PLIST 1.0//EN""#));
    let plist = doc.root_element();
    assert_eq!(plist.tag_name().name(), "plist");
    assert_eq!(plist.attribute("version"), Some("1.0"));
    let top = plist.children().find(|n| n.is_element()).unwrap();
    let keys = dict(top);
    assert_eq!(text(keys["Label"]), "ephemer-actors");
    let argv: Vec<String> = keys["ProgramArguments"]
        .children()
        .filter(|n| n.is_element())
        .map(text)
        .collect();
    assert_eq!(
        argv,
        [
            "/usr/local/bin/ephemer-actors",
            "serve",
            "--config",
            "/usr/local/etc/ephemer-actors/config.toml"
        ]
    );
    assert_eq!(keys["RunAtLoad"].tag_name().name(), "true");
    // Restarted after a crash, not after a clean stop.
    let keep_alive = dict(keys["KeepAlive"]);
    assert_eq!(keep_alive["SuccessfulExit"].tag_name().name(), "false");
    // The drain: the default shutdown_timeout (5m) and teardown (2m) before launchd's SIGKILL.
    assert!(integer(keys["ExitTimeOut"]) >= 420);
    assert_eq!(integer(keys["Umask"]), 0o077);
    assert_eq!(text(keys["UserName"]), "ephemer");
    let env = dict(keys["EnvironmentVariables"]);
    assert!(
        text(env["PATH"])
            .split(':')
            .any(|p| p == "/opt/homebrew/bin")
    );
    assert_eq!(
        text(env["CREDENTIALS_DIRECTORY"]),
        "/usr/local/etc/ephemer-actors/credentials"
    );
    // No secret in a file every user can read.
    for secret in [
        "GITHUB_TOKEN",
        "EPHEMER_WEBHOOK_SECRET",
        "EPHEMER_APP_PRIVATE_KEY",
    ] {
        assert!(!env.contains_key(secret), "{secret} in the plist");
    }
    for log in ["StandardOutPath", "StandardErrorPath"] {
        assert!(text(keys[log]).starts_with("/usr/local/var/log/ephemer-actors/"));
    }
    assert_eq!(
        integer(dict(keys["SoftResourceLimits"])["NumberOfFiles"]),
        65536
    );
}

#[test]
fn the_release_archive_gathers_every_file_laid_out_as_installed() {
    let out = tempfile::tempdir().unwrap();
    let binary = env!("CARGO_BIN_EXE_ephemer-actors");
    let made = Command::new("bash")
        .arg(support::repo_root().join("contrib/macos/make-archive"))
        .args([
            "--binary",
            binary,
            "--target",
            "aarch64-apple-darwin",
            "--out",
        ])
        .arg(out.path())
        .output()
        .unwrap();
    assert!(made.status.success(), "{made:?}");
    let version = env!("CARGO_PKG_VERSION");
    let name = format!("ephemer-actors-{version}-aarch64-apple-darwin");
    let archive = out.path().join(format!("{name}.tar.gz"));
    assert_eq!(
        String::from_utf8_lossy(&made.stdout).trim(),
        archive.display().to_string()
    );
    let unpacked = tempfile::tempdir().unwrap();
    let tar = Command::new("tar")
        .arg("-xzf")
        .arg(&archive)
        .arg("-C")
        .arg(unpacked.path())
        .status()
        .unwrap();
    assert!(tar.success());
    let top = unpacked.path().join(&name);
    for file in [
        "bin/ephemer-actors",
        "etc/ephemer-actors/config.toml",
        "Library/LaunchDaemons/ephemer-actors.plist",
        "share/man/man1/ephemer-actors.1",
        "share/doc/ephemer-actors/README.md",
        "share/doc/ephemer-actors/config.example.toml",
        "share/doc/ephemer-actors/alerts.yml",
        "share/doc/ephemer-actors/docs/macos.md",
    ] {
        assert!(top.join(file).is_file(), "{file} missing from the archive");
    }
    let mode = |f: &str| {
        std::os::unix::fs::PermissionsExt::mode(
            &std::fs::metadata(top.join(f)).unwrap().permissions(),
        ) & 0o777
    };
    assert_eq!(mode("bin/ephemer-actors"), 0o755);
    assert_eq!(mode("etc/ephemer-actors/config.toml"), 0o600);
    let man = std::fs::read_to_string(top.join("share/man/man1/ephemer-actors.1")).unwrap();
    assert!(
        man.contains(".TH ephemer-actors"),
        "{}",
        &man[..man.len().min(200)]
    );
    // The plist's program is where the archive's binary installs.
    let plist =
        std::fs::read_to_string(top.join("Library/LaunchDaemons/ephemer-actors.plist")).unwrap();
    assert!(plist.contains("<string>/usr/local/bin/ephemer-actors</string>"));

    // The recipe refuses what it cannot make, before making anything.
    let refused = Command::new("bash")
        .arg(support::repo_root().join("contrib/macos/make-archive"))
        .args([
            "--binary",
            binary,
            "--target",
            "x86_64-unknown-linux-gnu",
            "--out",
        ])
        .arg(out.path())
        .output()
        .unwrap();
    assert_eq!(refused.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&refused.stderr).contains("--target must be"));
}

#[test]
fn the_mac_config_it_ships_passes_check_config() {
    let config = support::repo_root().join("contrib/macos/config.toml");
    let out = Command::new(env!("CARGO_BIN_EXE_ephemer-actors"))
        .args(["check-config", "--config"])
        .arg(&config)
        .env("GITHUB_TOKEN", "ghp_test")
        .env("EPHEMER_WEBHOOK_SECRET", "hook")
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(said.contains("vm_macos (2 slots)"), "{said}");
    assert!(Path::new(&config).is_file());
}

/// `.ci/run` type-checks and lints the workspace for one Apple target (aarch64), which covers the
/// other (x86_64) only while no item is compiled for one architecture alone: `cfg!(target_arch
/// = ..)` in an expression is fine (both branches are checked on every target), a
/// `#[cfg(target_arch ..)]` item is not. An item that needs one must bring the second target
/// back into `.ci/run`'s Apple step.
#[test]
fn no_item_is_compiled_for_one_architecture_alone() {
    fn visit(dir: &Path, found: &mut Vec<String>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            if path.is_dir() {
                if name != "target" && !name.starts_with('.') {
                    visit(&path, found);
                }
            } else if name.ends_with(".rs") {
                let text = std::fs::read_to_string(&path).unwrap();
                for (n, line) in text.lines().enumerate() {
                    let attr = line.trim_start();
                    let is_attr = attr.starts_with("#[") || attr.starts_with("#![");
                    if is_attr && attr.contains("cfg") && attr.contains("target_arch") {
                        found.push(format!("{}:{}: {attr}", path.display(), n + 1));
                    }
                }
            }
        }
    }
    let mut found = Vec::new();
    visit(&support::repo_root(), &mut found);
    assert!(
        found.is_empty(),
        "items compiled for one architecture alone (.ci/run's Apple step checks aarch64 only):\n{}",
        found.join("\n")
    );
}
