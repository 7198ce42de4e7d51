//! The store: how far its projections lag behind the WALs while runs are written, and how fast
//! it rebuilds from the WALs.
//!
//! - Lag under load: sessions run back to back on one shard (pinned to CPU 0; the scripted
//!   model, counting tools, real WALs with fdatasync); when a run ends, its WAL is handed to a
//!   store thread (as serve's shards do) that catches the session up. Lag is the time from the
//!   run's end to its projection committed; p50 / p99 over every run.
//! - Rebuild: `Store::rebuild` over the WALs those runs wrote: facts per second and WAL bytes
//!   per second (each session's WAL read, scanned, decoded and replayed; its projections
//!   written in one LMDB transaction).
//!
//! Run: `cargo bench -p broca-bench --bench store` (BROCA_BENCH_SESSIONS and BROCA_BENCH_RUNS
//! change the workload; default 100 sessions, 20 runs each).

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::rc::Rc;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use broca::session::SessionActor;
use broca::store::Store;
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

fn main() {
    if std::env::args().any(|a| a == "--list") {
        println!("store: bench");
        return;
    }
    let sessions = env_num("BROCA_BENCH_SESSIONS", 100);
    let runs = env_num("BROCA_BENCH_RUNS", 20);
    let base = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/bench-store");
    std::fs::create_dir_all(&base).unwrap();
    let dir = tempfile::tempdir_in(&base).unwrap();
    let state = dir.path().to_path_buf();
    let wal_dir = state.join("wal");
    std::fs::create_dir_all(&wal_dir).unwrap();

    // The store thread: catches up each WAL it is handed, recording the lag.
    let (store, notes) = Store::open(&state).unwrap();
    assert!(notes.is_empty(), "{notes:?}");
    let (tx, rx) = mpsc::channel::<(std::path::PathBuf, Instant)>();
    let projector = std::thread::spawn(move || {
        let mut lags = Vec::new();
        while let Ok(first) = rx.recv() {
            let mut batch = vec![first];
            while let Ok(more) = rx.try_recv() {
                batch.push(more);
            }
            let mut paths: Vec<_> = batch.iter().map(|(p, _)| p.clone()).collect();
            paths.sort();
            paths.dedup();
            let failed = store.catch_up_batch(&paths).unwrap();
            assert!(failed.is_empty(), "{failed:?}");
            let done = Instant::now();
            lags.extend(batch.iter().map(|(_, ended)| done - *ended));
        }
        (store, lags)
    });

    let started = Instant::now();
    let wal = wal_dir.clone();
    std::thread::spawn(move || {
        glommio::LocalExecutorBuilder::new(glommio::Placement::Fixed(0))
            .make()
            .expect("an executor")
            .run(async move {
                let committer = Committer::default();
                let mut tasks = Vec::new();
                for i in 0..sessions {
                    let (wal, committer, tx) = (wal.clone(), committer.clone(), tx.clone());
                    tasks.push(glommio::spawn_local(async move {
                        let t = SessionTriple::new("/bench", "store", &format!("s{i}")).unwrap();
                        let script = Script {
                            seed: i as u64,
                            tool_step_percent: 60,
                            ..Script::default()
                        };
                        let mut a = SessionActor::opener(
                            &wal,
                            &t,
                            Rc::new(ScriptedModel::new(script)),
                            Rc::new(CountingTools::default()),
                        )
                        .tool_specs(CountingTools::specs(&["echo"]))
                        .log(LogConfig::default())
                        .committer(committer)
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
                            tx.send((wal_path(&wal, &t), Instant::now())).unwrap();
                        }
                        a.close().await.unwrap();
                    }));
                }
                for t in tasks {
                    t.await;
                }
            })
    })
    .join()
    .unwrap();
    let ran = started.elapsed();
    let (store, mut lags) = projector.join().unwrap();
    lags.sort();
    println!(
        "lag under load: {} runs in {:.2} s ({:.0} runs/s) over {sessions} sessions; projection lag p50 {:.1} ms, p99 {:.1} ms",
        lags.len(),
        ran.as_secs_f64(),
        lags.len() as f64 / ran.as_secs_f64(),
        percentile(&lags, 50.0).as_secs_f64() * 1e3,
        percentile(&lags, 99.0).as_secs_f64() * 1e3,
    );
    let diffs = store.check(&wal_dir).unwrap();
    assert!(diffs.is_empty(), "{diffs:?}");

    let mut times = Vec::new();
    let mut last = None;
    for _ in 0..3 {
        let t = Instant::now();
        let pass = store.rebuild(&wal_dir).unwrap();
        times.push(t.elapsed());
        last = Some(pass);
    }
    times.sort();
    let pass = last.unwrap();
    let median: Duration = times[1];
    println!(
        "rebuild ({} sessions, {} facts, {:.1} MB of WAL): median of 3 {:.3} s: {:.0} facts/s, {:.1} MB/s of WAL",
        pass.sessions,
        pass.facts,
        pass.wal_bytes as f64 / 1e6,
        median.as_secs_f64(),
        pass.facts as f64 / median.as_secs_f64(),
        pass.wal_bytes as f64 / 1e6 / median.as_secs_f64(),
    );
}
