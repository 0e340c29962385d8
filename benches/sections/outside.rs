//! Intake measured from outside, as a user would: the real `ephemer-actors serve` process, a
//! bare actix-web handler, and the least correct receiver on actix-web's default workers and on
//! one, as `serve`'s listener runs (this bench binary, re-run as servers of their own), each
//! loaded by `wrk` (`apt-get install wrk`), alternated round by round.

use std::{
    io::Write,
    path::Path,
    process::{Child, Command, Stdio},
    time::Duration,
};

use ephemer_actors_core::github::{event::parse_workflow_job, signature::sign};

/// The environment variable that makes this binary the bare handler on `127.0.0.1:<port>`.
pub const BARE_ENV: &str = "EPHEMER_BENCH_BARE_PORT";
/// The environment variable that makes this binary the least correct receiver (verify, then
/// parse what routing needs) on `127.0.0.1:<port>`.
pub const VERIFY_ENV: &str = "EPHEMER_BENCH_VERIFY_PORT";
/// With [`VERIFY_ENV`]: the receiver's workers (actix-web's default, one per core, without it).
pub const WORKERS_ENV: &str = "EPHEMER_BENCH_VERIFY_WORKERS";

/// Distinct signed deliveries the load cycles through.
const BODIES: u64 = 2_000;
/// Each delivery's size, as GitHub's `workflow_job` payloads with their repository and sender
/// objects are.
const BODY_BYTES: usize = 4_096;

/// Runs the bare handler until killed: an actix-web server with the default workers (one per
/// core, as `serve`'s webhook listener) whose one route reads the body and answers 202.
pub fn bare_server(port: u16) {
    use actix_web::{App, HttpResponse, HttpServer, web};
    actix_rt::System::new().block_on(async move {
        HttpServer::new(|| {
            App::new().route(
                "/webhook/github",
                web::post().to(|b: web::Bytes| async move {
                    HttpResponse::Accepted().body(format!("{}", b.len()))
                }),
            )
        })
        .bind(("127.0.0.1", port))
        .unwrap()
        .run()
        .await
        .unwrap();
    });
}

/// The fields a receiver needs to route a `workflow_job` delivery.
#[derive(serde::Deserialize)]
struct Routing<'a> {
    #[serde(borrow)]
    action: std::borrow::Cow<'a, str>,
    workflow_job: RoutingJob<'a>,
    repository: RoutingRepo<'a>,
}

#[derive(serde::Deserialize)]
struct RoutingJob<'a> {
    id: u64,
    run_id: u64,
    #[serde(borrow)]
    labels: Vec<std::borrow::Cow<'a, str>>,
}

#[derive(serde::Deserialize)]
struct RoutingRepo<'a> {
    #[serde(borrow)]
    full_name: std::borrow::Cow<'a, str>,
    owner: RoutingOwner<'a>,
}

#[derive(serde::Deserialize)]
struct RoutingOwner<'a> {
    #[serde(borrow)]
    login: std::borrow::Cow<'a, str>,
}

/// Runs the least a correct receiver does until killed: the same actix-web server, whose one
/// route checks `X-Hub-Signature-256` (HMAC-SHA256, compared in constant time) over the raw
/// body, then deserializes the fields routing needs (action, job id, run id, labels, repo,
/// owner), and answers 202 (401 for a bad signature, 400 for a body it cannot route). On
/// `workers` workers, or actix-web's default (one per core).
pub fn verify_server(port: u16, workers: Option<usize>) {
    use actix_web::{App, HttpRequest, HttpResponse, HttpServer, web};
    use ephemer_actors_core::github::signature::verify;
    actix_rt::System::new().block_on(async move {
        let server = HttpServer::new(|| {
            App::new().route(
                "/webhook/github",
                web::post().to(|req: HttpRequest, b: web::Bytes| async move {
                    let sig = req
                        .headers()
                        .get("x-hub-signature-256")
                        .map(|v| v.as_bytes());
                    if verify(super::SECRET.as_bytes(), &b, sig).is_err() {
                        return HttpResponse::Unauthorized().finish();
                    }
                    match serde_json::from_slice::<Routing<'_>>(&b) {
                        Ok(r) => {
                            let fields = r.action.len()
                                + r.workflow_job.labels.len()
                                + r.repository.full_name.len()
                                + r.repository.owner.login.len();
                            std::hint::black_box((
                                fields,
                                r.workflow_job.id,
                                r.workflow_job.run_id,
                            ));
                            HttpResponse::Accepted().finish()
                        }
                        Err(_) => HttpResponse::BadRequest().finish(),
                    }
                }),
            )
        });
        let server = match workers {
            Some(n) => server.workers(n),
            None => server,
        };
        server
            .bind(("127.0.0.1", port))
            .unwrap()
            .run()
            .await
            .unwrap();
    });
}

/// A `queued` delivery of job `id` with labels no pool covers, padded to [`BODY_BYTES`] with a
/// field the daemon does not read (GitHub's payloads carry many).
fn body(id: u64) -> String {
    let short = super::body(id, &["self-hosted", "gpu"]);
    let pad = BODY_BYTES.saturating_sub(short.len() + 16);
    format!("{{\"padding\":\"{}\",{}", "x".repeat(pad), &short[1..])
}

/// The wrk script: every request one of the bodies, in turn, with its signature and a delivery
/// id never sent before (the prefix is the run's).
fn script(dir: &Path, secret: &str) -> std::path::PathBuf {
    let path = dir.join("deliveries.lua");
    let mut f = std::fs::File::create(&path).unwrap();
    writeln!(f, "local bodies = {{}}\nlocal sigs = {{}}").unwrap();
    for i in 0..BODIES {
        let b = body(3_000_000 + i);
        let sig = sign(secret.as_bytes(), b.as_bytes());
        writeln!(
            f,
            "bodies[{}] = [==[{b}]==]\nsigs[{}] = \"{sig}\"",
            i + 1,
            i + 1
        )
        .unwrap();
    }
    writeln!(
        f,
        r#"local n = 0
local prefix = "run"
local tag = 0
init = function(args)
  prefix = args[1] or prefix
  for i = 1, #prefix do tag = (tag * 31 + prefix:byte(i)) % 4294967296 end
end
request = function()
  n = n + 1
  local i = (n % {BODIES}) + 1
  return wrk.format("POST", nil, {{
    ["Content-Type"] = "application/json",
    ["X-GitHub-Event"] = "workflow_job",
    ["X-GitHub-Delivery"] = string.format("%08x-0000-4000-8000-%012x", tag, n),
    ["X-Hub-Signature-256"] = sigs[i],
  }}, bodies[i])
end"#
    )
    .unwrap();
    path
}

/// CPU time a process has used so far (user + system), from `/proc/PID/stat`.
fn cpu_used(pid: u32) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command (which may hold spaces): state is the 3rd; utime and stime
    // are the 14th and 15th, in clock ticks (100 a second on Linux).
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
    };
    Duration::from_millis((ticks(11) + ticks(12)) * 10)
}

/// What the two unavoidable steps of a delivery cost on one core, per delivery, over the
/// load's own bodies: the HMAC over the raw body, and the JSON parse.
fn verify_and_parse_cost(secret: &str) -> (Duration, Duration) {
    use ephemer_actors_core::github::signature::verify;
    let bodies: Vec<(String, String)> = (0..BODIES)
        .map(|i| {
            let b = body(3_000_000 + i);
            let sig = sign(secret.as_bytes(), b.as_bytes());
            (b, sig)
        })
        .collect();
    let rounds = 20;
    let n = rounds * bodies.len() as u32;
    let started = std::time::Instant::now();
    for _ in 0..rounds {
        for (b, sig) in &bodies {
            verify(secret.as_bytes(), b.as_bytes(), Some(sig.as_bytes())).unwrap();
        }
    }
    let hmac = started.elapsed() / n;
    let started = std::time::Instant::now();
    for _ in 0..rounds {
        for (b, _) in &bodies {
            std::hint::black_box(parse_workflow_job(b.as_bytes()).unwrap());
        }
    }
    (hmac, started.elapsed() / n)
}

/// `wrk -t1 -c32 -d8s`: requests per second, and the non-2xx answers.
fn wrk(url: &str, script: &Path, run: &str) -> (f64, u64) {
    wrk_for(url, script, run, "8s")
}

/// `wrk -t1 -c32 -dDURATION`.
fn wrk_for(url: &str, script: &Path, run: &str, duration: &str) -> (f64, u64) {
    let out = Command::new("wrk")
        .args(["-t1", "-c32", &format!("-d{duration}"), "-s"])
        .arg(script)
        .arg(url)
        .args(["--", run])
        .output()
        .expect("wrk (apt-get install wrk)");
    let text = String::from_utf8_lossy(&out.stdout);
    let field = |name: &str| {
        text.lines()
            .find_map(|l| l.trim().strip_prefix(name))
            .and_then(|v| v.trim().parse::<f64>().ok())
    };
    let rate = field("Requests/sec:").unwrap_or_else(|| panic!("wrk said:\n{text}"));
    let bad = field("Non-2xx or 3xx responses:").unwrap_or(0.0) as u64;
    (rate, bad)
}

/// Runs on a blocking thread (the section runs under `spawn_blocking`), never an arbiter.
#[allow(clippy::disallowed_methods)]
pub(super) fn wait_ready(addr: &str) {
    for _ in 0..200 {
        if std::net::TcpStream::connect(addr).is_ok() {
            std::thread::sleep(Duration::from_millis(300));
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("{addr} did not come up");
}

pub(super) fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The daemon's config: a local pool whose labels the load's jobs do not have.
pub(super) fn serve_config(dir: &Path, api: &str, port: u16) -> std::path::PathBuf {
    let text = format!(
        r#"
[github]
api_url = "{api}"
owner = "acme"
token = "ghp_standin_token"

[webhook]
listen = "127.0.0.1:{port}"
secret = "{secret}"
reconcile_interval = "0s"
redeliver = false

[state]
dir = "{state}"

[admin]
listen = "127.0.0.1:{admin}"

[log]
level = "warn"

[providers.local]
command = "/bin/true"
labels = ["self-hosted", "linux", "x64"]
allow_root = true
"#,
        secret = super::SECRET,
        state = dir.join("state").display(),
        admin = free_port(),
    );
    let path = dir.join("serve.toml");
    std::fs::write(&path, text).unwrap();
    path
}

pub(super) struct Killed(pub(super) Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The section: prints its table rows.
pub fn intake_wrk(api: &str) {
    println!("\n## Intake, measured from outside (wrk)\n");
    if Command::new("wrk").arg("--version").output().is_err() {
        println!("wrk is not installed (apt-get install wrk): section skipped");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let script = script(dir.path(), super::SECRET);
    let (bare_port, verify_port, one_port, serve_port) =
        (free_port(), free_port(), free_port(), free_port());
    let baseline = |env: &str, port: u16, workers: Option<&str>| {
        let mut command = Command::new(std::env::current_exe().unwrap());
        command.env(env, port.to_string()).env_remove(WORKERS_ENV);
        if let Some(n) = workers {
            command.env(WORKERS_ENV, n);
        }
        Killed(command.stdout(Stdio::null()).spawn().unwrap())
    };
    let bare_server = baseline(BARE_ENV, bare_port, None);
    let verify_server = baseline(VERIFY_ENV, verify_port, None);
    // The same receiver on one worker, as `serve`'s webhook listener runs: the like-for-like
    // figure beside the goal's.
    let one_server = baseline(VERIFY_ENV, one_port, Some("1"));
    let cfg = serve_config(dir.path(), api, serve_port);
    let serve = Killed(
        Command::new(env!("CARGO_BIN_EXE_ephemer-actors"))
            .args(["serve", "--config"])
            .arg(&cfg)
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let addr = |port: u16| format!("127.0.0.1:{port}");
    for port in [bare_port, verify_port, one_port, serve_port] {
        wait_ready(&addr(port));
    }
    let url = |port: u16| format!("http://127.0.0.1:{port}/webhook/github");
    let rounds: usize = std::env::var("EPHEMER_BENCH_WRK_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3);
    // Requests per second of each server, round by round, and its CPU time per request over
    // every round.
    let (mut bare, mut verify, mut one, mut daemon) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let (mut bare_cpu, mut verify_cpu, mut one_cpu, mut daemon_cpu) = (
        Duration::ZERO,
        Duration::ZERO,
        Duration::ZERO,
        Duration::ZERO,
    );
    let load = |server: &Killed, port: u16, run: String, cpu: &mut Duration| {
        let before = cpu_used(server.0.id());
        let (rate, refused) = wrk(&url(port), &script, &run);
        *cpu += (cpu_used(server.0.id()) - before) / (rate * 8.0) as u32;
        assert_eq!(refused, 0, "{run}: non-2xx answers");
        rate
    };
    // A warm-up for each, not counted: the first seconds of a process are its page faults,
    // its allocator's first arenas and (the daemon's) its delivery-id set filling up to the
    // window it keeps, not the steady state a long-running receiver is in.
    for (port, run) in [
        (bare_port, "warm-bare"),
        (verify_port, "warm-verify"),
        (one_port, "warm-one"),
        (serve_port, "warm-serve"),
    ] {
        wrk_for(&url(port), &script, run, "4s");
    }
    for round in 0..rounds {
        bare.push(load(
            &bare_server,
            bare_port,
            format!("bare{round}"),
            &mut bare_cpu,
        ));
        verify.push(load(
            &verify_server,
            verify_port,
            format!("verify{round}"),
            &mut verify_cpu,
        ));
        one.push(load(
            &one_server,
            one_port,
            format!("one{round}"),
            &mut one_cpu,
        ));
        // `EPHEMER_BENCH_PERF=FILE`: `perf record` the daemon through its first round.
        let perf = std::env::var("EPHEMER_BENCH_PERF")
            .ok()
            .filter(|_| round == 0)
            .map(|out| {
                Killed(
                    Command::new("perf")
                        .args(["record", "-F", "1999", "-g", "-o", &out, "-p"])
                        .arg(serve.0.id().to_string())
                        .args(["--", "sleep", "7"])
                        .stdout(Stdio::null())
                        .stderr(Stdio::null())
                        .spawn()
                        .expect("perf"),
                )
            });
        daemon.push(load(
            &serve,
            serve_port,
            format!("serve{round}"),
            &mut daemon_cpu,
        ));
        if let Some(mut perf) = perf {
            let _ = perf.0.wait();
        }
    }
    let rss = std::fs::read_to_string(format!("/proc/{}/status", serve.0.id()))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .map(|v| v.trim().to_string())
        })
        .unwrap_or_default();
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
    let each = |v: &[f64]| {
        v.iter()
            .map(|r| format!("{r:.0}"))
            .collect::<Vec<_>>()
            .join(" / ")
    };
    let ratios = |a: &[f64], b: &[f64]| {
        a.iter()
            .zip(b)
            .map(|(a, b)| format!("{:.2}", a / b))
            .collect::<Vec<_>>()
            .join(" / ")
    };
    println!(
        "| wrk -t1 -c32 -d8s, {BODIES} distinct signed {BODY_BYTES} B deliveries, no pool covers them | rounds | mean |"
    );
    println!("|---|---|---|");
    println!(
        "| bare actix-web handler reading the body, req/s | {} | {:.0} |",
        each(&bare),
        mean(&bare)
    );
    println!(
        "| least correct receiver (verify the signature, parse the routing fields), req/s | {} | {:.0} |",
        each(&verify),
        mean(&verify)
    );
    println!(
        "| the same receiver on one worker (as `serve`'s listener), req/s | {} | {:.0} |",
        each(&one),
        mean(&one)
    );
    println!(
        "| `ephemer-actors serve` (verify, parse, dedup, scheduler), req/s | {} | {:.0} |",
        each(&daemon),
        mean(&daemon)
    );
    println!(
        "| serve / least correct receiver (target >= 0.9) | {} | {:.2} |",
        ratios(&daemon, &verify),
        mean(&daemon) / mean(&verify)
    );
    println!(
        "| serve / the receiver on one worker (like for like) | {} | {:.2} |",
        ratios(&daemon, &one),
        mean(&daemon) / mean(&one)
    );
    println!(
        "| serve / bare handler | {} | {:.2} |",
        ratios(&daemon, &bare),
        mean(&daemon) / mean(&bare)
    );
    println!("| daemon RSS after the load | {rss} | |");
    let n = rounds as u32;
    let (bare_cpu, verify_cpu, one_cpu, daemon_cpu) =
        (bare_cpu / n, verify_cpu / n, one_cpu / n, daemon_cpu / n);
    let (hmac, parse) = verify_and_parse_cost(super::SECRET);
    let us = |d: Duration| d.as_secs_f64() * 1e6;
    println!(
        "\n| CPU per request (every round) | µs |\n|---|---|\n\
         | bare handler process | {:.1} |\n| least correct receiver process | {:.1} |\n\
         | the receiver on one worker | {:.1} |\n| `serve` process | {:.1} |\n\
         | of which, measured alone on one core: HMAC-SHA256 over the body | {:.1} |\n\
         | of which, measured alone on one core: JSON parse of the body | {:.1} |",
        us(bare_cpu),
        us(verify_cpu),
        us(one_cpu),
        us(daemon_cpu),
        us(hmac),
        us(parse)
    );
}
