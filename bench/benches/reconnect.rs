//! A subscriber's reconnect near the head of a long WAL: the CPU its replay costs when it
//! reads from the session's nearest seek point (what serve does for a live session: the hub
//! keeps a point every 256 records) against reading every record from the first (what it did
//! before, and still does for a session whose actor is closed). Each replay reads the WAL
//! with broca's paged reader, decodes every record it passes and projects its control units,
//! as the hub's replay does; the file is in the page cache.
//!
//! Run: `cargo bench -p broca-bench --bench reconnect` (BROCA_BENCH_RECORDS changes the WAL's
//! length, default 100,000 records; the cursor is 200 records before the head).

use std::time::Duration;

use broca::read::project::units;
use broca::wal::frame::write_frame;
use broca::wal::header::WalHeader;
use broca::wal::reader::PagedReader;
use broca::wal::record::LeaseAcquired;
use broca::wal::{Record, SessionTriple};
use broca_bench::percentile;

const PAGE_BYTES: usize = 64 * 1024;
const ROUNDS: usize = 41;

/// CPU time of this thread.
fn thread_cpu() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the timespec it is given.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// Replays from `start` (a seek point) or from the first record, sending nothing: answers the
/// units projected after `cursor_seq`.
fn replay(path: &std::path::Path, start: Option<(u64, u64)>, cursor_seq: u64) -> usize {
    let mut reader = match start {
        Some((seq, offset)) => PagedReader::open_from(path, seq, offset),
        None => PagedReader::open_if_any(path),
    }
    .unwrap()
    .unwrap();
    let mut n = 0;
    loop {
        let page = reader.next_records(PAGE_BYTES).unwrap();
        if page.is_empty() {
            return n;
        }
        for (seq, record) in &page {
            if *seq > cursor_seq {
                n += units(*seq, record).len();
            }
        }
    }
}

fn main() {
    let records: u64 = std::env::var("BROCA_BENCH_RECORDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100_000);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("session.wal");
    let triple = SessionTriple::new("/bench", "h", "s").unwrap();
    let header = WalHeader::new(triple, 1);
    let tag = header.lineage_tag();
    let mut image = header.encode();
    image.resize(header.data_offset as usize, 0);
    let mut offsets = Vec::with_capacity(records as usize);
    for seq in 1..=records {
        let record = Record::LeaseAcquired(LeaseAcquired {
            epoch: 1,
            pid: 1,
            at_unix_ms: 1_700_000_000_000 + seq,
            cut: None,
        });
        let (kind, mut payload) = (record.kind(), Vec::new());
        record.encode_payload(&mut payload);
        let at = image.len();
        offsets.push(at as u64);
        image.resize(at + 40 + payload.len(), 0);
        write_frame(&mut image[at..], seq, tag, at as u64, 1, kind, &payload);
    }
    std::fs::write(&path, &image).unwrap();
    // Both ways read the same records after the cursor.
    assert_eq!(
        replay(&path, None, records - 200),
        replay(&path, Some((1, header.data_offset)), records - 200)
    );
    let cursor = records - 200;
    // The hub's nearest point at or before the cursor: a multiple of 256.
    let point_seq = (cursor / 256) * 256;
    let point = (point_seq, offsets[(point_seq - 1) as usize]);
    let measure = |start: Option<(u64, u64)>| {
        let mut times = Vec::with_capacity(ROUNDS);
        for _ in 0..ROUNDS {
            let t = thread_cpu();
            std::hint::black_box(replay(&path, start, cursor));
            times.push(thread_cpu() - t);
        }
        times.sort();
        (percentile(&times, 50.0), percentile(&times, 99.0))
    };
    let (all50, all99) = measure(None);
    let (seek50, seek99) = measure(Some(point));
    println!(
        "reconnect near the head of a {records}-record WAL ({} MB), cursor {cursor}, CPU per replay (median / p99 of {ROUNDS}):",
        image.len() / 1_000_000
    );
    println!("  from the first record: {all50:?} / {all99:?}");
    println!("  from the seek point (seq {point_seq}): {seek50:?} / {seek99:?}");
}
