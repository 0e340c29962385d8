//! An HTTP proxy that only tunnels: `CONNECT host:port` (RFC 9110 9.3.6), as corporate proxies
//! (squid, the usual `HTTPS_PROXY`) let HTTPS through. It counts the tunnels and what they
//! went to, requires the credentials it was given, and resolves names of its own (a host only
//! the proxy knows proves a call went through it).

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
};

use base64::Engine;
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{TcpListener, TcpStream},
};

/// A running proxy on its own thread.
pub struct ConnectProxy {
    /// `127.0.0.1:port`
    pub addr: std::net::SocketAddr,
    tunnels: Arc<Mutex<Vec<String>>>,
    refused: Arc<Mutex<usize>>,
}

impl ConnectProxy {
    /// Starts it. `user:password` is required when given; `hosts` maps names only the proxy
    /// resolves (to `127.0.0.1`, say).
    pub fn start(credentials: Option<&str>, hosts: &[(&str, &str)]) -> ConnectProxy {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let addr = listener.local_addr().unwrap();
        let tunnels = Arc::new(Mutex::new(Vec::new()));
        let refused = Arc::new(Mutex::new(0));
        let expected = credentials.map(|c| {
            format!(
                "Basic {}",
                base64::engine::general_purpose::STANDARD.encode(c)
            )
        });
        let hosts: HashMap<String, String> = hosts
            .iter()
            .map(|(h, ip)| (h.to_string(), ip.to_string()))
            .collect();
        let (t, r) = (tunnels.clone(), refused.clone());
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let listener = TcpListener::from_std(listener).unwrap();
                while let Ok((conn, _)) = listener.accept().await {
                    let (t, r, expected, hosts) =
                        (t.clone(), r.clone(), expected.clone(), hosts.clone());
                    tokio::spawn(async move {
                        let _ = serve(conn, t, r, expected, hosts).await;
                    });
                }
            });
        });
        ConnectProxy {
            addr,
            tunnels,
            refused,
        }
    }

    /// `host:port` of every tunnel opened, in order.
    pub fn tunnels(&self) -> Vec<String> {
        self.tunnels.lock().unwrap().clone()
    }

    /// CONNECTs refused for missing or wrong credentials.
    pub fn refused(&self) -> usize {
        *self.refused.lock().unwrap()
    }
}

async fn serve(
    mut conn: TcpStream,
    tunnels: Arc<Mutex<Vec<String>>>,
    refused: Arc<Mutex<usize>>,
    expected: Option<String>,
    hosts: HashMap<String, String>,
) -> std::io::Result<()> {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        if conn.read(&mut byte).await? == 0 {
            return Ok(());
        }
        head.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&head).to_string();
    let mut lines = head.lines();
    let request = lines.next().unwrap_or("");
    let mut parts = request.split_whitespace();
    let (method, target) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    if method != "CONNECT" {
        conn.write_all(b"HTTP/1.1 405 Method Not Allowed\r\n\r\n")
            .await?;
        return Ok(());
    }
    let auth = lines
        .filter_map(|l| l.split_once(':'))
        .find(|(k, _)| k.eq_ignore_ascii_case("proxy-authorization"))
        .map(|(_, v)| v.trim().to_string());
    if expected.is_some() && auth != expected {
        *refused.lock().unwrap() += 1;
        conn.write_all(b"HTTP/1.1 407 Proxy Authentication Required\r\nProxy-Authenticate: Basic realm=\"test\"\r\n\r\n")
            .await?;
        return Ok(());
    }
    let (host, port) = target.rsplit_once(':').unwrap_or((target, "443"));
    let ip = hosts.get(host).map_or(host, |ip| ip.as_str());
    let Ok(mut upstream) = TcpStream::connect(format!("{ip}:{port}")).await else {
        conn.write_all(b"HTTP/1.1 502 Bad Gateway\r\n\r\n").await?;
        return Ok(());
    };
    tunnels.lock().unwrap().push(target.to_string());
    conn.write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
        .await?;
    tokio::io::copy_bidirectional(&mut conn, &mut upstream).await?;
    Ok(())
}
