//! A stand-in for the GitHub Actions runner (`run.sh` with a JIT config), for tests and the demo.
//!
//! It reads `ACTIONS_RUNNER_INPUT_JITCONFIG` (base64 JSON of the runner's files, as GitHub mints
//! it), takes the server URL and its token from `.runner` and `.credentials`, and asks the
//! stand-in GitHub for a job (`POST /_runner/acquire`) until it gets one. The stand-in hands it
//! the oldest queued job whose labels it covers: not necessarily the one it was created for,
//! exactly as GitHub does. It "runs" the job for the time the stand-in says, reports completion
//! (`POST /_runner/complete`) and exits 0. It has no dependencies beyond std, serde_json and
//! base64, so it can be linked statically and run in a busybox container.

use std::time::{Duration, Instant};

use base64::{Engine, engine::general_purpose::STANDARD as B64};
use serde_json::Value;

/// How long a runner without a job keeps asking before it gives up and exits.
const IDLE_LIMIT: Duration = Duration::from_secs(600);
/// Pause between two acquire attempts.
const POLL: Duration = Duration::from_millis(100);

/// What the runner learned from its JIT config.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    /// `host:port` of the stand-in.
    pub server: String,
    /// Runner name.
    pub name: String,
    /// Runner token.
    pub token: String,
}

/// Decodes a JIT config as the stand-in GitHub mints it.
pub fn decode_jit(encoded: &str) -> Result<Identity, String> {
    let b64 = |s: &str| B64.decode(s.trim()).map_err(|e| format!("bad base64: {e}"));
    let files: Value =
        serde_json::from_slice(&b64(encoded)?).map_err(|e| format!("bad JIT JSON: {e}"))?;
    let file = |key: &str| -> Result<Value, String> {
        let raw = files[key]
            .as_str()
            .ok_or(format!("JIT config lacks {key}"))?;
        serde_json::from_slice(&b64(raw)?).map_err(|e| format!("bad {key}: {e}"))
    };
    let runner = file(".runner")?;
    let credentials = file(".credentials")?;
    let server_url = runner["ServerUrl"].as_str().ok_or("no ServerUrl")?;
    Ok(Identity {
        server: server_url
            .trim_start_matches("http://")
            .trim_end_matches('/')
            .to_string(),
        name: runner["AgentName"]
            .as_str()
            .ok_or("no AgentName")?
            .to_string(),
        token: credentials["Data"]["token"]
            .as_str()
            .ok_or("no token")?
            .to_string(),
    })
}

/// One POST with a JSON body through awc (the client the daemon uses); returns (status, body).
fn post(server: &str, path: &str, token: &str, body: &str) -> std::io::Result<(u16, String)> {
    let url = format!("http://{server}{path}");
    let body = body.to_string();
    let token = token.to_string();
    actix_rt::System::new().block_on(async move {
        let mut answer = awc::Client::builder()
            .timeout(Duration::from_secs(30))
            .finish()
            .post(&url)
            .insert_header(("Authorization", format!("Bearer {token}")))
            .insert_header(("Content-Type", "application/json"))
            .send_body(body)
            .await
            .map_err(|e| std::io::Error::other(e.to_string()))?;
        let bytes = answer
            .body()
            .limit(16 * 1024 * 1024)
            .await
            .map_err(|e| std::io::Error::other(e.to_string()))?;
        Ok((
            answer.status().as_u16(),
            String::from_utf8_lossy(&bytes).into_owned(),
        ))
    })
}

// This is a separate process, not an actix arbiter: blocking sleeps are what it should do.
#[allow(clippy::disallowed_methods)]
fn pause(d: Duration) {
    std::thread::sleep(d);
}

/// Runs the stand-in runner; returns the process exit code.
pub fn run() -> i32 {
    let Ok(encoded) = std::env::var("ACTIONS_RUNNER_INPUT_JITCONFIG") else {
        eprintln!("standin-runner: ACTIONS_RUNNER_INPUT_JITCONFIG is not set");
        return 2;
    };
    let me = match decode_jit(&encoded) {
        Ok(me) => me,
        Err(e) => {
            eprintln!("standin-runner: {e}");
            return 2;
        }
    };
    println!("standin-runner {} connecting to {}", me.name, me.server);
    let hello = format!(
        "{{\"name\":\"{}\",\"pid\":{}}}",
        me.name,
        std::process::id()
    );
    let started = Instant::now();
    let mut failures = 0;
    let job = loop {
        match post(&me.server, "/_runner/acquire", &me.token, &hello) {
            Ok((200, body)) => break serde_json::from_str::<Value>(&body).unwrap_or(Value::Null),
            Ok((204, _)) => failures = 0,
            Ok((401 | 404, _)) => {
                println!("standin-runner {}: registration gone; exiting", me.name);
                return 0;
            }
            Ok((status, body)) => {
                eprintln!(
                    "standin-runner {}: acquire answered {status}: {body}",
                    me.name
                );
                failures += 1;
            }
            Err(e) => {
                eprintln!("standin-runner {}: cannot reach the server: {e}", me.name);
                failures += 1;
            }
        }
        if failures > 50 || started.elapsed() > IDLE_LIMIT {
            eprintln!("standin-runner {}: giving up without a job", me.name);
            return 1;
        }
        pause(POLL);
    };
    let job_id = job["job_id"].as_u64().unwrap_or(0);
    match job["action"].as_str() {
        Some("crash") => {
            eprintln!("standin-runner {}: crashing at boot, as told", me.name);
            return 3;
        }
        Some("hang") => {
            println!(
                "standin-runner {}: hanging on job {job_id}, as told",
                me.name
            );
            loop {
                pause(Duration::from_secs(3600));
            }
        }
        _ => {}
    }
    let ms = job["duration_ms"].as_u64().unwrap_or(100);
    println!(
        "standin-runner {}: running job {job_id} for {ms} ms",
        me.name
    );
    pause(Duration::from_millis(ms));
    let done = format!("{{\"job_id\":{job_id},\"conclusion\":\"success\"}}");
    match post(&me.server, "/_runner/complete", &me.token, &done) {
        Ok((200, _)) => {
            println!("standin-runner {}: job {job_id} done", me.name);
            0
        }
        other => {
            eprintln!(
                "standin-runner {}: completing job {job_id} failed: {other:?}",
                me.name
            );
            1
        }
    }
}
