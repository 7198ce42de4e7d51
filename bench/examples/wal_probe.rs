use std::time::Instant;
use broca::wal::{Record, SessionTriple, WalWriter};
use broca_io::{Committer, LogConfig};
fn main() {
    let n: usize = std::env::args().nth(1).map(|s| s.parse().unwrap()).unwrap_or(5000);
    broca_shards::run_local(async move {
        let dir = tempfile::tempdir_in("/work/main/target/bench-files").unwrap();
        let t = SessionTriple::new("/b", "w", "s").unwrap();
        let zmin: u64 = std::env::args().nth(2).map(|s| s.parse().unwrap()).unwrap_or(16384); let cfg = LogConfig { zero_ahead_min_bytes: zmin, ..LogConfig::default() }; let (mut w, _) = WalWriter::open(dir.path(), &t, cfg, Committer::default()).await.unwrap();
        let rec = Record::Unknown { kind: 900, payload: vec![b'x'; 256] };
        let t0 = Instant::now();
        for _ in 0..n { w.append_durable(&rec).await.unwrap(); }
        println!("{:.1} us/append", t0.elapsed().as_secs_f64() * 1e6 / n as f64);
    }).unwrap();
}
