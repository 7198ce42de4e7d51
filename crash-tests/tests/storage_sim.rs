//! Seeded storage faults over real WAL files, through the same recovery scan a writer runs at
//! open. A log is written in batches, each ended by a barrier (its fdatasync); the file image is
//! kept at every barrier. A simulated crash picks a barrier, then builds the disk image a
//! storage device may leave when the next batch was in flight:
//!
//! - lost writes: the in-flight batch missing, whole or in part;
//! - reordered and torn writes: each 512-byte sector of the window independently old or new;
//! - zeros or garbage after the tail, as a file that grew may hold;
//! - a bit flipped outside the window, in bytes a later record attests durable.
//!
//! Recovery must keep every record durable at the barrier, never invent one, call window-only
//! damage a torn tail (never corruption), and report a flip outside the window as corruption at
//! or before the flipped byte (never cut it off as a tail). Fsync EIO and ENOSPC are covered by
//! tests/wal_faults.rs over the live writer. `BROCA_SIM_FAULT_SEEDS` sets the crashes (default
//! 400). The output ends with the counts.

use broca::wal::{scan, SessionTriple, Verdict, WalWriter};
use broca_crash_tests::{mix, note, Rng};
use broca_io::{Committer, LogConfig};
use broca_shards::run_local;

const SECTOR: usize = 512;

/// The file's bytes at each barrier, and the records durable there.
struct Barriers {
    images: Vec<Vec<u8>>,
    records: Vec<usize>,
}

fn write_batches(dir: &std::path::Path, batches: usize, seed: u64) -> Barriers {
    let triple = SessionTriple::new("/sim", "faults", format!("s{seed}")).unwrap();
    let path = broca::wal::writer::wal_path(dir, &triple);
    let mut rng = Rng(seed);
    let mut images = Vec::new();
    let mut records = Vec::new();
    let sizes: Vec<usize> = (0..batches).map(|_| 1 + rng.below(6) as usize).collect();
    run_local(async {
        let (mut w, _) = WalWriter::open(dir, &triple, LogConfig::default(), Committer::default())
            .await
            .unwrap();
        let mut n = 0;
        images.push(std::fs::read(&path).unwrap());
        records.push(1); // the lease record
        for size in sizes {
            let mut end = 0;
            for _ in 0..size {
                end = w.append(&note(n)).await.unwrap().end;
                n += 1;
            }
            w.wait_durable(end).await.unwrap();
            images.push(std::fs::read(&path).unwrap());
            records.push(1 + n);
        }
        w.close().await.unwrap();
    })
    .unwrap();
    Barriers { images, records }
}

#[derive(Default, Debug)]
struct Counts {
    crashes: u64,
    faults: u64,
    invariants: u64,
}

#[test]
fn seeded_storage_faults_never_lose_durable_records_or_hide_corruption() {
    let seeds: u64 = std::env::var("BROCA_SIM_FAULT_SEEDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(400);
    let dir = tempfile::tempdir().unwrap();
    let mut counts = Counts::default();
    // A few logs; many crashes over each.
    for log in 0..4u64 {
        let b = write_batches(dir.path(), 12, log);
        for seed in 0..seeds / 4 {
            let mut rng = Rng(mix(log * 1_000_003 + seed));
            // The last barrier that completed, and the batch after it in flight.
            let at = rng.below((b.images.len() - 1) as u64) as usize;
            let old = &b.images[at];
            let new = &b.images[at + 1];
            let durable = scan(old).unwrap();
            assert_eq!(durable.frames.len(), b.records[at]);
            let window_start = durable.end as usize / SECTOR * SECTOR;
            let len = old.len().max(new.len());
            let mut img = old.clone();
            img.resize(len, 0);
            counts.crashes += 1;
            // Lost, reordered and torn writes: each sector of the window old or new.
            let keep_new = rng.below(3); // 0: lost whole, 1: all written, 2: any subset
            let mut sector = window_start;
            while sector < len {
                let end = (sector + SECTOR).min(len);
                let take = match keep_new {
                    0 => false,
                    1 => true,
                    _ => rng.below(2) == 1,
                };
                if take {
                    let src = &new[sector.min(new.len())..end.min(new.len())];
                    img[sector..sector + src.len()].copy_from_slice(src);
                } else {
                    counts.faults += 1;
                }
                sector = end;
            }
            // After growth, the space past the tail may hold zeros or garbage.
            let tail = rng.below(3);
            if tail > 0 {
                let extra = SECTOR * (1 + rng.below(4) as usize);
                let fill: Vec<u8> = (0..extra)
                    .map(|_| if tail == 1 { 0 } else { rng.next_u64() as u8 })
                    .collect();
                img.extend_from_slice(&fill);
                counts.faults += 1;
            }
            let got = scan(&img).unwrap();
            // Everything durable at the barrier is there, in order; nothing else is invented.
            assert!(
                got.frames.len() >= durable.frames.len(),
                "log {log} seed {seed}: lost durable records"
            );
            assert_eq!(
                &got.frames[..durable.frames.len()],
                &durable.frames[..],
                "log {log} seed {seed}"
            );
            assert!(got.frames.len() <= b.records[at + 1]);
            assert!(
                !matches!(got.verdict, Verdict::Corrupt { .. }),
                "log {log} seed {seed}: window-only damage read as corruption: {:?}",
                got.verdict
            );
            counts.invariants += 4;

            // A bit flipped in what a later record attests durable (every frame carries the
            // durable end when it was written, so the bytes before the previous barrier are
            // known durable; the last batch before a crash is the window recovery may cut):
            // corruption, never a shorter log.
            let data = durable.header.data_offset as usize;
            let attested = match at {
                0 => 0,
                _ => scan(&b.images[at - 1]).unwrap().end as usize / SECTOR * SECTOR,
            };
            if attested > data + 1 && rng.below(2) == 0 {
                let byte = data + rng.below((attested - data - 1) as u64) as usize;
                let mut flipped = old.clone();
                flipped[byte] ^= 1 << rng.below(8);
                counts.faults += 1;
                let s = scan(&flipped).unwrap();
                match &s.verdict {
                    Verdict::Corrupt { .. } => assert!(s.end as usize <= byte + 1),
                    other => {
                        panic!("log {log} seed {seed}: a flip at {byte} read as {other:?}")
                    }
                }
                counts.invariants += 1;
            }
        }
    }
    println!(
        "simulated crashes: {}; storage faults injected: {}; invariants checked: {}",
        counts.crashes, counts.faults, counts.invariants
    );
    assert!(counts.faults > 0);
}
