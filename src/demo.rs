//! `demo`: the whole daemon, offline, in one process. A stand-in GitHub sends signed webhooks
//! for a few dozen jobs over two label sets; the real actors (scheduler, retry ladder, rate
//! tracking, the local provisioner under its supervisor) claim a runner for each; stand-in
//! runners take jobs the way GitHub hands them out. A short fault script plays a 502 burst, a
//! few seconds of exhausted rate budget, duplicate, replayed and out-of-order deliveries. A live
//! view shows jobs flowing; a summary closes. Exit 0 when every job ran and no runner is left.

use std::{
    io::{IsTerminal, Write},
    time::{Duration, Instant},
};

use anyhow::Context;
use ephemer_actors_core::{
    clock::Clock,
    config::{AdminListen, Config, Environment},
    metrics::Metrics,
    scheduler::{Phase, messages::GetSchedulerState},
    system::{self, StartOptions},
};
use github_standin::{DeliveryFaults, RunnerBehavior, Standin, StandinConfig};
use rand::{RngExt as _, SeedableRng, rngs::SmallRng};

/// `demo` options.
#[derive(Debug, Clone, clap::Args)]
pub struct DemoArgs {
    /// How many jobs to queue.
    #[arg(long, default_value_t = 36)]
    pub jobs: usize,
    /// Seed for label choice, job timing and retry jitter (reproducible runs).
    #[arg(long)]
    pub seed: Option<u64>,
    /// Stay up after the summary so /metrics can be browsed; Ctrl-C to exit.
    #[arg(long)]
    pub keep: bool,
    /// Pull mode: no webhook at all; the daemon finds the jobs by polling the stand-in.
    #[arg(long, conflicts_with = "scaleset")]
    pub pull: bool,
    /// Scale-set mode: no webhook at all; the pool is a runner scale set on the stand-in's
    /// Actions service, and the daemon long-polls its message queue.
    #[arg(long)]
    pub scaleset: bool,
}

const LABEL_SETS: [&[&str]; 2] = [&["self-hosted", "linux"], &["self-hosted", "linux", "gpu"]];
const DEADLINE: Duration = Duration::from_secs(150);

/// Runs the demo on a fresh actix System; `Ok(true)` when every job ran.
pub fn run(args: DemoArgs) -> anyhow::Result<bool> {
    actix_rt::System::new().block_on(demo(args))
}

/// The demo's config; the local pool runs a stand-in actions/runner install laid out under
/// `state` (its `run.sh` starts this executable's hidden `standin-runner`), one copy per job.
fn config(
    standin: &Standin,
    state: &std::path::Path,
    secret: &str,
    args: &DemoArgs,
) -> anyhow::Result<Config> {
    let exe = std::env::current_exe().context("cannot find this executable")?;
    let runner_dir = state.join("actions-runner");
    standin_runner::write_install(&runner_dir, &exe, &["standin-runner"])
        .with_context(|| format!("cannot lay out {}", runner_dir.display()))?;
    let text = format!(
        r#"
[github]
api_url = "{api}"
owner = "acme"
{repos}
token = "ghp_demo"
max_claims_per_minute = 600

[webhook]
listen = "127.0.0.1:0"
secret = "{secret}"
reconcile_interval = "0s"
{mode}

[runner]
max_concurrent = 8
shutdown_timeout = "20s"
# The stand-in serves actions/runner's releases too (github.com is not needed).
releases_url = "{api}/repos/actions/runner/releases"

[runner.claim_retry]
schedule = ["1s", "2s", "4s"]
rate_reset_jitter = ["1s", "2s"]

[state]
dir = "{state}"

[admin]
listen = "127.0.0.1:0"

[providers.local]
runner_dir = "{runner_dir}"
# The demo's stand-in runners run as whoever runs the demo.
allow_root = true
labels = ["self-hosted", "linux", "x64", "gpu"]
max_concurrent = 8
"#,
        api = standin.url(),
        state = state.display(),
        runner_dir = runner_dir.display(),
        mode = if args.pull {
            "mode = \"pull\"\npoll_interval = \"1s\"\npoll_idle_interval = \"5s\""
        } else if args.scaleset {
            "mode = \"scaleset\""
        } else {
            ""
        },
        // Scale sets are registered at the org.
        repos = if args.scaleset {
            ""
        } else {
            "repos = [\"demo\"]"
        },
    );
    Config::from_toml_str(&text, None, &Environment::default()).map_err(|e| anyhow::anyhow!("{e}"))
}

#[derive(Default, Clone, Copy)]
struct Counts {
    queued: usize,
    claiming: usize,
    retrying: usize,
    running: usize,
    done: usize,
}

async fn counts(standin: &Standin, handles: &system::Handles, sent: usize) -> Counts {
    let state = handles.scheduler.send(GetSchedulerState).await.ok();
    let phase = |want: fn(&Phase) -> bool| {
        state
            .as_ref()
            .map_or(0, |s| s.jobs.iter().filter(|j| want(&j.phase)).count())
    };
    let done = standin.jobs_in("completed");
    let running = standin.jobs_in("in_progress");
    let claiming = phase(|p| matches!(p, Phase::Claiming { .. }));
    let retrying = phase(|p| matches!(p, Phase::Retrying));
    Counts {
        queued: sent.saturating_sub(done + running + claiming + retrying),
        claiming,
        retrying,
        running,
        done,
    }
}

fn render(c: Counts, total: usize) -> String {
    const WIDTH: usize = 30;
    let filled = (c.done * WIDTH).checked_div(total).unwrap_or(0);
    format!(
        "[{}{}] {:>3}/{total}  queued {:>2} | claiming {:>2} | retrying {:>2} | running {:>2} | done {:>3}",
        "#".repeat(filled),
        ".".repeat(WIDTH - filled),
        c.done,
        c.queued,
        c.claiming,
        c.retrying,
        c.running,
        c.done
    )
}

async fn demo(args: DemoArgs) -> anyhow::Result<bool> {
    let seed = args.seed.unwrap_or_else(rand::random);
    let mut rng = SmallRng::seed_from_u64(seed);
    let state_dir = std::env::temp_dir().join(format!("ephemer-demo-{}", std::process::id()));
    let secret = format!("demo-{:016x}", rng.random::<u64>());

    let standin = Standin::start(StandinConfig {
        repos: vec!["demo".into()],
        token: "ghp_demo".into(),
        ..StandinConfig::default()
    })?;
    standin.set_behavior(RunnerBehavior {
        job_ms: 700,
        ..RunnerBehavior::default()
    });
    let config = config(&standin, &state_dir, &secret, &args)?;
    std::fs::create_dir_all(&config.state.dir)?;
    let handles = system::start(
        &config,
        Metrics::new(),
        Clock::real(),
        StartOptions {
            seed: Some(seed),
            ..StartOptions::default()
        },
    )?;
    let listeners = crate::serve::listen(&config, &handles)?;
    handles.health.set_ready();
    let webhook_url = format!("http://{}{}", listeners.webhook, config.webhook.path);
    let pushed = !args.pull && !args.scaleset;
    if pushed {
        standin.send_webhooks_to(&webhook_url, &secret);
    }

    let total = args.jobs.max(1);
    println!("ephemer-actors demo: {total} jobs over two label sets, seed {seed}");
    println!("  stand-in GitHub  {}", standin.url());
    if args.pull {
        println!(
            "  webhook          none: pull mode polls the stand-in every second (304s are free)"
        );
    } else if args.scaleset {
        println!(
            "  webhook          none: the pool is a scale set; the daemon long-polls its message queue"
        );
    } else {
        println!("  webhook          {webhook_url}");
    }
    println!("  metrics          http://{}/metrics", listeners.webhook);
    if let AdminListen::Tcp(admin) = &listeners.admin {
        println!("  status page      http://{admin}/");
    }
    if args.scaleset {
        println!(
            "  faults           a 502 burst and a 429 with Retry-After from generatejitconfig, the message session evicted\n"
        );
    } else {
        println!(
            "  faults           duplicate and replayed deliveries, a 502 burst, 3 s of exhausted rate budget, out-of-order in_progress/completed\n"
        );
    }

    let tty = std::io::stdout().is_terminal();
    let started = Instant::now();
    let mut sent = 0;
    let mut last_line = Instant::now() - Duration::from_secs(1);
    loop {
        // The fault script, keyed on how many jobs have been queued.
        if sent < total {
            if args.scaleset {
                scaleset_faults(&standin, sent, total);
            }
            match sent * 4 / total {
                _ if args.scaleset => {}
                0 => standin.set_delivery_faults(DeliveryFaults {
                    extra_copies: 1,
                    replays: 1,
                    ..DeliveryFaults::default()
                }),
                1 if sent == total / 4 => {
                    standin.set_delivery_faults(DeliveryFaults::default());
                    standin.fail_status("generate_jitconfig", 502, 3);
                }
                2 if sent == total / 2 => {
                    standin.exhaust_for(Duration::from_secs(3));
                }
                3 if sent == total * 3 / 4 => standin.set_delivery_faults(DeliveryFaults {
                    swap_in_progress_and_completed: true,
                    ..DeliveryFaults::default()
                }),
                _ => {}
            }
            let labels = LABEL_SETS[rng.random_range(0..LABEL_SETS.len())];
            standin.queue_jobs("demo", labels, 1);
            sent += 1;
        }
        let c = counts(&standin, &handles, sent).await;
        if tty {
            print!("\r{}", render(c, total));
            let _ = std::io::stdout().flush();
        } else if last_line.elapsed() >= Duration::from_secs(1) || c.done == total {
            println!("{}", render(c, total));
            last_line = Instant::now();
        }
        if c.done == total || started.elapsed() > DEADLINE {
            break;
        }
        let pause = if sent < total {
            rng.random_range(40..160)
        } else {
            200
        };
        tokio::time::sleep(Duration::from_millis(pause)).await;
    }
    if tty {
        println!();
    }
    let elapsed = started.elapsed();
    let metrics = handles.metrics.clone();
    let torn_down = handles.shutdown(Duration::from_secs(20)).await;
    let done = standin.jobs_in("completed");
    let ok = done == total && standin.runners().is_empty();
    print_summary(&standin, &metrics, total, elapsed, torn_down);

    if args.keep {
        println!(
            "\n--keep: still serving http://{}/metrics; Ctrl-C to exit",
            listeners.webhook
        );
        let _ = tokio::signal::ctrl_c().await;
    }
    listeners.stop().await;
    standin.stop().await;
    let _ = std::fs::remove_dir_all(&state_dir);
    Ok(ok)
}

/// Scale-set mode's fault script, keyed on how many jobs have been queued.
fn scaleset_faults(standin: &Standin, sent: usize, total: usize) {
    if sent == total / 4 {
        standin.fail_status("actions_generate_jitconfig", 502, 3);
    } else if sent == total / 2 {
        // The Actions service answers its own throttling with Retry-After.
        standin.fail_next(
            "actions_generate_jitconfig",
            1,
            github_standin::Fault::Status {
                status: 429,
                message: "Too Many Requests".into(),
                retry_after: Some(2),
                rate_headers: false,
            },
        );
    } else if sent == total * 3 / 4 {
        let ids: Vec<u64> = standin.scale_sets().iter().map(|s| s.0).collect();
        let mut state = standin.state();
        for id in ids {
            state.scalesets.evict_session(id);
        }
    }
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn print_summary(
    standin: &Standin,
    metrics: &Metrics,
    total: usize,
    elapsed: Duration,
    torn_down: usize,
) {
    let jobs = standin.jobs();
    let done = jobs.iter().filter(|j| j.status == "completed").count();
    let calls = standin.calls();
    let claim = |c: &&github_standin::Call| {
        matches!(
            c.endpoint.as_str(),
            "generate_jitconfig" | "actions_generate_jitconfig"
        )
    };
    let claims_ok = calls
        .iter()
        .filter(claim)
        .filter(|c| matches!(c.status, 200 | 201))
        .count();
    let claims_failed = calls
        .iter()
        .filter(claim)
        .filter(|c| !matches!(c.status, 200 | 201))
        .count();
    let messages = calls
        .iter()
        .filter(|c| c.endpoint == "actions_get_message")
        .count();
    let mut waits: Vec<f64> = jobs
        .iter()
        .filter_map(|j| {
            j.picked_at_ms
                .map(|p| p.saturating_sub(j.queued_at_ms) as f64 / 1000.0)
        })
        .collect();
    waits.sort_by(f64::total_cmp);
    let retries: Vec<String> = ephemer_actors_core::metrics::ERROR_CLASSES
        .iter()
        .map(|c| (c, metrics.retry_attempts.with_label_values(&[*c]).get()))
        .filter(|(_, n)| *n > 0)
        .map(|(c, n)| format!("{c} {n}"))
        .collect();
    let deliveries = standin.deliveries();
    let replays = deliveries.iter().filter(|d| d.status == 200).count();
    let polls = calls
        .iter()
        .filter(|c| matches!(c.endpoint.as_str(), "list_runs" | "list_jobs"))
        .count();
    let free = calls
        .iter()
        .filter(|c| matches!(c.endpoint.as_str(), "list_runs" | "list_jobs") && c.status == 304)
        .count();
    let left = standin.runners().len();
    let row = |k: &str, v: String| println!("  {k:<28} {v}");
    println!("\nsummary ({:.1} s)", elapsed.as_secs_f64());
    row("jobs run", format!("{done} / {total}"));
    row(
        "claims (runners registered)",
        format!("{claims_ok}  (+{claims_failed} failed and retried)"),
    );
    row(
        "GitHub API calls",
        format!(
            "{}  ({:.2} per job)",
            calls.len(),
            calls.len() as f64 / total as f64
        ),
    );
    row(
        "retries by class",
        if retries.is_empty() {
            "none".into()
        } else {
            retries.join(", ")
        },
    );
    if messages > 0 {
        row(
            "message polls (scale set)",
            format!("{messages}  (each answered at once by a message, or after ~50 s)"),
        );
    } else if polls > 0 && deliveries.is_empty() {
        row(
            "polls (pull mode)",
            format!("{polls}  ({free} unchanged: free 304s)"),
        );
    } else {
        row(
            "webhook deliveries",
            format!(
                "{}  ({replays} replays recognised by delivery id)",
                deliveries.len()
            ),
        );
    }
    row(
        "pickup latency p50 / p99",
        format!(
            "{:.2} s / {:.2} s  (queued -> taken by a runner)",
            percentile(&waits, 0.5),
            percentile(&waits, 0.99)
        ),
    );
    row("runners torn down at drain", torn_down.to_string());
    row("runners left registered", left.to_string());
    println!(
        "\n{}",
        if done == total && left == 0 {
            "every job ran; nothing left behind"
        } else {
            "NOT every job ran"
        }
    );
}
