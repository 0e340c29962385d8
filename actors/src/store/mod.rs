//! `Store`: the durable state under `state.dir` (redb, file mode 0600), so a restart, even
//! `kill -9`, loses no job and leaks no runner.
//!
//! Four tables: open jobs (what the intake accepted: recorded before the webhook is answered),
//! the runner ledger (every runner claimed, until its environment is gone), and the retry ladder
//! (attempts, first failure, next attempt, class), and marks (small named records, such as where
//! the redelivery pass left off). Writes go to one writer thread that commits
//! whatever has queued up since the last commit in one transaction (group commit), so many
//! concurrent webhooks share one fsync.
//!
//! A disk that fails (ENOSPC from a job's logs, EIO) loses nothing: the writer keeps what it
//! could not write in memory, in order, answers writers that it holds it (so the intake still
//! accepts deliveries: GitHub would not send a refused one again), says so in
//! [`StoreHealth`] (`/readyz`, `ephemerd_store_healthy`), reopens the file with backoff and
//! writes everything through once the disk takes it. Only a store that is corrupt is moved
//! aside at start-up (a fresh one is started, with a loud log); one the disk cannot read
//! (EACCES, EIO) is an error that stops the start, the file left as it is. A format mark says
//! which format the records are in (`open::FORMAT`): older formats are read, a newer one (a
//! rollback) refuses the start and is left as it is. Each start compacts the file, so what
//! finished jobs took goes back to the file system.

use std::{
    path::{Path, PathBuf},
    sync::mpsc,
};

use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};
use serde::Deserialize;

pub use crate::durable::{JobRow, Op, RetryRow, RunnerRow, Snapshot, UsageRow};
use crate::job::JobKey;

const JOBS: TableDefinition<'static, &str, &[u8]> = TableDefinition::new("jobs");
const RUNNERS: TableDefinition<'static, &str, &[u8]> = TableDefinition::new("runners");
const RETRIES: TableDefinition<'static, &str, &[u8]> = TableDefinition::new("retries");
/// Small named records that outlive a restart (where the redelivery pass left off).
const MARKS: TableDefinition<'static, &str, &[u8]> = TableDefinition::new("marks");
/// What finished jobs used ([`UsageRow`]), keyed by when they ended, for `state.usage_retention`.
const USAGE: TableDefinition<'static, &str, &[u8]> = TableDefinition::new("usage");
/// Each usage row's key by its job (`owner/job_id`): a job's row is written once, whatever
/// repeats its completion (a redelivery after a restart).
const USAGE_JOBS: TableDefinition<'static, &str, &str> = TableDefinition::new("usage_jobs");

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

struct Batch {
    ops: Vec<Op>,
    done: Option<tokio::sync::oneshot::Sender<Result<(), StoreError>>>,
    /// A read, run by the writer after the writes before it (`None`: no database open, the
    /// disk failing).
    read: Option<Read>,
}

/// A read the writer runs on its database.
type Read = Box<dyn FnOnce(Option<&Database>) + Send>;

/// The usage key of a row: when it ended first, so a time range is a key range.
fn usage_key(row: &UsageRow) -> String {
    format!("{:020}/{}", row.ended_unix, usage_job(row))
}

/// The job part of a usage key: `owner/job_id`.
fn usage_job(row: &UsageRow) -> String {
    format!("{}/{}", row.job.owner, row.job.job_id)
}

/// A handle on the writer thread. Cheap to clone; usable from any thread. The store closes
/// (its file lock is released) once every handle is dropped and the writer has applied what
/// it was sent; [`StoreClosed`] says when.
#[derive(Debug, Clone)]
pub struct Store {
    tx: mpsc::Sender<Batch>,
    closed: StoreClosed,
    health: StoreHealth,
}

/// A flag shared between the writer thread and its handles.
#[derive(Debug, Clone, Default)]
struct Flag(std::sync::Arc<std::sync::atomic::AtomicBool>);

impl Flag {
    fn get(&self) -> bool {
        self.0.load(std::sync::atomic::Ordering::SeqCst)
    }

    fn set(&self, on: bool) {
        self.0.store(on, std::sync::atomic::Ordering::SeqCst);
    }
}

/// Whether the store's writes reach the disk. Unhealthy while the writer holds changes in
/// memory that it could not write.
#[derive(Debug, Clone, Default)]
pub struct StoreHealth {
    unhealthy: Flag,
}

impl StoreHealth {
    /// True while every change handed over has been written (or is being).
    pub fn is_healthy(&self) -> bool {
        !self.unhealthy.get()
    }

    fn set(&self, healthy: bool) {
        self.unhealthy.set(!healthy);
    }
}

/// A switch that makes the store's disk fail (every write and reopen errs) while it is on:
/// for fault tests and chaos runs of an embedded instance. Off unless someone turns it on.
#[derive(Debug, Clone, Default)]
pub struct StoreFaults(Flag);

impl StoreFaults {
    /// Makes the disk fail (`true`) or work again.
    pub fn set_unwritable(&self, on: bool) {
        self.0.set(on);
    }

    fn unwritable(&self) -> bool {
        self.0.get()
    }
}

/// Tells when a store's writer has finished and its file is closed.
#[derive(Debug, Clone, Default)]
pub struct StoreClosed(Flag);

impl StoreClosed {
    /// True once the writer has exited and the database file is closed.
    pub fn is_closed(&self) -> bool {
        self.0.get()
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

/// The lock file in `state.dir`: one daemon per directory.
pub const LOCK_FILE: &str = "ephemer-actors.lock";

/// Takes `dir` for this process (an exclusive `flock` on its lock file, released when the
/// returned handle is dropped, or the process ends).
fn lock_dir(dir: &Path) -> Result<nix::fcntl::Flock<std::fs::File>, StoreError> {
    use std::os::unix::fs::OpenOptionsExt;
    let path = dir.join(LOCK_FILE);
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .mode(0o600)
        .open(&path)
        .map_err(|e| io(&path, e))?;
    nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusiveNonblock).map_err(|(_, e)| {
        io(
            &path,
            format!("{e} (is another daemon using this state.dir?)"),
        )
    })
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
        Store::open_with(dir, StoreFaults::default())
    }

    /// Like [`Store::open`], with a fault switch on its disk.
    pub fn open_with(dir: &Path, faults: StoreFaults) -> Result<(Store, Snapshot), StoreError> {
        std::fs::create_dir_all(dir).map_err(|e| io(dir, e))?;
        let lock = lock_dir(dir)?;
        let path = dir.join(FILE);
        let mut moved_aside = None;
        let db = match open::open_and_load(&path) {
            Ok(pair) => pair,
            Err(open::Open::Unreadable(e)) if path.exists() => {
                let aside = dir.join(format!("{FILE}.unreadable-{}", crate::clock::unix_now()));
                tracing::error!(path = %path.display(), error = %e, moved_to = %aside.display(), "the state store is corrupt or of an unknown format; moving it aside and starting a fresh one");
                std::fs::rename(&path, &aside).map_err(|e| io(&path, e))?;
                moved_aside = Some(aside);
                open::open_and_load(&path).map_err(open::Open::into_error)?
            }
            Err(e) => return Err(e.into_error()),
        };
        let (db, mut snapshot) = db;
        snapshot.moved_aside = moved_aside;
        let (tx, rx) = mpsc::channel::<Batch>();
        let closed = StoreClosed::default();
        let health = StoreHealth::default();
        let flag = closed.clone();
        let writer = writer::Writer::new(db, path, health.clone(), faults);
        std::thread::Builder::new()
            .name("ephemer-store".into())
            .spawn(move || {
                writer.run(rx);
                // Held until the writer is done: the database may be closed and reopened in
                // between (a failing disk), and no other daemon may take the dir meanwhile.
                drop(lock);
                flag.0.set(true);
            })
            .map_err(|e| io(dir, e))?;
        Ok((Store { tx, closed, health }, snapshot))
    }

    /// Whether writes reach the disk.
    pub fn health(&self) -> StoreHealth {
        self.health.clone()
    }

    /// Applies `ops` and waits until they are durable, or held in memory until the disk takes
    /// them (while the store is unhealthy). An error means they were refused: the writer is
    /// gone, or it already holds more than it may.
    pub async fn write(&self, ops: Vec<Op>) -> Result<(), StoreError> {
        self.send_committed(ops).await
    }

    /// Applies `ops` in order with later writes, as [`Store::send`] does (the order is fixed
    /// by this call, not by polling), and says when they are durable, as [`Store::write`]
    /// does.
    pub fn send_committed(
        &self,
        ops: Vec<Op>,
    ) -> impl Future<Output = Result<(), StoreError>> + Send + 'static {
        let (done, wait) = tokio::sync::oneshot::channel();
        let sent = self
            .tx
            .send(Batch {
                ops,
                done: Some(done),
                read: None,
            })
            .is_ok();
        async move {
            if !sent {
                return Err(StoreError::Closed);
            }
            wait.await.map_err(|_| StoreError::Closed)?
        }
    }

    /// The usage rows of jobs that ended at or after `since_unix`, oldest first, read after
    /// every write sent before. Rows it cannot read are skipped with a warning.
    pub async fn usage_since(&self, since_unix: u64) -> Result<Vec<UsageRow>, StoreError> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let read: Read = Box::new(move |db: Option<&Database>| {
            let _ = tx.send(db.map(|db| read_usage(db, since_unix)));
        });
        let batch = Batch {
            ops: Vec::new(),
            done: None,
            read: Some(read),
        };
        self.tx.send(batch).map_err(|_| StoreError::Closed)?;
        match rx.await.map_err(|_| StoreError::Closed)? {
            Some(rows) => rows,
            None => Err(StoreError::Io {
                path: FILE.into(),
                detail: "the store cannot be read now (its disk is failing)".into(),
            }),
        }
    }

    /// Says when this store is closed (every handle dropped, the writer done).
    pub fn closed(&self) -> StoreClosed {
        self.closed.clone()
    }

    /// Applies `ops` in order with later writes, without waiting.
    pub fn send(&self, ops: Vec<Op>) {
        let batch = Batch {
            ops,
            done: None,
            read: None,
        };
        if !batch.ops.is_empty() && self.tx.send(batch).is_err() {
            tracing::error!("state store writer stopped; state changes are no longer durable");
        }
    }
}

/// The usage rows from `since_unix` on.
fn read_usage(db: &Database, since_unix: u64) -> Result<Vec<UsageRow>, StoreError> {
    let failed = |e: &dyn std::fmt::Display| StoreError::Io {
        path: FILE.into(),
        detail: format!("reading usage: {e}"),
    };
    let r = db.begin_read().map_err(|e| failed(&e))?;
    let table = match r.open_table(USAGE) {
        Ok(t) => t,
        Err(redb::TableError::TableDoesNotExist(_)) => return Ok(Vec::new()),
        Err(e) => return Err(failed(&e)),
    };
    let from = format!("{since_unix:020}");
    let mut rows = Vec::new();
    for row in table.range(from.as_str()..).map_err(|e| failed(&e))? {
        let (k, v) = row.map_err(|e| failed(&e))?;
        match serde_json::from_slice(v.value()) {
            Ok(row) => rows.push(row),
            Err(e) => tracing::warn!(key = k.value(), error = %e, "skipping an unreadable usage row"),
        }
    }
    Ok(rows)
}

mod open;
#[cfg(test)]
mod tests;
mod writer;
