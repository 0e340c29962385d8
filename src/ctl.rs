//! `status`, `jobs`, `cordon`, `uncordon`: ask a running daemon through its admin API (awc, the
//! API's own answer types) and print a table for people, or the JSON with `--json`. The admin address comes from the config
//! (`admin.listen`, read without demanding the secrets) or `--admin`.

use std::{net::SocketAddr, time::Duration};

use actix_web::http::Method;
use anyhow::{Context, anyhow, bail};
use ephemer_actors_core::{
    admin::{CordonAnswer, ErrorAnswer, JobAnswer, JobsAnswer, StatusAnswer},
    config::AdminListen,
    scheduler::Phase,
};
use serde::de::DeserializeOwned;

/// Where to find the daemon.
#[derive(Debug, Clone, clap::Args)]
pub struct Target {
    /// The global `--config`, whose `admin.listen` names the daemon (secrets are not needed).
    #[arg(skip)]
    config: Option<crate::cli::ConfigPath>,
    /// The admin address itself, e.g. 127.0.0.1:9091 or unix:/run/ephemer/admin.sock (wins
    /// over --config).
    #[arg(long, value_name = "ADDR")]
    admin: Option<String>,
    /// Print the JSON the daemon answered.
    #[arg(long)]
    pub(crate) json: bool,
}

/// The config file a control command was pointed at cannot be read: exit 2, as for any
/// config error.
#[derive(Debug)]
pub struct BadConfig(String);

impl std::fmt::Display for BadConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for BadConfig {}

impl Target {
    /// This target, reading `config` (the global `--config`).
    pub fn with(mut self, config: &crate::cli::ConfigPath) -> Self {
        self.config = Some(config.clone());
        self
    }

    /// The config file as a plain table (secrets are not needed); empty when no config was
    /// named and the default file does not exist (the defaults then name the daemon).
    fn table(&self) -> anyhow::Result<toml::Table> {
        let Some(config) = &self.config else {
            return Ok(toml::Table::new());
        };
        let path = &config.path;
        let text = match std::fs::read_to_string(path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && !config.explicit => {
                return Ok(toml::Table::new());
            }
            Err(e) => return Err(BadConfig(format!("cannot read {}: {e}", path.display())).into()),
        };
        // The parser's own message quotes the offending line, which may hold a token: say only
        // where and what.
        toml::from_str(&text).map_err(|e| {
            let line = e.span().map_or(0, |s| {
                text[..s.start.min(text.len())].matches('\n').count() + 1
            });
            BadConfig(format!(
                "{} is not valid TOML (line {line}): {}",
                path.display(),
                e.message()
            ))
            .into()
        })
    }

    fn key<'t>(table: &'t toml::Table, section: &str, key: &str) -> Option<&'t str> {
        table.get(section)?.get(key)?.as_str()
    }

    fn addr(&self) -> anyhow::Result<AdminListen> {
        let table = self.table()?;
        let default = ephemer_actors_core::config::defaults::ADMIN_LISTEN;
        let listen = match &self.admin {
            Some(a) => a.as_str(),
            None => Self::key(&table, "admin", "listen").unwrap_or(default),
        };
        AdminListen::parse(listen).map_err(|e| anyhow!("admin.listen: {e}"))
    }

    /// The admin token: `EPHEMER_ADMIN_TOKEN`, else `<state.dir>/admin.token` (readable by the
    /// daemon's user and root only); `None` when neither can be read (reads may still work).
    fn token(&self) -> Option<String> {
        use ephemer_actors_core::admin::access::{TOKEN_ENV, TOKEN_FILE};
        if let Some(t) = std::env::var(TOKEN_ENV)
            .ok()
            .filter(|t| !t.trim().is_empty())
        {
            return Some(t.trim().to_string());
        }
        let table = self.table().ok()?;
        let dir = Self::key(&table, "state", "dir")
            .unwrap_or(ephemer_actors_core::config::defaults::STATE_DIR);
        let token = std::fs::read_to_string(std::path::Path::new(dir).join(TOKEN_FILE)).ok()?;
        Some(token.trim().to_string()).filter(|t| !t.is_empty())
    }
}

/// One admin API call, its answer read as the API's own type.
pub(crate) fn call<T: DeserializeOwned>(
    t: &Target,
    method: Method,
    path: &str,
) -> anyhow::Result<T> {
    let listen = t.addr()?;
    let token = t.token();
    let (status, body) = match &listen {
        AdminListen::Tcp(addr) => call_tcp(*addr, &method, path, token.as_deref()),
        AdminListen::Unix(socket) => call_unix(socket, &method, path, token.as_deref()),
    }
    .map_err(|e| {
        anyhow!(
            "no daemon answers on {listen} ({e:#}); is `ephemer-actors serve` running? see admin.listen"
        )
    })?;
    if !(200..300).contains(&status) {
        let why = serde_json::from_slice::<ErrorAnswer>(&body)
            .map(|e| e.error)
            .unwrap_or_else(|_| String::from_utf8_lossy(&body).into_owned());
        bail!("{path} answered {status}: {why}");
    }
    serde_json::from_slice(&body).with_context(|| format!("{path} answered an unexpected body"))
}

/// Through awc: (status, body).
fn call_tcp(
    addr: SocketAddr,
    method: &Method,
    path: &str,
    token: Option<&str>,
) -> anyhow::Result<(u16, Vec<u8>)> {
    let url = format!("http://{addr}{path}");
    actix_rt::System::new().block_on(async move {
        let client = awc::Client::builder()
            .timeout(Duration::from_secs(10))
            .finish();
        let mut request = client.request(method.clone(), &url);
        if let Some(token) = token {
            request = request.insert_header(("Authorization", format!("Bearer {token}")));
        }
        let sent = if method == Method::POST {
            request
                .insert_header(("Content-Type", "application/json"))
                .send_body("{}")
                .await
        } else {
            request.send().await
        };
        let mut answer = sent.map_err(|e| anyhow!("{e}"))?;
        let body = answer
            .body()
            .limit(64 * 1024 * 1024)
            .await
            .with_context(|| format!("reading the answer of {path}"))?;
        Ok((answer.status().as_u16(), body.to_vec()))
    })
}

/// HTTP/1.1 over the admin unix socket (one request, `Connection: close`): (status, body).
fn call_unix(
    socket: &std::path::Path,
    method: &Method,
    path: &str,
    token: Option<&str>,
) -> anyhow::Result<(u16, Vec<u8>)> {
    use std::io::{Read, Write};
    let mut stream = std::os::unix::net::UnixStream::connect(socket)?;
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    let auth = token.map_or(String::new(), |t| format!("Authorization: Bearer {t}\r\n"));
    let body = if method == Method::POST { "{}" } else { "" };
    write!(
        stream,
        "{method} {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n{auth}\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw)?;
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(|| anyhow!("an answer without headers"))?;
    let head = String::from_utf8_lossy(&raw[..split]).into_owned();
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse::<u16>().ok())
        .ok_or_else(|| anyhow!("an answer without a status"))?;
    let mut rest = raw[split + 4..].to_vec();
    if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        rest = dechunk(&rest)?;
    }
    Ok((status, rest))
}

/// A chunked body, joined.
fn dechunk(mut data: &[u8]) -> anyhow::Result<Vec<u8>> {
    let mut out = Vec::new();
    loop {
        let line_end = data
            .windows(2)
            .position(|w| w == b"\r\n")
            .ok_or_else(|| anyhow!("a broken chunked body"))?;
        let size_text = String::from_utf8_lossy(&data[..line_end]);
        let size = usize::from_str_radix(size_text.split(';').next().unwrap_or("").trim(), 16)?;
        data = &data[line_end + 2..];
        if size == 0 || data.len() < size {
            return Ok(out);
        }
        out.extend_from_slice(&data[..size]);
        data = data.get(size + 2..).unwrap_or_default();
    }
}

pub(crate) fn print_json(v: &impl serde::Serialize) -> anyhow::Result<()> {
    crate::term::outln!("{}", serde_json::to_string_pretty(v)?);
    Ok(())
}

pub(crate) fn or_dash<T: std::fmt::Display>(v: Option<T>) -> String {
    v.map_or_else(|| "-".into(), |v| v.to_string())
}

pub(crate) fn when(unix: u64) -> String {
    ephemer_actors_core::clock::rfc3339(unix)
}

/// `status`
pub fn status(t: &Target) -> anyhow::Result<()> {
    let v: StatusAnswer = call(t, Method::GET, "/api/v1/status")?;
    if t.json {
        print_json(&v)?;
    } else {
        print_status(&v);
    }
    // Scripts (and a load balancer's health check) can use the exit code: 1 while a pool is
    // down or the daemon shuts down. Cordoned by an operator is a choice, not a fault: 0.
    let down: Vec<&str> = v
        .scheduler
        .providers
        .iter()
        .filter(|p| !p.up)
        .map(|p| p.provider.as_str())
        .collect();
    if !down.is_empty() {
        bail!("pools down: {}", down.join(", "));
    }
    if v.scheduler.shutting_down {
        bail!("the daemon is shutting down: it claims no new jobs");
    }
    Ok(())
}

/// One line per bucket read so far.
fn print_rates(
    rates: &std::collections::BTreeMap<
        ephemer_actors_core::vocab::RateBucket,
        ephemer_actors_core::vocab::RateSnapshot,
    >,
    indent: &str,
) {
    let read: Vec<_> = rates.iter().filter(|(_, r)| r.updated > 0).collect();
    if read.is_empty() {
        crate::term::outln!("{indent}rate budget   no reading yet");
    }
    for (bucket, rate) in read {
        crate::term::outln!(
            "{indent}rate budget   {}: {}/{} left, resets {} (read {})",
            bucket.as_str(),
            or_dash(rate.remaining),
            or_dash(rate.limit),
            rate.reset.map_or("-".into(), when),
            when(rate.updated)
        );
    }
}

fn print_status(v: &StatusAnswer) {
    let st = &v.scheduler;
    crate::term::outln!(
        "ephemer-actors {}  up {}  cordoned: {}",
        v.version,
        humantime::format_duration(Duration::from_secs(v.uptime_seconds)),
        if st.draining { "yes" } else { "no" }
    );
    crate::term::outln!(
        "capacity      {}/{} runners, {} pending, retry queue {}",
        st.capacity.used,
        st.capacity.max_concurrent,
        st.pending,
        st.retry_queue_depth
    );
    if st.targets.len() > 1 {
        for t in &st.targets {
            crate::term::outln!(
                "target        {} (owner {}, weight {}): {} slots held, {} pending",
                t.name,
                t.owner,
                t.weight,
                t.held,
                t.pending
            );
            print_rates(&t.rate, "  ");
        }
    } else {
        print_rates(&v.rates, "");
    }
    crate::term::outln!(
        "\n{:<20} {:<24} {:<4} {:<9} LABELS",
        "POOL",
        "PROVISIONER",
        "UP",
        "USED/MAX"
    );
    for p in &st.providers {
        crate::term::outln!(
            "{:<20} {:<24} {:<4} {:<9} {}",
            p.provider,
            p.provisioner,
            if p.up { "yes" } else { "no" },
            format!("{}/{}", p.used, p.max),
            p.labels.join(",")
        );
        if let Some(cause) = &p.down_cause {
            crate::term::outln!("  down: {cause}");
        }
        if let Some(refusal) = &p.refusal {
            crate::term::outln!("  refused: {refusal}");
        }
        if let Some(accel) = &p.accel {
            crate::term::outln!("  accel: {accel}");
        }
        if let Some(w) = &p.warm {
            crate::term::outln!(
                "  warm: {} ready, {} booting (keeps {} now)",
                w.available,
                w.booting,
                w.target
            );
        }
        if let Some(last) = &p.last_environment_failure {
            crate::term::outln!(
                "  environments failed: {} (latest: {last})",
                p.environment_failures
            );
        }
    }
    if let Some(runner) = &v.runner {
        print_runner(runner);
    }
    if !v.scalesets.is_empty() {
        crate::term::outln!(
            "\n{:<16} {:<10} {:<15} {:<9} {:<9} {:<8} WHY",
            "SCALE SET",
            "ID",
            "SESSION",
            "LAST MSG",
            "ASSIGNED",
            "RUNNING"
        );
        for l in &v.scalesets {
            let stats = l.statistics.unwrap_or_default();
            crate::term::outln!(
                "{:<16} {:<10} {:<15} {:<9} {:<9} {:<8} {}",
                l.pool,
                l.scale_set_id.map_or("-".to_string(), |id| id.to_string()),
                l.state,
                l.last_message_id,
                stats.total_assigned_jobs,
                stats.total_running_jobs,
                l.why
            );
            if !l.dropped_labels.is_empty() {
                crate::term::outln!(
                    "  labels dropped by the service: {} (jobs asking for them do not reach this pool)",
                    l.dropped_labels.join(", ")
                );
            }
        }
    }
    if let Some(fleet) = &v.fleet {
        crate::term::outln!(
            "\n{:<20} {:<6} {:<10} {:<9} {:<8} POOLS   (this host: {}; {} queued in the fleet)",
            "HOST",
            "LEASE",
            "EXPIRES",
            "USED/MAX",
            "HOLDING",
            fleet.me,
            fleet.queued
        );
        for h in &fleet.hosts {
            let pools: Vec<String> = h
                .pools
                .as_array()
                .map(|a| {
                    a.iter()
                        .filter_map(|p| p["name"].as_str().map(str::to_string))
                        .collect()
                })
                .unwrap_or_default();
            crate::term::outln!(
                "{:<20} {:<6} {:<10} {:<9} {:<8} {}",
                h.host,
                if h.alive { "live" } else { "EXPIRED" },
                format!("{}s", h.lease_secs),
                format!("{}/{}", h.used, h.capacity),
                h.holding,
                pools.join(",")
            );
        }
    }
}

/// The runner's latest release and each pool's version.
fn print_runner(r: &ephemer_actors_core::release::actor::RunnerReleaseView) {
    let latest = match (&r.latest, r.latest_published_unix) {
        (Some(v), Some(at)) if at > 0 => format!(
            "{v} (published {})",
            humantime::format_rfc3339_seconds(std::time::UNIX_EPOCH + Duration::from_secs(at))
        ),
        (Some(v), _) => v.to_string(),
        (None, _) => "unknown".into(),
    };
    crate::term::outln!(
        "\nrunner        latest release {latest}; auto_update {}",
        if r.auto_update { "on" } else { "off" }
    );
    if let Some(problem) = &r.problem {
        crate::term::outln!("  problem: {problem}");
    }
    for p in &r.pools {
        let version = p
            .version
            .as_ref()
            .map_or("none yet".into(), |v| v.to_string());
        let lag = match p.behind_seconds {
            Some(0) => "current".to_string(),
            Some(s) if s > ephemer_actors_core::release::BEHIND_CUTOFF_WARN => format!(
                "behind by {}: GitHub refuses it 30 days after the release, update it now",
                humantime::format_duration(Duration::from_secs(s - s % 3600))
            ),
            Some(s) => format!(
                "behind by {}",
                humantime::format_duration(Duration::from_secs(s))
            ),
            None => "latest unknown".to_string(),
        };
        let who = if p.managed {
            "kept current by the daemon"
        } else {
            "operator's install"
        };
        crate::term::outln!("  {:<18} {version} ({lag}; {who})", p.pool);
    }
}

/// A job's state as `jobs` prints it: a parked job with why (`parked (zombie)`).
pub(crate) fn state_text(p: &Phase) -> String {
    match p {
        Phase::Parked { reason, .. } => format!("parked ({})", reason.as_str()),
        other => other.name().to_string(),
    }
}

/// When a job is tried next: its retry, or a parked job's next look.
fn next_try(j: &ephemer_actors_core::scheduler::core::JobView) -> Option<u64> {
    match j.phase {
        Phase::Parked { look_unix, .. } => Some(look_unix),
        _ => j.next_attempt_unix,
    }
}

pub(crate) fn phase_provider(p: &Phase) -> String {
    match p {
        Phase::Claiming { provider } | Phase::Active { provider, .. } => provider.to_string(),
        _ => "-".into(),
    }
}

/// `jobs` and `jobs <id>`
/// `jobs --state` and `--repo`.
#[derive(Debug, Default)]
pub struct JobFilter {
    /// Only jobs in this state (`phase.name()`).
    pub state: Option<String>,
    /// Only jobs of this repo.
    pub repo: Option<String>,
}

/// A job id, or a job's URL as GitHub shows it (`.../actions/runs/RUN/job/ID`, or
/// `.../actions/runs/RUN/jobs/ID` as the API names it).
pub fn job_id(text: &str) -> Result<u64, String> {
    if let Ok(id) = text.parse() {
        return Ok(id);
    }
    let path = text.split(['?', '#']).next().unwrap_or("");
    let segs: Vec<&str> = path.trim_end_matches('/').split('/').collect();
    segs.windows(2)
        .rev()
        .find(|w| w[0] == "job" || w[0] == "jobs")
        .and_then(|w| w[1].parse().ok())
        .ok_or_else(|| {
            format!("{text:?} is neither a job id nor a job's URL (.../actions/runs/RUN/job/ID)")
        })
}

pub fn jobs(t: &Target, id: Option<u64>, filter: &JobFilter) -> anyhow::Result<()> {
    let Some(id) = id else {
        let mut v: JobsAnswer = call(t, Method::GET, "/api/v1/jobs")?;
        v.jobs.retain(|j| {
            filter
                .state
                .as_deref()
                .is_none_or(|s| j.phase.name().eq_ignore_ascii_case(s))
                && filter.repo.as_deref().is_none_or(|r| j.repo == r)
        });
        if t.json {
            return print_json(&v);
        }
        crate::term::outln!(
            "{:<12} {:<16} {:<15} {:<9} {:<8} {:<18} NEXT ATTEMPT",
            "JOB",
            "REPO",
            "STATE",
            "POOL",
            "RETRIES",
            "CLASS"
        );
        for j in &v.jobs {
            crate::term::outln!(
                "{:<12} {:<16} {:<15} {:<9} {:<8} {:<18} {}",
                j.key.job_id,
                crate::term::one_line(&j.repo),
                state_text(&j.phase),
                phase_provider(&j.phase),
                j.retry_attempts,
                or_dash(j.error_class),
                next_try(j).map_or("-".into(), when)
            );
        }
        return Ok(());
    };
    let v: JobAnswer = call(t, Method::GET, &format!("/api/v1/jobs/{id}"))?;
    if t.json {
        return print_json(&v);
    }
    print!(
        "{}",
        crate::term::printable(&crate::job_text::job_text(id, &v))
    );
    Ok(())
}

/// `cordon` / `uncordon`
pub fn cordon(t: &Target, on: bool) -> anyhow::Result<()> {
    let path = if on {
        "/api/v1/cordon"
    } else {
        "/api/v1/uncordon"
    };
    let v: CordonAnswer = call(t, Method::POST, path)?;
    if t.json {
        return print_json(&v);
    }
    if v.cordoned {
        crate::term::outln!("cordoned: no new claims and no new retries; running jobs continue");
    } else {
        crate::term::outln!("uncordoned: claiming again");
    }
    Ok(())
}

/// `drain`: cordon; with `wait`, poll until no runner is left (exit 0), or `timeout` passes
/// (exit 1). Running jobs finish; none is torn down.
pub fn drain(t: &Target, wait: bool, timeout: Option<Duration>) -> anyhow::Result<()> {
    let _: CordonAnswer = call(t, Method::POST, "/api/v1/cordon")?;
    if !wait {
        crate::term::outln!(
            "cordoned: no new claims; running jobs continue (drain --wait waits for them)"
        );
        return Ok(());
    }
    let started = std::time::Instant::now();
    let mut said = None;
    loop {
        let v: StatusAnswer = call(t, Method::GET, "/api/v1/status")?;
        let left = v.scheduler.runners;
        if left == 0 {
            crate::term::outln!("drained: no runner left; the daemon can be stopped or upgraded");
            return Ok(());
        }
        if said != Some(left) {
            crate::term::outln!("waiting for {left} runners to finish");
            said = Some(left);
        }
        if let Some(limit) = timeout
            && started.elapsed() >= limit
        {
            bail!(
                "{left} runners still running after {}",
                humantime::format_duration(limit)
            );
        }
        // A control command is its own process, not an arbiter: blocking here is fine.
        #[allow(clippy::disallowed_methods)]
        std::thread::sleep(Duration::from_millis(500));
    }
}
