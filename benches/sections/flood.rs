//! Unverified bodies under a flood: 200 connections send 1 MiB deliveries with a well-formed
//! but wrong signature to the real `serve`, as fast as they can, while a good peer sends a
//! signed delivery every 50 ms from another address. The good delivery's answer time is the
//! figure (target: the flood adds at most 100 ms). Two floods: all from one address, and from
//! 200 addresses (one each, so no per-peer rule helps by itself). The flood's addresses are
//! added to `lo` for the run (`10.255.x.y`: not loopback, which never strikes out); needs root
//! and `ip`.

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use ephemer_actors_core::github::signature::sign;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::outside::{Killed, free_port, serve_config, wait_ready};

const FLOODERS: usize = 200;
const BAD_BODY: usize = 1 << 20;
const RUN: Duration = Duration::from_secs(10);

/// One POST from `from` (a loopback address), `body` sent after the headers; the status and
/// the time to the answer.
async fn post(
    from: std::net::Ipv4Addr,
    addr: std::net::SocketAddr,
    body: &[u8],
    signature: &str,
) -> Option<(u16, Duration)> {
    let socket = tokio::net::TcpSocket::new_v4().ok()?;
    socket.bind((from, 0).into()).ok()?;
    let started = Instant::now();
    let mut s = socket.connect(addr).await.ok()?;
    let head = format!(
        "POST /webhook/github HTTP/1.1\r\nHost: {addr}\r\nX-GitHub-Event: workflow_job\r\n\
         X-GitHub-Delivery: {}\r\nContent-Type: application/json\r\n\
         X-Hub-Signature-256: {signature}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        rand::random::<u64>(),
        body.len()
    );
    s.write_all(head.as_bytes()).await.ok()?;
    // The server may answer (and close) before the body is all sent: that is the point.
    let _ = s.write_all(body).await;
    let mut answer = [0u8; 64];
    let n = tokio::time::timeout(Duration::from_secs(15), s.read(&mut answer))
        .await
        .ok()?
        .ok()?;
    let code = std::str::from_utf8(&answer[..n])
        .ok()?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()?;
    Some((code, started.elapsed()))
}

/// The address flooder `i` sends from.
fn flooder_address(i: usize) -> std::net::Ipv4Addr {
    std::net::Ipv4Addr::new(10, 255, 1 + (i / 250) as u8, 1 + (i % 250) as u8)
}

/// Adds (or with `del`, removes) the flooders' addresses on `lo`.
fn addresses(del: bool) -> bool {
    (0..FLOODERS).all(|i| {
        std::process::Command::new("ip")
            .args(["addr", if del { "del" } else { "add" }])
            .arg(format!("{}/32", flooder_address(i)))
            .args(["dev", "lo"])
            .stderr(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
            || del
    })
}

fn quantile(sorted: &[Duration], q: f64) -> Duration {
    sorted
        .get(((sorted.len() as f64 - 1.0) * q).round() as usize)
        .copied()
        .unwrap_or_default()
}

/// The good peer's answer times over `RUN`, with `flood` connections at work meanwhile (from
/// one address, or one address each). The flood runs on a thread of its own, so the good
/// peer's times are the daemon's, not the flood's client's.
fn measure(addr: std::net::SocketAddr, flood: usize, spread: bool) -> (Vec<Duration>, u64) {
    let stop = Arc::new(AtomicBool::new(false));
    let flooded = Arc::new(AtomicU64::new(0));
    let flooder = {
        let (stop, flooded) = (stop.clone(), flooded.clone());
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async {
                let bad_body: Arc<Vec<u8>> = Arc::new(vec![b'{'; BAD_BODY]);
                let bad_sig = format!("sha256={}", "ab".repeat(32));
                let mut tasks = Vec::new();
                for i in 0..flood {
                    let (stop, flooded, body, sig) = (
                        stop.clone(),
                        flooded.clone(),
                        bad_body.clone(),
                        bad_sig.clone(),
                    );
                    let from = flooder_address(if spread { i } else { 0 });
                    tasks.push(tokio::spawn(async move {
                        while !stop.load(Ordering::Relaxed) {
                            if post(from, addr, &body, &sig).await.is_some() {
                                flooded.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                    }));
                }
                for t in tasks {
                    let _ = tokio::time::timeout(Duration::from_secs(30), t).await;
                }
            });
        })
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut times = rt.block_on(async {
        let mut times = Vec::new();
        let started = Instant::now();
        let mut id = 9_000_000u64;
        while started.elapsed() < RUN {
            id += 1;
            let good = super::body(id, &["self-hosted", "gpu"]);
            let sig = sign(super::SECRET.as_bytes(), good.as_bytes());
            let from = std::net::Ipv4Addr::new(127, 0, 0, 2);
            match post(from, addr, good.as_bytes(), &sig).await {
                Some((202, took)) => times.push(took),
                Some((code, _)) => panic!("a good delivery was answered {code}"),
                None => panic!("a good delivery got no answer"),
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        times
    });
    stop.store(true, Ordering::Relaxed);
    let _ = flooder.join();
    times.sort();
    (times, flooded.load(Ordering::Relaxed))
}

/// The section: prints its table.
pub fn flood(api: &str) {
    println!("\n## Unverified bodies under a flood\n");
    addresses(true);
    if !addresses(false) {
        println!("cannot add the flood's addresses to lo (root and ip needed): section skipped");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let cfg = serve_config(dir.path(), api, port);
    let _serve = Killed(
        std::process::Command::new(env!("CARGO_BIN_EXE_ephemer-actors"))
            .args(["serve", "--config"])
            .arg(&cfg)
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    );
    let addr: std::net::SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    wait_ready(&addr.to_string());
    println!(
        "| load on the daemon | good deliveries | p50 | p99 | max | flood requests answered |"
    );
    println!("|---|---|---|---|---|---|");
    for (what, flood, spread) in [
        ("none", 0, false),
        (
            "200 connections from one address, 1 MiB bad-signature bodies",
            FLOODERS,
            false,
        ),
        (
            "200 connections from 200 addresses, 1 MiB bad-signature bodies",
            FLOODERS,
            true,
        ),
    ] {
        let (times, flooded) = measure(addr, flood, spread);
        let ms = |d: Duration| format!("{:.1} ms", d.as_secs_f64() * 1000.0);
        println!(
            "| {what} | {} | {} | {} | {} | {flooded} |",
            times.len(),
            ms(quantile(&times, 0.5)),
            ms(quantile(&times, 0.99)),
            ms(times.last().copied().unwrap_or_default()),
        );
    }
    addresses(true);
}
