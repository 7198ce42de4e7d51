//! The client of a running `broca serve`, for the commands that talk to one (`send`,
//! `attach`, `status`, `cancel`, `ls`, `read`): found through `<state-dir>/serve.json` (its
//! Unix socket when there is one, which needs no handle; else its TCP address with the
//! bearer handle from its owner-only file), or named with `--connect URL|SOCKET`. Blocking
//! HTTP/1.1, one connection per request, and the event stream read line by line.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{json, Value};

/// How long a request (not a subscription) may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(120);
/// The largest answer read.
const BODY_MAX: usize = 64 << 20;

/// Where the daemon is.
#[derive(Debug, Clone)]
pub enum Daemon {
    Socket(PathBuf),
    Tcp { addr: String, handle: String },
}

/// A refusal as the daemon gave it, or why it could not be asked.
#[derive(Debug, Clone)]
pub enum ClientError {
    /// The daemon answered an error: its code and message.
    Refused { code: String, message: String },
    /// No daemon could be reached, or its answer could not be read.
    Unreachable(String),
}

impl std::fmt::Display for ClientError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ClientError::Refused { code, message } => write!(f, "{code}: {message}"),
            ClientError::Unreachable(why) => f.write_str(why),
        }
    }
}

fn unreachable(why: impl Into<String>) -> ClientError {
    ClientError::Unreachable(why.into())
}

impl Daemon {
    /// The daemon `connect` names (`http://HOST:PORT`, with the handle from `BROCA_HANDLE`
    /// or the state dir's handle file, or a socket's path), else the one serve.json of
    /// `state_dir` describes.
    pub fn find(state_dir: &Path, connect: Option<&str>) -> Result<Daemon, String> {
        match connect {
            Some(url) if url.starts_with("http://") => {
                let addr = url.trim_start_matches("http://").trim_end_matches('/');
                let handle = match std::env::var("BROCA_HANDLE") {
                    Ok(h) if !h.trim().is_empty() => h.trim().to_string(),
                    _ => read_handle(&state_dir.join("serve.handle"))?,
                };
                Ok(Daemon::Tcp {
                    addr: addr.to_string(),
                    handle,
                })
            }
            Some(url) if url.contains("://") => Err(format!(
                "--connect {url}: give http://HOST:PORT or a socket's path (https is a proxy's \
                 to terminate)"
            )),
            Some(path) => Ok(Daemon::Socket(PathBuf::from(path))),
            None => Daemon::from_serve_json(state_dir),
        }
    }

    fn from_serve_json(state_dir: &Path) -> Result<Daemon, String> {
        let file = state_dir.join("serve.json");
        let bytes = std::fs::read(&file).map_err(|e| {
            format!(
                "no running broca serve found: {} ({e}); start one with `broca serve`, or \
                 name it with --connect URL|SOCKET (and --state-dir, if it uses another)",
                file.display()
            )
        })?;
        let info: Value = serde_json::from_slice(&bytes)
            .map_err(|e| format!("{}: not serve's file ({e})", file.display()))?;
        if let Some(socket) = info["socket"].as_str().filter(|s| Path::new(s).exists()) {
            return Ok(Daemon::Socket(PathBuf::from(socket)));
        }
        let addr = info["listen"]
            .as_str()
            .ok_or_else(|| format!("{}: names no listen address", file.display()))?;
        let handle_file = info["handle_file"]
            .as_str()
            .map(PathBuf::from)
            .unwrap_or_else(|| state_dir.join("serve.handle"));
        Ok(Daemon::Tcp {
            addr: addr.to_string(),
            handle: read_handle(&handle_file)?,
        })
    }

    /// One management request: its `result`, or the daemon's refusal.
    pub fn rpc(&self, method: &str, params: Value) -> Result<Value, ClientError> {
        debug_assert!(
            broca_wire::request::Method::parse(method).is_some(),
            "the command line calls the methods broca answers"
        );
        let body = json!({"method": method, "params": params}).to_string();
        self.post("/v1/rpc", &body)
    }

    /// A POST of `body` to `path` whose answer is `{"result"}` or `{"error"}`: the result, or
    /// the daemon's refusal.
    pub fn post(&self, path: &str, body: &str) -> Result<Value, ClientError> {
        debug_assert!(path.starts_with('/') && !path.contains(char::is_whitespace));
        let head = format!(
            "POST {path} HTTP/1.1\r\nHost: broca\r\n{}Content-Type: application/json\r\n\
             Content-Length: {}\r\nConnection: close\r\n\r\n",
            self.auth(),
            body.len()
        );
        let mut stream = self.connect(Some(REQUEST_TIMEOUT))?;
        stream
            .write_all(head.as_bytes())
            .and_then(|()| stream.write_all(body.as_bytes()))
            .map_err(|e| unreachable(format!("sending to {self}: {e}")))?;
        let mut reader = BufReader::new(stream);
        let status = read_head(&mut reader, self)?;
        let mut answer = Vec::new();
        reader
            .take(BODY_MAX as u64)
            .read_to_end(&mut answer)
            .map_err(|e| unreachable(format!("reading {self}'s answer: {e}")))?;
        let v: Value = serde_json::from_slice(&answer).map_err(|e| {
            unreachable(format!(
                "{self} answered {status} with a body that is not JSON: {e}"
            ))
        })?;
        if let Some(result) = v.get("result") {
            return Ok(result.clone());
        }
        let e = &v["error"];
        Err(ClientError::Refused {
            code: e["code"].as_str().unwrap_or("error").to_string(),
            message: e["message"].as_str().unwrap_or("").to_string(),
        })
    }

    /// Subscribes to a session's events (`query` is the subscribe route's query string).
    pub fn subscribe(&self, query: &str) -> Result<Events, ClientError> {
        debug_assert!(
            !query.contains(char::is_whitespace),
            "a query is percent-encoded"
        );
        let head = format!(
            "GET /v1/subscribe?{query} HTTP/1.1\r\nHost: broca\r\n{}Accept: text/event-stream\r\n\r\n",
            self.auth()
        );
        let mut stream = self.connect(None)?;
        stream
            .write_all(head.as_bytes())
            .map_err(|e| unreachable(format!("sending to {self}: {e}")))?;
        let mut reader = BufReader::new(stream);
        let status = read_head(&mut reader, self)?;
        if status != 200 {
            let mut body = Vec::new();
            let _ = reader.take(BODY_MAX as u64).read_to_end(&mut body);
            let v: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
            return Err(ClientError::Refused {
                code: v["error"]["code"].as_str().unwrap_or("error").to_string(),
                message: v["error"]["message"].as_str().unwrap_or("").to_string(),
            });
        }
        Ok(Events { reader })
    }

    fn auth(&self) -> String {
        match self {
            Daemon::Socket(_) => String::new(),
            Daemon::Tcp { handle, .. } => format!("Authorization: Bearer {handle}\r\n"),
        }
    }

    fn connect(&self, timeout: Option<Duration>) -> Result<Box<dyn Stream>, ClientError> {
        let fail = |e: std::io::Error| unreachable(format!("cannot reach {self}: {e}"));
        let s: Box<dyn Stream> = match self {
            Daemon::Socket(path) => {
                let s = UnixStream::connect(path).map_err(fail)?;
                s.set_read_timeout(timeout).map_err(fail)?;
                Box::new(s)
            }
            Daemon::Tcp { addr, .. } => {
                let s = TcpStream::connect(addr).map_err(fail)?;
                s.set_read_timeout(timeout).map_err(fail)?;
                Box::new(s)
            }
        };
        Ok(s)
    }
}

impl std::fmt::Display for Daemon {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Daemon::Socket(p) => write!(f, "broca serve at {}", p.display()),
            Daemon::Tcp { addr, .. } => write!(f, "broca serve at http://{addr}"),
        }
    }
}

/// A connection's two directions.
pub trait Stream: Read + Write + Send {}
impl<T: Read + Write + Send> Stream for T {}

fn read_handle(path: &Path) -> Result<String, String> {
    let bytes = broca_owner_only::read_private(path)
        .map_err(|e| format!("the bearer handle {}: {e}", path.display()))?;
    Ok(String::from_utf8_lossy(&bytes).trim().to_string())
}

/// Reads a response's status line and headers; answers the status.
fn read_head(reader: &mut impl BufRead, daemon: &Daemon) -> Result<u16, ClientError> {
    let mut line = String::new();
    reader
        .read_line(&mut line)
        .map_err(|e| unreachable(format!("reading {daemon}'s answer: {e}")))?;
    let status = line
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| unreachable(format!("{daemon} answered {:?}, not HTTP", line.trim())))?;
    loop {
        line.clear();
        let n = reader
            .read_line(&mut line)
            .map_err(|e| unreachable(format!("reading {daemon}'s answer: {e}")))?;
        if n == 0 || line == "\r\n" || line == "\n" {
            return Ok(status);
        }
    }
}

/// One event of a subscription.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// A control unit: its cursor and body.
    Control { id: String, unit: Value },
    /// Display text of the step in flight.
    Display(String),
    /// Display deltas were dropped (a slow reader).
    Gap(u64),
    /// The daemon ended the subscription: why.
    End(String),
}

/// A subscription's events, read as they come.
pub struct Events {
    reader: BufReader<Box<dyn Stream>>,
}

impl Events {
    /// The next event; `None` once the daemon closed the stream.
    pub fn next_event(&mut self) -> Option<Event> {
        let (mut id, mut event, mut data) = (None::<String>, None::<String>, String::new());
        let mut line = String::new();
        loop {
            line.clear();
            match self.reader.read_line(&mut line) {
                Ok(0) | Err(_) => return None,
                Ok(_) => {}
            }
            let l = line.trim_end_matches(['\r', '\n']);
            if l.is_empty() {
                if data.is_empty() {
                    continue; // a comment's end, or a keepalive
                }
                let v: Value = serde_json::from_str(&data).unwrap_or(Value::Null);
                let (kind, cursor) = (event.take(), id.take());
                data.clear();
                debug_assert!(id.is_none() && event.is_none(), "each event starts afresh");
                return Some(match (kind.as_deref(), cursor) {
                    (Some("display"), _) => {
                        Event::Display(v["text"].as_str().unwrap_or("").to_string())
                    }
                    (Some("display_gap"), _) => Event::Gap(v["dropped"].as_u64().unwrap_or(0)),
                    (Some("end"), _) => Event::End(v["reason"].as_str().unwrap_or("").to_string()),
                    (_, Some(id)) => Event::Control { id, unit: v },
                    // An event of a kind this client does not know: skipped.
                    _ => continue,
                });
            }
            if let Some(v) = l.strip_prefix("id: ") {
                id = Some(v.to_string());
            } else if let Some(v) = l.strip_prefix("event: ") {
                event = Some(v.to_string());
            } else if let Some(v) = l.strip_prefix("data: ") {
                data.push_str(v);
            }
        }
    }
}
