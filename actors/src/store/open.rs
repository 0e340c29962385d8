//! Opening the store: create it private, read what the last run left, and tell a store that
//! is corrupt or of an unknown version (moved aside, a fresh one started) from one the disk
//! cannot give right now (EACCES, EIO, ENOSPC: an error, nothing moved, the ledger kept).

use redb::{CommitError, DatabaseError, StorageError, TableError, TransactionError};

use super::*;

/// Why a store did not open.
pub(super) enum Open {
    /// Held by another process: leave it alone.
    Locked(StoreError),
    /// Corrupt or of a format this build cannot read: move it aside.
    Unreadable(StoreError),
    /// The disk failed (permission, I/O, space): the file may be fine; refuse to start.
    Disk(StoreError),
    /// Written by a newer build, in a format this one does not know: refuse to start and
    /// leave it as it is (its jobs are the newer build's to run).
    Newer(StoreError),
}

impl Open {
    pub(super) fn into_error(self) -> StoreError {
        match self {
            Open::Locked(e) | Open::Unreadable(e) | Open::Disk(e) | Open::Newer(e) => e,
        }
    }
}

/// The mark that says which format the store's records are in, and which build wrote it last.
pub(super) const FORMAT_MARK: &str = "store_format";

/// The store format this build writes and the newest it reads. 1: the stores of builds from
/// before the mark (the same records); 2: the mark is there. A build reads every format up to
/// its own (serde defaults carry a record an older build wrote), and refuses a newer one.
pub(super) const FORMAT: u64 = 2;

/// What [`FORMAT_MARK`] holds.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(super) struct FormatMark {
    /// The records' format.
    pub(super) format: u64,
    /// The build that wrote it (`CARGO_PKG_VERSION`).
    #[serde(default)]
    pub(super) written_by: String,
}

impl FormatMark {
    /// This build's.
    pub(super) fn current() -> Self {
        FormatMark {
            format: FORMAT,
            written_by: env!("CARGO_PKG_VERSION").to_string(),
        }
    }
}

/// Whether this build may open a store whose mark is `found` (`None`: a store from before
/// the mark, format 1): the refusal says what to do.
pub(super) fn may_open(found: Option<&FormatMark>, path: &Path) -> Result<(), Open> {
    match found {
        Some(mark) if mark.format > FORMAT => Err(Open::Newer(io(
            path,
            format!(
                "written in store format {} by ephemer-actors {}, newer than this build ({}, \
                 formats up to {FORMAT}); nothing was changed: run that build (or a newer one) \
                 on this state.dir, or move the file aside yourself to start with an empty \
                 store (the jobs it holds are then not run by this host)",
                mark.format,
                if mark.written_by.is_empty() { "?" } else { &mark.written_by },
                env!("CARGO_PKG_VERSION"),
            ),
        ))),
        _ => Ok(()),
    }
}

/// A redb failure, sorted by whether the disk or the file is at fault.
pub(super) trait Sort: std::fmt::Display {
    /// The storage error inside, if any.
    fn storage(&self) -> Option<&StorageError>;

    /// `Disk` for an I/O error, else `Unreadable`.
    fn sorted(&self, path: &Path) -> Open {
        let e = io(path, self);
        match self.storage() {
            // redb reports a file that is not a store (bad magic, short header) as an I/O
            // error of these kinds: the file is at fault, not the disk.
            Some(StorageError::Io(io))
                if matches!(
                    io.kind(),
                    std::io::ErrorKind::InvalidData | std::io::ErrorKind::UnexpectedEof
                ) =>
            {
                Open::Unreadable(e)
            }
            Some(StorageError::Io(_) | StorageError::PreviousIo) => Open::Disk(e),
            _ => Open::Unreadable(e),
        }
    }
}

impl Sort for StorageError {
    fn storage(&self) -> Option<&StorageError> {
        Some(self)
    }
}

impl Sort for DatabaseError {
    fn storage(&self) -> Option<&StorageError> {
        match self {
            DatabaseError::Storage(s) => Some(s),
            _ => None,
        }
    }
}

impl Sort for TransactionError {
    fn storage(&self) -> Option<&StorageError> {
        match self {
            TransactionError::Storage(s) => Some(s),
            _ => None,
        }
    }
}

impl Sort for TableError {
    fn storage(&self) -> Option<&StorageError> {
        match self {
            TableError::Storage(s) => Some(s),
            _ => None,
        }
    }
}

impl Sort for CommitError {
    fn storage(&self) -> Option<&StorageError> {
        match self {
            CommitError::Storage(s) => Some(s),
            _ => None,
        }
    }
}

/// Opens the database at `path` (creating it, mode 0600 from the start), makes sure its tables
/// exist, and reads them.
pub(super) fn open_and_load(path: &Path) -> Result<(Database, Snapshot), Open> {
    // Mode 0600 from its creation: the store holds every job and runner of the org.
    if !path.exists() {
        crate::harden::private_file(path, true).map_err(|e| Open::Disk(io(path, e)))?;
    }
    let mut db = match Database::create(path) {
        Ok(db) => db,
        Err(e @ (DatabaseError::DatabaseAlreadyOpen | DatabaseError::LockProtocolMismatch)) => {
            return Err(Open::Locked(io(
                path,
                format!("{e} (is another daemon using this state.dir?)"),
            )));
        }
        Err(e) => return Err(e.sorted(path)),
    };
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
            .map_err(|e| Open::Disk(io(path, e)))?;
    }
    // A store a newer build wrote is refused before anything is written to it.
    let found = read_format(&db, path)?;
    may_open(found.as_ref(), path)?;
    // Make sure the tables exist and the mark says this build's format, then read them.
    let w = db.begin_write().map_err(|e| e.sorted(path))?;
    for t in [JOBS, RUNNERS, RETRIES, MARKS, USAGE] {
        w.open_table(t).map_err(|e| e.sorted(path))?;
    }
    w.open_table(USAGE_JOBS).map_err(|e| e.sorted(path))?;
    if found != Some(FormatMark::current()) {
        if let Some(old) = &found {
            tracing::info!(from = old.format, to = FORMAT, written_by = %old.written_by, "state store last written by another build: its records are read as they are, and its mark now says this build's format");
        }
        let mark = serde_json::to_vec(&FormatMark::current()).map_err(|e| Open::Disk(io(path, e)))?;
        let mut marks = w.open_table(MARKS).map_err(|e| e.sorted(path))?;
        marks
            .insert(FORMAT_MARK, mark.as_slice())
            .map_err(|e| e.sorted(path))?;
    }
    w.commit().map_err(|e| e.sorted(path))?;
    compact(&mut db, path);
    let r = db.begin_read().map_err(|e| e.sorted(path))?;
    fn rows<T: for<'de> Deserialize<'de>>(
        r: &redb::ReadTransaction,
        t: TableDefinition<'_, &str, &[u8]>,
        path: &Path,
    ) -> Result<Vec<T>, Open> {
        let table = r.open_table(t).map_err(|e| e.sorted(path))?;
        let mut out = Vec::new();
        for row in table.iter().map_err(|e| e.sorted(path))? {
            let (k, v) = row.map_err(|e| e.sorted(path))?;
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
        marks: marks(&r, path)?,
        moved_aside: None,
    };
    drop(r);
    Ok((db, snapshot))
}

/// Gives the space of records gone since the last start back to the file system: redb reuses
/// freed pages but never shrinks its file, so a burst of jobs long finished would keep the
/// file at its high-water mark. At start-up, before anything else uses the store; a failure
/// leaves the store as it was (said, not fatal).
fn compact(db: &mut Database, path: &Path) {
    let before = std::fs::metadata(path).map(|m| m.len()).unwrap_or(0);
    match db.compact() {
        Ok(_) => {
            let after = std::fs::metadata(path).map(|m| m.len()).unwrap_or(0);
            if after < before {
                tracing::info!(path = %path.display(), before, after, "state store compacted");
            }
        }
        Err(e) => tracing::warn!(path = %path.display(), error = %e, "cannot compact the state store; it is used as it is"),
    }
}

/// The format mark of a store (`None`: it has none, or no marks table yet).
fn read_format(db: &Database, path: &Path) -> Result<Option<FormatMark>, Open> {
    let r = db.begin_read().map_err(|e| e.sorted(path))?;
    let table = match r.open_table(MARKS) {
        Ok(t) => t,
        Err(TableError::TableDoesNotExist(_)) => return Ok(None),
        Err(e) => return Err(e.sorted(path)),
    };
    let Some(v) = table.get(FORMAT_MARK).map_err(|e| e.sorted(path))? else {
        return Ok(None);
    };
    match serde_json::from_slice::<FormatMark>(v.value()) {
        Ok(mark) => Ok(Some(mark)),
        // A mark this build cannot read is a newer build's.
        Err(e) => Err(Open::Newer(io(
            path,
            format!("its format mark is not one this build reads ({e}); nothing was changed"),
        ))),
    }
}

/// The marks, by name (an unreadable one is skipped, as rows are).
fn marks(
    r: &redb::ReadTransaction,
    path: &Path,
) -> Result<std::collections::HashMap<String, serde_json::Value>, Open> {
    let table = r.open_table(MARKS).map_err(|e| e.sorted(path))?;
    let mut out = std::collections::HashMap::new();
    for row in table.iter().map_err(|e| e.sorted(path))? {
        let (k, v) = row.map_err(|e| e.sorted(path))?;
        if k.value() == FORMAT_MARK {
            continue;
        }
        match serde_json::from_slice(v.value()) {
            Ok(x) => {
                out.insert(k.value().to_string(), x);
            }
            Err(e) => tracing::warn!(key = k.value(), error = %e, "skipping an unreadable mark"),
        }
    }
    Ok(out)
}

/// Opens the database again after a failure (redb latches an I/O error until reopened).
pub(super) fn reopen(path: &Path) -> Result<Database, StoreError> {
    Database::create(path).map_err(|e| io(path, e))
}
