//! The admin API's access rules through the real daemon: changes need the token (which `ctl`
//! finds by itself), a JSON content type and the listener's own `Host`; the shutdown drain
//! cannot be lifted.

use std::{os::unix::fs::PermissionsExt, time::Duration};

use github_standin::{Standin, StandinConfig};

use crate::support::{
    daemon::{Daemon, local_provider},
    provision::eventually,
};

/// `POST path` on the admin listener with these headers: (status, body).
async fn post(daemon: &Daemon, path: &str, headers: &[(&str, String)]) -> (u16, String) {
    let addr = daemon.admin_addr();
    let mut req = awc::Client::new().post(format!("http://{addr}{path}"));
    for (k, v) in headers {
        req = req.insert_header((*k, v.as_str()));
    }
    let mut answer = req.send_body("{}").await.unwrap();
    let body = answer.body().await.unwrap();
    (
        answer.status().as_u16(),
        String::from_utf8_lossy(&body).into_owned(),
    )
}

fn token(daemon: &Daemon) -> String {
    let path = daemon.state_dir().join("admin.token");
    let mode = std::fs::metadata(&path).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600, "the token file is private");
    std::fs::read_to_string(path).unwrap().trim().to_string()
}

#[actix_rt::test]
async fn changes_need_the_token_json_and_the_listeners_own_host() {
    let standin = Standin::start(StandinConfig::default()).unwrap();
    let daemon = Daemon::start(&standin, "", &local_provider(2)).await;
    let bearer = format!("Bearer {}", token(&daemon));
    let json = ("Content-Type", "application/json".to_string());
    let (code, body) = post(&daemon, "/api/v1/cordon", std::slice::from_ref(&json)).await;
    assert_eq!(code, 401, "{body}");
    let wrong = ("Authorization", "Bearer not-the-token".to_string());
    assert_eq!(
        post(&daemon, "/api/v1/cordon", &[json.clone(), wrong])
            .await
            .0,
        401
    );
    let auth = ("Authorization", bearer.clone());
    let form = (
        "Content-Type",
        "application/x-www-form-urlencoded".to_string(),
    );
    assert_eq!(
        post(&daemon, "/api/v1/cordon", &[form, auth.clone()])
            .await
            .0,
        415
    );
    let rebound = ("Host", "attacker.example:80".to_string());
    let (code, _) = post(
        &daemon,
        "/api/v1/cordon",
        &[json.clone(), auth.clone(), rebound],
    )
    .await;
    assert_eq!(code, 421);
    let status = || async {
        let (_, out, _) = daemon.ctl(&["status", "--json"]).await;
        serde_json::from_str::<serde_json::Value>(&out).unwrap()["draining"].clone()
    };
    assert_eq!(status().await, false, "nothing refused changed anything");
    let (code, body) = post(&daemon, "/api/v1/cordon", &[json, auth]).await;
    assert_eq!((code, body.as_str()), (200, r#"{"cordoned":true}"#));
    assert_eq!(status().await, true);
    // The operator's CLI finds the token by itself.
    assert_eq!(daemon.ctl(&["uncordon"]).await.0, 0);
    assert_eq!(status().await, false);
    assert_eq!(daemon.stop(Duration::from_secs(30)).await.0, Some(0));
}

#[actix_rt::test]
async fn the_shutdown_drain_cannot_be_uncordoned() {
    let standin = crate::support::standin(4000);
    let daemon = Daemon::start(&standin, "", &local_provider(2)).await;
    standin.queue_jobs("app", &["self-hosted", "linux"], 1);
    eventually("the job running", Duration::from_secs(20), || {
        standin.jobs_in("in_progress") == 1
    })
    .await;
    daemon.begin_drain();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (code, out, err) = daemon.ctl(&["uncordon"]).await;
    assert_ne!(code, 0, "{out}");
    assert!(
        err.contains("409") && err.contains("draining to shut down"),
        "{err}"
    );
    assert_eq!(daemon.wait_exit(Duration::from_secs(30)).await.0, Some(0));
    assert_eq!(
        standin.jobs_in("completed"),
        1,
        "the drain let the job finish"
    );
}

/// `admin.listen = "unix:PATH"`: the socket is private to the daemon's user, and the CLI works
/// through it unchanged (reads, and changes with the token it finds itself).
#[actix_rt::test]
async fn the_admin_api_on_a_unix_socket() {
    let standin = Standin::start(StandinConfig::default()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("admin.sock");
    let extra = format!("[admin]\nlisten = \"unix:{}\"\n", socket.display());
    let daemon = Daemon::start(&standin, &extra, &local_provider(1)).await;
    let mode = std::fs::metadata(&socket).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600, "the socket is private");
    // The pool's host check may still be under way on a loaded machine (`status` exits 1
    // while a pool is down): what is tested here is the socket, so wait for the pool.
    let mut answer = daemon.ctl(&["status", "--json"]).await;
    for _ in 0..100 {
        if answer.0 == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        answer = daemon.ctl(&["status", "--json"]).await;
    }
    let (code, out, err) = answer;
    assert_eq!(code, 0, "{err}\n{}", daemon.logs());
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&out).unwrap()["draining"],
        false
    );
    assert_eq!(daemon.ctl(&["cordon"]).await.0, 0);
    let (_, out, _) = daemon.ctl(&["status", "--json"]).await;
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&out).unwrap()["draining"],
        true
    );
    // Without the token, a change is refused on the socket too.
    let (code, _, err) = daemon
        .ctl_with_env(&["uncordon"], &[("EPHEMER_ADMIN_TOKEN", "wrong")])
        .await;
    assert_ne!(code, 0);
    assert!(err.contains("401"), "{err}");
    assert_eq!(daemon.stop(Duration::from_secs(30)).await.0, Some(0));
}
