//! Waiting on the stand-in for one daemon or a fleet of them, with every host's logs in what a
//! failure says.

use std::time::Duration;

use github_standin::Standin;

use super::daemon::Daemon;

/// Every host's logs, each under its own heading.
pub(crate) fn logs(hosts: &[Daemon]) -> String {
    hosts
        .iter()
        .enumerate()
        .map(|(i, d)| format!("===== h{} =====\n{}", i + 1, d.logs()))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Waits until the stand-in has `n` jobs completed. A failure names the open jobs before and
/// after the logs: a CI excerpt keeps only the end.
pub(crate) async fn wait_completed(
    standin: &Standin,
    n: usize,
    within: Duration,
    hosts: &[Daemon],
) {
    let deadline = tokio::time::Instant::now() + within;
    while standin.jobs_in("completed") < n {
        if tokio::time::Instant::now() > deadline {
            let open: Vec<_> = standin
                .jobs()
                .into_iter()
                .filter(|j| j.status != "completed")
                .map(|j| (j.id, j.status, j.labels))
                .collect();
            let done = standin.jobs_in("completed");
            panic!(
                "{done} of {n} jobs completed; open: {open:?}\n{}\n{done} of {n} jobs completed; open: {open:?}",
                logs(hosts)
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits until the stand-in has no runner registration left.
pub(crate) async fn wait_no_registration_left(
    standin: &Standin,
    within: Duration,
    hosts: &[Daemon],
) {
    let deadline = tokio::time::Instant::now() + within;
    while !standin.runners().is_empty() {
        // What is left is named again after the logs: a CI excerpt keeps the end.
        assert!(
            tokio::time::Instant::now() < deadline,
            "registrations left: {left:?}\n{}\nregistrations left: {left:?}",
            logs(hosts),
            left = standin.runners()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
