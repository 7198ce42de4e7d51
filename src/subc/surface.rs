//! A blocking client of one module's management surface, over a connection of its own: the
//! daemon's handshake (authenticated, no HELLO), `route.open` to the module's
//! `management_surface` with broca's consumer identity (its module id and launch nonce: the
//! module scopes what it answers to broca's grant), then `{method, params}` requests on the
//! route, one at a time. The vault (claustrum) and the bus (ckbus) are reached this way; each
//! reads its answers with its own contract's decoders.
//!
//! Short deadlines; one connection, kept, redialled once after a transport failure; a
//! route.open the daemon refuses as retryable is tried again with a doubling backoff.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::Duration;

use serde_json::{json, Value};
use subc_control::{ClientControlRequest, ClientControlResponse, ConsumerIdentity};
use subc_protocol::error_codes::is_retryable_route_open;
use subc_protocol::{BindIdentity, FrameType, RouteTarget};

use crate::frames::{self, Decoder, FrameIn};

/// A refused open the daemon marks retryable is tried again this many times, backing off.
const OPEN_ATTEMPTS: u32 = 5;

/// Why a request on a surface did not get an answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SurfaceError {
    /// The connection or the route is gone, or an answer did not come in time: how.
    Transport(String),
    /// The daemon refused the route for good: the code it gave.
    Refused(String),
}

impl std::fmt::Display for SurfaceError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SurfaceError::Transport(e) => f.write_str(e),
            SurfaceError::Refused(code) => write!(f, "the daemon refused the route: {code}"),
        }
    }
}

/// The module's answer to one request: its result body, or its ERROR frame's body.
pub type Answer = Result<Value, Vec<u8>>;

/// A client of `target`'s management surface for one module (broca).
pub struct SurfaceClient {
    file: PathBuf,
    target: String,
    /// The role broca binds the route as (`credential-consumer`, `publisher`).
    role: String,
    module_id: String,
    launch_nonce: Option<String>,
    deadline: Duration,
    conn: Mutex<Option<Conn>>,
}

struct Conn {
    stream: TcpStream,
    decoder: Decoder,
    channel: u16,
    epoch: u32,
    next_corr: u64,
}

fn transport(why: impl Into<String>) -> SurfaceError {
    SurfaceError::Transport(why.into())
}

impl SurfaceClient {
    /// A client that reaches `target`'s surface through the daemon of the connection file
    /// `file`, as module `module_id` (with its launch nonce, when the daemon handed one),
    /// waiting at most `deadline` for each answer.
    pub fn new(
        file: PathBuf,
        target: &str,
        role: &str,
        module_id: String,
        launch_nonce: Option<String>,
        deadline: Duration,
    ) -> SurfaceClient {
        SurfaceClient {
            file,
            target: target.to_string(),
            role: role.to_string(),
            module_id,
            launch_nonce,
            deadline,
            conn: Mutex::new(None),
        }
    }

    /// One request on the route; a transport failure (the connection or the route gone)
    /// redials once.
    pub fn call(&self, method: &str, params: Value) -> Result<Answer, SurfaceError> {
        let body = serde_json::to_vec(&json!({ "method": method, "params": params }))
            .expect("JSON values serialize");
        let mut guard = self
            .conn
            .lock()
            .map_err(|_| transport(format!("the {} client's lock is poisoned", self.target)))?;
        let mut last = None;
        for _ in 0..2 {
            if guard.is_none() {
                *guard = Some(self.open()?);
            }
            let conn = guard.as_mut().expect("opened above");
            match conn.request(&body, &self.target) {
                Ok(answer) => return Ok(answer),
                Err(e) => {
                    *guard = None;
                    last = Some(e);
                }
            }
        }
        Err(last.unwrap_or_else(|| transport(format!("{} did not answer", self.target))))
    }

    /// Drops the connection: the next request dials again (an answer said the route is gone).
    pub fn reset(&self) {
        if let Ok(mut guard) = self.conn.lock() {
            *guard = None;
        }
    }

    /// Connects, authenticates and opens the route; a refusal the daemon marks retryable is
    /// tried again with a doubling backoff (100 ms up to 1.6 s).
    fn open(&self) -> Result<Conn, SurfaceError> {
        let stream =
            crate::connect::authenticate(&self.file).map_err(|e| transport(e.to_string()))?;
        stream
            .set_read_timeout(Some(self.deadline))
            .map_err(|e| transport(e.to_string()))?;
        let mut conn = Conn {
            stream,
            decoder: Decoder::new(),
            channel: 0,
            epoch: 0,
            next_corr: 1,
        };
        let open = ClientControlRequest::RouteOpen {
            target: RouteTarget::ManagementSurface {
                module_id: self.target.clone(),
            },
            identity: BindIdentity::new(self.module_id.clone(), self.role.clone()),
            consumer_identity: self.launch_nonce.as_ref().map(|n| ConsumerIdentity {
                module_id: self.module_id.clone(),
                launch_nonce: n.clone(),
            }),
            consumer_capabilities: None,
            role_versions: None,
            admission_facts: None,
            scope: None,
        };
        let body = serde_json::to_vec(&open).expect("a route.open serializes");
        let mut delay = Duration::from_millis(100);
        for attempt in 1..=OPEN_ATTEMPTS {
            let reply = conn.exchange(0, 0, &body, &self.target)?;
            match reply.header.ty {
                FrameType::Response => {
                    let Ok(ClientControlResponse::RouteOpen {
                        route_channel,
                        route_epoch,
                    }) = serde_json::from_slice(&reply.body)
                    else {
                        return Err(transport("a route.open answer that does not parse"));
                    };
                    conn.channel = route_channel;
                    conn.epoch = route_epoch;
                    return Ok(conn);
                }
                FrameType::Error => {
                    let code = serde_json::from_slice::<subc_protocol::ErrorBody>(&reply.body)
                        .map(|e| e.code)
                        .unwrap_or_default();
                    if !is_retryable_route_open(&code) {
                        return Err(SurfaceError::Refused(code));
                    }
                    if attempt < OPEN_ATTEMPTS {
                        std::thread::sleep(delay);
                        delay *= 2;
                    }
                }
                other => return Err(transport(format!("a {other:?} frame for route.open"))),
            }
        }
        Err(transport(format!(
            "the route to {} stayed unavailable (retried)",
            self.target
        )))
    }
}

impl Conn {
    /// A request on (channel, epoch) and its terminal frame.
    fn exchange(
        &mut self,
        channel: u16,
        epoch: u32,
        body: &[u8],
        target: &str,
    ) -> Result<FrameIn, SurfaceError> {
        let corr = self.next_corr;
        self.next_corr += 1;
        let flags = if channel == 0 {
            frames::control()
        } else {
            frames::data()
        };
        let frame = frames::encode(
            FrameType::Request,
            flags,
            channel,
            epoch,
            corr,
            body.to_vec(),
        )
        .map_err(transport)?;
        self.stream
            .write_all(&frame)
            .map_err(|e| transport(format!("writing to the daemon: {e}")))?;
        let mut buf = [0u8; 16 * 1024];
        loop {
            while let Some(f) = self.decoder.next_frame().map_err(transport)? {
                let h = f.header;
                if h.channel == channel && h.corr == corr {
                    return Ok(f);
                }
                if h.channel == 0 && h.ty == FrameType::Ping {
                    let pong = frames::encode(FrameType::Pong, h.flags, 0, 0, h.corr, Vec::new())
                        .map_err(transport)?;
                    let _ = self.stream.write_all(&pong);
                }
            }
            let n = match self.stream.read(&mut buf) {
                Ok(0) => {
                    return Err(transport(format!(
                        "the daemon closed the connection to {target}"
                    )))
                }
                Ok(n) => n,
                Err(e) => return Err(transport(format!("waiting for {target}: {e}"))),
            };
            self.decoder.push(&buf[..n]);
        }
    }

    /// A `{method, params}` request on the route: its answer, or the module's error body.
    fn request(&mut self, body: &[u8], target: &str) -> Result<Answer, SurfaceError> {
        let reply = self.exchange(self.channel, self.epoch, body, target)?;
        match reply.header.ty {
            FrameType::Response => serde_json::from_slice(&reply.body)
                .map(Ok)
                .map_err(|e| transport(format!("an answer of {target} that does not parse: {e}"))),
            FrameType::Error => Ok(Err(reply.body)),
            other => Err(transport(format!("a {other:?} frame from {target}"))),
        }
    }
}
