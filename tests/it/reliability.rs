//! Faults that must lose no job and touch nothing that is not ours: restarts next to another
//! host of the same org.

use std::time::Duration;

use crate::support::{self, daemon::Daemon, provision::eventually};

const LABELS: &[&str] = &["self-hosted", "linux"];

/// A pool whose runners never connect: their registrations stay idle on GitHub, as a booting
/// VM's do.
fn idle_pool() -> String {
    "[providers.local]\ncommand = \"/bin/sleep\"\nargs = [\"300\"]\n\
     labels = [\"self-hosted\", \"linux\", \"x64\"]\nmax_concurrent = 2\nallow_root = true\n"
        .to_string()
}

fn registrations(standin: &github_standin::Standin) -> Vec<String> {
    standin.runners().into_iter().map(|r| r.name).collect()
}

/// Two hosts with the default `name_prefix` serve one org. Restarting one cleans up its own
/// leftover registration, and never the other host's idle (booting) runners.
#[actix_rt::test]
async fn restarting_one_of_two_hosts_deletes_only_its_own_leftovers() {
    let standin = support::standin(100);
    let defaults = "[runner]\nname_prefix = \"ephemer\"\nshutdown_timeout = \"1s\"\n";
    let a = Daemon::start(&standin, defaults, &idle_pool()).await;
    standin.queue_jobs("app", LABELS, 2);
    eventually("host a's two runners", Duration::from_secs(20), || {
        registrations(&standin).len() == 2
    })
    .await;
    let b = Daemon::start(&standin, defaults, &idle_pool()).await;
    standin.queue_jobs("app", LABELS, 2);
    eventually("host b's two runners", Duration::from_secs(20), || {
        registrations(&standin).len() == 4
    })
    .await;
    let all = registrations(&standin);
    assert!(
        all.iter().all(|n| n.starts_with("ephemer-local-")),
        "{all:?}"
    );

    // A leftover of host a: registered under its install id, named by no ledger.
    let a_id = std::fs::read_to_string(a.state_dir().join("install-id")).unwrap();
    let leftover = format!("ephemer-local-{}zzzzzzzz", a_id.trim());
    {
        let mut s = standin.state();
        let mut fake = s.runners.values().next().unwrap().clone();
        fake.id = 9_999;
        fake.name = leftover.clone();
        s.runners.insert(fake.id, fake);
    }

    let a = Daemon::resume(&standin, a.kill9().await).await;
    eventually("host a's leftover deleted", Duration::from_secs(30), || {
        !registrations(&standin).contains(&leftover)
    })
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let after = registrations(&standin);
    assert_eq!(
        after.len(),
        4,
        "the restart deleted runners it did not own: {all:?} -> {after:?}\n{}",
        a.logs()
    );
    assert_eq!(a.stop(Duration::from_secs(30)).await.0, Some(0));
    assert_eq!(b.stop(Duration::from_secs(30)).await.0, Some(0));
}

/// The state dir's disk refuses writes for 5 s: the 20 deliveries in that window are all
/// accepted (GitHub would never send a refused one again) and all run; `/readyz` says 503
/// while the store is unhealthy and 200 once it has written everything through.
#[actix_rt::test]
async fn deliveries_while_the_disk_is_full_are_accepted_and_run() {
    let standin = support::standin(100);
    let state = tempfile::tempdir().unwrap();
    let faults = ephemer_actors_core::store::StoreFaults::default();
    let (handles, addr) = crate::embed::instance(
        &standin,
        &crate::embed::config(&standin, state.path()),
        faults.clone(),
    );
    let readyz = || async { support::http_get(&addr, "/ci/readyz").await.map(|r| r.0) };
    assert_eq!(readyz().await, Some(200));

    faults.set_unwritable(true);
    for _ in 0..20 {
        standin.queue_jobs("app", LABELS, 1);
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    eventually("20 deliveries answered", Duration::from_secs(10), || {
        standin
            .deliveries()
            .iter()
            .filter(|d| d.action == "queued" && d.status != 0)
            .count()
            == 20
    })
    .await;
    let statuses: Vec<u16> = standin
        .deliveries()
        .iter()
        .filter(|d| d.action == "queued")
        .map(|d| d.status)
        .collect();
    assert!(statuses.iter().all(|s| *s == 202), "{statuses:?}");
    assert_eq!(
        readyz().await,
        Some(503),
        "ready while the store cannot write"
    );
    assert!(
        handles
            .metrics
            .encode()
            .contains("ephemerd_store_healthy 0")
    );
    tokio::time::sleep(Duration::from_secs(1)).await;
    faults.set_unwritable(false);

    eventually("all 20 jobs ran", Duration::from_secs(60), || {
        standin.jobs_in("completed") == 20
    })
    .await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while readyz().await != Some(200) {
        assert!(tokio::time::Instant::now() < deadline, "never ready again");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    handles.shutdown(Duration::from_secs(20)).await;
}

/// Each core actor made to panic: the instance says so within 2 s (`/readyz` 503 naming it,
/// and `dead_core_actor`, on which `serve` exits 1), never 503-but-ready or ready-but-dead.
#[actix_rt::test]
async fn a_core_actor_that_panics_is_noticed_within_two_seconds() {
    use ephemer_actors_core::lifecycle::Crash;
    let standin = support::standin(100);
    for victim in [
        "scheduler",
        "retry",
        "rate",
        "github",
        "webhook",
        "supervisor:local",
    ] {
        let state = tempfile::tempdir().unwrap();
        let (handles, addr) = crate::embed::instance(
            &standin,
            &crate::embed::config(&standin, state.path()),
            Default::default(),
        );
        assert_eq!(handles.dead_core_actor(), None);
        match victim {
            "scheduler" => handles.scheduler.do_send(Crash),
            "retry" => handles.retry.do_send(Crash),
            "rate" => handles.rate.do_send(Crash),
            "github" => handles.github.do_send(Crash),
            "webhook" => handles.webhook.do_send(Crash),
            _ => handles
                .provisioners
                .values()
                .for_each(|p| p.crash.do_send(Crash)),
        }
        let started = tokio::time::Instant::now();
        while handles.dead_core_actor().is_none() {
            assert!(
                started.elapsed() < Duration::from_secs(2),
                "{victim} died unnoticed"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(handles.dead_core_actor().as_deref(), Some(victim));
        let (status, body) = support::http_get(&addr, "/ci/readyz").await.unwrap();
        assert_eq!(status, 503, "{victim}: {body}");
        assert!(body.contains(victim), "{body}");
        handles.shutdown(Duration::from_secs(5)).await;
    }
}

/// At start-up a provisioner removes leftover environments of this install only: a runner
/// directory with this install's id goes, one with another install's id (a second daemon on
/// the host with the same prefix) stays.
#[actix_rt::test]
async fn start_up_reaps_only_this_installs_leftover_environments() {
    let standin = support::standin(100);
    let daemon = Daemon::start(&standin, "", &support::daemon::local_provider(1)).await;
    let state = daemon.state_dir();
    let id = std::fs::read_to_string(state.join("install-id")).unwrap();
    let work = daemon.runner_dir();
    let ours = work.join(format!("{}-local-{}leftover1", daemon.prefix(), id.trim()));
    let theirs = work.join(format!("{}-local-zzzzzzleftover", daemon.prefix()));
    for dir in [&ours, &theirs] {
        std::fs::create_dir_all(dir.join("_home")).unwrap();
    }
    let daemon = Daemon::resume(&standin, daemon.kill9().await).await;
    eventually("our leftover reaped", Duration::from_secs(20), || {
        !ours.exists()
    })
    .await;
    assert!(theirs.exists(), "another install's environment was removed");
    assert_eq!(daemon.stop(Duration::from_secs(30)).await.0, Some(0));
}

/// A second SIGTERM during the drain tears the running job down at once instead of waiting
/// out `shutdown_timeout`; the daemon still exits 0, the runner torn down.
#[actix_rt::test]
async fn a_second_sigterm_ends_the_drain_at_once() {
    let standin = support::standin(600_000);
    let daemon = Daemon::start(&standin, "", &support::daemon::local_provider(1)).await;
    standin.queue_jobs("app", LABELS, 1);
    eventually("the job to start", Duration::from_secs(20), || {
        standin.jobs_in("in_progress") == 1
    })
    .await;
    daemon.begin_drain();
    tokio::time::sleep(Duration::from_secs(1)).await;
    // The drain would wait 5 minutes for the job; the second signal ends it now.
    let (code, logs) = daemon.stop(Duration::from_secs(30)).await;
    assert_eq!(code, Some(0), "{logs}");
    assert!(logs.contains("second shutdown signal"), "{logs}");
    assert!(logs.contains("stopped cleanly torn_down=1"), "{logs}");
}
