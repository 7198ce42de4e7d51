//! A consumer connection to the daemon, shared by every shard: authenticated (no HELLO),
//! it carries the routes broca opens to other modules (tool providers). Its socket is served
//! by two threads, a writer and a reader, so no shard ever blocks on it; a caller sends a
//! frame and waits on channels: one says whether the frame's bytes were handed to the socket
//! (a request never written was never delivered), the other brings the request's terminal
//! frame. The connection's end, a GOODBYE on a route or the daemon's `route.closed` fails
//! the requests still waiting on it, each with the reason.

use std::collections::{HashMap, HashSet};
use std::io::{Read, Write};
use std::net::{Shutdown, TcpStream};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex};

use futures_channel::oneshot;
use serde::Deserialize;
use subc_protocol::{Flags, FrameType};

use crate::frames::{self, Decoder, FrameIn};
use crate::LinkError;

/// How a frame's write went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Written {
    /// Every byte was handed to the socket.
    Whole,
    /// Not one byte was: the daemon never saw it.
    Nothing,
    /// The socket failed part way: the daemon may have read it.
    Partly,
}

/// A request sent: its correlation id, how its write went, and its terminal frame (or why
/// none will come).
pub struct Sent {
    pub corr: u64,
    pub written: oneshot::Receiver<Written>,
    pub reply: oneshot::Receiver<Result<FrameIn, LinkError>>,
    /// PUSH frames seen for this request so far (keepalives and progress): a call that
    /// declares keepalives is alive while this moves.
    pub pushes: Arc<AtomicU64>,
}

struct Out {
    bytes: Vec<u8>,
    written: Option<oneshot::Sender<Written>>,
}

struct Waiter {
    channel: u16,
    tx: oneshot::Sender<Result<FrameIn, LinkError>>,
    pushes: Arc<AtomicU64>,
}

type Waiters = Arc<Mutex<HashMap<u64, Waiter>>>;

/// One consumer connection.
pub struct Link {
    writer: Mutex<Option<mpsc::Sender<Out>>>,
    waiters: Waiters,
    next_corr: AtomicU64,
    alive: Arc<AtomicBool>,
    /// Routes the daemon closed (or said GOODBYE on) since they were last asked for.
    closed: Arc<Mutex<HashSet<u16>>>,
    socket: TcpStream,
}

#[derive(Deserialize)]
struct RouteClosed {
    op: String,
    #[serde(default)]
    channels: Vec<u16>,
    #[serde(default)]
    reason: String,
}

impl Link {
    /// Connects with the connection file at `file` and authenticates (blocking: the
    /// handshake's own deadlines bound it), then starts the connection's two threads.
    pub fn connect(file: &Path) -> Result<Arc<Link>, LinkError> {
        let stream =
            crate::connect::authenticate(file).map_err(|e| LinkError::Down(e.to_string()))?;
        let socket = |e: std::io::Error| LinkError::Down(format!("the daemon's connection: {e}"));
        stream.set_read_timeout(None).map_err(socket)?;
        let reading = stream.try_clone().map_err(socket)?;
        let writing = stream.try_clone().map_err(socket)?;
        let (tx, rx) = mpsc::channel::<Out>();
        let link = Arc::new(Link {
            writer: Mutex::new(Some(tx.clone())),
            waiters: Arc::new(Mutex::new(HashMap::new())),
            next_corr: AtomicU64::new(1),
            alive: Arc::new(AtomicBool::new(true)),
            closed: Arc::new(Mutex::new(HashSet::new())),
            socket: stream,
        });
        let alive = link.alive.clone();
        std::thread::Builder::new()
            .name("subc-link-writer".into())
            .spawn(move || write_loop(writing, rx, alive))
            .map_err(|e| {
                LinkError::Down(format!("cannot start the daemon connection's writer: {e}"))
            })?;
        let (waiters, alive, closed) = (
            link.waiters.clone(),
            link.alive.clone(),
            link.closed.clone(),
        );
        std::thread::Builder::new()
            .name("subc-link-reader".into())
            .spawn(move || read_loop(reading, tx, waiters, alive, closed))
            .map_err(|e| {
                LinkError::Down(format!("cannot start the daemon connection's reader: {e}"))
            })?;
        Ok(link)
    }

    /// Whether the connection is still up.
    pub fn is_alive(&self) -> bool {
        self.alive.load(Ordering::Acquire)
    }

    /// Whether the daemon closed route `channel` since it was opened; forgets the mark.
    pub fn take_closed(&self, channel: u16) -> bool {
        self.closed
            .lock()
            .map(|mut c| c.remove(&channel))
            .unwrap_or(true)
    }

    /// Sends a request on (channel, epoch). An error means nothing was handed to the socket.
    pub fn request(&self, channel: u16, epoch: u32, body: Vec<u8>) -> Result<Sent, LinkError> {
        if !self.is_alive() {
            return Err(LinkError::Down(
                "the connection to the daemon is down".into(),
            ));
        }
        let corr = self.next_corr.fetch_add(1, Ordering::Relaxed);
        let flags = if channel == 0 {
            frames::control()
        } else {
            frames::data()
        };
        let bytes = frames::encode(FrameType::Request, flags, channel, epoch, corr, body)?;
        let (reply_tx, reply) = oneshot::channel();
        let (written_tx, written) = oneshot::channel();
        let pushes = Arc::new(AtomicU64::new(0));
        self.waiters
            .lock()
            .map_err(|_| LinkError::Down("the daemon connection's lock is poisoned".into()))?
            .insert(
                corr,
                Waiter {
                    channel,
                    tx: reply_tx,
                    pushes: pushes.clone(),
                },
            );
        let queued = self.writer.lock().ok().and_then(|w| {
            w.as_ref().map(|w| {
                w.send(Out {
                    bytes,
                    written: Some(written_tx),
                })
                .is_ok()
            })
        });
        if queued != Some(true) {
            self.forget(corr);
            return Err(LinkError::Down(
                "the connection to the daemon is down".into(),
            ));
        }
        Ok(Sent {
            corr,
            written,
            reply,
            pushes,
        })
    }

    /// Stops waiting for request `corr` and tells the daemon (a CANCEL on its route).
    pub fn cancel(&self, channel: u16, epoch: u32, corr: u64) {
        self.forget(corr);
        self.pure(FrameType::Cancel, channel, epoch, corr);
    }

    /// Closes route (channel, epoch): a GOODBYE on it.
    pub fn close_route(&self, channel: u16, epoch: u32) {
        self.pure(FrameType::Goodbye, channel, epoch, 0);
    }

    /// Ends the connection: its waiters are told, its threads stop.
    pub fn shutdown(&self) {
        self.alive.store(false, Ordering::Release);
        let _ = self.socket.shutdown(Shutdown::Both);
    }

    fn forget(&self, corr: u64) {
        if let Ok(mut w) = self.waiters.lock() {
            w.remove(&corr);
        }
    }

    fn pure(&self, ty: FrameType, channel: u16, epoch: u32, corr: u64) {
        let flags = if channel == 0 {
            frames::control()
        } else {
            frames::data()
        };
        if let Ok(bytes) = frames::encode(ty, flags, channel, epoch, corr, Vec::new()) {
            if let Ok(w) = self.writer.lock() {
                if let Some(w) = w.as_ref() {
                    let _ = w.send(Out {
                        bytes,
                        written: None,
                    });
                }
            }
        }
    }
}

impl Drop for Link {
    fn drop(&mut self) {
        self.shutdown();
    }
}

fn write_loop(mut socket: TcpStream, rx: mpsc::Receiver<Out>, alive: Arc<AtomicBool>) {
    let mut broken = false;
    while let Ok(out) = rx.recv() {
        let how = if broken {
            Written::Nothing
        } else {
            let mut at = 0;
            while at < out.bytes.len() {
                match socket.write(&out.bytes[at..]) {
                    Ok(0) => break,
                    Ok(n) => at += n,
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(_) => break,
                }
            }
            if at == out.bytes.len() {
                Written::Whole
            } else {
                broken = true;
                alive.store(false, Ordering::Release);
                let _ = socket.shutdown(Shutdown::Both);
                if at == 0 {
                    Written::Nothing
                } else {
                    Written::Partly
                }
            }
        };
        if let Some(tx) = out.written {
            let _ = tx.send(how);
        }
    }
}

fn read_loop(
    mut socket: TcpStream,
    writer: mpsc::Sender<Out>,
    waiters: Waiters,
    alive: Arc<AtomicBool>,
    closed: Arc<Mutex<HashSet<u16>>>,
) {
    let mut decoder = Decoder::new();
    let mut buf = vec![0u8; 64 * 1024];
    let why = 'conn: loop {
        let n = match socket.read(&mut buf) {
            Ok(0) => break 'conn "the daemon closed the connection".to_string(),
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => break 'conn format!("the connection to the daemon failed: {e}"),
        };
        decoder.push(&buf[..n]);
        loop {
            let frame = match decoder.next_frame() {
                Ok(Some(f)) => f,
                Ok(None) => break,
                Err(e) => break 'conn e.to_string(),
            };
            if let Some(why) = on_frame(frame, &writer, &waiters, &closed) {
                break 'conn why;
            }
        }
    };
    alive.store(false, Ordering::Release);
    let _ = socket.shutdown(Shutdown::Both);
    if let Ok(mut w) = waiters.lock() {
        for (_, waiter) in w.drain() {
            let _ = waiter.tx.send(Err(LinkError::Down(why.clone())));
        }
    }
}

/// One frame from the daemon: a ping answered, a route's end told its waiters, an answer
/// handed to the request waiting on its correlation, a keepalive counted for it. `Some`:
/// the connection ends (the daemon said GOODBYE).
fn on_frame(
    frame: FrameIn,
    writer: &mpsc::Sender<Out>,
    waiters: &Waiters,
    closed: &Mutex<HashSet<u16>>,
) -> Option<String> {
    let h = frame.header;
    match (h.channel, h.ty) {
        (0, FrameType::Ping) => {
            if let Ok(bytes) = frames::encode(FrameType::Pong, h.flags, 0, 0, h.corr, Vec::new()) {
                let _ = writer.send(Out {
                    bytes,
                    written: None,
                });
            }
        }
        (0, FrameType::Goodbye) => return Some("the daemon said GOODBYE".to_string()),
        (0, FrameType::Push) => {
            let push = serde_json::from_slice::<RouteClosed>(&frame.body).ok()?;
            if push.op == subc_control::ops::ROUTE_CLOSED {
                let why = format!("the daemon closed the route ({})", push.reason);
                for ch in push.channels {
                    route_gone(waiters, closed, ch, &why);
                }
            }
        }
        (ch, FrameType::Goodbye) => route_gone(waiters, closed, ch, "the route said GOODBYE"),
        (_, FrameType::Response | FrameType::Error | FrameType::StreamEnd) => {
            let waiter = waiters.lock().ok().and_then(|mut w| match w.get(&h.corr) {
                Some(found) if found.channel == h.channel => w.remove(&h.corr),
                _ => None,
            });
            if let Some(w) = waiter {
                let _ = w.tx.send(Ok(frame));
            }
        }
        // Keepalives and progress (PUSH) on a request's correlation: counted for it (never
        // shown, never passed on).
        (ch, FrameType::Push) => {
            if let Ok(w) = waiters.lock() {
                if let Some(found) = w.get(&h.corr).filter(|f| f.channel == ch) {
                    found.pushes.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
        // Stream data: nothing waits on it.
        _ => {}
    }
    None
}

fn route_gone(waiters: &Waiters, closed: &Mutex<HashSet<u16>>, channel: u16, why: &str) {
    if let Ok(mut c) = closed.lock() {
        c.insert(channel);
    }
    if let Ok(mut w) = waiters.lock() {
        let gone: Vec<u64> = w
            .iter()
            .filter(|(_, x)| x.channel == channel)
            .map(|(c, _)| *c)
            .collect();
        for corr in gone {
            if let Some(x) = w.remove(&corr) {
                let _ = x.tx.send(Err(LinkError::Down(why.to_string())));
            }
        }
    }
}

/// Whether an ERROR frame was written by the daemon itself rather than the module.
pub fn daemon_origin(flags: Flags) -> bool {
    flags.is_daemon_origin()
}
