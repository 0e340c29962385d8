//! The writer thread: group commit, and riding out a disk that fails.

use std::time::{Duration, Instant};

use super::*;
use crate::retry::Doubling;

/// The wait before writing again after a failure: 250 ms, doubling to 10 s while the disk
/// fails.
const WRITE_BACKOFF: Doubling = Doubling::new(Duration::from_millis(250), Duration::from_secs(10));
/// Changes held in memory at most while the disk fails; past this, writes are refused (the
/// intake then answers 503) rather than the daemon growing without bound.
pub(super) const BACKLOG_CAP: usize = 200_000;

/// The writer's state: the database (none after a failure, until reopened) and what it holds
/// that the disk has not taken yet.
pub(super) struct Writer {
    db: Option<Database>,
    path: PathBuf,
    health: StoreHealth,
    faults: StoreFaults,
    /// Changes not written yet, in the order they came.
    backlog: Vec<Op>,
    /// While the disk fails: when to try again, and the wait after that.
    retry: Option<(Instant, Duration)>,
}

impl Writer {
    pub(super) fn new(
        db: Database,
        path: PathBuf,
        health: StoreHealth,
        faults: StoreFaults,
    ) -> Self {
        Writer {
            db: Some(db),
            path,
            health,
            faults,
            backlog: Vec::new(),
            retry: None,
        }
    }

    /// Serves batches until every handle is dropped; one transaction for everything queued
    /// since the last commit.
    pub(super) fn run(mut self, rx: mpsc::Receiver<Batch>) {
        loop {
            let first = match self.retry {
                None => match rx.recv() {
                    Ok(b) => Some(b),
                    Err(_) => break,
                },
                Some((at, _)) => {
                    match rx.recv_timeout(at.saturating_duration_since(Instant::now())) {
                        Ok(b) => Some(b),
                        Err(mpsc::RecvTimeoutError::Timeout) => None,
                        Err(mpsc::RecvTimeoutError::Disconnected) => break,
                    }
                }
            };
            let mut batches: Vec<Batch> = first.into_iter().collect();
            while let Ok(more) = rx.try_recv() {
                batches.push(more);
            }
            self.serve(batches);
        }
        // Every handle is gone: one last try for what is still held.
        if !self.backlog.is_empty() {
            self.retry = None;
            self.serve(Vec::new());
            if !self.backlog.is_empty() {
                tracing::error!(
                    changes = self.backlog.len(),
                    path = %self.path.display(),
                    "the state store is still unwritable at close: these changes are lost (the \
                     start-up reconcile finds queued jobs again)"
                );
            }
        }
    }

    fn serve(&mut self, mut batches: Vec<Batch>) {
        let reads: Vec<Read> = batches.iter_mut().filter_map(|b| b.read.take()).collect();
        self.write(batches);
        // After the writes sent before them; with no database while the disk fails.
        let db = self.db.as_ref().filter(|_| self.retry.is_none());
        for read in reads {
            read(db);
        }
    }

    fn write(&mut self, batches: Vec<Batch>) {
        let due = self.retry.is_none_or(|(at, _)| Instant::now() >= at);
        if !due {
            // The disk failed a moment ago: hold these with the rest until the next attempt.
            self.hold(batches);
            return;
        }
        let result = self.write_through(&batches);
        match result {
            Ok(()) => {
                if self.retry.take().is_some() {
                    self.health.set(true);
                    tracing::warn!(path = %self.path.display(), "the state store is writable again; everything held was written");
                }
                self.backlog.clear();
                for b in batches {
                    if let Some(done) = b.done {
                        let _ = done.send(Ok(()));
                    }
                }
            }
            Err(e) => {
                // redb latches an I/O error: drop the database and open it again next time.
                self.db = None;
                let wait = WRITE_BACKOFF.following(self.retry.map(|(_, w)| w));
                if self.retry.is_none() {
                    self.health.set(false);
                    tracing::error!(path = %self.path.display(), error = %e, "the state store cannot be written: holding changes in memory and trying again; deliveries are still accepted");
                } else {
                    tracing::debug!(error = %e, "the state store is still unwritable");
                }
                self.retry = Some((Instant::now() + wait, wait));
                self.hold(batches);
            }
        }
    }

    /// Keeps `batches` in memory (up to [`BACKLOG_CAP`] changes) and answers their writers.
    fn hold(&mut self, batches: Vec<Batch>) {
        for b in batches {
            let answer = if self.backlog.len() + b.ops.len() <= BACKLOG_CAP {
                self.backlog.extend(b.ops);
                Ok(())
            } else {
                Err(io(
                    &self.path,
                    format!("unwritable, and {BACKLOG_CAP} changes already held in memory"),
                ))
            };
            if let Some(done) = b.done {
                let _ = done.send(answer);
            }
        }
    }

    /// Writes what is held and then `batches`, in one transaction, opening the file again
    /// first if a failure closed it.
    fn write_through(&mut self, batches: &[Batch]) -> Result<(), StoreError> {
        if self.faults.unwritable() {
            return Err(io(&self.path, "injected fault: no space left on device"));
        }
        if self.db.is_none() {
            self.db = Some(open::reopen(&self.path)?);
        }
        let db = self.db.as_ref().expect("opened above");
        let ops = self
            .backlog
            .iter()
            .chain(batches.iter().flat_map(|b| &b.ops));
        apply(db, ops).map_err(|e| io(&self.path, e))
    }
}

fn apply<'a>(
    db: &Database,
    ops: impl Iterator<Item = &'a Op>,
) -> Result<(), Box<dyn std::error::Error>> {
    let w = db.begin_write()?;
    {
        let mut jobs = w.open_table(JOBS)?;
        let mut runners = w.open_table(RUNNERS)?;
        let mut retries = w.open_table(RETRIES)?;
        let mut marks = w.open_table(MARKS)?;
        let mut usage = w.open_table(USAGE)?;
        let mut usage_jobs = w.open_table(USAGE_JOBS)?;
        for op in ops {
            match op {
                Op::AddJob(row) => {
                    let k = key(&row.info.key);
                    if jobs.get(k.as_str())?.is_none() {
                        jobs.insert(k.as_str(), job_bytes(row)?.as_slice())?;
                    }
                }
                Op::JobStarted(job, at) => {
                    let k = key(job);
                    let row = jobs
                        .get(k.as_str())?
                        .map(|v| serde_json::from_slice::<JobRow>(v.value()));
                    // An `in_progress` may come before its `queued` (deliveries are not
                    // ordered): the start is kept all the same, so the late `queued` (which
                    // adds a row only where none is) cannot make a restart dispatch it again.
                    let mut row = match row {
                        Some(Ok(row)) => row,
                        _ => JobRow {
                            info: crate::job::JobInfo {
                                key: job.clone(),
                                ..crate::job::JobInfo::default()
                            },
                            received_unix: *at,
                            started_unix: None,
                        },
                    };
                    row.started_unix.get_or_insert(*at);
                    jobs.insert(k.as_str(), job_bytes(&row)?.as_slice())?;
                }
                Op::DeleteJob(k) => {
                    jobs.remove(key(k).as_str())?;
                }
                Op::PutRunner(row) => {
                    runners.insert(row.name.as_str(), serde_json::to_vec(row)?.as_slice())?;
                }
                Op::DeleteRunner(name) => {
                    runners.remove(name.as_str())?;
                }
                Op::Unregistered(_) => {}
                Op::PutRetry(row) => {
                    retries.insert(
                        key(&row.job.key).as_str(),
                        serde_json::to_vec(row)?.as_slice(),
                    )?;
                }
                Op::DeleteRetry(k) => {
                    retries.remove(key(k).as_str())?;
                }
                Op::PutMark(name, value) => {
                    marks.insert(name.as_str(), serde_json::to_vec(value)?.as_slice())?;
                }
                Op::PutUsage(row) => {
                    let job = usage_job(row);
                    if usage_jobs.get(job.as_str())?.is_none() {
                        let k = usage_key(row);
                        usage.insert(k.as_str(), serde_json::to_vec(row)?.as_slice())?;
                        usage_jobs.insert(job.as_str(), k.as_str())?;
                    }
                }
                Op::PruneUsage(before) => {
                    let before = format!("{before:020}");
                    let old: Vec<String> = usage
                        .range(..before.as_str())?
                        .map(|row| row.map(|(k, _)| k.value().to_string()))
                        .collect::<Result<_, _>>()?;
                    for k in old {
                        usage.remove(k.as_str())?;
                        if let Some((_, job)) = k.split_once('/') {
                            usage_jobs.remove(job)?;
                        }
                    }
                }
            }
        }
    }
    w.commit()?;
    Ok(())
}

/// A job's row as this build writes it; as the next release would, with one field more, when
/// this process plays it (crate::next_build).
fn job_bytes(row: &JobRow) -> serde_json::Result<Vec<u8>> {
    #[derive(serde::Serialize)]
    struct Next<'a> {
        #[serde(flatten)]
        row: &'a JobRow,
        accepted_by: &'static str,
    }
    if !crate::next_build::on() {
        return serde_json::to_vec(row);
    }
    serde_json::to_vec(&Next {
        row,
        accepted_by: concat!("ephemer-actors ", env!("CARGO_PKG_VERSION"), " (next build)"),
    })
}
