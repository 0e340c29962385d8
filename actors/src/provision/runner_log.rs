//! A process runner's log (`state.dir/logs/<runner>.log`), kept near its cap while the runner
//! writes to it.
//!
//! The runner's output goes straight to the file (its stdout is the file, opened to append), so
//! the runner keeps writing across a restart of the daemon. A job that floods its output would
//! fill the state directory's disk (and logs are kept a week), so the daemon looks at the file
//! every second and cuts it past [`super::container::LOG_CAP`], keeping the newest part
//! ([`crate::bounded::cut_log`]).

use std::{path::PathBuf, time::Duration};

/// How often a runner's log is looked at, and cut past [`super::container::LOG_CAP`].
const LOG_LOOK: Duration = Duration::from_secs(1);

/// Keeps runner log `path` near its cap while the runner lives (a job flooding its output
/// cannot fill the state directory's disk); never ends by itself.
pub(super) async fn watch(path: PathBuf) -> std::convert::Infallible {
    let mut said = false;
    if crate::weaken::off("log-cap") {
        return std::future::pending().await;
    }
    loop {
        tokio::time::sleep(LOG_LOOK).await;
        let cut = {
            let path = path.clone();
            tokio::task::spawn_blocking(move || crate::bounded::cut_log(&path, super::container::LOG_CAP))
                .await
        };
        if matches!(cut, Ok(Ok(true))) && !said {
            said = true;
            tracing::warn!(log = %path.display(), cap = super::container::LOG_CAP, "a runner's output passed its log's cap: the log keeps its newest part");
        }
    }
}

