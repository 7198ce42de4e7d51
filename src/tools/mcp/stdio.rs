//! An MCP server broca runs as a child process, speaking newline-delimited JSON-RPC over its
//! stdin and stdout. One process per configured server per broca process, shared by every
//! session and shard: its pipes are served by three threads (writer, reader, stderr logger),
//! so a shard never blocks on a pipe; callers wait on channels.
//!
//! The process is started on first use (or at startup, to learn its tools) and again on the
//! next call after it died. Starting is bounded by the startup timeout; a call by the call
//! timeout. A request is delivered once its whole line was written to the pipe.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

use broca_io::net::with_timeout;
use futures_channel::oneshot;
use serde_json::{json, Value};

use super::{
    answer_server_request, classify, initialize_params, list_tools, notification, request, Answer,
    CallError, Incoming, McpError, McpTool, Slots,
};
use crate::config::{ServerConfig, Transport};

/// A line from the server longer than this is not a message broca accepts: the server is
/// stopped (a result that large is far past any tool-result limit).
const LINE_BYTES_MAX: usize = 64 * 1024 * 1024;

/// Starts tried per call when the server is down, and the pause after a failed one.
const START_ATTEMPTS: u32 = 2;
const START_RETRY_PAUSE: Duration = Duration::from_millis(250);

/// How long a stopping server gets to exit after its stdin closes before it is killed.
const EXIT_GRACE: Duration = Duration::from_secs(2);

/// One configured stdio server.
pub struct StdioServer {
    cfg: ServerConfig,
    command: Vec<String>,
    env: Vec<(String, String)>,
    cwd: Option<String>,
    state: Mutex<State>,
    next_id: AtomicU64,
    slots: Arc<Slots>,
    /// Processes started, for logs and tests.
    starts: AtomicU64,
}

enum State {
    Down,
    Starting(Vec<oneshot::Sender<Result<Arc<Proc>, McpError>>>),
    Up(Arc<Proc>),
    Stopped,
}

/// A running server process.
struct Proc {
    pid: u32,
    child: Mutex<Child>,
    /// The one sender to the writer thread (the reader answers the server's requests through
    /// it too): taking it closes the child's stdin.
    writer: Arc<Mutex<Option<mpsc::Sender<Outgoing>>>>,
    pending: Arc<Mutex<HashMap<u64, oneshot::Sender<Reply>>>>,
    alive: Arc<AtomicBool>,
    tools: Mutex<Vec<McpTool>>,
}

struct Outgoing {
    line: Vec<u8>,
    /// Told whether the whole line was written; `Err(n)` when the pipe failed after `n` bytes.
    written: Option<oneshot::Sender<Result<(), usize>>>,
}

enum Reply {
    Answer(Answer),
    /// The process ended (or its output broke) before answering.
    Died(String),
}

impl StdioServer {
    /// A server of `cfg` (a stdio transport), not started yet.
    pub fn new(cfg: ServerConfig) -> Arc<StdioServer> {
        let Transport::Stdio { command, env, cwd } = cfg.transport.clone() else {
            unreachable!("a stdio server is made from a stdio config");
        };
        Arc::new(StdioServer {
            slots: Slots::new(cfg.max_concurrency),
            command,
            env: env.into_iter().collect(),
            cwd,
            cfg,
            state: Mutex::new(State::Down),
            next_id: AtomicU64::new(1),
            starts: AtomicU64::new(0),
        })
    }

    pub fn name(&self) -> &str {
        &self.cfg.name
    }

    /// How many times the process was started.
    pub fn starts(&self) -> u64 {
        self.starts.load(Ordering::Relaxed)
    }

    /// Starts the server if it is not running and answers its tools.
    pub async fn tools(self: &Arc<Self>) -> Result<Vec<McpTool>, McpError> {
        let proc = self.running().await?;
        let tools = proc.tools.lock().expect("the tools lock").clone();
        Ok(tools)
    }

    /// Calls tool `name` with `args` (an object). See the module notes for what the outcomes
    /// mean.
    pub async fn call(self: &Arc<Self>, name: &str, args: &Value) -> Result<Answer, CallError> {
        let _slot = self.slots.acquire().await;
        let mut last = String::new();
        for attempt in 0..START_ATTEMPTS {
            if attempt > 0 {
                glommio::timer::sleep(START_RETRY_PAUSE).await;
            }
            let proc = match self.running().await {
                Ok(p) => p,
                Err(e) => {
                    last = e.to_string();
                    continue;
                }
            };
            let id = self.next_id.fetch_add(1, Ordering::Relaxed);
            let params = json!({"name": name, "arguments": args});
            match proc.send(id, request(id, "tools/call", &params)).await {
                Sent::Delivered(reply) => return self.await_answer(&proc, id, reply).await,
                Sent::NotWritten(why) => last = why, // nothing reached it: try a fresh process
                Sent::Partly(why) => return Err(CallError::Indeterminate(why)),
            }
        }
        Err(CallError::Refused(format!(
            "tool server `{}` is not available: {last}",
            self.cfg.name
        )))
    }

    async fn await_answer(
        &self,
        proc: &Arc<Proc>,
        id: u64,
        reply: oneshot::Receiver<Reply>,
    ) -> Result<Answer, CallError> {
        match with_timeout(self.cfg.call_timeout, reply).await {
            Ok(Ok(Reply::Answer(a))) => Ok(a),
            Ok(Ok(Reply::Died(why))) => Err(CallError::Indeterminate(format!(
                "tool server `{}` {why} after the call was delivered",
                self.cfg.name
            ))),
            Ok(Err(_)) => Err(CallError::Indeterminate(format!(
                "tool server `{}` stopped after the call was delivered",
                self.cfg.name
            ))),
            Err(()) => {
                proc.pending.lock().expect("the pending lock").remove(&id);
                let params = json!({"requestId": id, "reason": "broca: the call timed out"});
                proc.notify(notification("notifications/cancelled", Some(&params)));
                Err(CallError::Indeterminate(format!(
                    "tool server `{}` did not answer within {} ms after the call was delivered",
                    self.cfg.name,
                    self.cfg.call_timeout.as_millis()
                )))
            }
        }
    }

    /// The running process, started (or restarted after it died) if need be; callers that
    /// arrive while it starts wait for that start.
    async fn running(self: &Arc<Self>) -> Result<Arc<Proc>, McpError> {
        let wait = {
            let mut state = self.state.lock().expect("the state lock");
            match &mut *state {
                State::Up(p) if p.alive.load(Ordering::Acquire) => return Ok(p.clone()),
                State::Stopped => {
                    return Err(McpError::Unavailable(format!(
                        "tool server `{}` was stopped",
                        self.cfg.name
                    )))
                }
                State::Starting(waiters) => {
                    let (tx, rx) = oneshot::channel();
                    waiters.push(tx);
                    Some(rx)
                }
                State::Up(_) | State::Down => {
                    *state = State::Starting(Vec::new());
                    None
                }
            }
        };
        if let Some(rx) = wait {
            return rx.await.unwrap_or_else(|_| {
                Err(McpError::Unavailable("start abandoned".into()).of(&self.cfg.name))
            });
        }
        let started = with_timeout(self.cfg.startup_timeout, self.start())
            .await
            .unwrap_or_else(|()| {
                Err(McpError::Unavailable(format!(
                    "tool server `{}` did not finish starting within {} ms",
                    self.cfg.name,
                    self.cfg.startup_timeout.as_millis()
                )))
            });
        let waiters = {
            let mut state = self.state.lock().expect("the state lock");
            let next = match &started {
                Ok(p) => State::Up(p.clone()),
                Err(_) => State::Down,
            };
            match std::mem::replace(&mut *state, next) {
                State::Starting(w) => w,
                State::Stopped => {
                    *state = State::Stopped;
                    Vec::new()
                }
                _ => Vec::new(),
            }
        };
        match &started {
            Ok(p) => tracing::info!(server = %self.cfg.name, pid = p.pid, "tool server started"),
            Err(e) => tracing::warn!(server = %self.cfg.name, "{e}"),
        }
        for w in waiters {
            let _ = w.send(started.clone());
        }
        started
    }

    /// Spawns the process, initializes it and lists its tools. A failure kills the process.
    async fn start(&self) -> Result<Arc<Proc>, McpError> {
        let name = &self.cfg.name;
        let mut cmd = Command::new(&self.command[0]);
        cmd.args(&self.command[1..])
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        if let Some(dir) = &self.cwd {
            cmd.current_dir(dir);
        }
        let child = cmd.spawn().map_err(|e| {
            McpError::Unavailable(format!("cannot start `{}`: {e}", self.command[0])).of(name)
        })?;
        self.starts.fetch_add(1, Ordering::Relaxed);
        let proc = Arc::new(Proc::attach(name, child));
        match proc.handshake(self).await {
            Ok(tools) => {
                *proc.tools.lock().expect("the tools lock") = tools;
                Ok(proc)
            }
            Err(e) => {
                proc.kill();
                Err(e.of(name))
            }
        }
    }

    /// Closes every process's stdin, waits a moment for it to exit, then kills it.
    pub fn stop(&self) {
        let state = std::mem::replace(
            &mut *self.state.lock().expect("the state lock"),
            State::Stopped,
        );
        if let State::Up(p) = state {
            p.stop();
        }
    }
}

impl Drop for StdioServer {
    fn drop(&mut self) {
        self.stop();
    }
}

enum Sent {
    /// The whole line was written; the answer will come on this channel.
    Delivered(oneshot::Receiver<Reply>),
    /// Not one byte was written.
    NotWritten(String),
    /// The pipe broke partway through the line.
    Partly(String),
}

impl Proc {
    /// Starts the threads serving the child's pipes.
    fn attach(name: &str, mut child: Child) -> Proc {
        let pending: Arc<Mutex<HashMap<u64, oneshot::Sender<Reply>>>> = Arc::default();
        let alive = Arc::new(AtomicBool::new(true));
        let (tx, rx) = mpsc::channel::<Outgoing>();
        let writer_slot = Arc::new(Mutex::new(Some(tx)));
        let stdin = child.stdin.take().expect("stdin is piped");
        let stdout = child.stdout.take().expect("stdout is piped");
        let stderr = child.stderr.take().expect("stderr is piped");
        let server = name.to_string();
        spawn_named(&format!("mcp-w-{name}"), move || writer(stdin, rx));
        let (p, a, answers, s) = (
            pending.clone(),
            alive.clone(),
            writer_slot.clone(),
            server.clone(),
        );
        spawn_named(&format!("mcp-r-{name}"), move || {
            reader(&s, BufReader::new(stdout), &p, &answers);
            a.store(false, Ordering::Release);
            let mut p = p.lock().expect("the pending lock");
            for (_, waiter) in p.drain() {
                let _ = waiter.send(Reply::Died("exited (or closed its output)".into()));
            }
        });
        spawn_named(&format!("mcp-e-{name}"), move || {
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                let line: String = line.chars().take(2000).collect();
                tracing::info!(server = %server, "{line}");
            }
        });
        Proc {
            pid: child.id(),
            child: Mutex::new(child),
            writer: writer_slot,
            pending,
            alive,
            tools: Mutex::new(Vec::new()),
        }
    }

    /// `initialize`, `notifications/initialized`, then every page of `tools/list`.
    async fn handshake(&self, server: &StdioServer) -> Result<Vec<McpTool>, McpError> {
        let init = self.ask(server, "initialize", initialize_params()).await?;
        if init
            .get("protocolVersion")
            .and_then(Value::as_str)
            .is_none()
        {
            return Err(McpError::Protocol(
                "initialize answered without a protocolVersion".into(),
            ));
        }
        self.notify(notification("notifications/initialized", None));
        list_tools(&server.cfg.name, |params| {
            self.ask(server, "tools/list", params)
        })
        .await
    }

    /// A request during the handshake: its result, or why there is none.
    async fn ask(
        &self,
        server: &StdioServer,
        method: &str,
        params: Value,
    ) -> Result<Value, McpError> {
        let id = server.next_id.fetch_add(1, Ordering::Relaxed);
        let reply = match self.send(id, request(id, method, &params)).await {
            Sent::Delivered(r) => r,
            Sent::NotWritten(why) | Sent::Partly(why) => return Err(McpError::Unavailable(why)),
        };
        match reply.await {
            Ok(Reply::Answer(Answer::Result(v))) => Ok(v),
            Ok(Reply::Answer(Answer::Error { code, message })) => Err(McpError::Rpc {
                method: method.into(),
                code,
                message,
            }),
            Ok(Reply::Died(why)) => Err(McpError::Unavailable(format!(
                "the server {why} during {method}"
            ))),
            Err(_) => Err(McpError::Unavailable(format!(
                "the server stopped during {method}"
            ))),
        }
    }

    /// Registers request `id` and writes its line; says whether it was delivered.
    async fn send(&self, id: u64, line: Vec<u8>) -> Sent {
        if !self.alive.load(Ordering::Acquire) {
            return Sent::NotWritten("the server has exited".into());
        }
        let (reply_tx, reply_rx) = oneshot::channel();
        let earlier = self
            .pending
            .lock()
            .expect("the pending lock")
            .insert(id, reply_tx);
        debug_assert!(earlier.is_none(), "a request id is used once");
        let (written_tx, written_rx) = oneshot::channel();
        let queued = self
            .writer
            .lock()
            .expect("the writer lock")
            .as_ref()
            .is_some_and(|w| {
                w.send(Outgoing {
                    line,
                    written: Some(written_tx),
                })
                .is_ok()
            });
        let outcome = if queued {
            written_rx.await.unwrap_or(Err(0))
        } else {
            Err(0)
        };
        match outcome {
            Ok(()) => Sent::Delivered(reply_rx),
            Err(n) => {
                self.pending.lock().expect("the pending lock").remove(&id);
                if n == 0 {
                    Sent::NotWritten("its input is closed".into())
                } else {
                    Sent::Partly(format!(
                        "its input closed after {n} bytes of the request were written"
                    ))
                }
            }
        }
    }

    /// Writes a notification; its fate is not awaited.
    fn notify(&self, line: Vec<u8>) {
        if let Some(w) = self.writer.lock().expect("the writer lock").as_ref() {
            let _ = w.send(Outgoing {
                line,
                written: None,
            });
        }
    }

    fn kill(&self) {
        self.writer.lock().expect("the writer lock").take();
        let mut child = self.child.lock().expect("the child lock");
        let _ = child.kill();
        let _ = child.wait();
    }

    /// Closes stdin (a well-behaved server exits), then kills it after a grace period.
    fn stop(&self) {
        self.writer.lock().expect("the writer lock").take();
        let mut child = self.child.lock().expect("the child lock");
        let until = std::time::Instant::now() + EXIT_GRACE;
        while std::time::Instant::now() < until {
            if let Ok(Some(_)) = child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = child.kill();
        let _ = child.wait();
    }
}

fn spawn_named(name: &str, f: impl FnOnce() + Send + 'static) {
    let name: String = name.chars().take(15).collect(); // the kernel's thread name limit
    if let Err(e) = std::thread::Builder::new().name(name).spawn(f) {
        tracing::error!("cannot start a tool server thread: {e}");
    }
}

/// The writer thread: one line per message, each followed by a newline and a flush; tells
/// the sender how far it got.
fn writer(mut stdin: ChildStdin, rx: mpsc::Receiver<Outgoing>) {
    while let Ok(mut msg) = rx.recv() {
        debug_assert!(
            !msg.line.contains(&b'\n'),
            "a message is one line (JSON escapes newlines)"
        );
        msg.line.push(b'\n');
        let mut done = 0usize;
        let mut failed = false;
        while done < msg.line.len() {
            match stdin.write(&msg.line[done..]) {
                Ok(0) => {
                    failed = true;
                    break;
                }
                Ok(n) => done += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(_) => {
                    failed = true;
                    break;
                }
            }
        }
        debug_assert!(
            failed || done == msg.line.len(),
            "a line is written whole or fails"
        );
        if !failed && stdin.flush().is_err() {
            failed = true;
        }
        if let Some(w) = msg.written {
            let _ = w.send(if failed { Err(done) } else { Ok(()) });
        }
        if failed {
            // Nothing more can be delivered: everything queued is refused unwritten.
            while let Ok(m) = rx.recv() {
                if let Some(w) = m.written {
                    let _ = w.send(Err(0));
                }
            }
            return;
        }
    }
}

/// The reader thread: routes answers to their callers, answers the server's own requests,
/// and logs what is not JSON-RPC. Returns when the output ends or breaks.
fn reader(
    server: &str,
    mut out: BufReader<std::process::ChildStdout>,
    pending: &Mutex<HashMap<u64, oneshot::Sender<Reply>>>,
    answers: &Mutex<Option<mpsc::Sender<Outgoing>>>,
) {
    let mut line = Vec::new();
    let mut garbage = 0u64;
    loop {
        line.clear();
        match std::io::Read::take(&mut out, LINE_BYTES_MAX as u64 + 1).read_until(b'\n', &mut line)
        {
            Ok(0) | Err(_) => return,
            Ok(_) if line.len() > LINE_BYTES_MAX => {
                tracing::error!(
                    server,
                    "the server wrote a line over {LINE_BYTES_MAX} bytes; treating its output as broken"
                );
                return;
            }
            Ok(_) => {}
        }
        debug_assert!(
            line.len() <= LINE_BYTES_MAX,
            "a line is read within its bound"
        );
        let text = line.trim_ascii();
        if text.is_empty() {
            continue;
        }
        let msg = match serde_json::from_slice::<Value>(text) {
            Ok(v) => classify(&v),
            Err(_) => Incoming::Garbage,
        };
        match msg {
            Incoming::Answer { id, answer } => {
                let waiter = pending.lock().expect("the pending lock").remove(&id);
                match waiter {
                    Some(w) => {
                        let _ = w.send(Reply::Answer(answer));
                    }
                    None => tracing::debug!(server, id, "an answer nobody waits for (timed out?)"),
                }
            }
            Incoming::Request { id, method } => {
                // Not once the server is being stopped: its input is closed then.
                if let Some(w) = answers.lock().expect("the writer lock").as_ref() {
                    let _ = w.send(Outgoing {
                        line: answer_server_request(&id, &method),
                        written: None,
                    });
                }
            }
            Incoming::Notification { method } => tracing::debug!(server, method, "notification"),
            Incoming::Garbage => {
                garbage += 1;
                if garbage <= 10 {
                    let shown: String = String::from_utf8_lossy(text).chars().take(200).collect();
                    tracing::warn!(
                        server,
                        "the server printed a line that is not JSON-RPC: {shown}"
                    );
                }
            }
        }
    }
}
