//! The Debian package, installed for real and run as its unit runs it: a new operator's path.
//!
//! `dpkg -i` the built package (its postinst creates the `run_as` users), put a stand-in
//! actions/runner install where the package's config says (`runner_dir`), fill in the
//! package's config as its comments say (the owner, GitHub's API URL: the stand-in's) and the
//! secrets in `/etc/ephemer-actors/env`, then run `ExecStartPre` and `ExecStart` the way the
//! installed unit does, without systemd: every `[Service]` key is either applied (`UMask`,
//! `StateDirectory` with its mode, `EnvironmentFile`, `LimitNOFILE`, `PrivateTmp`,
//! `ProtectSystem=full`, `ProtectKernelTunables` and `ProtectHostname` through a mount and UTS
//! namespace, `Type=notify` on a socket of the test's) or listed as not reproducible here, and a
//! key the test does not know fails it, so a new hardening line is never silently untested.
//! Four jobs run on the two users; `KillSignal` drains it; `dpkg -r` leaves no process of those
//! users, and `dpkg -P` removes the state.
//!
//! It changes the machine (a package, two users, `/opt/actions-runner`), so it is ignored by
//! default; `.ci/run` builds the package and runs it with `EPHEMER_DEB` set.

use std::{
    collections::BTreeMap,
    os::unix::{fs::PermissionsExt, net::UnixDatagram},
    path::{Path, PathBuf},
    process::Stdio,
    time::Duration,
};

use github_standin::Standin;

use crate::support::{self, provision::eventually};

const UNIT: &str = "/lib/systemd/system/ephemer-actors.service";
const CONFIG: &str = "/etc/ephemer-actors/config.toml";
const ENV: &str = "/etc/ephemer-actors/env";
const RUNNER_DIR: &str = "/opt/actions-runner";
const STATE: &str = "/var/lib/ephemer-actors";
const SECRET: &str = "package-test-secret";
const USERS: [&str; 2] = ["ephemer-runner1", "ephemer-runner2"];

/// What the test does with each `[Service]` key of the unit.
#[derive(Debug, PartialEq)]
enum Key {
    /// Reproduced (how).
    Applied,
    /// Cannot be reproduced without systemd (why).
    NotHere(&'static str),
}

fn known(key: &str) -> Option<Key> {
    use Key::*;
    Some(match key {
        "Type"
        | "NotifyAccess"
        | "WatchdogSec"
        | "ExecStartPre"
        | "ExecStart"
        | "EnvironmentFile"
        | "KillSignal"
        | "TimeoutStopSec"
        | "KillMode"
        | "StateDirectory"
        | "StateDirectoryMode"
        | "UMask"
        | "LimitNOFILE"
        | "ProtectSystem"
        | "PrivateTmp"
        | "ProtectKernelTunables"
        | "ProtectHostname" => Applied,
        "Restart" | "RestartSec" => NotHere("no crash is expected; a restart is systemd's"),
        "ProtectKernelModules" => NotHere("a seccomp filter and an inaccessible /usr/lib/modules"),
        "ProtectKernelLogs" => NotHere("a seccomp filter on syslog(2)"),
        "ProtectClock" => NotHere("a seccomp filter on the clock syscalls"),
        "RestrictRealtime" => NotHere("a seccomp filter on sched_setscheduler"),
        "LockPersonality" => NotHere("a seccomp filter on personality(2)"),
        _ => return None,
    })
}

/// The `[Service]` keys of a unit file (a key given twice keeps its last value).
fn service_keys(text: &str) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut in_service = false;
    for line in text.lines().map(str::trim) {
        if line.starts_with('[') {
            in_service = line == "[Service]";
            continue;
        }
        if !in_service || line.is_empty() || line.starts_with('#') || line.starts_with(';') {
            continue;
        }
        let (k, v) = line.split_once('=').expect("a unit line is KEY=VALUE");
        out.insert(k.trim().to_string(), v.trim().to_string());
    }
    out
}

async fn run(cmd: &str, args: &[&str]) -> (i32, String) {
    let out = tokio::process::Command::new(cmd)
        .args(args)
        .output()
        .await
        .unwrap_or_else(|e| panic!("{cmd}: {e}"));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code().unwrap_or(-1), text)
}

/// The answer to `GET path` at `addr`, head and body.
fn http_get(addr: &str, path: &str) -> String {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(addr).unwrap_or_else(|e| panic!("{addr}: {e}"));
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut answer = String::new();
    let _ = stream.read_to_string(&mut answer);
    answer
}

/// The package's config, filled in as its comments say: GitHub's API URL (a GHES's, here the
/// stand-in's) beside the owner it already names.
fn fill_in_config(standin: &Standin) {
    let text = std::fs::read_to_string(CONFIG).unwrap();
    assert!(
        text.contains("# api_url ="),
        "the package's config says where GitHub's API URL goes:\n{text}"
    );
    let text = text.replacen(
        "# api_url =",
        &format!("api_url = \"{}\" #", standin.url()),
        1,
    );
    std::fs::write(CONFIG, text).unwrap();
    std::fs::write(
        ENV,
        format!(
            "GITHUB_TOKEN={}\nEPHEMER_WEBHOOK_SECRET={SECRET}\n",
            support::daemon::TOKEN
        ),
    )
    .unwrap();
    std::fs::set_permissions(ENV, std::fs::Permissions::from_mode(0o600)).unwrap();
}

/// `KEY=value` lines of an environment file.
fn environment_file(path: &str) -> Vec<(String, String)> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter(|l| !l.trim().is_empty() && !l.trim_start().starts_with('#'))
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect()
}

/// A command line of the unit (`ExecStart=`), run in the unit's sandbox: its own mount and
/// UTS namespaces with `ProtectSystem=full`, `PrivateTmp` and `ProtectKernelTunables` mounted,
/// then `UMask` and `LimitNOFILE`, then the command.
fn sandboxed(unit: &BTreeMap<String, String>, line: &str) -> tokio::process::Command {
    let argv: Vec<&str> = line
        .trim_start_matches(['-', '@', '+', '!'])
        .split_whitespace()
        .collect();
    let mut setup = String::from("set -e\n");
    if unit.get("ProtectSystem").map(String::as_str) == Some("full") {
        for dir in ["/usr", "/boot", "/efi", "/etc"] {
            if Path::new(dir).is_dir() {
                setup.push_str(&format!(
                    "mount --bind {dir} {dir}; mount -o remount,bind,ro {dir}\n"
                ));
            }
        }
    }
    if unit.get("PrivateTmp").map(String::as_str) == Some("yes") {
        setup.push_str("mount -t tmpfs tmpfs /tmp; mount -t tmpfs tmpfs /var/tmp\n");
    }
    if unit.get("ProtectKernelTunables").map(String::as_str) == Some("yes") {
        for dir in ["/proc/sys", "/sys"] {
            setup.push_str(&format!(
                "mount --bind {dir} {dir}; mount -o remount,bind,ro {dir}\n"
            ));
        }
    }
    if let Some(mask) = unit.get("UMask") {
        setup.push_str(&format!("umask {mask}\n"));
    }
    if let Some(n) = unit.get("LimitNOFILE") {
        // As far as this host lets a root without CAP_SYS_RESOURCE go (its hard limit).
        setup.push_str(&format!(
            "ulimit -n {n} 2>/dev/null || ulimit -n \"$(ulimit -H -n)\"\n"
        ));
    }
    setup.push_str("exec \"$@\"\n");
    let mut cmd = tokio::process::Command::new("unshare");
    cmd.args(["--mount", "--propagation", "private"]);
    if unit.get("ProtectHostname").map(String::as_str) == Some("yes") {
        cmd.arg("--uts");
    }
    cmd.args(["--", "sh", "-c", &setup, "sh"]).args(&argv);
    cmd.env_clear().env(
        "PATH",
        "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    );
    if let Some(file) = unit.get("EnvironmentFile") {
        cmd.envs(environment_file(file.trim_start_matches('-')));
    }
    cmd
}

/// Purges the package when the test ends, passed or not.
struct Purge;

impl Drop for Purge {
    fn drop(&mut self) {
        let _ = std::process::Command::new("dpkg")
            .args(["-P", "ephemer-actors"])
            .output();
        let _ = std::fs::remove_dir_all(RUNNER_DIR);
    }
}

fn uid_of(user: &str) -> u32 {
    nix::unistd::User::from_name(user)
        .unwrap()
        .unwrap_or_else(|| panic!("the package's postinst did not create {user}"))
        .uid
        .as_raw()
}

#[actix_rt::test]
#[ignore = "installs the package on this machine: .ci/run builds it and runs this with EPHEMER_DEB"]
async fn the_package_runs_jobs_as_installed() {
    let Some(deb) = std::env::var_os("EPHEMER_DEB").map(PathBuf::from) else {
        return support::skip("package", "EPHEMER_DEB names no built package (cargo deb)");
    };
    for tool in ["dpkg", "sudo", "unshare", "pgrep"] {
        if support::which(tool).is_none() {
            return support::skip("package", &format!("{tool} is not installed"));
        }
    }
    if !nix::unistd::geteuid().is_root() {
        return support::skip("package", "installing a package needs root");
    }

    // A fresh machine: nothing of an earlier run (whose edited config dpkg would keep).
    let _ = run("dpkg", &["-P", "ephemer-actors"]).await;
    let _purge = Purge;
    // As the README says: install the package, put an install at runner_dir, fill in the
    // config and the secrets.
    let (code, out) = run("dpkg", &["-i", deb.to_str().unwrap()]).await;
    assert_eq!(code, 0, "dpkg -i: {out}");
    let uids: Vec<u32> = USERS.iter().map(|u| uid_of(u)).collect();
    for deny in ["/etc/cron.deny", "/etc/at.deny"] {
        let text = std::fs::read_to_string(deny).unwrap_or_default();
        for user in USERS {
            assert!(
                text.lines().any(|l| l == user),
                "{deny} does not list {user}: a job could leave a schedule for the next"
            );
        }
    }
    let mode = std::fs::metadata(CONFIG).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "the config may hold secrets");
    assert!(Path::new("/usr/share/doc/ephemer-actors/alerts.yml").exists());
    let (code, out) = run("/usr/bin/ephemer-actors", &["--version"]).await;
    assert_eq!(code, 0, "{out}");
    let _ = std::fs::remove_dir_all(RUNNER_DIR);
    standin_runner::write_install(
        Path::new(RUNNER_DIR),
        Path::new("/usr/bin/ephemer-actors"),
        &["standin-runner"],
    )
    .unwrap();
    let standin = support::standin(1500);
    fill_in_config(&standin);

    // The unit, as installed: every key known.
    let unit = service_keys(&std::fs::read_to_string(UNIT).unwrap());
    let mut not_here = Vec::new();
    for key in unit.keys() {
        match known(key) {
            Some(Key::Applied) => {}
            Some(Key::NotHere(why)) => not_here.push(format!("{key} ({why})")),
            None => panic!(
                "the unit sets {key}={}: apply it in this test or list it as not reproducible",
                unit[key]
            ),
        }
    }
    println!(
        "package: unit keys not reproduced here: {}",
        not_here.join("; ")
    );
    // StateDirectory=, with its mode, as systemd makes it before every start.
    assert_eq!(
        unit.get("StateDirectory").map(String::as_str),
        Some("ephemer-actors")
    );
    std::fs::create_dir_all(STATE).unwrap();
    let mode = u32::from_str_radix(unit.get("StateDirectoryMode").unwrap(), 8).unwrap();
    std::fs::set_permissions(STATE, std::fs::Permissions::from_mode(mode)).unwrap();

    // ExecStartPre: check-config proves the runner paths as each run_as user.
    let (code, out) = {
        let o = sandboxed(&unit, &unit["ExecStartPre"])
            .output()
            .await
            .unwrap();
        (
            o.status.code(),
            format!(
                "{}{}",
                String::from_utf8_lossy(&o.stdout),
                String::from_utf8_lossy(&o.stderr)
            ),
        )
    };
    assert_eq!(code, Some(0), "ExecStartPre failed:\n{out}");

    // ExecStart, with the notify socket Type=notify needs.
    // Where systemd keeps its own (/run/systemd/notify): outside the unit's private /tmp.
    let sock_dir = tempfile::tempdir_in("/run").unwrap();
    let sock_path = sock_dir.path().join("notify");
    let notify = UnixDatagram::bind(&sock_path).unwrap();
    notify
        .set_read_timeout(Some(Duration::from_secs(60)))
        .unwrap();
    let log_path = sock_dir.path().join("daemon.log");
    let log = std::fs::File::create(&log_path).unwrap();
    let mut daemon = sandboxed(&unit, &unit["ExecStart"])
        .env("NOTIFY_SOCKET", &sock_path)
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let logs = || std::fs::read_to_string(&log_path).unwrap_or_default();
    let ready = tokio::task::spawn_blocking(move || {
        let mut buf = [0u8; 4096];
        loop {
            let n = notify.recv(&mut buf).ok()?;
            if String::from_utf8_lossy(&buf[..n])
                .lines()
                .any(|l| l == "READY=1")
            {
                return Some(notify);
            }
        }
    })
    .await
    .unwrap();
    assert!(ready.is_some(), "no READY=1 within a minute:\n{}", logs());

    // Four jobs on two run_as users.
    standin.send_webhooks_to("http://127.0.0.1:8080/webhook/github", SECRET);
    standin.queue_jobs("app", &["self-hosted", "linux"], 4);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(90);
    while standin.jobs_in("completed") < 4 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{} of 4 jobs ran: {:?}\n{}",
            standin.jobs_in("completed"),
            standin.jobs(),
            logs()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Each ran as one of the package's users (the stand-in runner logs its uid).
    let runner_logs: String = std::fs::read_dir(Path::new(STATE).join("logs"))
        .unwrap()
        .flatten()
        .map(|e| std::fs::read_to_string(e.path()).unwrap_or_default())
        .collect();
    let ran_as: Vec<u32> = runner_logs
        .lines()
        .filter_map(|l| l.split(" as uid ").nth(1))
        .filter_map(|u| u.trim().parse().ok())
        .collect();
    assert!(ran_as.len() >= 4, "{runner_logs}");
    assert!(
        ran_as.iter().all(|u| uids.contains(u)),
        "{ran_as:?} not in {uids:?}"
    );
    assert!(
        uids.iter().all(|u| ran_as.contains(u)),
        "both users ran jobs: {ran_as:?}"
    );

    // What the jobs' users and the public port see of the daemon: nothing. `status` works for
    // root over the admin socket in the 0700 state directory; nothing answers on the contract's
    // loopback admin port; /metrics is on loopback, not on the webhook port.
    let (code, out) = run("/usr/bin/ephemer-actors", &["status"]).await;
    assert_eq!(
        code, 0,
        "status as root, over the package's admin socket: {out}"
    );
    assert!(out.contains("local"), "{out}");
    let sock = Path::new(STATE).join("admin.sock");
    let mode = std::fs::metadata(&sock).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "{}", sock.display());
    let (code, out) = run(
        "sudo",
        &[
            "-n",
            "-u",
            USERS[0],
            "/usr/bin/ephemer-actors",
            "status",
            "--admin",
            "unix:/var/lib/ephemer-actors/admin.sock",
        ],
    )
    .await;
    assert_ne!(code, 0, "a job's user reached the admin API: {out}");
    assert!(
        std::net::TcpStream::connect("127.0.0.1:9091").is_err(),
        "the admin API also listens on loopback TCP"
    );
    assert!(http_get("127.0.0.1:8080", "/metrics").starts_with("HTTP/1.1 404"));
    let metrics = http_get("127.0.0.1:9090", "/metrics");
    assert!(
        metrics.starts_with("HTTP/1.1 200") && metrics.contains("ephemerd_"),
        "{metrics}"
    );

    // `systemctl stop`: KillSignal to the main process, a drain within TimeoutStopSec.
    assert_eq!(unit.get("KillSignal").map(String::as_str), Some("SIGTERM"));
    support::sigterm(&daemon);
    let stop: u64 = unit["TimeoutStopSec"].parse().unwrap();
    let status = tokio::time::timeout(Duration::from_secs(stop), daemon.wait())
        .await
        .expect("drained within TimeoutStopSec")
        .unwrap();
    assert_eq!(status.code(), Some(0), "{}", logs());
    assert!(
        standin.runners().is_empty(),
        "registrations left: {:?}",
        standin.runners()
    );

    // Removal leaves no process of the runner users; purge removes the state.
    let (code, out) = run("dpkg", &["-r", "ephemer-actors"]).await;
    assert_eq!(code, 0, "dpkg -r: {out}");
    for user in USERS {
        let (code, out) = run("ps", &["-o", "pid,ppid,stat,lstart,args", "-u", user]).await;
        assert_ne!(code, 0, "processes of {user} left after dpkg -r:\n{out}");
    }
    let (code, out) = run("dpkg", &["-P", "ephemer-actors"]).await;
    assert_eq!(code, 0, "dpkg -P: {out}");
    for gone in [STATE, "/var/lib/ephemer-actors-work", "/etc/ephemer-actors"] {
        eventually(
            &format!("{gone} removed by purge"),
            Duration::from_secs(5),
            || !Path::new(gone).exists(),
        )
        .await;
    }
    let _ = std::fs::remove_dir_all(RUNNER_DIR);
}
