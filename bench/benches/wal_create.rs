//! A new session's WAL file: created in the WALs' folder when it is needed (what broca did,
//! and still does when no spare is at hand), against an empty file made ahead and renamed
//! into place (broca_wal_writer::spares). Each in a fresh folder, and in a folder where
//! many files were just deleted: on an ext4 without a journal, a create then scans past the
//! recently deleted inodes while it holds the folder's lock (BENCHMARKS.md, "A file
//! create"); a rename allocates no inode.
//! Run: `cargo bench -p broca-bench --bench wal_create` (`BROCA_BENCH_FILES`, default 2,000;
//! `BROCA_BENCH_DELETED`, default 20,000; `BROCA_BENCH_DIR`, default the system's temp;
//! `BROCA_BENCH_DROP_CACHES=1` drops the kernel's caches after the deletions, as root).

use std::path::Path;

use broca_bench::floors::{create_floor, spare_handout_floor, Floor};

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn row(case: &str, how: &str, f: Floor) {
    println!(
        "| {case} | {how} | {:.0} | {:.1} | {:.0} | {:.0} |",
        f.ops_per_s, f.cpu_us_per_op, f.p50_us, f.p99_us
    );
}

/// Makes (written and synced, as a WAL is) and deletes `n` files in `dir`, leaving it empty
/// and its inodes recently deleted; then, when `BROCA_BENCH_DROP_CACHES=1` (root only), drops
/// the kernel's caches, so that the inode tables are read from the disk again, as they are
/// in a daemon that runs for long.
fn churn(dir: &Path, n: usize) {
    for i in 0..n {
        let f = dir.join(format!("gone-{i}"));
        std::fs::write(&f, [7u8; 4096]).unwrap();
        std::fs::File::open(&f).unwrap().sync_data().unwrap();
        std::fs::remove_file(&f).unwrap();
    }
    if n > 0 && std::env::var("BROCA_BENCH_DROP_CACHES").is_ok_and(|v| v == "1") {
        // SAFETY: sync has no arguments.
        unsafe { libc::sync() };
        std::fs::write("/proc/sys/vm/drop_caches", b"3").expect("dropping caches needs root");
    }
}

fn main() {
    if !std::env::args().any(|a| a == "--bench") {
        return; // `cargo test` runs benches as tests: nothing to time there
    }
    let files = env_usize("BROCA_BENCH_FILES", 2000);
    let deleted = env_usize("BROCA_BENCH_DELETED", 20_000);
    let base = std::env::var_os("BROCA_BENCH_DIR").map_or_else(std::env::temp_dir, Into::into);
    let work = tempfile::tempdir_in(base).unwrap();
    println!("{files} new files a case; the second case after {deleted} files were deleted\n");
    println!("| folder | a new WAL's file | files/s | CPU µs/file | p50 µs | p99 µs |");
    println!("|---|---|---:|---:|---:|---:|");
    for (case, churned) in [("fresh", 0), ("after deletions", deleted)] {
        for how in ["created", "spare renamed in"] {
            let dir = work.path().join(format!("{case}-{how}"));
            let spares = dir.join(".spare");
            std::fs::create_dir_all(&spares).unwrap();
            churn(&dir, churned);
            let f = match how {
                "created" => create_floor(&dir, files),
                _ => spare_handout_floor(&dir, &spares, files),
            };
            row(case, how, f);
        }
    }
}
