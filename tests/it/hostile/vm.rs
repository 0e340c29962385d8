//! The corpus against `linux_vm` pools (QEMU under TCG): each job's script, served by the test
//! from its stand-in "internet", runs as root in the guest before its stand-in runner.

use std::{
    io::{Read, Write},
    net::Ipv4Addr,
    os::unix::fs::PermissionsExt,
    sync::{Arc, Mutex},
    time::Duration,
};

use super::{Found, record};
use crate::{
    linux_vm::{KillVms, vm_logs},
    support::{self, daemon::Daemon, netns::TestHost, vm},
};

const KIND: &str = "linux_vm";
const LABELS: &[&str] = &["self-hosted", "linux", "vm"];

/// Serves `GET /attack` (the current script) and anything else with a word, on `listener`,
/// from a thread of its own, for as long as the process lives.
fn serve(listener: std::net::TcpListener, script: Arc<Mutex<String>>, word: &'static str) {
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let mut stream = stream;
            let mut buf = [0u8; 2048];
            let n = stream.read(&mut buf).unwrap_or(0);
            let body = if String::from_utf8_lossy(&buf[..n]).starts_with("GET /attack") {
                script.lock().unwrap().clone()
            } else {
                word.to_string()
            };
            let _ = write!(
                stream,
                "HTTP/1.0 200 OK\r\nContent-Length: {}\r\n\r\n{body}",
                body.len()
            );
        }
    });
}

/// A service listening on every address of this host, as a database or an engine API might.
fn host_service() -> u16 {
    let listener = std::net::TcpListener::bind("0.0.0.0:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let mut s = stream;
            let _ = s.write_all(b"host service\n");
        }
    });
    port
}

/// This host's addresses other than loopback (a VM must reach none of them).
fn host_addresses() -> Vec<String> {
    let out = std::process::Command::new("ip")
        .args(["-4", "-o", "addr", "show", "scope", "global"])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            l.split_whitespace()
                .nth(3)?
                .split('/')
                .next()
                .map(String::from)
        })
        .filter(|a| !a.starts_with("198.51.100.") && !a.starts_with("203.0.113."))
        .collect()
}

/// Findings 2 and the egress boundary: a guest connects to the host's loopback services (the
/// admin API, the webhook listener, one on every address) through 10.0.2.2, to the host's own
/// addresses, and to the cloud metadata address. One boot per daemon: both attacks in it.
async fn network(weaken: &str) -> (Found, Found) {
    let Some(image) = vm::image() else {
        return (Found::refused("no VM here"), Found::refused("no VM here"));
    };
    let Some(internet) = TestHost::internet() else {
        return (
            Found::refused("no namespaces"),
            Found::refused("no namespaces"),
        );
    };
    let _one_metadata_host = support::netns::METADATA.lock().await;
    let Some(metadata) = TestHost::at_address("etm", Ipv4Addr::new(169, 254, 169, 254)) else {
        return (
            Found::refused("no namespaces"),
            Found::refused("no namespaces"),
        );
    };
    serve(metadata.listen(80), Arc::default(), "instance credentials");
    let standin = support::netns::standin_on(&internet, 500);
    let script = Arc::new(Mutex::new(String::new()));
    let attacks = internet.listen(0);
    let url = format!(
        "http://{}:{}",
        internet.addr,
        attacks.local_addr().unwrap().port()
    );
    serve(attacks, script.clone(), "");
    let env: Vec<(&str, &str)> = if weaken.is_empty() {
        Vec::new()
    } else {
        vec![("EPHEMER_TEST_WEAKEN", weaken)]
    };
    let pool = vm::pool(
        "linux_vm",
        &image,
        1,
        "180s",
        &format!(
            "runner_command = \"/opt/actions-runner/hostile.sh\"\nenv = {{ HOSTILE_URL = \"{url}\" }}"
        ),
    );
    let daemon = Daemon::start_with_env(&standin, "", &pool, &env).await;
    let _vms = KillVms(daemon.prefix());
    let config = std::fs::read_to_string(&daemon.config).unwrap();
    let admin = config
        .lines()
        .skip_while(|l| l.trim() != "[admin]")
        .find_map(|l| {
            l.trim()
                .strip_prefix("listen = \"127.0.0.1:")?
                .trim_end_matches('"')
                .parse::<u16>()
                .ok()
        })
        .unwrap();
    let webhook: u16 = daemon.addr.rsplit(':').next().unwrap().parse().unwrap();
    let everywhere = host_service();
    let mut targets = vec![
        format!("10.0.2.2:{admin}"),
        format!("10.0.2.2:{webhook}"),
        format!("10.0.2.2:{everywhere}"),
        format!("{}:{everywhere}", internet.gateway),
    ];
    targets.extend(host_addresses().iter().map(|a| format!("{a}:{everywhere}")));
    *script.lock().unwrap() = format!(
        r#"got=none
for t in {targets}; do
    if echo | nc -w 3 "${{t%:*}}" "${{t#*:}}" >/dev/null 2>&1; then got="$got,$t"; fi
done
echo "RESULT host-$got"
if echo | nc -w 3 169.254.169.254 80 >/dev/null 2>&1; then echo "RESULT metadata-reached"; else echo "RESULT metadata-refused"; fi
"#,
        targets = targets.join(" ")
    );
    standin.queue_jobs("app", LABELS, 1);
    daemon
        .wait_completed(&standin, 1, Duration::from_secs(300))
        .await;
    let mut said = String::new();
    for _ in 0..60 {
        said = vm_logs(&daemon).join("\n");
        if said.contains("RESULT metadata-") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let _ = daemon.stop(Duration::from_secs(120)).await;
    standin.stop().await;
    let host = said
        .lines()
        .find_map(|l| l.split("RESULT host-").nth(1))
        .map(|s| s.trim().to_string());
    let host = match host {
        Some(got) if got == "none" => Found::refused("no host service or address answered"),
        Some(got) => Found::got(format!(
            "reached {}",
            got.trim_start_matches("none,").replace(',', " ")
        )),
        None => Found::refused(format!("the guest said nothing (consoles: {})", said.len())),
    };
    let meta = if said.contains("RESULT metadata-reached") {
        Found::got("169.254.169.254 answered")
    } else if said.contains("RESULT metadata-refused") {
        Found::refused("169.254.169.254 out of reach")
    } else {
        Found::silent("the guest said nothing")
    };
    (host, meta)
}

/// Finding 4: a qcow2 image a job user owns and may write, whose backing file is a root-only
/// file (the host's shadow file in the review): root's overlay would read it through the chain.
async fn image_chain(weaken: &str) -> Found {
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let secret = support::write_file(dir.path(), "shadow", "root:$6$secret:19000:0:99999:7:::\n");
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).unwrap();
    let image = dir.path().join("chain.qcow2");
    let made = std::process::Command::new("qemu-img")
        .args(["create", "-q", "-f", "qcow2", "-F", "raw", "-b"])
        .arg(&secret)
        .arg(&image)
        .status()
        .unwrap();
    assert!(made.success(), "qemu-img create");
    let user = nix::unistd::User::from_name("ephemer-hostile1")
        .unwrap()
        .unwrap();
    std::os::unix::fs::chown(&image, Some(user.uid.as_raw()), None).unwrap();
    std::fs::set_permissions(&image, std::fs::Permissions::from_mode(0o666)).unwrap();
    let pool = vm::pool("linux_vm", &image, 1, "30s", "");
    let (code, err) = super::check_config(dir.path(), &pool, weaken).await;
    if code == 0 {
        Found::got("accepted: every VM's overlay would read the root-only file through it")
    } else if err.contains("providers.linux_vm.image") {
        Found::refused("check-config refuses it, naming the image")
    } else {
        Found::refused(format!("check-config said {code}: {}", err.trim()))
    }
}

/// The corpus on `linux_vm`.
pub(super) async fn all() {
    if vm::image().is_none() {
        return;
    }
    let (host_weak, meta_weak) = network("vm-network").await;
    let (host_real, meta_real) = network("").await;
    record("host_services", KIND, "vm-network", host_weak, host_real);
    record("metadata", KIND, "vm-network", meta_weak, meta_real);
    record(
        "image_chain",
        KIND,
        "image-check",
        image_chain("image-check").await,
        image_chain("").await,
    );
}
