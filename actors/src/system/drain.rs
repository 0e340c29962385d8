//! Draining an instance: cordon, wait for running jobs, tear down and delete what remains.

use super::Handles;

/// What a stop may take after `shutdown_timeout` at most: the teardown of what still runs (a
/// 60 s cap), GitHub calls in flight (30 s), the store's close (10 s), and some slack. A
/// service manager's stop window is `shutdown_timeout` plus this.
pub const AFTER_SHUTDOWN_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(120);

/// Drains an instance: cordon (no new claims, no new retries; job events keep being handled),
/// wait up to `timeout` for every runner to finish, then tear down and delete what remains.
/// Returns how many runners had to be torn down.
pub async fn drain(handles: &Handles, timeout: std::time::Duration) -> usize {
    drain_until(handles, timeout, std::future::pending()).await
}

/// Like [`drain`], but the wait for running jobs also ends when `hurry` resolves.
pub async fn drain_until(
    handles: &Handles,
    timeout: std::time::Duration,
    hurry: impl std::future::Future<Output = ()>,
) -> usize {
    use crate::scheduler::messages::{
        BeginShutdown, CallsInFlight, FlushDeferred, GetStatus, TeardownAll,
    };
    const POLL: std::time::Duration = std::time::Duration::from_millis(200);
    let runners = || async {
        handles
            .scheduler
            .send(GetStatus)
            .await
            .map(|s| s.runners)
            .unwrap_or(0)
    };
    // Claims, deletions and busy checks already sent get their answers before the actors
    // stop: a claim answered after it would leave a registration nobody runs.
    let calls = || async { handles.scheduler.send(CallsInFlight).await.unwrap_or(0) };
    let settle = || async {
        let until = tokio::time::Instant::now() + std::time::Duration::from_secs(30);
        while calls().await > 0 && tokio::time::Instant::now() < until {
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    };
    let _ = handles.scheduler.send(BeginShutdown).await;
    // No warm environment outlives the drain: each pool removes its own, and answers once
    // they are gone.
    for pool in handles.provisioners.values() {
        let _ = pool.warm.send(crate::provision::warm::WarmHold(true)).await;
    }
    let deadline = tokio::time::Instant::now() + timeout;
    settle().await;
    let mut left = runners().await;
    tracing::info!(runners = left, timeout = ?timeout, "draining: waiting for running jobs");
    tokio::pin!(hurry);
    let mut hurried = false;
    while left > 0 && tokio::time::Instant::now() < deadline && !hurried {
        tokio::select! {
            () = tokio::time::sleep(POLL) => {}
            () = &mut hurry => {
                hurried = true;
                tracing::warn!(runners = left, "asked again to stop: tearing down the running jobs now");
            }
        }
        left = runners().await;
    }
    if left == 0 {
        let _ = handles.scheduler.send(FlushDeferred).await;
        settle().await;
        return 0;
    }
    if !hurried {
        tracing::warn!(
            runners = left,
            "shutdown_timeout reached; tearing down what remains"
        );
    }
    let _ = handles.scheduler.send(TeardownAll).await;
    // Teardown itself is bounded by the provisioners' kill grace; give it that long and more.
    let teardown_deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(60);
    while runners().await > 0 && tokio::time::Instant::now() < teardown_deadline {
        tokio::time::sleep(POLL).await;
    }
    let _ = handles.scheduler.send(FlushDeferred).await;
    settle().await;
    left
}
