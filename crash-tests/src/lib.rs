//! Crash-cut test support: building WAL images as a crash would leave them.
//!
//! The tests in `tests/` cut real WAL files at every byte and every sector of the writes that
//! may have been in flight, flip bits in what was durable, and check what recovery makes of it.

use std::path::Path;

pub mod core_sim;
pub mod fuzz;

/// splitmix64: a small, good, deterministic mixer for seeded tests.
pub fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// A seeded random sequence.
pub struct Rng(pub u64);

impl Rng {
    pub fn next_u64(&mut self) -> u64 {
        self.0 = mix(self.0);
        self.0
    }

    /// A number below `n` (0 when `n` is 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }
}

use broca::wal::verify::read_and_scan;
use broca::wal::writer::wal_path;
use broca::wal::{Record, SessionTriple, WalWriter};
use broca_io::{Committer, LogConfig};
use broca_shards::run_local;

/// A test record of a kind the WAL does not know (kinds from 900 are free for tests).
pub fn note(i: usize) -> Record {
    Record::Unknown {
        kind: 900,
        payload: format!("{{\"note\":{i},\"pad\":\"{}\"}}", "x".repeat(i % 40)).into_bytes(),
    }
}

/// A WAL written in two parts: `durable` records each made durable on its own, then one
/// batch of `in_flight` records appended in one tick. Returns the file's bytes and the offset
/// where the batch starts (the durable end when it was appended).
pub struct TwoPartWal {
    pub bytes: Vec<u8>,
    pub batch_start: u64,
    pub batch_end: u64,
    /// Records before the batch, the lease record included.
    pub durable_records: usize,
}

/// Writes a [`TwoPartWal`] for `triple` in `dir`.
pub fn write_two_part(
    dir: &Path,
    triple: &SessionTriple,
    durable: usize,
    in_flight: usize,
) -> TwoPartWal {
    let batch_start = run_local(async {
        let (mut w, _) = WalWriter::open(dir, triple, LogConfig::default(), Committer::default())
            .await
            .expect("open the WAL");
        for i in 0..durable {
            w.append_durable(&note(i)).await.expect("append");
        }
        let start = w.log().durable_end();
        let mut last = 0;
        for i in 0..in_flight {
            last = w.append(&note(durable + i)).await.expect("append").end;
        }
        w.wait_durable(last).await.expect("sync");
        w.close().await.expect("close");
        start
    })
    .expect("executor");
    let path = wal_path(dir, triple);
    let (bytes, scan) = read_and_scan(&path).expect("scan");
    let batch_end = scan.end;
    TwoPartWal {
        bytes,
        batch_start,
        batch_end,
        durable_records: 1 + durable,
    }
}
