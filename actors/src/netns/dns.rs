//! The DNS forwarder of one job's namespace: sockets bound at `127.0.0.1:53` inside the
//! namespace (where the namespace's own rule sends every query, whatever server it named),
//! served by the daemon from the host's namespace, asking the host's name servers.
//!
//! A query is passed on only when it is one ([`ephemer_decide::egress::dns`]); an answer is
//! passed back only when it answers that query (id and question) from the server it was sent
//! to. At most [`dns::MAX_IN_FLIGHT`] queries of a namespace wait at once, each for
//! [`UPSTREAM_WAIT`] a server; TCP connections are few and short.

use std::{
    net::SocketAddr,
    path::{Path, PathBuf},
    rc::Rc,
    sync::Arc,
    time::Duration,
};

use ephemer_decide::egress::dns;

use super::watch::{Verdict, Watch};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{TcpListener, TcpStream, UdpSocket},
};

/// How long one upstream server gets to answer.
const UPSTREAM_WAIT: Duration = Duration::from_secs(3);
/// How long a TCP client of the namespace may take with its query.
const CLIENT_WAIT: Duration = Duration::from_secs(10);
/// TCP connections served at once.
const MAX_TCP_CLIENTS: usize = 8;

/// The forwarder's sockets, bound inside a namespace.
#[derive(Debug)]
pub struct Sockets {
    udp: std::net::UdpSocket,
    tcp: std::net::TcpListener,
}

/// Binds UDP and TCP `127.0.0.1:53` inside the namespace at `netns`, from a thread of its own
/// that enters it and ends (a socket keeps the namespace it was made in).
pub async fn bind_in(netns: &Path) -> std::io::Result<Sockets> {
    let netns: PathBuf = netns.to_path_buf();
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name("ephemer-netns-bind".into())
        .spawn(move || {
            let bound = (|| {
                enter(&netns)?;
                let udp = std::net::UdpSocket::bind("127.0.0.1:53")?;
                let tcp = std::net::TcpListener::bind("127.0.0.1:53")?;
                udp.set_nonblocking(true)?;
                tcp.set_nonblocking(true)?;
                Ok(Sockets { udp, tcp })
            })();
            let _ = tx.send(bound);
        })?;
    rx.await
        .unwrap_or_else(|_| Err(std::io::Error::other("the binding thread died")))
}

/// Moves the calling thread into the network namespace at `netns`.
#[cfg(target_os = "linux")]
fn enter(netns: &Path) -> std::io::Result<()> {
    let ns = std::fs::File::open(netns)?;
    nix::sched::setns(ns, nix::sched::CloneFlags::CLONE_NEWNET).map_err(std::io::Error::from)
}

/// Network namespaces are Linux's: a pool that needs one is refused on other hosts by
/// check-config, so this is never reached there.
#[cfg(not(target_os = "linux"))]
fn enter(_netns: &Path) -> std::io::Result<()> {
    Err(std::io::Error::new(
        std::io::ErrorKind::Unsupported,
        "network namespaces need a Linux host",
    ))
}

/// Serves the namespace's queries until aborted, each as `watch` decides.
pub async fn serve(sockets: Sockets, upstreams: Arc<Vec<SocketAddr>>, watch: Arc<Watch>) {
    let (Ok(udp), Ok(tcp)) = (
        UdpSocket::from_std(sockets.udp),
        TcpListener::from_std(sockets.tcp),
    ) else {
        tracing::warn!("cannot serve a job's DNS forwarder");
        return;
    };
    let udp = Rc::new(udp);
    let in_flight = Arc::new(tokio::sync::Semaphore::new(dns::MAX_IN_FLIGHT));
    let tcp_clients = Arc::new(tokio::sync::Semaphore::new(MAX_TCP_CLIENTS));
    let mut buf = vec![0u8; dns::MAX_UDP];
    loop {
        tokio::select! {
            got = udp.recv_from(&mut buf) => {
                let Ok((n, from)) = got else { continue };
                let query = buf[..n].to_vec();
                if !dns::is_query(&query, dns::MAX_UDP) {
                    continue;
                }
                let Ok(permit) = in_flight.clone().try_acquire_owned() else { continue };
                let (udp, upstreams, watch) = (udp.clone(), upstreams.clone(), watch.clone());
                actix_rt::spawn(async move {
                    if let Some(answer) = answer(&query, &upstreams, &watch, ask_udp).await {
                        let _ = udp.send_to(&answer, from).await;
                    }
                    drop(permit);
                });
            }
            conn = tcp.accept() => {
                let Ok((stream, _)) = conn else { continue };
                let Ok(permit) = tcp_clients.clone().try_acquire_owned() else { continue };
                let (upstreams, watch) = (upstreams.clone(), watch.clone());
                actix_rt::spawn(async move {
                    let _ = tokio::time::timeout(CLIENT_WAIT, serve_tcp(stream, &upstreams, &watch)).await;
                    drop(permit);
                });
            }
        }
    }
}

/// What `query` is answered with, as `watch` decides: `REFUSED`, or the upstream's answer
/// (its addresses pinned first where the job's mode asks it), or nothing. Upstream, the query
/// goes under a fresh random id, and the answer comes back under the job's.
async fn answer<'a, F, Fut>(
    query: &[u8],
    upstreams: &'a [SocketAddr],
    watch: &Watch,
    ask: F,
) -> Option<Vec<u8>>
where
    F: FnOnce(Vec<u8>, &'a [SocketAddr]) -> Fut,
    Fut: std::future::Future<Output = Option<Vec<u8>>>,
{
    match watch.lookup(query) {
        Verdict::Refuse => dns::refused(query),
        Verdict::Ask { pin } => {
            let job_id = dns::id(query)?;
            let answer = ask(dns::with_id(query, rand::random()), upstreams).await?;
            if pin && !watch.pin(&answer).await {
                return None;
            }
            Some(dns::with_id(&answer, job_id))
        }
    }
}

/// The answer to `query` from the first upstream that gives one.
async fn ask_udp(query: Vec<u8>, upstreams: &[SocketAddr]) -> Option<Vec<u8>> {
    for server in upstreams {
        let local: SocketAddr = if server.is_ipv4() {
            "0.0.0.0:0".parse().ok()?
        } else {
            "[::]:0".parse().ok()?
        };
        let Ok(sock) = UdpSocket::bind(local).await else {
            continue;
        };
        if sock.connect(server).await.is_err() || sock.send(&query).await.is_err() {
            continue;
        }
        let mut buf = vec![0u8; dns::MAX_UDP];
        let wait = async {
            loop {
                let n = sock.recv(&mut buf).await.ok()?;
                if dns::answers(&query, &buf[..n]) {
                    return Some(buf[..n].to_vec());
                }
            }
        };
        if let Ok(Some(answer)) = tokio::time::timeout(UPSTREAM_WAIT, wait).await {
            return Some(answer);
        }
    }
    None
}

/// One TCP client: length-prefixed queries, each asked of an upstream over TCP.
async fn serve_tcp(mut client: TcpStream, upstreams: &[SocketAddr], watch: &Watch) -> Option<()> {
    loop {
        let query = read_framed(&mut client).await?;
        if !dns::is_query(&query, dns::MAX_TCP) {
            return None;
        }
        let answer = answer(&query, upstreams, watch, ask_tcp).await?;
        let len = u16::try_from(answer.len()).ok()?;
        client.write_all(&len.to_be_bytes()).await.ok()?;
        client.write_all(&answer).await.ok()?;
    }
}

async fn ask_tcp(query: Vec<u8>, upstreams: &[SocketAddr]) -> Option<Vec<u8>> {
    for server in upstreams {
        let exchange = async {
            let mut s = TcpStream::connect(server).await.ok()?;
            let len = u16::try_from(query.len()).ok()?;
            s.write_all(&len.to_be_bytes()).await.ok()?;
            s.write_all(&query).await.ok()?;
            let answer = read_framed(&mut s).await?;
            dns::answers(&query, &answer).then_some(answer)
        };
        if let Ok(Some(answer)) = tokio::time::timeout(UPSTREAM_WAIT, exchange).await {
            return Some(answer);
        }
    }
    None
}

/// One length-prefixed message (at most [`dns::MAX_TCP`] bytes, by its prefix).
async fn read_framed(s: &mut TcpStream) -> Option<Vec<u8>> {
    let mut len = [0u8; 2];
    s.read_exact(&mut len).await.ok()?;
    let mut msg = vec![0u8; usize::from(u16::from_be_bytes(len))];
    s.read_exact(&mut msg).await.ok()?;
    Some(msg)
}

#[cfg(test)]
mod tests {
    use super::*;
    use ephemer_decide::egress::dns::query;

    /// A resolver on loopback that answers each query for a name with its question and one
    /// address, after a spoofed answer with another id.
    async fn resolver() -> SocketAddr {
        let sock = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let addr = sock.local_addr().unwrap();
        actix_rt::spawn(async move {
            let mut buf = [0u8; 512];
            while let Ok((n, from)) = sock.recv_from(&mut buf).await {
                let mut spoof = buf[..n].to_vec();
                spoof[2] |= 0x80;
                spoof[0] ^= 0xff;
                let _ = sock.send_to(&spoof, from).await;
                let mut a = buf[..n].to_vec();
                a[2] |= 0x80;
                a[7] = 1;
                a.extend([0xc0, 12, 0, 1, 0, 1, 0, 0, 0, 60, 0, 4, 192, 0, 2, 7]);
                let _ = sock.send_to(&a, from).await;
            }
        });
        addr
    }

    #[actix_rt::test]
    async fn a_query_is_answered_by_the_upstream_and_a_spoof_with_another_id_is_not_passed() {
        let upstream = resolver().await;
        let q = query(7, "github.com");
        let a = ask_udp(q.clone(), &[upstream]).await.expect("an answer");
        assert!(dns::answers(&q, &a));
        assert!(a.ends_with(&[192, 0, 2, 7]));
    }

    #[actix_rt::test]
    async fn an_upstream_that_says_nothing_is_passed_over() {
        let silent = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let upstream = resolver().await;
        let q = query(9, "x.example");
        let a = ask_udp(q.clone(), &[silent.local_addr().unwrap(), upstream]).await;
        assert!(a.is_some());
    }

    #[actix_rt::test]
    async fn the_job_s_transaction_id_never_leaves_the_forwarder() {
        let watch = Watch::new(
            ephemer_decide::egress::Slot(3),
            super::super::Egress::open(&crate::config::PoolName::new("linux")),
        );
        let q = query(0x4242, "github.com");
        let asked = std::rc::Rc::new(std::cell::Cell::new(None));
        let mut ids = Vec::new();
        for _ in 0..4 {
            let seen = asked.clone();
            let a = answer(&q, &[], &watch, |up: Vec<u8>, _| async move {
                seen.set(dns::id(&up));
                let mut a = up;
                a[2] |= 0x80;
                Some(a)
            })
            .await
            .expect("an answer");
            assert_eq!(dns::id(&a), Some(0x4242), "the job gets its own id back");
            assert!(dns::answers(&q, &a));
            ids.push(asked.get().unwrap());
        }
        assert!(ids.iter().any(|id| *id != 0x4242));
        ids.dedup();
        assert!(ids.len() > 1, "a fresh id each time: {ids:?}");
    }
}
