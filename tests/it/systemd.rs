//! `serve` under a service manager: the `sd_notify` protocol on a stub `NOTIFY_SOCKET`.

use std::{
    os::unix::net::UnixDatagram,
    sync::{Arc, Mutex},
    time::Duration,
};

use crate::support::daemon::{Daemon, local_provider};

/// Collects every datagram sent to a socket bound in a temp dir.
struct StubManager {
    path: std::path::PathBuf,
    seen: Arc<Mutex<Vec<String>>>,
    _dir: tempfile::TempDir,
}

impl StubManager {
    fn start() -> StubManager {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("notify.sock");
        let socket = UnixDatagram::bind(&path).unwrap();
        socket
            .set_read_timeout(Some(Duration::from_millis(200)))
            .unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let sink = seen.clone();
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            // Ends when the test's process does; a stale socket path is in a removed dir.
            loop {
                if let Ok(n) = socket.recv(&mut buf) {
                    sink.lock()
                        .unwrap()
                        .push(String::from_utf8_lossy(&buf[..n]).into_owned());
                }
            }
        });
        StubManager {
            path,
            seen,
            _dir: dir,
        }
    }

    fn seen(&self) -> Vec<String> {
        self.seen.lock().unwrap().clone()
    }

    async fn wait_for(&self, what: &str, within: Duration) {
        let deadline = tokio::time::Instant::now() + within;
        while !self.seen().iter().any(|m| m.contains(what)) {
            assert!(
                tokio::time::Instant::now() < deadline,
                "no {what} within {within:?}: {:?}",
                self.seen()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// READY=1 once serving; during a drain that waits for a running job, STOPPING=1, STATUS lines
/// with the runners left, and EXTEND_TIMEOUT_USEC, renewed while the drain goes on.
#[actix_rt::test]
async fn serve_tells_the_service_manager_it_is_ready_and_how_a_drain_goes() {
    let manager = StubManager::start();
    let standin = crate::support::standin(9_000);
    let path = manager.path.display().to_string();
    let daemon = Daemon::start_with_env(
        &standin,
        "",
        &local_provider(1),
        &[("NOTIFY_SOCKET", &path)],
    )
    .await;
    manager.wait_for("READY=1", Duration::from_secs(5)).await;
    standin.queue_jobs("app", &["self-hosted", "linux", "x64"], 1);
    crate::support::provision::eventually("the job running", Duration::from_secs(20), || {
        standin.jobs_in("in_progress") == 1
    })
    .await;
    let watch = async {
        manager.wait_for("STOPPING=1", Duration::from_secs(5)).await;
        manager
            .wait_for(
                "STATUS=draining: 1 runners still running",
                Duration::from_secs(5),
            )
            .await;
        // A second tick renews the extension while the job still runs.
        tokio::time::sleep(Duration::from_secs(6)).await;
        manager
            .seen()
            .iter()
            .filter(|m| m.contains("EXTEND_TIMEOUT_USEC=15000000"))
            .count()
    };
    let ((code, _), extensions) = tokio::join!(daemon.stop(Duration::from_secs(30)), watch);
    assert!(extensions >= 2, "{:?}", manager.seen());
    assert_eq!(code, Some(0));
    assert_eq!(
        standin.jobs_in("completed"),
        1,
        "the drain let the job finish"
    );
    manager
        .wait_for("STATUS=stopped", Duration::from_secs(2))
        .await;
}
