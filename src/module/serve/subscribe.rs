//! `GET /v1/subscribe`: the parameters, the handshake (server-sent events, or a WebSocket
//! when the client asks to upgrade), and the loop that writes what the session's hub sends.
//! Control units carry `id: <wal_seq>.<sub_index>`; display deltas carry none. Nothing is
//! written until the hub has accepted the subscription, so a cursor beyond the session's
//! head is answered 400, not with an empty stream.

use std::sync::Arc;
use std::time::Duration;

use broca_io::http_server::{response, RequestHead};
use broca_io::net::ws::ServerFramer;
use futures_lite::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, StreamExt};

use broca_core::project::Cursor;
use broca_wal::SessionTriple;
use broca_wire::RpcError;

use super::http::JSON;
use super::hub::{SubFrom, SubItem, SUB_CHANNEL_ITEMS};
use super::{ServeCtx, ShardMsg};

/// How often an idle subscription says it is alive (an SSE comment, or a WebSocket ping).
const KEEPALIVE: Duration = Duration::from_secs(15);

/// The most bytes of queued items joined into one write.
const COALESCE_BYTES_MAX: usize = 64 * 1024;

/// What a subscription asks for.
struct Params {
    triple: SessionTriple,
    from: SubFrom,
    websocket: Option<String>,
}

/// The subscription's parameters: the triple from the query, where to start
/// (`Last-Event-ID` wins over `from`; with neither, live), and the WebSocket key when the
/// client asks to upgrade.
fn params(head: &RequestHead) -> Result<Params, RpcError> {
    let invalid = |m: String| RpcError::new(broca_wire::Code::InvalidParams, m);
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
    let from = match from_text.as_deref() {
        None | Some("live") => SubFrom::Live,
        Some("start") => SubFrom::Start,
        Some(c) => SubFrom::After(Cursor::parse(c).ok_or_else(|| {
            invalid(format!(
                "`{}` is not start, live or a cursor <wal_seq>.<sub_index>",
                c.escape_debug()
            ))
        })?),
    };
    let upgrade = head
        .header("upgrade")
        .is_some_and(|u| u.eq_ignore_ascii_case("websocket"));
    let websocket = match (upgrade, head.header("sec-websocket-key")) {
        (false, _) => None,
        (true, Some(key)) => Some(key.to_string()),
        (true, None) => {
            return Err(RpcError::new(
                broca_wire::Code::InvalidRequest,
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
pub(super) async fn serve<S: AsyncRead + AsyncWrite + Unpin>(
    ctx: &Arc<ServeCtx>,
    head: &RequestHead,
    stream: &mut S,
) {
    let refuse = |e: RpcError| response(e.status(), JSON, &e.body(), false);
    let p = match params(head) {
        Ok(p) => p,
        Err(e) => {
            let _ = stream.write_all(&refuse(e)).await;
            return;
        }
    };
    if ctx.is_stopping() {
        let e = RpcError::new(
            broca_wire::Code::ShuttingDown,
            "broca is stopping; retry later",
        );
        let _ = stream.write_all(&refuse(e)).await;
        return;
    }
    let (tx, mut rx) = futures_channel::mpsc::channel::<SubItem>(SUB_CHANNEL_ITEMS);
    // Dropped when this connection ends: the hub stops serving it at once.
    let (_alive, gone) = futures_channel::oneshot::channel::<()>();
    let shard = ctx.shard_of(&p.triple);
    let msg = ShardMsg::Subscribe {
        triple: p.triple,
        from: p.from,
        tx,
        gone,
    };
    if let Err(e) = ctx.mesh.try_send(shard, msg) {
        let e = match e {
            super::mesh::MeshError::Full => RpcError::new(
                broca_wire::Code::ShardBusy,
                "the session's shard has too many commands waiting; retry shortly",
            ),
            super::mesh::MeshError::Gone => {
                RpcError::new(broca_wire::Code::SessionUnavailable, "retry")
            }
        };
        let _ = stream.write_all(&refuse(e)).await;
        return;
    }
    match rx.next().await {
        Some(SubItem::Ready) => {}
        Some(SubItem::Refused(why)) => {
            let e = RpcError::new(broca_wire::Code::InvalidParams, why);
            let _ = stream.write_all(&refuse(e)).await;
            return;
        }
        _ => {
            let e = RpcError::new(
                broca_wire::Code::SessionUnavailable,
                "the session went away; retry",
            );
            let _ = stream.write_all(&refuse(e)).await;
            return;
        }
    }
    let mut framer = match handshake(stream, p.websocket.as_deref()).await {
        Ok(f) => f,
        Err(()) => return,
    };
    pump(stream, &mut rx, framer.as_mut()).await;
}

/// Writes the response head: `101 Switching Protocols` for a WebSocket (answering its framer),
/// else the event stream's `200`.
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
        None => (
            "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\n\
             connection: close\r\n\r\n"
                .to_string(),
            None,
        ),
    };
    stream.write_all(head.as_bytes()).await.map_err(|_| ())?;
    Ok(framer)
}

/// Writes items as they come, answers what a WebSocket client sends, and keeps an idle
/// connection alive, until the subscription or the connection ends.
async fn pump<S: AsyncRead + AsyncWrite + Unpin>(
    stream: &mut S,
    rx: &mut futures_channel::mpsc::Receiver<SubItem>,
    mut framer: Option<&mut ServerFramer>,
) {
    enum Next {
        Item(Option<SubItem>),
        Read(std::io::Result<usize>),
        Tick,
    }
    // An SSE client sends nothing after its request (a read only notices the close); a
    // WebSocket client sends frames.
    let mut buf = vec![0u8; if framer.is_some() { 4096 } else { 256 }];
    loop {
        let next = futures_lite::future::or(
            async { Next::Item(rx.next().await) },
            futures_lite::future::or(async { Next::Read(stream.read(&mut buf).await) }, async {
                glommio::timer::sleep(KEEPALIVE).await;
                Next::Tick
            }),
        )
        .await;
        let (bytes, last) = match next {
            Next::Item(None) | Next::Read(Ok(0)) | Next::Read(Err(_)) => break,
            Next::Item(Some(item)) => {
                // The items already queued go out in the same write (a step's units come
                // together).
                let mut end = matches!(item, SubItem::End(_));
                let mut bytes = encode(item, framer.as_deref_mut());
                while !end && bytes.len() < COALESCE_BYTES_MAX {
                    let Ok(more) = rx.try_recv() else { break };
                    end = matches!(more, SubItem::End(_));
                    bytes.extend_from_slice(&encode(more, framer.as_deref_mut()));
                }
                (bytes, end)
            }
            Next::Read(Ok(n)) => match framer.as_deref_mut() {
                Some(f) => f.feed(&buf[..n]),
                None => continue, // a client sends nothing on an event stream
            },
            Next::Tick => match framer.as_deref_mut() {
                Some(f) => (f.ping(), false),
                None => (b": keepalive\n\n".to_vec(), false),
            },
        };
        if stream.write_all(&bytes).await.is_err() || stream.flush().await.is_err() {
            break;
        }
        if last {
            if let Some(f) = framer.as_deref_mut() {
                let _ = stream.write_all(&f.close()).await;
            }
            break;
        }
    }
}

/// One item as an SSE event, or as a WebSocket text message.
fn encode(item: SubItem, framer: Option<&mut ServerFramer>) -> Vec<u8> {
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
        SubItem::End(why) | SubItem::Refused(why) => (
            None,
            Some("end"),
            serde_json::json!({ "reason": why }).to_string(),
        ),
        SubItem::Ready => return Vec::new(),
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
            let mut out = String::with_capacity(data.len() + 32);
            if let Some(id) = id {
                out.push_str("id: ");
                out.push_str(&id);
                out.push('\n');
            }
            if let Some(e) = event {
                out.push_str("event: ");
                out.push_str(e);
                out.push('\n');
            }
            out.push_str("data: ");
            out.push_str(&data);
            out.push_str("\n\n");
            out.into_bytes()
        }
    }
}
