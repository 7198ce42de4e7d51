//! A failed fdatasync or write is fatal for the log: never retried, every waiter gets the error,
//! later appends are refused, and a reopen recovers everything that was acknowledged.

use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use broca_io::{Committer, FaultHook, FaultPoint, LogConfig};
use broca_shards::run_local;
use broca_wal::verify::read_and_scan;
use broca_wal::{Record, SessionTriple, Verdict, WalError};
use broca_wal_writer::wal_path;
use broca_wal_writer::WalWriter;

fn note(i: usize) -> Record {
    Record::Unknown {
        kind: 900,
        payload: format!("{{\"n\":{i}}}").into_bytes(),
    }
}

/// Fails the `fail_at`th batch fdatasync (1-based) with `errno`, and counts every sync.
fn failing_sync(fail_at: u64, errno: i32) -> (LogConfig, Arc<AtomicU64>) {
    let syncs = Arc::new(AtomicU64::new(0));
    let seen = syncs.clone();
    let hook = FaultHook(Arc::new(move |point| match point {
        FaultPoint::Sync => {
            let n = seen.fetch_add(1, Ordering::SeqCst) + 1;
            (n == fail_at).then(|| io::Error::from_raw_os_error(errno))
        }
        FaultPoint::Write { .. } | FaultPoint::Written { .. } => None,
    }));
    (
        LogConfig {
            faults: Some(hook),
            ..LogConfig::default()
        },
        syncs,
    )
}

#[test]
fn a_failed_fdatasync_kills_the_log_and_is_never_retried() {
    let dir = tempfile::tempdir().unwrap();
    let t = SessionTriple::new("/proj", "faults", "eio").unwrap();
    // Sync 1 is the lease record; syncs 2 and 3 are notes 0 and 1; sync 4 fails.
    let (cfg, syncs) = failing_sync(4, libc::EIO);
    run_local(async {
        let (mut w, _) = WalWriter::open(dir.path(), &t, cfg, Committer::default())
            .await
            .unwrap();
        w.append_durable(&note(0)).await.unwrap();
        w.append_durable(&note(1)).await.unwrap();
        let err = w.append_durable(&note(2)).await.unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("fdatasync") && msg.contains(".wal"), "{msg}");
        assert!(matches!(err, WalError::Closed { .. }), "{err:?}");
        // The log is dead: appends are refused, and the sync is never tried again.
        let again = w.append_durable(&note(3)).await.unwrap_err();
        assert!(again.to_string().contains("closed for writing"), "{again}");
        assert_eq!(
            syncs.load(Ordering::SeqCst),
            4,
            "a failed fdatasync was retried"
        );
        assert!(w.log().dead().is_some());
    })
    .unwrap();
    // A reopen (without faults) recovers every acknowledged record.
    let (_, scan) = read_and_scan(&wal_path(dir.path(), &t)).unwrap();
    assert!(
        !matches!(scan.verdict, Verdict::Corrupt { .. }),
        "{:?}",
        scan.verdict
    );
    assert!(
        scan.frames.len() >= 3,
        "acknowledged records lost: {}",
        scan.frames.len()
    );
    run_local(async {
        let (w, rec) = WalWriter::open(dir.path(), &t, LogConfig::default(), Committer::default())
            .await
            .unwrap();
        assert!(rec.scan.unwrap().frames.len() >= 3);
        assert_eq!(w.epoch(), 2);
        w.close().await.unwrap();
    })
    .unwrap();
}

#[test]
fn a_write_that_finds_no_space_fails_every_waiter_of_its_batch_with_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let t = SessionTriple::new("/proj", "faults", "enospc").unwrap();
    let writes = Arc::new(AtomicU64::new(0));
    let seen = writes.clone();
    let hook = FaultHook(Arc::new(move |point| match point {
        FaultPoint::Write { .. } => {
            let n = seen.fetch_add(1, Ordering::SeqCst) + 1;
            (n >= 2).then(|| io::Error::from_raw_os_error(libc::ENOSPC))
        }
        FaultPoint::Sync | FaultPoint::Written { .. } => None,
    }));
    let cfg = LogConfig {
        faults: Some(hook),
        ..LogConfig::default()
    };
    run_local(async {
        let (mut w, _) = WalWriter::open(dir.path(), &t, cfg, Committer::default())
            .await
            .unwrap();
        let mut ends = Vec::new();
        for i in 0..10 {
            ends.push(w.append(&note(i)).await.unwrap().end);
        }
        for end in ends {
            let err = w.wait_durable(end).await.unwrap_err();
            assert!(matches!(err, WalError::StorageFull { .. }), "{err:?}");
            assert!(err.to_string().contains("the file system is full"), "{err}");
        }
    })
    .unwrap();
    let (_, scan) = read_and_scan(&wal_path(dir.path(), &t)).unwrap();
    assert_eq!(
        (scan.verdict, scan.frames.len()),
        (Verdict::Clean, 1),
        "only the lease record"
    );
}
