//! The tart provisioner with a stand-in `tart` (and a stand-in or real `ssh`): a VM's life for
//! one job, and whose host key it must present before it gets a JIT config.

use std::{os::unix::fs::PermissionsExt, path::Path, process::Stdio, time::Duration};

use ephemer_actors_core::{
    config::HostKeys,
    provision::{
        Backend, ExitReason, Provision, RunnerEventKind,
        tart::{TartBackend, TartSettings},
    },
};

use crate::{
    provision::fake_runner,
    support::provision::{eventually, spec, supervise, wait_clean_exit},
};

/// How the stand-in `tart` behaves.
pub(crate) struct Guest<'a> {
    /// `tart ip` answers.
    pub(crate) boots: bool,
    /// `tart list` prints this.
    pub(crate) leftovers: &'a str,
    /// `tart exec` reaches a guest agent.
    pub(crate) agent: bool,
}

pub(crate) const GUEST: Guest<'static> = Guest {
    boots: true,
    leftovers: "[]",
    agent: true,
};

/// A real-looking ed25519 public key whose blob is made of `seed`.
pub(crate) fn public_key(seed: u8) -> String {
    use base64::Engine;
    let mut blob = vec![0, 0, 0, 11];
    blob.extend_from_slice(b"ssh-ed25519");
    blob.extend_from_slice(&[0, 0, 0, 32]);
    blob.extend_from_slice(&[seed; 32]);
    format!(
        "ssh-ed25519 {}",
        base64::engine::general_purpose::STANDARD.encode(blob)
    )
}

fn executable(path: &Path, text: &str) {
    std::fs::write(path, text).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

/// A stand-in `tart` in `dir`: `exec` prints `dir/vmkey-NAME` (the key that VM made for
/// itself), or fails when there is no guest agent.
fn fake_tart(dir: &Path, guest: &Guest<'_>) {
    let d = dir.display();
    executable(
        &dir.join("tart"),
        &format!(
            r#"#!/bin/bash
D={d}
echo "tart $*" >> $D/calls.log
name="${{@: -1}}"
case "$1" in
  clone|delete) exit 0 ;;
  run) while [ -d "$D" ] && [ ! -e "$D/stopped-$name" ]; do sleep 0.05; done; exit 0 ;;
  ip) if [ "{boots}" = "true" ]; then echo 127.0.0.1; else echo "no address" >&2; exit 1; fi ;;
  stop) touch "$D/stopped-$name"; exit 0 ;;
  list) echo '{leftovers}' ;;
  exec)
    [ "$2" = "--help" ] && exit 0
    [ "{agent}" = "true" ] || {{ echo "Error: guest agent is not running" >&2; exit 1; }}
    case "$*" in *Runner.Listener*) echo 2.330.0; exit 0 ;; esac
    cat "$D/vmkey-$2"; echo "$*" > "$D/exec-args-$2" ;;
esac
"#,
            boots = guest.boots,
            leftovers = guest.leftovers,
            agent = guest.agent,
        ),
    );
}

fn settings(dir: &Path, host_keys: HostKeys, boot: Duration) -> TartSettings {
    TartSettings {
        pool: "vm_macos".into(),
        env: Default::default(),
        tart: dir.join("tart"),
        ssh: dir.join("ssh"),
        base_image: "ghcr.io/cirruslabs/macos-base:latest".into(),
        ssh_user: "admin".into(),
        runner_command: "~/actions-runner/run.sh".into(),
        boot_timeout: boot,
        name_prefix: "ephemer-vm-macos-".into(),
        log_dir: dir.join("logs"),
        host_keys,
        run_args: Vec::new(),
        known_hosts: dir.join("known_hosts"),
        vm_hosts: dir.join("tart-hosts"),
    }
}

/// The stand-in `tart`, an `ssh` that records its argv, the pin it was held to and its stdin,
/// and an `ssh-keyscan` that reports the image's key.
pub(crate) fn tart_fixture(dir: &Path, guest: &Guest<'_>, host_keys: HostKeys) -> TartBackend {
    fake_tart(dir, guest);
    let d = dir.display();
    executable(
        &dir.join("ssh"),
        &format!(
            r#"#!/bin/bash
echo "ssh $*" >> {d}/calls.log
for a in "$@"; do case "$a" in UserKnownHostsFile=*) cp "${{a#*=}}" {d}/pin-seen-by-ssh ;; esac; done
cat > {d}/ssh-stdin
sleep 0.2
"#
        ),
    );
    executable(
        &dir.join("ssh-keyscan"),
        &format!(
            "#!/bin/bash\necho \"ssh-keyscan $*\" >> {d}/calls.log\necho '# 127.0.0.1:22 SSH-2.0'\necho \"${{@: -1}} {}\"\n",
            public_key(0)
        ),
    );
    TartBackend::new(settings(dir, host_keys, Duration::from_secs(120)))
}

/// What the stand-ins were called with, each `tart` call first checked against tart's own
/// command line (`tart_cli`, from tart's source): the stand-in accepts anything, tart would not.
pub(crate) fn calls(dir: &Path) -> Vec<String> {
    let calls: Vec<String> = std::fs::read_to_string(dir.join("calls.log"))
        .unwrap_or_default()
        .lines()
        .map(str::to_string)
        .collect();
    for call in calls.iter().filter_map(|c| c.strip_prefix("tart ")) {
        let argv: Vec<&str> = call.split(' ').collect();
        if let Err(why) = ephemer_decide::provision::tart_cli::check(&argv) {
            panic!("the daemon called `tart {call}`, which tart refuses: {why}");
        }
    }
    calls
}

pub(crate) fn position(calls: &[String], prefix: &str) -> usize {
    calls
        .iter()
        .position(|c| c.starts_with(prefix))
        .unwrap_or_else(|| panic!("no `{prefix}` in {calls:#?}"))
}

/// One job's VM: cloned, booted (with the pool's `run_args`), given host keys of its own through `tart exec`, held to that
/// key (and only that key) over ssh, then stopped and deleted, its pin with it. The next VM of
/// the same image is held to the key it made, not to the first one's.
#[actix_rt::test]
async fn vm_lifecycle_for_one_job() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let backend = TartBackend::new(TartSettings {
        run_args: vec!["--net-softnet".into()],
        ..tart_fixture(dir, &GUEST, HostKeys::PerVm)
            .settings()
            .clone()
    });
    let (sup, events) = supervise(backend.clone(), None);
    let runner = fake_runner("ephemer-vm-macos-abc12345");
    let n = &runner.name;
    std::fs::write(
        dir.join(format!("vmkey-{n}")),
        public_key(1) + " root@guest\n",
    )
    .unwrap();
    sup.send(Provision::now(spec(&runner, 1))).await.unwrap();
    wait_clean_exit(&events, n, Duration::from_secs(20)).await;
    let c = calls(dir);
    assert_eq!(c[0], "tart list --format json");
    let clone = position(
        &c,
        &format!("tart clone ghcr.io/cirruslabs/macos-base:latest {n}"),
    );
    let run = position(&c, &format!("tart run --no-graphics --net-softnet {n}"));
    let ip = position(&c, &format!("tart ip --wait 120 {n}"));
    let exec = position(&c, &format!("tart exec {n} sudo -n /bin/sh -c "));
    let ssh = position(&c, "ssh -o StrictHostKeyChecking=yes");
    let stop = position(&c, &format!("tart stop --timeout 30 {n}"));
    let delete = position(&c, &format!("tart delete {n}"));
    assert!(
        clone < run && clone < ip && ip < exec && exec < ssh && ssh < stop && stop < delete,
        "{c:#?}"
    );
    assert!(
        !c.iter().any(|l| l.starts_with("ssh-keyscan")),
        "a per-VM key is never learned from the network: {c:#?}"
    );
    let pin = dir.join("tart-hosts").join(n);
    assert!(
        c[ssh].contains(&format!("UserKnownHostsFile={}", pin.display()))
            && c[ssh].contains(&format!("HostKeyAlias={n}"))
            && c[ssh].contains("GlobalKnownHostsFile=/dev/null"),
        "{}",
        c[ssh]
    );
    assert_eq!(
        std::fs::read_to_string(dir.join("pin-seen-by-ssh")).unwrap(),
        format!("{n} {}\n", public_key(1)),
        "ssh is held to the key this VM made"
    );
    assert!(!pin.exists(), "the pin goes with the VM");
    let mode = std::fs::metadata(dir.join("tart-hosts"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o700);
    assert!(c[ssh].contains("admin@127.0.0.1"), "{}", c[ssh]);
    assert!(
        !c[ssh].contains("jit"),
        "the JIT config never goes on argv: {}",
        c[ssh]
    );
    assert_eq!(
        std::fs::read_to_string(dir.join("ssh-stdin")).unwrap(),
        "\njit",
        "it goes on stdin"
    );

    // The base image's runner version, asked of the VM through the same channel.
    assert!(
        c.iter().any(|l| l
            == &format!("tart exec {n} /bin/sh -c ~/actions-runner/bin/Runner.Listener --version")),
        "{c:#?}"
    );
    assert_eq!(
        backend
            .runner_version()
            .await
            .unwrap()
            .map(|v| v.to_string()),
        Some("2.330.0".to_string())
    );

    let second = fake_runner("ephemer-vm-macos-def67890");
    std::fs::write(
        dir.join(format!("vmkey-{}", second.name)),
        public_key(2) + "\n",
    )
    .unwrap();
    sup.send(Provision::now(spec(&second, 2))).await.unwrap();
    wait_clean_exit(&events, &second.name, Duration::from_secs(20)).await;
    assert_eq!(
        std::fs::read_to_string(dir.join("pin-seen-by-ssh")).unwrap(),
        format!("{} {}\n", second.name, public_key(2)),
    );
}

/// `host_keys = "image"` (for images without the guest agent): the image's key is learned once
/// with `ssh-keyscan` and every later VM of the image is held to it.
#[actix_rt::test]
async fn an_image_key_is_learned_once_and_required_after() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let (sup, events) = supervise(tart_fixture(dir, &GUEST, HostKeys::Image), None);
    for (i, name) in ["ephemer-vm-macos-img00001", "ephemer-vm-macos-img00002"]
        .into_iter()
        .enumerate()
    {
        sup.send(Provision::now(spec(&fake_runner(name), i as u64 + 1)))
            .await
            .unwrap();
        wait_clean_exit(&events, name, Duration::from_secs(20)).await;
    }
    let c = calls(dir);
    assert_eq!(
        c.iter().filter(|l| l.starts_with("ssh-keyscan")).count(),
        1,
        "{c:#?}"
    );
    assert!(
        !c.iter()
            .any(|l| l.starts_with("tart exec") && l.contains("ssh-keygen")),
        "no key is made in the VM: {c:#?}"
    );
    let known = dir.join("known_hosts");
    let alias = "ephemer-ghcr.io-cirruslabs-macos-base-latest";
    let ssh = position(&c, "ssh -o");
    assert!(
        c[ssh].contains(&format!("UserKnownHostsFile={}", known.display()))
            && c[ssh].contains(&format!("HostKeyAlias={alias}")),
        "{}",
        c[ssh]
    );
    assert_eq!(
        std::fs::read_to_string(&known).unwrap().trim(),
        format!("{alias} {}", public_key(0))
    );
    let mode = std::fs::metadata(&known).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600);
}

/// A VM whose guest agent never answers gets no JIT config: no ssh at all, the VM is removed
/// and the failure says what the image needs.
#[actix_rt::test]
async fn a_vm_that_cannot_make_its_own_key_gets_no_jit_config() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let guest = Guest {
        agent: false,
        ..GUEST
    };
    tart_fixture(dir, &guest, HostKeys::PerVm);
    let backend = TartBackend::new(settings(dir, HostKeys::PerVm, Duration::from_secs(2)));
    let (sup, events) = supervise(backend, None);
    let runner = fake_runner("ephemer-vm-macos-noagent1");
    sup.send(Provision::now(spec(&runner, 1))).await.unwrap();
    let failed = events
        .wait_for(&runner.name, Duration::from_secs(20), |k| {
            matches!(k, RunnerEventKind::Failed { .. })
        })
        .await;
    let why = format!("{failed:?}");
    assert!(
        why.contains("tart exec") && why.contains("guest agent is not running"),
        "{why}"
    );
    let c = calls(dir);
    assert!(
        c.iter().filter(|l| l.starts_with("tart exec")).count() >= 2,
        "tried again while the agent may still be starting: {c:#?}"
    );
    assert!(!c.iter().any(|l| l.starts_with("ssh")), "{c:#?}");
    let n = &runner.name;
    let stop = position(&c, &format!("tart stop --timeout 30 {n}"));
    let delete = position(&c, &format!("tart delete {n}"));
    assert!(stop < delete, "{c:#?}");
}

#[actix_rt::test]
async fn vm_boot_failure_cleans_up_and_reports() {
    let tmp = tempfile::tempdir().unwrap();
    let guest = Guest {
        boots: false,
        ..GUEST
    };
    let backend = tart_fixture(tmp.path(), &guest, HostKeys::PerVm);
    let (sup, events) = supervise(backend, None);
    let runner = fake_runner("ephemer-vm-macos-noboot1");
    sup.send(Provision::now(spec(&runner, 1))).await.unwrap();
    let failed = events
        .wait_for(&runner.name, Duration::from_secs(20), |k| {
            matches!(k, RunnerEventKind::Failed { .. })
        })
        .await;
    assert!(format!("{failed:?}").contains("did not boot"), "{failed:?}");
    let c = calls(tmp.path());
    let n = &runner.name;
    let ip = position(&c, &format!("tart ip --wait 120 {n}"));
    let stop = position(&c, &format!("tart stop --timeout 30 {n}"));
    let delete = position(&c, &format!("tart delete {n}"));
    assert!(ip < stop && stop < delete, "{c:#?}");
    assert!(
        !c.iter()
            .any(|l| l.starts_with("ssh") || l.starts_with("tart exec")),
        "no runner on a VM that did not boot"
    );
}

/// Leftover VMs of ours (and their pins) are removed at start-up; other VMs are not touched.
#[actix_rt::test]
async fn leftover_vms_are_removed_at_start_up() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let list = r#"[{"Name":"ephemer-vm-macos-old00001","State":"running"},{"Name":"someone-elses-vm","State":"stopped"}]"#;
    std::fs::create_dir_all(dir.join("tart-hosts")).unwrap();
    std::fs::write(dir.join("tart-hosts/ephemer-vm-macos-gone0001"), "x").unwrap();
    let guest = Guest {
        leftovers: list,
        ..GUEST
    };
    let backend = tart_fixture(dir, &guest, HostKeys::PerVm);
    let (_sup, _events) = supervise(backend, None);
    eventually(
        "the leftover to be deleted",
        Duration::from_secs(10),
        || {
            calls(dir)
                .iter()
                .any(|c| c == "tart delete ephemer-vm-macos-old00001")
                && !dir.join("tart-hosts/ephemer-vm-macos-gone0001").exists()
        },
    )
    .await;
    let c = calls(dir);
    assert_eq!(c[0], "tart list --format json");
    assert!(c.contains(&"tart stop --timeout 30 ephemer-vm-macos-old00001".to_string()));
    assert!(
        !c.iter()
            .any(|l| l.contains("someone-elses-vm") && !l.starts_with("tart list")),
        "{c:#?}"
    );
}

/// `doctor` on a tart pool: the base image in tart's list is fine; an OCI name not pulled yet
/// is a warning (the first clone pulls it); a local name that is not there is a failure. A
/// tart with `exec` passes the host-key check; the image's shared key is a warning.
#[actix_rt::test]
async fn doctor_looks_for_the_tart_base_image_and_the_host_key_channel() {
    use ephemer_actors_core::provision::Finding;
    let tmp = tempfile::tempdir().unwrap();
    let listed = r#"[{"Name":"ghcr.io/cirruslabs/macos-base:latest","Source":"OCI"}]"#;
    let guest = Guest {
        leftovers: listed,
        ..GUEST
    };
    let found = tart_fixture(tmp.path(), &guest, HostKeys::PerVm)
        .doctor_checks()
        .await;
    assert!(
        matches!(&found[..], [Finding::Ok(_), Finding::Ok(k)] if k.contains("tart exec")),
        "{found:?}"
    );
    let found = tart_fixture(tmp.path(), &GUEST, HostKeys::Image)
        .doctor_checks()
        .await;
    assert!(
        matches!(&found[..], [Finding::Warn(w), Finding::Warn(k)]
            if w.contains("tart pull") && k.contains("same ssh host key")),
        "{found:?}"
    );
    let local = TartBackend::new(TartSettings {
        base_image: "ci-base".into(),
        ..tart_fixture(tmp.path(), &GUEST, HostKeys::PerVm)
            .settings()
            .clone()
    });
    let found = local.doctor_checks().await;
    assert!(
        matches!(&found[..], [Finding::Fail(f), _] if f.contains("ci-base")),
        "{found:?}"
    );
    // A tart without `exec`.
    executable(
        &tmp.path().join("tart"),
        "#!/bin/sh\n[ \"$1\" = list ] && echo '[]' && exit 0\necho \"Error: Unexpected argument '$1'\" >&2; exit 64\n",
    );
    let found = tart_fixture_settings_only(tmp.path()).doctor_checks().await;
    assert!(
        matches!(&found[..], [_, Finding::Fail(k)] if k.contains("no `exec`")),
        "{found:?}"
    );
}

fn tart_fixture_settings_only(dir: &Path) -> TartBackend {
    TartBackend::new(settings(dir, HostKeys::PerVm, Duration::from_secs(120)))
}

// ----- a real sshd ---------------------------------------------------------------------------

/// The attack the per-VM key stops, with a real `ssh` and `sshd`: a sibling VM holds the image's
/// host key (it has root in its guest) and answers at the address of a VM that is booting. The
/// booting VM made a key of its own and the daemon learned it through `tart exec`, so ssh
/// refuses the sibling and the JIT config never leaves the host. The same VM presenting its own
/// key gets the JIT config.
#[actix_rt::test]
async fn a_sibling_holding_the_image_key_cannot_pose_as_a_booting_vm() {
    let sshd = Path::new("/usr/sbin/sshd");
    if !sshd.exists() || !nix::unistd::geteuid().is_root() {
        crate::support::skip(
            "real sshd host-key",
            "needs /usr/sbin/sshd (Debian's openssh-server) and root",
        );
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let keygen = |name: &str| {
        let ok = std::process::Command::new("ssh-keygen")
            .args(["-q", "-t", "ed25519", "-N", "", "-f"])
            .arg(dir.join(name))
            .status()
            .unwrap()
            .success();
        assert!(ok, "ssh-keygen {name}");
    };
    keygen("client");
    keygen("image_key");
    keygen("vm_key");
    std::fs::copy(dir.join("client.pub"), dir.join("authorized_keys")).unwrap();
    std::fs::create_dir_all("/run/sshd").unwrap();
    let port = crate::support::daemon::free_port();
    let d = dir.display();
    // The stand-in tart's `exec` reports the key the booting VM made for itself.
    fake_tart(dir, &GUEST);
    executable(
        &dir.join("ssh"),
        &format!(
            "#!/bin/sh\nexec /usr/bin/ssh -p {port} -i {d}/client -o IdentitiesOnly=yes \"$@\"\n"
        ),
    );
    let got = dir.join("got-jit");
    let mut tart = settings(dir, HostKeys::PerVm, Duration::from_secs(30));
    tart.ssh_user = "root".into();
    tart.runner_command = format!(
        "sh -c 'printf %s \"$ACTIONS_RUNNER_INPUT_JITCONFIG\" > {}'",
        got.display()
    );
    let (sup, events) = supervise(TartBackend::new(tart), None);

    for (round, (host_key, genuine)) in [("image_key", false), ("vm_key", true)]
        .into_iter()
        .enumerate()
    {
        let name = &format!("ephemer-vm-macos-ssh0000{round}");
        std::fs::copy(dir.join("vm_key.pub"), dir.join(format!("vmkey-{name}"))).unwrap();
        let config = dir.join("sshd_config");
        std::fs::write(
            &config,
            format!(
                "Port {port}\nListenAddress 127.0.0.1\nHostKey {d}/{host_key}\nPidFile {d}/sshd.pid\n\
                 AuthorizedKeysFile {d}/authorized_keys\nStrictModes no\nUsePAM no\n\
                 PermitRootLogin prohibit-password\nPasswordAuthentication no\n\
                 KbdInteractiveAuthentication no\n"
            ),
        )
        .unwrap();
        let mut server = tokio::process::Command::new(sshd)
            .args(["-D", "-e", "-f"])
            .arg(&config)
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        eventually("sshd to listen", Duration::from_secs(10), || {
            std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
        })
        .await;
        sup.send(Provision::now(spec(&fake_runner(name), round as u64 + 1)))
            .await
            .unwrap();
        let exit = events
            .wait_for(name, Duration::from_secs(30), |k| {
                matches!(k, RunnerEventKind::Exited { .. })
            })
            .await;
        let _ = server.kill().await;
        if genuine {
            assert_eq!(
                exit,
                RunnerEventKind::Exited {
                    code: Some(0),
                    reason: ExitReason::Exited,
                    detail: None,
                }
            );
            assert_eq!(std::fs::read_to_string(&got).unwrap(), "jit");
        } else {
            assert_eq!(
                exit,
                RunnerEventKind::Exited {
                    code: Some(255),
                    reason: ExitReason::Exited,
                    detail: None,
                },
                "ssh refuses the host with the image's key"
            );
            assert!(!got.exists(), "the sibling received the JIT config");
            let log = std::fs::read_to_string(dir.join(format!("logs/{name}.log"))).unwrap();
            assert!(log.contains("Host key verification failed"), "{log}");
        }
    }
}
