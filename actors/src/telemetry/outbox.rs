//! The traces not yet accepted by the collector, kept until it answers 2xx: one file per job
//! under `<state.dir>/traces/` (the OTLP request body of that job's spans, written to a
//! temporary name, synced, then renamed), so a `kill -9` or a collector outage loses none;
//! sent again at the next start. Bounded: past [`OUTBOX_TRACES`] the oldest go first, counted.
//! Without a state directory (an embedding without a store) the outbox lives in memory.

use std::{
    collections::VecDeque,
    fs,
    io::{self, Write as _},
    path::{Path, PathBuf},
};

/// Traces kept for the collector at most; the oldest go first.
pub const OUTBOX_TRACES: usize = 10_000;

/// A file's body larger than this is not read back (a trace is a few KiB; anything this
/// large was not written by the daemon).
const MAX_FILE: u64 = 4 << 20;

/// One trace waiting: its name (ordered by when it was written), its span count, its body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Waiting {
    /// `<unix ms, 13 digits>-<sequence, 6 digits>-<spans>.otlp`.
    pub name: String,
    /// Spans in it.
    pub spans: u64,
    /// The encoded `ExportTraceServiceRequest`.
    pub body: Vec<u8>,
}

/// The waiting traces, oldest first.
#[derive(Debug)]
pub struct Outbox {
    dir: Option<PathBuf>,
    cap: usize,
    waiting: VecDeque<Waiting>,
    seq: u64,
}

impl Outbox {
    /// The outbox under `dir` (created 0700 if missing), with what a previous run left in it;
    /// `None`: in memory only. A directory that cannot be used falls back to memory, said.
    pub fn open(dir: Option<&Path>, cap: usize) -> Self {
        let mut out = Outbox {
            dir: None,
            cap: cap.max(1),
            waiting: VecDeque::new(),
            seq: 0,
        };
        let Some(dir) = dir else { return out };
        if let Err(e) = crate::harden::private_dir(dir) {
            tracing::warn!(dir = %dir.display(), error = %e, "the trace outbox cannot be kept on disk: traces wait in memory, and a crash loses them");
            return out;
        }
        out.waiting = read_left(dir);
        out.dir = Some(dir.to_path_buf());
        out
    }

    /// Traces waiting.
    pub fn len(&self) -> usize {
        self.waiting.len()
    }

    /// Whether none waits.
    pub fn is_empty(&self) -> bool {
        self.waiting.is_empty()
    }

    /// Keeps `body` (of `spans` spans) until it is sent; returns the spans of the oldest
    /// traces dropped to stay within the bound.
    pub fn put(&mut self, body: Vec<u8>, spans: u64, now_ms: u64) -> u64 {
        self.seq += 1;
        let name = format!("{now_ms:013}-{:06}-{spans}.otlp", self.seq % 1_000_000);
        if let Some(dir) = &self.dir
            && let Err(e) = write_synced(dir, &name, &body)
        {
            tracing::warn!(error = %e, "a job's trace could not be written to the outbox: it waits in memory only");
        }
        self.waiting.push_back(Waiting { name, spans, body });
        let mut dropped = 0;
        while self.waiting.len() > self.cap {
            if let Some(old) = self.waiting.pop_front() {
                dropped += old.spans;
                self.forget(&old.name);
            }
        }
        dropped
    }

    /// The oldest waiting traces, up to `max_bytes` of body (at least one).
    pub fn oldest(&self, max_bytes: usize) -> Vec<&Waiting> {
        let mut size = 0;
        let mut out = Vec::new();
        for w in &self.waiting {
            if !out.is_empty() && size + w.body.len() > max_bytes {
                break;
            }
            size += w.body.len();
            out.push(w);
        }
        out
    }

    /// The collector accepted the `n` oldest: gone from memory and disk.
    pub fn sent(&mut self, n: usize) {
        for _ in 0..n {
            if let Some(w) = self.waiting.pop_front() {
                self.forget(&w.name);
            }
        }
    }

    fn forget(&self, name: &str) {
        if let Some(dir) = &self.dir {
            let _ = fs::remove_file(dir.join(name));
        }
    }
}

/// Writes `body` as `dir/name`: a temporary name, synced, renamed, the directory synced.
fn write_synced(dir: &Path, name: &str, body: &[u8]) -> io::Result<()> {
    let tmp = dir.join(format!(".{name}.tmp"));
    let mut f = crate::harden::private_file(&tmp, false)?;
    f.write_all(body)?;
    f.sync_all()?;
    fs::rename(&tmp, dir.join(name))?;
    fs::File::open(dir)?.sync_all()
}

/// The span count a file's name carries.
fn spans_of(name: &str) -> Option<u64> {
    let stem = name.strip_suffix(".otlp")?;
    let mut parts = stem.split('-');
    let (at, seq, spans) = (parts.next()?, parts.next()?, parts.next()?);
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    (parts.next().is_none() && digits(at) && digits(seq))
        .then(|| spans.parse().ok())
        .flatten()
}

/// What a previous run left, oldest first; temporary files (a write cut by a crash) and
/// files that are not ours are removed.
fn read_left(dir: &Path) -> VecDeque<Waiting> {
    let Ok(entries) = fs::read_dir(dir) else {
        return VecDeque::new();
    };
    let mut found: Vec<Waiting> = Vec::new();
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let path = entry.path();
        let regular = entry.file_type().is_ok_and(|t| t.is_file());
        let Some(spans) = spans_of(&name).filter(|_| regular) else {
            let _ = fs::remove_file(&path);
            continue;
        };
        match crate::bounded::read_file(&path, MAX_FILE) {
            Ok(body) => found.push(Waiting { name, spans, body }),
            Err(_) => {
                let _ = fs::remove_file(&path);
            }
        }
    }
    found.sort_by(|a, b| a.name.cmp(&b.name));
    found.into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn traces_survive_a_reopen_in_order_and_the_oldest_go_past_the_bound() {
        let dir = tempfile::tempdir().unwrap();
        let at = dir.path().join("traces");
        let mut o = Outbox::open(Some(&at), 3);
        assert_eq!(o.put(b"a".to_vec(), 1, 1_000), 0);
        assert_eq!(o.put(b"b".to_vec(), 2, 1_001), 0);
        std::fs::write(at.join(".x.otlp.tmp"), b"cut").unwrap();
        std::fs::write(at.join("stray"), b"?").unwrap();
        drop(o);
        let mut o = Outbox::open(Some(&at), 3);
        let bodies: Vec<&[u8]> = o.oldest(usize::MAX).iter().map(|w| &w.body[..]).collect();
        assert_eq!(bodies, [b"a", b"b"]);
        assert!(!at.join("stray").exists() && !at.join(".x.otlp.tmp").exists());
        assert_eq!(o.put(b"c".to_vec(), 3, 1_002), 0);
        assert_eq!(o.put(b"d".to_vec(), 4, 1_003), 1, "a's one span dropped");
        assert_eq!(o.oldest(1).len(), 1, "at least one, within the bytes");
        assert_eq!(o.oldest(2).len(), 2);
        o.sent(2);
        drop(o);
        let o = Outbox::open(Some(&at), 3);
        let left: Vec<u64> = o.oldest(usize::MAX).iter().map(|w| w.spans).collect();
        assert_eq!(left, [4], "sent ones are gone from disk");
    }

    #[test]
    fn without_a_directory_it_lives_in_memory() {
        let mut o = Outbox::open(None, 2);
        o.put(vec![1], 1, 1);
        assert_eq!(o.len(), 1);
        o.sent(1);
        assert!(o.is_empty());
    }

    #[test]
    fn only_the_daemon_s_names_are_read() {
        assert_eq!(spans_of("0000000001000-000001-7.otlp"), Some(7));
        for bad in ["x.otlp", "1-2.otlp", "1-2-x.otlp", "a-2-3.otlp", "1-2-3.txt", "1-2-3-4.otlp"] {
            assert_eq!(spans_of(bad), None, "{bad}");
        }
    }
}
