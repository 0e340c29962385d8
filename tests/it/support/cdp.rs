//! A headless Chromium driven over the DevTools protocol (its WebSocket), for what a page does
//! while it stays open: navigate once, then read and set the page's state with
//! `Runtime.evaluate`, as a person watching it would see it change.

use std::{path::Path, process::Stdio, time::Duration};

use actix_codec::Framed;
use awc::{BoxedSocket, ws};
use futures_util::{SinkExt as _, StreamExt as _};
use tokio::io::{AsyncBufReadExt as _, BufReader};

/// One browser with one page.
pub struct Browser {
    child: tokio::process::Child,
    socket: Framed<BoxedSocket, ws::Codec>,
    next_id: u64,
    _profile: tempfile::TempDir,
}

impl Browser {
    /// Starts `browser` headless with its DevTools on a free port and attaches to its page.
    pub async fn start(browser: &Path) -> Browser {
        let profile = tempfile::tempdir().unwrap();
        let mut child = tokio::process::Command::new(browser)
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-dev-shm-usage",
                "--no-first-run",
                "--remote-debugging-port=0",
                "--remote-allow-origins=*",
                "--window-size=1280,900",
            ])
            .arg(format!("--user-data-dir={}", profile.path().display()))
            .arg("about:blank")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("the browser starts");
        // "DevTools listening on ws://127.0.0.1:PORT/devtools/browser/ID"
        let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
        let port = tokio::time::timeout(Duration::from_secs(30), async {
            while let Some(line) = lines.next_line().await.unwrap() {
                if let Some(rest) = line.split("ws://127.0.0.1:").nth(1) {
                    return rest.split('/').next().unwrap().to_string();
                }
            }
            panic!("the browser ended without its DevTools address")
        })
        .await
        .expect("the browser's DevTools within 30 s");
        // Its stderr keeps being read, or a full pipe would stop it.
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        let (_, list) = super::http_get(&format!("127.0.0.1:{port}"), "/json/list")
            .await
            .unwrap();
        let targets: serde_json::Value = serde_json::from_str(&list).unwrap();
        let page = targets
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["type"] == "page")
            .and_then(|t| t["webSocketDebuggerUrl"].as_str())
            .unwrap_or_else(|| panic!("no page in {targets}"))
            .to_string();
        let (_, socket) = awc::Client::new()
            .ws(page)
            .max_frame_size(64 << 20)
            .connect()
            .await
            .expect("the page's DevTools socket");
        Browser {
            child,
            socket,
            next_id: 0,
            _profile: profile,
        }
    }

    /// Sends `method` with `params` and waits for its answer (events in between are skipped).
    pub async fn call(&mut self, method: &str, params: serde_json::Value) -> serde_json::Value {
        self.next_id += 1;
        let id = self.next_id;
        let ask = serde_json::json!({"id": id, "method": method, "params": params});
        self.socket
            .send(ws::Message::Text(ask.to_string().into()))
            .await
            .unwrap();
        let answer = tokio::time::timeout(Duration::from_secs(30), async {
            while let Some(frame) = self.socket.next().await {
                if let ws::Frame::Text(bytes) = frame.unwrap() {
                    let v: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
                    if v["id"] == id {
                        return v;
                    }
                }
            }
            panic!("the browser closed its DevTools socket")
        })
        .await
        .unwrap_or_else(|_| panic!("{method}: no answer within 30 s"));
        assert!(answer.get("error").is_none(), "{method}: {answer}");
        answer["result"].clone()
    }

    /// Loads `url`, and waits until its document is complete.
    pub async fn navigate(&mut self, url: &str) {
        self.call("Page.navigate", serde_json::json!({"url": url}))
            .await;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        while self.eval("document.readyState").await != "complete" {
            assert!(tokio::time::Instant::now() < deadline, "{url} never loaded");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The value of `expression` in the page.
    pub async fn eval(&mut self, expression: &str) -> serde_json::Value {
        let r = self
            .call(
                "Runtime.evaluate",
                serde_json::json!({"expression": expression, "returnByValue": true}),
            )
            .await;
        assert!(r.get("exceptionDetails").is_none(), "{expression}: {r}");
        r["result"]["value"].clone()
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.child.start_kill();
    }
}
