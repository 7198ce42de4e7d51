//! A crash at every byte and every sector of the in-flight window: recovery yields exactly the
//! records wholly on disk, never reports corruption, and a reopened log appends after them.

use broca::wal::verify::read_and_scan;
use broca::wal::writer::wal_path;
use broca::wal::{scan, SessionTriple, Verdict, WalWriter};
use broca_crash_tests::{note, write_two_part};
use broca_io::{Committer, LogConfig};
use broca_shards::run_local;

fn triple() -> SessionTriple {
    SessionTriple::new("/proj", "crash", "torn").unwrap()
}

#[test]
fn a_crash_at_every_byte_of_the_in_flight_batch_keeps_exactly_the_whole_records() {
    let dir = tempfile::tempdir().unwrap();
    let wal = write_two_part(dir.path(), &triple(), 12, 8);
    let full = scan(&wal.bytes).unwrap();
    let (p, t) = (wal.batch_start as usize, wal.batch_end as usize);
    assert!(t > p);
    let mut reopened = 0;
    for k in p..=t {
        let mut img = wal.bytes.clone();
        img[k..t].fill(0); // the write reached byte k; pre-zeroed space holds zeros beyond
        let s = scan(&img).unwrap();
        let whole = full
            .frames
            .iter()
            .filter(|f| (f.offset + f.len) as usize <= k)
            .count();
        assert_eq!(s.frames.len(), whole, "cut at byte {k}");
        assert!(
            s.frames.len() >= wal.durable_records,
            "an acknowledged record was lost at {k}"
        );
        assert_eq!(&s.frames[..], &full.frames[..whole]);
        assert!(
            !matches!(s.verdict, Verdict::Corrupt { .. }),
            "cut at {k}: {:?}",
            s.verdict
        );

        // A reopened log appends after the durable prefix (every 5th cut: each open fsyncs).
        if k % 5 == 0 || k == t {
            let d = tempfile::tempdir().unwrap();
            std::fs::write(wal_path(d.path(), &triple()), &img).unwrap();
            run_local(async {
                let (mut w, rec) = WalWriter::open(
                    d.path(),
                    &triple(),
                    LogConfig::default(),
                    Committer::default(),
                )
                .await
                .unwrap();
                assert_eq!(rec.scan.as_ref().unwrap().frames.len(), whole);
                w.append_durable(&note(999)).await.unwrap();
                w.close().await.unwrap();
            })
            .unwrap();
            let (_, after) = read_and_scan(&wal_path(d.path(), &triple())).unwrap();
            assert_eq!(
                after.verdict,
                Verdict::Clean,
                "after reopening a cut at {k}"
            );
            assert_eq!(
                after.frames.len(),
                whole + 2,
                "the lease record and the new record"
            );
            assert_eq!(&after.frames[..whole], &full.frames[..whole]);
            let seqs: Vec<u64> = after.frames.iter().map(|f| f.seq).collect();
            assert_eq!(seqs, (1..=(whole as u64 + 2)).collect::<Vec<_>>());
            reopened += 1;
        }
    }
    assert!(reopened > 10);
}

#[test]
fn a_crash_that_tears_the_batch_at_any_set_of_sectors_never_reads_as_corruption() {
    let dir = tempfile::tempdir().unwrap();
    let wal = write_two_part(dir.path(), &triple(), 5, 30);
    let full = scan(&wal.bytes).unwrap();
    let sector = 512usize;
    let (p, t) = (wal.batch_start as usize, wal.batch_end as usize);
    let first = p / sector;
    let last = t.div_ceil(sector);
    let sectors = last - first;
    assert!(
        (2..=12).contains(&sectors),
        "the batch spans {sectors} sectors"
    );
    let mut old = wal.bytes.clone();
    old[p..t].fill(0);
    for mask in 0u32..(1 << sectors) {
        let mut img = old.clone();
        for s in 0..sectors {
            if mask & (1 << s) != 0 {
                let range = (first + s) * sector..(first + s + 1) * sector;
                img[range.clone()].copy_from_slice(&wal.bytes[range]);
            }
        }
        let got = scan(&img).unwrap();
        assert!(
            !matches!(got.verdict, Verdict::Corrupt { .. }),
            "mask {mask:b}: {:?}",
            got.verdict
        );
        assert!(
            got.frames.len() >= wal.durable_records,
            "mask {mask:b} lost a durable record"
        );
        assert_eq!(
            &got.frames[..],
            &full.frames[..got.frames.len()],
            "mask {mask:b}"
        );
    }
}
