//! `Store`: the durable state under `state.dir` (redb, file mode 0600), so a restart, even
//! `kill -9`, loses no job and leaks no runner.
//!
//! Three tables: open jobs (what the intake accepted: recorded before the webhook is answered),
//! the runner ledger (every runner claimed, until its environment is gone), and the retry ladder
//! (attempts, first failure, next attempt, class). Writes go to one writer thread that commits
//! whatever has queued up since the last commit in one transaction (group commit), so many
//! concurrent webhooks share one fsync. A store that cannot be opened is moved aside with a
//! clear error and a fresh one is created: never silently dropped.

use std::{
    path::{Path, PathBuf},
    sync::mpsc,
};

use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};
use serde::{Deserialize, Serialize};

use crate::{
    job::{JobInfo, JobKey},
    vocab::{ErrorClass, ProviderKind},
};

const JOBS: TableDefinition<'static, &str, &[u8]> = TableDefinition::new("jobs");
const RUNNERS: TableDefinition<'static, &str, &[u8]> = TableDefinition::new("runners");
const RETRIES: TableDefinition<'static, &str, &[u8]> = TableDefinition::new("retries");

/// The file under `state.dir`.
pub const FILE: &str = "ephemer-actors.redb";

/// Store failures.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StoreError {
    /// The database could not be opened or written.
    #[error("state store {path}: {detail}")]
    Io {
        /// The file.
        path: String,
        /// What failed.
        detail: String,
    },
    /// The writer thread is gone.
    #[error("state store writer stopped")]
    Closed,
}

/// A job the intake accepted and nobody has seen finish yet.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobRow {
    /// The job.
    pub info: JobInfo,
    /// Unix seconds the queued event arrived.
    pub received_unix: u64,
    /// Unix seconds it was observed running (then it is only kept for dedup until pruned).
    pub started_unix: Option<u64>,
}

/// A runner in the ledger.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunnerRow {
    /// Name (also the environment's handle: directory, container or VM name).
    pub name: String,
    /// GitHub id.
    pub id: u64,
    /// Provider.
    pub provider: ProviderKind,
    /// Repo for repo-level runners.
    pub repo: Option<String>,
    /// The job it was created for.
    pub intent: JobKey,
    /// The job it ran, once observed.
    pub bound: Option<JobKey>,
    /// Unix seconds of the claim.
    pub created_unix: u64,
}

/// A job on the retry ladder.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RetryRow {
    /// The job.
    pub job: JobInfo,
    /// Failures so far.
    pub attempts: u32,
    /// Unix seconds of the first failure.
    pub first_failure_unix: u64,
    /// Unix seconds of the next attempt.
    pub next_attempt_unix: u64,
    /// Class of the first failure.
    pub class: ErrorClass,
    /// The latest failure.
    pub last_error: String,
}

/// One change.
#[derive(Debug, Clone)]
pub enum Op {
    /// Record an accepted job unless it is already there.
    AddJob(JobRow),
    /// Mark a job observed running.
    JobStarted(JobKey, u64),
    /// Forget a job.
    DeleteJob(JobKey),
    /// Record or update a runner.
    PutRunner(RunnerRow),
    /// Forget a runner (its environment is gone).
    DeleteRunner(String),
    /// Record or update a retry.
    PutRetry(RetryRow),
    /// Forget a retry.
    DeleteRetry(JobKey),
}

/// Everything the store held at start-up.
#[derive(Debug, Default, Clone)]
pub struct Snapshot {
    /// Open jobs.
    pub jobs: Vec<JobRow>,
    /// The runner ledger.
    pub runners: Vec<RunnerRow>,
    /// The retry ladder.
    pub retries: Vec<RetryRow>,
    /// Where an unreadable store was moved, if it was.
    pub moved_aside: Option<PathBuf>,
}

struct Batch {
    ops: Vec<Op>,
    done: Option<tokio::sync::oneshot::Sender<Result<(), StoreError>>>,
}

/// A handle on the writer thread. Cheap to clone; usable from any thread. The store closes
/// (its file lock is released) once every handle is dropped and the writer has applied what
/// it was sent; [`StoreClosed`] says when.
#[derive(Debug, Clone)]
pub struct Store {
    tx: mpsc::Sender<Batch>,
    closed: StoreClosed,
}

/// Tells when a store's writer has finished and its file is closed.
#[derive(Debug, Clone, Default)]
pub struct StoreClosed(std::sync::Arc<std::sync::atomic::AtomicBool>);

impl StoreClosed {
    /// True once the writer has exited and the database file is closed.
    pub fn is_closed(&self) -> bool {
        self.0.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Waits (up to `timeout`) until the store is closed; true if it is.
    pub async fn wait(&self, timeout: std::time::Duration) -> bool {
        let deadline = tokio::time::Instant::now() + timeout;
        while !self.is_closed() && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        self.is_closed()
    }
}

fn key(k: &JobKey) -> String {
    format!("{}/{}", k.owner, k.job_id)
}

fn io(path: &Path, e: impl std::fmt::Display) -> StoreError {
    StoreError::Io {
        path: path.display().to_string(),
        detail: e.to_string(),
    }
}

/// The file in `state.dir` that holds this install's id.
pub const INSTALL_ID_FILE: &str = "install-id";

/// This install's id: six characters of `[a-z0-9]`, generated at the first start and kept in
/// `dir/install-id`. Runner names carry it, so hosts that share a `name_prefix` (the default)
/// in one org never take each other's registrations or environments for leftovers of their own.
pub fn install_id(dir: &Path) -> Result<String, StoreError> {
    let path = dir.join(INSTALL_ID_FILE);
    let valid = |s: &str| {
        s.len() == 6
            && s.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
    };
    match std::fs::read_to_string(&path) {
        Ok(text) if valid(text.trim()) => return Ok(text.trim().to_string()),
        Ok(text) => {
            return Err(io(
                &path,
                std::io::Error::other(format!(
                    "holds {:?}, not an install id (six of a-z0-9); restore it or remove the file \
                     (runners the old id named are then not cleaned up)",
                    text.trim()
                )),
            ));
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(io(&path, e)),
    }
    std::fs::create_dir_all(dir).map_err(|e| io(dir, e))?;
    let id: String = crate::vocab::random_suffix().chars().take(6).collect();
    let tmp = dir.join(format!("{INSTALL_ID_FILE}.new"));
    std::fs::write(&tmp, format!("{id}\n"))
        .and_then(|()| std::fs::rename(&tmp, &path))
        .map_err(|e| io(&path, e))?;
    Ok(id)
}

impl Store {
    /// Opens (or creates) the store in `dir`, loads it, and starts the writer thread.
    pub fn open(dir: &Path) -> Result<(Store, Snapshot), StoreError> {
        std::fs::create_dir_all(dir).map_err(|e| io(dir, e))?;
        let path = dir.join(FILE);
        let mut moved_aside = None;
        let db = match open_and_load(&path) {
            Ok(pair) => pair,
            Err(Open::Locked(e)) => return Err(e),
            Err(Open::Unreadable(e)) if path.exists() => {
                let aside = dir.join(format!("{FILE}.unreadable-{}", crate::clock::unix_now()));
                tracing::error!(path = %path.display(), error = %e, moved_to = %aside.display(), "the state store cannot be read; moving it aside and starting a fresh one");
                std::fs::rename(&path, &aside).map_err(|e| io(&path, e))?;
                moved_aside = Some(aside);
                open_and_load(&path).map_err(Open::into_error)?
            }
            Err(e) => return Err(e.into_error()),
        };
        let (db, mut snapshot) = db;
        snapshot.moved_aside = moved_aside;
        let (tx, rx) = mpsc::channel::<Batch>();
        let closed = StoreClosed::default();
        let flag = closed.clone();
        std::thread::Builder::new()
            .name("ephemer-store".into())
            .spawn(move || {
                writer(db, path, rx);
                flag.0.store(true, std::sync::atomic::Ordering::SeqCst);
            })
            .map_err(|e| io(dir, e))?;
        Ok((Store { tx, closed }, snapshot))
    }

    /// Applies `ops` and waits until they are durable.
    pub async fn write(&self, ops: Vec<Op>) -> Result<(), StoreError> {
        let (done, wait) = tokio::sync::oneshot::channel();
        self.tx
            .send(Batch {
                ops,
                done: Some(done),
            })
            .map_err(|_| StoreError::Closed)?;
        wait.await.map_err(|_| StoreError::Closed)?
    }

    /// Says when this store is closed (every handle dropped, the writer done).
    pub fn closed(&self) -> StoreClosed {
        self.closed.clone()
    }

    /// Applies `ops` in order with later writes, without waiting.
    pub fn send(&self, ops: Vec<Op>) {
        if !ops.is_empty() && self.tx.send(Batch { ops, done: None }).is_err() {
            tracing::error!("state store writer stopped; state changes are no longer durable");
        }
    }
}

/// Why a store did not open: held by another process (leave it alone), or unreadable.
enum Open {
    Locked(StoreError),
    Unreadable(StoreError),
}

impl Open {
    fn into_error(self) -> StoreError {
        match self {
            Open::Locked(e) | Open::Unreadable(e) => e,
        }
    }
}

impl From<StoreError> for Open {
    fn from(e: StoreError) -> Self {
        Open::Unreadable(e)
    }
}

fn open_and_load(path: &Path) -> Result<(Database, Snapshot), Open> {
    // Mode 0600 from its creation: the store holds every job and runner of the org.
    if !path.exists() {
        crate::harden::private_file(path, true).map_err(|e| Open::Unreadable(io(path, e)))?;
    }
    let db = match Database::create(path) {
        Ok(db) => db,
        Err(
            e @ (redb::DatabaseError::DatabaseAlreadyOpen
            | redb::DatabaseError::LockProtocolMismatch),
        ) => {
            return Err(Open::Locked(io(
                path,
                format!("{e} (is another daemon using this state.dir?)"),
            )));
        }
        Err(e) => return Err(Open::Unreadable(io(path, e))),
    };
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
            .map_err(|e| io(path, e))?;
    }
    // Make sure the tables exist, then read them.
    let w = db.begin_write().map_err(|e| io(path, e))?;
    for t in [JOBS, RUNNERS, RETRIES] {
        w.open_table(t).map_err(|e| io(path, e))?;
    }
    w.commit().map_err(|e| io(path, e))?;
    let r = db.begin_read().map_err(|e| io(path, e))?;
    fn rows<T: for<'de> Deserialize<'de>>(
        r: &redb::ReadTransaction,
        t: TableDefinition<'_, &str, &[u8]>,
        path: &Path,
    ) -> Result<Vec<T>, StoreError> {
        let table = r.open_table(t).map_err(|e| io(path, e))?;
        let mut out = Vec::new();
        for row in table.iter().map_err(|e| io(path, e))? {
            let (k, v) = row.map_err(|e| io(path, e))?;
            match serde_json::from_slice(v.value()) {
                Ok(x) => out.push(x),
                Err(e) => {
                    tracing::warn!(key = k.value(), error = %e, "skipping an unreadable state row")
                }
            }
        }
        Ok(out)
    }
    let snapshot = Snapshot {
        jobs: rows(&r, JOBS, path)?,
        runners: rows(&r, RUNNERS, path)?,
        retries: rows(&r, RETRIES, path)?,
        moved_aside: None,
    };
    drop(r);
    Ok((db, snapshot))
}

/// The writer thread: one transaction for everything queued since the last commit.
fn writer(db: Database, path: PathBuf, rx: mpsc::Receiver<Batch>) {
    while let Ok(first) = rx.recv() {
        let mut batches = vec![first];
        while let Ok(more) = rx.try_recv() {
            batches.push(more);
        }
        let result = apply(&db, &batches).map_err(|e| io(&path, e));
        if let Err(e) = &result {
            tracing::error!(error = %e, "state store write failed");
        }
        for b in batches {
            if let Some(done) = b.done {
                let _ = done.send(result.clone());
            }
        }
    }
}

fn apply(db: &Database, batches: &[Batch]) -> Result<(), Box<dyn std::error::Error>> {
    let w = db.begin_write()?;
    {
        let mut jobs = w.open_table(JOBS)?;
        let mut runners = w.open_table(RUNNERS)?;
        let mut retries = w.open_table(RETRIES)?;
        for op in batches.iter().flat_map(|b| &b.ops) {
            match op {
                Op::AddJob(row) => {
                    let k = key(&row.info.key);
                    if jobs.get(k.as_str())?.is_none() {
                        jobs.insert(k.as_str(), serde_json::to_vec(row)?.as_slice())?;
                    }
                }
                Op::JobStarted(k, at) => {
                    let k = key(k);
                    let row = jobs
                        .get(k.as_str())?
                        .map(|v| serde_json::from_slice::<JobRow>(v.value()));
                    if let Some(Ok(mut row)) = row {
                        row.started_unix.get_or_insert(*at);
                        jobs.insert(k.as_str(), serde_json::to_vec(&row)?.as_slice())?;
                    }
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
                Op::PutRetry(row) => {
                    retries.insert(
                        key(&row.job.key).as_str(),
                        serde_json::to_vec(row)?.as_slice(),
                    )?;
                }
                Op::DeleteRetry(k) => {
                    retries.remove(key(k).as_str())?;
                }
            }
        }
    }
    w.commit()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(id: u64) -> JobInfo {
        JobInfo {
            key: JobKey::new("acme", id),
            repo: "app".into(),
            run_id: 1,
            run_attempt: 1,
            labels: vec!["self-hosted".into()],
            runner_name: None,
            runner_id: None,
            conclusion: None,
            installation_id: None,
        }
    }

    #[actix_rt::test]
    async fn survives_a_reopen_and_keeps_its_mode() {
        let dir = tempfile::tempdir().unwrap();
        {
            let (store, snap) = Store::open(dir.path()).unwrap();
            assert!(snap.jobs.is_empty());
            store
                .write(vec![
                    Op::AddJob(JobRow {
                        info: job(1),
                        received_unix: 10,
                        started_unix: None,
                    }),
                    Op::AddJob(JobRow {
                        info: job(2),
                        received_unix: 11,
                        started_unix: None,
                    }),
                    Op::JobStarted(JobKey::new("acme", 2), 12),
                    Op::PutRunner(RunnerRow {
                        name: "r1".into(),
                        id: 7,
                        provider: ProviderKind::Local,
                        repo: None,
                        intent: JobKey::new("acme", 1),
                        bound: None,
                        created_unix: 13,
                    }),
                    Op::PutRetry(RetryRow {
                        job: job(3),
                        attempts: 2,
                        first_failure_unix: 5,
                        next_attempt_unix: 99,
                        class: ErrorClass::RateLimit,
                        last_error: "403".into(),
                    }),
                ])
                .await
                .unwrap();
            store
                .write(vec![Op::AddJob(JobRow {
                    info: job(1),
                    received_unix: 999,
                    started_unix: None,
                })])
                .await
                .unwrap();
        }
        // The writer thread holds the database until its channel closes; wait for that.
        let (_, snap) = loop {
            match Store::open(dir.path()) {
                Ok(pair) => break pair,
                Err(_) => tokio::time::sleep(std::time::Duration::from_millis(20)).await,
            }
        };
        let mut jobs = snap.jobs.clone();
        jobs.sort_by_key(|j| j.info.key.job_id);
        assert_eq!(jobs.len(), 2);
        assert_eq!(jobs[0].received_unix, 10, "AddJob keeps the first");
        assert_eq!(jobs[1].started_unix, Some(12));
        assert_eq!(snap.runners[0].id, 7);
        assert_eq!(snap.retries[0].attempts, 2);
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(dir.path().join(FILE))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
    }

    #[actix_rt::test]
    async fn an_unreadable_store_is_moved_aside() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join(FILE),
            b"this is not a redb file at all, not even close",
        )
        .unwrap();
        let (store, snap) = Store::open(dir.path()).unwrap();
        let aside = snap.moved_aside.expect("moved aside");
        assert!(aside.exists());
        assert_eq!(
            std::fs::read(&aside).unwrap(),
            b"this is not a redb file at all, not even close"
        );
        store
            .write(vec![Op::DeleteJob(JobKey::new("acme", 1))])
            .await
            .unwrap();
    }
}
