//! The management surface over HTTP/1.1, on the loopback TCP listener and the Unix socket:
//! keep-alive connections, limits on head and body, bearer-handle auth on TCP, and the
//! routes `POST /v1/rpc`, `GET /healthz`, `GET /metrics`. Every failure is a 4xx or 5xx with
//! a JSON error body; the server keeps serving.

use std::cell::Cell;
use std::os::fd::{FromRawFd, IntoRawFd};
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use broca_io::http_server::{response, RequestDecoder, RequestHead};
use futures_lite::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::wire::RpcError;

use super::hub::{SubFrom, SubItem};
use super::{ServeCtx, ShardMsg, ShardStats};

/// How long a connection may sit idle between requests.
const KEEP_ALIVE_IDLE: Duration = Duration::from_secs(60);

/// The accept loops; `stop` ends them.
pub(crate) struct Acceptor {
    stopped: Rc<Cell<bool>>,
}

impl Acceptor {
    pub fn stop(&self) {
        self.stopped.set(true);
    }
}

/// Starts accepting on this shard: on its copy of the TCP listener (every shard accepts from
/// the one listening socket, and serves the connections it accepted), and on the Unix socket
/// when given one (shard 0).
pub(crate) fn start(
    ctx: Arc<ServeCtx>,
    tcp: std::net::TcpListener,
    unix: Option<std::os::unix::net::UnixListener>,
) -> Result<Acceptor, String> {
    let stopped = Rc::new(Cell::new(false));
    // SAFETY: the descriptor comes from a listener this function owns and gives up.
    let tcp = unsafe { glommio::net::TcpListener::from_raw_fd(tcp.into_raw_fd()) };
    let (c, s) = (ctx.clone(), stopped.clone());
    glommio::spawn_local(async move {
        while let Some(conn) = until_stopped(&s, tcp.accept()).await {
            match conn {
                Ok(stream) => {
                    let _ = stream.set_nodelay(true);
                    glommio::spawn_local(connection(c.clone(), stream, true)).detach();
                }
                Err(e) => tracing::warn!("accept on TCP: {e}"),
            }
        }
    })
    .detach();
    let Some(unix) = unix else {
        return Ok(Acceptor { stopped });
    };
    let path = unix
        .local_addr()
        .ok()
        .and_then(|a| a.as_pathname().map(|p| p.to_path_buf()))
        .ok_or("the Unix socket has no path")?;
    drop(unix);
    let _ = std::fs::remove_file(&path);
    let unix = glommio::net::UnixListener::bind(&path)
        .map_err(|e| format!("cannot listen on {}: {e}", path.display()))?;
    {
        use std::os::unix::fs::PermissionsExt;
        let _ = std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600));
    }
    let s = stopped.clone();
    glommio::spawn_local(async move {
        while let Some(conn) = until_stopped(&s, unix.accept()).await {
            match conn {
                Ok(stream) => {
                    glommio::spawn_local(connection(ctx.clone(), stream, false)).detach();
                }
                Err(e) => tracing::warn!("accept on the Unix socket: {e}"),
            }
        }
    })
    .detach();
    Ok(Acceptor { stopped })
}

/// `fut`'s output, or `None` once `stopped` is set.
async fn until_stopped<T>(
    stopped: &Rc<Cell<bool>>,
    fut: impl std::future::Future<Output = T>,
) -> Option<T> {
    futures_lite::future::or(async { Some(fut.await) }, async {
        while !stopped.get() {
            glommio::timer::sleep(Duration::from_millis(20)).await;
        }
        None
    })
    .await
}

/// Serves one connection until it closes, errs, or stays idle too long.
async fn connection<S: AsyncRead + AsyncWrite + Unpin>(
    ctx: Arc<ServeCtx>,
    mut stream: S,
    tcp: bool,
) {
    let mut dec = RequestDecoder::new(ctx.opts.limits);
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        loop {
            match dec.next() {
                Ok(Some((head, _))) if head.method == "GET" && head.path() == "/v1/subscribe" => {
                    if tcp && !authorized(&ctx, &head) {
                        let err = unauthorized();
                        let _ = stream
                            .write_all(&response(err.status, JSON, &err.body(), false))
                            .await;
                    } else {
                        subscribe(&ctx, &head, &mut stream).await;
                    }
                    return; // a subscription keeps its connection to the end
                }
                Ok(Some((head, body))) => {
                    let (status, kind, out) = handle(&ctx, &head, body, tcp).await;
                    let keep = head.keep_alive;
                    if stream
                        .write_all(&response(status, kind, &out, keep))
                        .await
                        .is_err()
                        || !keep
                    {
                        return;
                    }
                }
                Ok(None) => break,
                Err(e) => {
                    let err = RpcError::permanent(e.status(), e.code(), e.to_string());
                    let _ = stream
                        .write_all(&response(
                            err.status,
                            "application/json",
                            &err.body(),
                            false,
                        ))
                        .await;
                    return;
                }
            }
        }
        let wait = if dec.is_idle() {
            KEEP_ALIVE_IDLE
        } else {
            ctx.opts.request_timeout
        };
        let read = broca_io::net::with_timeout(wait, stream.read(&mut buf)).await;
        match read {
            Ok(Ok(n)) if n > 0 => dec.push(&buf[..n]),
            Err(()) if !dec.is_idle() => {
                let err =
                    RpcError::permanent(408, "request_timeout", "the request stopped arriving");
                let _ = stream
                    .write_all(&response(408, "application/json", &err.body(), false))
                    .await;
                return;
            }
            _ => return,
        }
    }
}

/// Whether the request carries the daemon's handle (compared in constant time).
fn authorized(ctx: &ServeCtx, head: &RequestHead) -> bool {
    let Some(given) = head
        .header("authorization")
        .and_then(|v| v.strip_prefix("Bearer "))
    else {
        return false;
    };
    let (a, b) = (given.trim().as_bytes(), ctx.handle.as_bytes());
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

const JSON: &str = "application/json";

fn unauthorized() -> RpcError {
    RpcError {
        status: 401,
        code: "unauthorized",
        class: crate::protocol::ErrorClass::AuthRequired,
        message: "missing or wrong `Authorization: Bearer <handle>` (the handle is in the file \
                  serve.json names)"
            .into(),
    }
}

/// How often an idle subscription says it is alive.
const KEEPALIVE: Duration = Duration::from_secs(15);

/// Serves `GET /v1/subscribe`: server-sent events, or a WebSocket when the client asks to
/// upgrade. Control units carry `id: <wal_seq>.<sub_index>`; display deltas carry none.
async fn subscribe<S: AsyncRead + AsyncWrite + Unpin>(
    ctx: &Arc<ServeCtx>,
    head: &RequestHead,
    stream: &mut S,
) {
    let refuse = |e: RpcError| response(e.status, JSON, &e.body(), false);
    let q = |k: &str| head.query(k);
    let triple = match (q("project_root"), q("harness"), q("session")) {
        (Some(p), Some(h), Some(s)) => crate::wal::SessionTriple::new(&p, &h, &s),
        _ => {
            let e = RpcError::permanent(
                400,
                "invalid_params",
                "project_root, harness and session are required query parameters",
            );
            let _ = stream.write_all(&refuse(e)).await;
            return;
        }
    };
    let triple = match triple {
        Ok(t) => t,
        Err(e) => {
            let _ = stream
                .write_all(&refuse(RpcError::permanent(
                    400,
                    "invalid_params",
                    e.to_string(),
                )))
                .await;
            return;
        }
    };
    // Last-Event-ID wins over `from`; with neither, live.
    let from_text = head
        .header("last-event-id")
        .map(str::to_string)
        .or_else(|| q("from"));
    let from = match from_text.as_deref() {
        None | Some("live") => SubFrom::Live,
        Some("start") => SubFrom::Start,
        Some(c) => match crate::core::project::Cursor::parse(c) {
            Some(c) => SubFrom::After(c),
            None => {
                let e = RpcError::permanent(
                    400,
                    "invalid_params",
                    format!("`{c}` is not start, live or a cursor <wal_seq>.<sub_index>"),
                );
                let _ = stream.write_all(&refuse(e)).await;
                return;
            }
        },
    };
    if ctx.is_stopping() {
        let _ = stream
            .write_all(&refuse(RpcError::transient(
                503,
                "shutting_down",
                "broca is stopping; retry later",
            )))
            .await;
        return;
    }
    let websocket = head
        .header("upgrade")
        .is_some_and(|u| u.eq_ignore_ascii_case("websocket"));
    let (tx, mut rx) = futures_channel::mpsc::channel::<SubItem>(1024);
    let shard = ctx.shard_of(&triple);
    if ctx.mesh[shard]
        .unbounded_send(ShardMsg::Subscribe { triple, from, tx })
        .is_err()
    {
        let _ = stream
            .write_all(&refuse(RpcError::transient(
                503,
                "session_unavailable",
                "retry",
            )))
            .await;
        return;
    }
    let mut framer = None;
    if websocket {
        let Some(key) = head.header("sec-websocket-key") else {
            let _ = stream
                .write_all(&refuse(RpcError::permanent(
                    400,
                    "invalid_request",
                    "a WebSocket upgrade needs Sec-WebSocket-Key",
                )))
                .await;
            return;
        };
        let reply = format!(
            "HTTP/1.1 101 Switching Protocols\r\nupgrade: websocket\r\nconnection: Upgrade\r\nsec-websocket-accept: {}\r\n\r\n",
            broca_io::net::ws::accept_key(key)
        );
        if stream.write_all(reply.as_bytes()).await.is_err() {
            return;
        }
        framer = Some(broca_io::net::ws::ServerFramer::default());
    } else {
        let head = "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\nconnection: close\r\n\r\n";
        if stream.write_all(head.as_bytes()).await.is_err() {
            return;
        }
    }
    let mut buf = vec![0u8; 4096];
    loop {
        enum Next {
            Item(Option<SubItem>),
            Read(std::io::Result<usize>),
            Tick,
        }
        let next = futures_lite::future::or(
            async { Next::Item(futures_lite::StreamExt::next(&mut rx).await) },
            futures_lite::future::or(async { Next::Read(stream.read(&mut buf).await) }, async {
                glommio::timer::sleep(KEEPALIVE).await;
                Next::Tick
            }),
        )
        .await;
        let (bytes, last) = match next {
            Next::Item(None) => break,
            Next::Item(Some(item)) => {
                let end = matches!(item, SubItem::End(_));
                (encode(item, framer.as_mut()), end)
            }
            Next::Read(Ok(0)) | Next::Read(Err(_)) => break,
            Next::Read(Ok(n)) => match framer.as_mut() {
                Some(f) => {
                    let (reply, closed) = f.feed(&buf[..n]);
                    (reply, closed)
                }
                None => continue, // a client sends nothing on an event stream
            },
            Next::Tick => match framer.as_mut() {
                Some(_) => continue,
                None => (b": keepalive\n\n".to_vec(), false),
            },
        };
        if stream.write_all(&bytes).await.is_err() || stream.flush().await.is_err() {
            break;
        }
        if last {
            if let Some(f) = framer.as_mut() {
                let _ = stream.write_all(&f.close()).await;
            }
            break;
        }
    }
}

/// One item as an SSE event, or as a WebSocket text message.
fn encode(item: SubItem, framer: Option<&mut broca_io::net::ws::ServerFramer>) -> Vec<u8> {
    let (id, event, data) = match item {
        SubItem::Control { cursor, unit } => (Some(cursor.to_string()), None, unit),
        SubItem::Display(text) => (
            None,
            Some("display"),
            serde_json::json!({ "text": text }).to_string(),
        ),
        SubItem::Gap(n) => (
            None,
            Some("display_gap"),
            serde_json::json!({ "dropped": n }).to_string(),
        ),
        SubItem::End(why) => (
            None,
            Some("end"),
            serde_json::json!({ "reason": why }).to_string(),
        ),
    };
    match framer {
        Some(f) => {
            let msg = match (&id, event) {
                (Some(id), _) => format!("{{\"id\":\"{id}\",\"unit\":{data}}}"),
                (None, Some(e)) => format!("{{\"event\":\"{e}\",\"data\":{data}}}"),
                (None, None) => data,
            };
            f.text(msg)
        }
        None => {
            let mut out = String::new();
            if let Some(id) = id {
                out.push_str(&format!("id: {id}\n"));
            }
            if let Some(e) = event {
                out.push_str(&format!("event: {e}\n"));
            }
            out.push_str(&format!("data: {data}\n\n"));
            out.into_bytes()
        }
    }
}

async fn handle(
    ctx: &Arc<ServeCtx>,
    head: &RequestHead,
    body: Vec<u8>,
    tcp: bool,
) -> (u16, &'static str, Vec<u8>) {
    let error = |e: RpcError| (e.status, JSON, e.body());
    if tcp && !authorized(ctx, head) {
        return error(unauthorized());
    }
    match (head.method.as_str(), head.path()) {
        ("POST", "/v1/rpc") => match super::rpc::call(ctx, &body).await {
            Ok(result) => (
                200,
                JSON,
                serde_json::to_vec(&serde_json::json!({ "result": result }))
                    .expect("a reply serializes"),
            ),
            Err(e) => error(e),
        },
        ("GET", "/healthz") => {
            if ctx.is_stopping() {
                (503, JSON, br#"{"status":"stopping"}"#.to_vec())
            } else {
                (200, JSON, br#"{"status":"ok"}"#.to_vec())
            }
        }
        ("GET", "/metrics") => (
            200,
            "text/plain; version=0.0.4",
            metrics(ctx).await.into_bytes(),
        ),
        (_, "/v1/rpc" | "/healthz" | "/metrics" | "/v1/subscribe") => error(RpcError::permanent(
            405,
            "method_not_allowed",
            format!("{} {} is not served", head.method, head.path()),
        )),
        _ => error(RpcError::permanent(
            404,
            "not_found",
            format!("no route {}", head.path()),
        )),
    }
}

/// Every shard's counters in the Prometheus text format.
async fn metrics(ctx: &Arc<ServeCtx>) -> String {
    let mut stats: Vec<ShardStats> = Vec::new();
    for tx in &ctx.mesh {
        let (reply, wait) = futures_channel::oneshot::channel();
        if tx.unbounded_send(ShardMsg::Stats(reply)).is_ok() {
            if let Ok(s) = wait.await {
                stats.push(s);
            }
        }
    }
    let mut out = String::new();
    let mut family = |name: &str, kind: &str, help: &str, value: &dyn Fn(&ShardStats) -> u64| {
        out.push_str(&format!("# HELP {name} {help}\n# TYPE {name} {kind}\n"));
        for s in &stats {
            out.push_str(&format!("{name}{{shard=\"{}\"}} {}\n", s.shard, value(s)));
        }
    };
    family(
        "broca_sessions_live",
        "gauge",
        "Session actors in memory.",
        &|s| s.sessions_live as u64,
    );
    family(
        "broca_sessions_evicted_total",
        "counter",
        "Idle sessions closed to stay within open_sessions_max.",
        &|s| s.sessions_evicted,
    );
    family(
        "broca_sessions_refused_at_limit_total",
        "counter",
        "Commands refused (503 session_limit): every open session was running.",
        &|s| s.sessions_refused_at_limit,
    );
    family("broca_runs_active", "gauge", "Runs being driven.", &|s| {
        s.runs_active as u64
    });
    family(
        "broca_wal_appends_total",
        "counter",
        "Records appended to WALs.",
        &|s| s.commit.appends,
    );
    family(
        "broca_wal_append_bytes_total",
        "counter",
        "Bytes of records appended.",
        &|s| s.commit.append_bytes,
    );
    family(
        "broca_wal_fsyncs_total",
        "counter",
        "fdatasync calls completed.",
        &|s| s.commit.fsyncs,
    );
    family(
        "broca_wal_fsync_errors_total",
        "counter",
        "fdatasync calls that failed.",
        &|s| s.commit.fsync_errors,
    );
    family(
        "broca_provider_bytes_in_total",
        "counter",
        "Bytes received from providers.",
        &|s| s.provider_bytes_in,
    );
    family(
        "broca_provider_bytes_out_total",
        "counter",
        "Bytes sent to providers.",
        &|s| s.provider_bytes_out,
    );
    family(
        "broca_provider_connects_total",
        "counter",
        "Connections opened to providers.",
        &|s| s.provider_connects,
    );
    out.push_str("# HELP broca_model_errors_total Failed model attempts by error class.\n# TYPE broca_model_errors_total counter\n");
    for s in &stats {
        for (class, n) in &s.model_errors {
            out.push_str(&format!(
                "broca_model_errors_total{{shard=\"{}\",class=\"{}\"}} {n}\n",
                s.shard,
                class.as_str()
            ));
        }
    }
    out.push_str("# HELP broca_wal_fsync_seconds fdatasync latency.\n# TYPE broca_wal_fsync_seconds histogram\n");
    for s in &stats {
        let mut cumulative = 0u64;
        for (i, count) in s.commit.fsync_latency_buckets.iter().enumerate() {
            cumulative += count;
            let le = match broca_io::commit::FSYNC_LATENCY_BUCKETS_US.get(i) {
                Some(us) => format!("{}", *us as f64 / 1e6),
                None => "+Inf".into(),
            };
            out.push_str(&format!(
                "broca_wal_fsync_seconds_bucket{{shard=\"{}\",le=\"{le}\"}} {cumulative}\n",
                s.shard
            ));
        }
        out.push_str(&format!(
            "broca_wal_fsync_seconds_sum{{shard=\"{}\"}} {}\nbroca_wal_fsync_seconds_count{{shard=\"{}\"}} {}\n",
            s.shard,
            s.commit.fsync_latency_sum_us as f64 / 1e6,
            s.shard,
            cumulative
        ));
    }
    out
}
