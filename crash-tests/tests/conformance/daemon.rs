//! The daemon's side of the module wire, for the suite's routes: a loopback listener with a
//! real connection file, the daemon's handshake (`subc_transport::authenticate_server`) and
//! frames moved with subc-transport's `read_frame`/`write_frame`. Nothing of broca's wire code
//! is on this side. The first connection that sends HELLO is the module's own; every other is
//! a consumer connection of broca's (its tool routes), answered by [`ToolModule`].
//!
//! On the module's connection, requests are multiplexed: each (channel, corr) has a waiter
//! that receives broca's frames for it, so the suite's concurrent requests and subscriptions
//! share the one connection as they do under the real daemon.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU16, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{json, Value};
use subc_protocol::{Flags, Frame, FrameType, Priority};
use subc_transport::connection_file::{
    generate_daemon_id, generate_key, write_atomic, ConnectionInfo, Endpoint,
};
use subc_transport::frame_io::{read_frame, write_frame};
use tokio::io::AsyncRead;
use tokio::net::tcp::OwnedWriteHalf;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;

use crate::bus::Bus;
use crate::tools::ToolModule;

/// A listening daemon: its connection file and the module connection once broca made it.
pub struct Daemon {
    pub file: PathBuf,
    accept: tokio::task::JoinHandle<()>,
    module: tokio::sync::Mutex<Option<mpsc::Receiver<Arc<Link>>>>,
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

impl Daemon {
    /// Listens on loopback and writes the connection file into `dir`. Tool routes go to
    /// `tools`, routes to ckbus to `bus`.
    pub async fn start(dir: &Path, tools: ToolModule, bus: Bus) -> Result<Daemon, String> {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(|e| format!("the daemon's listener: {e}"))?;
        let port = listener.local_addr().map_err(|e| e.to_string())?.port();
        let key = generate_key().map_err(|e| format!("{e:?}"))?;
        let daemon_id = generate_daemon_id().map_err(|e| format!("{e:?}"))?;
        let file = dir.join("subc-connection.json");
        let info = ConnectionInfo {
            schema: 1,
            wire_version: Some(2),
            endpoints: vec![Endpoint {
                host: "127.0.0.1".into(),
                port,
            }],
            key: key.clone(),
            daemon_id,
            pid: std::process::id(),
            daemon_ver: "conformance-daemon".into(),
        };
        write_atomic(&file, &info).map_err(|e| format!("the connection file: {e:?}"))?;
        let (tx, rx) = mpsc::channel(1);
        let accept = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let (key, tx, tools, bus) = (key.clone(), tx.clone(), tools.clone(), bus.clone());
                tokio::spawn(
                    async move { connection(stream, key, daemon_id, tx, tools, bus).await },
                );
            }
        });
        Ok(Daemon {
            file,
            accept,
            module: tokio::sync::Mutex::new(Some(rx)),
        })
    }

    /// The module's connection, once broca has connected and said HELLO (within `within`).
    pub async fn module(&self, within: Duration) -> Result<Arc<Link>, String> {
        let mut rx = self.module.lock().await;
        let rx = rx.as_mut().ok_or("the module connection was taken")?;
        tokio::time::timeout(within, rx.recv())
            .await
            .map_err(|_| format!("broca did not connect within {within:?}"))?
            .ok_or_else(|| "the daemon stopped".to_string())
    }
}

async fn connection(
    mut stream: TcpStream,
    key: Vec<u8>,
    daemon_id: [u8; 16],
    module: mpsc::Sender<Arc<Link>>,
    tools: ToolModule,
    bus: Bus,
) {
    let auth = subc_transport::authenticate_server(
        &mut stream,
        &key,
        &daemon_id,
        "conformance-daemon",
        Duration::from_secs(5),
    )
    .await;
    if auth.is_err() {
        return;
    }
    let (mut reader, writer) = stream.into_split();
    let Ok(Some(first)) = read_frame(&mut reader).await else {
        return;
    };
    let writer = Arc::new(tokio::sync::Mutex::new(writer));
    if first.header.ty == FrameType::Hello {
        let ack = json!({"negotiated_ver": 2, "subc_ops": ["route.open", "catalog.update"], "subc_capabilities": []});
        if send(
            &writer,
            FrameType::HelloAck,
            0,
            0,
            first.header.corr,
            &ack,
            false,
        )
        .await
        .is_err()
        {
            return;
        }
        let link = Arc::new(Link {
            writer,
            waiters: Mutex::default(),
            next_corr: AtomicU64::new(100),
            next_channel: AtomicU16::new(1),
        });
        let _ = module.send(link.clone()).await;
        link.read(reader).await;
    } else {
        crate::tools::consumer(first, reader, writer, tools, bus).await;
    }
}

pub type Writer = Arc<tokio::sync::Mutex<OwnedWriteHalf>>;

/// Writes one frame (a JSON body, or none for a pure-header type).
pub async fn send(
    writer: &Writer,
    ty: FrameType,
    channel: u16,
    epoch: u32,
    corr: u64,
    body: &Value,
    daemon_origin: bool,
) -> Result<(), String> {
    let body = if ty.is_pure_header() {
        Vec::new()
    } else {
        serde_json::to_vec(body).expect("JSON serializes")
    };
    let priority = if channel == 0 {
        Priority::Passive
    } else {
        Priority::Interactive
    };
    let mut flags = Flags::new(false, priority, false);
    if daemon_origin {
        flags = flags.with_daemon_origin();
    }
    let frame = Frame::build(ty, flags, channel, epoch, corr, body).map_err(|e| e.to_string())?;
    write_frame(&mut *writer.lock().await, &frame)
        .await
        .map_err(|e| format!("writing a frame: {e:?}"))
}

/// The module's connection: requests out, each answered through its waiter.
pub struct Link {
    writer: Writer,
    waiters: Mutex<HashMap<(u16, u64), mpsc::UnboundedSender<Frame>>>,
    next_corr: AtomicU64,
    next_channel: AtomicU16,
}

impl Link {
    async fn read<R: AsyncRead + Unpin>(&self, mut reader: R) {
        while let Ok(Some(f)) = read_frame(&mut reader).await {
            let key = (f.header.channel, f.header.corr);
            let terminal = matches!(
                f.header.ty,
                FrameType::Response | FrameType::Error | FrameType::StreamEnd
            );
            let mut waiters = self.waiters.lock().unwrap();
            if let Some(w) = waiters.get(&key) {
                let _ = w.send(f);
            }
            if terminal {
                waiters.remove(&key);
            }
        }
        // The connection ended: every waiter hears it (its sender is dropped).
        self.waiters.lock().unwrap().clear();
    }

    /// Sends a REQUEST on `channel`; answers its corr and the receiver of broca's frames for
    /// it.
    pub async fn request(
        &self,
        channel: u16,
        epoch: u32,
        body: &Value,
    ) -> Result<(u64, mpsc::UnboundedReceiver<Frame>), String> {
        let corr = self.next_corr.fetch_add(1, Ordering::SeqCst);
        let (tx, rx) = mpsc::unbounded_channel();
        self.waiters.lock().unwrap().insert((channel, corr), tx);
        if let Err(e) = send(
            &self.writer,
            FrameType::Request,
            channel,
            epoch,
            corr,
            body,
            false,
        )
        .await
        {
            self.waiters.lock().unwrap().remove(&(channel, corr));
            return Err(e);
        }
        Ok((corr, rx))
    }

    /// A pure-header frame (CANCEL) for an earlier request.
    pub async fn cancel(&self, channel: u16, epoch: u32, corr: u64) {
        self.waiters.lock().unwrap().remove(&(channel, corr));
        let _ = send(
            &self.writer,
            FrameType::Cancel,
            channel,
            epoch,
            corr,
            &Value::Null,
            false,
        )
        .await;
    }

    /// Binds a fresh route channel to `session` for `principal` (and the scope, when the
    /// stamp has one). Answers the channel.
    pub async fn bind(
        &self,
        harness: &str,
        session: &str,
        stamp: &cortexkit_role_harness::RouteStamp,
    ) -> Result<u16, String> {
        let channel = self.next_channel.fetch_add(1, Ordering::SeqCst);
        let mut body = json!({
            "op": "route.bind",
            "route_channel": channel,
            "epoch": 1,
            "target": {"kind": "management_surface", "module_id": "ck-broca"},
            "identity": {"harness": harness, "session": session},
            "principal": principal(&stamp.principal),
        });
        if let Some(scope) = &stamp.scope {
            body["scope"] = json!({
                "owner": principal(&scope.owner),
                "ref": scope.scope_ref,
                "scope_epoch": scope.scope_epoch,
                "kind": "head",
                "owner_authorized": false,
            });
        }
        let (_, mut rx) = self.request(0, 0, &body).await?;
        let f = tokio::time::timeout(Duration::from_secs(10), rx.recv())
            .await
            .map_err(|_| "route.bind: no answer within 10 s".to_string())?
            .ok_or("route.bind: the connection ended")?;
        if f.header.ty != FrameType::Response {
            return Err(format!(
                "route.bind refused: {}",
                String::from_utf8_lossy(&f.body)
            ));
        }
        Ok(channel)
    }
}

/// A stamp's principal string (`reserved:<module>`, `direct`, `unverified`) as the bind
/// carries it.
fn principal(text: &str) -> Value {
    match text.split_once(':') {
        Some(("reserved", module)) => json!({"kind": "reserved", "module_id": module}),
        _ => json!({"kind": text}),
    }
}
