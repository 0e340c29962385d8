//! One OpenTelemetry trace per job (`[telemetry] otlp_endpoint`), as an OTLP collector
//! receives it (`support/otlp.rs` decodes the protobuf): four jobs, one through a failed
//! claim and its retry, one across a `kill -9`, one ending in a drain, one across a binary
//! swap (the current build drained, the next one started on its store), with a collector that
//! refuses its first request. Each job is exactly one trace, with a root from its first delivery to its
//! teardown and a child for each stage; a job that spans a restart is continued under the same
//! trace, its root still starting at the delivery before the restart, never sent twice.
//! A finished job's trace is kept until the collector accepts it: through a `kill -9` right
//! after the job ended and a collector away for a minute.

use std::{
    collections::{BTreeMap, BTreeSet},
    time::Duration,
};

use github_standin::RunnerBehavior;

use crate::support::{
    self,
    daemon::{Daemon, local_provider},
    otlp::{Receiver, Span},
    provision::eventually,
};

const LABELS: &[&str] = &["self-hosted", "linux"];

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// The root span of each job the receiver has a root for, by job id.
fn roots(spans: &[Span]) -> BTreeMap<u64, Vec<Span>> {
    let mut roots: BTreeMap<u64, Vec<Span>> = BTreeMap::new();
    for s in spans.iter().filter(|s| s.name == "workflow job") {
        let job = s.attributes["github.job.id"].parse().unwrap();
        roots.entry(job).or_default().push(s.clone());
    }
    roots
}

fn children<'a>(spans: &'a [Span], root: &Span) -> Vec<&'a Span> {
    spans
        .iter()
        .filter(|s| s.trace_id == root.trace_id && s.span_id != root.span_id)
        .collect()
}

fn names(spans: &[&Span]) -> BTreeSet<String> {
    spans.iter().map(|s| s.name.clone()).collect()
}

/// Waits until the receiver holds a trace of each of `jobs`.
async fn traced(receiver: &Receiver, jobs: &[u64], daemon: &Daemon) {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let r = roots(&receiver.spans());
        if jobs.iter().all(|j| r.contains_key(j)) {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "traces of jobs {:?} of {jobs:?} after {} requests:\n{}",
            r.keys().collect::<Vec<_>>(),
            receiver.requests(),
            daemon.logs()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[actix_rt::test]
async fn each_job_is_one_trace_through_a_retry_a_kill_9_and_a_binary_swap() {
    let receiver = Receiver::start(1);
    let standin = support::standin(100);
    let extra = format!(
        "[telemetry]\notlp_endpoint = \"{}\"\nservice_name = \"ci-traces\"\n\n\
         [runner.claim_retry]\nschedule = [\"1s\", \"2s\"]\n",
        receiver.url
    );
    let daemon = Daemon::start(&standin, &extra, &local_provider(1)).await;

    // 1. A claim GitHub fails once (502): the ladder claims again a second later.
    standin.fail_status("generate_jitconfig", 502, 1);
    let retried = standin.queue_jobs("app", LABELS, 1)[0];
    daemon
        .wait_completed(&standin, 1, Duration::from_secs(60))
        .await;
    // Sent within its batch's second (and the refused request's retry), before the kill.
    traced(&receiver, &[retried], &daemon).await;

    // 2. A job running when the daemon is killed; the next start finishes it.
    standin.set_behavior(RunnerBehavior {
        job_ms: 3_000,
        ..RunnerBehavior::default()
    });
    let killed = standin.queue_jobs("app", LABELS, 1)[0];
    eventually("the second job running", Duration::from_secs(30), || {
        standin.jobs_in("in_progress") == 1
    })
    .await;
    let kill_ms = now_ms();
    let left = daemon.kill9().await;
    let daemon = Daemon::resume(&standin, left).await;
    daemon
        .wait_completed(&standin, 2, Duration::from_secs(60))
        .await;

    // 3. A job waiting for the one slot, behind a running one, when the daemon is drained
    //    (the running one finishes in the drain) and the next build started on its store.
    let ran = standin.queue_jobs("app", LABELS, 1)[0];
    eventually("the third job running", Duration::from_secs(30), || {
        standin.jobs_in("in_progress") == 1
    })
    .await;
    let delivered = standin.deliveries().len();
    let swapped = standin.queue_jobs("app", LABELS, 1)[0];
    eventually("the fourth job delivered", Duration::from_secs(30), || {
        standin.deliveries().len() > delivered
    })
    .await;
    let swap_ms = now_ms();
    let (left, code, logs) = daemon.stop_keeping(Duration::from_secs(60)).await;
    assert_eq!(code, Some(0), "{logs}");
    assert_eq!(
        standin.jobs_in("completed"),
        3,
        "the drain let the running job end"
    );
    standin.set_behavior(RunnerBehavior::default());
    let daemon = Daemon::resume_next(&standin, left).await;
    daemon
        .wait_completed(&standin, 4, Duration::from_secs(60))
        .await;

    let jobs = [retried, killed, ran, swapped];
    traced(&receiver, &jobs, &daemon).await;
    let metrics = daemon.metrics().await;
    // The drain sends what is queued; give a late duplicate its chance to show.
    assert_eq!(daemon.stop(Duration::from_secs(30)).await.0, Some(0));
    tokio::time::sleep(Duration::from_secs(2)).await;

    let spans = receiver.spans();
    assert!(
        receiver.requests() >= 2,
        "the refused request was sent again"
    );
    let mut ids: Vec<(&str, &str)> = spans
        .iter()
        .map(|s| (s.trace_id.as_str(), s.span_id.as_str()))
        .collect();
    ids.sort_unstable();
    let all = ids.len();
    ids.dedup();
    assert_eq!(ids.len(), all, "no span was sent twice");
    let roots = roots(&spans);
    for job in jobs {
        let r = &roots[&job];
        assert_eq!(r.len(), 1, "job {job}: one trace, not {r:?}");
        let root = &r[0];
        assert_eq!(root.parent, "", "the root has no parent");
        assert_eq!(root.service, "ci-traces");
        assert_eq!(root.attributes["github.repository"], "acme/app");
        assert_eq!(root.attributes["ephemer.pool"], "local");
        assert_eq!(root.attributes["github.conclusion"], "success");
        assert!(root.attributes.contains_key("github.run.id"));
        // GitHub's own times, as its deliveries gave them (the stand-in's clock).
        let github = |key: &str| {
            let at = root.attributes.get(key);
            let at = at.unwrap_or_else(|| panic!("job {job}: no {key} on {root:?}"));
            humantime::parse_rfc3339(at).unwrap_or_else(|e| panic!("{key} {at}: {e}"))
        };
        assert!(github("github.started_at") >= github("github.created_at"));
        let kids = children(&spans, root);
        for k in &kids {
            assert_eq!(k.parent, root.span_id, "{k:?}");
            assert!(
                k.start_ms >= root.start_ms && k.end_ms <= root.end_ms,
                "job {job}: {k:?} outside its root {root:?}"
            );
        }
        let have = names(&kids);
        // The killed job's runner booted before the kill: its claim is an event of the root.
        let stages: &[&str] = if job == killed {
            &["job", "teardown"]
        } else {
            &[
                "environment boot",
                "registration to job start",
                "job",
                "teardown",
            ]
        };
        for stage in stages {
            assert!(have.contains(*stage), "job {job}: no {stage:?} in {have:?}");
        }
    }

    // The retried job: two claims, the first failed with its class, the retry an event.
    let root = &roots[&retried][0];
    let kids = children(&spans, root);
    let claims: Vec<_> = kids.iter().filter(|s| s.name == "claim").collect();
    assert_eq!(claims.len(), 2, "{claims:?}");
    assert!(
        claims[0]
            .error
            .as_deref()
            .is_some_and(|e| e.starts_with("server_side")),
        "{claims:?}"
    );
    assert!(
        root.events
            .iter()
            .any(|(n, a)| n == "retry scheduled" && a["ephemer.error.class"] == "server_side"),
        "{root:?}"
    );
    assert!(names(&kids).contains("waiting for a slot"));

    // The jobs across a restart: continued from their first delivery, the restart marked.
    for (job, at) in [(killed, kill_ms), (swapped, swap_ms)] {
        let root = &roots[&job][0];
        assert!(
            root.start_ms < at && root.end_ms > at,
            "job {job}: its trace spans the restart at {at}: {root:?}"
        );
        assert!(
            root.events.iter().any(|(n, _)| n == "restarted"),
            "job {job}: {root:?}"
        );
    }
    let root = &roots[&killed][0];
    assert!(
        root.events.iter().any(|(n, _)| n == "runner claimed"),
        "{root:?}"
    );
    assert!(
        metrics.contains("ephemerd_trace_spans_exported_total"),
        "{metrics}"
    );
    assert!(
        metrics.contains("ephemerd_trace_spans_dropped_total{reason=\"queue_full\"} 0"),
        "{metrics}"
    );
}

/// The collector refuses everything; a job ends and its trace waits in the outbox; the daemon
/// is killed (`kill -9`) at once and started again, and the collector stays away for a
/// minute more. Once it accepts, the trace arrives, once, and the outbox is empty.
#[actix_rt::test]
async fn a_finished_job_s_trace_survives_a_kill_9_and_a_collector_away_for_a_minute() {
    let receiver = Receiver::start(usize::MAX);
    let standin = support::standin(100);
    let extra = format!("[telemetry]\notlp_endpoint = \"{}\"\n", receiver.url);
    let daemon = Daemon::start(&standin, &extra, &local_provider(1)).await;
    let job = standin.queue_jobs("app", LABELS, 1)[0];
    daemon
        .wait_completed(&standin, 1, Duration::from_secs(60))
        .await;
    eventually("the trace refused once", Duration::from_secs(30), || {
        receiver.requests() >= 1
    })
    .await;
    let left = daemon.kill9().await;
    let outbox = left.0.path().join("state/traces");
    let kept = std::fs::read_dir(&outbox).map_or(0, |d| d.count());
    assert_eq!(kept, 1, "the trace waits on disk in {}", outbox.display());
    let daemon = Daemon::resume(&standin, left).await;
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert!(roots(&receiver.spans()).is_empty());
    receiver.refuse(0);
    let deadline = std::time::Instant::now() + Duration::from_secs(90);
    while !roots(&receiver.spans()).contains_key(&job) && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(
        roots(&receiver.spans()).get(&job).map(Vec::len),
        Some(1),
        "the trace arrived once:\n{}",
        daemon.logs()
    );
    let logs = daemon.logs();
    assert!(
        logs.contains(
            "job traces the collector had not accepted before the restart are sent again"
        ),
        "{logs}"
    );
    assert_eq!(daemon.stop(Duration::from_secs(30)).await.0, Some(0));
}
