//! The Engine API reads that must not hang on bollard's closed enums.
//!
//! bollard parses a container's `State` into an enum of Docker's states, and one value it does
//! not know fails the whole answer. Podman's compatible service passes its own states through:
//! `stopped` (a container that has exited and whose cleanup has not yet run, which every job's
//! container passes through), and `unknown`. A listing taken at that moment fails whole, so the
//! start-up reaper would leave every leftover container it was meant to remove. What the reaper
//! needs is names, so it reads names and nothing else, over a plain HTTP/1.1 request on the same
//! socket bollard uses.

use std::time::Duration;

use http_body_util::{BodyExt, Empty};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use serde::Deserialize;

/// How long one read may take, connection included.
const READ_TIMEOUT: Duration = Duration::from_secs(60);
/// The largest answer read: a listing of our containers is about 2 KiB each, so this holds
/// thousands; an engine answering more (an endless chunked body took the daemon to 20 GB in
/// 16 s before) is refused at it.
pub const MAX_ANSWER: usize = 16 << 20;

/// Why a read failed: the socket and what went wrong, in words for a log line.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("engine at {socket}: {what}")]
pub struct EngineReadError {
    /// The engine's socket, as configured.
    pub socket: String,
    /// What went wrong.
    pub what: String,
}

/// The names (without Docker's leading `/`) of every container, running or not, that carries
/// label `label` (`key=value`).
pub async fn container_names(socket: &str, label: &str) -> Result<Vec<String>, EngineReadError> {
    let filters = serde_json::json!({ "label": [label] }).to_string();
    let query = serde_urlencoded::to_string([("all", "true"), ("filters", filters.as_str())])
        .map_err(|e| error(socket, e))?;
    let body = get(socket, &format!("/containers/json?{query}")).await?;
    names_in_listing(&body).map_err(|e| error(socket, format!("its listing: {e}")))
}

/// The body of a successful (2xx) `GET path_and_query` to the engine at `socket`
/// (`unix:///path`, `tcp://host:port` or `http://host:port`).
pub async fn get(socket: &str, path_and_query: &str) -> Result<Bytes, EngineReadError> {
    tokio::time::timeout(READ_TIMEOUT, exchange(socket, path_and_query))
        .await
        .unwrap_or_else(|_| Err(format!("no answer within {READ_TIMEOUT:?}")))
        .map_err(|what| error(socket, what))
}

async fn exchange(socket: &str, path_and_query: &str) -> Result<Bytes, String> {
    let request = |host: &str| {
        hyper::Request::get(path_and_query)
            .header(hyper::header::HOST, host)
            .header(hyper::header::CONNECTION, "close")
            .body(Empty::<Bytes>::new())
            .map_err(|e| e.to_string())
    };
    if let Some(path) = socket.strip_prefix("unix://") {
        let stream = tokio::net::UnixStream::connect(path)
            .await
            .map_err(|e| format!("cannot connect: {e}"))?;
        send(stream, request("localhost")?).await
    } else {
        let address = ["tcp://", "http://"]
            .iter()
            .find_map(|scheme| socket.strip_prefix(scheme))
            .ok_or("is neither unix://, tcp:// nor http://")?
            .trim_end_matches('/');
        let stream = tokio::net::TcpStream::connect(address)
            .await
            .map_err(|e| format!("cannot connect: {e}"))?;
        send(stream, request(address)?).await
    }
}

/// One request on a fresh connection; the connection is driven alongside and ends with it.
async fn send<S>(stream: S, request: hyper::Request<Empty<Bytes>>) -> Result<Bytes, String>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| format!("handshake: {e}"))?;
    let answer = async move {
        let response = sender.send_request(request).await;
        // Dropped, the sender lets the connection end once the answer is read.
        drop(sender);
        let response = response.map_err(|e| format!("request: {e}"))?;
        let status = response.status();
        let body = http_body_util::Limited::new(response.into_body(), MAX_ANSWER)
            .collect()
            .await
            .map_err(|e| format!("reading the answer: {e}"))?
            .to_bytes();
        if status.is_success() {
            Ok(body)
        } else {
            let text = String::from_utf8_lossy(&body[..body.len().min(300)]).into_owned();
            Err(format!("answered {status}: {}", text.trim()))
        }
    };
    let (answer, _) = tokio::join!(answer, connection);
    answer
}

fn error(socket: &str, what: impl ToString) -> EngineReadError {
    EngineReadError {
        socket: socket.to_string(),
        what: what.to_string(),
    }
}

/// The names in a `GET /containers/json` answer, whatever else each entry carries.
fn names_in_listing(body: &[u8]) -> Result<Vec<String>, serde_json::Error> {
    #[derive(Deserialize)]
    struct Listed {
        #[serde(rename = "Names", default)]
        names: Vec<String>,
    }
    let listed: Vec<Listed> = serde_json::from_slice(body)?;
    Ok(listed
        .into_iter()
        .filter_map(|c| c.names.into_iter().next())
        .map(|n| n.trim_start_matches('/').to_string())
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Entries shaped as podman's compatible service lists them, one in each state it can
    /// report, `stopped` and `unknown` among them.
    const PODMAN_LISTING: &str = r#"[
      {"Id":"a1","Names":["/ptest-linux-1"],"Image":"localhost/x:1","State":"running","Status":"Up 2 seconds","Labels":{"io.ephemer-actors.prefix":"ptest-linux-"}},
      {"Id":"a2","Names":["/ptest-linux-2"],"Image":"localhost/x:1","State":"stopped","Status":"Exited (0) 1 second ago","Labels":{}},
      {"Id":"a3","Names":["/ptest-linux-3"],"Image":"localhost/x:1","State":"unknown","Status":"","Labels":{}},
      {"Id":"a4","Names":["/ptest-linux-4"],"Image":"localhost/x:1","State":"created","Status":"Created","Labels":{}},
      {"Id":"a5","Image":"localhost/x:1","State":"exited"}
    ]"#;

    #[test]
    fn a_listing_with_states_docker_lacks_still_gives_every_name() {
        assert_eq!(
            names_in_listing(PODMAN_LISTING.as_bytes()).unwrap(),
            ["ptest-linux-1", "ptest-linux-2", "ptest-linux-3", "ptest-linux-4"]
        );
    }

    /// Why this module exists: bollard's typed listing fails whole on the same answer. If a
    /// bollard release learns podman's states, this fails and the module can go.
    #[test]
    fn bollards_typed_listing_fails_on_a_state_it_does_not_know() {
        let typed: Result<Vec<bollard::models::ContainerSummary>, _> =
            serde_json::from_str(PODMAN_LISTING);
        let e = typed.expect_err("bollard's enum has no `stopped`");
        assert!(e.to_string().contains("stopped"), "{e}");
    }

    #[test]
    fn an_answer_that_is_no_listing_is_an_error() {
        assert!(names_in_listing(br#"{"message":"boom"}"#).is_err());
    }

    #[actix_rt::test]
    async fn a_socket_nothing_listens_on_is_an_error_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let socket = format!("unix://{}", dir.path().join("none.sock").display());
        let e = container_names(&socket, "a=b").await.unwrap_err();
        assert_eq!(e.socket, socket);
        assert!(e.what.contains("cannot connect"), "{e}");
        let e = get("ftp://x", "/").await.unwrap_err();
        assert!(e.what.contains("neither"), "{e}");
    }

    /// A tiny engine on a unix socket: the request line it saw, and the answer it gave.
    #[actix_rt::test]
    async fn the_read_sends_the_label_filter_and_reads_a_chunked_answer() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("engine.sock");
        let listener = tokio::net::UnixListener::bind(&path).unwrap();
        let server = tokio::spawn(async move {
            let (mut conn, _) = listener.accept().await.unwrap();
            let mut seen = Vec::new();
            let mut buf = [0u8; 1024];
            while !seen.windows(4).any(|w| w == b"\r\n\r\n") {
                let n = conn.read(&mut buf).await.unwrap();
                seen.extend_from_slice(&buf[..n]);
            }
            let body = PODMAN_LISTING.as_bytes();
            let (a, b) = body.split_at(body.len() / 2);
            let mut answer = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n".to_vec();
            for part in [a, b] {
                answer.extend_from_slice(format!("{:x}\r\n", part.len()).as_bytes());
                answer.extend_from_slice(part);
                answer.extend_from_slice(b"\r\n");
            }
            answer.extend_from_slice(b"0\r\n\r\n");
            conn.write_all(&answer).await.unwrap();
            String::from_utf8(seen).unwrap()
        });
        let socket = format!("unix://{}", path.display());
        let names = container_names(&socket, "io.ephemer-actors.prefix=ptest-linux-")
            .await
            .unwrap();
        assert_eq!(names.len(), 4);
        let request = server.await.unwrap();
        let line = request.lines().next().unwrap();
        let query = line
            .strip_prefix("GET /containers/json?")
            .and_then(|l| l.strip_suffix(" HTTP/1.1"))
            .unwrap_or_else(|| panic!("{line}"));
        let pairs: Vec<(String, String)> = serde_urlencoded::from_str(query).unwrap();
        assert_eq!(
            pairs,
            [
                ("all".to_string(), "true".to_string()),
                (
                    "filters".to_string(),
                    r#"{"label":["io.ephemer-actors.prefix=ptest-linux-"]}"#.to_string()
                )
            ]
        );
    }

    /// The review's engine: an endless chunked answer. The read stops at its ceiling.
    #[actix_rt::test]
    async fn an_endless_answer_is_refused_at_the_ceiling() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("engine.sock");
        let listener = tokio::net::UnixListener::bind(&path).unwrap();
        tokio::spawn(async move {
            let (mut conn, _) = listener.accept().await.unwrap();
            let mut buf = [0u8; 1024];
            let _ = conn.read(&mut buf).await.unwrap();
            conn.write_all(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
                .await
                .unwrap();
            let chunk = [b'['; 65536];
            let mut framed = format!("{:x}\r\n", chunk.len()).into_bytes();
            framed.extend_from_slice(&chunk);
            framed.extend_from_slice(b"\r\n");
            while conn.write_all(&framed).await.is_ok() {}
        });
        let e = container_names(&format!("unix://{}", path.display()), "a=b")
            .await
            .unwrap_err();
        assert!(e.what.contains("length limit exceeded"), "{e}");
    }

    #[actix_rt::test]
    async fn an_error_status_is_an_error_with_the_engines_words() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("engine.sock");
        let listener = tokio::net::UnixListener::bind(&path).unwrap();
        tokio::spawn(async move {
            let (mut conn, _) = listener.accept().await.unwrap();
            let mut buf = [0u8; 1024];
            let _ = conn.read(&mut buf).await.unwrap();
            let body = r#"{"message":"no such container"}"#;
            let answer = format!(
                "HTTP/1.1 404 Not Found\r\nContent-Length: {}\r\n\r\n{body}",
                body.len()
            );
            conn.write_all(answer.as_bytes()).await.unwrap();
        });
        let e = get(&format!("unix://{}", path.display()), "/containers/x/json")
            .await
            .unwrap_err();
        assert!(
            e.what.contains("404") && e.what.contains("no such container"),
            "{e}"
        );
    }
}
