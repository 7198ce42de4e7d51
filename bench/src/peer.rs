//! Loopback peers for benchmarks that drive the real `broca serve` binary: a cheap
//! Anthropic-shaped provider (pre-rendered SSE answers on keep-alive connections, one thread
//! per connection) and the daemon itself, started and reached over TCP with its handle.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use broca_io::http_server::{RequestDecoder, ServerLimits};

/// One model step that asks for the tool `noop`.
pub const TOOL_STEP: &str = "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\",\"usage\":{\"input_tokens\":50,\"output_tokens\":1}}}\n\n\
event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"tool_use\",\"id\":\"toolu_1\",\"name\":\"noop\",\"input\":{}}}\n\n\
event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"input_json_delta\",\"partial_json\":\"{}\"}}\n\n\
event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}\n\n\
event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"tool_use\"},\"usage\":{\"output_tokens\":9}}\n\n\
event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n";

/// One model step that ends the turn with text.
pub const TEXT_STEP: &str = "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_2\",\"usage\":{\"input_tokens\":70,\"output_tokens\":1}}}\n\n\
event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n\
event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"Done.\"}}\n\n\
event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}\n\n\
event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":{\"output_tokens\":3}}\n\n\
event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n";

/// A loopback provider answering every request with [`TEXT_STEP`] (or [`TOOL_STEP`] while
/// the request has fewer than `tool_steps` tool results), on keep-alive connections.
pub struct FakeProvider {
    pub port: u16,
    pub requests: Arc<AtomicU64>,
}

impl FakeProvider {
    pub fn start(tool_steps: usize) -> FakeProvider {
        let listener = TcpListener::bind("127.0.0.1:0").expect("a loopback port");
        let port = listener.local_addr().expect("an address").port();
        let requests = Arc::new(AtomicU64::new(0));
        let counted = requests.clone();
        std::thread::Builder::new()
            .name("fake-provider".into())
            .spawn(move || {
                for conn in listener.incoming().flatten() {
                    let counted = counted.clone();
                    std::thread::spawn(move || answer(conn, tool_steps, &counted));
                }
            })
            .expect("the provider thread");
        FakeProvider { port, requests }
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }
}

fn answer(mut conn: TcpStream, tool_steps: usize, requests: &AtomicU64) {
    let _ = conn.set_nodelay(true);
    let mut dec = RequestDecoder::new(ServerLimits::default());
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        while let Ok(Some((_, body))) = dec.next() {
            requests.fetch_add(1, Ordering::Relaxed);
            let results = memchr::memmem::find_iter(&body, b"tool_result").count();
            let step = if results < tool_steps {
                TOOL_STEP
            } else {
                TEXT_STEP
            };
            let head = format!(
                "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-length: {}\r\n\r\n",
                step.len()
            );
            if conn.write_all(head.as_bytes()).is_err() || conn.write_all(step.as_bytes()).is_err()
            {
                return;
            }
        }
        match conn.read(&mut buf) {
            Ok(0) | Err(_) => return,
            Ok(n) => dec.push(&buf[..n]),
        }
    }
}

/// The release `broca` binary, built first if needed (`cargo build --release --bin broca`);
/// `BROCA_BIN` names one to use instead.
pub fn broca_release_bin() -> PathBuf {
    if let Some(bin) = std::env::var_os("BROCA_BIN") {
        return PathBuf::from(bin);
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let status = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
        .args([
            "build",
            "--release",
            "--quiet",
            "-p",
            "broca",
            "--bin",
            "broca",
        ])
        .current_dir(&root)
        .status()
        .expect("cargo runs");
    assert!(status.success(), "building the release broca binary failed");
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("target"));
    target.join("release/broca")
}

/// A running `broca serve`.
pub struct Daemon {
    pub child: Child,
    pub addr: String,
    pub handle: String,
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Daemon {
    /// Starts `bin serve` on a free port with `provider` as the Anthropic base URL.
    pub fn start(bin: &Path, state: &Path, provider: &str, extra: &[&str]) -> Daemon {
        let mut child = Command::new(bin)
            .arg("--state-dir")
            .arg(state)
            .args(["serve", "--listen", "127.0.0.1:0"])
            .args(extra)
            .env("ANTHROPIC_API_KEY", "sk-bench-0123456789")
            .env("BROCA_BASE_URL_ANTHROPIC", provider)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("broca serve starts");
        let mut line = String::new();
        BufReader::new(child.stdout.take().expect("stdout"))
            .read_line(&mut line)
            .expect("the listen line");
        let addr = line
            .trim()
            .strip_prefix("broca listening on http://")
            .unwrap_or_else(|| panic!("the listen line: {line:?}"))
            .to_string();
        let handle = std::fs::read_to_string(state.join("serve.handle")).expect("the handle");
        Daemon {
            child,
            addr,
            handle,
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// One request on a new connection: status and body.
    pub fn request(&self, method: &str, path: &str, body: &str) -> std::io::Result<(u16, Vec<u8>)> {
        request(&self.addr, &self.handle, method, path, body)
    }

    /// A management call: status and the JSON reply.
    pub fn rpc(
        &self,
        method: &str,
        params: serde_json::Value,
    ) -> std::io::Result<(u16, serde_json::Value)> {
        let body = serde_json::json!({"method": method, "params": params}).to_string();
        let (status, out) = self.request("POST", "/v1/rpc", &body)?;
        Ok((
            status,
            serde_json::from_slice(&out).unwrap_or(serde_json::Value::Null),
        ))
    }
}

/// One request to the daemon at `addr` with its bearer `handle`, on a new connection: status
/// and body.
pub fn request(
    addr: &str,
    handle: &str,
    method: &str,
    path: &str,
    body: &str,
) -> std::io::Result<(u16, Vec<u8>)> {
    let mut s = TcpStream::connect(addr)?;
    s.set_read_timeout(Some(Duration::from_secs(30)))?;
    let raw = format!(
        "{method} {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {handle}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    s.write_all(raw.as_bytes())?;
    let mut all = Vec::new();
    s.read_to_end(&mut all)?;
    let end = all
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(|| std::io::Error::other("no response head"))?;
    let status = std::str::from_utf8(&all[9..12])
        .ok()
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| std::io::Error::other("no status"))?;
    Ok((status, all[end + 4..].to_vec()))
}

/// The resident set of process `pid` in KiB, and its open descriptors.
pub fn rss_kib_and_fds(pid: u32) -> (u64, usize) {
    let rss = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        })
        .unwrap_or(0);
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count());
    (rss, fds)
}

/// The resident set of process `pid` in KiB split into anonymous memory (the heap) and
/// mapped files (the store's LMDB map is read through one).
pub fn rss_anon_file_kib(pid: u32) -> (u64, u64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    (
        kib_field(&status, "RssAnon:"),
        kib_field(&status, "RssFile:"),
    )
}

/// A `kB` field of process `pid`'s /proc status (`VmHWM:`, `VmRSS:`, ...); zero if absent.
pub fn status_kib(pid: u32, name: &str) -> u64 {
    kib_field(
        &std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default(),
        name,
    )
}

fn kib_field(status: &str, name: &str) -> u64 {
    status
        .lines()
        .find_map(|l| l.strip_prefix(name))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// The anonymous memory of process `pid` held in transparent huge pages, in KiB.
pub fn anon_huge_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("AnonHugePages:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        })
        .unwrap_or(0)
}

/// CPU seconds (user + system) process `pid` has used.
pub fn cpu_secs(pid: u32) -> f64 {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return 0.0;
    };
    // Fields after the command name, which is parenthesised and may hold spaces.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = f.get(11).and_then(|v| v.parse().ok()).unwrap_or(0)
        + f.get(12).and_then(|v| v.parse().ok()).unwrap_or(0);
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    ticks as f64 / hz
}
