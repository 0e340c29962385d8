//! GitHub calls through an HTTP proxy: awc has no proxy support, so the client gets a TCP
//! connector of its own that opens a `CONNECT host:port` tunnel through the proxy (RFC 9110
//! section 9.3.6) for every host `NO_PROXY` does not exempt, and connects directly otherwise.
//! awc then speaks TLS to GitHub inside the tunnel, so the proxy sees only the host name.

use std::{net::SocketAddr, rc::Rc, task::Poll};

use actix_service::Service;
use actix_tls::connect::{
    ConnectError as TcpConnectError, ConnectInfo, Connection as TcpConnection,
};
use awc::http::Uri;
use futures_util::future::LocalBoxFuture;
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::TcpStream,
};

use crate::config::{ProxyConfig, net::ProxyUrl};

/// The longest proxy answer to a `CONNECT` read before giving up on it.
const MAX_CONNECT_ANSWER: usize = 16 * 1024;

/// Whether `host` bypasses the proxy per `NO_PROXY` entries: `*`, an exact host or IP, or a
/// domain (`example.com` or `.example.com`) and its subdomains; an entry may carry a port.
pub(crate) fn bypasses(no_proxy: &[String], host: &str, port: u16) -> bool {
    let host = host
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_ascii_lowercase();
    no_proxy.iter().any(|entry| {
        let entry = entry.trim().to_ascii_lowercase();
        if entry == "*" {
            return true;
        }
        let (name, entry_port) = match entry.rsplit_once(':') {
            Some((n, p)) if !n.contains(':') || n.ends_with(']') => (n.to_string(), p.parse().ok()),
            _ => (entry.clone(), None),
        };
        if entry_port.is_some_and(|p: u16| p != port) {
            return false;
        }
        let name = name.trim_start_matches('[').trim_end_matches(']');
        let domain = name.trim_start_matches('.');
        !domain.is_empty() && (host == domain || host.ends_with(&format!(".{domain}")))
    })
}

/// awc's TCP connector: direct, or through a `CONNECT` tunnel.
#[derive(Clone, Debug)]
pub(crate) struct ProxyConnector {
    /// The proxy and its `NO_PROXY` list; `None`: every connection is direct.
    inner: Rc<Option<(ProxyUrl, Vec<String>)>>,
}

impl ProxyConnector {
    /// A connector for `config` (its URL already validated by the config).
    pub(crate) fn new(config: &ProxyConfig) -> Result<Self, crate::config::net::ProxyUrlError> {
        let url = ProxyUrl::parse(config.url.expose())?;
        Ok(ProxyConnector {
            inner: Rc::new(Some((url, config.no_proxy.clone()))),
        })
    }

    /// A connector that always connects directly.
    pub(crate) fn direct() -> Self {
        ProxyConnector {
            inner: Rc::new(None),
        }
    }
}

impl Service<ConnectInfo<Uri>> for ProxyConnector {
    type Response = TcpConnection<Uri, TcpStream>;
    type Error = TcpConnectError;
    type Future = LocalBoxFuture<'static, Result<Self::Response, Self::Error>>;

    fn poll_ready(&self, _: &mut std::task::Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&self, req: ConnectInfo<Uri>) -> Self::Future {
        let inner = self.inner.clone();
        Box::pin(async move {
            let (host, port) = (req.hostname().to_string(), req.port());
            let uri = req.request().clone();
            let stream = match &*inner {
                Some((proxy, no_proxy)) if !bypasses(no_proxy, &host, port) => {
                    tunnel(proxy, &host, port)
                        .await
                        .map_err(TcpConnectError::Io)?
                }
                _ => connect_direct(&req, &host, port).await?,
            };
            Ok(TcpConnection::new(uri, stream))
        })
    }
}

async fn connect_direct(
    req: &ConnectInfo<Uri>,
    host: &str,
    port: u16,
) -> Result<TcpStream, TcpConnectError> {
    let addrs: Vec<SocketAddr> = match req.addrs().next() {
        Some(_) => req.addrs().collect(),
        None => tokio::net::lookup_host((host, port))
            .await
            .map_err(|e| TcpConnectError::Resolver(Box::new(e)))?
            .collect(),
    };
    let mut last = None;
    for addr in addrs {
        match TcpStream::connect(addr).await {
            Ok(s) => return Ok(s),
            Err(e) => last = Some(e),
        }
    }
    Err(last.map_or(TcpConnectError::NoRecords, TcpConnectError::Io))
}

/// Opens `CONNECT host:port` through the proxy and returns the tunnel once it answers 2xx.
async fn tunnel(proxy: &ProxyUrl, host: &str, port: u16) -> std::io::Result<TcpStream> {
    use std::io::{Error, ErrorKind};
    let mut stream = TcpStream::connect(&proxy.authority).await?;
    let target = if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    };
    let mut request = format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n");
    if let Some(auth) = proxy.authorization() {
        request.push_str("Proxy-Authorization: ");
        request.push_str(auth);
        request.push_str("\r\n");
    }
    request.push_str("\r\n");
    stream.write_all(request.as_bytes()).await?;
    // Read the answer's head byte by byte: nothing after it may be consumed, it is the TLS
    // handshake's.
    let mut head = Vec::with_capacity(256);
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        if head.len() >= MAX_CONNECT_ANSWER || stream.read(&mut byte).await? == 0 {
            return Err(Error::new(
                ErrorKind::ConnectionAborted,
                format!(
                    "the proxy {} closed or flooded the CONNECT answer",
                    proxy.authority
                ),
            ));
        }
        head.push(byte[0]);
    }
    let status_line = String::from_utf8_lossy(&head);
    let status_line = status_line.lines().next().unwrap_or("");
    let code = status_line.split_whitespace().nth(1).unwrap_or("");
    if !code.starts_with('2') {
        return Err(Error::new(
            ErrorKind::ConnectionRefused,
            format!(
                "the proxy {} refused CONNECT {target}: {status_line}",
                proxy.authority
            ),
        ));
    }
    Ok(stream)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_proxy_matches_hosts_domains_and_ports() {
        let list: Vec<String> = [
            "localhost",
            ".corp.example",
            "ghe.internal:8443",
            "10.0.0.1",
        ]
        .map(String::from)
        .into();
        assert!(bypasses(&list, "localhost", 443));
        assert!(bypasses(&list, "api.corp.example", 443));
        assert!(bypasses(&list, "corp.example", 443));
        assert!(!bypasses(&list, "notcorp.example", 443));
        assert!(bypasses(&list, "ghe.internal", 8443));
        assert!(!bypasses(&list, "ghe.internal", 443));
        assert!(bypasses(&list, "10.0.0.1", 443));
        assert!(!bypasses(&list, "api.github.com", 443));
        assert!(bypasses(&["*".to_string()], "api.github.com", 443));
    }
}
