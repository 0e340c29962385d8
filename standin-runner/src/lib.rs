//! A stand-in for the GitHub Actions runner (`run.sh` with a JIT config), for tests and the demo.
//!
//! It reads `ACTIONS_RUNNER_INPUT_JITCONFIG` (base64 JSON of the runner's files, as GitHub mints
//! it), takes the server URL and its token from `.runner` and `.credentials`, and asks the
//! stand-in GitHub for a job (`POST /_runner/acquire`) until it gets one. The stand-in hands it
//! the oldest queued job whose labels it covers: not necessarily the one it was created for,
//! exactly as GitHub does. It "runs" the job for the time the stand-in says, reports completion
//! (`POST /_runner/complete`) and exits 0. It has few dependencies, so it can be linked
//! statically and run in a busybox container.
//!
//! Like the real runner it keeps its state in its **install root**, not its working directory:
//! it writes every file of its JIT config there at start (the real listener does so with
//! `File.WriteAllBytes`, truncating an existing file in place: actions/runner
//! `src/Runner.Listener/Runner.cs`) and works under `<root>/_work`. Its root is `--root DIR`,
//! which the `run.sh` of a stand-in install ([`write_install`]) passes as the directory the
//! script itself is in, as the real `run.sh` resolves it (`src/Misc/layoutroot/run.sh`); without
//! it, the current directory. At the end of a job it checks that the identity in its root is
//! still its own and that `_work` holds only its job: if not, another runner shared its root,
//! and it fails the job (exits non-zero without reporting completion), as a real runner whose
//! credentials were overwritten would.

use std::{
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

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

fn b64(s: &str) -> Result<Vec<u8>, String> {
    B64.decode(s.trim()).map_err(|e| format!("bad base64: {e}"))
}

/// The files of a JIT config: file name and content.
pub fn jit_files(encoded: &str) -> Result<Vec<(String, Vec<u8>)>, String> {
    let files: serde_json::Map<String, Value> =
        serde_json::from_slice(&b64(encoded)?).map_err(|e| format!("bad JIT JSON: {e}"))?;
    files
        .into_iter()
        .map(|(name, v)| {
            let raw = v.as_str().ok_or(format!("{name} is not a string"))?;
            Ok((name, b64(raw)?))
        })
        .collect()
}

/// Decodes a JIT config as the stand-in GitHub mints it.
pub fn decode_jit(encoded: &str) -> Result<Identity, String> {
    let files = jit_files(encoded)?;
    let file = |key: &str| -> Result<Value, String> {
        let (_, raw) = files
            .iter()
            .find(|(name, _)| name == key)
            .ok_or(format!("JIT config lacks {key}"))?;
        serde_json::from_slice(raw).map_err(|e| format!("bad {key}: {e}"))
    };
    let runner = file(".runner")?;
    let credentials = file(".credentials")?;
    let server_url = runner["ServerUrl"].as_str().ok_or("no ServerUrl")?;
    Ok(Identity {
        server: if server_url.contains("://") {
            server_url.trim_end_matches('/').to_string()
        } else {
            format!("http://{}", server_url.trim_end_matches('/'))
        },
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

/// The roots the runner trusts: the bundled ones, and the bundle `SSL_CERT_FILE` names. The
/// real runner is .NET, which on Linux verifies through OpenSSL, and OpenSSL's default verify
/// paths honour `SSL_CERT_FILE` (GitHub's docs for self-hosted runners behind a private CA
/// install the CA into that store): a runner whose environment lacks it fails TLS here too.
fn tls_config() -> std::io::Result<std::sync::Arc<rustls::ClientConfig>> {
    use rustls_pki_types::{CertificateDer, pem::PemObject};
    let mut roots = rustls::RootCertStore {
        roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
    };
    if let Some(path) = std::env::var_os("SSL_CERT_FILE") {
        let pem = std::fs::read(&path)?;
        for cert in CertificateDer::pem_slice_iter(&pem).flatten() {
            let _ = roots.add(cert);
        }
    }
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(std::io::Error::other)?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(std::sync::Arc::new(config))
}

/// One POST with a JSON body through awc (the client the daemon uses); returns (status, body).
fn post(server: &str, path: &str, token: &str, body: &str) -> std::io::Result<(u16, String)> {
    let url = format!("{server}{path}");
    let body = body.to_string();
    let token = token.to_string();
    actix_rt::System::new().block_on(async move {
        let mut answer = awc::Client::builder()
            .connector(awc::Connector::new().rustls_0_23(tls_config()?))
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

/// The install root from the command line (`--root DIR`), else the current directory.
pub fn root_from_args(args: impl IntoIterator<Item = String>) -> PathBuf {
    let mut args = args.into_iter();
    while let Some(a) = args.next() {
        if a == "--root"
            && let Some(dir) = args.next()
        {
            return PathBuf::from(dir);
        }
        if let Some(dir) = a.strip_prefix("--root=") {
            return PathBuf::from(dir);
        }
    }
    PathBuf::from(".")
}

/// Runs the stand-in runner with the root named on the command line; returns the exit code.
pub fn run() -> i32 {
    run_in(&root_from_args(std::env::args().skip(1)))
}

/// Writes the JIT config's files into `root`, as the real listener does.
fn write_identity(root: &Path, encoded: &str) -> Result<(), String> {
    for (name, content) in jit_files(encoded)? {
        let path = root.join(&name);
        std::fs::write(&path, content)
            .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    }
    Ok(())
}

/// Whether `root` still holds this runner's identity and `_work` only `job_dir`.
fn check_root(root: &Path, me: &Identity, job_dir: &str) -> Result<(), String> {
    let read =
        |name: &str| std::fs::read(root.join(name)).map_err(|e| format!("cannot read {name}: {e}"));
    let runner: Value = serde_json::from_slice(&read(".runner")?).map_err(|e| e.to_string())?;
    let credentials: Value =
        serde_json::from_slice(&read(".credentials")?).map_err(|e| e.to_string())?;
    if runner["AgentName"].as_str() != Some(me.name.as_str())
        || credentials["Data"]["token"].as_str() != Some(me.token.as_str())
    {
        return Err(format!(
            "the identity in {} is no longer mine (now {})",
            root.display(),
            runner["AgentName"]
        ));
    }
    let work = root.join("_work");
    let others: Vec<String> = std::fs::read_dir(&work)
        .map_err(|e| format!("cannot read {}: {e}", work.display()))?
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n != job_dir)
        .collect();
    if !others.is_empty() {
        return Err(format!(
            "{} holds other jobs' work: {others:?}",
            work.display()
        ));
    }
    Ok(())
}

/// The install's version, as the real one answers it: `bin/Runner.Listener --version` ("?" when
/// it cannot say).
pub fn own_version(root: &Path) -> String {
    std::process::Command::new(root.join("bin/Runner.Listener"))
        .arg("--version")
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| "?".into())
}

/// Whether the runner's settings (`.runner`, from its JIT config) turn self-updates off
/// (`DisableUpdate`, as `config.sh --disableupdate` sets it for the real runner).
fn updates_disabled(root: &Path) -> bool {
    std::fs::read(root.join(".runner"))
        .ok()
        .and_then(|raw| serde_json::from_slice::<Value>(&raw).ok())
        .is_some_and(|v| v["DisableUpdate"] == Value::Bool(true))
}

/// The exit code of a runner GitHub refuses as too old, when
/// `ACTIONS_RUNNER_RETURN_VERSION_DEPRECATED_EXIT_CODE` is set (actions/runner's
/// `ReturnCode.RunnerVersionDeprecated`).
pub const VERSION_DEPRECATED: i32 = 7;

/// Runs the stand-in runner with its install root at `root`; returns the process exit code.
pub fn run_in(root: &Path) -> i32 {
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
    if let Err(e) = write_identity(root, &encoded) {
        eprintln!("standin-runner {}: {e}", me.name);
        return 2;
    }
    let var = |k: &str| std::env::var(k).unwrap_or_default();
    // Who it runs as: the owner of a file it makes (on every OS, a new file is its maker's
    // effective uid); the tests of `run_as` read it.
    let probe = root.join(format!(".whoami-{}", std::process::id()));
    let uid = std::fs::write(&probe, b"")
        .and_then(|()| std::fs::metadata(&probe))
        .map_or_else(
            |_| "?".to_string(),
            |m| std::os::unix::fs::MetadataExt::uid(&m).to_string(),
        );
    let _ = std::fs::remove_file(&probe);
    let mut version = own_version(root);
    let updates_off = updates_disabled(root);
    println!(
        "standin-runner {} {version} connecting to {} (root {}, HOME {}, TMPDIR {}) as uid {uid}",
        me.name,
        me.server,
        root.display(),
        var("HOME"),
        var("TMPDIR")
    );
    let hello = |version: &str| {
        serde_json::json!({
            "name": me.name,
            "pid": std::process::id(),
            "version": version,
            "disable_update": updates_off,
        })
        .to_string()
    };
    let started = Instant::now();
    let mut failures = 0;
    let job = loop {
        match post(&me.server, "/_runner/acquire", &me.token, &hello(&version)) {
            Ok((200, body)) => {
                let answer = serde_json::from_str::<Value>(&body).unwrap_or(Value::Null);
                if answer["action"] == "update" {
                    // The real runner downloads the release into its root and restarts; a JIT
                    // runner does so in every job's fresh copy, on every job.
                    let to = answer["version"].as_str().unwrap_or("?").to_string();
                    println!(
                        "standin-runner {}: self-updating from {version} to {to} in {}",
                        me.name,
                        root.display()
                    );
                    pause(Duration::from_millis(answer["ms"].as_u64().unwrap_or(500)));
                    version = to;
                    continue;
                }
                break answer;
            }
            Ok((204, _)) => failures = 0,
            // GitHub refuses this version (actions/runner's `AccessDeniedException` with error
            // code 1): exit 7 when asked to say so, else 1, as the listener does.
            Ok((403, body))
                if serde_json::from_str::<Value>(&body).is_ok_and(|v| v["errorCode"] == 1) =>
            {
                let said = serde_json::from_str::<Value>(&body)
                    .ok()
                    .and_then(|v| v["message"].as_str().map(str::to_string))
                    .unwrap_or_default();
                eprintln!("standin-runner {}: An error occurred: {said}", me.name);
                let asked = matches!(
                    var("ACTIONS_RUNNER_RETURN_VERSION_DEPRECATED_EXIT_CODE")
                        .to_ascii_lowercase()
                        .as_str(),
                    "1" | "true"
                );
                return if asked { VERSION_DEPRECATED } else { 1 };
            }
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
    // The job's lock, renewed while it runs, as the real listener does every 60 s.
    let renew = Duration::from_millis(job["renew_ms"].as_u64().unwrap_or(60_000).max(50));
    let renewing = |for_: Duration| run_renewing(&me, job_id, renew, for_);
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
                renewing(Duration::from_secs(3600));
            }
        }
        _ => {}
    }
    let ms = job["duration_ms"].as_u64().unwrap_or(100);
    println!(
        "standin-runner {}: running job {job_id} for {ms} ms",
        me.name
    );
    let job_dir = format!("job-{job_id}");
    let work = root.join("_work").join(&job_dir);
    if let Err(e) = std::fs::create_dir_all(&work)
        .and_then(|()| std::fs::write(work.join("step.log"), format!("{}\n", me.name)))
    {
        eprintln!(
            "standin-runner {}: cannot write {}: {e}",
            me.name,
            work.display()
        );
        return 1;
    }
    renewing(Duration::from_millis(ms));
    if let Err(e) = check_root(root, &me, &job_dir) {
        eprintln!("standin-runner {}: failing job {job_id}: {e}", me.name);
        return 4;
    }
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

/// Spends `for_` on job `job_id`, renewing its lock every `every` (a renewal the server
/// refuses, or cannot be reached for, is tried again at the next; the server fails the job if
/// none gets through before the lock lapses).
fn run_renewing(me: &Identity, job_id: u64, every: Duration, for_: Duration) {
    let end = Instant::now() + for_;
    loop {
        let left = end.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return;
        }
        pause(left.min(every));
        if Instant::now() < end {
            let body = format!("{{\"job_id\":{job_id}}}");
            if let Ok((status, answer)) = post(&me.server, "/_runner/renew", &me.token, &body)
                && status != 200
            {
                eprintln!(
                    "standin-runner {}: renewing job {job_id} answered {status}: {answer}",
                    me.name
                );
            }
        }
    }
}

/// Lays out a stand-in actions/runner install at `dir`, shaped like a real one after its first
/// run: `run.sh` (which finds its root from its own path and rewrites `run-helper.sh` from the
/// template with `cp -f`, as the real one does), `run-helper.sh.template` and `run-helper.sh`
/// (which starts `program` with `args` and `--root <root>`), `bin/`, `externals/`, `.env`,
/// `.path`, and a `.runner` left from an earlier configuration.
pub fn write_install(dir: &Path, program: &Path, args: &[&str]) -> std::io::Result<()> {
    write_install_version(dir, program, args, DEFAULT_VERSION)
}

/// The version [`write_install`] lays out.
pub const DEFAULT_VERSION: &str = "2.330.0";

/// [`write_install`] of a given version: `bin/Runner.Listener --version` prints it.
pub fn write_install_version(
    dir: &Path,
    program: &Path,
    args: &[&str],
    version: &str,
) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let quoted: Vec<String> = std::iter::once(program.display().to_string())
        .chain(args.iter().map(|a| a.to_string()))
        .map(|a| format!("'{}'", a.replace('\'', r"'\''")))
        .collect();
    let find_root = "DIR=\"$(cd -P \"$(dirname \"$0\")\" && pwd)\"\n";
    let run = format!(
        "#!/bin/sh\n# The stand-in's run.sh: its root is the directory it is in.\n{find_root}\
         cp -f \"$DIR/run-helper.sh.template\" \"$DIR/run-helper.sh\"\n\
         exec \"$DIR/run-helper.sh\" \"$@\"\n"
    );
    let helper = format!(
        "#!/bin/sh\n{find_root}exec {} --root \"$DIR\" \"$@\"\n",
        quoted.join(" ")
    );
    let listener = format!(
        "#!/bin/sh\n# The stand-in's listener: answers --version as the real one does.\n\
         [ \"$1\" = --version ] && echo {version} && exit 0\necho 'stand-in listener' >&2; exit 1\n"
    );
    // The build's manifest beside the listener, where the daemon reads the version: actions/runner
    // publishes every project with `Version=$(RunnerVersion)` (src/dir.proj), so the .NET SDK's
    // `bin/Runner.Listener.deps.json` names `Runner.Listener/<version>` among its targets and
    // libraries.
    let deps = format!(
        "{{\"targets\":{{\".NETCoreApp,Version=v8.0/linux-x64\":{{\"Runner.Listener/{version}\":{{}}}}}},\
         \"libraries\":{{\"Runner.Listener/{version}\":{{\"type\":\"project\"}}}}}}\n"
    );
    let files: [(&str, &str, u32); 10] = [
        ("run.sh", &run, 0o755),
        ("run-helper.sh.template", &helper, 0o755),
        ("run-helper.sh", &helper, 0o755),
        ("config.sh", "#!/bin/sh\necho configured\n", 0o755),
        ("bin/Runner.Listener", &listener, 0o755),
        ("bin/Runner.Worker", "stand-in worker\n", 0o755),
        ("bin/Runner.Listener.deps.json", &deps, 0o644),
        ("externals/node20/bin/node", "stand-in node\n", 0o755),
        (".env", "LANG=C.UTF-8\n", 0o644),
        (".runner", "{\"AgentName\":\"configured-before\"}\n", 0o644),
    ];
    for (name, text, mode) in files {
        let path = dir.join(name);
        let parent = path.parent().unwrap_or(dir);
        std::fs::create_dir_all(parent)?;
        // As an operator lays it out: nobody but its owner may change it, whatever the umask.
        for made in parent.ancestors().take_while(|a| a.starts_with(dir)) {
            std::fs::set_permissions(made, std::fs::Permissions::from_mode(0o755))?;
        }
        std::fs::write(&path, text)?;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode))?;
    }
    std::fs::write(dir.join(".path"), "/usr/local/bin:/usr/bin:/bin\n")
}

/// A release archive of a stand-in install of `version` (`actions-runner-<os>-<arch>-<version>.tar.gz`
/// as GitHub publishes it: the install's files at the top, no leading directory).
pub fn release_archive(version: &str, program: &Path, args: &[&str]) -> std::io::Result<Vec<u8>> {
    let dir = std::env::temp_dir().join(format!(
        "standin-release-{version}-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0)
    ));
    write_install_version(&dir, program, args, version)?;
    // An install as released holds no identity of an earlier configuration.
    std::fs::remove_file(dir.join(".runner"))?;
    let gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    let mut tar = tar::Builder::new(gz);
    tar.append_dir_all(".", &dir)?;
    let bytes = tar.into_inner()?.finish()?;
    std::fs::remove_dir_all(&dir)?;
    Ok(bytes)
}
