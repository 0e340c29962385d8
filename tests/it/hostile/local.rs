//! The corpus against `local` pools with `run_as`: each job's script runs as a dedicated user
//! before its stand-in runner.

use std::{os::unix::fs::PermissionsExt, path::PathBuf, time::Duration};

use github_standin::Standin;

use super::{Found, record};
use crate::support::{self, daemon::Daemon};

const USERS: [&str; 2] = ["ephemer-hostile1", "ephemer-hostile2"];
const LABELS: &[&str] = &["self-hosted", "linux"];
const KIND: &str = "local";

/// A daemon whose `local` pool runs `script` before each job's runner.
struct Bench {
    daemon: Daemon,
    standin: Standin,
    dir: tempfile::TempDir,
}

/// The job's script: `script` (with `$TARGET` naming a file that says where the daemon's state
/// is and its pid), then the stand-in runner.
fn job_sh(dir: &std::path::Path, script: &str) -> PathBuf {
    let text = format!(
        "#!/bin/sh\nTARGET={target}\n{script}\nexec '{bin}' standin-runner \"$@\"\n",
        target = dir.join("target").display(),
        bin = env!("CARGO_BIN_EXE_ephemer-actors"),
    );
    let path = support::write_file(dir, "job.sh", &text);
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path
}

fn shared_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    dir
}

impl Bench {
    /// A pool running `script` as `run_as` (none: `allow_root`), `max_concurrent` at once.
    async fn start(script: &str, run_as: &[&str], slots: usize, weaken: &str) -> Bench {
        let dir = shared_dir();
        let job = job_sh(dir.path(), script);
        let who = if run_as.is_empty() {
            "allow_root = true".to_string()
        } else {
            format!("run_as = {run_as:?}")
        };
        let providers = format!(
            "[providers.local]\ncommand = \"{}\"\n{who}\nlabels = [\"self-hosted\", \"linux\"]\n\
             max_concurrent = {slots}\n",
            job.display(),
        );
        Self::start_pool(dir, &providers, weaken).await
    }

    async fn start_pool(dir: tempfile::TempDir, providers: &str, weaken: &str) -> Bench {
        for user in USERS {
            assert!(support::ensure_user(user), "cannot create {user}");
            let uid = nix::unistd::User::from_name(user).unwrap().unwrap().uid;
            ephemer_actors_core::provision::leftovers::clear(uid.as_raw(), user, &[]);
        }
        let standin = support::standin(1500);
        let env: Vec<(&str, &str)> = if weaken.is_empty() {
            Vec::new()
        } else {
            vec![("EPHEMER_TEST_WEAKEN", weaken)]
        };
        let daemon = Daemon::start_with_env(&standin, "", providers, &env).await;
        std::fs::write(
            dir.path().join("target"),
            format!("{}\n{}\n", daemon.state_dir().display(), daemon.pid()),
        )
        .unwrap();
        std::fs::set_permissions(
            dir.path().join("target"),
            std::fs::Permissions::from_mode(0o644),
        )
        .unwrap();
        Bench {
            daemon,
            standin,
            dir,
        }
    }

    /// Queues `n` jobs at once and waits until they completed and their runners are gone, or
    /// the daemon died; the runners' logs.
    async fn jobs(&mut self, n: usize) -> Vec<String> {
        let done = self.standin.jobs_in("completed");
        self.standin.queue_jobs("app", LABELS, n);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(180);
        while self.standin.jobs_in("completed") < done + n
            && tokio::time::Instant::now() < deadline
            && !self.daemon.has_exited()
        {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let (work, prefix) = (self.daemon.runner_dir(), self.daemon.prefix());
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        while tokio::time::Instant::now() < deadline && !self.daemon.has_exited() {
            let left = std::fs::read_dir(&work).is_ok_and(|d| {
                d.flatten()
                    .any(|e| e.file_name().to_string_lossy().starts_with(&prefix))
            });
            if !left {
                break;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        self.logs()
    }

    fn logs(&self) -> Vec<String> {
        std::fs::read_dir(self.daemon.state_dir().join("logs"))
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| std::fs::read_to_string(e.path()).unwrap_or_default())
            .collect()
    }

    /// Bytes of the runners' logs.
    fn log_bytes(&self) -> u64 {
        std::fs::read_dir(self.daemon.state_dir().join("logs"))
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| e.metadata().ok())
            .map(|m| m.len())
            .sum()
    }

    /// What a killed daemon leaves is removed by the walk that no tree breaks (a test's own
    /// `TempDir` would recurse into a job's 15,000 levels).
    async fn end(mut self) {
        if !self.daemon.has_exited() {
            let _ = self.daemon.stop(Duration::from_secs(60)).await;
        } else {
            let work = self.daemon.runner_dir();
            let _ = ephemer_actors_core::remove::remove_tree(&work, Duration::from_secs(120));
            drop(self.daemon);
        }
        self.standin.stop().await;
        drop(self.dir);
    }
}

fn said(logs: &[String], word: &str) -> bool {
    logs.iter().any(|l| l.contains(word))
}

/// Finding 1: a job makes 15,000 nested directories in `/tmp` and in its own directory;
/// teardown's recursion aborted the root daemon, and every start after it.
async fn deep_tree(weaken: &str) -> Found {
    let script = r#"t=$(mktemp -d /tmp/hostile-deep.XXXXXX)
mkdir -p "$PWD/_work"
for at in "$t" "$PWD/_work"; do
    (cd "$at" && perl -e 'for (1..15000) { mkdir "d" or last; chdir "d" or last }')
done
echo "RESULT built""#;
    let mut b = Bench::start(script, &USERS[..1], 1, weaken).await;
    // Not `jobs`: the stand-in runner fails a job that leaves more than its own directory in
    // `_work`, so this one never completes at the stand-in (waiting for that took three
    // minutes). The tree built, the runner's end and its teardown are what count.
    b.standin.queue_jobs("app", LABELS, 1);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    while !said(&b.logs(), "RESULT built")
        && tokio::time::Instant::now() < deadline
        && !b.daemon.has_exited()
    {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let logs = b.logs();
    let gone = eventually_or_dead(&mut b, Duration::from_secs(60)).await;
    let found = if b.daemon.has_exited() {
        Found::got("the daemon aborted removing the tree")
    } else if !said(&logs, "RESULT built") {
        Found::silent("the job did not build its tree")
    } else if gone {
        Found::refused("the daemon lives; both trees are gone")
    } else {
        Found::got("the daemon lives, but the tree is still there")
    };
    b.end().await;
    found
}

/// Waits until the daemon's work root holds no runner directory, or the daemon died.
async fn eventually_or_dead(b: &mut Bench, within: Duration) -> bool {
    let (work, prefix) = (b.daemon.runner_dir(), b.daemon.prefix());
    let deadline = tokio::time::Instant::now() + within;
    loop {
        if b.daemon.has_exited() {
            return false;
        }
        let left = std::fs::read_dir(&work).is_ok_and(|d| {
            d.flatten()
                .any(|e| e.file_name().to_string_lossy().starts_with(&prefix))
        });
        let tmp_left = std::fs::read_dir("/tmp").is_ok_and(|d| {
            d.flatten()
                .any(|e| e.file_name().to_string_lossy().starts_with("hostile-deep."))
        });
        if !left && !tmp_left {
            return true;
        }
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Finding 7: a key in the job user's kernel keyring, read by the next job on the uid.
async fn keyring(weaken: &str) -> Found {
    let script = r#"if keyctl search @u user hostile-key >/dev/null 2>&1; then echo "RESULT saw-key"; else echo "RESULT no-key"; fi
keyctl add user hostile-key the-last-jobs-secret @u >/dev/null 2>&1"#;
    let mut b = Bench::start(script, &USERS[..1], 1, weaken).await;
    b.jobs(1).await;
    let logs = b.jobs(1).await;
    let found = if said(&logs, "RESULT saw-key") {
        Found::got("the second job read the first one's key")
    } else if said(&logs, "RESULT no-key") {
        Found::refused("the second job found no key")
    } else {
        Found::silent("no job said what it saw")
    };
    b.end().await;
    found
}

/// A job floods its output (100 MB): the runner's log stays near its 16 MiB cap.
async fn flood(weaken: &str) -> Found {
    let script = "head -c 100000000 /dev/zero | tr '\\0' x\necho\necho \"RESULT flooded\"";
    let mut b = Bench::start(script, &USERS[..1], 1, weaken).await;
    b.jobs(1).await;
    let mib = b.log_bytes() >> 20;
    b.end().await;
    if mib > 48 {
        Found::got(format!("the runner's log holds {mib} MiB"))
    } else {
        Found::refused(format!("the runner's logs hold {mib} MiB"))
    }
}

/// A fork bomb that keeps its children (6,000 of them): the job's cgroup stops it at its own
/// ceiling, the daemon lives, and nothing of it outlives the teardown.
async fn fork_bomb(weaken: &str) -> Found {
    let script = r#"perl -e 'my $n = 0; for (1..6000) { my $p = fork(); last unless defined $p; if ($p == 0) { sleep 120; exit 0 } $n++ } print "RESULT forked $n\n"'"#;
    let mut b = Bench::start(script, &USERS[..1], 1, weaken).await;
    let logs = b.jobs(1).await;
    let forked: u32 = logs
        .iter()
        .flat_map(|l| l.lines())
        .find_map(|l| l.strip_prefix("RESULT forked ")?.trim().parse().ok())
        .unwrap_or(0);
    let uid = nix::unistd::User::from_name(USERS[0]).unwrap().unwrap().uid;
    // The job is done when its runner says so; its teardown (the cgroup's kill, then the
    // user's leftovers) follows. What is left is counted once that had its time.
    let left_of = || ephemer_actors_core::provision::leftovers::processes_of(uid.as_raw()).len();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while left_of() > 0 && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let left = left_of();
    let alive = !b.daemon.has_exited();
    b.end().await;
    if forked >= 6000 {
        Found::got(format!(
            "6000 processes at once ({left} left after teardown)"
        ))
    } else if alive && left == 0 {
        Found::refused(format!("stopped at {forked}; the daemon lives, none left"))
    } else {
        Found::got(format!(
            "{forked} forked, {left} left, daemon alive: {alive}"
        ))
    }
}

/// Two jobs at once: each reads every `/proc/*/environ` it can for another runner's JIT
/// config. With one user per concurrent job, none is readable.
async fn sibling_environ(run_as: &[&str]) -> Found {
    let script = r#"found=none
end=$(( $(date +%s) + 8 ))
while [ "$(date +%s)" -lt "$end" ]; do
    for f in /proc/[0-9]*/environ; do
        if grep -qa ACTIONS_RUNNER_INPUT_JITCONFIG "$f" 2>/dev/null && ! grep -qaF "$ACTIONS_RUNNER_INPUT_JITCONFIG" "$f" 2>/dev/null; then found=read; fi
    done
    [ "$found" = read ] && break
    sleep 0.5
done
echo "RESULT sibling-$found""#;
    let mut b = Bench::start(script, run_as, 2, "").await;
    let logs = b.jobs(2).await;
    b.end().await;
    if said(&logs, "RESULT sibling-read") {
        Found::got("a job read its sibling's JIT config")
    } else if said(&logs, "RESULT sibling-none") {
        Found::refused("no sibling's environment was readable")
    } else {
        Found::silent("the jobs said nothing")
    }
}

/// A job writes the runner install through its copy's hard link: the next job (another
/// user) would run what it wrote.
async fn install_write(weaken: &str) -> Found {
    let dir = shared_dir();
    let script = "if echo '# hostile' >> bin/Runner.Listener 2>/dev/null; then echo \"RESULT wrote\"; else echo \"RESULT refused\"; fi";
    let job = job_sh(dir.path(), script);
    let install = dir.path().join("install");
    standin_runner::write_install(&install, &job, &[]).unwrap();
    if !weaken.is_empty() {
        // The loose install the weakened daemon no longer refuses.
        std::fs::set_permissions(
            install.join("bin/Runner.Listener"),
            std::fs::Permissions::from_mode(0o777),
        )
        .unwrap();
    }
    let before = std::fs::read(install.join("bin/Runner.Listener")).unwrap();
    let providers = format!(
        "[providers.local]\nrunner_dir = \"{}\"\nrun_as = [\"{}\"]\nlabels = [\"self-hosted\", \"linux\"]\nmax_concurrent = 1\n",
        install.display(),
        USERS[0]
    );
    let mut b = Bench::start_pool(dir, &providers, weaken).await;
    let logs = b.jobs(1).await;
    let after = std::fs::read(install.join("bin/Runner.Listener")).unwrap();
    b.end().await;
    if after != before {
        Found::got("the install's listener was changed")
    } else if said(&logs, "RESULT refused") {
        Found::refused("the install cannot be written; unchanged")
    } else {
        Found::silent("the job did not run; the install is unchanged")
    }
}

/// A job reads what the daemon keeps: its admin token, its store, its environment.
async fn daemon_secrets(run_as: &[&str]) -> Found {
    let script = r#"S=$(sed -n 1p "$TARGET"); P=$(sed -n 2p "$TARGET")
got=none
cat "$S/admin.token" >/dev/null 2>&1 && got=token
head -c 16 "$S/ephemer-actors.redb" >/dev/null 2>&1 && got="$got,store"
grep -qa GITHUB_TOKEN "/proc/$P/environ" 2>/dev/null && got="$got,environ"
echo "RESULT secrets-$got""#;
    let mut b = Bench::start(script, run_as, 1, "").await;
    let logs = b.jobs(1).await;
    b.end().await;
    let line = logs
        .iter()
        .flat_map(|l| l.lines())
        .find(|l| l.starts_with("RESULT secrets-"))
        .map(str::to_string)
        .unwrap_or_default();
    if line.is_empty() {
        Found::silent("the job said nothing")
    } else if line.ends_with("secrets-none") {
        Found::refused("token, store and environment all refused")
    } else {
        Found::got(format!(
            "read {}",
            line.trim_start_matches("RESULT secrets-")
        ))
    }
}

/// Finding 7: `run_as` names a second uid-0 account (`useradd -o -u 0`).
async fn uid0_alias(weaken: &str) -> Found {
    const ALIAS: &str = "ephemer-toor";
    if nix::unistd::User::from_name(ALIAS).unwrap().is_none() {
        let made = std::process::Command::new("useradd")
            .args(["-o", "-u", "0", "-M", "-s", "/usr/sbin/nologin", ALIAS])
            .status()
            .unwrap();
        assert!(made.success(), "cannot make {ALIAS}");
    }
    let script = "echo \"RESULT uid-$(id -u)\"";
    let found = if weaken.is_empty() {
        // The real daemon does not start with such a pool: check-config says why.
        let dir = shared_dir();
        let job = job_sh(dir.path(), script);
        let pool = format!(
            "[providers.local]\ncommand = \"{}\"\nrun_as = [\"{ALIAS}\"]\n",
            job.display()
        );
        let (code, err) = super::check_config(dir.path(), &pool, "").await;
        if code == 2 && err.contains("uid is 0") {
            Found::refused("check-config refuses it by uid")
        } else {
            Found::got(format!("check-config said {code}: {}", err.trim()))
        }
    } else {
        let mut b = Bench::start(script, &[ALIAS], 1, weaken).await;
        let logs = b.jobs(1).await;
        b.end().await;
        if said(&logs, "RESULT uid-0") {
            Found::got("the job ran as uid 0")
        } else {
            Found::refused("the job did not run as root")
        }
    };
    let _ = std::process::Command::new("userdel").arg(ALIAS).status();
    found
}

/// The corpus on `local`.
pub(super) async fn all() {
    record(
        "deep_tree",
        KIND,
        "removal",
        deep_tree("removal").await,
        deep_tree("").await,
    );
    record(
        "keyring",
        KIND,
        "keyring",
        keyring("keyring").await,
        keyring("").await,
    );
    record(
        "flood",
        KIND,
        "log-cap",
        flood("log-cap").await,
        flood("").await,
    );
    record(
        "fork_bomb",
        KIND,
        "pids-limit",
        fork_bomb("pids-limit").await,
        fork_bomb("").await,
    );
    record(
        "sibling_environ",
        KIND,
        "config: one run_as user for two runners",
        sibling_environ(&USERS[..1]).await,
        sibling_environ(&USERS).await,
    );
    record(
        "install_write",
        KIND,
        "install-trust",
        install_write("install-trust").await,
        install_write("").await,
    );
    record(
        "daemon_secrets",
        KIND,
        "config: no run_as (allow_root)",
        daemon_secrets(&[]).await,
        daemon_secrets(&USERS[..1]).await,
    );
    record(
        "uid0_alias",
        KIND,
        "uid-check",
        uid0_alias("uid-check").await,
        uid0_alias("").await,
    );
}
