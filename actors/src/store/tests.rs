//! The store against a real file.

use super::*;
use crate::{config::PoolName, job::JobInfo, vocab::ErrorClass};

fn job(id: u64) -> JobInfo {
    crate::scheduler::fixtures::job(id, &["self-hosted"])
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
                // Job 4's `in_progress` came before its `queued`: its start is kept.
                Op::JobStarted(JobKey::new("acme", 4), 14),
                Op::AddJob(JobRow {
                    info: job(4),
                    received_unix: 15,
                    started_unix: None,
                }),
                Op::PutRunner(RunnerRow {
                    name: "r1".into(),
                    id: 7,
                    provider: PoolName::from("local"),
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
    assert_eq!(jobs.len(), 3);
    assert_eq!(jobs[0].received_unix, 10, "AddJob keeps the first");
    assert_eq!(jobs[1].started_unix, Some(12));
    assert_eq!(
        jobs[2].started_unix,
        Some(14),
        "a start before the queued row is kept: a restart does not dispatch it again"
    );
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

fn add(id: u64) -> Op {
    Op::AddJob(JobRow {
        info: job(id),
        received_unix: id,
        started_unix: None,
    })
}

/// Reopens the store in `dir` once the writer has let go of it.
async fn reopened(dir: &Path) -> Snapshot {
    loop {
        match Store::open(dir) {
            Ok((_, snap)) => return snap,
            Err(_) => tokio::time::sleep(std::time::Duration::from_millis(20)).await,
        }
    }
}

/// While the disk fails, writes are held (answered, the store unhealthy); once it works again
/// they are written through, in order, without another write to carry them.
#[actix_rt::test]
async fn an_unwritable_disk_holds_changes_and_writes_them_through_when_it_recovers() {
    let dir = tempfile::tempdir().unwrap();
    let faults = StoreFaults::default();
    {
        let (store, _) = Store::open_with(dir.path(), faults.clone()).unwrap();
        store.write(vec![add(1)]).await.unwrap();
        assert!(store.health().is_healthy());
        faults.set_unwritable(true);
        for id in 2..22 {
            store.write(vec![add(id)]).await.expect("held, not refused");
        }
        store.send(vec![Op::DeleteJob(JobKey::new("acme", 2))]);
        assert!(!store.health().is_healthy());
        faults.set_unwritable(false);
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(20);
        while !store.health().is_healthy() {
            assert!(tokio::time::Instant::now() < deadline, "never recovered");
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    }
    let snap = reopened(dir.path()).await;
    let mut ids: Vec<u64> = snap.jobs.iter().map(|j| j.info.key.job_id).collect();
    ids.sort_unstable();
    assert_eq!(ids, [1].into_iter().chain(3..22).collect::<Vec<_>>());
}

/// What still cannot be written when the last handle goes is tried once more at close.
#[actix_rt::test]
async fn held_changes_get_a_last_try_at_close() {
    let dir = tempfile::tempdir().unwrap();
    let faults = StoreFaults::default();
    let closed = {
        let (store, _) = Store::open_with(dir.path(), faults.clone()).unwrap();
        faults.set_unwritable(true);
        store.write(vec![add(7)]).await.unwrap();
        faults.set_unwritable(false);
        store.closed()
    };
    // The file is unlocked while the writer holds changes; its last try comes before it says
    // it is closed.
    assert!(closed.wait(std::time::Duration::from_secs(10)).await);
    let snap = reopened(dir.path()).await;
    assert_eq!(snap.jobs.len(), 1);
}

/// A disk error is not corruption: the file is kept and the open fails; a file redb cannot
/// read as a store is moved aside.
#[test]
fn disk_errors_are_told_from_corruption() {
    let path = Path::new("/state/ephemer-actors.redb");
    let disk = redb::StorageError::Io(std::io::Error::from_raw_os_error(5));
    assert!(matches!(
        open::Sort::sorted(&disk, path),
        open::Open::Disk(_)
    ));
    let denied = redb::DatabaseError::Storage(redb::StorageError::Io(std::io::Error::from(
        std::io::ErrorKind::PermissionDenied,
    )));
    assert!(matches!(
        open::Sort::sorted(&denied, path),
        open::Open::Disk(_)
    ));
    let not_redb = redb::StorageError::Io(std::io::Error::new(
        std::io::ErrorKind::InvalidData,
        "Not a redb database: magic number mismatch",
    ));
    assert!(matches!(
        open::Sort::sorted(&not_redb, path),
        open::Open::Unreadable(_)
    ));
    let corrupt = redb::StorageError::Corrupted("bad page".into());
    assert!(matches!(
        open::Sort::sorted(&corrupt, path),
        open::Open::Unreadable(_)
    ));
    let old = redb::DatabaseError::UpgradeRequired(1);
    assert!(matches!(
        open::Sort::sorted(&old, path),
        open::Open::Unreadable(_)
    ));
}

/// A mark is kept across a restart, the last one written of each name.
#[actix_rt::test]
async fn marks_survive_a_reopen_and_the_last_write_wins() {
    let dir = tempfile::tempdir().unwrap();
    {
        let (store, snap) = Store::open(dir.path()).unwrap();
        assert!(snap.marks.is_empty());
        store
            .write(vec![
                Op::PutMark("redeliver".into(), serde_json::json!({ "seen": 1 })),
                Op::PutMark("redeliver".into(), serde_json::json!({ "seen": 2 })),
            ])
            .await
            .unwrap();
    }
    let snap = reopened(dir.path()).await;
    assert_eq!(snap.marks["redeliver"], serde_json::json!({ "seen": 2 }));
}

/// Opens the store file at `path` with redb alone (the store closed) and sets its format mark.
fn set_format_mark(path: &Path, mark: &serde_json::Value) {
    let db = Database::create(path).unwrap();
    let w = db.begin_write().unwrap();
    {
        let mut marks = w.open_table(MARKS).unwrap();
        marks
            .insert(open::FORMAT_MARK, serde_json::to_vec(mark).unwrap().as_slice())
            .unwrap();
    }
    w.commit().unwrap();
}

/// The format mark of the store file at `path`, as it is written, and how many jobs it holds.
fn raw_mark_and_jobs(path: &Path) -> (serde_json::Value, u64) {
    let db = Database::create(path).unwrap();
    let r = db.begin_read().unwrap();
    let marks = r.open_table(MARKS).unwrap();
    let v = marks.get(open::FORMAT_MARK).unwrap().expect("a format mark");
    let jobs = r.open_table(JOBS).unwrap().iter().unwrap().count() as u64;
    (serde_json::from_slice(v.value()).unwrap(), jobs)
}

/// The format mark of the store file at `path`.
fn format_mark(path: &Path) -> open::FormatMark {
    serde_json::from_value(raw_mark_and_jobs(path).0).unwrap()
}

#[actix_rt::test]
async fn a_store_a_newer_build_wrote_is_refused_and_left_as_it_is() {
    let dir = tempfile::tempdir().unwrap();
    {
        let (store, _) = Store::open(dir.path()).unwrap();
        store.write(vec![add(1)]).await.unwrap();
        let closed = store.closed();
        drop(store);
        assert!(closed.wait(std::time::Duration::from_secs(10)).await);
    }
    let path = dir.path().join(FILE);
    assert_eq!(format_mark(&path), open::FormatMark::current());
    for newer in [
        serde_json::json!({ "format": open::FORMAT + 1, "written_by": "9.9.9" }),
        serde_json::json!({ "format": "three", "written_by": "9.9.9" }),
    ] {
        set_format_mark(&path, &newer);
        let err = Store::open(dir.path()).map(|_| ()).unwrap_err();
        let text = err.to_string();
        assert!(text.contains("nothing was changed"), "{text}");
        if newer["format"].is_u64() {
            assert!(text.contains("by ephemer-actors 9.9.9, newer than this build"), "{text}");
        }
        // redb's own header may be touched by an open; what the store holds is not.
        assert_eq!(
            raw_mark_and_jobs(&path),
            (newer.clone(), 1),
            "the mark and the jobs are left as they are"
        );
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().to_string())
            .collect();
        assert!(
            !names.iter().any(|n| n.contains("unreadable")),
            "nothing is moved aside: {names:?}"
        );
    }
}

/// A store an earlier build wrote (tests/data, written by the build before the format mark,
/// 7fe5e2c) opens with every record, and from then on carries this build's mark.
#[actix_rt::test]
async fn a_store_an_earlier_build_wrote_opens_with_every_record() {
    let golden = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/data/store-format1-7fe5e2c.redb");
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(&golden, dir.path().join(FILE)).unwrap();
    let snap = reopened(dir.path()).await;
    assert!(snap.moved_aside.is_none());
    let mut jobs = snap.jobs.clone();
    jobs.sort_by_key(|j| j.info.key.job_id);
    let ids: Vec<u64> = jobs.iter().map(|j| j.info.key.job_id).collect();
    assert_eq!(ids, vec![101, 102]);
    assert_eq!(jobs[0].received_unix, 1_700_000_010);
    assert_eq!(jobs[1].started_unix, Some(1_700_000_012));
    assert_eq!(snap.runners.len(), 1);
    assert_eq!(snap.runners[0].name, "ephemer-local-golden1");
    assert_eq!(snap.runners[0].intent, JobKey::new("acme", 101));
    assert_eq!(snap.retries.len(), 1);
    assert_eq!(snap.retries[0].job.key.job_id, 103);
    assert_eq!(snap.retries[0].class, ErrorClass::RateLimit);
    assert_eq!(
        snap.marks.get("redeliver_cursor"),
        Some(&serde_json::json!({ "last_id": 42 }))
    );
    assert!(!snap.marks.contains_key(open::FORMAT_MARK), "the mark is the store's own");
    // Wait for the writer to let go, then read the mark it left.
    let _ = reopened(dir.path()).await;
    let closed_path = dir.path().join(FILE);
    let mark = loop {
        match Database::create(&closed_path) {
            Ok(db) => {
                drop(db);
                break format_mark(&closed_path);
            }
            Err(_) => tokio::time::sleep(std::time::Duration::from_millis(20)).await,
        }
    };
    assert_eq!(mark, open::FormatMark::current());
}

/// The file gives back what finished jobs took: a burst of 3,000 jobs, all of them done, and
/// the next start leaves a file no bigger than an empty store's few pages.
#[actix_rt::test]
async fn a_start_compacts_what_finished_jobs_left() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(FILE);
    let empty = {
        let _ = reopened(dir.path()).await;
        let _ = reopened(dir.path()).await;
        std::fs::metadata(&path).unwrap().len()
    };
    {
        let (store, _) = loop {
            match Store::open(dir.path()) {
                Ok(pair) => break pair,
                Err(_) => tokio::time::sleep(std::time::Duration::from_millis(20)).await,
            }
        };
        for chunk in (1..=3_000u64).collect::<Vec<_>>().chunks(500) {
            store
                .write(chunk.iter().map(|id| add(*id)).collect())
                .await
                .unwrap();
        }
        store
            .write(
                (1..=3_000u64)
                    .map(|id| Op::DeleteJob(JobKey::new("acme", id)))
                    .collect(),
            )
            .await
            .unwrap();
        let closed = store.closed();
        drop(store);
        assert!(closed.wait(std::time::Duration::from_secs(10)).await);
    }
    let burst = std::fs::metadata(&path).unwrap().len();
    let snap = reopened(dir.path()).await;
    assert!(snap.jobs.is_empty());
    let after = std::fs::metadata(&path).unwrap().len();
    assert!(
        burst > 4 * empty && after <= 2 * empty,
        "empty {empty} B, after the burst {burst} B, after the start {after} B"
    );
}

fn usage(id: u64, repo: &str, ended: u64, minutes: u64) -> UsageRow {
    UsageRow {
        job: JobKey::new("acme", id),
        repo: repo.into(),
        pool: "local".into(),
        target: "acme".into(),
        queued_unix: ended - 100,
        ended_unix: ended,
        runner_ms: minutes * 60_000,
        retries: 0,
        pickup_ms: Some(500),
    }
}

/// Usage rows outlive a reopen, are read from a time on, and the prune forgets those older
/// than its mark; a read comes after the writes sent before it.
#[actix_rt::test]
async fn usage_rows_are_kept_read_by_time_and_pruned() {
    let dir = tempfile::tempdir().unwrap();
    let closed = {
        let (store, _) = Store::open(dir.path()).unwrap();
        store.send(vec![
            Op::PutUsage(usage(1, "app", 1_000, 10)),
            Op::PutUsage(usage(2, "web", 2_000, 20)),
            Op::PutUsage(usage(3, "app", 3_000, 30)),
            // Job 3's completion again (a redelivery after a restart): its row is kept as it was.
            Op::PutUsage(usage(3, "app", 3_500, 99)),
        ]);
        let all = store.usage_since(0).await.unwrap();
        assert_eq!(all.iter().map(|r| r.job.job_id).collect::<Vec<_>>(), [1, 2, 3]);
        let lines = crate::usage::summarize(&all, crate::usage::UsageBy::Repo);
        assert_eq!(
            lines.iter().map(|l| (l.key.as_str(), l.runner_minutes)).collect::<Vec<_>>(),
            [("acme/app", 40.0), ("acme/web", 20.0)]
        );
        let late = store.usage_since(2_000).await.unwrap();
        assert_eq!(late.iter().map(|r| r.job.job_id).collect::<Vec<_>>(), [2, 3]);
        store.closed()
    };
    assert!(closed.wait(std::time::Duration::from_secs(10)).await);
    let (store, _) = Store::open(dir.path()).unwrap();
    assert_eq!(store.usage_since(0).await.unwrap().len(), 3);
    store.send(vec![Op::PruneUsage(2_500)]);
    let kept = store.usage_since(0).await.unwrap();
    assert_eq!(kept.iter().map(|r| r.job.job_id).collect::<Vec<_>>(), [3]);
    // A pruned job's completion may be written again (its index went with it).
    store.send(vec![Op::PutUsage(usage(1, "app", 4_000, 10))]);
    assert_eq!(store.usage_since(0).await.unwrap().len(), 2);
}
