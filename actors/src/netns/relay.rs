//! A relay from a job's namespace to the GitHub this host serves on its own loopback (a GHES or
//! a stand-in on `127.0.0.1`): the job's runner must reach its GitHub, and the namespace's
//! loopback is its own. A listener bound at the same address and port inside the namespace,
//! served by the daemon, which connects to that one address on the host's loopback for each
//! connection: nothing else of the host is reachable through it.

use std::{net::SocketAddr, path::Path, sync::Arc};

use tokio::net::{TcpListener, TcpStream};

/// Connections relayed at once, per job.
const MAX_CONNECTIONS: usize = 32;

/// Binds `to` (a loopback address of the host) inside the namespace at `netns`.
pub(super) async fn bind_in(netns: &Path, to: SocketAddr) -> std::io::Result<std::net::TcpListener> {
    let netns = netns.to_path_buf();
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name("ephemer-netns-relay".into())
        .spawn(move || {
            let bound = (|| {
                super::dns::enter(&netns)?;
                let l = std::net::TcpListener::bind(to)?;
                l.set_nonblocking(true)?;
                Ok(l)
            })();
            let _ = tx.send(bound);
        })?;
    rx.await
        .unwrap_or_else(|_| Err(std::io::Error::other("the binding thread died")))
}

/// Serves `listener` until aborted: each connection joined to `to` on the host.
pub(super) async fn serve(listener: std::net::TcpListener, to: SocketAddr) {
    let Ok(listener) = TcpListener::from_std(listener) else {
        tracing::warn!(%to, "cannot serve a job's relay to its GitHub");
        return;
    };
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    loop {
        let Ok((mut inside, _)) = listener.accept().await else {
            continue;
        };
        let Ok(permit) = slots.clone().try_acquire_owned() else {
            continue;
        };
        actix_rt::spawn(async move {
            if let Ok(mut host) = TcpStream::connect(to).await {
                let _ = tokio::io::copy_bidirectional(&mut inside, &mut host).await;
            }
            drop(permit);
        });
    }
}
