//! Damage outside the in-flight window is corruption, reported with its offset, never a
//! shorter log; bad files of every sort get a clear error or a clean recovery, never a panic.

use broca::wal::writer::wal_path;
use broca::wal::{scan, HeaderError, SessionTriple, Verdict, WalError, WalWriter};
use broca_crash_tests::write_two_part;
use broca_io::{Committer, LogConfig};
use broca_shards::run_local;

fn triple(s: &str) -> SessionTriple {
    SessionTriple::new("/proj", "crash", s).unwrap()
}

#[test]
fn a_flipped_bit_in_any_record_before_the_window_is_corruption_at_that_record() {
    let dir = tempfile::tempdir().unwrap();
    // 25 records each durable on its own, then a last batch of one record: the window.
    let wal = write_two_part(dir.path(), &triple("flip"), 25, 1);
    let clean = scan(&wal.bytes).unwrap();
    assert_eq!(clean.verdict, Verdict::Clean);
    let window_start = wal.batch_start as usize;
    let data_start = clean.header.data_offset as usize;
    let mut checked = 0;
    for byte in data_start..window_start {
        for bit in [byte % 8, (byte + 3) % 8] {
            let mut img = wal.bytes.clone();
            img[byte] ^= 1 << bit;
            let got = scan(&img).unwrap();
            let owner = clean
                .frames
                .iter()
                .find(|f| (f.offset as usize..(f.offset + f.len) as usize).contains(&byte));
            let owner = owner.expect("every byte before the window is in a record");
            match &got.verdict {
                Verdict::Corrupt { .. } => {}
                other => panic!("bit {bit} of byte {byte}: {other:?}, expected corruption"),
            }
            assert_eq!(
                got.end, owner.offset,
                "bit {bit} of byte {byte}: wrong offset"
            );
            checked += 1;
        }
    }
    assert!(checked > 1000);
}

#[test]
fn a_writer_refuses_to_open_a_corrupt_log_and_leaves_its_bytes_alone() {
    let dir = tempfile::tempdir().unwrap();
    let t = triple("refuse");
    let wal = write_two_part(dir.path(), &t, 10, 1);
    let mut img = wal.bytes.clone();
    let target = scan(&img).unwrap().frames[3].clone();
    img[target.offset as usize + 45] ^= 0x10;
    let path = wal_path(dir.path(), &t);
    std::fs::write(&path, &img).unwrap();
    let err = run_local(async {
        WalWriter::open(dir.path(), &t, LogConfig::default(), Committer::default())
            .await
            .err()
    })
    .unwrap()
    .expect("a corrupt log is refused");
    match &err {
        WalError::Corrupt {
            offset, path: p, ..
        } => {
            assert_eq!(*offset, target.offset);
            assert_eq!(p, &path);
        }
        other => panic!("expected corruption, got {other:?}"),
    }
    let msg = err.to_string();
    assert!(
        msg.contains(&format!("offset {}", target.offset)) && msg.contains(".wal"),
        "{msg}"
    );
    assert_eq!(
        std::fs::read(&path).unwrap(),
        img,
        "a refused open changed the file"
    );
}

#[test]
fn records_of_another_lineage_after_the_tail_are_named_as_foreign() {
    let dir = tempfile::tempdir().unwrap();
    let a = write_two_part(dir.path(), &triple("a"), 3, 1);
    // The same session recreated elsewhere: same triple, a fresh lineage.
    let other_dir = tempfile::tempdir().unwrap();
    let b = write_two_part(other_dir.path(), &triple("a"), 3, 1);
    let a_scan = scan(&a.bytes).unwrap();
    let b_scan = scan(&b.bytes).unwrap();
    let mut img = a.bytes.clone();
    let b_frames = &b.bytes[b_scan.header.data_offset as usize..b_scan.end as usize];
    let at = a_scan.end as usize;
    img[at..at + b_frames.len()].copy_from_slice(b_frames);
    let got = scan(&img).unwrap();
    match got.verdict {
        Verdict::Corrupt {
            reason: broca::wal::Corruption::ForeignLineage { found, expected },
        } => assert_ne!(found, expected),
        other => panic!("expected foreign lineage, got {other:?}"),
    }
    assert_eq!(got.end, a_scan.end);
    assert_eq!(got.frames, a_scan.frames);
}

#[test]
fn zeros_and_garbage_after_the_tail_recover_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    let t = triple("garbage");
    let wal = write_two_part(dir.path(), &t, 4, 2);
    let clean = scan(&wal.bytes).unwrap();
    let end = clean.end as usize;

    let mut zeros = wal.bytes.clone();
    zeros.extend(std::iter::repeat_n(0u8, 100_000));
    let got = scan(&zeros).unwrap();
    assert_eq!(
        (got.verdict, got.frames.len()),
        (Verdict::Clean, clean.frames.len())
    );

    let mut garbage = wal.bytes.clone();
    let mut x = 0x2545_F491_4F6C_DD1Du64;
    for b in garbage[end..end + 3000].iter_mut() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        *b = x as u8;
    }
    let got = scan(&garbage).unwrap();
    assert!(
        matches!(got.verdict, Verdict::Torn { .. }),
        "{:?}",
        got.verdict
    );
    assert_eq!(got.frames, clean.frames);

    // The lease holder cuts it and goes on.
    std::fs::write(wal_path(dir.path(), &t), &garbage).unwrap();
    let cut = run_local(async {
        let (w, rec) = WalWriter::open(dir.path(), &t, LogConfig::default(), Committer::default())
            .await
            .unwrap();
        w.close().await.unwrap();
        rec.cut
    })
    .unwrap()
    .expect("the cut is recorded");
    assert_eq!(cut.at_offset, end as u64);
    let after = scan(&std::fs::read(wal_path(dir.path(), &t)).unwrap()).unwrap();
    assert_eq!(after.verdict, Verdict::Clean);
    assert_eq!(after.frames.len(), clean.frames.len() + 1);
}

#[test]
fn truncated_headers_empty_files_and_other_files_are_clear_errors() {
    let dir = tempfile::tempdir().unwrap();
    let wal = write_two_part(dir.path(), &triple("h"), 1, 1);
    let header_len = scan(&wal.bytes).unwrap().header.encoded_len();
    for len in 1..header_len {
        match scan(&wal.bytes[..len]) {
            Err(HeaderError::Truncated { .. } | HeaderError::NotAWal) => {}
            other => panic!("a header cut at {len} gave {other:?}"),
        }
    }
    assert!(matches!(scan(&[]), Err(HeaderError::Empty)));
    assert!(matches!(
        scan(&[0u8; 8192]),
        Err(HeaderError::Uninitialized)
    ));
    assert!(matches!(
        scan(b"#!/bin/sh\necho hello\n"),
        Err(HeaderError::NotAWal)
    ));
    // A header whose data region was cut away.
    assert!(matches!(
        scan(&wal.bytes[..header_len + 10]),
        Err(HeaderError::Truncated { .. })
    ));
}

#[test]
fn a_writer_initializes_an_empty_or_all_zero_file_left_by_a_crash_at_creation() {
    for contents in [Vec::new(), vec![0u8; 4096]] {
        let dir = tempfile::tempdir().unwrap();
        let t = triple("init");
        std::fs::write(wal_path(dir.path(), &t), &contents).unwrap();
        run_local(async {
            let (w, rec) =
                WalWriter::open(dir.path(), &t, LogConfig::default(), Committer::default())
                    .await
                    .unwrap();
            assert!(rec.scan.is_none());
            w.close().await.unwrap();
        })
        .unwrap();
        let got = scan(&std::fs::read(wal_path(dir.path(), &t)).unwrap()).unwrap();
        assert_eq!((got.verdict, got.frames.len()), (Verdict::Clean, 1));
    }
}
