//! The WAL writer on real files with real O_DIRECT and fdatasync, in temp dirs.

use std::path::Path;

use broca_io::log::DirectIo;
use broca_io::{Committer, LogConfig};
use broca_shards::run_local;
use broca_wal::record::{kind, LeaseAcquired};
use broca_wal::verify::read_and_scan;
use broca_wal::{Record, SessionTriple, Verdict, WalError};
use broca_wal_writer::wal_path;
use broca_wal_writer::WalWriter;

fn triple(session: &str) -> SessionTriple {
    SessionTriple::new("/proj", "test", session).unwrap()
}

fn note(i: usize) -> Record {
    Record::Unknown {
        kind: 900,
        payload: format!("{{\"note\":{i}}}").into_bytes(),
    }
}

fn write_notes(dir: &Path, t: &SessionTriple, n: usize, cfg: LogConfig) -> u32 {
    run_local(async {
        let (mut w, _) = WalWriter::open(dir, t, cfg, Committer::default())
            .await
            .unwrap();
        for i in 0..n {
            w.append(&note(i)).await.unwrap();
        }
        let epoch = w.epoch();
        w.close().await.unwrap();
        epoch
    })
    .unwrap()
}

#[test]
fn records_survive_a_reopen_and_each_open_takes_a_new_epoch() {
    let dir = tempfile::tempdir().unwrap();
    let t = triple("a");
    assert_eq!(write_notes(dir.path(), &t, 100, LogConfig::default()), 1);
    assert_eq!(write_notes(dir.path(), &t, 50, LogConfig::default()), 2);

    let (bytes, scan) = read_and_scan(&wal_path(dir.path(), &t)).unwrap();
    assert_eq!(scan.verdict, Verdict::Clean);
    assert_eq!(scan.frames.len(), 1 + 100 + 1 + 50);
    assert_eq!(scan.epoch_max, 2);
    let seqs: Vec<u64> = scan.frames.iter().map(|f| f.seq).collect();
    assert_eq!(seqs, (1..=152).collect::<Vec<_>>());
    let decoded = scan.decode(&bytes).unwrap();
    assert_eq!(
        decoded.unknown_kinds, 150,
        "unknown kinds are skipped and counted"
    );
    let leases: Vec<u32> = decoded
        .records
        .iter()
        .map(|(_, r)| match r {
            Record::LeaseAcquired(LeaseAcquired { epoch, .. }) => *epoch,
            other => panic!("unexpected record {other:?}"),
        })
        .collect();
    assert_eq!(leases, vec![1, 2]);
    assert_eq!(scan.frames[0].kind, kind::LEASE_ACQUIRED);
    let payload = &bytes[scan.frames[1 + 42].payload.clone()];
    assert_eq!(payload, b"{\"note\":42}");
}

#[test]
fn the_header_names_the_session_and_a_wrong_triple_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let t = triple("a");
    write_notes(dir.path(), &t, 1, LogConfig::default());
    let (_, scan) = read_and_scan(&wal_path(dir.path(), &t)).unwrap();
    assert_eq!(scan.header.triple, t);
    assert_eq!(scan.header.address, t.address());

    // Put a's WAL where b's belongs: the writer for b must refuse it.
    let b = triple("b");
    std::fs::copy(wal_path(dir.path(), &t), wal_path(dir.path(), &b)).unwrap();
    let err = run_local(async {
        WalWriter::open(dir.path(), &b, LogConfig::default(), Committer::default())
            .await
            .err()
    })
    .unwrap();
    assert!(
        matches!(err, Some(WalError::WrongSession { .. })),
        "{err:?}"
    );
}

#[test]
fn files_and_directories_are_owner_only_and_the_file_is_durable_at_creation() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let t = triple("a");
    write_notes(dir.path(), &t, 0, LogConfig::default());
    let mode = std::fs::metadata(wal_path(dir.path(), &t))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);
}

#[test]
fn many_concurrent_appends_share_fdatasyncs_and_all_become_durable() {
    let dir = tempfile::tempdir().unwrap();
    let t = triple("group");
    let committer = Committer::default();
    let c2 = committer.clone();
    run_local(async move {
        let (mut w, _) = WalWriter::open(dir.path(), &t, LogConfig::default(), c2)
            .await
            .unwrap();
        let before = committer.stats().fsyncs;
        let mut ends = Vec::new();
        for i in 0..512 {
            ends.push(w.append(&note(i)).await.unwrap().end);
        }
        w.wait_durable(*ends.last().unwrap()).await.unwrap();
        let fsyncs = committer.stats().fsyncs - before;
        assert!(
            fsyncs <= 2,
            "512 appends in one tick took {fsyncs} fdatasyncs"
        );
        assert!(w.log().durable_end() >= *ends.last().unwrap());
        w.close().await.unwrap();
        let (_, scan) = read_and_scan(&wal_path(dir.path(), &t)).unwrap();
        assert_eq!(scan.frames.len(), 513);
    })
    .unwrap();
}

#[test]
fn deferred_appends_ride_on_the_next_urgent_one_or_get_a_write_of_their_own_in_time() {
    let dir = tempfile::tempdir().unwrap();
    let t = triple("deferred");
    let committer = Committer::default();
    let c2 = committer.clone();
    let defer_max = std::time::Duration::from_secs(2);
    let cfg = LogConfig {
        defer_max,
        ..LogConfig::default()
    };
    run_local(async move {
        let (mut w, _) = WalWriter::open(dir.path(), &t, cfg, c2).await.unwrap();
        let fsyncs = || committer.stats().fsyncs;
        // A deferred append alone is not written at once...
        let before = fsyncs();
        let a = w.append_deferred(&note(1)).await.unwrap().end;
        glommio::timer::sleep(std::time::Duration::from_millis(50)).await;
        assert!(
            w.log().durable_end() < a,
            "a deferred append was written at once"
        );
        // ...and rides on the next urgent append: one fdatasync for both.
        let b = w.append(&note(2)).await.unwrap().end;
        w.wait_durable(b).await.unwrap();
        assert!(w.log().durable_end() >= b);
        assert_eq!(fsyncs() - before, 1, "two appends, one of them urgent");
        // Waiting for a deferred append writes it now, not when its time runs out.
        let c = w.append_deferred(&note(3)).await.unwrap().end;
        let started = std::time::Instant::now();
        w.wait_durable(c).await.unwrap();
        assert!(started.elapsed() < defer_max / 2);
        // A deferred append that nothing follows or waits for becomes durable on its own
        // (a watch waits without hurrying it).
        let before = fsyncs();
        let d = w.append_deferred(&note(4)).await.unwrap().end;
        w.watch().wait_durable(d).await.unwrap();
        assert_eq!(fsyncs() - before, 1);
        w.close().await.unwrap();
        let (_, scan) = read_and_scan(&wal_path(dir.path(), &t)).unwrap();
        assert_eq!(scan.frames.len(), 5, "the lease record and the four notes");
    })
    .unwrap();
}

#[test]
fn appends_larger_than_a_batch_wait_for_room_and_keep_their_order() {
    let dir = tempfile::tempdir().unwrap();
    let t = triple("room");
    let cfg = LogConfig {
        batch_bytes_max: 4096,
        ..LogConfig::default()
    };
    write_notes(dir.path(), &t, 2_000, cfg);
    let (_, scan) = read_and_scan(&wal_path(dir.path(), &t)).unwrap();
    assert_eq!(scan.verdict, Verdict::Clean);
    assert_eq!(scan.frames.len(), 2_001);
}

#[test]
fn buffered_fallback_writes_the_same_log() {
    let dir = tempfile::tempdir().unwrap();
    let t = triple("buffered");
    let cfg = LogConfig {
        direct_io: DirectIo::Off,
        ..LogConfig::default()
    };
    write_notes(dir.path(), &t, 10, cfg.clone());
    write_notes(dir.path(), &t, 10, LogConfig::default());
    write_notes(dir.path(), &t, 10, cfg);
    let (_, scan) = read_and_scan(&wal_path(dir.path(), &t)).unwrap();
    assert_eq!(scan.verdict, Verdict::Clean);
    assert_eq!(scan.frames.len(), 33);
    assert_eq!(scan.epoch_max, 3);
}

#[test]
fn a_second_writer_in_another_thread_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let t = triple("lease");
    let path = dir.path().to_path_buf();
    let t2 = t.clone();
    let (held_tx, held_rx) = std::sync::mpsc::channel();
    let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
    let holder = std::thread::spawn(move || {
        run_local(async move {
            let (w, _) = WalWriter::open(&path, &t2, LogConfig::default(), Committer::default())
                .await
                .unwrap();
            held_tx.send(()).unwrap();
            release_rx.recv().unwrap();
            w.close().await.unwrap();
        })
        .unwrap()
    });
    held_rx.recv().unwrap();
    let err = run_local(async {
        WalWriter::open(dir.path(), &t, LogConfig::default(), Committer::default())
            .await
            .err()
    })
    .unwrap();
    match err {
        Some(e @ WalError::LeaseHeld { .. }) => {
            assert!(e.to_string().contains("another writer holds"), "{e}")
        }
        other => panic!("expected LeaseHeld, got {other:?}"),
    }
    release_tx.send(()).unwrap();
    holder.join().unwrap();
    assert_eq!(write_notes(dir.path(), &t, 1, LogConfig::default()), 2);
}

#[test]
fn a_writer_whose_file_was_replaced_is_refused_as_stale() {
    let dir = tempfile::tempdir().unwrap();
    let t = triple("fence");
    let path = wal_path(dir.path(), &t);
    run_local(async {
        let (mut w, _) =
            WalWriter::open(dir.path(), &t, LogConfig::default(), Committer::default())
                .await
                .unwrap();
        w.append_durable(&note(0)).await.unwrap();
        // Another writer's copy takes the path over (a restore, a second host...).
        let copy = dir.path().join("copy");
        std::fs::copy(&path, &copy).unwrap();
        std::fs::rename(&copy, &path).unwrap();
        let err = w.append_durable(&note(1)).await.unwrap_err();
        assert!(
            err.to_string().contains("stale writer") || matches!(err, WalError::LeaseStale { .. }),
            "{err}"
        );
    })
    .unwrap();
    // The replacing file holds what was durable before, untouched by the stale writer.
    let (_, scan) = read_and_scan(&path).unwrap();
    assert_eq!(scan.frames.len(), 2);
}

#[test]
fn a_writer_whose_file_was_removed_is_refused_as_stale() {
    let dir = tempfile::tempdir().unwrap();
    let t = triple("removed");
    run_local(async {
        let (mut w, _) =
            WalWriter::open(dir.path(), &t, LogConfig::default(), Committer::default())
                .await
                .unwrap();
        w.append_durable(&note(0)).await.unwrap();
        std::fs::remove_file(wal_path(dir.path(), &t)).unwrap();
        let err = w.append_durable(&note(1)).await.unwrap_err();
        assert!(err.to_string().contains("stale writer"), "{err}");
    })
    .unwrap();
}

#[test]
fn close_makes_every_append_durable_and_the_seq_counts_each_record() {
    let dir = tempfile::tempdir().unwrap();
    let t = triple("close");
    let path = wal_path(dir.path(), &t);
    let on_disk = run_local(async {
        let (mut w, _) =
            WalWriter::open(dir.path(), &t, LogConfig::default(), Committer::default())
                .await
                .unwrap();
        assert_eq!(w.next_seq(), 2, "the lease record took seq 1");
        for i in 0..10 {
            let appended = w.append(&note(i)).await.unwrap();
            assert_eq!(appended.seq, 2 + i as u64);
        }
        assert_eq!(w.next_seq(), 12);
        // Nothing waited for the disk; close does, before it returns.
        w.close().await.unwrap();
        read_and_scan(&path).unwrap().1.frames.len()
    })
    .unwrap();
    assert_eq!(
        on_disk, 11,
        "every append is in the file once close returned"
    );
}

#[test]
fn a_payload_at_the_frame_limit_is_taken_and_one_byte_more_is_refused() {
    use broca_wal::frame::{FRAME_HEADER_BYTES, PAYLOAD_BYTES_MAX};
    let dir = tempfile::tempdir().unwrap();
    let t = triple("big");
    // The default batch: a record larger than a batch is written as a batch of its own.
    let cfg = LogConfig::default();
    assert!(cfg.batch_bytes_max < PAYLOAD_BYTES_MAX + FRAME_HEADER_BYTES);
    run_local(async {
        let (mut w, _) = WalWriter::open(dir.path(), &t, cfg, Committer::default())
            .await
            .unwrap();
        let small = Record::Unknown {
            kind: 900,
            payload: vec![b's'; 100],
        };
        w.append_deferred(&small).await.unwrap();
        let at_limit = Record::Unknown {
            kind: 900,
            payload: vec![b'x'; PAYLOAD_BYTES_MAX],
        };
        w.append(&at_limit).await.unwrap();
        w.append(&small).await.unwrap();
        let over = Record::Unknown {
            kind: 900,
            payload: vec![b'x'; PAYLOAD_BYTES_MAX + 1],
        };
        let err = w.append(&over).await.unwrap_err();
        assert!(
            matches!(err, WalError::TooLarge { bytes, .. } if bytes == PAYLOAD_BYTES_MAX + 1),
            "{err}"
        );
        w.close().await.unwrap();
    })
    .unwrap();
    let (_, scan) = read_and_scan(&wal_path(dir.path(), &t)).unwrap();
    assert_eq!(scan.verdict, Verdict::Clean);
    assert_eq!(
        scan.frames.len(),
        4,
        "the lease, a small record, the record at the limit, a small record"
    );
}
