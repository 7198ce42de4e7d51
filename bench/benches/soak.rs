//! Soak: the release `broca serve` under a mixed load with idle gaps longer than 11 minutes,
//! sampled every minute (RSS, open descriptors, request latency p50/p99), to show that they
//! stay flat and that the daemon still answers after each gap. Not part of CI.
//!
//! Run: `cargo bench -p broca-bench --bench soak` (about 31 minutes). Settings:
//! `BROCA_SOAK_ACTIVE_SECS` (180), `BROCA_SOAK_IDLE_SECS` (720), `BROCA_SOAK_ROUNDS` (2),
//! `BROCA_SOAK_SESSIONS` (8 per worker), `BROCA_SOAK_RUNS_PER_SESSION` (20),
//! `BROCA_SOAK_WORKERS` (8). `BROCA_SOAK_IDLE_ONLY=SECS` instead
//! keeps a fresh daemon idle that long, then checks that it serves.

use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use broca_bench::peer::{
    anon_huge_kib, broca_release_bin, cpu_secs, rss_anon_file_kib, rss_kib_and_fds, Daemon,
    FakeProvider,
};
use broca_bench::percentile;
use serde_json::json;

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn triple(i: u64) -> serde_json::Value {
    json!({"project_root": "/soak", "harness": "soak", "session": format!("s{i}")})
}

fn with(mut base: serde_json::Value, more: serde_json::Value) -> serde_json::Value {
    base.as_object_mut()
        .expect("an object")
        .extend(more.as_object().expect("an object").clone());
    base
}

/// Subscribes to the session's live units: the connection, once the daemon has answered.
fn subscribe_live(d: &Daemon, session: u64) -> Option<BufReader<TcpStream>> {
    let mut s = TcpStream::connect(&d.addr).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(30))).ok()?;
    let req = format!(
        "GET /v1/subscribe?project_root=/soak&harness=soak&session=s{session}&from=live HTTP/1.1\r\n\
         Authorization: Bearer {}\r\n\r\n",
        d.handle
    );
    s.write_all(req.as_bytes()).ok()?;
    let mut r = BufReader::new(s);
    let mut line = String::new();
    r.read_line(&mut line).ok()?;
    line.starts_with("HTTP/1.1 200").then_some(r)
}

/// Reads a subscription until the run's `run_finished` unit; `false` on any failure.
fn follow(sub: BufReader<TcpStream>, run_id: &str) -> bool {
    let needle = format!("\"run_id\":\"{run_id}\"");
    for line in sub.lines() {
        let Ok(line) = line else { return false };
        if line.contains("\"type\":\"run_finished\"") && line.contains(&needle) {
            return true;
        }
    }
    false
}

/// One worker's loop while `active`: a subscriber, a send followed to its end, a read and a
/// status.
fn work(
    d: &Daemon,
    sessions: u64,
    seed: u64,
    active: &AtomicBool,
    lat: &Mutex<Vec<Duration>>,
    errors: &AtomicU64,
) {
    // Each worker keeps `sessions` sessions of its own and moves each on to a new session
    // after `runs_per_session` runs: the history of a live session stays bounded, as on a
    // host whose sessions come and go, while the daemon sees a steady stream of new ones.
    let runs_per_session = env_u64("BROCA_SOAK_RUNS_PER_SESSION", 20);
    let mut k = 0u64;
    while active.load(Ordering::Relaxed) {
        let generation = k / (runs_per_session * sessions);
        let session = (seed << 40) | (generation * sessions + k % sessions);
        k += 1;
        let Some(sub) = subscribe_live(d, session) else {
            errors.fetch_add(1, Ordering::Relaxed);
            continue;
        };
        let t = Instant::now();
        let sent = d.rpc(
            "session.send",
            with(
                triple(session),
                json!({"prompt": "soak", "model": "anthropic/m"}),
            ),
        );
        let took = t.elapsed();
        let run_id = match &sent {
            Ok((200, r)) => r["result"]["run_id"].as_str().map(str::to_string),
            _ => None,
        };
        let Some(run_id) = run_id else {
            // A session still busy with another worker's run is refused: that is expected.
            if !matches!(sent, Ok((409, _))) {
                errors.fetch_add(1, Ordering::Relaxed);
            }
            continue;
        };
        lat.lock().expect("latencies").push(took);
        if !follow(sub, &run_id) {
            errors.fetch_add(1, Ordering::Relaxed);
        }
        for (method, params) in [
            ("session.read", json!({"limit": 50})),
            ("run.status", json!({"run_id": run_id})),
        ] {
            let t = Instant::now();
            match d.rpc(method, with(triple(session), params)) {
                Ok((200, _)) => lat.lock().expect("latencies").push(t.elapsed()),
                _ => {
                    errors.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
    }
}

struct Minute {
    at_secs: u64,
    phase: &'static str,
    rss_kib: u64,
    anon_kib: u64,
    file_kib: u64,
    huge_kib: u64,
    fds: usize,
    requests: usize,
    p50: Duration,
    p99: Duration,
    errors: u64,
    cpu_secs: f64,
}

fn sample(
    d: &Daemon,
    start: Instant,
    phase: &'static str,
    lat: &Mutex<Vec<Duration>>,
    errors: &AtomicU64,
) -> Minute {
    let mut l = std::mem::take(&mut *lat.lock().expect("latencies"));
    l.sort_unstable();
    let (rss_kib, fds) = rss_kib_and_fds(d.pid());
    let (anon_kib, file_kib) = rss_anon_file_kib(d.pid());
    Minute {
        anon_kib,
        file_kib,
        huge_kib: anon_huge_kib(d.pid()),
        at_secs: start.elapsed().as_secs(),
        phase,
        rss_kib,
        fds,
        requests: l.len(),
        p50: percentile(&l, 50.0),
        p99: percentile(&l, 99.0),
        errors: errors.swap(0, Ordering::Relaxed),
        cpu_secs: cpu_secs(d.pid()),
    }
}

fn healthy(d: &Daemon) -> bool {
    matches!(d.request("GET", "/healthz", ""), Ok((200, _)))
}

fn idle_only(bin: &std::path::Path, secs: u64) {
    let provider = FakeProvider::start(0);
    let dir = tempfile::tempdir().expect("a temp dir");
    let d = Daemon::start(
        bin,
        &dir.path().join("state"),
        &provider.url(),
        &["--shards", "1"],
    );
    println!("idle-only soak: a fresh daemon idle for {secs} s, then served");
    let (rss0, fds0) = rss_kib_and_fds(d.pid());
    std::thread::sleep(Duration::from_secs(secs));
    let (rss1, fds1) = rss_kib_and_fds(d.pid());
    let t = Instant::now();
    let ok = healthy(&d);
    let health = t.elapsed();
    let followed = subscribe_live(&d, 0).is_some_and(|sub| {
        let sent = d.rpc(
            "session.send",
            with(
                triple(0),
                json!({"prompt": "after the idle", "model": "anthropic/m"}),
            ),
        );
        let run_id = sent
            .ok()
            .and_then(|(_, r)| r["result"]["run_id"].as_str().map(str::to_string));
        run_id.is_some_and(|id| follow(sub, &id))
    });
    println!(
        "{}",
        json!({
            "idle_secs": secs, "healthz_ok": ok, "healthz_ms": health.as_secs_f64() * 1e3,
            "send_and_subscribe_ok": followed, "rss_kib": [rss0, rss1], "fds": [fds0, fds1],
        })
    );
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return; // nothing to list: this bench is one run
    }
    let bin = broca_release_bin();
    if let Some(secs) = std::env::var("BROCA_SOAK_IDLE_ONLY")
        .ok()
        .and_then(|v| v.parse().ok())
    {
        return idle_only(&bin, secs);
    }
    let active_secs = env_u64("BROCA_SOAK_ACTIVE_SECS", 180);
    let idle_secs = env_u64("BROCA_SOAK_IDLE_SECS", 720);
    let rounds = env_u64("BROCA_SOAK_ROUNDS", 2);
    let sessions = env_u64("BROCA_SOAK_SESSIONS", 8);
    let workers = env_u64("BROCA_SOAK_WORKERS", 8);
    let provider = FakeProvider::start(0);
    let dir = tempfile::tempdir().expect("a temp dir");
    let d = Arc::new(Daemon::start(
        &bin,
        &dir.path().join("state"),
        &provider.url(),
        &[],
    ));
    println!(
        "soak: {rounds} rounds of {active_secs} s active ({workers} workers with {sessions} sessions each, a new one after every 20 runs: \
         send, subscribe to the end, read, status) and {idle_secs} s idle, then {active_secs} s active"
    );
    let lat = Arc::new(Mutex::new(Vec::new()));
    let errors = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let mut minutes: Vec<Minute> = Vec::new();
    let mut after_idle_ok = Vec::new();
    let mut phases = Vec::new();
    for _ in 0..rounds {
        phases.push(("active", active_secs));
        phases.push(("idle", idle_secs));
    }
    phases.push(("active", active_secs));
    for (phase, secs) in phases {
        let active = Arc::new(AtomicBool::new(phase == "active"));
        if phase == "active" {
            after_idle_ok.push(healthy(&d));
        }
        let handles: Vec<_> = (0..if phase == "active" { workers } else { 0 })
            .map(|w| {
                let (d, active, lat, errors) =
                    (d.clone(), active.clone(), lat.clone(), errors.clone());
                std::thread::spawn(move || work(&d, sessions, w + 1, &active, &lat, &errors))
            })
            .collect();
        let phase_end = Instant::now() + Duration::from_secs(secs);
        while Instant::now() < phase_end {
            let next = (Instant::now() + Duration::from_secs(60)).min(phase_end);
            std::thread::sleep(next.saturating_duration_since(Instant::now()));
            let m = sample(&d, start, phase, &lat, &errors);
            println!(
                "{:>6} s {:<6} rss {:>7} KiB (heap {:>7}, of it huge pages {:>6}; files {:>7})  fds {:>4}  requests {:>7}  p50 {:>8.2} ms  p99 {:>8.2} ms  errors {}  cpu {:.1} s",
                m.at_secs, m.phase, m.rss_kib, m.anon_kib, m.huge_kib, m.file_kib, m.fds, m.requests,
                m.p50.as_secs_f64() * 1e3, m.p99.as_secs_f64() * 1e3, m.errors, m.cpu_secs
            );
            minutes.push(m);
        }
        active.store(false, Ordering::Relaxed);
        for h in handles {
            let _ = h.join();
        }
    }
    let active: Vec<&Minute> = minutes.iter().filter(|m| m.phase == "active").collect();
    let rss: Vec<u64> = active.iter().map(|m| m.rss_kib).collect();
    let heap: Vec<u64> = minutes.iter().map(|m| m.anon_kib).collect();
    let fds: Vec<usize> = minutes.iter().map(|m| m.fds).collect();
    let p99: Vec<f64> = active.iter().map(|m| m.p99.as_secs_f64() * 1e3).collect();
    println!(
        "{}",
        json!({
            "minutes": minutes.len(),
            "served_after_every_idle_gap": after_idle_ok.iter().all(|&ok| ok),
            "rss_kib_active_min_max": [rss.iter().min(), rss.iter().max()],
            "heap_kib_min_max": [heap.iter().min(), heap.iter().max()],
            "fds_min_max": [fds.iter().min(), fds.iter().max()],
            "p99_ms_active_min_max": [p99.iter().cloned().fold(f64::INFINITY, f64::min), p99.iter().cloned().fold(0.0, f64::max)],
            "requests": minutes.iter().map(|m| m.requests).sum::<usize>(),
            "errors": minutes.iter().map(|m| m.errors).sum::<u64>(),
            "provider_requests": provider.requests.load(Ordering::Relaxed),
        })
    );
}
