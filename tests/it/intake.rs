//! The intake's limits through the real daemon: what the headers alone decide is answered
//! before a byte of the body is read.

use std::time::Duration;

use github_standin::{Standin, StandinConfig};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::support::daemon::{Daemon, local_provider};

/// Sends only the headers of a POST declaring `length` bytes of body, and reads the answer,
/// waiting at most 3 s: a server that waited for the body would not answer.
async fn headers_only(addr: &str, extra: &str, length: usize) -> String {
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let head = format!(
        "POST /webhook/github HTTP/1.1\r\nHost: {addr}\r\nX-GitHub-Event: workflow_job\r\n\
         X-GitHub-Delivery: 5a6b\r\nContent-Type: application/json\r\n{extra}\
         Content-Length: {length}\r\n\r\n"
    );
    s.write_all(head.as_bytes()).await.unwrap();
    let mut buf = vec![0u8; 4096];
    let n = tokio::time::timeout(Duration::from_secs(3), s.read(&mut buf))
        .await
        .expect("answered before the body was sent")
        .unwrap();
    String::from_utf8_lossy(&buf[..n]).into_owned()
}

#[actix_rt::test]
async fn an_unsigned_or_oversized_delivery_is_refused_before_its_body_is_read() {
    let standin = Standin::start(StandinConfig::default()).unwrap();
    let daemon = Daemon::start(
        &standin,
        "[webhook]\nmax_body = \"64KiB\"\n",
        &local_provider(1),
    )
    .await;
    let unsigned = headers_only(&daemon.addr, "", 25 * 1024 * 1024).await;
    assert!(unsigned.starts_with("HTTP/1.1 401"), "{unsigned}");
    let signature = format!("X-Hub-Signature-256: sha256={}\r\n", "ab".repeat(32));
    let big = headers_only(&daemon.addr, &signature, 65 * 1024).await;
    assert!(big.starts_with("HTTP/1.1 413"), "{big}");
    let metrics = daemon.metrics().await;
    assert!(
        metrics.contains("ephemerd_github_webhook_events_total{action=\"queued\"} 0"),
        "nothing was handed over:\n{metrics}"
    );
    assert_eq!(daemon.stop(Duration::from_secs(30)).await.0, Some(0));
}

/// POSTs `body` with `signature` from local address `from` (a loopback address of the
/// 127.0.0.0/8 range: a peer of its own) and returns the status line's code.
async fn post_from(from: &str, addr: &str, body: &str, signature: &str) -> u16 {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind(format!("{from}:0").parse().unwrap()).unwrap();
    let mut s = socket.connect(addr.parse().unwrap()).await.unwrap();
    let head = format!(
        "POST /webhook/github HTTP/1.1\r\nHost: {addr}\r\nX-GitHub-Event: workflow_job\r\n\
         X-GitHub-Delivery: {}\r\nContent-Type: application/json\r\n\
         X-Hub-Signature-256: {signature}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        rand::random::<u32>(),
        body.len()
    );
    s.write_all(head.as_bytes()).await.unwrap();
    let _ = s.write_all(body.as_bytes()).await;
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut answer)).await;
    let text = String::from_utf8_lossy(&answer);
    text.split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0)
}

/// A peer that sends bad signatures has its next deliveries refused unread (429) for a while;
/// another peer's signed delivery is taken meanwhile, and this host's (loopback: a proxy in
/// front of the daemon) never strike out. The daemon listens on every address and the peers
/// are addresses added to `lo` for the test (not loopback ones).
#[actix_rt::test]
async fn a_peer_sending_bad_signatures_is_refused_while_others_are_served() {
    if !nix::unistd::geteuid().is_root() || crate::support::which("ip").is_none() {
        return crate::support::skip("intake gate", "adding addresses to lo needs root and ip");
    }
    let peers = ["10.254.0.1", "10.254.0.2"];
    for a in peers {
        let _ = std::process::Command::new("ip")
            .args(["addr", "add", &format!("{a}/32"), "dev", "lo"])
            .status();
    }
    let standin = Standin::start(StandinConfig::default()).unwrap();
    let daemon = Daemon::start_config(
        |port, state| {
            crate::support::daemon::config(&standin, port, state, "0s", "", &local_provider(1))
                .replace(
                    &format!("listen = \"127.0.0.1:{port}\""),
                    &format!("listen = \"0.0.0.0:{port}\""),
                )
        },
        &[],
    )
    .await;
    let port = daemon.addr.rsplit(':').next().unwrap().to_string();
    let job = ephemer_actors_core::github::event::render_workflow_job(
        "queued",
        &ephemer_actors_core::job::JobInfo {
            key: ephemer_actors_core::job::JobKey::new("acme", 77),
            repo: "app".into(),
            labels: vec!["self-hosted".to_string(), "gpu".to_string()].into(),
            ..Default::default()
        },
    );
    let bad = format!("sha256={}", "ab".repeat(32));
    let good = ephemer_actors_core::github::signature::sign(
        crate::support::daemon::SECRET.as_bytes(),
        job.as_bytes(),
    );
    let addr = format!("127.0.0.1:{port}");
    for _ in 0..3 {
        assert_eq!(post_from(peers[0], &addr, &job, &bad).await, 401);
        assert_eq!(post_from("127.0.0.1", &addr, &job, &bad).await, 401);
    }
    assert_eq!(
        post_from(peers[0], &addr, &job, &good).await,
        429,
        "the peer struck out"
    );
    assert_eq!(post_from(peers[1], &addr, &job, &good).await, 202);
    assert_eq!(
        post_from("127.0.0.1", &addr, &job, &good).await,
        202,
        "this host never strikes out"
    );
    let metrics = daemon.metrics().await;
    for a in peers {
        let _ = std::process::Command::new("ip")
            .args(["addr", "del", &format!("{a}/32"), "dev", "lo"])
            .status();
    }
    assert!(
        metrics.contains("ephemerd_webhook_refused_total{reason=\"overloaded\"} 1"),
        "{metrics}"
    );
    assert_eq!(daemon.stop(Duration::from_secs(30)).await.0, Some(0));
}
