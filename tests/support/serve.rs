//! `broca serve` as a real process for tests: started on a free port with aimock as the
//! provider, its management surface reached over TCP with the bearer handle.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::{broca, Aimock};

pub struct Serve {
    pub child: Child,
    pub addr: String,
    pub handle: String,
    pub socket: PathBuf,
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn start(state: &Path, peer: &Aimock, extra: &[&str]) -> Serve {
    start_env(state, peer, extra, &[])
}

/// [`start`] with extra environment variables for the daemon.
pub fn start_env(state: &Path, peer: &Aimock, extra: &[&str], env: &[(&str, &str)]) -> Serve {
    let mut cmd = command(state, &peer.url(), extra);
    cmd.envs(env.iter().copied()).stderr(Stdio::inherit());
    spawn(&mut cmd, state)
}

/// The `broca serve` command on a free port with `base_url` as the Anthropic provider (two
/// shards unless `extra` says otherwise); stdio is the caller's to set.
pub fn command(state: &Path, base_url: &str, extra: &[&str]) -> std::process::Command {
    let mut cmd = broca(state);
    cmd.env("ANTHROPIC_API_KEY", "sk-serve-test-0123456789")
        .env("BROCA_BASE_URL_ANTHROPIC", base_url)
        .args(["serve", "--listen", "127.0.0.1:0"])
        .args(if extra.contains(&"--shards") {
            &[][..]
        } else {
            &["--shards", "2"][..]
        })
        .args(extra);
    cmd
}

/// Spawns a serve command and waits for its listen line; checks serve.json.
pub fn spawn(cmd: &mut std::process::Command, state: &Path) -> Serve {
    let (child, line) = super::spawn_first_line(cmd);
    let addr = line
        .trim()
        .strip_prefix("broca listening on http://")
        .unwrap_or_else(|| panic!("the listen line: {line:?}"))
        .to_string();
    let info: Value =
        serde_json::from_slice(&std::fs::read(state.join("serve.json")).unwrap()).unwrap();
    assert_eq!(info["listen"], addr.as_str());
    assert_eq!(info["pid"], child.id());
    let handle = std::fs::read_to_string(info["handle_file"].as_str().unwrap()).unwrap();
    Serve {
        child,
        addr,
        handle,
        socket: PathBuf::from(info["socket"].as_str().unwrap()),
    }
}

/// `GET path` with the handle: status and body.
pub fn get(s: &Serve, path: &str) -> (u16, Vec<u8>) {
    let req = format!(
        "GET {path} HTTP/1.1\r\nAuthorization: Bearer {}\r\nConnection: close\r\n\r\n",
        s.handle
    );
    http(&s.addr, req.as_bytes())
}

/// One HTTP exchange on a new connection: status and body.
/// (A send that meets a session a pack holds waits up to 10 s for the pack and then restores
/// the session: on a loaded machine an answer may take that long and more.)
pub fn http(addr: &str, raw: &[u8]) -> (u16, Vec<u8>) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    s.write_all(raw).unwrap();
    let began = Instant::now();
    try_read_response(&mut s).unwrap_or_else(|why| {
        let first_line = raw.split(|b| *b == b'\r').next().unwrap_or(raw);
        panic!(
            "{} (after {:?}): {why}",
            String::from_utf8_lossy(first_line),
            began.elapsed()
        )
    })
}

pub fn read_response(s: &mut impl Read) -> (u16, Vec<u8>) {
    try_read_response(s).unwrap_or_else(|why| panic!("{why}"))
}

/// Reads one response; the error names whether the peer closed early or went silent.
fn try_read_response(s: &mut impl Read) -> Result<(u16, Vec<u8>), String> {
    let mut all = Vec::new();
    let mut buf = [0u8; 4096];
    let so_far = |all: &[u8]| format!("{:?}", String::from_utf8_lossy(all));
    loop {
        let n = s
            .read(&mut buf)
            .map_err(|e| format!("no complete response ({e}): {}", so_far(&all)))?;
        if n == 0 {
            return Err(format!(
                "no complete response (the peer closed): {}",
                so_far(&all)
            ));
        }
        all.extend_from_slice(&buf[..n]);
        if let Some(end) = all.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&all[..end]).to_ascii_lowercase();
            let len: usize = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .map(|v| v.trim().parse().unwrap())
                .unwrap_or(0);
            if all.len() >= end + 4 + len {
                let status = head[9..12].parse().unwrap();
                return Ok((status, all[end + 4..end + 4 + len].to_vec()));
            }
        }
    }
}

pub fn post(s: &Serve, body: &str) -> (u16, Value) {
    let raw = format!(
        "POST /v1/rpc HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        s.handle,
        body.len()
    );
    let (status, body) = http(&s.addr, raw.as_bytes());
    (status, serde_json::from_slice(&body).unwrap_or(Value::Null))
}

/// The session [`rpc`] talks to, as the command line names it.
#[allow(dead_code)]
pub const CLI_SESSION: [&str; 6] = [
    "--project-root",
    "/proj",
    "--harness",
    "h",
    "--session",
    "s1",
];

pub fn rpc(s: &Serve, method: &str, params: Value) -> (u16, Value) {
    let mut p = json!({"project_root": "/proj", "harness": "h", "session": "s1"});
    p.as_object_mut()
        .unwrap()
        .extend(params.as_object().unwrap().clone());
    post(s, &json!({"method": method, "params": p}).to_string())
}

/// [`rpc`]'s answer's body, or `None` when broca answered nothing (it died, as a crash test
/// has it).
pub fn try_rpc(s: &Serve, method: &str, params: Value) -> Option<Value> {
    use std::io::{Read, Write};
    let mut p = json!({"project_root": "/proj", "harness": "h", "session": "s1"});
    p.as_object_mut()
        .unwrap()
        .extend(params.as_object().unwrap().clone());
    let body = json!({"method": method, "params": p}).to_string();
    let raw = format!(
        "POST /v1/rpc HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {}\r\nContent-Type: \
         application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        s.handle,
        body.len()
    );
    let mut c = std::net::TcpStream::connect(&s.addr).ok()?;
    c.write_all(raw.as_bytes()).ok()?;
    let mut all = Vec::new();
    c.read_to_end(&mut all).ok()?;
    let at = all.windows(4).position(|w| w == b"\r\n\r\n")?;
    serde_json::from_slice(&all[at + 4..]).ok()
}

/// Sends `params` (with the default session) and waits until the run completes: its id.
pub fn send_until_completed(s: &Serve, params: Value) -> String {
    let (status, r) = rpc(s, "session.send", params);
    assert_eq!(status, 200, "{r}");
    let run_id = r["result"]["run_id"].as_str().unwrap().to_string();
    wait_for("the run to complete", || {
        rpc(s, "run.status", json!({"run_id": run_id})).1["result"]["state"] == "completed"
    });
    run_id
}

pub fn wait_for(what: &str, mut f: impl FnMut() -> bool) {
    let until = Instant::now() + Duration::from_secs(20);
    while !f() {
        assert!(Instant::now() < until, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The sum over shards of a metric.
pub fn metric(s: &Serve, name: &str) -> u64 {
    metric_with(s, name, "")
}

/// The sum over shards of a metric's samples whose labels hold `label` (`reason="completed"`).
pub fn metric_with(s: &Serve, name: &str, label: &str) -> u64 {
    let req = format!(
        "GET /metrics HTTP/1.1\r\nAuthorization: Bearer {}\r\nConnection: close\r\n\r\n",
        s.handle
    );
    let (_, m) = http(&s.addr, req.as_bytes());
    let prefix = format!("{name}{{");
    String::from_utf8(m)
        .unwrap()
        .lines()
        .filter(|l| l.starts_with(&prefix) && l.contains(label))
        .map(|l| l.rsplit(' ').next().unwrap().parse::<u64>().unwrap())
        .sum()
}

/// Reads server-sent events from `s` until `until` says stop or the stream ends; returns
/// (id or None, event or None, data) triples.
pub fn read_events(
    s: TcpStream,
    mut until: impl FnMut(&(Option<String>, Option<String>, String)) -> bool,
) -> Vec<(Option<String>, Option<String>, String)> {
    read_events_for(s, Duration::from_secs(20), &mut until)
}

/// The same, giving up after `wait` without bytes.
pub fn read_events_for(
    s: TcpStream,
    wait: Duration,
    until: &mut dyn FnMut(&(Option<String>, Option<String>, String)) -> bool,
) -> Vec<(Option<String>, Option<String>, String)> {
    s.set_read_timeout(Some(wait)).unwrap();
    let mut r = BufReader::new(s);
    let mut head = String::new();
    loop {
        let mut line = String::new();
        r.read_line(&mut line).unwrap();
        head.push_str(&line);
        if line == "\r\n" {
            break;
        }
    }
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(head.contains("text/event-stream"), "{head}");
    let mut out = Vec::new();
    let (mut id, mut event, mut data) = (None, None, String::new());
    loop {
        let mut line = String::new();
        if r.read_line(&mut line).unwrap_or(0) == 0 {
            return out;
        }
        let line = line.trim_end_matches('\n');
        if line.is_empty() {
            if !data.is_empty() {
                let ev = (id.take(), event.take(), std::mem::take(&mut data));
                let stop = until(&ev);
                out.push(ev);
                if stop {
                    return out;
                }
            }
        } else if let Some(v) = line.strip_prefix("id: ") {
            id = Some(v.to_string());
        } else if let Some(v) = line.strip_prefix("event: ") {
            event = Some(v.to_string());
        } else if let Some(v) = line.strip_prefix("data: ") {
            data = v.to_string();
        }
    }
}

pub fn open_sse(s: &Serve, query: &str, last_event_id: Option<&str>) -> TcpStream {
    let mut c = TcpStream::connect(&s.addr).unwrap();
    let extra = last_event_id
        .map(|id| format!("Last-Event-ID: {id}\r\n"))
        .unwrap_or_default();
    c.write_all(
        format!(
            "GET /v1/subscribe?{query} HTTP/1.1\r\nAuthorization: Bearer {}\r\n{extra}\r\n",
            s.handle
        )
        .as_bytes(),
    )
    .unwrap();
    c
}

/// [`open_sse`], returning once the response head has come: the subscription is then
/// registered, so display deltas of a run started after it reach it (the display lane is
/// live only, never replayed).
pub fn open_sse_ready(s: &Serve, query: &str) -> TcpStream {
    let c = open_sse(s, query, None);
    c.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let mut buf = [0u8; 1024];
    loop {
        let n = c.peek(&mut buf).expect("the subscription's response head");
        assert!(n > 0, "the subscription closed before its head");
        if buf[..n].windows(4).any(|w| w == b"\r\n\r\n") {
            return c;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// The run's run.result once run.status no longer says it is active.
pub fn result_when_ended(s: &Serve, session: &str, run_id: &str) -> Value {
    wait_for("the run to end", || {
        rpc(
            s,
            "run.status",
            json!({"session": session, "run_id": run_id}),
        )
        .1["result"]["state"]
            != "active"
    });
    let (status, r) = rpc(
        s,
        "run.result",
        json!({"session": session, "run_id": run_id}),
    );
    assert_eq!(status, 200, "{r}");
    r["result"].clone()
}

/// `broca attach --json` on the session `base` names (its stderr dropped).
pub fn attach_json(state: &Path, base: &[&str]) -> Child {
    broca(state)
        .arg("attach")
        .args(base)
        .arg("--json")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap()
}

/// Reads `attach`'s JSON lines until a control unit of type `kind` arrives (its stdout is
/// taken).
pub fn until_unit(attach: &mut Child, kind: &str) {
    let mut lines = BufReader::new(attach.stdout.take().unwrap()).lines();
    loop {
        let line = lines.next().expect("attach saw the unit").unwrap();
        let v: Value = serde_json::from_str(&line).unwrap();
        if v["unit"]["type"] == kind {
            return;
        }
    }
}

/// Sends `prompt` to the demo model in the session `base` names and kills serve (-9) once the
/// call's dispatch intent is durable (its `tool_call` event): while the tool runs.
pub fn kill_mid_demo_tool(state: &Path, s: &mut Serve, base: &[&str], prompt: &str) {
    let mut attach = attach_json(state, base);
    let sent = broca(state)
        .arg("send")
        .args(base)
        .args(["--model", "demo/tour", prompt])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    until_unit(&mut attach, "tool_call");
    // SAFETY: a signal to the serve this test started and has not reaped.
    unsafe { libc::kill(s.child.id() as i32, libc::SIGKILL) };
    let _ = s.child.wait();
    let _ = attach.kill();
    let _ = attach.wait();
    let _ = sent.wait_with_output();
}
