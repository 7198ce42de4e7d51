//! Durable agent steps per second on one shard, with session actors as serve runs them: a
//! real WAL per session (O_DIRECT, group commit), the provider transport talking HTTP/1.1 to a
//! zero-latency loopback provider (a child process answering every call at once with an
//! Anthropic stream: a tool call, then after the tool's result a final text), and a no-op
//! tool. Each run is two model steps with a durable tool intent and result between them.
//! Measured at 1, 100 and 5,000 concurrent sessions (10,000 needs more than the 20,000 open
//! files this machine allows: an open WAL holds two descriptors); at 1, each run's latency
//! beside the fdatasync latency; the process's RSS before the sessions, at its peak while every run is
//! in flight, and after the idle sessions were closed.
//!
//! `BROCA_BENCH_ON_DISK=N` instead opens and closes N sessions (their WALs created) and reports
//! the RSS before and after: idle sessions on disk should cost no memory.
//!
//! `BROCA_BENCH_COST=1` also counts what each durable step costs over the runs' window (the
//! cost model, docs/cost-model.md): CPU, context switches, system calls (perf stat, when perf
//! is on the path), allocations, bytes appended, written and synced, and the bytes sent to and
//! read from the provider.
//!
//! Run: `cargo bench -p broca-bench --bench serve_steps` (BROCA_BENCH_SESSIONS=1,100,5000 and
//! BROCA_BENCH_RUNS=N change the workload; BROCA_BENCH_DIR the WAL folder, default a temporary
//! folder on the disk beside the target dir).

#[global_allocator]
static GLOBAL: Counting = Counting;

/// mimalloc with a count of live heap bytes and of live allocations per power-of-two size
/// class, kept only with `BROCA_BENCH_HEAP=1` (the counters cost a few atomics per call).
struct Counting;

static COUNTING: AtomicBool = AtomicBool::new(false);
static LIVE_BYTES: AtomicI64 = AtomicI64::new(0);
/// Allocation calls and the bytes they asked for (reallocs that grow count as one).
static ALLOCS: AtomicI64 = AtomicI64::new(0);
static ALLOC_BYTES: AtomicI64 = AtomicI64::new(0);
static LIVE_BY_CLASS: [AtomicI64; 40] = [const { AtomicI64::new(0) }; 40];

fn size_class(size: usize) -> usize {
    (usize::BITS - size.max(1).leading_zeros()) as usize % 40
}

fn count(size: usize, sign: i64) {
    if COUNTING.load(Ordering::Relaxed) {
        LIVE_BYTES.fetch_add(sign * size as i64, Ordering::Relaxed);
        LIVE_BY_CLASS[size_class(size)].fetch_add(sign, Ordering::Relaxed);
        if sign > 0 {
            ALLOCS.fetch_add(1, Ordering::Relaxed);
            ALLOC_BYTES.fetch_add(size as i64, Ordering::Relaxed);
        }
    }
}

// SAFETY: every call is forwarded to mimalloc unchanged; the counters only observe sizes.
unsafe impl std::alloc::GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: std::alloc::Layout) -> *mut u8 {
        count(layout.size(), 1);
        // SAFETY: forwarded with the caller's guarantees.
        unsafe { mimalloc::MiMalloc.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: std::alloc::Layout) {
        count(layout.size(), -1);
        // SAFETY: forwarded with the caller's guarantees.
        unsafe { mimalloc::MiMalloc.dealloc(ptr, layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: std::alloc::Layout) -> *mut u8 {
        count(layout.size(), 1);
        // SAFETY: forwarded with the caller's guarantees.
        unsafe { mimalloc::MiMalloc.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: std::alloc::Layout, new: usize) -> *mut u8 {
        count(layout.size(), -1);
        count(new, 1);
        // SAFETY: forwarded with the caller's guarantees.
        unsafe { mimalloc::MiMalloc.realloc(ptr, layout, new) }
    }
}

fn heap_snapshot() -> (i64, Vec<i64>) {
    (
        LIVE_BYTES.load(Ordering::Relaxed),
        LIVE_BY_CLASS
            .iter()
            .map(|c| c.load(Ordering::Relaxed))
            .collect(),
    )
}

use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::time::{Duration, Instant};

use broca::core::admission::SendRequest;
use broca::provider::credential::EnvSecrets;
use broca::session::SessionActor;
use broca::transport::{Endpoints, HttpModelClient};
use broca::wal::SessionTriple;
use broca_bench::{percentile, raise_fd_limit};
use broca_io::http_server::{RequestDecoder, ServerLimits};
use broca_io::net::proxy::ProxyConfig;
use broca_io::net::{tls, ClientConfig, HttpClient};
use broca_io::{Committer, LogConfig};
use broca_testkit::CountingTools;
use futures_lite::{AsyncReadExt, AsyncWriteExt};

const TOOL_STEP: &str = "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\",\"usage\":{\"input_tokens\":50,\"output_tokens\":1}}}\n\n\
event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"tool_use\",\"id\":\"toolu_1\",\"name\":\"echo\",\"input\":{}}}\n\n\
event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"input_json_delta\",\"partial_json\":\"{\\\"x\\\":1}\"}}\n\n\
event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}\n\n\
event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"tool_use\"},\"usage\":{\"output_tokens\":9}}\n\n\
event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n";

const TEXT_STEP: &str = "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_2\",\"usage\":{\"input_tokens\":70,\"output_tokens\":1}}}\n\n\
event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n\
event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"Done.\"}}\n\n\
event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}\n\n\
event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":{\"output_tokens\":3}}\n\n\
event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n";

/// The provider: answers every request at once on a keep-alive connection. It dies with the
/// bench (a failed workload must not leave it holding the terminal's pipe).
fn provider_main() {
    // SAFETY: prctl on this process, asking for SIGKILL when the parent exits.
    unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) };
    let ex = glommio::LocalExecutorBuilder::new(glommio::Placement::Fixed(1))
        .make()
        .expect("an executor");
    ex.run(async {
        let l = glommio::net::TcpListener::bind("127.0.0.1:0").unwrap();
        println!("{}", l.local_addr().unwrap().port());
        use std::io::Write;
        std::io::stdout().flush().unwrap();
        loop {
            let Ok(mut s) = l.accept().await else {
                continue;
            };
            glommio::spawn_local(async move {
                let mut dec = RequestDecoder::new(ServerLimits::default());
                let mut buf = vec![0u8; 64 * 1024];
                loop {
                    while let Ok(Some((_, body))) = dec.next() {
                        let tool_result = memchr::memmem::find(&body, b"tool_result").is_some();
                        let answer = if tool_result { TEXT_STEP } else { TOOL_STEP };
                        let out = broca_io::http_server::response(
                            200,
                            "text/event-stream",
                            answer.as_bytes(),
                            true,
                        );
                        if s.write_all(&out).await.is_err() {
                            return;
                        }
                    }
                    match s.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => dec.push(&buf[..n]),
                    }
                }
            })
            .detach();
        }
    });
}

fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1).and_then(|v| v.parse().ok()))
        })
        .unwrap_or(0)
}

/// Runs in one session before the next run moves to a fresh one.
const RUNS_PER_SESSION: usize = 25;

struct Outcome {
    steps: u64,
    elapsed: Duration,
    run_latencies: Vec<u64>,
    rss_before: u64,
    /// Once every session is open, before the runs.
    rss_open: u64,
    rss_peak: u64,
    rss_after_close: u64,
    fsync_p50_us: u64,
    fsync_count: u64,
    /// Per run: its latency less the fdatasync time of its log during the run, in µs.
    above_fsync: Vec<u64>,
    /// Live heap bytes before the sessions and at the sampled peak, with the live allocations
    /// per size class at both moments (only with `BROCA_BENCH_HEAP=1`).
    heap_before: (i64, Vec<i64>),
    heap_open: (i64, Vec<i64>),
    heap_peak: (i64, Vec<i64>),
    /// What the runs' window cost (with `BROCA_BENCH_COST=1`).
    cost: Option<Cost>,
}

/// The runs' window's costs, whole (divided by the steps when printed).
struct Cost {
    process: broca_bench::cost::Snapshot,
    perf: Vec<(String, u64)>,
    allocs: i64,
    alloc_bytes: i64,
    appended: u64,
    appends: u64,
    written: u64,
    fsyncs: u64,
    http_out: u64,
    http_in: u64,
}

fn costing() -> bool {
    std::env::var_os("BROCA_BENCH_COST").is_some_and(|v| v == "1")
}

/// Runs `work` on a new executor pinned to CPU 0 (the shard) and waits for its result.
fn on_shard<T: Send + 'static, F: std::future::Future<Output = T>>(
    work: impl FnOnce() -> F + Send + 'static,
) -> T {
    std::thread::spawn(move || {
        glommio::LocalExecutorBuilder::new(glommio::Placement::Fixed(0))
            .io_memory(broca_shards::IO_MEMORY_BYTES)
            .make()
            .expect("an executor")
            .run(work())
    })
    .join()
    .expect("the shard's work finishes")
}

fn workload(dir: &std::path::Path, port: u16, sessions: usize, runs: usize) -> Outcome {
    let dir = dir.to_path_buf();
    on_shard(move || async move {
        let mut cfg = ClientConfig::new(tls::client_config(&[]).unwrap(), ProxyConfig::default());
        cfg.idle_per_origin = sessions + 16;
        let http = HttpClient::new(cfg);
        let mut endpoints = Endpoints::default();
        endpoints
            .set("anthropic", &format!("http://127.0.0.1:{port}"))
            .unwrap();
        let model = Rc::new(HttpModelClient::new(http, endpoints, Box::new(EnvSecrets)));
        let committer = Committer::default();
        let tools = CountingTools::default();
        let rss_before = rss_kib();
        let heap_before = heap_snapshot();
        let peak = Rc::new(Cell::new(rss_before));
        let heap_peak = Rc::new(RefCell::new(heap_before.clone()));
        let sampling = Rc::new(Cell::new(true));
        let (p, hp, on) = (peak.clone(), heap_peak.clone(), sampling.clone());
        glommio::spawn_local(async move {
            while on.get() {
                p.set(p.get().max(rss_kib()));
                let now = heap_snapshot();
                if now.0 > hp.borrow().0 {
                    *hp.borrow_mut() = now;
                }
                glommio::timer::sleep(Duration::from_millis(5)).await;
            }
        })
        .detach();
        // Every session opens first; the runs start together once all are open, so the peak
        // measured during the runs is the runs' own.
        let opened = Rc::new(Cell::new(0usize));
        let gate = Rc::new(glommio::sync::Semaphore::new(0));
        let mut tasks = Vec::new();
        for i in 0..sessions {
            let (dir, model, committer, tools, opened, gate) = (
                dir.clone(),
                model.clone(),
                committer.clone(),
                tools.clone(),
                opened.clone(),
                gate.clone(),
            );
            tasks.push(glommio::spawn_local(async move {
                let tools = Rc::new(tools);
                let open = |k: usize| {
                    let name = format!("s{i}-{k}");
                    let (dir, model, tools, committer) =
                        (dir.clone(), model.clone(), tools.clone(), committer.clone());
                    async move {
                        let triple = SessionTriple::new("/bench", "serve-steps", &name).unwrap();
                        SessionActor::opener(&dir, &triple, model, tools)
                            .tool_specs(CountingTools::specs(&["echo"]))
                            .log(LogConfig::default())
                            .committer(committer)
                            .open()
                            .await
                            .expect("the session opens")
                    }
                };
                let mut actor = open(0).await;
                opened.set(opened.get() + 1);
                let _ = gate.acquire(1).await;
                let mut lat = Vec::with_capacity(runs);
                let mut above_fsync = Vec::with_capacity(runs);
                let mut steps = 0u64;
                for r in 0..runs {
                    if r > 0 && r % RUNS_PER_SESSION == 0 {
                        // A fresh session: a transcript that grew over thousands of runs
                        // would make each step render far more than an agent's usually does.
                        actor.close().await.expect("closes");
                        actor = open(r / RUNS_PER_SESSION).await;
                    }
                    let fsync_us = committer.stats().fsync_latency_sum_us;
                    let t = Instant::now();
                    let req = SendRequest {
                        prompt: format!("run {r}"),
                        model: "anthropic/bench".into(),
                        credential_id: Some("env:BROCA_BENCH_KEY".into()),
                        ..SendRequest::default()
                    };
                    actor.send(&req).await.expect("admitted");
                    let outcome = actor.run_admitted().await.expect("the run ends");
                    assert_eq!(outcome.reason.map(|k| k.as_str()), Some("completed"));
                    let took = t.elapsed().as_micros() as u64;
                    lat.push(took);
                    // Alone on the shard, the committer's fsync time during the run is this
                    // log's.
                    let synced = committer.stats().fsync_latency_sum_us - fsync_us;
                    above_fsync.push(took.saturating_sub(synced));
                    steps += 2;
                }
                actor.close().await.expect("closes");
                (steps, lat, above_fsync)
            }));
        }
        while opened.get() < sessions {
            glommio::timer::sleep(Duration::from_millis(1)).await;
        }
        let rss_open = rss_kib();
        let heap_open = heap_snapshot();
        peak.set(rss_open);
        *heap_peak.borrow_mut() = heap_open.clone();
        let costed = costing().then(|| {
            let perf =
                broca_bench::cost::PerfStat::start(&["raw_syscalls:sys_enter", "context-switches"]);
            (
                perf,
                broca_bench::cost::snapshot(),
                ALLOCS.load(Ordering::Relaxed),
                ALLOC_BYTES.load(Ordering::Relaxed),
                committer.stats(),
                http_stats(&model),
            )
        });
        let start = Instant::now();
        gate.signal(sessions as u64);
        let mut steps = 0;
        let mut run_latencies = Vec::new();
        let mut above_fsync = Vec::new();
        for t in tasks {
            let (s, l, a) = t.await;
            steps += s;
            run_latencies.extend(l);
            above_fsync.extend(a);
        }
        let elapsed = start.elapsed();
        let cost = costed.map(|(perf, before, allocs, alloc_bytes, commits, http)| {
            let process = broca_bench::cost::snapshot() - before;
            let (allocs_after, bytes_after) = (
                ALLOCS.load(Ordering::Relaxed),
                ALLOC_BYTES.load(Ordering::Relaxed),
            );
            let now = committer.stats();
            let http_now = http_stats(&model);
            Cost {
                process,
                perf: perf.map(|p| p.stop()).unwrap_or_default(),
                allocs: allocs_after - allocs,
                alloc_bytes: bytes_after - alloc_bytes,
                appended: now.append_bytes - commits.append_bytes,
                appends: now.appends - commits.appends,
                written: now.write_bytes - commits.write_bytes,
                fsyncs: now.fsyncs - commits.fsyncs,
                http_out: http_now.0 - http.0,
                http_in: http_now.1 - http.1,
            }
        });
        sampling.set(false);
        glommio::timer::sleep(Duration::from_millis(20)).await;
        let stats = committer.stats();
        // The median fsync from the histogram (the bucket's upper bound).
        let half = stats.fsyncs.div_ceil(2);
        let mut seen = 0;
        let mut fsync_p50_us = 0;
        for (i, n) in stats.fsync_latency_buckets.iter().enumerate() {
            seen += n;
            if seen >= half {
                fsync_p50_us = *broca_io::commit::FSYNC_LATENCY_BUCKETS_US
                    .get(i)
                    .unwrap_or(&u64::MAX);
                break;
            }
        }
        Outcome {
            steps,
            elapsed,
            run_latencies,
            rss_before,
            rss_open,
            rss_peak: peak.get(),
            rss_after_close: rss_kib(),
            fsync_p50_us,
            fsync_count: stats.fsyncs,
            above_fsync,
            heap_before,
            heap_open,
            heap_peak: heap_peak.take(),
            cost,
        }
    })
}

/// The provider client's bytes out and in so far.
fn http_stats(model: &HttpModelClient) -> (u64, u64) {
    let s = model.http().stats();
    (s.bytes_out, s.bytes_in)
}

/// One row of the cost table: what a durable step cost, on average over the window.
fn print_cost(sessions: usize, steps: u64, elapsed: Duration, c: &Cost) {
    let per = |v: u64| v as f64 / steps.max(1) as f64;
    let perf = |name: &str| {
        c.perf
            .iter()
            .find(|(e, _)| e == name)
            .map_or("n/a".to_string(), |(_, n)| format!("{:.1}", per(*n)))
    };
    let p = &c.process;
    println!(
        "| {sessions} | {steps} | {:.0} | {:.1} / {:.1} | {:.2} / {:.2} | {} | {:.1} / {:.0} | {:.1} / {:.0} / {:.0} | {:.2} | {:.0} / {:.0} |",
        steps as f64 / elapsed.as_secs_f64(),
        per(p.user_us),
        per(p.sys_us),
        per(p.voluntary_switches),
        per(p.involuntary_switches),
        perf("raw_syscalls:sys_enter"),
        c.allocs as f64 / steps.max(1) as f64,
        c.alloc_bytes as f64 / steps.max(1) as f64,
        per(c.appends),
        per(c.appended),
        per(c.written),
        per(c.fsyncs),
        per(c.http_out),
        per(c.http_in),
    );
}

/// The loopback provider's bare round trip as the transport's HTTP client sees it: a POST of
/// `body_len` bytes and its whole streamed answer read, `n` times in a row; latencies in µs.
fn provider_round_trips(port: u16, n: usize, body_len: usize) -> Vec<u64> {
    on_shard(move || async move {
        let http = HttpClient::new(ClientConfig::new(
            tls::client_config(&[]).unwrap(),
            ProxyConfig::default(),
        ));
        let url = broca_io::net::Url::parse(&format!("http://127.0.0.1:{port}")).unwrap();
        let body = vec![b' '; body_len];
        let mut out = Vec::with_capacity(n);
        for _ in 0..n {
            let t = Instant::now();
            let req = broca_io::net::client::Request {
                method: "POST",
                url: &url,
                path: "/v1/messages",
                headers: &[("content-type", "application/json")],
                body: &body,
            };
            let mut resp = http.send(&req).await.expect("the provider answers");
            while resp.chunk().await.expect("the body").is_some() {}
            out.push(t.elapsed().as_micros() as u64);
        }
        out
    })
}

/// Opens and closes `n` sessions (each WAL created with its header and lease record), 1,000
/// at a time, as an idle daemon's sessions come and go; RSS before, and after all are closed.
fn sessions_on_disk(dir: &std::path::Path, n: usize) -> (u64, u64, Duration) {
    let dir = dir.to_path_buf();
    on_shard(move || async move {
        let before = rss_kib();
        let start = Instant::now();
        let committer = Committer::default();
        let model = Rc::new(HttpModelClient::new(
            HttpClient::new(ClientConfig::new(
                tls::client_config(&[]).unwrap(),
                ProxyConfig::default(),
            )),
            Endpoints::default(),
            Box::new(EnvSecrets),
        ));
        for chunk in (0..n).collect::<Vec<_>>().chunks(1000) {
            let mut tasks = Vec::new();
            for &i in chunk {
                let (dir, committer, model) = (dir.clone(), committer.clone(), model.clone());
                tasks.push(glommio::spawn_local(async move {
                    let triple = SessionTriple::new("/bench", "on-disk", &format!("s{i}")).unwrap();
                    let actor = SessionActor::opener(
                        &dir,
                        &triple,
                        model,
                        Rc::new(CountingTools::default()),
                    )
                    .tool_specs(Vec::new())
                    .log(LogConfig::default())
                    .committer(committer)
                    .open()
                    .await
                    .expect("the session opens");
                    actor.close().await.expect("closes");
                }));
            }
            for t in tasks {
                t.await;
            }
        }
        (before, rss_kib(), start.elapsed())
    })
}

fn main() {
    COUNTING.store(
        std::env::var_os("BROCA_BENCH_HEAP").is_some_and(|v| v == "1") || costing(),
        Ordering::Relaxed,
    );
    if let Some(n) = std::env::var("BROCA_BENCH_ON_DISK")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
    {
        let base = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/bench-serve");
        std::fs::create_dir_all(&base).unwrap();
        let dir = tempfile::tempdir_in(&base).unwrap();
        let heap_before = heap_snapshot().0;
        let (before, after, took) = sessions_on_disk(dir.path(), n);
        if COUNTING.load(Ordering::Relaxed) {
            println!(
                "live heap after - before: {} bytes ({:.2} per session)",
                heap_snapshot().0 - heap_before,
                (heap_snapshot().0 - heap_before) as f64 / n as f64
            );
        }
        println!(
            "{n} sessions created and closed in {:.1} s ({:.0}/s); RSS before {} MiB, after {} MiB",
            took.as_secs_f64(),
            n as f64 / took.as_secs_f64(),
            before / 1024,
            after / 1024
        );
        return;
    }
    if std::env::var_os("BROCA_BENCH_ROLE").is_some_and(|r| r == "provider") {
        provider_main();
        return;
    }
    if std::env::args().any(|a| a == "--list") {
        println!("serve_steps: bench");
        return;
    }
    raise_fd_limit(65_536);
    // SAFETY: setting an environment variable before any thread reads it.
    unsafe { std::env::set_var("BROCA_BENCH_KEY", "sk-bench-not-a-secret") };
    let mut provider = std::process::Command::new(std::env::current_exe().unwrap())
        .env("BROCA_BENCH_ROLE", "provider")
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("the provider starts");
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(provider.stdout.take().unwrap()),
        &mut line,
    )
    .unwrap();
    let port: u16 = line.trim().parse().expect("the provider's port");
    if costing() {
        // For a profile of the bench alone (bench/peers/cost_parts.py takes this pid).
        eprintln!(
            "cost: the bench is pid {}, its provider pid {}",
            std::process::id(),
            provider.id()
        );
    }
    let sessions: Vec<usize> = std::env::var("BROCA_BENCH_SESSIONS")
        .unwrap_or_else(|_| "1,100,5000".into())
        .split(',')
        .map(|v| v.trim().parse().expect("a session count"))
        .collect();
    let base = std::env::var_os("BROCA_BENCH_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| {
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/bench-serve")
        });
    std::fs::create_dir_all(&base).unwrap();
    println!("| sessions | runs each | model steps | steps/s | run p50 / p99 | fsync p50 | fsyncs | RSS before / open / peak / after close |");
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|");
    let mut costs = Vec::new();
    for n in sessions {
        let runs = std::env::var("BROCA_BENCH_RUNS")
            .ok()
            .map(|v| v.parse().unwrap())
            .unwrap_or(if n == 1 {
                2000
            } else if n <= 100 {
                40
            } else {
                2
            });
        let dir = tempfile::tempdir_in(&base).unwrap();
        let mut o = workload(dir.path(), port, n, runs);
        if let Some(c) = o.cost.take() {
            costs.push((n, o.steps, o.elapsed, c));
        }
        let mut lat: Vec<Duration> = o
            .run_latencies
            .iter()
            .map(|&us| Duration::from_micros(us))
            .collect();
        lat.sort();
        println!(
            "| {n} | {runs} | {} | {:.0} | {} / {} µs | {} | {} | {} / {} / {} / {} MiB |",
            o.steps,
            o.steps as f64 / o.elapsed.as_secs_f64(),
            percentile(&lat, 50.0).as_micros(),
            percentile(&lat, 99.0).as_micros(),
            match o.fsync_p50_us {
                u64::MAX => format!(
                    ">{} µs",
                    broca_io::commit::FSYNC_LATENCY_BUCKETS_US.last().unwrap()
                ),
                us => format!("≤{us} µs"),
            },
            o.fsync_count,
            o.rss_before / 1024,
            o.rss_open / 1024,
            o.rss_peak / 1024,
            o.rss_after_close / 1024,
        );
        if n == 1 {
            // Per step: half a run (two model steps) less its log's fdatasync time.
            let mut above: Vec<Duration> = o
                .above_fsync
                .iter()
                .map(|&us| Duration::from_micros(us / 2))
                .collect();
            above.sort();
            let mut bare: Vec<Duration> = provider_round_trips(port, 2000, 4096)
                .into_iter()
                .map(Duration::from_micros)
                .collect();
            bare.sort();
            println!(
                "|  | per step above fdatasync: p50 {} µs, p99 {} µs; the provider's bare loopback \
                 round trip (4 KiB POST, whole answer): p50 {} µs, p99 {} µs |",
                percentile(&above, 50.0).as_micros(),
                percentile(&above, 99.0).as_micros(),
                percentile(&bare, 50.0).as_micros(),
                percentile(&bare, 99.0).as_micros(),
            );
        }
        if n > 1 {
            let per = |a: u64, b: u64| a.saturating_sub(b) * 1024 / n as u64 / 1024;
            println!(
                "|  | RSS per open session: {} KiB; per run in flight (peak - open): {} KiB |",
                per(o.rss_open, o.rss_before),
                per(o.rss_peak, o.rss_open)
            );
        }
        if COUNTING.load(Ordering::Relaxed) && n > 1 {
            let (before, _) = &o.heap_before;
            let (open, by_class_before) = &o.heap_open;
            let (peak, by_class_peak) = &o.heap_peak;
            println!(
                "|  | live heap per open session: {} B; per run in flight (peak - open): {} B |",
                (open - before) / n as i64,
                (peak - open) / n as i64
            );
            for (class, (b, p)) in by_class_before.iter().zip(by_class_peak).enumerate() {
                let extra = p - b;
                if extra.abs() >= n as i64 / 10 {
                    let hi = 1u64 << class;
                    println!(
                        "|  | size {}..{} B: {:+} live allocations ({:+.2} per session) |",
                        hi / 2,
                        hi,
                        extra,
                        extra as f64 / n as f64
                    );
                }
            }
        }
    }
    if !costs.is_empty() {
        println!();
        println!("Per durable step (model step), over the runs' window:");
        println!("| sessions | steps | steps/s | CPU user / sys µs | switches vol / invol | syscalls | allocs / bytes | WAL appends / bytes appended / written | fsyncs | HTTP bytes out / in |");
        println!("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
        for (n, steps, elapsed, c) in &costs {
            print_cost(*n, *steps, *elapsed, c);
        }
    }
    let _ = provider.kill();
}
