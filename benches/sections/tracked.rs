//! Memory per tracked job: the real scheduler core holding 100,000 jobs in every state that
//! stays in memory (done with its timeline, running on a runner, retrying on the ladder,
//! unroutable), measured as the growth of this process's RSS. 1,000 run at once (a large
//! host); the rest split evenly between the other three states.

use ephemer_actors_core::{
    clock::Now,
    config::{Config, Environment, ProviderKind},
    github::{ErrorClass, GithubError, JitRunner},
    job::{JobAbout, JobAction, JobInfo, JobKey},
    retry::Backoff,
    scheduler::{Effect, Scheduler, settings_of},
};

const JOBS: u64 = 100_000;
/// Jobs running at once.
const RUNNING: u64 = 1_000;

fn job(id: u64, labels: &[&str]) -> JobInfo {
    JobInfo {
        key: JobKey::new("acme", id),
        repo: "app".into(),
        run_id: id / 4,
        run_attempt: 1,
        labels: labels.iter().map(|l| l.to_string()).collect(),
        // What a delivery names: a matrix job's name, its workflow, branch and sender.
        about: JobAbout::new(
            &format!("test (ubuntu-24.04, {})", id % 8),
            "CI",
            "main",
            "octocat",
        )
        .map(std::sync::Arc::new),
        ..JobInfo::default()
    }
}

/// Which state the jobs are driven to.
#[derive(Clone, Copy, PartialEq)]
enum Mix {
    /// Ids 4n+2 retrying, 4n+3 unroutable, the first 1,000 of 4n+1 running, the rest done.
    All,
    /// Every job claimed, run and completed.
    Done,
    /// Every job's claim failed: on the ladder.
    Retrying,
    /// No pool covers any job.
    Unroutable,
}

impl Mix {
    fn parse(s: &str) -> Option<Mix> {
        Some(match s {
            "done" => Mix::Done,
            "retrying" => Mix::Retrying,
            "unroutable" => Mix::Unroutable,
            "all" => Mix::All,
            _ => return None,
        })
    }

    fn fails(self, id: u64) -> bool {
        self == Mix::Retrying || (self == Mix::All && id % 4 == 2)
    }

    fn keeps_running(self, id: u64) -> bool {
        self == Mix::All && id % 4 == 1 && id < RUNNING * 4
    }

    fn uncovered(self, id: u64) -> bool {
        self == Mix::Unroutable || (self == Mix::All && id % 4 == 3)
    }
}

/// The environment variable that makes this binary measure one [`Mix`] and print its bytes
/// per job (each state in a process of its own: a freed heap is not given back).
pub const TRACKED_ENV: &str = "EPHEMER_BENCH_TRACKED";

/// Answers every claim: ids 4n+2 fail (the ladder keeps them); the first 1,000 ids 4n+1 get a
/// runner that stays; every other claim's runner runs and completes its job.
fn answer(s: &mut Scheduler, fx: Vec<Effect>, now: Now, mix: Mix) {
    for e in fx {
        let Effect::Claim { key, provider, .. } = e else {
            continue;
        };
        let id = key.job_id;
        if mix.fails(id) {
            let e = GithubError::Network {
                endpoint: "generate_jitconfig",
                detail: "connection reset".into(),
            };
            assert_eq!(e.class(), ErrorClass::Network);
            let _ = s.on_claim_result(key, provider, Err(e), now);
            continue;
        }
        let name = format!("ephemer-local-bench-{id:08}");
        let runner = JitRunner {
            id,
            name: name.clone(),
            encoded_jit_config: Default::default(),
        };
        let _ = s.on_claim_result(key.clone(), provider, Ok(runner), now);
        if !mix.keeps_running(id) {
            let ran = JobInfo {
                runner_name: Some(name.clone()),
                runner_id: Some(id),
                conclusion: Some("success".into()),
                ..job(id, &["self-hosted"])
            };
            let _ = s.on_job_event(JobAction::InProgress, ran.clone(), None, now.mono, now);
            let _ = s.on_job_event(JobAction::Completed, ran, None, now.mono, now);
            let gone = ephemer_actors_core::provision::RunnerEventKind::Exited {
                code: Some(0),
                reason: ephemer_actors_core::provision::ExitReason::Exited,
                detail: None,
            };
            let _ = s.on_runner_event(&name, gone, now);
        }
    }
}

/// Drives 100,000 jobs to `mix` and returns the RSS growth per job, and the scheduler.
fn measure(mix: Mix) -> (f64, Scheduler, Now) {
    let text = format!(
        "[github]\nowner = \"acme\"\ntoken = \"t\"\nmax_claims_per_minute = 10000\n[webhook]\nsecret = \"s\"\n\
         [runner]\nmax_concurrent = {JOBS}\n[providers.local]\ncommand = \"/bin/true\"\nallow_same_user = true\nmax_concurrent = {JOBS}\n"
    );
    let cfg = Config::from_toml_str(&text, None, &Environment::default()).unwrap();
    let backoff = Backoff::try_new(&cfg.runner.claim_retry).unwrap();
    let mut settings = settings_of(&cfg);
    settings.targets[0].claims_per_minute = u32::MAX;
    let t0 = std::time::Instant::now();
    let now = Now::whole_seconds(t0, 1_800_000_000);
    let before = super::rss_bytes();
    let mut s = Scheduler::new(settings, backoff, 7);
    let _ = s.on_provider_status(ProviderKind::Local.into(), true, None, now);
    for id in 0..JOBS {
        let labels: &[&str] = if mix.uncovered(id) {
            &["self-hosted", "gpu"]
        } else {
            &["self-hosted"]
        };
        // A GUID like GitHub's X-GitHub-Delivery, so the bench pays for a real id.
        let delivery = format!("{id:08x}-7a1e-11f0-8000-0242ac120002");
        let fx = s.on_job_event(
            JobAction::Queued,
            job(id, labels),
            Some(&delivery),
            now.mono,
            now,
        );
        answer(&mut s, fx, now, mix);
        let _ = s.take_observations();
        let _ = s.take_ops();
    }
    let per_job = super::rss_bytes().saturating_sub(before) as f64 / JOBS as f64;
    (per_job, s, now)
}

/// In a process of its own ([`TRACKED_ENV`]): prints one state's bytes per job.
pub fn measure_one(state: &str) {
    let mix = Mix::parse(state).expect("done, retrying, unroutable or all");
    println!("{:.0}", measure(mix).0);
}

fn in_own_process(state: &str) -> String {
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .env(TRACKED_ENV, state)
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// The section: prints its table rows.
pub fn tracked() {
    println!("\n## Jobs tracked in memory\n");
    let (per_job, s, now) = measure(Mix::All);
    let status = s.view().status(now);
    println!("| 100,000 jobs tracked by the scheduler core | RSS growth per job | target |");
    println!("|---|---|---|");
    println!(
        "| every state: {} done / {} running / {} retrying / {} unroutable | {per_job:.0} B | <= 1024 B |",
        JOBS / 2 - RUNNING,
        status.runners,
        status.retry_queue_depth,
        JOBS / 4
    );
    for (state, what) in [
        (
            "done",
            "all done (claimed, run, completed; timeline of 9 notes)",
        ),
        ("retrying", "all retrying (claim failed; on the ladder)"),
        ("unroutable", "all unroutable (no pool covers them)"),
    ] {
        println!("| {what} | {} B | |", in_own_process(state));
    }
    println!(
        "| timeline cap per job | {} entries | capped |",
        ephemer_actors_core::scheduler::core::timeline::TIMELINE_CAP
    );
}
