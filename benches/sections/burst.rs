//! A burst on one host: the real scheduler core handed N `queued` jobs at once, with 64 slots,
//! the default claim pacing and runners whose job takes 0.2 s, driven in virtual time until
//! every job ran. What it measures is the daemon's own work per decision (the core is where
//! every decision is made; the actors only carry its effects out): the time per call while the
//! backlog is large, which must not grow with it, the claims in any minute against the pacing,
//! and the memory the burst holds.

use std::time::{Duration, Instant as WallInstant};

use ephemer_actors_core::{
    clock::Now,
    config::{Config, Environment, ProviderKind},
    github::JitRunner,
    job::{JobAction, JobInfo, JobKey},
    provision::{ExitReason, RunnerEventKind},
    retry::Backoff,
    scheduler::{Effect, Scheduler, settings_of},
};
use std::time::Instant;

/// Slots of the host's one pool.
const SLOTS: u64 = 64;
/// How long each job runs.
const JOB_TIME: Duration = Duration::from_millis(200);

fn job(id: u64) -> JobInfo {
    JobInfo {
        key: JobKey::new("acme", id),
        repo: "app".into(),
        run_id: id,
        run_attempt: 1,
        labels: vec!["self-hosted".to_string(), "linux".to_string()].into(),
        ..JobInfo::default()
    }
}

/// What one burst measured.
pub struct Burst {
    /// Jobs that ran.
    pub ran: u64,
    /// Virtual time from the burst to the last job's end.
    pub took: Duration,
    /// Core calls made, and their wall time in all.
    pub calls: u64,
    pub wall: Duration,
    /// Mean wall time per call while nine in ten of the burst were not claimed yet (its intake
    /// and the first claims).
    pub per_call_backlogged: Duration,
    /// Claims in the busiest 60 s of virtual time, and the pacing's limit.
    pub busiest_minute: usize,
    pub pacing: u32,
    /// RSS growth over the run, per job.
    pub rss_per_job: f64,
}

/// Runs a burst of `jobs`.
pub fn burst(jobs: u64) -> Burst {
    let text = format!(
        "[github]\nowner = \"acme\"\ntoken = \"t\"\n[webhook]\nsecret = \"s\"\n\
         [runner]\nmax_concurrent = {SLOTS}\n[providers.local]\ncommand = \"/bin/true\"\n\
         allow_same_user = true\nmax_concurrent = {SLOTS}\nlabels = [\"self-hosted\", \"linux\"]\n"
    );
    let cfg = Config::from_toml_str(&text, None, &Environment::default()).unwrap();
    let pacing = cfg.github.max_claims_per_minute;
    let backoff = Backoff::try_new(&cfg.runner.claim_retry).unwrap();
    let settings = settings_of(&cfg);
    let t0 = Instant::now();
    let at = |d: Duration| Now::whole_seconds(t0 + d, 1_800_000_000 + d.as_secs());
    let before = super::rss_bytes();
    let mut s = Scheduler::new(settings, backoff, 7);
    let mut clock = Duration::ZERO;
    let mut wall = Duration::ZERO;
    let mut calls = 0u64;
    let mut backlogged = (0u64, Duration::ZERO);
    let mut timer: Option<Instant> = None;
    // Runners at work: (end, name, job id).
    let mut running: Vec<(Duration, String, u64)> = Vec::new();
    let mut claims_at: Vec<Duration> = Vec::new();
    let mut ran = 0u64;
    let mut pending: Vec<Effect> = Vec::new();
    // Times one core call, counting it as backlogged while most of the burst still waits.
    macro_rules! call {
        ($e:expr) => {{
            let started = WallInstant::now();
            let fx = $e;
            let took = started.elapsed();
            wall += took;
            calls += 1;
            // Nine in ten of the burst not claimed yet.
            if (claims_at.len() as u64) * 10 <= jobs {
                backlogged.0 += 1;
                backlogged.1 += took;
            }
            let _ = s.take_observations();
            let _ = s.take_ops();
            fx
        }};
    }
    pending.extend(call!(s.on_provider_status(
        ProviderKind::Local.into(),
        true,
        None,
        at(clock)
    )));
    for id in 0..jobs {
        let delivery = format!("{id:08x}-7a1e-11f0-8000-0242ac120002");
        pending.extend(call!(s.on_job_event(
            JobAction::Queued,
            job(id),
            Some(&delivery),
            at(clock).mono,
            at(clock)
        )));
    }
    while ran < jobs {
        // Carry the effects out: a claim is answered at once and its runner takes its job.
        while let Some(e) = pending.pop() {
            match e {
                Effect::Claim { key, provider, .. } => {
                    claims_at.push(clock);
                    let id = key.job_id;
                    let name = format!("ephemer-local-burst-{id:08}");
                    let runner = JitRunner {
                        id,
                        name: name.clone(),
                        encoded_jit_config: Default::default(),
                    };
                    pending.extend(call!(s.on_claim_result(
                        key,
                        provider,
                        Ok(runner),
                        at(clock)
                    )));
                    pending.extend(call!(s.on_runner_event(
                        &name,
                        RunnerEventKind::Started { warm: false },
                        at(clock)
                    )));
                    let took = JobInfo {
                        runner_name: Some(name.clone()),
                        runner_id: Some(id),
                        ..job(id)
                    };
                    pending.extend(call!(s.on_job_event(
                        JobAction::InProgress,
                        took,
                        None,
                        at(clock).mono,
                        at(clock)
                    )));
                    running.push((clock + JOB_TIME, name, id));
                }
                Effect::ArmTimer { at } => timer = at,
                _ => {}
            }
        }
        // The next thing to happen: a job's end, or the core's timer.
        running.sort_by_key(|r| std::cmp::Reverse(r.0));
        let next_end = running.last().map(|r| r.0);
        let next_timer = timer.map(|t| t.saturating_duration_since(t0));
        let Some(next) = [next_end, next_timer].into_iter().flatten().min() else {
            break;
        };
        clock = clock.max(next);
        while running.last().is_some_and(|r| r.0 <= clock) {
            let (_, name, id) = running.pop().unwrap();
            let done = JobInfo {
                runner_name: Some(name.clone()),
                runner_id: Some(id),
                conclusion: Some("success".into()),
                ..job(id)
            };
            pending.extend(call!(s.on_job_event(
                JobAction::Completed,
                done,
                None,
                at(clock).mono,
                at(clock)
            )));
            let gone = RunnerEventKind::Exited {
                code: Some(0),
                reason: ExitReason::Exited,
                detail: None,
            };
            pending.extend(call!(s.on_runner_event(&name, gone, at(clock))));
            ran += 1;
        }
        if timer.is_some_and(|t| t <= t0 + clock) {
            timer = None;
            pending.extend(call!(s.on_timer(at(clock))));
        }
    }
    let busiest_minute = claims_at
        .iter()
        .enumerate()
        .map(|(i, start)| {
            claims_at[i..]
                .iter()
                .take_while(|t| **t < *start + Duration::from_secs(60))
                .count()
        })
        .max()
        .unwrap_or(0);
    Burst {
        ran,
        took: clock,
        calls,
        wall,
        per_call_backlogged: backlogged.1 / backlogged.0.max(1) as u32,
        busiest_minute,
        pacing,
        rss_per_job: super::rss_bytes().saturating_sub(before) as f64 / jobs as f64,
    }
}

/// The section: prints its table rows.
pub fn bursts() {
    println!("\n## A burst on one host\n");
    println!(
        "| jobs queued in one burst, {SLOTS} slots, 0.2 s jobs, default pacing | ran | virtual time | core calls | core CPU per job | per call, backlog large | per call, whole run | claims in the busiest minute (pacing) | RSS per job |"
    );
    println!("|---|---|---|---|---|---|---|---|---|");
    for jobs in [500, 5_000] {
        let b = burst(jobs);
        println!(
            "| {jobs} | {} | {:.0} s | {} | {:.1} µs | {:.2} µs | {:.2} µs | {} ({}) | {:.0} B |",
            b.ran,
            b.took.as_secs_f64(),
            b.calls,
            b.wall.as_secs_f64() * 1e6 / jobs as f64,
            b.per_call_backlogged.as_secs_f64() * 1e6,
            b.wall.as_secs_f64() * 1e6 / b.calls.max(1) as f64,
            b.busiest_minute,
            b.pacing,
            b.rss_per_job
        );
    }
}
