//! The benchmark harness: one command reproduces every figure in docs/benchmarks.md.
//!
//! `cargo bench --bench bench` runs every section; `cargo bench --bench bench -- intake pickup`
//! runs some (`wrk`: the intake of the real `serve` process measured from outside). Each section prints Markdown table rows. Ratios are measured within one run, since
//! absolute figures vary between runs on these shared 2-core machines.

use std::{
    collections::VecDeque,
    time::{Duration, Instant as StdInstant},
};

use actix_web::{App, HttpResponse, HttpServer, web};
use ephemer_actors_core::{
    clock::{Clock, Now},
    config::{ClaimRetryConfig, Config, Environment, ProviderKind},
    github::{ErrorClass, JitRunner, signature::sign},
    job::{JobAction, JobInfo, JobKey},
    metrics::Metrics,
    retry::{Backoff, Failure, RetryQueue},
    scheduler::{Effect, Scheduler, settings_of},
    system::{self, StartOptions},
    webhook::WebhookIntake,
};
use github_standin::{DeliveryFaults, RunnerBehavior, Standin, StandinConfig};

#[path = "sections/burst.rs"]
mod burst;
#[path = "sections/egress.rs"]
mod egress;
#[path = "sections/flood.rs"]
mod flood;
#[path = "sections/outside.rs"]
mod outside;
#[path = "sections/pickup.rs"]
mod pickup;
#[path = "sections/tracked.rs"]
mod tracked;

const SECRET: &str = "bench-secret";

fn body(id: u64, labels: &[&str]) -> String {
    let info = JobInfo {
        key: JobKey::new("acme", id),
        repo: "app".into(),
        run_id: id,
        run_attempt: 1,
        labels: labels.iter().map(|l| l.to_string()).collect(),
        ..JobInfo::default()
    };
    ephemer_actors_core::github::event::render_workflow_job("queued", &info)
}

fn config(api: &str, state: &std::path::Path, extra: &str, command: &str, args: &str) -> Config {
    let text = format!(
        r#"
[github]
api_url = "{api}"
owner = "acme"
repos = ["app"]
token = "ghp_standin_token"
max_claims_per_minute = 10000

[webhook]
listen = "127.0.0.1:0"
secret = "{SECRET}"
reconcile_interval = "0s"

[state]
dir = "{state}"

[admin]
listen = "127.0.0.1:0"

{extra}

[providers.local]
command = "{command}"
args = {args}
allow_same_user = true
labels = ["self-hosted", "linux", "x64"]
max_concurrent = 2000
"#,
        state = state.display()
    );
    Config::from_toml_str(&text, None, &Environment::default()).unwrap_or_else(|e| panic!("{e}"))
}

/// Serves one instance's intake (and metrics) on 127.0.0.1:0; returns its webhook URL.
fn serve_intake(handles: &system::Handles) -> String {
    let intake = handles.intake.clone();
    let server = HttpServer::new(move || {
        App::new().service(WebhookIntake::resource(intake.clone(), "/webhook/github"))
    })
    .disable_signals()
    .bind(("127.0.0.1", 0))
    .unwrap();
    let addr = server.addrs()[0];
    actix_rt::spawn(server.run());
    format!("http://{addr}/webhook/github")
}

/// Sends every body (signed) with `concurrency` in flight, from a thread of its own (so the
/// load generator never shares a thread with the actors); returns deliveries per second.
async fn load(url: &str, bodies: Vec<String>, concurrency: usize) -> f64 {
    let url = url.to_string();
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::spawn(move || {
        let rate = actix_rt::System::new().block_on(load_here(&url, bodies, concurrency));
        let _ = tx.send(rate);
    });
    rx.await.expect("load generator thread")
}

async fn load_here(url: &str, bodies: Vec<String>, concurrency: usize) -> f64 {
    let client = awc::Client::builder()
        .timeout(Duration::from_secs(30))
        .finish();
    let n = bodies.len();
    let mut queue: VecDeque<String> = bodies.into();
    let started = StdInstant::now();
    let mut inflight = futures_util::stream::FuturesUnordered::new();
    use futures_util::StreamExt;
    loop {
        while inflight.len() < concurrency {
            let Some(b) = queue.pop_front() else { break };
            let sig = sign(SECRET.as_bytes(), b.as_bytes());
            let req = client
                .post(url)
                .insert_header(("X-GitHub-Event", "workflow_job"))
                .insert_header(("X-Hub-Signature-256", sig))
                .insert_header(("Content-Type", "application/json"));
            inflight.push(async move { req.send_body(b).await.map(|r| r.status().as_u16()) });
        }
        match inflight.next().await {
            Some(Ok(s)) => assert!(s == 202 || s == 200, "status {s}"),
            Some(Err(e)) => panic!("delivery failed: {e}"),
            None => break,
        }
    }
    n as f64 / started.elapsed().as_secs_f64()
}

async fn intake() {
    println!("\n## Intake\n");
    let n = 20_000;
    let bodies: Vec<String> = (0..n)
        .map(|i| body(1_000_000 + i, &["self-hosted", "gpu"]))
        .collect();
    let bare = HttpServer::new(|| {
        App::new()
            .app_data(web::PayloadConfig::new(25 << 20))
            .route(
                "/webhook/github",
                web::post().to(|b: web::Bytes| async move {
                    HttpResponse::Accepted().body(format!("{}", b.len()))
                }),
            )
    })
    .disable_signals()
    .bind(("127.0.0.1", 0))
    .unwrap();
    let bare_url = format!("http://{}/webhook/github", bare.addrs()[0]);
    actix_rt::spawn(bare.run());
    let standin = Standin::start(StandinConfig::default()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(&standin.url(), dir.path(), "", "/bin/true", "[]");
    let handles =
        system::start(&cfg, Metrics::new(), Clock::real(), StartOptions::default()).unwrap();
    let url = serve_intake(&handles);
    // Warm both, then alternate so neither gets a quieter machine.
    load(&bare_url, bodies[..500].to_vec(), 64).await;
    load(
        &url,
        (0..500)
            .map(|i| body(9_000_000 + i, &["self-hosted", "gpu"]))
            .collect(),
        64,
    )
    .await;
    let bare_rate = load(&bare_url, bodies.clone(), 64).await;
    let daemon_rate = load(&url, bodies, 64).await;
    println!("| target | deliveries/s (20,000 signed workflow_job, 64 in flight) |");
    println!("|---|---|");
    println!("| bare actix-web handler reading the body | {bare_rate:.0} |");
    println!(
        "| ephemer-actors intake: verify, parse, dedup, durable commit, scheduler | {daemon_rate:.0} |"
    );
    println!("| ratio (target >= 0.8) | {:.2} |", daemon_rate / bare_rate);
    // Let go of the instance: its 20,500 tracked jobs and timers would otherwise share the
    // actors' thread with the sections after this one.
    handles.shutdown(Duration::ZERO).await;
}

fn percentiles(mut v: Vec<f64>) -> (f64, f64) {
    v.sort_by(f64::total_cmp);
    let at = |p: f64| v[((v.len() as f64 - 1.0) * p).round() as usize];
    (at(0.5), at(0.99))
}

async fn economy() {
    println!("\n## API economy\n");
    let exe = env!("CARGO_BIN_EXE_ephemer-actors");
    let run = |extra: &'static str| async move {
        let standin = Standin::start(StandinConfig::default()).unwrap();
        standin.set_behavior(RunnerBehavior {
            job_ms: 50,
            ..RunnerBehavior::default()
        });
        let dir = tempfile::tempdir().unwrap();
        let cfg = config(
            &standin.url(),
            dir.path(),
            extra,
            exe,
            "[\"standin-runner\"]",
        );
        let handles =
            system::start(&cfg, Metrics::new(), Clock::real(), StartOptions::default()).unwrap();
        let url = serve_intake(&handles);
        standin.send_webhooks_to(&url, SECRET);
        tokio::time::sleep(Duration::from_millis(300)).await;
        (standin, handles, dir)
    };
    let calls = |s: &Standin| {
        s.calls()
            .iter()
            .filter(|c| c.endpoint != "list_runners")
            .count()
    };
    let wait_done = |s: Standin, n: usize| async move {
        let deadline = StdInstant::now() + Duration::from_secs(180);
        while s.jobs_in("completed") < n && StdInstant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        s
    };
    println!("| scenario | GitHub calls | per unit | target |");
    println!("|---|---|---|---|");
    let (s, h, _d) = run("").await;
    s.queue_jobs("app", &["self-hosted", "linux"], 30);
    let s = wait_done(s, 30).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    println!(
        "| happy path, 30 jobs | {} | {:.2} per job | 1.0 |",
        calls(&s),
        calls(&s) as f64 / 30.0
    );
    h.shutdown(Duration::from_secs(5)).await;

    let (s, h, _d) = run("").await;
    s.set_delivery_faults(DeliveryFaults {
        extra_copies: 2,
        replays: 1,
        ..DeliveryFaults::default()
    });
    s.queue_jobs("app", &["self-hosted", "linux"], 10);
    let s = wait_done(s, 10).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let dup = s
        .deliveries()
        .iter()
        .filter(|d| d.action == "queued")
        .count()
        - 10;
    println!(
        "| {dup} duplicate or replayed deliveries of 10 jobs | {} beyond one per job | {:.2} per duplicate | 0 |",
        calls(&s) - 10,
        (calls(&s) - 10) as f64 / dup as f64
    );
    h.shutdown(Duration::from_secs(5)).await;

    let (s, h, _d) = run("").await;
    s.queue_jobs("app", &["self-hosted", "gpu"], 10);
    tokio::time::sleep(Duration::from_secs(2)).await;
    println!(
        "| 10 deliveries no provider covers | {} | {:.2} per delivery | 0 |",
        calls(&s),
        calls(&s) as f64 / 10.0
    );
    h.shutdown(Duration::from_secs(5)).await;

    let (s, h, _d) = run("[runner.claim_retry]\nschedule = [\"30s\", \"1m\", \"2m\"]\n").await;
    s.exhaust_for(Duration::from_secs(60));
    s.queue_jobs("app", &["self-hosted", "linux"], 10);
    let s = wait_done(s, 10).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    println!(
        "| 10 jobs across a one-minute exhausted rate window | {} | {:.2} per job | <= 2 |",
        calls(&s),
        calls(&s) as f64 / 10.0
    );
    h.shutdown(Duration::from_secs(5)).await;
}

fn rss_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| {
            s.split_whitespace()
                .nth(1)
                .and_then(|p| p.parse::<u64>().ok())
        })
        .map_or(0, |pages| pages * 4096)
}

fn retry_scale() {
    println!("\n## Retry scale\n");
    println!(
        "| parked jobs | add per job | fire + re-add per job | CPU per job (both) | RSS per job |"
    );
    println!("|---|---|---|---|---|");
    let failure = Failure {
        class: ErrorClass::ServerSide,
        retry_after: None,
        bucket: None,
        reading: None,
        message: "502".into(),
    };
    for n in [1_000u64, 10_000, 100_000] {
        let mut q = RetryQueue::new(Backoff::try_new(&ClaimRetryConfig::default()).unwrap());
        let mut rng = <rand::rngs::SmallRng as rand::SeedableRng>::seed_from_u64(1);
        let jobs: Vec<JobInfo> = (0..n)
            .map(|id| JobInfo {
                key: JobKey::new("acme", id),
                repo: "app".into(),
                run_id: id / 10,
                run_attempt: 1,
                labels: vec!["self-hosted".into(), "linux".into(), "x64".into()].into(),
                ..JobInfo::default()
            })
            .collect();
        let rss0 = rss_bytes();
        let t0 = StdInstant::now();
        let started = StdInstant::now();
        for j in jobs {
            q.record_failure(&j.key, &failure, t0, 0, None, &mut rng);
        }
        let add = started.elapsed();
        let rss1 = rss_bytes();
        let later = t0 + Duration::from_secs(3600);
        let started = StdInstant::now();
        for (j, _) in q.pop_due(later) {
            q.record_failure(&j, &failure, later, 0, None, &mut rng);
        }
        let fire = started.elapsed();
        let per = |d: Duration| d.as_secs_f64() * 1e6 / n as f64;
        println!(
            "| {n} | {:.2} µs | {:.2} µs | {:.2} µs | {} B |",
            per(add),
            per(fire),
            per(add + fire),
            rss1.saturating_sub(rss0) / n
        );
        drop(q);
    }
}

fn footprint() {
    println!("\n## Footprint\n");
    let dir = tempfile::tempdir().unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let admin = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let cfg = dir.path().join("c.toml");
    std::fs::write(
        &cfg,
        format!(
            "[github]\nowner = \"acme\"\napi_url = \"http://127.0.0.1:9\"\ntoken = \"t\"\n[webhook]\nlisten = \"127.0.0.1:{port}\"\nsecret = \"s\"\nreconcile_interval = \"0s\"\n[state]\ndir = \"{}\"\n[admin]\nlisten = \"127.0.0.1:{admin}\"\n[providers.local]\ncommand = \"/bin/true\"\nallow_root = true\n",
            dir.path().join("state").display()
        ),
    )
    .unwrap();
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_ephemer-actors"))
        .args(["serve", "--config"])
        .arg(&cfg)
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let pid = child.id();
    let cpu = || -> f64 {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
        let f: Vec<&str> = rest.split_whitespace().collect();
        let ticks: f64 = f.get(11).and_then(|v| v.parse().ok()).unwrap_or(0.0)
            + f.get(12).and_then(|v| v.parse().ok()).unwrap_or(0.0);
        ticks / 100.0
    };
    let rss_kb = || -> u64 {
        std::fs::read_to_string(format!("/proc/{pid}/status"))
            .unwrap_or_default()
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .unwrap_or(0)
    };
    idle(Duration::from_secs(3));
    if let Ok(Some(status)) = child.try_wait() {
        panic!(
            "`serve` exited at start ({status}): run it with {} to see why",
            cfg.display()
        );
    }
    let c0 = cpu();
    idle(Duration::from_secs(60));
    let c1 = cpu();
    let rss = rss_kb();
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGTERM,
    );
    let _ = child.wait();
    println!("| idle `serve` (local provider, no jobs) | value | target |");
    println!("|---|---|---|");
    println!(
        "| resident memory | {:.1} MB | <= 20 MB |",
        rss as f64 / 1024.0
    );
    println!(
        "| CPU over 60 s idle | {:.2} s ({:.2}%) | no busy polling |",
        c1 - c0,
        (c1 - c0) / 60.0 * 100.0
    );
}

// The benchmark driver is not an actix arbiter; it waits on a child process.
#[allow(clippy::disallowed_methods)]
fn idle(d: Duration) {
    std::thread::sleep(d);
}

/// The real scheduler core in virtual time: `jobs` queued at once, `max_claims_per_minute` at
/// its default 150, every claim answering at once. Returns when each claim was sent, from the
/// moment the burst arrived.
fn burst(jobs: u64) -> Vec<Duration> {
    let t0 = StdInstant::now();
    let mut now = Now::whole_seconds(t0, 1_800_000_000);
    let text = "[github]\nowner = \"acme\"\ntoken = \"t\"\n[webhook]\nsecret = \"s\"\n[runner]\nmax_concurrent = 2000\n[providers.local]\ncommand = \"/bin/true\"\nallow_same_user = true\nmax_concurrent = 2000\n";
    let cfg = Config::from_toml_str(text, None, &Environment::default()).unwrap();
    let backoff = Backoff::try_new(&cfg.runner.claim_retry).unwrap();
    let mut s = Scheduler::new(settings_of(&cfg), backoff, 7);
    let _ = s.on_provider_status(ProviderKind::Local.into(), true, None, now);
    let mut claims: Vec<StdInstant> = Vec::new();
    let mut wake = None;
    let handle = |fx: Vec<Effect>,
                  now: Now,
                  s: &mut Scheduler,
                  claims: &mut Vec<StdInstant>,
                  wake: &mut Option<StdInstant>| {
        let mut queue: VecDeque<Effect> = fx.into();
        while let Some(e) = queue.pop_front() {
            match e {
                Effect::Claim { key, provider, .. } => {
                    claims.push(now.mono);
                    let id = claims.len() as u64;
                    let runner = JitRunner {
                        id,
                        name: format!("r{id}"),
                        encoded_jit_config: Default::default(),
                    };
                    queue.extend(s.on_claim_result(key, provider, Ok(runner), now));
                }
                // The one timer: the latest arm replaces the one before.
                Effect::ArmTimer { at } => *wake = at,
                _ => {}
            }
        }
    };
    for id in 0..jobs {
        let job = JobInfo {
            key: JobKey::new("acme", id),
            repo: "app".into(),
            labels: vec!["self-hosted".into()].into(),
            ..JobInfo::default()
        };
        let fx = s.on_job_event(JobAction::Queued, job, None, now.mono, now);
        handle(fx, now, &mut s, &mut claims, &mut wake);
    }
    while (claims.len() as u64) < jobs {
        let Some(at) = wake.take() else { break };
        now = Now::whole_seconds(at, now.unix + at.duration_since(now.mono).as_secs());
        let fx = s.on_timer(now);
        handle(fx, now, &mut s, &mut claims, &mut wake);
    }
    claims.iter().map(|c| c.duration_since(t0)).collect()
}

fn pacing() {
    println!("\n## Claim pacing under a burst\n");
    let hundred = burst(100);
    let first_50_p50 = hundred.get(24).copied().unwrap_or_default();
    let claims = burst(1000);
    let busiest = (0..claims.len())
        .map(|i| {
            claims[i..]
                .iter()
                .take_while(|t| **t < claims[i] + Duration::from_secs(60))
                .count()
        })
        .max()
        .unwrap_or(0);
    let took = claims.last().copied().unwrap_or_default();
    println!("| burst, max_claims_per_minute = 150 (virtual time) | value |");
    println!("|---|---|");
    println!(
        "| 100 jobs: first-50 webhook -> claim p50 | {:.2} s |",
        first_50_p50.as_secs_f64()
    );
    println!(
        "| 100 jobs: last claim | {:.2} s |",
        hundred.last().copied().unwrap_or_default().as_secs_f64()
    );
    println!("| 1,000 jobs: claims made | {} |", claims.len());
    println!(
        "| 1,000 jobs: burst took | {:.1} min |",
        took.as_secs_f64() / 60.0
    );
    println!(
        "| 1,000 jobs: most claims in any 60 s window (GitHub's secondary limit ~180) | {busiest} |"
    );
}

/// Every section, in the order a full run takes them.
const SECTIONS: [&str; 11] = [
    "retry",
    "pacing",
    "intake",
    "wrk",
    "flood",
    "pickup",
    "economy",
    "footprint",
    "tracked",
    "burst",
    "egress",
];
/// Set in a section's own process (a full run starts one per section).
const SECTION_ENV: &str = "EPHEMER_BENCH_SECTION";

fn main() {
    if let Ok(state) = std::env::var(tracked::TRACKED_ENV) {
        tracked::measure_one(&state);
        return;
    }
    if let Ok(port) = std::env::var(outside::BARE_ENV) {
        outside::bare_server(port.parse().expect("a port"));
        return;
    }
    if let Ok(port) = std::env::var(outside::VERIFY_ENV) {
        let workers = std::env::var(outside::WORKERS_ENV)
            .ok()
            .map(|w| w.parse().expect("a number of workers"));
        outside::verify_server(port.parse().expect("a port"), workers);
        return;
    }
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    let want = |s: &str| args.iter().any(|a| a == s);
    if std::env::var_os(SECTION_ENV).is_none() {
        println!(
            "# ephemer-actors benchmarks ({} cores)",
            std::thread::available_parallelism().map_or(0, |n| n.get())
        );
    }
    if args.is_empty() {
        // Every section, each in a process of its own: what one leaves behind (servers,
        // instances, a heap) must not weigh on the next one's figures.
        for section in SECTIONS {
            let status = std::process::Command::new(std::env::current_exe().unwrap())
                .arg(section)
                .env(SECTION_ENV, "1")
                .status()
                .unwrap();
            assert!(status.success(), "section {section} failed");
        }
        return;
    }
    if want("retry") {
        retry_scale();
    }
    if want("pacing") {
        pacing();
    }
    let sys = actix_rt::System::new();
    sys.block_on(async {
        if want("intake") {
            intake().await;
        }
        if want("wrk") {
            let standin = Standin::start(StandinConfig::default()).unwrap();
            let api = standin.url();
            // wrk and the processes it loads run outside this System: block a thread, not it.
            tokio::task::spawn_blocking(move || outside::intake_wrk(&api))
                .await
                .unwrap();
        }
        if want("flood") {
            let standin = Standin::start(StandinConfig::default()).unwrap();
            let api = standin.url();
            tokio::task::spawn_blocking(move || flood::flood(&api))
                .await
                .unwrap();
        }
        if want("pickup") {
            pickup::pickup().await;
        }
        if want("economy") {
            economy().await;
        }
        if want("egress") {
            egress::egress_costs().await;
        }
    });
    if want("footprint") {
        footprint();
    }
    if want("tracked") {
        tracked::tracked();
    }
    if want("burst") {
        burst::bursts();
    }
}
