//! The end-to-end bench's load generator: sessions driven over TCP as users drive
//! `broca serve`, each with one subscriber (SSE, or a WebSocket) reading the control lane and
//! one keep-alive connection for its `session.send`s. Runs on a glommio executor of its own
//! thread; every session is a task.
//!
//! A step's start is the moment its `step_started` unit reaches the subscriber; a step's
//! latency is from its start to the start of the next step of the same run. Steps count when
//! they start inside the measured window.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::net::SocketAddr;
use std::rc::Rc;
use std::time::{Duration, Instant};

use futures_lite::{AsyncReadExt, AsyncWriteExt};
use glommio::channels::local_channel::{self, LocalReceiver, LocalSender};
use glommio::net::TcpStream;
use glommio::sync::Semaphore;

use crate::roles::{mono_us, thread_cpu_secs};

/// Sends a session takes before its task moves on to a fresh session (so that a transcript
/// stays an agent's size, however long the window).
pub const SENDS_PER_SESSION: u32 = 5;

/// Connections being opened at once (the daemon's accept backlog is not the subject).
const CONNECTS_AT_ONCE: u64 = 128;

/// Sends on connections of their own in flight at once (each holds a descriptor).
const SENDS_AT_ONCE: u64 = 1024;

/// How many times a send refused 503 is made before it counts as an error (100 ms apart).
const SEND_RETRIES: u32 = 600;

/// Longest wait for the next unit of a subscription.
const READ_TIMEOUT: Duration = Duration::from_secs(120);

/// What ended one exchange of a session with the daemon.
#[derive(Debug)]
pub enum LoadError {
    /// A socket's connect, read or write failed.
    Io {
        doing: &'static str,
        source: std::io::Error,
    },
    /// The executor refused a permit (its semaphore closed).
    Runtime(glommio::GlommioError<()>),
    /// The peer closed (or the WebSocket was closed) before the answer was whole.
    Closed(&'static str),
    /// A response head without `content-length`.
    NoLength,
    /// The daemon answered with another status than the one the exchange wants.
    Status {
        what: &'static str,
        status: u16,
        body: String,
    },
    /// The run ended other than completed (its last unit, as text).
    Run(String),
    /// `session.send` stayed refused with 503 through every retry.
    Refused { times: u32 },
}

impl std::fmt::Display for LoadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LoadError::Io { doing, source } => write!(f, "{doing}: {source}"),
            LoadError::Runtime(e) => write!(f, "the executor: {e}"),
            LoadError::Closed(what) => write!(f, "{what} closed"),
            LoadError::NoLength => f.write_str("a response without content-length"),
            LoadError::Status { what, status, body } => {
                write!(f, "{what} answered {status}: {body}")
            }
            LoadError::Run(why) => write!(f, "the run did not complete: {why}"),
            LoadError::Refused { times } => write!(f, "session.send refused 503 {times} times"),
        }
    }
}

impl std::error::Error for LoadError {}

impl LoadError {
    fn io(doing: &'static str) -> impl FnOnce(std::io::Error) -> LoadError {
        move |source| LoadError::Io { doing, source }
    }
}

/// Where the daemon listens and its bearer handle.
#[derive(Clone)]
pub struct Target {
    pub addr: SocketAddr,
    pub handle: String,
}

/// How sends are made.
#[derive(Clone, Copy, Debug)]
pub enum Mode {
    /// Every session sends again as soon as its run ends, for `secs` after a warm-up.
    Closed { secs: f64 },
    /// Every session makes one send; the window is until the last run ends.
    Once,
    /// Sends arrive at `steps_per_s / steps_per_send` a second, each to an idle session, for
    /// `secs` after a warm-up; a send due when no session is idle counts as late.
    Open {
        steps_per_s: f64,
        steps_per_send: u32,
        secs: f64,
    },
}

/// One workload.
#[derive(Clone)]
pub struct Plan {
    /// Names this workload's sessions apart from other workloads' in one daemon.
    pub tag: String,
    pub sessions: usize,
    pub websocket: bool,
    /// Each session keeps its send connection open between sends; else a connection per
    /// send (a client of 10,000 sessions cannot hold 20,000 descriptors on a machine whose
    /// limit is 20,000).
    pub keep_alive: bool,
    pub mode: Mode,
    pub warm: Duration,
}

/// The moments the caller is told of, on the generator's thread: every session subscribed
/// (before any send), the window's start and its end.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mark {
    Ready,
    Start,
    End,
}

/// What a workload measured.
#[derive(Debug, Default)]
pub struct Figures {
    pub steps: u64,
    pub window: Duration,
    /// Step latencies in µs, sorted.
    pub gaps_us: Vec<u32>,
    /// From a send's request to its first step's start, in µs, sorted.
    pub first_step_us: Vec<u32>,
    /// From a token's write by the provider to its display unit's arrival, in µs, sorted.
    pub display_us: Vec<u32>,
    pub display_dropped: u64,
    pub sends: u64,
    pub errors: u64,
    pub first_error: Option<String>,
    /// The generator thread's CPU seconds inside the window.
    pub cpu_s: f64,
    /// Open loop: sends due when no session was idle.
    pub late: u64,
    /// Sends refused 503 (a transient refusal: the daemon is at a limit) and made again.
    pub retried: u64,
    /// The error codes of the sends refused 503, with how many of each.
    pub retried_codes: Vec<(String, u64)>,
}

struct Ctx {
    target: Target,
    plan: Plan,
    connects: Semaphore,
    sends_at_once: Semaphore,
    arrived: Cell<usize>,
    gate: Semaphore,
    stopping: Cell<bool>,
    live: Cell<usize>,
    finished_runs: RefCell<Vec<Vec<Instant>>>,
    current: RefCell<Vec<Vec<Instant>>>,
    first_step_us: RefCell<Vec<u32>>,
    display_us: RefCell<Vec<u32>>,
    dropped: Cell<u64>,
    sends: Cell<u64>,
    retried: Cell<u64>,
    retried_codes: RefCell<std::collections::BTreeMap<String, u64>>,
    errors: Cell<u64>,
    first_error: RefCell<Option<String>>,
    idle: RefCell<VecDeque<usize>>,
}

impl Ctx {
    fn fail(&self, what: String) {
        self.errors.set(self.errors.get() + 1);
        self.first_error.borrow_mut().get_or_insert(what);
    }
}

/// Runs `plan` against `target` on a new thread and returns its figures; `mark` is called at
/// each [`Mark`].
pub fn run(target: Target, plan: Plan, mark: impl FnMut(Mark) + Send + 'static) -> Figures {
    glommio::LocalExecutorBuilder::new(glommio::Placement::Unbound)
        .name("e2e-loadgen")
        .spawn(move || drive(target, plan, mark))
        .expect("the generator's executor")
        .join()
        .expect("the generator")
}

async fn drive(target: Target, plan: Plan, mut mark: impl FnMut(Mark)) -> Figures {
    let n = plan.sessions;
    let ctx = Rc::new(Ctx {
        target,
        plan: plan.clone(),
        connects: Semaphore::new(CONNECTS_AT_ONCE),
        sends_at_once: Semaphore::new(SENDS_AT_ONCE),
        arrived: Cell::new(0),
        gate: Semaphore::new(0),
        stopping: Cell::new(matches!(plan.mode, Mode::Once)),
        live: Cell::new(n),
        finished_runs: RefCell::default(),
        current: RefCell::new(vec![Vec::new(); n]),
        first_step_us: RefCell::default(),
        display_us: RefCell::default(),
        dropped: Cell::new(0),
        sends: Cell::new(0),
        retried: Cell::new(0),
        retried_codes: RefCell::new(Default::default()),
        errors: Cell::new(0),
        first_error: RefCell::default(),
        idle: RefCell::new((0..n).collect()),
    });
    let open = matches!(plan.mode, Mode::Open { .. });
    let mut goes: Vec<LocalSender<()>> = Vec::new();
    for i in 0..n {
        let rx = open.then(|| {
            let (tx, rx) = local_channel::new_bounded(1);
            goes.push(tx);
            rx
        });
        glommio::spawn_local(session_task(ctx.clone(), i, rx)).detach();
    }
    while ctx.arrived.get() < n {
        glommio::timer::sleep(Duration::from_millis(5)).await;
    }
    mark(Mark::Ready);
    ctx.gate.signal(n as u64);
    let t0 = Instant::now();
    let (start, cpu0, end, cpu1, late) = match plan.mode {
        Mode::Closed { secs } => {
            glommio::timer::sleep(plan.warm).await;
            let (start, cpu0) = (Instant::now(), thread_cpu_secs());
            mark(Mark::Start);
            glommio::timer::sleep(Duration::from_secs_f64(secs)).await;
            let (end, cpu1) = (Instant::now(), thread_cpu_secs());
            mark(Mark::End);
            ctx.stopping.set(true);
            (start, cpu0, end, cpu1, 0)
        }
        Mode::Once => {
            let cpu0 = thread_cpu_secs();
            mark(Mark::Start);
            while ctx.live.get() > 0 {
                glommio::timer::sleep(Duration::from_millis(2)).await;
            }
            let (end, cpu1) = (Instant::now(), thread_cpu_secs());
            mark(Mark::End);
            (t0, cpu0, end, cpu1, 0)
        }
        Mode::Open {
            steps_per_s,
            steps_per_send,
            secs,
        } => {
            let sends_per_s = steps_per_s / steps_per_send.max(1) as f64;
            open_loop(&ctx, &plan, &mut goes, t0, sends_per_s, secs, &mut mark).await
        }
    };
    // The runs still going finish (their steps after the window do not count).
    let wait_until = Instant::now() + Duration::from_secs(60);
    while ctx.live.get() > 0 && Instant::now() < wait_until {
        glommio::timer::sleep(Duration::from_millis(5)).await;
    }
    figures(&ctx, start, end, cpu1 - cpu0, late)
}

/// The open loop: sends offered at `sends_per_s` from `t0` (each to an idle session; none
/// idle is a late send, counted once the window started), for the warm-up and `secs`.
/// Answers the window's start, its CPU at start, its end, its CPU at end and the late sends.
async fn open_loop(
    ctx: &Ctx,
    plan: &Plan,
    goes: &mut Vec<LocalSender<()>>,
    t0: Instant,
    sends_per_s: f64,
    secs: f64,
    mark: &mut impl FnMut(Mark),
) -> (Instant, f64, Instant, f64, u64) {
    let (mut issued, mut late) = (0u64, 0u64);
    let (mut start, mut cpu0) = (None, 0.0);
    let stop_at = t0 + plan.warm + Duration::from_secs_f64(secs);
    loop {
        let now = Instant::now();
        if start.is_none() && now >= t0 + plan.warm {
            start = Some(now);
            cpu0 = thread_cpu_secs();
            mark(Mark::Start);
        }
        if now >= stop_at {
            break;
        }
        let due = (sends_per_s * now.duration_since(t0).as_secs_f64()) as u64;
        while issued < due {
            issued += 1;
            match ctx.idle.borrow_mut().pop_front() {
                Some(i) => {
                    let _ = goes[i].try_send(());
                }
                None if start.is_some() => late += 1,
                None => {}
            }
        }
        glommio::timer::sleep(Duration::from_micros(500)).await;
    }
    let (end, cpu1) = (Instant::now(), thread_cpu_secs());
    mark(Mark::End);
    goes.clear();
    (start.unwrap_or(t0), cpu0, end, cpu1, late)
}

fn figures(ctx: &Ctx, start: Instant, end: Instant, cpu_s: f64, late: u64) -> Figures {
    let mut steps = 0u64;
    let mut gaps = Vec::new();
    let runs = ctx.finished_runs.borrow();
    let current = ctx.current.borrow();
    for run in runs.iter().chain(current.iter()) {
        let inside: Vec<Instant> = run
            .iter()
            .copied()
            .filter(|t| *t >= start && *t <= end)
            .collect();
        steps += inside.len() as u64;
        gaps.extend(
            inside
                .windows(2)
                .map(|w| w[1].duration_since(w[0]).as_micros() as u32),
        );
    }
    gaps.sort_unstable();
    let mut first = ctx.first_step_us.take();
    first.sort_unstable();
    let mut display = ctx.display_us.take();
    display.sort_unstable();
    Figures {
        steps,
        window: end.duration_since(start),
        gaps_us: gaps,
        first_step_us: first,
        display_us: display,
        display_dropped: ctx.dropped.get(),
        sends: ctx.sends.get(),
        errors: ctx.errors.get(),
        first_error: ctx.first_error.take(),
        cpu_s,
        late,
        retried: ctx.retried.get(),
        retried_codes: ctx.retried_codes.borrow().clone().into_iter().collect(),
    }
}

async fn session_task(ctx: Rc<Ctx>, idx: usize, go: Option<LocalReceiver<()>>) {
    let mut sender = Sender { stream: None };
    let mut gen = 0u32;
    let mut sent_one = false;
    'sessions: loop {
        let name = format!("{}-{idx}-{gen}", ctx.plan.tag);
        let opened = Sub::open(&ctx, &name).await;
        if gen == 0 {
            let connected = if ctx.plan.keep_alive {
                sender.connect(&ctx).await
            } else {
                Ok(())
            };
            ctx.arrived.set(ctx.arrived.get() + 1);
            let _ = ctx.gate.acquire(1).await;
            if let Err(e) = connected {
                ctx.fail(e.to_string());
            }
        }
        let mut sub = match opened {
            Ok(sub) => sub,
            Err(e) => {
                ctx.fail(e.to_string());
                break;
            }
        };
        for k in 0..SENDS_PER_SESSION {
            match &go {
                Some(rx) => {
                    if rx.recv().await.is_none() {
                        break 'sessions;
                    }
                }
                None if sent_one && ctx.stopping.get() => break 'sessions,
                None => {}
            }
            sent_one = true;
            let outcome = one_send(&ctx, idx, &mut sub, &mut sender, &name, k).await;
            let ran = std::mem::take(&mut ctx.current.borrow_mut()[idx]);
            ctx.finished_runs.borrow_mut().push(ran);
            match outcome {
                Ok(()) => ctx.sends.set(ctx.sends.get() + 1),
                Err(e) => ctx.fail(format!("session {name}: {e}")),
            }
            if go.is_some() {
                ctx.idle.borrow_mut().push_back(idx);
            }
        }
        gen += 1;
    }
    ctx.live.set(ctx.live.get() - 1);
}

/// What a unit of the subscription says.
enum Unit {
    Step,
    Finished { completed: bool },
    Paused,
    Display,
    Gap(u64),
    End,
    Other,
}

fn classify(ev: &[u8]) -> Unit {
    let has = |needle: &[u8]| memchr::memmem::find(ev, needle).is_some();
    if has(b"\"type\":\"step_started\"") {
        Unit::Step
    } else if has(b"\"type\":\"run_finished\"") {
        Unit::Finished {
            completed: has(b"\"reason\":\"completed\""),
        }
    } else if has(b"\"type\":\"run_paused\"") {
        Unit::Paused
    } else if has(b"display_gap") {
        let at = memchr::memmem::find(ev, b"\"dropped\":").map_or(ev.len(), |i| i + 10);
        Unit::Gap(digits(&ev[at..]).unwrap_or(0))
    } else if has(b"display") {
        Unit::Display
    } else if has(b"event: end") || has(b"\"event\":\"end\"") {
        Unit::End
    } else {
        Unit::Other
    }
}

fn digits(b: &[u8]) -> Option<u64> {
    let n = b.iter().take_while(|c| c.is_ascii_digit()).count();
    std::str::from_utf8(&b[..n]).ok()?.parse().ok()
}

async fn one_send(
    ctx: &Ctx,
    idx: usize,
    sub: &mut Sub,
    sender: &mut Sender,
    session: &str,
    k: u32,
) -> Result<(), LoadError> {
    let sent_at = Instant::now();
    sender.send(ctx, session, k).await?;
    let mut first = true;
    loop {
        let (a, b) = sub.next().await?;
        match classify(&sub.buf[a..b]) {
            Unit::Step => {
                let now = Instant::now();
                if first {
                    first = false;
                    ctx.first_step_us
                        .borrow_mut()
                        .push(now.duration_since(sent_at).as_micros() as u32);
                }
                ctx.current.borrow_mut()[idx].push(now);
            }
            Unit::Finished { completed: true } => return Ok(()),
            Unit::Finished { completed: false } => {
                return Err(LoadError::Run(
                    String::from_utf8_lossy(&sub.buf[a..b]).into_owned(),
                ))
            }
            Unit::Paused => return Err(LoadError::Run("the run paused".into())),
            Unit::End => return Err(LoadError::Closed("the subscription")),
            Unit::Display => {
                let now = mono_us();
                let ev = &sub.buf[a..b];
                let mut display = ctx.display_us.borrow_mut();
                for at in memchr::memchr_iter(b'@', ev) {
                    if let Some(stamp) = digits(&ev[at + 1..]) {
                        display.push(now.saturating_sub(stamp) as u32);
                    }
                }
            }
            Unit::Gap(n) => ctx.dropped.set(ctx.dropped.get() + n),
            Unit::Other => {}
        }
    }
}

async fn connect(ctx: &Ctx) -> Result<TcpStream, LoadError> {
    let _permit = ctx
        .connects
        .acquire_permit(1)
        .await
        .map_err(LoadError::Runtime)?;
    let s = TcpStream::connect(ctx.target.addr)
        .await
        .map_err(|e| match e {
            glommio::GlommioError::IoError(source) => LoadError::Io {
                doing: "connecting to the daemon",
                source,
            },
            other => LoadError::Io {
                doing: "connecting to the daemon",
                source: std::io::Error::other(other.to_string()),
            },
        })?;
    let _ = s.set_nodelay(true);
    let _ = s.set_read_timeout(Some(READ_TIMEOUT));
    Ok(s)
}

/// Reads until `buf` holds a whole response head; its length with the blank line.
async fn read_head(s: &mut TcpStream, buf: &mut Vec<u8>) -> Result<usize, LoadError> {
    let mut chunk = [0u8; 8192];
    loop {
        if let Some(i) = memchr::memmem::find(buf, b"\r\n\r\n") {
            return Ok(i + 4);
        }
        match s.read(&mut chunk).await {
            Ok(0) => return Err(LoadError::Closed("the connection")),
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(e) => return Err(LoadError::io("reading an answer")(e)),
        }
    }
}

fn status_of(head: &[u8]) -> u16 {
    head.get(9..12)
        .and_then(|s| std::str::from_utf8(s).ok())
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

struct Sender {
    stream: Option<TcpStream>,
}

impl Sender {
    async fn connect(&mut self, ctx: &Ctx) -> Result<(), LoadError> {
        self.stream = Some(connect(ctx).await?);
        Ok(())
    }

    /// `session.send` on the keep-alive connection (opened again once if it was lost), or on
    /// a connection of its own; a transient refusal (503) is made again after a pause.
    async fn send(&mut self, ctx: &Ctx, session: &str, k: u32) -> Result<(), LoadError> {
        for _ in 0..SEND_RETRIES {
            match self.send_once(ctx, session, k).await {
                Err(LoadError::Status {
                    status: 503, body, ..
                }) => {
                    ctx.retried.set(ctx.retried.get() + 1);
                    let code = serde_json::from_str::<serde_json::Value>(&body)
                        .ok()
                        .and_then(|v| v["error"]["code"].as_str().map(str::to_string))
                        .unwrap_or_else(|| "(no JSON error)".into());
                    *ctx.retried_codes.borrow_mut().entry(code).or_insert(0) += 1;
                    glommio::timer::sleep(Duration::from_millis(100)).await;
                }
                other => return other,
            }
        }
        Err(LoadError::Refused {
            times: SEND_RETRIES,
        })
    }

    async fn send_once(&mut self, ctx: &Ctx, session: &str, k: u32) -> Result<(), LoadError> {
        let _permit = match ctx.plan.keep_alive {
            true => None,
            false => Some(
                ctx.sends_at_once
                    .acquire_permit(1)
                    .await
                    .map_err(LoadError::Runtime)?,
            ),
        };
        let body = format!(
            "{{\"method\":\"session.send\",\"params\":{{\"project_root\":\"/e2e\",\"harness\":\"bench\",\
             \"session\":\"{session}\",\"prompt\":\"bench-prompt {session} {k}\",\"model\":\"anthropic/bench\"}}}}"
        );
        let req = format!(
            "POST /v1/rpc HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {}\r\ncontent-type: application/json\r\n\
             content-length: {}\r\n{}\r\n{body}",
            ctx.target.handle,
            body.len(),
            if ctx.plan.keep_alive { "" } else { "connection: close\r\n" }
        );
        for attempt in 0..2 {
            if self.stream.is_none() {
                self.connect(ctx).await?;
            }
            let s = self.stream.as_mut().expect("just connected");
            let answer = exchange(s, req.as_bytes()).await;
            if !ctx.plan.keep_alive {
                self.stream = None;
            }
            match answer {
                Ok((200, _)) => return Ok(()),
                Ok((status, reply)) => {
                    return Err(LoadError::Status {
                        what: broca::wire::Method::SessionSend.as_str(),
                        status,
                        body: String::from_utf8_lossy(&reply).into_owned(),
                    })
                }
                Err(e) if attempt == 1 => return Err(e),
                Err(_) => self.stream = None,
            }
        }
        unreachable!("the loop returns")
    }
}

/// Writes a request and reads its response (Content-Length framed).
pub(crate) async fn exchange(s: &mut TcpStream, req: &[u8]) -> Result<(u16, Vec<u8>), LoadError> {
    s.write_all(req)
        .await
        .map_err(LoadError::io("writing a request"))?;
    let mut buf = Vec::with_capacity(512);
    let head_len = read_head(s, &mut buf).await?;
    let head = String::from_utf8_lossy(&buf[..head_len]).to_ascii_lowercase();
    let len: usize = head
        .split("content-length:")
        .nth(1)
        .and_then(|r| r.split("\r\n").next())
        .and_then(|v| v.trim().parse().ok())
        .ok_or(LoadError::NoLength)?;
    let mut chunk = [0u8; 8192];
    while buf.len() < head_len + len {
        match s.read(&mut chunk).await {
            Ok(0) => return Err(LoadError::Closed("the connection")),
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(e) => return Err(LoadError::io("reading an answer")(e)),
        }
    }
    Ok((status_of(&buf), buf[head_len..head_len + len].to_vec()))
}

/// A subscription: server-sent events, or WebSocket text messages.
struct Sub {
    s: TcpStream,
    buf: Vec<u8>,
    at: usize,
    websocket: bool,
}

impl Sub {
    async fn open(ctx: &Ctx, session: &str) -> Result<Sub, LoadError> {
        let mut s = connect(ctx).await?;
        let ws = if ctx.plan.websocket {
            "Upgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\
             Sec-WebSocket-Version: 13\r\n"
        } else {
            ""
        };
        let req = format!(
            "GET /v1/subscribe?project_root=%2Fe2e&harness=bench&session={session}&from=live HTTP/1.1\r\n\
             Host: x\r\nAuthorization: Bearer {}\r\n{ws}\r\n",
            ctx.target.handle
        );
        s.write_all(req.as_bytes())
            .await
            .map_err(LoadError::io("writing the subscribe request"))?;
        let mut buf = Vec::with_capacity(4096);
        let head_len = read_head(&mut s, &mut buf).await?;
        let status = status_of(&buf);
        let want = if ctx.plan.websocket { 101 } else { 200 };
        if status != want {
            return Err(LoadError::Status {
                what: "subscribe",
                status,
                body: String::from_utf8_lossy(&buf).into_owned(),
            });
        }
        Ok(Sub {
            s,
            buf,
            at: head_len,
            websocket: ctx.plan.websocket,
        })
    }

    /// The next event's bytes, as a range of `self.buf` (valid until the next call).
    async fn next(&mut self) -> Result<(usize, usize), LoadError> {
        loop {
            if let Some(found) = self.take() {
                return found;
            }
            if self.at > 0 {
                self.buf.drain(..self.at);
                self.at = 0;
            }
            let len = self.buf.len();
            self.buf.resize(len + 16 * 1024, 0);
            match self.s.read(&mut self.buf[len..]).await {
                Ok(0) => return Err(LoadError::Closed("the subscription")),
                Ok(n) => self.buf.truncate(len + n),
                Err(e) => return Err(LoadError::io("reading the subscription")(e)),
            }
        }
    }

    /// An event already buffered, if there is one.
    fn take(&mut self) -> Option<Result<(usize, usize), LoadError>> {
        let rest = &self.buf[self.at..];
        if !self.websocket {
            let i = memchr::memmem::find(rest, b"\n\n")?;
            let range = (self.at, self.at + i);
            self.at += i + 2;
            return Some(Ok(range));
        }
        loop {
            let rest = &self.buf[self.at..];
            if rest.len() < 2 {
                return None;
            }
            let opcode = rest[0] & 0x0f;
            let (len, head) = match rest[1] & 0x7f {
                126 if rest.len() >= 4 => (u16::from_be_bytes([rest[2], rest[3]]) as usize, 4),
                127 if rest.len() >= 10 => (
                    u64::from_be_bytes(rest[2..10].try_into().expect("eight bytes")) as usize,
                    10,
                ),
                126 | 127 => return None,
                n => (n as usize, 2),
            };
            if rest.len() < head + len {
                return None;
            }
            let range = (self.at + head, self.at + head + len);
            self.at += head + len;
            match opcode {
                0x1 | 0x2 | 0x0 => return Some(Ok(range)),
                0x8 => return Some(Err(LoadError::Closed("the WebSocket"))),
                _ => {} // ping, pong
            }
        }
    }
}
