//! The end-to-end bench's helper processes, each the bench binary itself started with
//! `BROCA_E2E_ROLE`: the loopback provider (`provider`) and the no-op MCP tool server over
//! stdio (`mcp`). Each in a process of its own, so that its CPU time is its own in /proc.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::io::{BufRead, Write};
use std::rc::Rc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use broca_io::http_server::{RequestDecoder, ServerLimits};
use futures_lite::{AsyncReadExt, AsyncWriteExt};

use crate::peer::TEXT_STEP;

/// Microseconds on CLOCK_MONOTONIC: the same clock in every process of the machine, so a
/// token's send time written by the provider can be read by the generator.
pub fn mono_us() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid out pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000 + ts.tv_nsec as u64 / 1_000
}

/// CPU seconds the calling thread has used.
pub fn thread_cpu_secs() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid out pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as f64 + ts.tv_nsec as f64 / 1e9
}

/// What the provider answers: `tool_steps` tool calls per send (counted as the tool results
/// after the send's prompt, which holds `bench-prompt`), then a text answer. With
/// `stream_tokens` > 0 every answer is chunked and trickles that many text tokens at
/// `tokens_per_s`, each token the microsecond it was written (`@<mono_us>;`).
#[derive(Clone, Copy)]
pub struct ProviderPlan {
    pub tool_steps: usize,
    pub stream_tokens: usize,
    pub tokens_per_s: u32,
}

impl ProviderPlan {
    pub fn from_env() -> ProviderPlan {
        let var = |k: &str, d: u64| {
            std::env::var(k)
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(d)
        };
        ProviderPlan {
            tool_steps: var("E2E_TOOL_STEPS", 9) as usize,
            stream_tokens: var("E2E_STREAM_TOKENS", 0) as usize,
            tokens_per_s: var("E2E_TOKENS_PER_S", 50).max(1) as u32,
        }
    }
}

fn tool_step(id: u64) -> String {
    format!(
        "event: message_start\ndata: {{\"type\":\"message_start\",\"message\":{{\"id\":\"msg_{id}\",\"usage\":{{\"input_tokens\":50,\"output_tokens\":1}}}}}}\n\n\
event: content_block_start\ndata: {{\"type\":\"content_block_start\",\"index\":0,\"content_block\":{{\"type\":\"tool_use\",\"id\":\"toolu_{id}\",\"name\":\"noop\",\"input\":{{}}}}}}\n\n\
event: content_block_delta\ndata: {{\"type\":\"content_block_delta\",\"index\":0,\"delta\":{{\"type\":\"input_json_delta\",\"partial_json\":\"{{}}\"}}}}\n\n\
event: content_block_stop\ndata: {{\"type\":\"content_block_stop\",\"index\":0}}\n\n\
event: message_delta\ndata: {{\"type\":\"message_delta\",\"delta\":{{\"stop_reason\":\"tool_use\"}},\"usage\":{{\"output_tokens\":9}}}}\n\n\
event: message_stop\ndata: {{\"type\":\"message_stop\"}}\n\n"
    )
}

/// The provider's measurements, shared with the thread that reports them.
#[derive(Default)]
struct Measured {
    requests: u64,
    /// Per request that carried the result of an earlier answer's tool call: from that
    /// answer's last byte written to this request's first byte read, in µs.
    gaps_us: Vec<u32>,
}

/// The provider process: prints its port, then serves until its stdin closes. A line
/// `report` on stdin prints `{"requests", "gap_p50_us", "gap_p99_us", "gaps"}` for what came
/// since the last report.
pub fn provider_main() {
    // SAFETY: prctl on this process, asking for SIGKILL when the parent exits.
    unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) };
    let plan = ProviderPlan::from_env();
    let measured = Arc::new(Mutex::new(Measured::default()));
    let reporter = measured.clone();
    std::thread::spawn(move || {
        for line in std::io::stdin().lock().lines() {
            let Ok(line) = line else { break };
            if line.trim() == "report" {
                let m = std::mem::take(&mut *reporter.lock().expect("measured"));
                let mut gaps = m.gaps_us;
                gaps.sort_unstable();
                let pick = |p: f64| {
                    gaps.get(((gaps.len() as f64 * p).ceil() as usize).saturating_sub(1))
                        .copied()
                        .unwrap_or(0)
                };
                println!(
                    "{}",
                    serde_json::json!({"requests": m.requests, "gap_p50_us": pick(0.5),
                        "gap_p99_us": pick(0.99), "gaps": gaps.len()})
                );
                let _ = std::io::stdout().flush();
            }
        }
        std::process::exit(0);
    });
    let ex = glommio::LocalExecutorBuilder::new(glommio::Placement::Unbound)
        .make()
        .expect("an executor");
    ex.run(async move {
        let l = glommio::net::TcpListener::bind("127.0.0.1:0").expect("a loopback port");
        println!("{}", l.local_addr().expect("an address").port());
        let _ = std::io::stdout().flush();
        let answered: Rc<RefCell<HashMap<u64, Instant>>> = Rc::default();
        let next_id = Rc::new(Cell::new(1u64));
        loop {
            let Ok(s) = l.accept().await else {
                glommio::timer::sleep(Duration::from_millis(5)).await;
                continue;
            };
            let _ = s.set_nodelay(true);
            let (measured, answered, next_id) =
                (measured.clone(), answered.clone(), next_id.clone());
            glommio::spawn_local(async move {
                serve_connection(s, plan, &measured, &answered, &next_id).await
            })
            .detach();
        }
    });
}

async fn serve_connection(
    mut s: glommio::net::TcpStream,
    plan: ProviderPlan,
    measured: &Mutex<Measured>,
    answered: &RefCell<HashMap<u64, Instant>>,
    next_id: &Cell<u64>,
) {
    let mut dec = RequestDecoder::new(ServerLimits {
        body_bytes_max: 64 << 20,
        ..ServerLimits::default()
    });
    let mut buf = vec![0u8; 64 * 1024];
    let mut read_at = Instant::now();
    loop {
        while let Ok(Some((_, body))) = dec.next() {
            let gap = previous_call(&body)
                .and_then(|id| answered.borrow_mut().remove(&id))
                .map(|at| read_at.saturating_duration_since(at).as_micros() as u32);
            {
                let mut m = measured.lock().expect("measured");
                m.requests += 1;
                m.gaps_us.extend(gap);
            }
            let prompt = memchr::memmem::rfind(&body, b"bench-prompt").unwrap_or(0);
            let results = memchr::memmem::find_iter(&body[prompt..], b"tool_result").count();
            let call = (results < plan.tool_steps).then(|| {
                let id = next_id.get();
                next_id.set(id + 1);
                id
            });
            let written = if plan.stream_tokens == 0 {
                let answer = call.map_or_else(|| TEXT_STEP.to_string(), tool_step);
                let out = broca_io::http_server::response(
                    200,
                    "text/event-stream",
                    answer.as_bytes(),
                    true,
                );
                s.write_all(&out).await.is_ok()
            } else {
                trickle(&mut s, plan, call).await.is_ok()
            };
            if !written {
                return;
            }
            if let Some(id) = call {
                answered.borrow_mut().insert(id, Instant::now());
            }
        }
        match s.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => {
                read_at = Instant::now();
                dec.push(&buf[..n]);
            }
        }
    }
}

/// The id of the tool call whose result is the last one in a request body (`toolu_<id>`).
fn previous_call(body: &[u8]) -> Option<u64> {
    let key = b"\"tool_use_id\":\"toolu_";
    let at = memchr::memmem::rfind(body, key)? + key.len();
    let digits = body[at..].iter().take_while(|b| b.is_ascii_digit()).count();
    std::str::from_utf8(&body[at..at + digits])
        .ok()?
        .parse()
        .ok()
}

async fn chunk(s: &mut glommio::net::TcpStream, data: &[u8]) -> std::io::Result<()> {
    let mut out = format!("{:x}\r\n", data.len()).into_bytes();
    out.extend_from_slice(data);
    out.extend_from_slice(b"\r\n");
    s.write_all(&out).await
}

/// A streamed answer: text tokens at the plan's pace, then the tool call (or the end).
async fn trickle(
    s: &mut glommio::net::TcpStream,
    plan: ProviderPlan,
    call: Option<u64>,
) -> std::io::Result<()> {
    s.write_all(
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n",
    )
    .await?;
    chunk(s, b"event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_s\",\"usage\":{\"input_tokens\":50,\"output_tokens\":1}}}\n\n\
event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n").await?;
    let every = Duration::from_secs_f64(1.0 / plan.tokens_per_s as f64);
    let start = Instant::now();
    for i in 0..plan.stream_tokens {
        let due = start + every * i as u32;
        if let Some(wait) = due.checked_duration_since(Instant::now()) {
            glommio::timer::sleep(wait).await;
        }
        let ev = format!(
            "event: content_block_delta\ndata: {{\"type\":\"content_block_delta\",\"index\":0,\"delta\":{{\"type\":\"text_delta\",\"text\":\"@{};\"}}}}\n\n",
            mono_us()
        );
        chunk(s, ev.as_bytes()).await?;
    }
    let mut tail = String::from(
        "event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}\n\n",
    );
    let stop = match call {
        Some(id) => {
            tail.push_str(&format!(
                "event: content_block_start\ndata: {{\"type\":\"content_block_start\",\"index\":1,\"content_block\":{{\"type\":\"tool_use\",\"id\":\"toolu_{id}\",\"name\":\"noop\",\"input\":{{}}}}}}\n\n\
event: content_block_delta\ndata: {{\"type\":\"content_block_delta\",\"index\":1,\"delta\":{{\"type\":\"input_json_delta\",\"partial_json\":\"{{}}\"}}}}\n\n\
event: content_block_stop\ndata: {{\"type\":\"content_block_stop\",\"index\":1}}\n\n"
            ));
            "tool_use"
        }
        None => "end_turn",
    };
    tail.push_str(&format!(
        "event: message_delta\ndata: {{\"type\":\"message_delta\",\"delta\":{{\"stop_reason\":\"{stop}\"}},\"usage\":{{\"output_tokens\":{}}}}}\n\n\
event: message_stop\ndata: {{\"type\":\"message_stop\"}}\n\n",
        plan.stream_tokens + 1
    ));
    chunk(s, tail.as_bytes()).await?;
    s.write_all(b"0\r\n\r\n").await
}

/// The no-op MCP tool server over stdio (newline-delimited JSON-RPC): one tool, `noop`,
/// answered at once with the text `ok`. Writes its pid to `E2E_MCP_PID_FILE` when set.
pub fn noop_mcp_main() {
    if let Some(path) = std::env::var_os("E2E_MCP_PID_FILE") {
        let _ = std::fs::write(path, std::process::id().to_string());
    }
    let mut input = std::io::BufReader::new(std::io::stdin());
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    let mut line = String::new();
    loop {
        line.clear();
        match input.read_line(&mut line) {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
        let Ok(msg) = serde_json::from_str::<serde_json::Value>(&line) else {
            continue;
        };
        let Some(id) = msg.get("id").cloned() else {
            continue; // a notification
        };
        let result = match msg.get("method").and_then(|m| m.as_str()) {
            Some("initialize") => serde_json::json!({
                "protocolVersion": msg["params"]["protocolVersion"].as_str().unwrap_or("2025-06-18"),
                "capabilities": {"tools": {}},
                "serverInfo": {"name": "broca-bench-noop", "version": "1"}
            }),
            Some("tools/list") => serde_json::json!({"tools": [{
                "name": "noop", "description": "Does nothing.",
                "inputSchema": {"type": "object", "properties": {}}
            }]}),
            Some("tools/call") => serde_json::json!({"content": [{"type": "text", "text": "ok"}]}),
            _ => serde_json::json!({}),
        };
        let reply = serde_json::json!({"jsonrpc": "2.0", "id": id, "result": result});
        let _ = writeln!(out, "{reply}");
        // Answers still queued in stdin are written together.
        if input.buffer().is_empty() && out.flush().is_err() {
            return;
        }
    }
}
