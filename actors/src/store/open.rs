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
}

impl Open {
    pub(super) fn into_error(self) -> StoreError {
        match self {
            Open::Locked(e) | Open::Unreadable(e) | Open::Disk(e) => e,
        }
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
    let db = match Database::create(path) {
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
    // Make sure the tables exist, then read them.
    let w = db.begin_write().map_err(|e| e.sorted(path))?;
    for t in [JOBS, RUNNERS, RETRIES, MARKS] {
        w.open_table(t).map_err(|e| e.sorted(path))?;
    }
    w.commit().map_err(|e| e.sorted(path))?;
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

/// The marks, by name (an unreadable one is skipped, as rows are).
fn marks(
    r: &redb::ReadTransaction,
    path: &Path,
) -> Result<std::collections::HashMap<String, serde_json::Value>, Open> {
    let table = r.open_table(MARKS).map_err(|e| e.sorted(path))?;
    let mut out = std::collections::HashMap::new();
    for row in table.iter().map_err(|e| e.sorted(path))? {
        let (k, v) = row.map_err(|e| e.sorted(path))?;
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
