//! WAL append throughput and commit latency: broca's log against the limit (a bare
//! O_DIRECT write + fdatasync loop on pre-zeroed space), std::fs write + sync_data, and SQLite
//! in WAL mode with synchronous=FULL. 256-byte records at 1, 8, 64 and 512 per fdatasync; for
//! broca also spread over 1,000 logs on one shard. Run: `cargo bench -p broca-bench --bench
//! wal_append`. Criterion reports records/s; the commit latency table is printed at the end.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;
use std::time::{Duration, Instant};

use broca::wal::{Record, SessionTriple, WalWriter};
use broca_bench::{AlignedBuf, Latencies};
use broca_io::{Committer, LogConfig};
use criterion::{BenchmarkId, Criterion, Throughput};
use glommio::{LocalExecutor, LocalExecutorBuilder, Placement};

const RECORD_BYTES: usize = 256;
/// A broca frame: the 40-byte frame header and the record.
const FRAME_BYTES: usize = RECORD_BYTES + 40;
const BATCHES: [usize; 4] = [1, 8, 64, 512];
const SPREAD_LOGS: usize = 1_000;

fn record() -> Record {
    Record::Unknown {
        kind: 900,
        payload: vec![b'x'; RECORD_BYTES],
    }
}

/// The CPU every workload runs on (`BROCA_BENCH_CPU`, default 0): broca's executor and the
/// peers' loops share it, so that no workload gains from sitting nearer the disk's interrupts.
fn bench_cpu() -> usize {
    std::env::var("BROCA_BENCH_CPU")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// Pins the calling thread to [`bench_cpu`].
fn pin_this_thread() {
    // SAFETY: cpu_set_t is plain data; sched_setaffinity reads it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(bench_cpu(), &mut set);
        let rc = libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
        assert_eq!(rc, 0, "pinning to CPU {} failed", bench_cpu());
    }
}

fn executor() -> LocalExecutor {
    LocalExecutorBuilder::new(Placement::Fixed(bench_cpu()))
        .io_memory(broca_shards::IO_MEMORY_BYTES)
        .make()
        .expect("executor")
}

/// `logs` WALs on one executor; one batch = `per_log` appends to every log, then waiting until
/// all of them are durable.
struct BrocaLogs {
    ex: LocalExecutor,
    writers: Vec<WalWriter>,
    _dir: tempfile::TempDir,
}

impl BrocaLogs {
    fn open(logs: usize) -> BrocaLogs {
        let dir = tempfile::tempdir_in(bench_dir()).expect("temp dir");
        let ex = executor();
        let committer = Committer::default();
        let writers = ex.run(async {
            let mut writers = Vec::with_capacity(logs);
            for i in 0..logs {
                let t = SessionTriple::new("/bench", "wal", format!("s{i}")).expect("triple");
                let (w, _) =
                    WalWriter::open(dir.path(), &t, LogConfig::default(), committer.clone())
                        .await
                        .expect("open WAL");
                writers.push(w);
            }
            writers
        });
        BrocaLogs {
            ex,
            writers,
            _dir: dir,
        }
    }

    fn run(&mut self, batches: u64, per_log: usize, lat: &mut Vec<Duration>) -> Duration {
        let writers = &mut self.writers;
        let rec = record();
        self.ex.run(async move {
            let start = Instant::now();
            let mut ends = vec![0u64; writers.len()];
            for _ in 0..batches {
                let t0 = Instant::now();
                for (w, end) in writers.iter_mut().zip(ends.iter_mut()) {
                    for _ in 0..per_log {
                        *end = w.append(&rec).await.expect("append").end;
                    }
                }
                for (w, end) in writers.iter().zip(&ends) {
                    w.wait_durable(*end).await.expect("durable");
                }
                lat.push(t0.elapsed());
            }
            start.elapsed()
        })
    }
}

/// The limit: one pwrite of the batch's aligned bytes into pre-zeroed space, then fdatasync.
/// It writes as many bytes as broca's frames take, so that both move the same bytes.
struct Bare {
    file: File,
    buf: AlignedBuf,
    offset: u64,
    _dir: tempfile::TempDir,
}

const BARE_FILE_BYTES: u64 = 256 * 1024 * 1024;

impl Bare {
    fn open() -> Bare {
        let dir = tempfile::tempdir_in(bench_dir()).expect("temp dir");
        let path = dir.path().join("bare");
        let mut f = File::create(&path).expect("create");
        let zeros = vec![0u8; 1 << 20];
        for _ in 0..BARE_FILE_BYTES >> 20 {
            f.write_all(&zeros).expect("zero");
        }
        f.sync_all().expect("sync");
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_DIRECT)
            .open(&path)
            .expect("open O_DIRECT");
        Bare {
            file,
            buf: AlignedBuf::zeroed(512 * FRAME_BYTES + 4096, 4096),
            offset: 0,
            _dir: dir,
        }
    }

    fn run(&mut self, batches: u64, per_batch: usize, lat: &mut Vec<Duration>) -> Duration {
        let bytes = (per_batch * FRAME_BYTES) as u64;
        let start = Instant::now();
        for _ in 0..batches {
            let t0 = Instant::now();
            if self.offset + bytes + 512 > BARE_FILE_BYTES {
                self.offset = 0;
            }
            // The same span a log writes: from the start of the partial tail block to the end
            // of the new bytes, rounded up to the sector.
            let pos = self.offset & !511;
            let len = ((self.offset + bytes).div_ceil(512) * 512 - pos) as usize;
            let buf = &mut self.buf.as_mut_slice()[..len];
            buf[..8].copy_from_slice(&self.offset.to_le_bytes());
            self.file.write_all_at(buf, pos).expect("pwrite");
            self.file.sync_data().expect("fdatasync");
            self.offset += bytes;
            lat.push(t0.elapsed());
        }
        start.elapsed()
    }
}

/// std::fs: a buffered file, one write_all per record, one sync_data per batch.
struct StdFs {
    file: File,
    _dir: tempfile::TempDir,
}

impl StdFs {
    fn open() -> StdFs {
        let dir = tempfile::tempdir_in(bench_dir()).expect("temp dir");
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.path().join("std.log"))
            .expect("open");
        StdFs { file, _dir: dir }
    }

    fn run(&mut self, batches: u64, per_batch: usize, lat: &mut Vec<Duration>) -> Duration {
        let rec = [b'x'; RECORD_BYTES];
        let start = Instant::now();
        for _ in 0..batches {
            let t0 = Instant::now();
            for _ in 0..per_batch {
                self.file.write_all(&rec).expect("write");
            }
            self.file.sync_data().expect("sync_data");
            lat.push(t0.elapsed());
        }
        start.elapsed()
    }
}

/// SQLite in WAL mode with synchronous=FULL: one transaction of `per_batch` inserts per batch.
struct Sqlite {
    conn: rusqlite::Connection,
    _dir: tempfile::TempDir,
}

impl Sqlite {
    fn open() -> Sqlite {
        let dir = tempfile::tempdir_in(bench_dir()).expect("temp dir");
        let conn = rusqlite::Connection::open(dir.path().join("bench.db")).expect("open");
        conn.pragma_update(None, "journal_mode", "WAL")
            .expect("WAL mode");
        conn.pragma_update(None, "synchronous", "FULL")
            .expect("synchronous");
        conn.execute(
            "CREATE TABLE log (seq INTEGER PRIMARY KEY, body BLOB NOT NULL)",
            [],
        )
        .expect("table");
        Sqlite { conn, _dir: dir }
    }

    fn run(&mut self, batches: u64, per_batch: usize, lat: &mut Vec<Duration>) -> Duration {
        let rec = vec![b'x'; RECORD_BYTES];
        let start = Instant::now();
        for _ in 0..batches {
            let t0 = Instant::now();
            let tx = self.conn.transaction().expect("begin");
            {
                let mut stmt = tx
                    .prepare_cached("INSERT INTO log (body) VALUES (?1)")
                    .expect("prepare");
                for _ in 0..per_batch {
                    stmt.execute([&rec]).expect("insert");
                }
            }
            tx.commit().expect("commit");
            lat.push(t0.elapsed());
        }
        start.elapsed()
    }
}

/// Benchmark files go under target/ (a real disk), not a tmpfs /tmp.
fn bench_dir() -> &'static Path {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/bench-files");
    std::fs::create_dir_all(&dir).expect("bench dir");
    Box::leak(dir.into_boxed_path())
}

fn bench(c: &mut Criterion, lat: &mut Latencies) {
    let mut group = c.benchmark_group("wal_append");
    group
        .sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));
    for &batch in &BATCHES {
        group.throughput(Throughput::Elements(batch as u64));
        let mut bare = Bare::open();
        group.bench_function(BenchmarkId::new("bare_fdatasync_limit", batch), |b| {
            b.iter_custom(|n| {
                bare.run(n, batch, lat.samples(&format!("bare limit, batch {batch}")))
            })
        });
        let mut one = BrocaLogs::open(1);
        group.bench_function(BenchmarkId::new("broca_1_log", batch), |b| {
            b.iter_custom(|n| {
                one.run(
                    n,
                    batch,
                    lat.samples(&format!("broca 1 log, batch {batch}")),
                )
            })
        });
        let mut stdfs = StdFs::open();
        group.bench_function(BenchmarkId::new("std_fs_sync_data", batch), |b| {
            b.iter_custom(|n| stdfs.run(n, batch, lat.samples(&format!("std::fs, batch {batch}"))))
        });
        let mut sqlite = Sqlite::open();
        group.bench_function(BenchmarkId::new("sqlite_wal_full", batch), |b| {
            b.iter_custom(|n| sqlite.run(n, batch, lat.samples(&format!("sqlite, batch {batch}"))))
        });
    }
    group.finish();

    let mut spread = c.benchmark_group("wal_append_1000_logs");
    spread
        .sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(5));
    let mut logs = BrocaLogs::open(SPREAD_LOGS);
    for &batch in &BATCHES {
        spread.throughput(Throughput::Elements((batch * SPREAD_LOGS) as u64));
        spread.bench_function(BenchmarkId::new("broca_1000_logs", batch), |b| {
            let label = format!("broca 1000 logs, batch {batch}/log");
            b.iter_custom(|n| logs.run(n, batch, lat.samples(&label)))
        });
    }
    spread.finish();
}

fn main() {
    pin_this_thread();
    println!("every workload runs on CPU {}", bench_cpu());
    let mut c = Criterion::default().configure_from_args();
    let mut lat = Latencies::default();
    bench(&mut c, &mut lat);
    c.final_summary();
    lat.print("commit latency (one batch: appends until durable)");
}
