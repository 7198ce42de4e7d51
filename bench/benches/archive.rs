//! The archive: pack throughput beside a plain copy + fsync of the same files, and the
//! latency of an archived session's first read beside a live one's.
//!
//! - WALs: BROCA_BENCH_SESSIONS sessions (default 2,000), each with BROCA_BENCH_RUNS runs
//!   (default 3) of the scripted model and counting tools, written by real session actors
//!   (real WALs with fdatasync); each model step opens with BROCA_BENCH_THINKING bytes
//!   (default 1,024) of signed reasoning.
//! - Pack: `broca_archive::pack` of a fresh copy of those WALs (idle threshold 0): read, lease
//!   taken, sealed containers written, fsynced and renamed, the live WALs removed and `wal/`
//!   fsynced. Beside it, the same files copied to another folder, each fsynced, the folder
//!   fsynced. Beside both, the same pack pruning each session's reasoning
//!   (`--prune-reasoning`: each WAL replayed, rewritten with its reasoning emptied, its older
//!   sealed copies looked for). MB/s counts the WAL files' bytes; median of 5 of each,
//!   interleaved.
//! - First read: `read_and_scan_if_any` (what run.status, run.result and session.read use
//!   when the session's actor is closed) of 1,000 random sessions, live and then archived
//!   (digest checked); p50 / p99.
//!
//! Run: `cargo bench -p broca-bench --bench archive`.

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::time::{Duration, Instant};

use broca::session::SessionActor;
use broca::wal::writer::wal_path;
use broca::wal::SessionTriple;
use broca_bench::percentile;
use broca_io::{Committer, LogConfig};
use broca_testkit::{CountingTools, Script, ScriptedModel};

fn env_num(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn wal_files(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "wal"))
        .collect();
    v.sort();
    v
}

/// Copies every WAL of `from` into `to`, each fsynced, then `to` fsynced.
fn copy_and_sync(from: &[PathBuf], to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for p in from {
        let dst = to.join(p.file_name().unwrap());
        std::fs::copy(p, &dst).unwrap();
        std::fs::File::open(&dst).unwrap().sync_all().unwrap();
    }
    std::fs::File::open(to).unwrap().sync_all().unwrap();
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        println!("archive: bench");
        return;
    }
    let sessions = env_num("BROCA_BENCH_SESSIONS", 2_000);
    let runs = env_num("BROCA_BENCH_RUNS", 3);
    let thinking = env_num("BROCA_BENCH_THINKING", 1024);
    let base = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/bench-archive");
    std::fs::create_dir_all(&base).unwrap();
    let dir = tempfile::tempdir_in(&base).unwrap();
    let source = dir.path().join("source/wal");
    std::fs::create_dir_all(&source).unwrap();
    let triples: Vec<SessionTriple> = (0..sessions)
        .map(|i| SessionTriple::new("/bench", "archive", &format!("s{i}")).unwrap())
        .collect();
    let made = Instant::now();
    {
        let (wal, triples) = (source.clone(), triples.clone());
        broca_shards::run_local(async move {
            let committer = Committer::default();
            for (i, t) in triples.iter().enumerate() {
                let script = Script {
                    seed: i as u64,
                    tool_step_percent: 60,
                    thinking_bytes: thinking,
                    ..Script::default()
                };
                let mut a = SessionActor::opener(
                    &wal,
                    t,
                    Rc::new(ScriptedModel::new(script)),
                    Rc::new(CountingTools::default()),
                )
                .tool_specs(CountingTools::specs(&["echo"]))
                .log(LogConfig::default())
                .committer(committer.clone())
                .open()
                .await
                .unwrap();
                for r in 0..runs {
                    let req = broca::core::SendRequest {
                        prompt: format!("task {r}"),
                        model: "scripted/bench".into(),
                        max_steps: Some(8),
                        ..Default::default()
                    };
                    a.send(&req).await.unwrap();
                    a.run_admitted().await.unwrap();
                }
                a.close().await.unwrap();
            }
        })
        .unwrap();
    }
    let files = wal_files(&source);
    let file_bytes: u64 = files
        .iter()
        .map(|p| std::fs::metadata(p).unwrap().len())
        .sum();
    println!(
        "{sessions} sessions x {runs} runs written in {:.1} s: {:.1} MB of WAL files",
        made.elapsed().as_secs_f64(),
        file_bytes as f64 / 1e6
    );

    let mut packs = Vec::new();
    let mut prunes = Vec::new();
    let mut copies = Vec::new();
    let mut sealed_bytes = 0;
    let mut pruned_bytes = 0;
    let mut containers = 0;
    for rep in 0..5 {
        let state = dir.path().join(format!("prune{rep}"));
        copy_and_sync(&files, &state.join("wal"));
        let t = Instant::now();
        let opts = broca_archive::PackOptions {
            idle: Duration::ZERO,
            rewrite: Some(broca::host::prune_reasoning),
            ..Default::default()
        };
        let r = broca_archive::pack(&state, &opts, &mut |_| {}).unwrap();
        prunes.push(t.elapsed());
        assert_eq!(r.rewritten.len(), if thinking > 0 { sessions } else { 0 });
        pruned_bytes = r.bytes;
        std::fs::remove_dir_all(&state).unwrap();

        let state = dir.path().join(format!("pack{rep}"));
        copy_and_sync(&files, &state.join("wal"));
        let t = Instant::now();
        let opts = broca_archive::PackOptions {
            idle: Duration::ZERO,
            ..Default::default()
        };
        let r = broca_archive::pack(&state, &opts, &mut |_| {}).unwrap();
        packs.push(t.elapsed());
        assert_eq!(r.packed.len(), sessions);
        sealed_bytes = r.bytes;
        containers = r.containers.len();
        let t = Instant::now();
        copy_and_sync(&files, &dir.path().join(format!("copy{rep}")));
        copies.push(t.elapsed());
        if rep < 4 {
            std::fs::remove_dir_all(&state).unwrap();
        }
        std::fs::remove_dir_all(dir.path().join(format!("copy{rep}"))).unwrap();
    }
    let (pack, prune, copy) = (median(packs), median(prunes), median(copies));
    println!(
        "pack: median of 5 {:.3} s: {:.0} sessions/s, {:.1} MB/s of WAL files ({:.1} MB of records sealed in {containers} containers)",
        pack.as_secs_f64(),
        sessions as f64 / pack.as_secs_f64(),
        file_bytes as f64 / 1e6 / pack.as_secs_f64(),
        sealed_bytes as f64 / 1e6
    );
    println!(
        "pack pruning reasoning: median of 5 {:.3} s: {:.0} sessions/s, {:.1} MB/s of WAL files ({:.1} MB of records sealed)",
        prune.as_secs_f64(),
        sessions as f64 / prune.as_secs_f64(),
        file_bytes as f64 / 1e6 / prune.as_secs_f64(),
        pruned_bytes as f64 / 1e6
    );
    println!(
        "copy + fsync of the same files: median of 5 {:.3} s: {:.0} files/s, {:.1} MB/s",
        copy.as_secs_f64(),
        sessions as f64 / copy.as_secs_f64(),
        file_bytes as f64 / 1e6 / copy.as_secs_f64()
    );

    // First reads: live (the source WALs), then archived (the last pack's state dir).
    let archived_wal = dir.path().join("pack4/wal");
    let mut seed = 0x9E37_79B9_7F4A_7C15u64;
    let picks: Vec<usize> = (0..1000)
        .map(|_| {
            seed = broca_testkit::mix(seed);
            (seed % sessions as u64) as usize
        })
        .collect();
    for (what, wal) in [("live", &source), ("archived", &archived_wal)] {
        let mut lat = Vec::with_capacity(picks.len());
        for &i in &picks {
            let p = wal_path(wal, &triples[i]);
            let t = Instant::now();
            let found = broca::wal::verify::read_and_scan_if_any(&p).unwrap();
            lat.push(t.elapsed());
            assert!(found.is_some(), "{what} {}", p.display());
        }
        lat.sort();
        println!(
            "first read, {what}: p50 {:.1} us, p99 {:.1} us (1,000 random sessions)",
            percentile(&lat, 50.0).as_secs_f64() * 1e6,
            percentile(&lat, 99.0).as_secs_f64() * 1e6
        );
    }
}
