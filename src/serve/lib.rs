//! broca-serve: `broca serve`, the management surface over HTTP/1.1 on a TCP listener and a
//! Unix socket, a front of the host (broca-host). Every shard accepts on its own descriptor of
//! the TCP listener and serves the connections it accepted; shard 0 also serves the Unix
//! socket. `POST /v1/rpc` parses the request with the management core (broca-wire) and hands
//! it to the host; `GET /v1/subscribe` is the host's subscription written as server-sent
//! events or WebSocket messages; `GET /healthz` and `GET /metrics` read the host's state;
//! `/ui` is a read-only web view over the same requests (ui.rs), signed into through a
//! one-time link.
//!
//! Where things are: `broca serve`: HTTP/1.1 on TCP and the Unix socket as a front of the host
//! (`http.rs` routes and auth, `accept.rs` accept loops that never poll, `subscribe.rs` SSE and
//! WebSocket, `socket.rs` the socket's claim, `ui.rs` the read-only web view at `/ui` and its
//! one-time sign-in, the page itself in `ui/`)

mod accept;
mod http;
mod socket;
mod subscribe;
mod ui;

use broca_host::StartError;
use socket::front;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use broca_host::{Extras, Front, Host, HostOptions, Running, ShardFront, Startup};
use broca_io::http_server::ServerLimits;

/// The content type of every JSON answer.
pub(crate) const JSON: &str = "application/json";

/// How serve runs.
#[derive(Debug, Clone)]
pub struct ServeOptions {
    pub host: HostOptions,
    pub listen: SocketAddr,
    /// The Unix socket (default `<state-dir>/broca.sock`).
    pub socket: Option<PathBuf>,
    pub limits: ServerLimits,
    /// How long a request may take to arrive once it has begun (then 408).
    pub request_timeout: Duration,
}

/// What one shard's connections share.
pub(crate) struct Surface {
    pub(crate) host: Arc<Host>,
    pub(crate) limits: ServerLimits,
    pub(crate) request_timeout: Duration,
    /// The web view's sign-ins, shared by every shard.
    pub(crate) ui: Arc<ui::UiAuth>,
}

/// The TCP listener and the Unix socket, bound before the shards start (so a port in use is
/// a clear error here).
struct Listeners {
    tcp: std::net::TcpListener,
    listen: SocketAddr,
    unix: std::os::unix::net::UnixListener,
    socket: PathBuf,
}

impl Listeners {
    fn bind(opts: &ServeOptions) -> Result<Listeners, StartError> {
        let cannot = |e: std::io::Error| front(format!("cannot listen on {}: {e}", opts.listen));
        let tcp = std::net::TcpListener::bind(opts.listen).map_err(cannot)?;
        // Non-blocking for good: every shard accepts on a copy of this descriptor, and
        // glommio's first, synchronous accept toggles O_NONBLOCK on the shared file
        // description around its call; left blocking, one shard could restore blocking mode
        // while another is about to accept, and that shard would sleep inside accept(2) until
        // the next connection.
        tcp.set_nonblocking(true).map_err(cannot)?;
        let listen = tcp.local_addr().map_err(cannot)?;
        let state_dir = &opts.host.state_dir;
        let socket = opts
            .socket
            .clone()
            .unwrap_or_else(|| state_dir.join("broca.sock"));
        socket::claim_socket(&socket, state_dir)?; // a socket left by a killed daemon
        let unix = std::os::unix::net::UnixListener::bind(&socket)
            .map_err(|e| front(format!("cannot listen on {}: {e}", socket.display())))?;
        {
            use std::os::unix::fs::PermissionsExt;
            let _ = std::fs::set_permissions(&socket, std::fs::Permissions::from_mode(0o600));
        }
        Ok(Listeners {
            tcp,
            listen,
            unix,
            socket,
        })
    }

    /// Each shard's part: its copy of the TCP listener, and (shard 0) the Unix socket.
    fn into_front(
        self,
        opts: &ServeOptions,
        handle_file: &std::path::Path,
    ) -> Result<Front, StartError> {
        let socket = self.socket.display().to_string();
        let shards = opts.host.shards;
        assert!(shards > 0, "there is at least one shard");
        let mut copies = Vec::with_capacity(shards);
        for _ in 1..shards {
            let copy = self.tcp.try_clone();
            copies.push(copy.map_err(|e| front(format!("cannot share the listener: {e}")))?);
        }
        copies.insert(0, self.tcp);
        let mut unix = Some(self.unix);
        let ui = Arc::new(ui::UiAuth::new(
            self.listen,
            Some(opts.host.state_dir.join("ui-sign-ins")),
        ));
        let parts: Vec<Option<Box<dyn ShardFront>>> = copies
            .into_iter()
            .map(|tcp| {
                let part = HttpShard {
                    tcp,
                    unix: unix.take(), // shard 0's
                    limits: opts.limits,
                    request_timeout: opts.request_timeout,
                    ui: ui.clone(),
                };
                Some(Box::new(part) as Box<dyn ShardFront>)
            })
            .collect();
        assert_eq!(parts.len(), shards);
        let listen = self.listen;
        let mut info = serde_json::Map::new();
        info.insert("listen".into(), listen.to_string().into());
        info.insert("socket".into(), socket.into());
        info.insert(
            "handle_file".into(),
            handle_file.display().to_string().into(),
        );
        Ok(Front {
            info,
            ready: format!("broca listening on http://{listen}"),
            shards: parts,
        })
    }
}

/// One shard's listeners, handed to it as it starts.
struct HttpShard {
    tcp: std::net::TcpListener,
    unix: Option<std::os::unix::net::UnixListener>,
    limits: ServerLimits,
    request_timeout: Duration,
    ui: Arc<ui::UiAuth>,
}

impl ShardFront for HttpShard {
    fn start(
        self: Box<Self>,
        host: Arc<Host>,
    ) -> broca_host::LocalBoxFuture<'static, Result<Box<dyn Running>, StartError>> {
        Box::pin(async move {
            let surface = Arc::new(Surface {
                host,
                limits: self.limits,
                request_timeout: self.request_timeout,
                ui: self.ui,
            });
            let acceptor = http::start(surface, self.tcp, self.unix)?;
            Ok(Box::new(acceptor) as Box<dyn Running>)
        })
    }
}

/// Runs `broca serve` until a signal stops it. Returns the signal, for the caller to re-raise
/// once everything is closed. `Err` is one line naming what kept it from starting.
pub fn serve(opts: ServeOptions) -> Result<i32, StartError> {
    let startup = Startup::begin(opts.host.clone())?;
    let listeners = Listeners::bind(&opts)?;
    let socket = listeners.socket.clone();
    let front = listeners.into_front(&opts, startup.handle_file())?;
    let result = startup.run(front, Extras::default());
    // This daemon held the state dir's lock until now: the socket is its own.
    let _ = std::fs::remove_file(&socket);
    result
}
