//! Scale-set mode against the Actions service as GitHub's own clients describe it (the
//! stand-in plays the sources: actions/scaleset, actions-runner-controller, GARM): both message
//! shapes, capacity held against what the listener says, jobs withdrawn and assigned again,
//! messages that cannot be read, labels a service drops.

use std::time::Duration;

use github_standin::{RunnerBehavior, Standin, scaleset::MessageShape};

use crate::{
    scaleset::{ALPHA, BETA, assert_each_job_on_its_pool, standin, start},
    support::{daemon::Daemon, provision::eventually},
};

/// The id of the scale set named `name`.
pub(crate) fn set_id(standin: &Standin, name: &str) -> u64 {
    standin
        .scale_sets()
        .iter()
        .find(|(_, n, _, _)| n == name)
        .map(|(id, ..)| *id)
        .unwrap_or_else(|| panic!("no scale set {name}"))
}

/// A metric's value (0 when absent).
pub(crate) fn metric(metrics: &str, series: &str) -> u64 {
    metrics
        .lines()
        .find(|l| l.starts_with(series))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
        .unwrap_or(0)
}

/// The jobs that did not run (the service gave them up, or they never ended well).
pub(crate) fn jobs_not_run(standin: &Standin) -> Vec<u64> {
    standin
        .jobs()
        .iter()
        .filter(|j| j.conclusion.as_deref() != Some("success"))
        .map(|j| j.id)
        .collect()
}

/// How many times the service withdrew an assigned job no runner took in time.
pub(crate) fn withdrawals(standin: &Standin) -> u32 {
    standin
        .state()
        .scalesets
        .requests
        .values()
        .map(|r| r.withdrawals)
        .sum()
}

/// Every capacity the listeners sent was what their pool can run, never less.
pub(crate) fn assert_capacity_always(standin: &Standin, slots: u64) {
    let sent = standin.state().scalesets.capacities.clone();
    assert!(!sent.is_empty(), "no poll said its capacity");
    let below: Vec<_> = sent.iter().filter(|(_, c)| *c != slots).collect();
    assert!(
        below.is_empty(),
        "{} of {} polls said another capacity than the pool's {slots}: {below:?}",
        below.len(),
        sent.len()
    );
}

/// 40 jobs over two pools of 3 in each message shape, with the stand-in holding the jobs it
/// assigns against the capacity each listener says: every job runs once, on its own pool,
/// every poll says the pool's 3 (with the free slots said, assignment stalled at half the
/// pool), and GitHub's shape is met (acquired on a GHES, never on github.com).
#[actix_rt::test]
async fn both_message_shapes_run_a_backlog_with_capacity_said_as_the_pool_s() {
    for shape in [MessageShape::Dotcom, MessageShape::Ghes] {
        let standin = standin();
        standin.state().scalesets.shape = shape;
        let daemon = start(&standin, 3).await;
        for _ in 0..20 {
            standin.queue_jobs("app", ALPHA, 1);
            standin.queue_jobs("app", BETA, 1);
        }
        daemon
            .wait_completed(&standin, 40, Duration::from_secs(180))
            .await;
        assert_each_job_on_its_pool(&standin);
        daemon.wait_no_runner_left(&standin).await;
        assert_eq!(jobs_not_run(&standin), Vec::<u64>::new(), "{shape:?}");
        assert_capacity_always(&standin, 3);
        let acquired = standin.count("actions_acquire_jobs");
        match shape {
            MessageShape::Dotcom => assert_eq!(acquired, 0, "github.com assigns directly"),
            MessageShape::Ghes => assert!(acquired > 0, "a GHES offers first"),
        }
        let metrics = daemon.metrics().await;
        for pool in ["alpha", "beta"] {
            let assigned = metric(
                &metrics,
                &format!(
                    "ephemerd_scaleset_messages_total{{pool=\"{pool}\",type=\"JobAssigned\"}}"
                ),
            );
            assert_eq!(assigned, 20, "{shape:?} {pool}");
            let filled = metric(
                &metrics,
                &format!("ephemerd_scaleset_reckoned_total{{action=\"fill\",pool=\"{pool}\"}}"),
            );
            assert_eq!(
                filled, 0,
                "{shape:?}: every job came with its message, none was found by the reckoning"
            );
        }
        let registered = standin.count("actions_generate_jitconfig");
        assert!(
            (40..=44).contains(&registered),
            "{shape:?}: {registered} registrations for 40 jobs"
        );
        assert_eq!(daemon.stop(Duration::from_secs(30)).await.0, Some(0));
    }
}

/// Runners take 2.5 s to come up and the service withdraws an assigned job no runner took in
/// 2 s, then assigns it again with the same ids: every job still runs (before, the second
/// assignment was a duplicate of the first and most jobs were cancelled for good), and no
/// registration is left.
#[actix_rt::test]
async fn jobs_withdrawn_and_assigned_again_with_the_same_ids_get_runners() {
    let standin = standin();
    standin.set_behavior(RunnerBehavior {
        job_ms: 200,
        boot_ms: 2500,
        ..RunnerBehavior::default()
    });
    {
        let mut s = standin.state();
        s.scalesets.assign_windows = vec![Duration::from_secs(2)];
        s.scalesets.reassign_delay = Duration::from_millis(300);
    }
    let daemon = start(&standin, 4).await;
    standin.queue_jobs("app", ALPHA, 8);
    daemon
        .wait_completed(&standin, 8, Duration::from_secs(120))
        .await;
    let cancelled = jobs_not_run(&standin);
    assert!(
        cancelled.is_empty(),
        "jobs given up: {cancelled:?}\n{}",
        daemon.logs()
    );
    let withdrawn = withdrawals(&standin);
    assert!(
        withdrawn >= 8,
        "the service withdrew each job at least once: {withdrawn}"
    );
    daemon.wait_no_runner_left(&standin).await;
    assert!(
        daemon
            .logs()
            .contains("withdrew jobs no runner took in time")
    );
    // The registration goes at GitHub before the daemon's record of the runner does (its
    // teardown ends between the two): the record follows within moments.
    let mut runners = serde_json::Value::Null;
    for _ in 0..100 {
        runners = daemon.ctl_json(&["status"]).await["runners"].clone();
        if runners == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(runners, 0, "the daemon still holds runners");
    assert_eq!(daemon.stop(Duration::from_secs(30)).await.0, Some(0));
}

/// A message of a type the daemon does not know at the head of the queue, a job message with
/// a field of the wrong type, one of an unknown kind, and `null` in every field the service
/// leaves unset: all counted as unreadable (or read), acknowledged, and the jobs behind them
/// run (before, the queue was blocked for good and a new session opened every ~16 s).
#[actix_rt::test]
async fn what_the_daemon_cannot_read_is_counted_acknowledged_and_never_blocks_the_queue() {
    let standin = standin();
    let daemon = start(&standin, 2).await;
    let alpha = set_id(&standin, "alpha");
    {
        let mut s = standin.state();
        s.scalesets.inject_other(
            alpha,
            "RunnerScaleSetSomethingNew",
            r#"{"what":"next year's"}"#,
        );
        s.scalesets.inject(
            alpha,
            serde_json::json!({ "messageType": "JobAssigned", "jobId": "odd", "workflowRunId": "not a number" }),
        );
        s.scalesets.inject(
            alpha,
            serde_json::json!({ "messageType": "JobRequeuedSomeday", "jobId": "x" }),
        );
    }
    standin.queue_jobs("app", ALPHA, 5);
    daemon
        .wait_completed(&standin, 5, Duration::from_secs(60))
        .await;
    let metrics = daemon.metrics().await;
    let unreadable = metric(
        &metrics,
        "ephemerd_scaleset_messages_total{pool=\"alpha\",type=\"unreadable\"}",
    );
    assert_eq!(unreadable, 3, "{metrics}");
    let logs = daemon.logs();
    assert!(
        logs.contains("counted as unreadable and acknowledged"),
        "{logs}"
    );
    eventually("the queue is empty", Duration::from_secs(10), || {
        standin.state().scalesets.sets[&alpha].queue.is_empty()
    })
    .await;
    // One session all along: the unreadable message never made the listener start over.
    assert_eq!(
        standin.state().scalesets.sets[&alpha].sessions_opened.len(),
        1
    );
    daemon.wait_no_runner_left(&standin).await;
    assert_eq!(daemon.stop(Duration::from_secs(30)).await.0, Some(0));
}

/// A service that drops custom labels (a GHES without custom scale-set labels) keeps the name
/// alone: the daemon says so once, `runs-on: <pool>` still reaches the pool, and a restart
/// does not ask for the labels again.
#[actix_rt::test]
async fn labels_a_service_drops_are_said_once_and_never_asked_for_in_a_loop() {
    let standin = standin();
    standin.state().scalesets.custom_labels = false;
    let daemon = start(&standin, 2).await;
    let sets = standin.scale_sets();
    assert!(
        sets.iter()
            .all(|(_, name, labels, _)| labels.as_slice() == std::slice::from_ref(name)),
        "{sets:?}"
    );
    let logs = daemon.logs();
    assert_eq!(
        logs.matches("dropped its custom labels").count(),
        2,
        "once per pool: {logs}"
    );
    standin.queue_jobs("app", &["alpha"], 2);
    daemon
        .wait_completed(&standin, 2, Duration::from_secs(60))
        .await;
    let left = daemon.kill9().await;
    let daemon = Daemon::resume(&standin, left).await;
    standin.state().webhook = None;
    crate::scaleset::wait_listening(&standin, 2).await;
    standin.queue_jobs("app", &["beta"], 1);
    daemon
        .wait_completed(&standin, 3, Duration::from_secs(60))
        .await;
    assert_eq!(
        standin.count("actions_update_scale_set"),
        0,
        "the labels were not asked for again"
    );
    assert!(daemon.logs().contains("dropped its custom labels before"));
    assert_eq!(daemon.stop(Duration::from_secs(30)).await.0, Some(0));
}

/// A service whose answer to the create names the labels asked for while the scale set keeps
/// the name alone (github.com has been seen to): the daemon reads each scale set back, says
/// the difference once per pool, and shows it in the gauge and `status`.
#[actix_rt::test]
async fn labels_dropped_behind_an_answer_that_names_them_are_found_by_reading_back() {
    let standin = standin();
    {
        let mut state = standin.state();
        state.scalesets.custom_labels = false;
        state.scalesets.answer_dropped_labels = true;
    }
    let daemon = start(&standin, 2).await;
    let logs = daemon.logs();
    assert_eq!(
        logs.matches("dropped its custom labels").count(),
        2,
        "once per pool: {logs}"
    );
    assert_eq!(
        logs.matches("answer named other labels than it kept")
            .count(),
        2,
        "{logs}"
    );
    assert_eq!(
        standin.count("actions_get_scale_set_by_id"),
        2,
        "one read each"
    );
    let metrics = daemon.metrics().await;
    for pool in ["alpha", "beta"] {
        let series = format!("ephemerd_scaleset_labels_dropped{{pool=\"{pool}\"}}");
        assert_eq!(metric(&metrics, &series), 2, "{metrics}");
    }
    let (code, status, _) = daemon.ctl(&["status"]).await;
    assert_eq!(code, 0);
    assert_eq!(
        status
            .matches("labels dropped by the service: self-hosted, linux")
            .count(),
        2,
        "{status}"
    );
    // `runs-on: <pool>` still reaches the pool.
    standin.queue_jobs("app", &["alpha"], 1);
    daemon
        .wait_completed(&standin, 1, Duration::from_secs(60))
        .await;
    assert_eq!(daemon.stop(Duration::from_secs(30)).await.0, Some(0));
}

/// The service URL comes from GitHub's answer, not the config (issue 52, item 6): one on
/// another host, in clear, is never followed with the admin token. Before, the daemon sent the
/// token wherever the answer said.
#[actix_rt::test]
async fn a_service_url_on_another_host_in_clear_is_never_followed_with_the_token() {
    let standin = standin();
    let port = standin.addr().port();
    // Reachable (localhost is this host), but not the host api_url names.
    standin.state().scalesets.service_base = Some(format!("http://localhost:{port}"));
    let daemon = Daemon::start_with_github(
        &standin,
        crate::scaleset::ORG_LEVEL,
        "[webhook]\nmode = \"scaleset\"\n",
        &crate::scaleset::two_pools_with(1, ""),
    )
    .await;
    eventually("the refusal is said", Duration::from_secs(20), || {
        daemon
            .logs()
            .contains("refused to follow the Actions service")
    })
    .await;
    assert!(standin.count("actions_admin_connection") >= 1);
    for endpoint in [
        "actions_get_runner_group",
        "actions_get_scale_set",
        "actions_create_scale_set",
        "actions_create_session",
    ] {
        assert_eq!(standin.count(endpoint), 0, "{endpoint} was called");
    }
    assert!(
        daemon
            .logs()
            .contains("is neither 127.0.0.1 (github.api_url)"),
        "{}",
        daemon.logs()
    );
    assert_eq!(daemon.stop(Duration::from_secs(30)).await.0, Some(0));
}

/// Two scale sets that both cover a job (the "assignment race", ARC#4004): GitHub, not the
/// daemon, picks which one gets it, and only that one's listener hears of it. Jobs labelled
/// `[self-hosted, linux]`, which both pools' scale sets cover: each runs once, on a runner of
/// the scale set the service assigned it to, and the other pool claims nothing for it.
#[actix_rt::test]
async fn a_job_two_scale_sets_cover_runs_once_in_the_one_github_assigned() {
    let standin = standin();
    let daemon = start(&standin, 2).await;
    let both = &["self-hosted", "linux"];
    standin.queue_jobs("app", both, 6);
    daemon
        .wait_completed(&standin, 6, Duration::from_secs(60))
        .await;
    let not_run = jobs_not_run(&standin);
    assert!(not_run.is_empty(), "{not_run:?}");
    let names: std::collections::BTreeMap<u64, String> = standin
        .scale_sets()
        .into_iter()
        .map(|(id, name, ..)| (id, name))
        .collect();
    let assigned: std::collections::BTreeMap<u64, u64> = standin
        .state()
        .scalesets
        .requests
        .values()
        .map(|r| (r.job_id, r.set_id))
        .collect();
    for job in standin.jobs() {
        let set = &names[&assigned[&job.id]];
        let runner = job.runner_name.clone().unwrap_or_default();
        assert!(
            runner.contains(&format!("-{set}-")),
            "job {} assigned to {set} ran on {runner}",
            job.id
        );
    }
    assert_eq!(
        standin.count("actions_generate_jitconfig"),
        6,
        "one runner a job: the other scale set's pool claimed nothing"
    );
    daemon.wait_no_runner_left(&standin).await;
    assert_eq!(daemon.stop(Duration::from_secs(30)).await.0, Some(0));
}
