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

/// Starts accepting on both listeners (on this shard).
pub(crate) fn start(
    ctx: Arc<ServeCtx>,
    tcp: std::net::TcpListener,
    unix: std::os::unix::net::UnixListener,
) -> Result<Acceptor, String> {
    let stopped = Rc::new(Cell::new(false));
    // SAFETY: the descriptor comes from a listener this function owns and gives up.
    let tcp = unsafe { glommio::net::TcpListener::from_raw_fd(tcp.into_raw_fd()) };
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

async fn handle(
    ctx: &Arc<ServeCtx>,
    head: &RequestHead,
    body: Vec<u8>,
    tcp: bool,
) -> (u16, &'static str, Vec<u8>) {
    let error = |e: RpcError| (e.status, JSON, e.body());
    if tcp && !authorized(ctx, head) {
        return error(RpcError {
            status: 401,
            code: "unauthorized",
            class: crate::protocol::ErrorClass::AuthRequired,
            message: "missing or wrong `Authorization: Bearer <handle>` (the handle is in the \
                      file serve.json names)"
                .into(),
        });
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
        ("GET", "/v1/subscribe") => error(RpcError::permanent(
            501,
            "not_implemented",
            "subscriptions are not served by this build yet",
        )),
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
