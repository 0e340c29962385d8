//! One `run_as` user, one job, across the whole host.
//!
//! Two process pools list the same two users, each with two slots and a warm directory, under
//! a burst of jobs for both. Before, each pool counted only its own directories: both handed
//! out the first user at once, the two jobs read each other's JIT config from `/proc`, and one
//! teardown killed the other job. Each job here takes a lock named after its user for as long
//! as it runs; a second job on the same user finds the lock taken and says so.

use std::{os::unix::fs::PermissionsExt, path::Path, time::Duration};

use crate::support::{self, daemon::Daemon, series};

const USERS: [&str; 2] = ["ephemer-share1", "ephemer-share2"];

/// The job: the user's lock while the stand-in runner runs.
fn script(results: &Path) -> String {
    format!(
        r#"#!/bin/sh
R='{r}'
me=$(id -un)
mkdir "$R/held-$me" 2>/dev/null || echo "$me" >> "$R/overlap"
echo "$me" >> "$R/ran"
'{bin}' standin-runner "$@"
code=$?
rmdir "$R/held-$me" 2>/dev/null
exit $code
"#,
        r = results.display(),
        bin = env!("CARGO_BIN_EXE_ephemer-actors")
    )
}

#[actix_rt::test]
async fn two_pools_listing_the_same_users_never_run_two_jobs_as_one_user() {
    if !nix::unistd::geteuid().is_root() || support::which("sudo").is_none() {
        return support::skip(
            "shared users",
            "run_as needs root and sudo (bash .ci/run installs it)",
        );
    }
    for user in USERS {
        assert!(support::ensure_user(user), "cannot create the user {user}");
    }
    let (tmp, results) = support::shared_results(&["overlap", "ran"]);
    let runner = support::write_file(tmp.path(), "runner.sh", &script(&results));
    std::fs::set_permissions(&runner, std::fs::Permissions::from_mode(0o755)).unwrap();
    let pool = |name: &str| {
        format!(
            "[providers.{name}]\nkind = \"local\"\ncommand = \"{}\"\nwork_root = \"{}\"\n\
             labels = [\"self-hosted\", \"linux\", \"{name}\"]\nmax_concurrent = 2\nwarm = 1\n\
             run_as = [\"{}\", \"{}\"]\n",
            runner.display(),
            tmp.path().join(format!("work-{name}")).display(),
            USERS[0],
            USERS[1],
        )
    };
    let standin = support::standin(1500);
    let daemon = Daemon::start(&standin, "", &(pool("pa") + &pool("pb"))).await;
    for _ in 0..3 {
        standin.queue_jobs("app", &["self-hosted", "linux", "pa"], 2);
        standin.queue_jobs("app", &["self-hosted", "linux", "pb"], 2);
        tokio::time::sleep(Duration::from_millis(700)).await;
    }
    daemon
        .wait_completed(&standin, 12, Duration::from_secs(180))
        .await;
    daemon.wait_no_runner_left(&standin).await;

    let overlap = std::fs::read_to_string(results.join("overlap")).unwrap();
    assert!(
        overlap.is_empty(),
        "two jobs ran as one user at once: {overlap}\n{}",
        daemon.logs()
    );
    let ran = std::fs::read_to_string(results.join("ran")).unwrap();
    assert_eq!(ran.lines().count(), 12, "{ran}");
    for user in USERS {
        assert!(ran.lines().any(|l| l == user), "{user} never ran: {ran}");
    }
    let metrics = daemon.metrics().await;
    let hits: f64 = ["pa", "pb"]
        .iter()
        .map(|p| {
            series(
                &metrics,
                &format!("ephemerd_warm_claims_total{{outcome=\"hit\",pool=\"{p}\"}}"),
            )
        })
        .sum();
    assert!(hits >= 1.0, "no warm claim was made:\n{metrics}");
    assert_eq!(daemon.stop(Duration::from_secs(30)).await.0, Some(0));
}
