//! The daemon's message plane (a NATS server the `ckbus` module fronts), for broca's plain
//! publishes: live hints such as llm-runner/v1 `step.finished.v1`. Nothing here is durable or
//! authoritative: a hint that cannot be sent is dropped and counted, never retried later and
//! never waited for by a run.
//!
//! The credential comes from ckbus's management surface (`ckbus.credential`: a user JWT, the
//! server's URL and the account the subjects are under), fetched again at every connect; the
//! server's nonce is signed by ckbus (`ckbus.nonce_sign`), so no private key is ever in broca.
//! The NATS client is the protocol's text form over a blocking socket on a thread of its own
//! (`INFO`, `CONNECT` with `jwt` and `sig`, `PUB`, `PING`/`PONG`), off the shards: a shard
//! hands a hint over a bounded queue and goes on.

use std::io::{BufRead, BufReader, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, RecvTimeoutError, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use base64::Engine as _;
use serde_json::{json, Value};

use crate::surface::{SurfaceClient, SurfaceError};

/// The bus module's id.
pub const CKBUS: &str = "ckbus";
/// How long a ckbus request may take.
const CKBUS_DEADLINE: Duration = Duration::from_secs(5);
/// Hints waiting for the bus thread; past this, new ones are dropped (and counted).
pub const QUEUE: usize = 4096;
/// How long a connect (TCP, the server's INFO, the answer to CONNECT) may take.
const CONNECT_DEADLINE: Duration = Duration::from_secs(5);
/// The wait before connecting again after a failure: doubling from the first to the last.
const BACKOFF: (Duration, Duration) = (Duration::from_millis(500), Duration::from_secs(30));
/// The largest INFO or protocol line read from the server.
const LINE_MAX: usize = 64 * 1024;

/// A credential for the bus, as ckbus issues it. The JWT is a secret: never logged.
#[derive(Clone)]
pub struct Credential {
    pub jwt: String,
    pub credential_public: String,
    pub server_url: String,
    pub acct: String,
}

impl std::fmt::Debug for Credential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credential")
            .field("server_url", &self.server_url)
            .field("acct", &self.acct)
            .finish_non_exhaustive()
    }
}

/// Why the bus could not be had: ckbus did not give a credential or a signature, the bus's
/// address does not read, a read or write failed, the bus said what broca does not take or
/// refused, or a thread of the bus client did not start.
#[derive(Debug)]
pub enum BusError {
    Ckbus(String),
    Address(String),
    Io {
        doing: &'static str,
        error: std::io::Error,
    },
    Protocol(String),
    Thread(std::io::Error),
}

impl std::fmt::Display for BusError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BusError::Ckbus(why) | BusError::Address(why) | BusError::Protocol(why) => {
                f.write_str(why)
            }
            BusError::Io { doing, error } => write!(f, "{doing}: {error}"),
            BusError::Thread(e) => write!(f, "a bus thread cannot start: {e}"),
        }
    }
}

impl std::error::Error for BusError {}

/// An I/O failure while `doing`.
fn io(doing: &'static str) -> impl FnOnce(std::io::Error) -> BusError {
    move |error| BusError::Io { doing, error }
}

/// Where credentials and nonce signatures come from.
pub trait Signer: Send + Sync + 'static {
    /// A fresh credential.
    fn credential(&self) -> Result<Credential, BusError>;
    /// ckbus's signature of the server's `nonce` under `credential`.
    fn sign(&self, credential: &Credential, nonce: &[u8]) -> Result<Vec<u8>, BusError>;
}

/// ckbus's management surface, reached through the daemon.
pub struct Ckbus {
    surface: SurfaceClient,
}

impl Ckbus {
    /// ckbus through the daemon of connection file `file`, as module `module_id`.
    pub fn new(file: PathBuf, module_id: String, launch_nonce: Option<String>) -> Ckbus {
        Ckbus {
            surface: SurfaceClient::new(
                file,
                CKBUS,
                "publisher",
                module_id,
                launch_nonce,
                CKBUS_DEADLINE,
            ),
        }
    }

    fn call(&self, method: &str, params: Value) -> Result<Value, BusError> {
        let refused = |why: String| Err(BusError::Ckbus(why));
        match self.surface.call(method, params) {
            Ok(Ok(mut answer)) => match answer.get_mut("error") {
                Some(error) => refused(format!(
                    "{CKBUS} refused {method}: {}",
                    error["code"].as_str().unwrap_or("an unreadable error")
                )),
                None => Ok(match answer.get_mut("result") {
                    Some(result) => result.take(),
                    None => answer,
                }),
            },
            Ok(Err(body)) => {
                let error: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
                let code = error["code"].as_str().unwrap_or("an unreadable error");
                refused(format!("{CKBUS} refused {method}: {code}"))
            }
            Err(SurfaceError::Refused(code)) => {
                refused(format!("the daemon refused a route to {CKBUS}: {code}"))
            }
            Err(SurfaceError::Transport(why)) => refused(format!("{CKBUS} ({method}): {why}")),
        }
    }
}

/// An answer's member `name` as text, or what is wrong with it.
fn text(answer: &Value, name: &str, method: &str) -> Result<String, BusError> {
    match answer.get(name).and_then(Value::as_str) {
        Some(v) if !v.is_empty() => Ok(v.to_string()),
        _ => Err(BusError::Ckbus(format!(
            "{CKBUS}'s {method} answer has no `{name}`"
        ))),
    }
}

impl Signer for Ckbus {
    fn credential(&self) -> Result<Credential, BusError> {
        const M: &str = "ckbus.credential";
        let a = self.call(M, json!({}))?;
        Ok(Credential {
            jwt: text(&a, "jwt", M)?,
            credential_public: text(&a, "credential_public", M)?,
            server_url: text(&a, "server_url", M)?,
            acct: text(&a, "acct", M)?,
        })
    }

    fn sign(&self, credential: &Credential, nonce: &[u8]) -> Result<Vec<u8>, BusError> {
        const M: &str = "ckbus.nonce_sign";
        let a = self.call(
            M,
            json!({"nonce_b64": STANDARD.encode(nonce), "credential_public": credential.credential_public}),
        )?;
        STANDARD
            .decode(text(&a, "signature_b64", M)?)
            .map_err(|e| BusError::Ckbus(format!("{CKBUS}'s {M} answer is not base64: {e}")))
    }
}

/// What the bus thread has done, for metrics and tests.
#[derive(Debug, Default)]
pub struct BusCounts {
    pub published: AtomicU64,
    /// Hints dropped: the queue full, or the bus unreachable when their turn came.
    pub dropped: AtomicU64,
    pub connects: AtomicU64,
}

/// One hint: the subject after `ck.{acct}.`, and its body.
struct Hint {
    tail: String,
    body: Vec<u8>,
}

/// The publisher: a bounded queue to the bus thread. Dropping it ends the thread once the
/// hints queued are sent (or dropped).
pub struct Publisher {
    tx: SyncSender<Hint>,
    counts: Arc<BusCounts>,
}

impl Publisher {
    /// Starts the bus thread; it connects when the first hint comes.
    pub fn start(signer: Arc<dyn Signer>) -> Result<Publisher, BusError> {
        let (tx, rx) = sync_channel(QUEUE);
        let counts = Arc::new(BusCounts::default());
        let c = counts.clone();
        std::thread::Builder::new()
            .name("broca-bus".into())
            .spawn(move || Thread::new(signer, c).run(rx))
            .map_err(BusError::Thread)?;
        Ok(Publisher { tx, counts })
    }

    /// Queues `body` for `ck.{acct}.{tail}`; never blocks. Answers whether it was queued.
    pub fn publish(&self, tail: String, body: Vec<u8>) -> bool {
        match self.tx.try_send(Hint { tail, body }) {
            Ok(()) => true,
            Err(TrySendError::Full(_)) | Err(TrySendError::Disconnected(_)) => {
                self.counts.dropped.fetch_add(1, Ordering::Relaxed);
                false
            }
        }
    }

    pub fn counts(&self) -> &BusCounts {
        &self.counts
    }
}

/// A connection to the NATS server.
struct Nats {
    writer: Arc<Mutex<TcpStream>>,
    dead: Arc<AtomicBool>,
    acct: String,
}

impl Drop for Nats {
    fn drop(&mut self) {
        if let Ok(s) = self.writer.lock() {
            let _ = s.shutdown(std::net::Shutdown::Both);
        }
    }
}

struct Thread {
    signer: Arc<dyn Signer>,
    counts: Arc<BusCounts>,
    conn: Option<Nats>,
    /// No connect before this (after a failure), and the next wait.
    retry_at: Option<Instant>,
    backoff: Duration,
}

impl Thread {
    fn new(signer: Arc<dyn Signer>, counts: Arc<BusCounts>) -> Thread {
        Thread {
            signer,
            counts,
            conn: None,
            retry_at: None,
            backoff: BACKOFF.0,
        }
    }

    fn run(mut self, rx: Receiver<Hint>) {
        loop {
            let hint = match rx.recv_timeout(Duration::from_secs(1)) {
                Ok(h) => h,
                Err(RecvTimeoutError::Timeout) => {
                    if self
                        .conn
                        .as_ref()
                        .is_some_and(|c| c.dead.load(Ordering::Acquire))
                    {
                        self.conn = None;
                    }
                    continue;
                }
                Err(RecvTimeoutError::Disconnected) => return,
            };
            self.send(hint);
        }
    }

    fn send(&mut self, hint: Hint) {
        if self
            .conn
            .as_ref()
            .is_some_and(|c| c.dead.load(Ordering::Acquire))
        {
            self.conn = None;
        }
        if self.conn.is_none() && self.retry_at.is_none_or(|at| Instant::now() >= at) {
            match connect(&*self.signer) {
                Ok(c) => {
                    self.counts.connects.fetch_add(1, Ordering::Relaxed);
                    tracing::info!("connected to the bus for live hints");
                    self.conn = Some(c);
                    self.retry_at = None;
                    self.backoff = BACKOFF.0;
                }
                Err(e) => {
                    tracing::warn!(
                        "live hints are dropped for {:?}: the bus cannot be reached: {e}",
                        self.backoff
                    );
                    self.retry_at = Some(Instant::now() + self.backoff);
                    self.backoff = (self.backoff * 2).min(BACKOFF.1);
                }
            }
        }
        let Some(conn) = &self.conn else {
            self.counts.dropped.fetch_add(1, Ordering::Relaxed);
            return;
        };
        let subject = format!("ck.{}.{}", conn.acct, hint.tail);
        let mut frame = format!("PUB {subject} {}\r\n", hint.body.len()).into_bytes();
        frame.extend_from_slice(&hint.body);
        frame.extend_from_slice(b"\r\n");
        let written = match conn.writer.lock() {
            Ok(mut s) => s.write_all(&frame).is_ok(),
            Err(_) => false,
        };
        if written {
            self.counts.published.fetch_add(1, Ordering::Relaxed);
        } else {
            tracing::warn!("the bus connection failed; a live hint was dropped");
            self.counts.dropped.fetch_add(1, Ordering::Relaxed);
            self.conn = None;
        }
    }
}

/// `nats://host:port` (or `host:port`) as a socket address; TLS is not spoken here.
fn server_addr(url: &str) -> Result<std::net::SocketAddr, BusError> {
    let rest = match url.split_once("://") {
        Some(("nats", rest)) => rest,
        Some((scheme, _)) => {
            return Err(BusError::Address(format!(
                "the bus URL's scheme `{scheme}` is not supported (nats:// only)"
            )))
        }
        None => url,
    };
    let hostport = rest
        .rsplit('@')
        .next()
        .unwrap_or(rest)
        .trim_end_matches('/');
    hostport
        .to_socket_addrs()
        .map_err(|e| BusError::Address(format!("the bus address {hostport}: {e}")))?
        .next()
        .ok_or_else(|| BusError::Address(format!("the bus address {hostport} resolves to nothing")))
}

/// One protocol line from the server, without its CRLF.
fn line<R: BufRead>(reader: &mut R) -> Result<String, BusError> {
    let mut buf = Vec::new();
    let n = std::io::Read::take(&mut *reader, LINE_MAX as u64)
        .read_until(b'\n', &mut buf)
        .map_err(io("reading from the bus"))?;
    if n == 0 {
        return Err(BusError::Protocol("the bus closed the connection".into()));
    }
    if buf.last() != Some(&b'\n') {
        return Err(BusError::Protocol(format!(
            "a line from the bus over {LINE_MAX} bytes"
        )));
    }
    while matches!(buf.last(), Some(b'\n' | b'\r')) {
        buf.pop();
    }
    String::from_utf8(buf)
        .map_err(|_| BusError::Protocol("a line from the bus that is not UTF-8".into()))
}

/// The server's INFO nonce, and whether it asks for TLS.
fn info(line: &str) -> Result<(Option<String>, bool), BusError> {
    let json = line.strip_prefix("INFO ").ok_or_else(|| {
        BusError::Protocol(format!("the bus began with {:?}, not INFO", cut(line)))
    })?;
    let v: Value = serde_json::from_str(json)
        .map_err(|e| BusError::Protocol(format!("the bus's INFO: {e}")))?;
    let tls = v["tls_required"].as_bool().unwrap_or(false);
    Ok((v["nonce"].as_str().map(str::to_string), tls))
}

fn cut(line: &str) -> &str {
    let mut end = line.len().min(80);
    while !line.is_char_boundary(end) {
        end -= 1;
    }
    &line[..end]
}

/// Connects: a fresh credential, INFO, CONNECT with the signed nonce, PING answered by PONG;
/// then a reader thread answers the server's PINGs and marks the connection dead when it
/// ends or the server says -ERR.
fn connect(signer: &dyn Signer) -> Result<Nats, BusError> {
    let credential = signer.credential()?;
    let addr = server_addr(&credential.server_url)?;
    let stream =
        TcpStream::connect_timeout(&addr, CONNECT_DEADLINE).map_err(io("connecting to the bus"))?;
    stream
        .set_read_timeout(Some(CONNECT_DEADLINE))
        .map_err(io("setting the read timeout"))?;
    let _ = stream.set_nodelay(true);
    // A server that stops reading fails the write (and the connection) instead of holding
    // the bus thread: hints queued meanwhile are dropped and counted, never a shard's wait.
    stream
        .set_write_timeout(Some(CONNECT_DEADLINE))
        .map_err(io("setting the write timeout"))?;
    let mut reader = BufReader::new(stream.try_clone().map_err(io("cloning the socket"))?);
    let (nonce, tls) = info(&line(&mut reader)?)?;
    if tls {
        return Err(BusError::Protocol(
            "the bus asks for TLS, which broca's bus client does not speak".into(),
        ));
    }
    let mut w = stream;
    let connect = connect_line(signer, &credential, nonce)?;
    w.write_all(connect.as_bytes())
        .map_err(io("writing to the bus"))?;
    loop {
        let l = line(&mut reader)?;
        match l.as_str() {
            "PONG" => break,
            "PING" => w.write_all(b"PONG\r\n").map_err(io("writing to the bus"))?,
            "+OK" => {}
            other if other.starts_with("-ERR") => {
                let why = format!("the bus refused the connection: {}", cut(other));
                return Err(BusError::Protocol(why));
            }
            other if other.starts_with("INFO ") => {}
            other => {
                return Err(BusError::Protocol(format!(
                    "the bus answered {:?}",
                    cut(other)
                )))
            }
        }
    }
    reader
        .get_ref()
        .set_read_timeout(None)
        .map_err(io("setting the read timeout"))?;
    let writer = Arc::new(Mutex::new(w));
    let dead = Arc::new(AtomicBool::new(false));
    answer_pings(reader, writer.clone(), dead.clone())?;
    Ok(Nats {
        writer,
        dead,
        acct: credential.acct,
    })
}

/// The CONNECT line (with the signed nonce, when the server sent one), then a PING.
fn connect_line(
    signer: &dyn Signer,
    credential: &Credential,
    nonce: Option<String>,
) -> Result<String, BusError> {
    let mut connect = json!({
        "verbose": false, "pedantic": false, "tls_required": false,
        "name": "broca", "lang": "rust", "version": env!("CARGO_PKG_VERSION"),
        "protocol": 1, "echo": false, "headers": false,
        "jwt": credential.jwt,
    });
    if let Some(nonce) = nonce {
        let sig = signer.sign(credential, nonce.as_bytes())?;
        connect["sig"] = Value::String(URL_SAFE_NO_PAD.encode(sig));
    }
    Ok(format!("CONNECT {connect}\r\nPING\r\n"))
}

/// A reader thread that answers the server's PINGs and marks the connection `dead` when it
/// ends or the server says -ERR.
fn answer_pings(
    mut reader: BufReader<TcpStream>,
    pong: Arc<Mutex<TcpStream>>,
    dead: Arc<AtomicBool>,
) -> Result<(), BusError> {
    std::thread::Builder::new()
        .name("broca-bus-read".into())
        .spawn(move || {
            loop {
                match line(&mut reader) {
                    Ok(l) if l == "PING" => {
                        let ok = pong
                            .lock()
                            .map(|mut s| s.write_all(b"PONG\r\n").is_ok())
                            .unwrap_or(false);
                        if !ok {
                            break;
                        }
                    }
                    Ok(l) if l.starts_with("-ERR") => {
                        tracing::warn!("the bus said {}", cut(&l));
                        break;
                    }
                    Ok(_) => {}
                    Err(_) => break,
                }
            }
            dead.store(true, Ordering::Release);
        })
        .map_err(BusError::Thread)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bus_urls_read_as_the_server_gives_them() {
        assert_eq!(server_addr("nats://127.0.0.1:4222").unwrap().port(), 4222);
        assert_eq!(server_addr("127.0.0.1:5").unwrap().port(), 5);
        assert!(server_addr("tls://127.0.0.1:4222")
            .unwrap_err()
            .to_string()
            .contains("nats:// only"));
    }

    #[test]
    fn an_info_line_gives_its_nonce() {
        let (nonce, tls) =
            info(r#"INFO {"server_id":"x","nonce":"abc","max_payload":1048576}"#).unwrap();
        assert_eq!(nonce.as_deref(), Some("abc"));
        assert!(!tls);
        assert!(info("-ERR 'nope'")
            .unwrap_err()
            .to_string()
            .contains("not INFO"));
    }

    #[test]
    fn a_credential_never_shows_its_jwt() {
        let c = Credential {
            jwt: "eyJ-secret".into(),
            credential_public: "U1".into(),
            server_url: "nats://127.0.0.1:1".into(),
            acct: "a1".into(),
        };
        assert!(!format!("{c:?}").contains("secret"));
    }
}
