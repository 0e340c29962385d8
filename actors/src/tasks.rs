//! Tasks the daemon spawns beside its actors (a store's watcher, the ledger's listeners, a
//! warm environment's stop, a log's write), counted while they live: what `GET
//! /api/v1/census` reports as `runtime.tasks`, so a soak sees a task per job that never ends.
//! Process-wide, as the RSS is: two instances in one process share the count. An actor's own
//! futures and timers end with it, and the actors of an instance are a fixed set.

use std::{
    future::Future,
    sync::atomic::{AtomicUsize, Ordering},
};

static ALIVE: AtomicUsize = AtomicUsize::new(0);

/// Counts one task from its spawn until it ends or is dropped.
struct Alive;

impl Alive {
    fn new() -> Self {
        ALIVE.fetch_add(1, Ordering::Relaxed);
        Alive
    }
}

impl Drop for Alive {
    fn drop(&mut self) {
        ALIVE.fetch_sub(1, Ordering::Relaxed);
    }
}

/// `actix_rt::spawn`, counted.
pub fn spawn<F>(fut: F) -> actix_rt::task::JoinHandle<F::Output>
where
    F: Future + 'static,
    F::Output: 'static,
{
    let alive = Alive::new();
    actix_rt::spawn(async move {
        let _alive = alive;
        fut.await
    })
}

/// Tasks spawned with [`spawn`] that have not ended.
pub fn alive() -> usize {
    ALIVE.load(Ordering::Relaxed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[actix_rt::test]
    async fn a_task_is_counted_until_it_ends() {
        let before = alive();
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let task = spawn(async move {
            let _ = rx.await;
        });
        assert_eq!(alive(), before + 1);
        tx.send(()).unwrap();
        task.await.unwrap();
        assert_eq!(alive(), before);
    }
}
