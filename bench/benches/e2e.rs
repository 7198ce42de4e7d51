//! End to end: the release `broca serve` driven as users drive it, against LangGraph and DBOS
//! on the same workload, provider and machine, in one run. Not part of CI (it is compiled
//! there).
//!
//! Run: `cargo bench -p broca-bench --bench e2e` (quick: under 5 minutes, one JSON line at the
//! end); `BROCA_E2E_MODE=full` for BENCHMARKS.md (longer windows, more rows). Other settings:
//! `BROCA_E2E_SESSIONS` (closed-loop rows, default 1,100,1000), `BROCA_E2E_PEERS=0` (broca
//! only), `BROCA_E2E_SECS` (each window).
//!
//! The workload: per session one subscriber (SSE; one row over WebSocket) reading the control
//! lane and one keep-alive connection for `session.send`; each send a 10-step tool-calling loop
//! (the loopback provider asks for the no-op tool 9 times, then answers); the tool from a real
//! MCP server over stdio (the bench binary itself as `broca-bench-noop`, one tool, answered at
//! once). The provider (pre-rendered Anthropic SSE answers on keep-alive connections, or a
//! streaming mode trickling tokens) and the no-op server run in processes of their own so that
//! their CPU shares are read from /proc beside broca's and the generator's.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use broca_bench::loadgen::{self, Figures, Mark, Mode, Plan, Target};
use broca_bench::peer::{
    broca_release_bin, cpu_secs, request, rss_anon_file_kib, rss_kib_and_fds, status_kib, Daemon,
};
use broca_bench::{floors, raise_fd_limit, roles};
use serde_json::{json, Value};

/// serve's `idle_secs` in every row: the sessions a generator's task moved on from close this
/// long after their last run (the default, 30 s, keeps hundreds of them open in a window).
const IDLE_SECS: u64 = 5;

fn env_str(name: &str, default: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| default.to_string())
}

/// The loopback provider in a process of its own.
struct Provider {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    port: u16,
    url: String,
}

impl Drop for Provider {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Provider {
    fn start(tool_steps: usize, stream_tokens: usize) -> Provider {
        let mut child = Command::new(std::env::current_exe().expect("this binary"))
            .env("BROCA_E2E_ROLE", "provider")
            .env("E2E_TOOL_STEPS", tool_steps.to_string())
            .env("E2E_STREAM_TOKENS", stream_tokens.to_string())
            .env("E2E_TOKENS_PER_S", "50")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("the provider starts");
        let stdin = child.stdin.take().expect("stdin");
        let mut stdout = BufReader::new(child.stdout.take().expect("stdout"));
        let mut line = String::new();
        stdout.read_line(&mut line).expect("the provider's port");
        let port: u16 = line.trim().parse().expect("the provider's port");
        Provider {
            child,
            stdin,
            stdout,
            port,
            url: format!("http://127.0.0.1:{port}"),
        }
    }

    /// What the provider measured since the last report.
    fn report(&mut self) -> Value {
        let _ = writeln!(self.stdin, "report");
        let _ = self.stdin.flush();
        let mut line = String::new();
        let _ = self.stdout.read_line(&mut line);
        serde_json::from_str(&line).unwrap_or(Value::Null)
    }

    fn cpu(&self) -> f64 {
        cpu_secs(self.child.id())
    }
}

/// Counters of the daemon read at a mark.
#[derive(Clone, Copy, Default, Debug)]
struct Sample {
    broca_cpu: f64,
    provider_cpu: f64,
    mcp_cpu: f64,
    fsyncs: f64,
    fsync_secs: f64,
    defer_timeouts: f64,
    rss_kib: u64,
    anon_kib: u64,
    file_kib: u64,
    /// broca's own account by kind (/metrics `broca_memory_bytes`).
    store_map_bytes: f64,
    wal_cache_bytes: f64,
    /// The shards' held rendered prefixes (/metrics `broca_render_prefix_bytes`).
    prefix_bytes: f64,
}

fn metric_sum(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(name) && l[name.len()..].starts_with('{'))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// `broca_memory_bytes{kind="KIND"}`.
fn metric_kind(text: &str, kind: &str) -> f64 {
    let line = format!("broca_memory_bytes{{kind=\"{kind}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&line)?.parse::<f64>().ok())
        .unwrap_or(0.0)
}

struct Probe {
    addr: String,
    handle: String,
    broca: u32,
    provider: u32,
    mcp_pid_file: PathBuf,
}

impl Probe {
    fn sample(&self) -> Sample {
        let metrics = request(&self.addr, &self.handle, "GET", "/metrics", "")
            .map(|(_, b)| String::from_utf8_lossy(&b).into_owned())
            .unwrap_or_default();
        let mcp = std::fs::read_to_string(&self.mcp_pid_file)
            .ok()
            .and_then(|p| p.trim().parse().ok())
            .map_or(0.0, cpu_secs);
        Sample {
            broca_cpu: cpu_secs(self.broca),
            provider_cpu: cpu_secs(self.provider),
            mcp_cpu: mcp,
            fsyncs: metric_sum(&metrics, "broca_wal_fsyncs_total"),
            fsync_secs: metric_sum(&metrics, "broca_wal_fsync_seconds_sum"),
            defer_timeouts: metric_sum(&metrics, "broca_wal_defer_timeouts_total"),
            rss_kib: rss_kib_and_fds(self.broca).0,
            anon_kib: rss_anon_file_kib(self.broca).0,
            file_kib: rss_anon_file_kib(self.broca).1,
            store_map_bytes: metric_kind(&metrics, "store_map"),
            wal_cache_bytes: metric_kind(&metrics, "wal_page_cache"),
            prefix_bytes: metric_sum(&metrics, "broca_render_prefix_bytes"),
        }
    }
}

fn peak_rss_kib(pid: u32) -> u64 {
    status_kib(pid, "VmHWM:")
}

fn pct(sorted: &[u32], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1] as f64
}

fn round(v: f64, digits: i32) -> f64 {
    let m = 10f64.powi(digits);
    (v * m).round() / m
}

/// One workload against a fresh daemon (fresh state directory, fresh provider).
fn broca_row(
    bin: &Path,
    work: &Path,
    label: &str,
    plan: Plan,
    stream_tokens: usize,
    serve_config: Value,
) -> Value {
    let tool_steps = if stream_tokens > 0 { 1 } else { 9 };
    let mut provider = Provider::start(tool_steps, stream_tokens);
    let state = kept_dir(work);
    let mcp_pid_file = state.join("mcp.pid");
    let tools = state.join("tools.json");
    std::fs::write(
        &tools,
        json!({"mcp": [{"name": "noop",
            "command": [std::env::current_exe().expect("this binary")],
            "env": {"BROCA_E2E_ROLE": "mcp", "E2E_MCP_PID_FILE": &mcp_pid_file},
            "max_concurrency": 64}]})
        .to_string(),
    )
    .expect("the tools config");
    let config = state.join("serve.json");
    let mut serve_config = serve_config;
    serve_config["idle_secs"] = json!(IDLE_SECS);
    std::fs::write(&config, serve_config.to_string()).expect("the serve config");
    let daemon = Daemon::start(
        bin,
        &state.join("state"),
        &provider.url,
        &[
            "--tools-config",
            tools.to_str().expect("utf-8"),
            "--config",
            config.to_str().expect("utf-8"),
        ],
    );
    let base_rss = rss_kib_and_fds(daemon.pid()).0;
    let probe = Probe {
        addr: daemon.addr.clone(),
        handle: daemon.handle.clone(),
        broca: daemon.pid(),
        provider: provider.child.id(),
        mcp_pid_file,
    };
    let marks: Arc<Mutex<Vec<(Mark, Sample)>>> = Arc::default();
    let recorded = marks.clone();
    let target = Target {
        addr: daemon.addr.parse().expect("a socket address"),
        handle: daemon.handle.clone(),
    };
    let sessions = plan.sessions;
    let mode = plan.mode;
    let probe_pid = daemon.pid();
    let started = Instant::now();
    let f: Figures = loadgen::run(target, plan, move |m| {
        let s = probe.sample();
        recorded.lock().expect("marks").push((m, s));
    });
    let peak = peak_rss_kib(daemon.pid());
    let gaps = provider.report();
    let marks = marks.lock().expect("marks").clone();
    let at = |m: Mark| {
        marks
            .iter()
            .find(|(k, _)| *k == m)
            .map(|(_, s)| *s)
            .unwrap_or_default()
    };
    let (ready, s0, s1) = (at(Mark::Ready), at(Mark::Start), at(Mark::End));
    let secs = f.window.as_secs_f64().max(1e-9);
    let steps = f.steps.max(1) as f64;
    let fsyncs = s1.fsyncs - s0.fsyncs;
    let row = json!({
        "label": label,
        "sessions": sessions,
        "mode": format!("{mode:?}"),
        "window_s": round(secs, 2),
        "steps": f.steps,
        "sends": f.sends,
        "errors": f.errors,
        "first_error": f.first_error,
        "late_sends": f.late,
        "sends_retried_after_503": f.retried,
        "sends_retried_503_codes": f
            .retried_codes
            .iter()
            .map(|(code, n)| (code.clone(), json!(n)))
            .collect::<serde_json::Map<_, _>>(),
        "steps_per_s": round(f.steps as f64 / secs, 0),
        "step_p50_ms": round(pct(&f.gaps_us, 50.0) / 1e3, 3),
        "step_p99_ms": round(pct(&f.gaps_us, 99.0) / 1e3, 3),
        "step_p999_ms": round(pct(&f.gaps_us, 99.9) / 1e3, 3),
        "send_to_first_step_p50_ms": round(pct(&f.first_step_us, 50.0) / 1e3, 3),
        "provider_to_next_request_p50_us": gaps["gap_p50_us"],
        "provider_to_next_request_p99_us": gaps["gap_p99_us"],
        "broca_cpu_us_per_step": round((s1.broca_cpu - s0.broca_cpu) * 1e6 / steps, 1),
        "broca_cores": round((s1.broca_cpu - s0.broca_cpu) / secs, 2),
        "provider_cores": round((s1.provider_cpu - s0.provider_cpu) / secs, 2),
        "mcp_cores": round((s1.mcp_cpu - s0.mcp_cpu) / secs, 2),
        "generator_cores": round(f.cpu_s / secs, 2),
        "fsyncs_per_step": round(fsyncs / steps, 3),
        "defer_timeouts_per_step": round((s1.defer_timeouts - s0.defer_timeouts) / steps, 3),
        "fsync_mean_us": round(if fsyncs > 0.0 { (s1.fsync_secs - s0.fsync_secs) * 1e6 / fsyncs } else { 0.0 }, 1),
        "rss_idle_mib": round(base_rss as f64 / 1024.0, 1),
        "rss_subscribed_mib": round(ready.rss_kib as f64 / 1024.0, 1),
        "peak_rss_mib": round(peak as f64 / 1024.0, 1),
        "rss_end_anon_mib": round(s1.anon_kib as f64 / 1024.0, 1),
        "rss_end_file_mib": round(s1.file_kib as f64 / 1024.0, 1),
        "store_map_end_mib": round(s1.store_map_bytes / 1048576.0, 1),
        "wal_page_cache_end_mib": round(s1.wal_cache_bytes / 1048576.0, 1),
        "render_prefix_end_mib": round(s1.prefix_bytes / 1048576.0, 1),
        "open_fds_end": rss_kib_and_fds(probe_pid).1,
        "rss_per_session_kib": round((peak.saturating_sub(base_rss)) as f64 / sessions as f64, 1),
        "display_p50_ms": round(pct(&f.display_us, 50.0) / 1e3, 3),
        "display_p99_ms": round(pct(&f.display_us, 99.0) / 1e3, 3),
        "display_tokens": f.display_us.len(),
        "display_dropped": f.display_dropped,
        "took_s": round(started.elapsed().as_secs_f64(), 1),
    });
    eprintln!("{row}");
    drop(daemon);
    row
}

/// The peers' virtualenv (created with their pinned packages on first use).
fn peers_python() -> Option<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let venv = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("../target"))
        .join("e2e-peers-venv");
    let python = venv.join("bin/python");
    let marker = venv.join(".installed");
    let reqs = root.join("peers/requirements.txt");
    let want = std::fs::read_to_string(&reqs).ok()?;
    if std::fs::read_to_string(&marker).ok().as_deref() == Some(want.as_str()) {
        return Some(python);
    }
    eprintln!("creating the peers' virtualenv in {}", venv.display());
    let ok = Command::new("python3")
        .args(["-m", "venv"])
        .arg(&venv)
        .status()
        .is_ok_and(|s| s.success())
        && Command::new(&python)
            .args([
                "-m",
                "pip",
                "install",
                "--quiet",
                "--disable-pip-version-check",
                "-r",
            ])
            .arg(&reqs)
            .status()
            .is_ok_and(|s| s.success());
    if !ok {
        eprintln!("the peers' virtualenv could not be made: peers skipped");
        return None;
    }
    let _ = std::fs::write(&marker, want);
    Some(python)
}

fn peer_row(python: &Path, work: &Path, peer: &str, sessions: usize, secs: f64) -> Value {
    let mut provider = Provider::start(9, 0);
    let state = kept_dir(work);
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("peers/e2e_peers.py");
    let cpu0 = provider.cpu();
    let out = Command::new(python)
        .arg(&script)
        .args([
            peer,
            &sessions.to_string(),
            &secs.to_string(),
            &provider.url,
        ])
        .arg(&state)
        .stderr(Stdio::inherit())
        .output();
    let cpu1 = provider.cpu();
    let gaps = provider.report();
    let mut row: Value = out
        .ok()
        .and_then(|o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .last()
                .and_then(|l| serde_json::from_str(l).ok())
        })
        .unwrap_or_else(|| json!({"peer": peer, "sessions": sessions, "failed": true}));
    row["provider_to_next_request_p50_us"] = gaps["gap_p50_us"].clone();
    row["provider_to_next_request_p99_us"] = gaps["gap_p99_us"].clone();
    row["provider_cpu_s"] = json!(round(cpu1 - cpu0, 2));
    if let (Some(steps), Some(cpu)) = (row["steps"].as_f64(), row["cpu_s"].as_f64()) {
        row["cpu_us_per_step"] = json!(round(cpu * 1e6 / steps.max(1.0), 1));
        row["cores"] = json!(round(cpu / secs, 2));
    }
    for k in ["step_p50_ms", "step_p99_ms", "steps_per_s", "cpu_s"] {
        if let Some(v) = row[k].as_f64() {
            row[k] = json!(round(v, 2));
        }
    }
    if let Some(kib) = row["peak_rss_kib"].as_f64() {
        row["peak_rss_mib"] = json!(round(kib / 1024.0, 1));
    }
    eprintln!("{row}");
    row
}

fn main() {
    match std::env::var("BROCA_E2E_ROLE").as_deref() {
        Ok("provider") => return roles::provider_main(),
        Ok("mcp") => return roles::noop_mcp_main(),
        _ => {}
    }
    let full = env_str("BROCA_E2E_MODE", "quick") == "full";
    let secs: f64 = env_str("BROCA_E2E_SECS", if full { "20" } else { "6" })
        .parse()
        .expect("BROCA_E2E_SECS: seconds");
    let sessions: Vec<usize> = env_str("BROCA_E2E_SESSIONS", "1,100,1000")
        .split(',')
        .filter_map(|s| s.trim().parse().ok())
        .collect();
    let with_peers = env_str("BROCA_E2E_PEERS", "1") != "0";
    let rows = env_str("BROCA_E2E_ROWS", "closed,once,websocket,open,streaming");
    let row = |name: &str| rows.split(',').any(|r| r == name);
    raise_fd_limit(262_144);
    let bin = broca_release_bin();
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let work_dir = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("target"))
        .join("e2e-work");
    std::fs::create_dir_all(&work_dir).expect("the work dir");
    let work = work_dir.as_path();
    let warm = Duration::from_secs(1);
    let plan = |tag: &str, n: usize, websocket: bool, mode: Mode| Plan {
        tag: tag.to_string(),
        sessions: n,
        websocket,
        keep_alive: n <= 2000,
        mode,
        warm,
    };
    let begun = Instant::now();
    let floors = measure_floors(work, if full { 5.0 } else { 2.0 });
    let mut broca = Vec::new();
    for &n in sessions.iter().filter(|_| row("closed")) {
        let label = format!("closed {n}");
        broca.push(broca_row(
            &bin,
            work,
            &label,
            plan("c", n, false, Mode::Closed { secs }),
            0,
            json!({}),
        ));
    }
    if row("once") {
        let p = plan("o", 10_000, false, Mode::Once);
        // 10,000 subscribers hold 10,000 of the 20,000 descriptors this machine allows a
        // process (a hard limit). serve's default descriptor budget keeps 1,666 sessions open
        // per shard (their WALs and provider connections: a third of the limit); a send
        // past it waits for an open session to close.
        broca.push(broca_row(&bin, work, "once 10000", p, 0, json!({})));
    }
    if row("websocket") {
        let n = if full { 1000 } else { 100 };
        let p = plan("w", n, true, Mode::Closed { secs });
        broca.push(broca_row(
            &bin,
            work,
            &format!("closed {n} websocket"),
            p,
            0,
            json!({}),
        ));
    }
    for rate in [1000.0, 5000.0].into_iter().filter(|_| row("open")) {
        let mode = Mode::Open {
            steps_per_s: rate,
            steps_per_send: 10,
            secs,
        };
        let p = plan("p", 1000, false, mode);
        let label = format!("open {rate} steps/s");
        broca.push(broca_row(&bin, work, &label, p, 0, json!({})));
    }
    if row("streaming") {
        let p = plan("s", 100, false, Mode::Once);
        broca.push(broca_row(&bin, work, "streaming 100", p, 300, json!({})));
    }
    let mut peers = Vec::new();
    if let Some(python) = with_peers.then(peers_python).flatten() {
        for &n in &sessions {
            for peer in ["langgraph-sync", "langgraph-async", "dbos"] {
                peers.push(peer_row(&python, work, peer, n, secs));
            }
        }
    }
    let ratios = ratios(&broca, &peers, &sessions);
    let targets = targets(&broca);
    print_tables(&broca, &peers);
    println!(
        "{}",
        json!({"mode": if full { "full" } else { "quick" }, "window_s": secs,
            "took_s": round(begun.elapsed().as_secs_f64(), 1), "floors": floors,
            "broca": broca, "peers": peers, "ratios": ratios, "targets": targets})
    );
    KEPT.with(|k| k.borrow_mut().clear());
}

thread_local! {
    static KEPT: std::cell::RefCell<Vec<tempfile::TempDir>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// A fresh directory in `work`, removed when the bench ends, not before: on ext4 without a
/// journal (this machine's) a file created within minutes of many deletions costs a scan past
/// the recently deleted inodes, so a row's files deleted at its end would tax the next
/// row's new WALs with the bench's own clean-up.
fn kept_dir(work: &Path) -> PathBuf {
    let dir = tempfile::tempdir_in(work).expect("a dir");
    let path = dir.path().to_path_buf();
    KEPT.with(|k| k.borrow_mut().push(dir));
    path
}

/// The disk's write + fdatasync ceiling over 1, 100 and 1,000 files, and the provider alone.
fn measure_floors(work: &Path, secs: f64) -> Value {
    let mut out = serde_json::Map::new();
    for files in [1, 100, 1000] {
        let dir = kept_dir(work);
        let f = floors::fsync_floor(&dir, files, secs);
        let v = json!({"ops_per_s": round(f.ops_per_s, 0), "cpu_us_per_op": round(f.cpu_us_per_op, 1),
            "p50_us": f.p50_us, "p99_us": f.p99_us});
        eprintln!("fdatasync floor, {files} files: {v}");
        out.insert(format!("fdatasync_{files}_files"), v);
    }
    // Creating a file, as each new session's WAL is (after this run's earlier deletions, if
    // any: none until the end, see `kept_dir`).
    let f = floors::create_floor(&kept_dir(work), 1000);
    let v = json!({"creates_per_s": round(f.ops_per_s, 0), "cpu_us_per_op": round(f.cpu_us_per_op, 1),
        "p50_us": f.p50_us, "p99_us": f.p99_us});
    eprintln!("file create floor, 1000 files: {v}");
    out.insert("create_1000_files".into(), v);
    let provider = Provider::start(9, 0);
    let mut body = String::from("{\"messages\":[{\"role\":\"user\",\"content\":\"bench-prompt\"}");
    for i in 0..9 {
        body.push_str(&format!(
            ",{{\"role\":\"user\",\"content\":[{{\"type\":\"tool_result\",\"tool_use_id\":\"x{i}\",\"content\":\"ok\"}}]}}"
        ));
    }
    body.push_str(&format!("],\"system\":\"{}\"}}", "x".repeat(3000)));
    let cpu0 = provider.cpu();
    let f = floors::provider_alone(provider.port, 64, body.into_bytes(), secs);
    let provider_cpu = provider.cpu() - cpu0;
    let v = json!({"requests_per_s": round(f.ops_per_s, 0),
        "provider_cpu_us_per_request": round(provider_cpu * 1e6 / (f.ops_per_s * secs).max(1.0), 1),
        "client_cpu_us_per_request": round(f.cpu_us_per_op, 1), "p50_us": f.p50_us, "p99_us": f.p99_us});
    eprintln!("provider alone, 64 connections: {v}");
    out.insert("provider_alone".into(), v);
    Value::Object(out)
}

/// The issue's targets, each with its measured figure and whether it is met.
fn targets(broca: &[Value]) -> Value {
    let row = |label: &str| broca.iter().find(|r| r["label"] == label);
    let f = |r: Option<&Value>, k: &str| r.and_then(|r| r[k].as_f64());
    let mut out = Vec::new();
    let mut check = |name: &str, value: Option<f64>, ok: fn(f64) -> bool| {
        out.push(json!({"target": name, "measured": value, "met": value.map(ok)}));
    };
    let c1000 = row("closed 1000");
    check(
        "1,000 sessions: >= 10,000 steps/s",
        f(c1000, "steps_per_s"),
        |v| v >= 10_000.0,
    );
    check(
        "1,000 sessions: peak RSS < 64 MiB",
        f(c1000, "peak_rss_mib"),
        |v| v < 64.0,
    );
    check(
        "1,000 sessions: <= 32 KiB per session",
        f(c1000, "rss_per_session_kib"),
        |v| v <= 32.0,
    );
    check(
        "1,000 sessions: < 100 µs CPU per step",
        f(c1000, "broca_cpu_us_per_step"),
        |v| v < 100.0,
    );
    check(
        "open loop 5,000 steps/s: p99 < 20 ms",
        f(row("open 5000 steps/s"), "step_p99_ms"),
        |v| v < 20.0,
    );
    let c1 = row("closed 1");
    let above = c1.and_then(|r| {
        Some(
            r["step_p99_ms"].as_f64()?
                - r["fsyncs_per_step"].as_f64()? * r["fsync_mean_us"].as_f64()? / 1e3,
        )
    });
    check(
        "1 session: step p99 less its fdatasync time < 1 ms",
        above,
        |v| v < 1.0,
    );
    let once = row("once 10000");
    check("10,000 sessions: no error", f(once, "errors"), |v| v == 0.0);
    check(
        "10,000 sessions: peak RSS < 400 MiB",
        f(once, "peak_rss_mib"),
        |v| v < 400.0,
    );
    check(
        "fdatasyncs per step, less deferral timeouts, <= 1.12 (per 50 steps of a session: its lease record, 5 RunStarted, 45 tool intents, 5 RunFinished)",
        c1000.and_then(|r| {
            Some(r["fsyncs_per_step"].as_f64()? - r["defer_timeouts_per_step"].as_f64()?)
        }),
        |v| v <= 1.12 + 1e-9,
    );
    Value::Array(out)
}

/// broca / peer for every figure of the closed-loop rows, at each session count.
fn ratios(broca: &[Value], peers: &[Value], sessions: &[usize]) -> Value {
    let mut out = Vec::new();
    for &n in sessions {
        let Some(b) = broca.iter().find(|r| r["label"] == format!("closed {n}")) else {
            continue;
        };
        for p in peers.iter().filter(|p| p["sessions"] == n) {
            let r = |bk: &str, pk: &str| match (b[bk].as_f64(), p[pk].as_f64()) {
                (Some(x), Some(y)) if y != 0.0 => json!(round(x / y, 2)),
                _ => Value::Null,
            };
            out.push(json!({
                "sessions": n, "peer": p["peer"],
                "steps_per_s": r("steps_per_s", "steps_per_s"),
                "step_p50": r("step_p50_ms", "step_p50_ms"),
                "step_p99": r("step_p99_ms", "step_p99_ms"),
                "cpu_per_step": r("broca_cpu_us_per_step", "cpu_us_per_step"),
                "peak_rss": r("peak_rss_mib", "peak_rss_mib"),
            }));
        }
    }
    Value::Array(out)
}

fn print_tables(broca: &[Value], peers: &[Value]) {
    println!("\n| workload | steps/s | step p50 / p99 / p999 ms | CPU µs/step | fsyncs/step | fsync mean µs | peak RSS MiB | KiB/session | cores: broca / provider / mcp / generator | errors |");
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for r in broca {
        println!(
            "| {} | {} | {} / {} / {} | {} | {} | {} | {} | {} | {} / {} / {} / {} | {} |",
            r["label"].as_str().unwrap_or(""),
            r["steps_per_s"],
            r["step_p50_ms"],
            r["step_p99_ms"],
            r["step_p999_ms"],
            r["broca_cpu_us_per_step"],
            r["fsyncs_per_step"],
            r["fsync_mean_us"],
            r["peak_rss_mib"],
            r["rss_per_session_kib"],
            r["broca_cores"],
            r["provider_cores"],
            r["mcp_cores"],
            r["generator_cores"],
            r["errors"],
        );
    }
    println!(
        "\n| peer | sessions | steps/s | step p50 / p99 ms | CPU µs/step | peak RSS MiB | errors |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|");
    for p in peers {
        println!(
            "| {} | {} | {} | {} / {} | {} | {} | {} |",
            p["peer"].as_str().unwrap_or(""),
            p["sessions"],
            p["steps_per_s"],
            p["step_p50_ms"],
            p["step_p99_ms"],
            p["cpu_us_per_step"],
            p["peak_rss_mib"],
            p["errors"],
        );
    }
}
