//! `status`, `jobs`, `cordon`, `uncordon`: ask a running daemon through its admin API and print
//! a table for people, or the JSON with `--json`. The admin address comes from the config
//! (`admin.listen`, read without demanding the secrets) or `--admin`.

use std::{
    io::{Read, Write},
    net::{SocketAddr, TcpStream},
    path::PathBuf,
    time::Duration,
};

use anyhow::{Context, bail};
use serde_json::Value;

/// Where to find the daemon.
#[derive(Debug, Clone, clap::Args)]
pub struct Target {
    /// Config file whose `admin.listen` names the daemon (secrets are not needed).
    #[arg(long, short = 'c', env = "EPHEMER_CONFIG", value_name = "PATH")]
    config: Option<PathBuf>,
    /// The admin address itself, e.g. 127.0.0.1:9091 (wins over --config).
    #[arg(long, value_name = "ADDR")]
    admin: Option<SocketAddr>,
    /// Print the JSON the daemon answered.
    #[arg(long)]
    json: bool,
}

impl Target {
    fn addr(&self) -> anyhow::Result<SocketAddr> {
        if let Some(a) = self.admin {
            return Ok(a);
        }
        let default = ephemer_actors_core::config::defaults::ADMIN_LISTEN;
        let listen = match &self.config {
            None => default.to_string(),
            Some(path) => {
                let text = std::fs::read_to_string(path)
                    .with_context(|| format!("cannot read {}", path.display()))?;
                let table: toml::Table = toml::from_str(&text)
                    .with_context(|| format!("{} is not valid TOML", path.display()))?;
                table
                    .get("admin")
                    .and_then(|a| a.get("listen"))
                    .and_then(|l| l.as_str())
                    .unwrap_or(default)
                    .to_string()
            }
        };
        listen
            .parse()
            .with_context(|| format!("admin.listen {listen:?} is not IP:PORT"))
    }
}

fn request(addr: SocketAddr, method: &str, path: &str) -> anyhow::Result<(u16, Value)> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(5)).with_context(|| {
        format!("no daemon answers on {addr} (is `ephemer-actors serve` running? see admin.listen)")
    })?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    )?;
    let mut text = String::new();
    s.read_to_string(&mut text)?;
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let body = if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        dechunk(body)
    } else {
        body.to_string()
    };
    let json = serde_json::from_str(&body).unwrap_or(Value::String(body));
    Ok((status, json))
}

fn dechunk(body: &str) -> String {
    let mut out = String::new();
    let mut rest = body;
    while let Some((size, after)) = rest.split_once("\r\n") {
        let Ok(n) = usize::from_str_radix(size.trim(), 16) else {
            break;
        };
        if n == 0 || after.len() < n {
            break;
        }
        out.push_str(&after[..n]);
        rest = after[n..].trim_start_matches("\r\n");
    }
    out
}

fn get(t: &Target, method: &str, path: &str) -> anyhow::Result<Value> {
    let (status, json) = request(t.addr()?, method, path)?;
    if !(200..300).contains(&status) {
        bail!(
            "{} answered {status}: {}",
            path,
            json.get("error")
                .and_then(Value::as_str)
                .unwrap_or(&json.to_string())
        );
    }
    Ok(json)
}

fn when(unix: u64) -> String {
    humantime::format_rfc3339_seconds(std::time::UNIX_EPOCH + Duration::from_secs(unix)).to_string()
}

fn s(v: &Value) -> String {
    match v {
        Value::Null => "-".into(),
        Value::String(x) => x.clone(),
        other => other.to_string(),
    }
}

/// `status`
pub fn status(t: &Target) -> anyhow::Result<()> {
    let v = get(t, "GET", "/api/v1/status")?;
    if t.json {
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    let up = v["uptime_seconds"].as_u64().unwrap_or(0);
    println!(
        "ephemer-actors {}  up {}  cordoned: {}",
        s(&v["version"]),
        humantime::format_duration(Duration::from_secs(up)),
        if v["draining"].as_bool().unwrap_or(false) {
            "yes"
        } else {
            "no"
        }
    );
    println!(
        "capacity      {}/{} runners, {} pending, retry queue {}",
        s(&v["capacity"]["used"]),
        s(&v["capacity"]["max_concurrent"]),
        s(&v["pending"]),
        s(&v["retry_queue_depth"])
    );
    let rate = &v["rate"];
    if rate["updated"].as_u64().unwrap_or(0) > 0 {
        println!(
            "rate budget   {}/{} left, resets {} (read {})",
            s(&rate["remaining"]),
            s(&rate["limit"]),
            rate["reset"].as_u64().map_or("-".into(), when),
            when(rate["updated"].as_u64().unwrap_or(0))
        );
    } else {
        println!("rate budget   no reading yet");
    }
    println!(
        "\n{:<14} {:<24} {:<4} {:<9} LABELS",
        "PROVIDER", "PROVISIONER", "UP", "USED/MAX"
    );
    for p in v["providers"].as_array().into_iter().flatten() {
        let labels: Vec<String> = p["labels"]
            .as_array()
            .into_iter()
            .flatten()
            .map(s)
            .collect();
        println!(
            "{:<14} {:<24} {:<4} {:<9} {}",
            s(&p["provider"]),
            s(&p["provisioner"]),
            if p["up"].as_bool().unwrap_or(false) {
                "yes"
            } else {
                "no"
            },
            format!("{}/{}", s(&p["used"]), s(&p["max"])),
            labels.join(",")
        );
        if let Some(cause) = p["down_cause"].as_str() {
            println!("  down: {cause}");
        }
    }
    Ok(())
}

/// `jobs` and `jobs <id>`
pub fn jobs(t: &Target, id: Option<u64>) -> anyhow::Result<()> {
    let Some(id) = id else {
        let v = get(t, "GET", "/api/v1/jobs")?;
        if t.json {
            println!("{}", serde_json::to_string_pretty(&v)?);
            return Ok(());
        }
        println!(
            "{:<12} {:<16} {:<11} {:<9} {:<8} {:<18} NEXT ATTEMPT",
            "JOB", "REPO", "STATE", "PROVIDER", "RETRIES", "CLASS"
        );
        for j in v["jobs"].as_array().into_iter().flatten() {
            println!(
                "{:<12} {:<16} {:<11} {:<9} {:<8} {:<18} {}",
                s(&j["key"]["job_id"]),
                s(&j["repo"]),
                s(&j["phase"]["state"]),
                s(&j["phase"]["provider"]),
                s(&j["retry_attempts"]),
                s(&j["error_class"]),
                j["next_attempt_unix"].as_u64().map_or("-".into(), when)
            );
        }
        return Ok(());
    };
    let v = get(t, "GET", &format!("/api/v1/jobs/{id}"))?;
    if t.json {
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    let j = &v["job"];
    println!(
        "job {} in {}/{}  labels {}",
        id,
        s(&j["key"]["owner"]),
        s(&j["repo"]),
        s(&j["labels"])
    );
    println!(
        "state {}  provider {}  runner {}  retries {}  first failure class {}",
        s(&j["phase"]["state"]),
        s(&j["phase"]["provider"]),
        s(&j["runner_name"]),
        s(&j["retry_attempts"]),
        s(&j["error_class"])
    );
    if let Some(next) = j["next_attempt_unix"].as_u64() {
        println!("next attempt {}", when(next));
    }
    println!("\ntimeline:");
    for n in j["timeline"].as_array().into_iter().flatten() {
        println!(
            "  {}  {}",
            when(n["at"].as_u64().unwrap_or(0)),
            s(&n["text"])
        );
    }
    Ok(())
}

/// `cordon` / `uncordon`
pub fn cordon(t: &Target, on: bool) -> anyhow::Result<()> {
    let path = if on {
        "/api/v1/cordon"
    } else {
        "/api/v1/uncordon"
    };
    let v = get(t, "POST", path)?;
    if t.json {
        println!("{v}");
    } else if on {
        println!("cordoned: no new claims and no new retries; running jobs continue");
    } else {
        println!("uncordoned: claiming again");
    }
    Ok(())
}
