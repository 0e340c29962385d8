//! Named pools, their runner `env`, and the network settings (CA file, proxy).

use super::*;

pub(super) const HEAD: &str = r#"
    [github]
    owner = "acme"
    token = "ghp_filetoken"
    [webhook]
    secret = "hooksecret"
"#;

fn load(pools: &str, env: &Environment) -> Result<Config, Vec<ConfigError>> {
    Config::from_toml_str(&format!("{HEAD}{pools}"), None, env).map_err(|e| e.0)
}

/// Fails unless every key in `wanted` has a problem.
fn assert_has_keys(keys: &[String], wanted: &[&str]) {
    for key in wanted {
        assert!(keys.iter().any(|k| k == key), "{key} missing from {keys:?}");
    }
}

fn keys(pools: &str) -> Vec<String> {
    load(pools, &Environment::default())
        .err()
        .unwrap_or_default()
        .into_iter()
        .map(|e| e.key)
        .collect()
}

#[test]
fn pools_of_one_kind_sit_beside_an_old_style_table() {
    let c = load(
        r#"
        [providers.linux-slim]
        kind = "linux"
        image = "localhost/runner:slim"
        labels = ["self-hosted", "linux", "x64"]
        [providers.linux-gpu]
        kind = "linux"
        image = "localhost/runner:cuda"
        labels = ["self-hosted", "linux", "gpu"]
        devices = ["/dev/nvidia0", "nvidia.com/gpu=all"]
        max_concurrent = 1
        [providers.local]
        allow_same_user = true
        command = "/usr/bin/runner"
        "#,
        &Environment::default(),
    )
    .unwrap();
    let names: Vec<&str> = c
        .providers
        .enabled()
        .iter()
        .map(|p| p.name.as_str())
        .collect();
    assert_eq!(names, ["linux-gpu", "linux-slim", "local"]);
    let gpu = c.providers.get("linux-gpu").unwrap();
    assert_eq!(gpu.kind(), ProviderKind::Linux);
    assert_eq!(gpu.linux().unwrap().image, "localhost/runner:cuda");
    assert_eq!(gpu.linux().unwrap().mounts.devices.len(), 2);
    assert_eq!(gpu.common.max_concurrent, 1);
    assert_eq!(
        c.providers.get("local").unwrap().kind(),
        ProviderKind::Local
    );
}

#[test]
fn a_pool_needs_a_known_kind_and_only_its_kinds_keys() {
    let k = keys(
        r#"
        [providers.gpu]
        image = "x"
        [providers.mac]
        kind = "windows"
        [providers.slim]
        kind = "linux"
        runner_dir = "/opt/actions-runner"
        base_image = "x"
        [providers.local]
        allow_same_user = true
        kind = "linux"
        "#,
    );
    assert_has_keys(
        &k,
        &[
            "providers.gpu.kind",
            "providers.mac.kind",
            "providers.slim.runner_dir",
            "providers.slim.base_image",
            "providers.local.kind",
        ],
    );
}

#[test]
fn pools_whose_runner_names_collide_are_refused() {
    // `vm_macos` and `vm-macos` both name runners `<prefix>-vm-macos-...`: each pool reaps by
    // its prefix, so one would remove the other's VMs.
    let k = keys(
        r#"
        [providers.vm_macos]
        [providers.vm-macos]
        kind = "vm_macos"
        [providers."bad name"]
        kind = "local"
        command = "/bin/true"
        "#,
    );
    assert!(k.contains(&"providers.vm_macos".to_string()), "{k:?}");
    assert!(k.contains(&"providers.bad name".to_string()), "{k:?}");
}

#[test]
fn env_expands_the_daemons_variables_and_refuses_what_the_daemon_sets() {
    let mut env = Environment::default();
    env.vars
        .insert("NPM_TOKEN".into(), Secret::new("npm-secret"));
    env.vars
        .insert("GITHUB_TOKEN".into(), Secret::new("ghp_daemon"));
    let c = load(
        r#"
        [providers.local]
        allow_same_user = true
        command = "/usr/bin/runner"
        env = { NPM_TOKEN = "${NPM_TOKEN}", TEAM = "ci-$team", ACTIONS_RUNNER_HOOK_JOB_STARTED = "/opt/hooks/start.sh" }
        "#,
        &env,
    )
    .unwrap();
    let pool = c.providers.get("local").unwrap();
    let vars: Vec<(&str, &str)> = pool
        .common
        .env
        .iter()
        .map(|(k, v)| (k.as_str(), v.expose()))
        .collect();
    assert!(vars.contains(&("NPM_TOKEN", "npm-secret")));
    assert!(vars.contains(&("TEAM", "ci-$team")));
    assert!(vars.contains(&("ACTIONS_RUNNER_HOOK_JOB_STARTED", "/opt/hooks/start.sh")));
    assert!(
        !format!("{c:?}").contains("npm-secret"),
        "env values are secrets"
    );

    let problems = load(
        r#"
        [providers.local]
        allow_same_user = true
        command = "/usr/bin/runner"
        env = { ACTIONS_RUNNER_INPUT_JITCONFIG = "x", HOME = "/root", https_proxy = "http://p:1", GITHUB_TOKEN = "x", LEAK = "${GITHUB_TOKEN}", MISSING = "${NOT_SET}", OPEN = "${X", "1BAD" = "x" }
        "#,
        &env,
    )
    .unwrap_err();
    let k: Vec<String> = problems.iter().map(|e| e.key.clone()).collect();
    assert_has_keys(
        &k,
        &[
            "providers.local.env.ACTIONS_RUNNER_INPUT_JITCONFIG",
            "providers.local.env.HOME",
            "providers.local.env.https_proxy",
            "providers.local.env.GITHUB_TOKEN",
            "providers.local.env.LEAK",
            "providers.local.env.MISSING",
            "providers.local.env.OPEN",
            "providers.local.env.1BAD",
        ],
    );
    assert!(
        !problems.iter().any(|e| e.reason.contains("ghp_daemon")),
        "no problem quotes a value"
    );
}

#[test]
fn container_settings_are_checked_with_their_keys() {
    let k = keys(
        r#"
        [providers.linux]
        pull = "sometimes"
        volumes = ["cache:/cache", "/tmp/data:/data:ro", "relative:path", "a:b:c:d"]
        tmpfs = ["/tmp", "scratch"]
        shm_size = "12"
        devices = ["/dev/nvidia0", "gpu"]
        extra_hosts = ["ghe.internal:10.0.0.5", "nohost"]
        dns = ["10.0.0.53", "dns.corp"]
        docker_access = true
        socket = "tcp://127.0.0.1:2375"
        "#,
    );
    assert_has_keys(
        &k,
        &[
            "providers.linux.pull",
            "providers.linux.volumes[2]",
            "providers.linux.volumes[3]",
            "providers.linux.tmpfs[1]",
            "providers.linux.shm_size",
            "providers.linux.devices[1]",
            "providers.linux.extra_hosts[1]",
            "providers.linux.dns[1]",
            "providers.linux.docker_access",
        ],
    );
    assert!(
        !k.iter()
            .any(|k| k.contains("volumes[0]") || k.contains("volumes[1]")),
        "{k:?}"
    );
}

#[test]
fn the_proxy_comes_from_the_file_or_the_environment_and_never_shows_its_password() {
    let env = Environment {
        https_proxy: Some(Secret::new("http://alice:hunter2@proxy.corp:3128")),
        no_proxy: Some("localhost, .corp.example".into()),
        ..Environment::default()
    };
    let pools = "[providers.local]\ncommand = \"/bin/true\"\nallow_same_user = true\n";
    let c = load(pools, &env).unwrap();
    let proxy = c.github.proxy.as_ref().unwrap();
    assert_eq!(proxy.url.expose(), "http://alice:hunter2@proxy.corp:3128");
    assert_eq!(proxy.no_proxy, ["localhost", ".corp.example"]);
    assert!(!format!("{c:?}").contains("hunter2"));

    let text = format!(
        "{}{pools}",
        HEAD.replacen(
            "token = \"ghp_filetoken\"",
            "token = \"ghp_filetoken\"\n    proxy = \"socks5://bob:hunter2@proxy:1080\"",
            1
        )
    );
    let errs = Config::from_toml_str(&text, None, &env).unwrap_err().0;
    let e = errs
        .iter()
        .find(|e| e.key == "github.proxy")
        .expect("github.proxy");
    assert!(!e.reason.contains("hunter2"), "{e}");
}

#[test]
fn a_ca_file_must_hold_a_certificate() {
    let dir = tempfile::tempdir().unwrap();
    let empty = dir.path().join("empty.pem");
    std::fs::write(&empty, "not a pem\n").unwrap();
    let text = format!(
        "{}\n[providers.local]\ncommand = \"/bin/true\"\n",
        HEAD.replacen(
            "token = \"ghp_filetoken\"",
            &format!(
                "token = \"ghp_filetoken\"\n    ca_file = \"{}\"",
                empty.display()
            ),
            1
        )
    );
    let errs = Config::from_toml_str(&text, None, &Environment::default())
        .unwrap_err()
        .0;
    assert!(errs.iter().any(|e| e.key == "github.ca_file"), "{errs:?}");
}

/// A container pool may not bind what reaches the engine or the daemon (the engine's socket,
/// the state directory, the runners' directory, the config, the host's own trees) unless it
/// says `allow_host_paths = true`; a dangerous capability is warned about.
#[test]
fn binds_that_reach_the_engine_or_the_daemon_are_refused() {
    let pool = |volumes: &str, extra: &str| {
        format!(
            "[state]\ndir = \"/var/lib/ephemer-actors\"\n[providers.linux]\nimage = \"runner:1\"\n\
             socket = \"unix:///run/podman/podman.sock\"\nvolumes = [{volumes}]\n{extra}\n"
        )
    };
    let k = keys(&pool(
        r#""/run/podman:/run/podman", "/var/lib/ephemer-actors:/s", "/var/lib:/l", "/var/lib/ephemer-actors-work/x:/w", "/etc:/e", "/srv/cache:/cache", "/opt/data:/d", "/var/spool/cron:/c", "/tmp/ci-cache:/cache", "cache:/c""#,
        "",
    ));
    assert_eq!(
        k,
        [
            "providers.linux.volumes[0]",
            "providers.linux.volumes[1]",
            "providers.linux.volumes[2]",
            "providers.linux.volumes[3]",
            "providers.linux.volumes[4]",
            "providers.linux.volumes[5]",
            "providers.linux.volumes[6]",
            "providers.linux.volumes[7]",
        ],
        "a cache dir of its own and a named volume are fine; /srv, /opt and /var (the cron \
         spools) are the host's (issue 65, item 8)"
    );
    // An operator's install under /opt, bound read-only: fine; read-write: refused.
    let with_install = |volume: &str| {
        keys(&format!(
            "{}[providers.local]\nrunner_dir = \"/opt/actions-runner\"\nallow_root = true\n",
            pool(volume, "")
        ))
        .into_iter()
        .filter(|k| k.starts_with("providers.linux"))
        .collect::<Vec<_>>()
    };
    assert!(with_install(r#""/opt/actions-runner:/runner:ro""#).is_empty());
    assert_eq!(
        with_install(r#""/opt/actions-runner:/runner""#),
        ["providers.linux.volumes[0]"]
    );
    assert!(
        keys(&pool(
            r#""/run/podman:/run/podman""#,
            "allow_host_paths = true"
        ))
        .is_empty()
    );
    let c = load(
        &pool(r#""cache:/c""#, r#"cap_add = ["CHOWN", "SYS_ADMIN"]"#),
        &Environment::default(),
    )
    .unwrap();
    let warnings = c.warnings();
    assert!(
        warnings
            .iter()
            .any(|w| w.contains("providers.linux.cap_add") && w.contains("SYS_ADMIN")),
        "{warnings:?}"
    );
}

#[test]
fn a_vm_pool_holds_each_vm_to_its_own_host_key_unless_told_otherwise() {
    let vm = |toml: &str| {
        let c = load(toml, &Environment::default()).unwrap();
        let pool = c
            .providers
            .pools
            .iter()
            .find(|p| p.name.as_str() == "vm_macos");
        match pool.map(|p| &p.spec) {
            Some(PoolSpec::VmMacos(v)) => v.host_keys,
            other => panic!("{other:?}"),
        }
    };
    assert_eq!(vm("[providers.vm_macos]\n"), HostKeys::PerVm);
    assert_eq!(
        vm("[providers.vm_macos]\nhost_keys = \"image\"\n"),
        HostKeys::Image
    );
    let k = keys(
        "[providers.vm_macos]\nhost_keys = \"trust_me\"\nrun_args = [\"--net-softnet\", \"rm -rf\"]\n",
    );
    assert_eq!(
        k,
        vec![
            "providers.vm_macos.host_keys".to_string(),
            "providers.vm_macos.run_args".to_string()
        ]
    );
}

#[test]
fn warm_takes_a_count_or_windows_and_names_every_problem_with_its_key() {
    let c = load(
        r#"
        [providers.local]
        command = "/bin/true"
        max_concurrent = 8
        allow_root = true
        warm = { min = 1, time_zone = "Europe/Berlin", windows = [{ days = "mon-fri", hours = "08:00-19:00", min = 6 }] }
        warm_max_age = "30m"
        [providers.small]
        kind = "local"
        command = "/bin/true"
        allow_root = true
        warm = 2
        "#,
        &Environment::default(),
    )
    .unwrap();
    let local = c.providers.get("local").unwrap();
    assert_eq!(local.common.warm.min, 1);
    assert_eq!(local.common.warm.windows[0].min, 6);
    assert_eq!(
        (
            local.common.warm.windows[0].from,
            local.common.warm.windows[0].to
        ),
        (480, 1140)
    );
    assert_eq!(
        local.common.warm.max_age,
        std::time::Duration::from_secs(1800)
    );
    assert_eq!(c.providers.get("small").unwrap().common.warm.min, 2);

    let bad = keys(
        r#"
        [providers.local]
        command = "/bin/true"
        max_concurrent = 2
        allow_root = true
        warm = { min = 3, time_zone = "Mars/Olympus", windows = [{ days = "weekdays", hours = "19:00-08:00", min = 1 }, { days = "sat" }] }
        warm_max_age = "0s"
        [providers.mac]
        kind = "vm_macos"
        warm = 3
        "#,
    );
    assert_has_keys(
        &bad,
        &[
            "providers.local.warm.min",
            "providers.local.warm.time_zone",
            "providers.local.warm.windows[0].days",
            "providers.local.warm.windows[0].hours",
            "providers.local.warm.windows[1].min",
            "providers.local.warm_max_age",
            "providers.mac.warm",
        ],
    );
}

#[test]
fn warm_mode_is_booted_or_registered_and_registered_needs_org_level_targets() {
    let pool = r#"
        [providers.local]
        command = "/bin/true"
        max_concurrent = 4
        allow_root = true
        warm = 2
        warm_mode = "registered"
        "#;
    let c = load(pool, &Environment::default()).unwrap();
    let warm = &c.providers.get("local").unwrap().common.warm;
    assert_eq!(warm.mode, crate::config::WarmMode::Registered);
    assert!(warm.registered() && !warm.booted());

    assert_has_keys(
        &keys(&pool.replace("\"registered\"", "\"standby\"")),
        &["providers.local.warm_mode"],
    );
    // A repo-level target registers each runner in its job's repo: none can be made ahead.
    let repo_level = Config::from_toml_str(
        &format!(
            "{}{pool}",
            HEAD.replace(
                "owner = \"acme\"",
                "owner = \"acme\"\n    repos = [\"app\"]"
            )
        ),
        None,
        &Environment::default(),
    )
    .expect_err("refused")
    .0;
    let problem = repo_level
        .iter()
        .find(|e| e.key == "providers.local.warm_mode")
        .expect("named at warm_mode");
    assert!(problem.reason.contains("acme"), "{}", problem.reason);
}

/// `run_as` never names root or the daemon's own user without the explicit yes: each would
/// hand every job the daemon's credential and state (issue 52, item 3; before, both passed).
#[test]
fn run_as_refuses_root_and_the_daemons_own_user_without_a_yes() {
    let env = Environment {
        as_root: true,
        daemon_user: Some("ephemer".into()),
        // `useradd -o -u 0 toor`: root under another name (issue 65, item 7).
        users: crate::config::UserDb::Listed(
            [("toor".to_string(), 0), ("ci1".to_string(), 1001)].into(),
        ),
        ..Environment::default()
    };
    let pool = |users: &str, extra: &str| {
        format!(
            "[github]\nowner = \"acme\"\ntoken = \"t\"\n[webhook]\nsecret = \"s\"\n\
             [providers.local]\ncommand = \"/bin/true\"\nmax_concurrent = 2\nrun_as = {users}\n{extra}\n"
        )
    };
    let refused = |text: &str| -> Vec<String> {
        match Config::from_toml_str(text, None, &env) {
            Ok(_) => Vec::new(),
            Err(e) => {
                e.0.into_iter()
                    .filter(|p| p.key == "providers.local.run_as")
                    .map(|p| p.reason)
                    .collect()
            }
        }
    };
    let root = refused(&pool("[\"root\", \"ci1\"]", ""));
    assert!(
        root.len() == 1 && root[0].contains("lists root") && root[0].contains("allow_root"),
        "{root:?}"
    );
    let own = refused(&pool("[\"ci1\", \"ephemer\"]", ""));
    assert!(
        own.len() == 1
            && own[0].contains("the daemon's own user")
            && own[0].contains("allow_same_user"),
        "{own:?}"
    );
    let toor = refused(&pool("[\"toor\", \"ci1\"]", ""));
    assert!(
        toor.len() == 1 && toor[0].contains("uid is 0") && toor[0].contains("allow_root"),
        "{toor:?}"
    );
    assert!(refused(&pool("[\"toor\", \"ci1\"]", "allow_root = true")).is_empty());
    assert!(refused(&pool("[\"root\", \"ci1\"]", "allow_root = true")).is_empty());
    assert!(refused(&pool("[\"ci1\", \"ephemer\"]", "allow_same_user = true")).is_empty());
    assert!(refused(&pool("[\"ci1\", \"ci2\"]", "")).is_empty());
}

/// Two process pools listing the same users: check-config says the pools take turns with
/// them (issue 52, item 2; before, nothing was said and both pools handed out the same user).
#[test]
fn pools_sharing_run_as_users_are_warned_about() {
    let env = Environment {
        as_root: true,
        ..Environment::default()
    };
    let text = "[github]\nowner = \"acme\"\ntoken = \"t\"\n[webhook]\nsecret = \"s\"\n\
        [providers.a]\nkind = \"local\"\ncommand = \"/bin/true\"\nrun_as = [\"ci1\", \"ci2\"]\n\
        [providers.b]\nkind = \"local\"\ncommand = \"/bin/true\"\nrun_as = [\"ci2\", \"ci3\"]\n";
    let c = Config::from_toml_str(text, None, &env).unwrap();
    let shared: Vec<String> = c
        .warnings()
        .into_iter()
        .filter(|w| w.contains("also listed by"))
        .collect();
    assert_eq!(shared.len(), 1, "{shared:?}");
    assert!(
        shared[0].starts_with("providers.a.run_as: user ci2 is also listed by providers.b"),
        "{shared:?}"
    );
}

/// The review's bypasses (issue 52, item 5): binds were checked as text, so `..` and links
/// walked past the guard, `/usr`, `/home` and an operator's install read-write were not
/// guarded, and any device passed. Each is refused now with its key; a read-only bind of the
/// install, a cache directory and the allowed devices pass.
#[test]
fn binds_and_devices_are_judged_on_the_path_they_resolve_to() {
    let tmp = tempfile::tempdir().unwrap();
    let link = tmp.path().join("innocent");
    std::os::unix::fs::symlink("/etc", &link).unwrap();
    let state = tmp.path().join("state");
    let text = format!(
        "[state]\ndir = \"{state}\"\n\
         [providers.local]\nrunner_dir = \"/opt/actions-runner\"\nwork_root = \"/srv/jobs\"\n\
         [providers.linux]\nimage = \"runner:1\"\nsocket = \"unix:///run/podman/podman.sock\"\n\
         volumes = [\"/tmp/../etc:/x\", \"/tmp/../run/podman/podman.sock:/var/run/docker.sock\", \
         \"{state}/x/../../state:/s\", \"/usr:/usr:ro\", \"/home:/h\", \
         \"/opt/actions-runner:/r\", \"{link}:/l\", \"/srv/jobs/one:/j\", \"/:/host:ro\", \
         \"/opt/actions-runner:/r:ro\", \"/tmp/cache:/cache\", \"cache:/c\"]\n\
         devices = [\"/dev/sda\", \"/dev/mem\", \"/dev/kvm\", \"/dev/dri/renderD128\", \
         \"/dev/nvidia0\", \"nvidia.com/gpu=all\"]\n",
        state = state.display(),
        link = link.display(),
    );
    let env = Environment {
        as_root: true,
        ..Environment::default()
    };
    let linux_problems = |text: &str| -> Vec<String> {
        match Config::from_toml_str(text, None, &env) {
            Ok(_) => Vec::new(),
            Err(e) => {
                e.0.into_iter()
                    .filter(|p| p.key.starts_with("providers.linux"))
                    .map(|p| format!("{}: {}", p.key, p.reason))
                    .collect()
            }
        }
    };
    let refused = linux_problems(&text);
    let said = |key: &str| {
        refused
            .iter()
            .find(|r| r.starts_with(&format!("{key}: ")))
            .cloned()
            .unwrap_or_default()
    };
    let mut keys: Vec<&str> = refused
        .iter()
        .map(|r| r.split(": ").next().unwrap_or_default())
        .collect();
    keys.sort();
    let mut wanted: Vec<String> = ["devices[0]", "devices[1]"]
        .map(|d| format!("providers.linux.{d}"))
        .to_vec();
    wanted.extend((0..9).map(|i| format!("providers.linux.volumes[{i}]")));
    assert_eq!(keys, wanted, "{refused:#?}");
    assert!(said("providers.linux.volumes[0]").contains("/tmp/../etc (that is /etc)"));
    assert!(said("providers.linux.volumes[6]").contains("reaches /etc"));
    let open = text.replace("devices = [", "allow_host_paths = true\ndevices = [");
    assert_eq!(linux_problems(&open), Vec::<String>::new());
}

#[test]
fn a_linux_vm_pool_reads_every_key_and_says_each_problem_with_its_key() {
    let c = load(
        r#"
        [providers.linux_vm]
        enabled = false
        kernel = ""
        image = "/var/lib/ephemer-actors-images/runner.img"
        cpus = 2
        memory = "4GiB"
        disk = "20GiB"
        network = "user"
        accel = "kvm"
        labels = ["self-hosted", "linux", "x64", "vm"]
        max_concurrent = 2
        [providers.vms]
        kind = "linux_vm"
        image = "/srv/img/runner.qcow2"
        kernel = "/srv/vmlinuz"
        accel = "tcg"
        network = "none"
        memory = "512MiB"
        warm = 1
        warm_mode = "registered"
        "#,
        &Environment::default(),
    )
    .unwrap();
    let vm = |name: &str| match &c
        .providers
        .pools
        .iter()
        .find(|p| p.name.as_str() == name)
        .unwrap()
        .spec
    {
        PoolSpec::LinuxVm(v) => v.clone(),
        other => panic!("{other:?}"),
    };
    let contract = vm("linux_vm");
    assert_eq!(contract.kernel, None, "\"\": the host's cloud kernel");
    assert_eq!(
        (contract.cpus, contract.memory, contract.disk),
        (2, 4 << 30, 20 << 30)
    );
    assert_eq!(contract.network, crate::config::linux_vm::VmNetwork::User);
    assert_eq!(contract.accel, crate::config::linux_vm::Accel::Kvm);
    let vms = vm("vms");
    assert_eq!(
        vms.kernel.as_deref(),
        Some(std::path::Path::new("/srv/vmlinuz"))
    );
    assert_eq!(vms.accel, crate::config::linux_vm::Accel::Tcg);
    assert_eq!(vms.network, crate::config::linux_vm::VmNetwork::None);
    assert_eq!(vms.memory, 512 << 20);

    let bad = keys(
        r#"
        [providers.linux_vm]
        kernel = "vmlinuz"
        image = "runner.img"
        cpus = 1.5
        memory = "100MiB"
        disk = "10MiB"
        network = "bridge"
        accel = "hvf"
        boot_timeout = "0s"
        socket = "unix:///run/podman.sock"
        warm = 1
        "#,
    );
    assert_has_keys(
        &bad,
        &[
            "providers.linux_vm.kernel",
            "providers.linux_vm.image",
            "providers.linux_vm.cpus",
            "providers.linux_vm.memory",
            "providers.linux_vm.disk",
            "providers.linux_vm.network",
            "providers.linux_vm.accel",
            "providers.linux_vm.boot_timeout",
            "providers.linux_vm.socket",
        ],
    );
}
