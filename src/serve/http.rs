//! The management surface over HTTP/1.1, on the loopback TCP listener and the Unix socket:
//! keep-alive connections, limits on head and body, bearer-handle auth on TCP (or the web
//! view's sign-in, which reads only), and the routes `POST /v1/rpc`, `GET /healthz`,
//! `GET /metrics` and the web view's `/ui` (ui.rs). Every failure is a 4xx or 5xx with
//! a JSON error body; the server keeps serving.

use std::os::fd::{AsRawFd, FromRawFd, IntoRawFd};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use broca_io::http_server::{response, response_with, RequestDecoder, RequestHead};
use futures_lite::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use broca_shards::timer::StopSignal;
use broca_wire::{Code, RpcError};

use crate::accept::{self, AcceptStats};
use crate::ui::Access;
use crate::{Surface, JSON};

/// How long a connection may sit idle between requests.
const KEEP_ALIVE_IDLE: Duration = Duration::from_secs(60);

/// The accept loops; `stop` ends them.
pub(crate) struct Acceptor {
    stop: Rc<StopSignal>,
    stats: Rc<AcceptStats>,
}

impl broca_host::Running for Acceptor {
    /// Accept-loop wakes with nothing to do, failed accepts, connections shed.
    fn counts(&self) -> (u64, u64, u64) {
        (
            self.stats.wakes.get(),
            self.stats.errors.get(),
            self.stats.shed.get(),
        )
    }

    fn stop(self: Box<Self>) -> broca_host::LocalBoxFuture<'static, ()> {
        self.stop.stop();
        Box::pin(async {})
    }
}

/// Starts accepting on this shard: on its copy of the TCP listener (every shard accepts from
/// the one listening socket, and serves the connections it accepted), and on the Unix socket
/// when given one (shard 0).
pub(crate) fn start(
    ctx: Arc<Surface>,
    tcp: std::net::TcpListener,
    unix: Option<std::os::unix::net::UnixListener>,
) -> Result<Acceptor, broca_host::StartError> {
    let stop = Rc::new(StopSignal::default());
    let stats = Rc::new(AcceptStats::default());
    let raw_fd = tcp.as_raw_fd();
    // SAFETY: the descriptor comes from a listener this function owns and gives up.
    let tcp = unsafe { glommio::net::TcpListener::from_raw_fd(tcp.into_raw_fd()) };
    let tcp_loop = accept::Loop {
        listener: tcp,
        name: "TCP",
        raw_fd: Some(raw_fd),
        stop: stop.clone(),
        stats: stats.clone(),
    };
    glommio::spawn_local(tcp_loop.run(ctx.clone(), |ctx, stream| {
        let _ = stream.set_nodelay(true);
        glommio::spawn_local(connection(ctx, stream, true)).detach();
    }))
    .detach();
    let Some(unix) = unix else {
        return Ok(Acceptor { stop, stats });
    };
    let path = unix
        .local_addr()
        .ok()
        .and_then(|a| a.as_pathname().map(|p| p.to_path_buf()))
        .ok_or_else(|| crate::socket::front("the Unix socket has no path".into()))?;
    // glommio binds its own Unix listener: replace the socket file this process just made
    // (and only that one: the file is checked to be the same before it is removed).
    let ours = std::fs::symlink_metadata(&path)
        .map(|m| (m.dev(), m.ino()))
        .map_err(|e| crate::socket::front(format!("{}: {e}", path.display())))?;
    drop(unix);
    match std::fs::symlink_metadata(&path) {
        Ok(m) if (m.dev(), m.ino()) == ours => {
            let _ = std::fs::remove_file(&path);
        }
        _ => {
            return Err(crate::socket::front(format!(
                "{} was replaced by another process while broca started",
                path.display()
            )))
        }
    }
    let unix = glommio::net::UnixListener::bind(&path)
        .map_err(|e| crate::socket::front(format!("cannot listen on {}: {e}", path.display())))?;
    let _ = std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600));
    let unix_loop = accept::Loop {
        listener: unix,
        name: "the Unix socket",
        raw_fd: None,
        stop: stop.clone(),
        stats: stats.clone(),
    };
    glommio::spawn_local(unix_loop.run(ctx, |ctx, stream| {
        glommio::spawn_local(connection(ctx, stream, false)).detach();
    }))
    .detach();
    Ok(Acceptor { stop, stats })
}

/// The read buffer of a connection: a send's request fits in one read, larger bodies take
/// several (every open connection holds one).
const READ_CHUNK: usize = 8 * 1024;

/// Serves one connection until it closes, errs, or stays idle too long.
async fn connection<S: AsyncRead + AsyncWrite + Unpin>(
    ctx: Arc<Surface>,
    mut stream: S,
    tcp: bool,
) {
    let mut dec = RequestDecoder::new(ctx.limits);
    let mut buf = vec![0u8; READ_CHUNK];
    // When the request being received began: it must arrive whole within the request
    // timeout, however slowly its bytes trickle in.
    let mut began: Option<Instant> = None;
    loop {
        loop {
            match dec.next() {
                Ok(Some((head, _))) if head.method == "GET" && head.path() == "/v1/subscribe" => {
                    if access(&ctx, &head, tcp) == Access::Nobody {
                        refuse(&mut stream, &unauthorized()).await;
                    } else {
                        // A subscription lives long: the request's buffers go first.
                        drop(std::mem::take(&mut buf));
                        drop(std::mem::replace(&mut dec, RequestDecoder::new(ctx.limits)));
                        Box::pin(crate::subscribe::serve(&ctx, &head, &mut stream)).await;
                    }
                    return; // a subscription keeps its connection to the end
                }
                Ok(Some((head, body))) => {
                    began = None; // the next request's clock starts with its first byte
                                  // Boxed: an answer's state (a management call's, the largest) lives while
                                  // it is made, not for as long as the connection is open.
                    if !Box::pin(answer(&ctx, &head, body, tcp, &mut stream)).await {
                        return;
                    }
                }
                Ok(None) => break,
                Err(e) => {
                    refuse(&mut stream, &RpcError::new(request_code(&e), e.to_string())).await;
                    return;
                }
            }
        }
        let wait = if dec.is_idle() {
            began = None;
            KEEP_ALIVE_IDLE
        } else {
            let since = *began.get_or_insert_with(Instant::now);
            ctx.request_timeout.saturating_sub(since.elapsed())
        };
        let read = broca_io::net::with_timeout(wait, stream.read(&mut buf)).await;
        match read {
            Ok(Ok(n)) if n > 0 => {
                if dec.is_idle() {
                    began = Some(Instant::now());
                }
                dec.push(&buf[..n]);
            }
            Err(()) if !dec.is_idle() => {
                let err = RpcError::new(Code::RequestTimeout, "the request stopped arriving");
                refuse(&mut stream, &err).await;
                return;
            }
            _ => return,
        }
    }
}

/// Answers one request; `false` when the connection is to close (the client asked, or the
/// answer could not be written).
async fn answer<S: AsyncWrite + Unpin>(
    ctx: &Arc<Surface>,
    head: &RequestHead,
    body: Vec<u8>,
    tcp: bool,
    stream: &mut S,
) -> bool {
    let Reply {
        status,
        kind,
        body: out,
        mut headers,
    } = handle(ctx, head, body, tcp).await;
    let keep = head.keep_alive;
    // Every 503 is a wait (busy, stopping, storage full): say how long to wait.
    if status == 503 {
        headers.push(("retry-after", RETRY_AFTER_SECS.to_string()));
    }
    let extra: Vec<(&str, &str)> = headers.iter().map(|(n, v)| (*n, v.as_str())).collect();
    let written = stream
        .write_all(&response_with(status, kind, &out, keep, &extra))
        .await;
    if written.is_ok() && broca_crash_points::armed() {
        // A crash test's `admitted` cut in the power-loss mode: once answered.
        let _ = stream.flush().await;
        broca_crash_points::send_answered();
    }
    written.is_ok() && keep
}

/// The `Retry-After` of a 503 answer, in seconds.
const RETRY_AFTER_SECS: &str = "2";

/// Writes `err` as the connection's last answer.
async fn refuse<S: AsyncWrite + Unpin>(stream: &mut S, err: &RpcError) {
    let _ = stream
        .write_all(&response(err.status(), JSON, &err.body(), false))
        .await;
}

/// Who the request comes from: the handle's holder (on the owner-only Unix socket, or with
/// the bearer handle), a browser signed in to the web view, or nobody.
fn access(ctx: &Surface, head: &RequestHead, tcp: bool) -> Access {
    if !tcp || authorized(ctx, head) {
        Access::Holder
    } else if ctx.ui.viewer(head) {
        Access::Viewer
    } else {
        Access::Nobody
    }
}

/// Whether the request carries the daemon's handle (compared in constant time).
fn authorized(ctx: &Surface, head: &RequestHead) -> bool {
    let Some(given) = head.header("authorization").and_then(bearer_credentials) else {
        return false;
    };
    let (a, b) = (given.trim().as_bytes(), ctx.host.handle.as_bytes());
    debug_assert!(!b.is_empty(), "the daemon's handle is never empty");
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The credentials of an `Authorization` value of the Bearer scheme, whose name is
/// case-insensitive (RFC 9110, 11.1) and followed by one or more spaces.
fn bearer_credentials(value: &str) -> Option<&str> {
    let (scheme, rest) = value.split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| rest.trim_start_matches(' '))
}

/// The code of a request the decoder refused.
fn request_code(e: &broca_io::http_server::RequestError) -> broca_wire::Code {
    use broca_io::http_server::RequestError;
    match e {
        RequestError::HeadTooLarge { .. } => Code::HeadTooLarge,
        RequestError::BodyTooLarge { .. } => Code::BodyTooLarge,
        RequestError::LengthRequired => Code::LengthRequired,
        RequestError::Malformed(_) => Code::MalformedRequest,
    }
}

fn unauthorized() -> RpcError {
    RpcError::new(
        Code::Unauthorized,
        "missing or wrong `Authorization: Bearer <handle>` (the handle is in the file serve.json \
         names)",
    )
}

/// One answer: its status, content type, body and any header lines beyond the content's.
struct Reply {
    status: u16,
    kind: &'static str,
    body: Vec<u8>,
    headers: Vec<(&'static str, String)>,
}

impl Reply {
    fn new(status: u16, kind: &'static str, body: Vec<u8>) -> Reply {
        debug_assert!((100..600).contains(&status), "an HTTP status");
        Reply {
            status,
            kind,
            body,
            headers: Vec::new(),
        }
    }

    fn error(e: RpcError) -> Reply {
        Reply::new(e.status(), JSON, e.body())
    }

    /// A page of the web view, with its headers and any cookie.
    fn page(page: crate::ui::Page) -> Reply {
        let mut headers: Vec<(&'static str, String)> = crate::ui::PAGE_HEADERS
            .iter()
            .map(|(n, v)| (*n, v.to_string()))
            .collect();
        if let Some(cookie) = page.cookie {
            headers.push(("set-cookie", cookie));
        }
        Reply {
            status: page.status,
            kind: page.kind,
            body: page.body,
            headers,
        }
    }
}

/// The refusal of a change asked by the web view's sign-in.
fn read_only(what: &str) -> RpcError {
    RpcError::new(
        Code::Forbidden,
        format!("the web view's sign-in reads only; {what} needs the handle"),
    )
}

async fn handle(ctx: &Arc<Surface>, head: &RequestHead, body: Vec<u8>, tcp: bool) -> Reply {
    let access = access(ctx, head, tcp);
    let path = head.path();
    if path == "/ui" || path.starts_with("/ui/") {
        return Reply::page(ctx.ui.route(head, access));
    }
    if access == Access::Nobody {
        return Reply::error(unauthorized());
    }
    match (head.method.as_str(), path) {
        ("POST", "/v1/rpc") => {
            if access == Access::Viewer && !ctx.ui.same_origin(head) {
                return Reply::error(read_only("a request from another origin"));
            }
            let caller = broca_wire::Caller::operator();
            let answer = match broca_wire::request::parse(&body) {
                Ok(request) if access == Access::Viewer && request.method().writes() => {
                    Err(read_only(request.method().as_str()))
                }
                Ok(request) => ctx.host.call(request, &caller).await,
                Err(e) => Err(e),
            };
            match answer {
                Ok(result) => Reply::new(
                    200,
                    JSON,
                    serde_json::to_vec(&serde_json::json!({ "result": result }))
                        .expect("a reply serializes"),
                ),
                Err(e) => Reply::error(e),
            }
        }
        ("GET", "/healthz") => {
            if ctx.host.is_stopping() {
                Reply::new(503, JSON, br#"{"status":"stopping"}"#.to_vec())
            } else {
                // Degraded (reads go on, writes are refused) is still an answer: 200.
                let health = ctx.host.storage.health_json();
                Reply::new(200, JSON, health.to_string().into_bytes())
            }
        }
        ("GET", "/metrics") => Reply::new(
            200,
            "text/plain; version=0.0.4",
            broca_host::metrics::render(&ctx.host).await.into_bytes(),
        ),
        (_, "/v1/rpc" | "/healthz" | "/metrics" | "/v1/subscribe") => Reply::error(RpcError::new(
            Code::MethodNotAllowed,
            format!("{} {} is not served", head.method, path),
        )),
        _ => Reply::error(RpcError::new(Code::NotFound, format!("no route {path}"))),
    }
}
