//! What a job's network lets out ([`Egress`], from its pool's `egress` table) and what its
//! forwarder does with each lookup ([`Watch`]): the decisions are
//! [`ephemer_decide::egress::allow`]'s; here they are carried out (a refusal answered, an
//! allowed answer's addresses pinned in the job's set before the job reads it, a refusal
//! counted, noted and, in `audit` and `allow-list` modes, each lookup logged for the report).

use std::{
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
};

use ephemer_decide::egress::{
    Slot,
    allow::{
        AllowList, JOB_PINS_MAX, Lookup, Mode, Pins, PinsFull, on_lookup,
    },
    audit, dns, fence,
    seen::{Kind, Seen},
};

use crate::{bounded::CappedLog, config::PoolName};

/// How large a pool's audit log grows before it is rotated (one older file is kept).
pub const AUDIT_LOG_MAX: u64 = 16 << 20;

/// A job's egress settings, and where what it meets is told.
#[derive(Debug, Clone)]
pub struct Egress {
    /// The pool.
    pub pool: PoolName,
    /// `egress.mode`.
    pub mode: Mode,
    /// `egress.allow`, with the runner's own hosts.
    pub allow: Arc<AllowList>,
    /// `egress.allow_private`, as `nft` writes them.
    pub allow_private: Vec<String>,
    /// `ephemerd_egress_refused_total`, when metrics are kept.
    pub refused: Option<prometheus::IntCounterVec>,
    /// The pool's audit log, in `audit` and `allow-list` modes.
    pub audit: Option<Arc<Mutex<CappedLog>>>,
}

impl Egress {
    /// An `open` pool's: the fence alone.
    pub fn open(pool: &PoolName) -> Self {
        Egress {
            pool: pool.clone(),
            mode: Mode::Open,
            allow: Arc::new(AllowList::default()),
            allow_private: Vec::new(),
            refused: None,
            audit: None,
        }
    }

    /// Pool `pool`'s, as configured, logging lookups under `audit_dir` (`<state>/egress`)
    /// when its mode reads them.
    pub fn of(
        pool: &PoolName,
        config: &crate::config::EgressConfig,
        audit_dir: Option<&Path>,
        refused: Option<prometheus::IntCounterVec>,
    ) -> Self {
        let audit = match (config.mode, audit_dir) {
            (Mode::Open, _) | (_, None) => None,
            (_, Some(dir)) => open_audit_log(dir, pool),
        };
        Egress {
            pool: pool.clone(),
            mode: config.mode,
            allow: Arc::new(config.allow.clone()),
            allow_private: config.private_ranges(),
            refused,
            audit,
        }
    }

    fn count(&self, kind: Kind, n: u64) {
        if let Some(m) = &self.refused {
            m.with_label_values(&[self.pool.as_str(), kind.as_str()])
                .inc_by(n);
        }
    }
}

/// The audit log of `pool` under `dir`.
pub fn audit_log_path(dir: &Path, pool: &str) -> PathBuf {
    dir.join(format!("{pool}.log"))
}

fn open_audit_log(dir: &Path, pool: &PoolName) -> Option<Arc<Mutex<CappedLog>>> {
    let opened = crate::harden::private_dir(dir)
        .and_then(|()| CappedLog::open(&audit_log_path(dir, pool.as_str()), AUDIT_LOG_MAX));
    match opened {
        Ok(log) => Some(Arc::new(Mutex::new(log))),
        Err(e) => {
            tracing::warn!(pool = pool.as_str(), error = %e, "cannot open the pool's egress audit log: its lookups are not reported");
            None
        }
    }
}

/// One job's egress while it runs: its forwarder asks it about each lookup.
#[derive(Debug)]
pub struct Watch {
    slot: Slot,
    egress: Egress,
    seen: Mutex<Seen>,
    pins: Mutex<Pins>,
    /// The job's pins reached their cap (said once).
    said_full: std::sync::atomic::AtomicBool,
    /// Lines the job wrote to its pool's audit log.
    audit_lines: std::sync::atomic::AtomicU32,
}

/// What the forwarder does with a query.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Ask upstream and answer; `pin`: the answer's addresses are pinned first.
    Ask {
        /// Pin the answer's addresses before it is passed on.
        pin: bool,
    },
    /// Answer `REFUSED`.
    Refuse,
}

impl Watch {
    /// The watch over slot `slot`'s job.
    pub fn new(slot: Slot, egress: Egress) -> Self {
        Watch {
            slot,
            egress,
            seen: Mutex::default(),
            pins: Mutex::default(),
            said_full: Default::default(),
            audit_lines: Default::default(),
        }
    }

    /// The job's settings.
    pub fn egress(&self) -> &Egress {
        &self.egress
    }

    /// What to do with `query`: decided, and a refusal (or an audited lookup) recorded.
    pub fn lookup(&self, query: &[u8]) -> Verdict {
        let mode = self.egress.mode;
        if mode == Mode::Open {
            return Verdict::Ask { pin: false };
        }
        let Some(name) = dns::question_name(query) else {
            // Not a question a list can judge: an allow-list refuses it; audit passes it
            // unpinned, so what the job reaches with it is recorded.
            return match mode {
                Mode::AllowList => Verdict::Refuse,
                _ => Verdict::Ask { pin: false },
            };
        };
        let decided = on_lookup(mode, &self.egress.allow, &name);
        let refused = decided != Lookup::Answer;
        if let Some(log) = &self.egress.audit {
            self.log_lookup(log, &name, refused);
        }
        match decided {
            Lookup::Answer => Verdict::Ask { pin: true },
            // Passed, not pinned: the connections it leads to are recorded as ones the list
            // would refuse, and a refused name's answers take no pins.
            Lookup::AnswerAudited => {
                self.note(Kind::Dns, &name, true);
                Verdict::Ask { pin: false }
            }
            Lookup::Refuse => {
                self.note(Kind::Dns, &name, false);
                self.egress.count(Kind::Dns, 1);
                Verdict::Refuse
            }
        }
    }

    /// Pins `answer`'s IPv4 addresses in the job's set, each for its TTL (within bounds, and
    /// within [`ephemer_decide::egress::allow::JOB_PINS_MAX`] for the job), in one `nft` batch
    /// before the answer is passed on; `false` when they could not be (the answer is then not
    /// passed on: the job would be refused what it was told it may reach). Only what `nft`
    /// wrote is kept.
    pub async fn pin(&self, answer: &[u8]) -> bool {
        let found = dns::addresses(answer);
        if found.is_empty() {
            return true;
        }
        let now = unix_now();
        let planned = {
            let Ok(mut pins) = self.pins.lock() else {
                return false;
            };
            match pins.plan(&found, now) {
                Ok(planned) => planned,
                Err(PinsFull::Job) => {
                    if !self.said_full.swap(true, std::sync::atomic::Ordering::Relaxed) {
                        tracing::warn!(pool = self.egress.pool.as_str(), max = JOB_PINS_MAX, "a job's lookups pinned as many addresses as a job may hold; answers with new addresses are withheld until older pins run out");
                    }
                    self.egress.count(Kind::Dns, 1);
                    return false;
                }
            }
        };
        let ok = match fence::pin_command(self.slot, &planned.timeouts()) {
            None => true,
            Some(cmd) => match super::run("nft", &["-f", "-"], Some(&cmd)).await {
                Ok(_) => true,
                Err(e) => {
                    tracing::warn!(pool = self.egress.pool.as_str(), error = %e, "cannot pin an answer's addresses for a job: the answer is withheld");
                    false
                }
            },
        };
        if ok && let Ok(mut pins) = self.pins.lock() {
            pins.commit(&planned);
        }
        ok
    }

    /// One line in the pool's audit log, while the job has written fewer than
    /// [`audit::JOB_LINES_MAX`]; said once when it has.
    fn log_lookup(&self, log: &Mutex<CappedLog>, name: &str, refused: bool) {
        let written = self
            .audit_lines
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        if written == audit::JOB_LINES_MAX {
            tracing::warn!(pool = self.egress.pool.as_str(), max = audit::JOB_LINES_MAX, "a job looked up more names than a job may write to its pool's audit log; its later lookups are decided and counted, not logged");
        }
        if written >= audit::JOB_LINES_MAX {
            return;
        }
        if let Ok(mut log) = log.lock() {
            let _ = log.line(&audit::line(unix_now(), name, refused));
        }
    }

    fn note(&self, kind: Kind, what: &str, audited: bool) {
        if let Ok(mut seen) = self.seen.lock() {
            seen.add(kind, what, audited);
        }
    }

    /// The addresses the job was refused (or, audited, would have been), read from its set
    /// once it is done: noted, and counted once each.
    pub async fn read_refused(&self) {
        if self.egress.mode == Mode::Open {
            return;
        }
        let args = fence::list_refused_args(self.slot);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let Ok(json) = super::run("nft", &args, None).await else {
            return;
        };
        let addrs = fence::refused_in(&json);
        let audited = self.egress.mode == Mode::Audit;
        for a in &addrs {
            self.note(Kind::Connect, &a.to_string(), audited);
        }
        if !audited {
            self.egress.count(Kind::Connect, addrs.len() as u64);
        }
    }

    /// What the job's egress met so far.
    pub fn seen(&self) -> Seen {
        self.seen.lock().map(|s| s.clone()).unwrap_or_default()
    }
}

fn unix_now() -> u64 {
    crate::clock::unix_now()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn watch(mode: Mode) -> Watch {
        let allow = AllowList::new(&["github.com".to_string()], None).unwrap();
        let egress = Egress {
            mode,
            allow: Arc::new(allow),
            ..Egress::open(&PoolName::new("linux"))
        };
        Watch::new(Slot(7), egress)
    }

    #[test]
    fn audit_pins_only_what_the_list_allows_so_the_rest_is_recorded() {
        let audit = watch(Mode::Audit);
        let query = |name: &str| dns::query(1, name);
        assert_eq!(
            audit.lookup(&query("github.com")),
            Verdict::Ask { pin: true }
        );
        assert_eq!(
            audit.lookup(&query("pastebin.com")),
            Verdict::Ask { pin: false },
            "a name the list would refuse takes no pins: its connections are recorded"
        );
        assert_eq!(audit.lookup(b"\x00\x01"), Verdict::Ask { pin: false });
        let forged = dns::query(1, "x.com");
        let mut forged = forged[..12].to_vec();
        forged.extend(b"\x0fa\n0 0 evil.com\x03com\x00\x00\x01\x00\x01");
        assert_eq!(
            audit.lookup(&forged),
            Verdict::Ask { pin: false },
            "a name with a newline is one escaped name"
        );
        let listed = watch(Mode::AllowList);
        assert_eq!(listed.lookup(&query("pastebin.com")), Verdict::Refuse);
        assert_eq!(
            listed.lookup(&query("github.com")),
            Verdict::Ask { pin: true }
        );
    }

    #[test]
    fn a_job_writes_at_most_its_share_of_the_pool_s_audit_log() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("linux.log");
        let log = CappedLog::open(&path, AUDIT_LOG_MAX).unwrap();
        let mut w = watch(Mode::Audit);
        w.egress.audit = Some(Arc::new(Mutex::new(log)));
        let over = audit::JOB_LINES_MAX + 50;
        for i in 0..over {
            w.lookup(&dns::query(1, &format!("n{i}.example")));
        }
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(text.lines().count() as u32, audit::JOB_LINES_MAX);
        assert!(text.lines().all(|l| audit::parse(l).is_some()));
        assert_eq!(w.seen().rows().len(), ephemer_decide::egress::seen::SEEN_MAX);
    }
}
