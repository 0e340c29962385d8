//! Several GitHub owners served by a fleet: each owner's claims spend its own budget in the
//! ledger (one owner's empty budget holds back only that owner's claims on every host), and a
//! dead host's registrations are deleted with the credential of the owner they belong to.

use std::time::Duration;

use github_standin::{RunnerBehavior, Standin};

use crate::{
    support::{daemon::Daemon, postgres::Postgres},
    targets::{ENV, config, owner, wait_for},
};

const LABELS: &[&str] = &["self-hosted", "linux"];

async fn host(pg: &Postgres, a: &Standin, b: &Standin, name: &str) -> Daemon {
    let cluster = format!(
        "[cluster]\nurl = \"{}\"\nhost = \"{name}\"\nlease = \"4s\"\n",
        pg.url()
    );
    Daemon::start_config(|port, state| config(a, b, 4, &cluster, port, state), ENV).await
}

fn urls(hosts: &[&Daemon]) -> Vec<String> {
    hosts
        .iter()
        .map(|d| format!("http://{}/webhook/github", d.addr))
        .collect()
}

fn logs(hosts: &[&Daemon]) -> String {
    hosts
        .iter()
        .map(|h| h.logs())
        .collect::<Vec<_>>()
        .join("\n----\n")
}

#[actix_rt::test]
async fn a_fleet_serves_two_owners_each_on_its_own_budget() {
    let Some(pg) = Postgres::start() else { return };
    let a = owner("acme", "tok-a", 100);
    let b = owner("beta", "tok-b", 100);
    let h1 = host(&pg, &a, &b, "h1").await;
    let h2 = host(&pg, &a, &b, "h2").await;
    let hosts = [&h1, &h2];
    a.send_webhooks_to_fleet(&urls(&hosts), "secret-a", 0.0);
    b.send_webhooks_to_fleet(&urls(&hosts), "secret-b", 0.0);
    a.queue_jobs("app", LABELS, 4);
    b.queue_jobs("app", LABELS, 4);
    wait_for("8 jobs", &h1, Duration::from_secs(40), || {
        a.jobs_in("completed") == 4 && b.jobs_in("completed") == 4
    })
    .await;

    // A's registration budget runs dry: the host that learns it tells the fleet, and every
    // host holds A's claims; B's budget is another row and B's claims go on.
    // Long enough that B's jobs finish well before it on a loaded machine (at 8 s, a CI run
    // saw A's reset pass first and a fifth job of A's run).
    let reset = a.exhaust_bucket_for("actions_runner_registration", Duration::from_secs(20));
    a.queue_jobs("app", LABELS, 1);
    wait_for("A's refused claim", &h1, Duration::from_secs(10), || {
        a.calls_to("generate_jitconfig")
            .iter()
            .any(|c| c.status == 403)
    })
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    a.queue_jobs("app", LABELS, 3);
    b.queue_jobs("app", LABELS, 4);
    wait_for("B's 4 jobs", &h1, Duration::from_secs(15), || {
        b.jobs_in("completed") == 8
    })
    .await;
    assert_eq!(a.jobs_in("completed"), 4, "{}", logs(&hosts));
    let early = a
        .calls_to("generate_jitconfig")
        .into_iter()
        .filter(|c| c.at_ms < u128::from(reset) * 1000 && c.at_ms > 0)
        .filter(|c| c.status != 201)
        .count();
    assert_eq!(
        early,
        1,
        "one claim learned the budget was empty\n{}",
        logs(&hosts)
    );
    wait_for(
        "A's jobs after its reset",
        &h1,
        Duration::from_secs(40),
        || a.jobs_in("completed") == 8,
    )
    .await;
    // Only A's credential ever ran low, so only its readings were shared (the row may already
    // hold the recovery after A's reset, so its `remaining` is not checked).
    let rates = pg.query("SELECT DISTINCT credential FROM ephemer_rates");
    assert_eq!(rates.len(), 1, "only A's budget was shared: {rates:?}");
    for h in [h1, h2] {
        assert_eq!(h.stop(Duration::from_secs(30)).await.0, Some(0));
    }
}

#[actix_rt::test]
async fn a_dead_host_s_registrations_are_deleted_with_their_owner_s_credential() {
    let Some(pg) = Postgres::start() else { return };
    let a = owner("acme", "tok-a", 100);
    let b = owner("beta", "tok-b", 100);
    // B's runners come up and get no job: their registrations stay, idle.
    b.set_behavior(RunnerBehavior {
        hold: true,
        ..RunnerBehavior::default()
    });
    // h1 alone claims; h2 joins once h1 holds both jobs.
    let h1 = host(&pg, &a, &b, "h1").await;
    let h1_prefix = h1.prefix();
    b.send_webhooks_to_fleet(&urls(&[&h1]), "secret-b", 0.0);
    b.queue_jobs("app", LABELS, 2);
    let h1_runners = |b: &Standin| {
        b.runners()
            .into_iter()
            .filter(|r| r.name.starts_with(&h1_prefix))
            .count()
    };
    wait_for(
        "h1's two runners at B",
        &h1,
        Duration::from_secs(20),
        || h1_runners(&b) == 2,
    )
    .await;
    let h2 = host(&pg, &a, &b, "h2").await;
    let _left = h1.kill9().await;
    // h2 reaps h1 once its 4 s lease is out: the jobs go back to the fleet, and h1's idle
    // registrations are deleted at B (a delete at A would answer 404 and leave them).
    wait_for(
        "h1's registrations deleted at B",
        &h2,
        Duration::from_secs(30),
        || h1_runners(&b) == 0,
    )
    .await;
    assert_eq!(a.count("delete_runner"), 0, "{:?}", a.calls());
    assert!(b.count("delete_runner") >= 2);
    b.set_behavior(RunnerBehavior::default());
    wait_for("B's jobs on h2", &h2, Duration::from_secs(30), || {
        b.jobs_in("completed") == 2
    })
    .await;
    assert_eq!(h2.stop(Duration::from_secs(30)).await.0, Some(0));
}
