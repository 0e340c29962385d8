//! What a job's user can reach of the daemon: run as an unprivileged user, the daemon is
//! non-dumpable (a process of the same user cannot read its environment or memory), and its
//! store and admin token are private to it from their creation.

use std::{os::unix::fs::PermissionsExt, path::Path, time::Duration};

use crate::support::{
    self,
    daemon::{Daemon, free_port},
    wait_for_http,
};

/// `cat PATH` as `uid`: (exit code, stderr).
async fn read_as(uid: u32, gid: u32, path: &str) -> (i32, String) {
    let out = tokio::process::Command::new("cat")
        .arg(path)
        .uid(uid)
        .gid(gid)
        .output()
        .await
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[actix_rt::test]
async fn a_process_of_the_daemons_own_user_cannot_read_its_environment() {
    if !nix::unistd::geteuid().is_root() {
        support::skip("security", "switching users needs root");
        return;
    }
    let nobody = nix::unistd::User::from_name("nobody").unwrap().unwrap();
    let (uid, gid) = (nobody.uid.as_raw(), nobody.gid.as_raw());
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let state = dir.path().join("state");
    std::fs::create_dir(&state).unwrap();
    nix::unistd::chown(&state, Some(nobody.uid), Some(nobody.gid)).unwrap();
    let (port, admin) = (free_port(), free_port());
    let config = support::write_file(
        dir.path(),
        "c.toml",
        &format!(
            "[github]\nowner = \"acme\"\napi_url = \"http://127.0.0.1:9\"\n\
             [webhook]\nlisten = \"127.0.0.1:{port}\"\nreconcile_interval = \"0s\"\n\
             [state]\ndir = \"{}\"\n[admin]\nlisten = \"127.0.0.1:{admin}\"\n\
             [providers.local]\ncommand = \"/bin/true\"\nallow_same_user = true\n",
            state.display()
        ),
    );
    let mut serve = support::daemon();
    serve
        .args(["serve", "--config"])
        .arg(&config)
        .env("GITHUB_TOKEN", "ghp_SECRET_IN_THE_ENVIRONMENT")
        .env("EPHEMER_WEBHOOK_SECRET", "hook")
        .uid(uid)
        .gid(gid)
        .kill_on_drop(true);
    let mut child = serve.spawn().unwrap();
    let up = wait_for_http(
        &format!("127.0.0.1:{port}"),
        "/healthz",
        Duration::from_secs(20),
    )
    .await;
    assert_eq!(up.map(|r| r.0), Some(200));
    let pid = child.id().unwrap();

    // A dumpable process of the same user is readable (the check can fail)...
    let mut sleeper = tokio::process::Command::new("sleep")
        .arg("30")
        .uid(uid)
        .gid(gid)
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let sleeper_env = format!("/proc/{}/environ", sleeper.id().unwrap());
    assert_eq!(read_as(uid, gid, &sleeper_env).await.0, 0);
    // ...the daemon is not.
    let (code, err) = read_as(uid, gid, &format!("/proc/{pid}/environ")).await;
    assert_ne!(code, 0, "the daemon's environment was readable");
    assert!(err.contains("Permission denied"), "{err}");

    for file in ["ephemer-actors.redb", "admin.token"] {
        let mode = std::fs::metadata(state.join(file))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o077, 0, "{file} is {mode:o}");
    }
    let _ = sleeper.start_kill();
    support::sigterm(&child);
    let status = tokio::time::timeout(Duration::from_secs(20), child.wait()).await;
    assert_eq!(status.unwrap().unwrap().code(), Some(0));
}

/// Users made for the probe below (system users without a home or a login shell).
const PROBE_USERS: [&str; 2] = ["ephemer-probe1", "ephemer-probe2"];

/// The "runner" of the probe test: a job's code. It tries to read what a job must not reach
/// (the daemon's environment, its config, store and admin token, and the environment of a
/// concurrent sibling runner, which holds that sibling's JIT config), writes what happened to
/// `<results>/<user>`, and meanwhile runs the stand-in runner so the job completes. Reading its
/// own runner's environment is the control: the same `cat` succeeds where access is allowed.
fn probe_script(results: &Path, config: &Path, state: &Path) -> String {
    format!(
        r#"#!/bin/sh
R='{results}'
out="$R/$(id -un)"
try() {{ if cat "$2" >/dev/null 2>&1; then echo "read $1" >> "$out"; else echo "denied $1" >> "$out"; fi; }}
try daemon-environ "/proc/$(cat "$R/daemon.pid")/environ"
try config '{config}'
try store '{state}/ephemer-actors.redb'
try admin-token '{state}/admin.token'
'{bin}' standin-runner &
runner=$!
try own-environ "/proc/$runner/environ"
i=0
while [ $i -lt 600 ]; do
  for d in /proc/[0-9]*; do
    [ "${{d#/proc/}}" = "$runner" ] && continue
    case "$(tr '\0' ' ' < "$d/cmdline" 2>/dev/null)" in
      *" standin-runner "*) try sibling-environ "$d/environ"; wait $runner; exit $? ;;
    esac
  done
  i=$((i + 1)); sleep 0.05
done
echo "no sibling" >> "$out"
wait $runner
"#,
        results = results.display(),
        config = config.display(),
        state = state.display(),
        bin = env!("CARGO_BIN_EXE_ephemer-actors"),
    )
}

/// A job run as `run_as` (one user per concurrent runner) is denied the daemon's environment,
/// its config, store and admin token, and its sibling's environment; its own runner's is not.
#[actix_rt::test]
async fn a_job_cannot_reach_the_daemons_secrets_or_its_siblings_environment() {
    if !nix::unistd::geteuid().is_root() || support::which("sudo").is_none() {
        support::skip(
            "security",
            "the probe needs root and sudo (bash .ci/run installs it)",
        );
        return;
    }
    for user in PROBE_USERS {
        assert!(support::ensure_user(user), "useradd {user}");
    }
    let (tmp, results) = support::shared_results(&PROBE_USERS);
    let open = |p: &Path, mode| std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode));
    let probe = tmp.path().join("probe.sh");

    // Long enough jobs that the two runners overlap even on a loaded machine.
    let standin = support::standin(10_000);
    let providers = format!(
        "[providers.local]\ncommand = \"{}\"\nwork_root = \"{}\"\nlabels = [\"self-hosted\", \"linux\"]\n\
         max_concurrent = 2\nrun_as = [\"{}\", \"{}\"]\n",
        probe.display(),
        tmp.path().join("work").display(),
        PROBE_USERS[0],
        PROBE_USERS[1],
    );
    let daemon = Daemon::start(&standin, "", &providers).await;
    // As the docs tell the operator: the config is the daemon's alone; the directories on the
    // way to the state are not what keeps a job out.
    let state = daemon.state_dir();
    open(&daemon.config, 0o600).unwrap();
    open(state.parent().unwrap(), 0o755).unwrap();
    open(&state, 0o755).unwrap();
    std::fs::write(&probe, probe_script(&results, &daemon.config, &state)).unwrap();
    open(&probe, 0o755).unwrap();
    std::fs::write(results.join("daemon.pid"), daemon.pid().to_string()).unwrap();

    standin.queue_jobs("app", &["self-hosted", "linux"], 2);
    daemon
        .wait_completed(&standin, 2, Duration::from_secs(60))
        .await;
    for user in PROBE_USERS {
        let seen = std::fs::read_to_string(results.join(user))
            .unwrap_or_else(|e| panic!("no result from {user} ({e}):\n{}", daemon.logs()));
        let expected = [
            "denied daemon-environ",
            "denied config",
            "denied store",
            "denied admin-token",
            "read own-environ",
            "denied sibling-environ",
        ];
        assert_eq!(
            seen.lines().collect::<Vec<_>>(),
            expected,
            "{user}:\n{}",
            daemon.logs()
        );
    }
    daemon.wait_no_runner_left(&standin).await;
    assert_eq!(daemon.stop(Duration::from_secs(30)).await.0, Some(0));
}

/// A JIT answer that names another runner (a path, from a broken server or a proxy trusted
/// through `ca_file`) is refused and its registration deleted, and the job goes on the ladder
/// like a 5xx: it runs at the next rung once the server answers properly (before, it was parked
/// for 30 minutes as the operator's fault).
#[actix_rt::test]
async fn a_jit_answer_naming_another_runner_is_retried_at_the_next_rung() {
    let standin = github_standin::Standin::start(github_standin::StandinConfig::default()).unwrap();
    let daemon = Daemon::start(
        &standin,
        "[runner]\nmax_concurrent = 2\n[runner.claim_retry]\nschedule = [\"2s\"]\njitter = 0.0\n",
        &support::daemon::local_provider(2),
    )
    .await;
    standin.rename_next_runner("../../..");
    standin.queue_jobs("app", &["self-hosted", "linux", "x64"], 1);
    daemon
        .wait_completed(&standin, 1, Duration::from_secs(20))
        .await;
    assert_eq!(
        standin.count("generate_jitconfig"),
        2,
        "one refused, one used"
    );
    daemon.wait_no_runner_left(&standin).await;
    assert_eq!(daemon.stop(Duration::from_secs(30)).await.0, Some(0));
}
