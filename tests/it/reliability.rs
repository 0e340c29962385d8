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
