//! `GET /v1/subscribe`: the session and the start from the query (`Last-Event-ID` wins over
//! `from`; with neither, live), the host's handshake, then server-sent events or, when the
//! client asks to upgrade, a WebSocket, written as the items come. Control units carry
//! `id: <wal_seq>.<sub_index>`; display deltas carry none. Nothing is written until the
//! session's shard has accepted the subscription, so a cursor beyond the session's head is
//! answered 400, not with an empty stream.

use std::sync::Arc;
use std::time::Duration;

use broca_io::http_server::{response, RequestHead};
use broca_io::net::ws::ServerFramer;
use futures_lite::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use broca_host::Subscription;
use broca_wal::SessionTriple;
use broca_wire::lanes::{self, SubFrom, SubItem};
use broca_wire::{Code, RpcError};

use crate::{Surface, JSON};

/// How often an idle subscription says it is alive (an SSE comment, or a WebSocket ping).
const KEEPALIVE: Duration = Duration::from_secs(15);

/// [`KEEPALIVE`]; debug builds take `BROCA_TEST_SSE_KEEPALIVE_MS` instead, for tests (release
/// builds have no such knob).
fn keepalive() -> Duration {
    #[cfg(debug_assertions)]
    if let Some(ms) = std::env::var("BROCA_TEST_SSE_KEEPALIVE_MS")
        .ok()
        .and_then(|v| v.parse().ok())
    {
        return Duration::from_millis(ms);
    }
    KEEPALIVE
}

/// The most bytes of queued items joined into one write.
const COALESCE_BYTES_MAX: usize = 64 * 1024;

/// What a subscription asks for.
struct Params {
    triple: SessionTriple,
    from: SubFrom,
    websocket: Option<String>,
}

/// The subscription's parameters: the triple from the query, where to start, and the
/// WebSocket key when the client asks to upgrade.
fn params(head: &RequestHead) -> Result<Params, RpcError> {
    let invalid = |m: String| RpcError::new(Code::InvalidParams, m);
    let q = |k: &str| head.query(k);
    let (Some(p), Some(h), Some(s)) = (q("project_root"), q("harness"), q("session")) else {
        return Err(invalid(
            "project_root, harness and session are required query parameters".into(),
        ));
    };
    let triple = SessionTriple::new(&p, &h, &s).map_err(|e| invalid(e.to_string()))?;
    let from_text = head
        .header("last-event-id")
        .map(str::to_string)
        .or_else(|| q("from"));
    let from = SubFrom::parse(from_text.as_deref())?;
    let upgrade = head
        .header("upgrade")
        .is_some_and(|u| u.eq_ignore_ascii_case("websocket"));
    let websocket = match (upgrade, head.header("sec-websocket-key")) {
        (false, _) => None,
        (true, Some(key)) => Some(key.to_string()),
        (true, None) => {
            return Err(RpcError::new(
                Code::InvalidRequest,
                "a WebSocket upgrade needs Sec-WebSocket-Key",
            ))
        }
    };
    Ok(Params {
        triple,
        from,
        websocket,
    })
}

/// Serves one subscription on its connection, to its end.
pub(crate) async fn serve<S: AsyncRead + AsyncWrite + Unpin>(
    ctx: &Arc<Surface>,
    head: &RequestHead,
    stream: &mut S,
) {
    let accepted = match params(head) {
        // Boxed: the handshake's state goes once it is done; the pump below is what lives.
        Ok(p) => Box::pin(ctx.host.subscribe(p.triple, p.from))
            .await
            .map(|sub| (sub, p.websocket)),
        Err(e) => Err(e),
    };
    let (mut sub, websocket) = match accepted {
        Ok(accepted) => accepted,
        Err(e) => {
            let _ = stream
                .write_all(&response(e.status(), JSON, &e.body(), false))
                .await;
            return;
        }
    };
    let mut framer = match handshake(stream, websocket.as_deref()).await {
        Ok(f) => f,
        Err(()) => return,
    };
    pump(stream, &mut sub, framer.as_mut()).await;
}

/// Writes the response head: `101 Switching Protocols` for a WebSocket (answering its framer),
/// else the event stream's `200` and a first comment line.
async fn handshake<S: AsyncWrite + Unpin>(
    stream: &mut S,
    websocket_key: Option<&str>,
) -> Result<Option<ServerFramer>, ()> {
    let (head, framer) = match websocket_key {
        Some(key) => (
            format!(
                "HTTP/1.1 101 Switching Protocols\r\nupgrade: websocket\r\nconnection: Upgrade\r\n\
                 sec-websocket-accept: {}\r\n\r\n",
                broca_io::net::ws::accept_key(key)
            ),
            Some(ServerFramer::default()),
        ),
        // The event stream's first bytes are a comment, with the head: a client (curl, a
        // browser) shows the subscription open at once, even on a session with nothing to say.
        None => (
            "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\n\
             connection: close\r\n\r\n: subscribed\n\n"
                .to_string(),
            None,
        ),
    };
    stream.write_all(head.as_bytes()).await.map_err(|_| ())?;
    Ok(framer)
}

/// One item in this connection's framing.
fn encode(item: &SubItem, framer: Option<&mut ServerFramer>, out: &mut Vec<u8>) {
    match framer {
        Some(f) => {
            if let Some(msg) = lanes::websocket(item) {
                out.extend_from_slice(&f.text(msg));
            }
        }
        None => lanes::sse_into(item, out),
    }
}

/// Writes items as they come, answers what a WebSocket client sends, and keeps an idle
/// connection alive, until the subscription or the connection ends.
///
/// The keepalive timer lives as long as the connection (re-armed when it fires, not made
/// anew per item, and silent while items flow). The connection is read all along: an SSE
/// client sends nothing after its request, and the read notices it leave; a WebSocket
/// client sends frames. (The executor keeps one readiness poll per connection across reads:
/// a read that is dropped for an item costs no system call.)
async fn pump<S: AsyncRead + AsyncWrite + Unpin>(
    stream: &mut S,
    sub: &mut Subscription,
    mut framer: Option<&mut ServerFramer>,
) {
    enum Next {
        Item(Option<SubItem>),
        Read(std::io::Result<usize>),
        Tick,
    }
    let mut buf = vec![0u8; if framer.is_some() { 4096 } else { 256 }];
    let every = keepalive();
    let mut tick = glommio::timer::Timer::new(every);
    // Whether anything was written since the last tick (then the tick writes nothing).
    let mut wrote = false;
    loop {
        let ticked = async {
            (&mut tick).await;
            Next::Tick
        };
        let next = futures_lite::future::or(
            async { Next::Item(sub.next().await) },
            futures_lite::future::or(async { Next::Read(stream.read(&mut buf).await) }, ticked),
        )
        .await;
        let item = matches!(next, Next::Item(_));
        let (bytes, last) = match next {
            Next::Item(None) | Next::Read(Ok(0)) | Next::Read(Err(_)) => break,
            Next::Item(Some(item)) => {
                // The items already queued go out in the same write (a step's units come
                // together).
                let mut end = item.is_last();
                let mut bytes = Vec::new();
                encode(&item, framer.as_deref_mut(), &mut bytes);
                while !end && bytes.len() < COALESCE_BYTES_MAX {
                    let Some(more) = sub.try_next() else { break };
                    end = more.is_last();
                    encode(&more, framer.as_deref_mut(), &mut bytes);
                }
                (bytes, end)
            }
            Next::Read(Ok(n)) => match framer.as_deref_mut() {
                Some(f) => f.feed(&buf[..n]),
                None => continue, // a client sends nothing on an event stream
            },
            Next::Tick => {
                tick.reset(every);
                if std::mem::take(&mut wrote) {
                    continue; // not idle
                }
                match framer.as_deref_mut() {
                    Some(f) => (f.ping(), false),
                    None => (b": keepalive\n\n".to_vec(), false),
                }
            }
        };
        if stream.write_all(&bytes).await.is_err() || stream.flush().await.is_err() {
            break;
        }
        wrote |= item;
        if last {
            if let Some(f) = framer.as_deref_mut() {
                let _ = stream.write_all(&f.close()).await;
            }
            break;
        }
    }
}
