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
