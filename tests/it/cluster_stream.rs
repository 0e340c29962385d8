//! The fleet's event stream against a real PostgreSQL: a job event rides in its notification,
//! so the hosts that hear it do not read it back from the events table; a grant is announced
//! to the other hosts.

use std::{
    sync::{Arc, Mutex},
    time::Duration,
};

use actix::{Actor, Context, Handler};
use ephemer_actors_core::{
    cluster::{Acquire, Ledger, stream::FleetEvent},
    job::{JobAction, JobInfo, JobKey},
};

use crate::{cluster_figures::ledger_config, support::postgres::Postgres};

struct Heard(Arc<Mutex<Vec<u64>>>, Arc<Mutex<Vec<(u64, String)>>>);

impl Actor for Heard {
    type Context = Context<Self>;
}

impl Handler<FleetEvent> for Heard {
    type Result = ();
    fn handle(&mut self, event: FleetEvent, _: &mut Context<Self>) {
        match event {
            FleetEvent::Job { info, .. } => self.0.lock().unwrap().push(info.key.job_id),
            FleetEvent::Held { key, host } => self.1.lock().unwrap().push((key.job_id, host)),
            _ => {}
        }
    }
}

/// How often the listener has read the events table.
fn event_reads(pg: &Postgres) -> u64 {
    pg.query(
        "SELECT coalesce(sum(calls), 0) FROM pg_stat_statements
         WHERE query LIKE 'SELECT seq, action, origin, body FROM ephemer_events%'",
    )[0]
    .parse()
    .unwrap()
}

#[actix_rt::test]
async fn a_job_event_reaches_the_other_hosts_in_its_notification_without_a_read() {
    let Some(pg) = Postgres::start() else { return };
    let pg = pg.with_statement_stats();
    let connect = |host: &'static str| {
        let config = ledger_config(&pg, host);
        async move {
            let cluster = config.cluster.clone().unwrap();
            Ledger::connect(&cluster, &config, Duration::from_secs(10))
                .await
                .unwrap()
        }
    };
    let (a, b) = (connect("a").await, connect("b").await);
    let heard = Arc::new(Mutex::new(Vec::new()));
    let held = Arc::new(Mutex::new(Vec::new()));
    let listener = Heard(heard.clone(), held.clone()).start().recipient();
    actix_rt::spawn(ephemer_actors_core::cluster::stream::listen(b, listener));
    // The listener's first read (from its cursor) happens once it is up.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while event_reads(&pg) == 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the listener never read"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let reads_before = event_reads(&pg);
    let info = |id: u64| JobInfo {
        key: JobKey::new("acme", id),
        repo: "app".into(),
        labels: ["self-hosted".to_string(), "linux".to_string()].into(),
        ..JobInfo::default()
    };
    for id in 1..=20 {
        assert!(a.record(JobAction::Queued, &info(id)).await.unwrap());
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while heard.lock().unwrap().len() < 20 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "not every event was heard"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(*heard.lock().unwrap(), (1..=20).collect::<Vec<u64>>());
    assert_eq!(
        event_reads(&pg) - reads_before,
        0,
        "20 events heard without reading the events table"
    );

    // A grant to host a: b hears who holds the job (and asking would be wasted).
    a.heartbeat(&serde_json::json!([]), 0, 4, &Default::default())
        .await
        .unwrap();
    assert_eq!(a.acquire(&info(3)).await.unwrap(), Acquire::Granted);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while held.lock().unwrap().is_empty() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the grant was not heard"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(*held.lock().unwrap(), vec![(3, "a".to_string())]);
}
