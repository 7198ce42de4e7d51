//! A WebSocket client over the client's own connection (TCP or TLS, through the proxy when
//! one applies). The upgrade is written and checked here; frames are tungstenite's, driven
//! through an in-memory bridge: tungstenite reads what the socket delivered and writes into a
//! buffer the socket then sends, so it never blocks the shard.

use std::io::{self, Read, Write};

use tungstenite::handshake::client::generate_key;
use tungstenite::handshake::derive_accept_key;
use tungstenite::protocol::Role;
use tungstenite::Message;

use super::client::HttpClient;
use super::conn::Conn;
use super::{with_timeout, NetError, Url};
use crate::http1::{Limits, Part, ResponseDecoder};

const HEAD_MAX: usize = 64 * 1024;
const REFUSAL_BODY_MAX: usize = 1024 * 1024;

#[derive(Default)]
struct Bridge {
    rx: Vec<u8>,
    rx_pos: usize,
    tx: Vec<u8>,
}

impl Read for Bridge {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let left = &self.rx[self.rx_pos..];
        if left.is_empty() {
            return Err(io::ErrorKind::WouldBlock.into());
        }
        let n = left.len().min(buf.len());
        buf[..n].copy_from_slice(&left[..n]);
        self.rx_pos += n;
        if self.rx_pos == self.rx.len() {
            self.rx.clear();
            self.rx_pos = 0;
        }
        Ok(n)
    }
}

impl Write for Bridge {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.tx.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// The server answered the upgrade with something other than 101.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused {
    pub status: u16,
    pub retry_after: Option<String>,
    pub body: Vec<u8>,
}

/// An open WebSocket.
pub struct WebSocket {
    conn: Conn,
    ws: tungstenite::WebSocket<Bridge>,
    target: String,
    idle: std::time::Duration,
    buf: Vec<u8>,
    /// The server sent its close frame (the TCP close that follows is the clean end).
    closed_by_peer: bool,
    /// The upgrade reply's headers (names in lower case): what the server said of the
    /// connection (a provider's quota, say).
    headers: Vec<(String, String)>,
}

/// The upgrade request's bytes; a header value holding a line break is refused.
fn upgrade_request(
    url: &Url,
    path: &str,
    target: &str,
    user_agent: &str,
    key: &str,
    headers: &[(&str, &str)],
) -> Result<String, NetError> {
    let mut req = format!(
        "GET {}{} HTTP/1.1\r\nHost: {}\r\nUser-Agent: {}\r\nUpgrade: websocket\r\n\
         Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n",
        url.prefix, path, target, user_agent
    );
    for (name, value) in headers {
        if value.contains(['\r', '\n']) {
            return Err(NetError::Url(format!("header `{name}` holds a line break")));
        }
        req.push_str(&format!("{name}: {value}\r\n"));
    }
    req.push_str("\r\n");
    Ok(req)
}

/// Reads the upgrade reply's head (at most [`HEAD_MAX`] bytes, each read within `t`):
/// what was read, and where the head ends in it.
async fn read_reply_head(
    conn: &mut Conn,
    target: &str,
    t: std::time::Duration,
    buf: &mut [u8],
) -> Result<(Vec<u8>, usize), NetError> {
    let ws_err = |why: String| NetError::WebSocket {
        target: target.to_string(),
        why,
    };
    let mut got = Vec::new();
    loop {
        if let Some(i) = memchr::memmem::find(&got, b"\r\n\r\n") {
            assert!(i + 4 <= got.len());
            return Ok((got, i + 4));
        }
        if got.len() > HEAD_MAX {
            return Err(ws_err("upgrade reply head too large".into()));
        }
        let n = match with_timeout(t, conn.read(buf)).await {
            Err(()) => {
                return Err(NetError::Timeout {
                    what: "upgrade reply",
                    target: target.to_string(),
                    after: t,
                })
            }
            Ok(r) => r.map_err(|e| ws_err(format!("reading the upgrade reply: {e}")))?,
        };
        if n == 0 {
            return Err(ws_err("closed before the upgrade reply".into()));
        }
        assert!(n <= buf.len(), "a read fills at most its buffer");
        got.extend_from_slice(&buf[..n]);
    }
}

/// An upgrade reply's head: its status and headers (names in lower case).
struct UpgradeHead {
    status: u16,
    headers: Vec<(String, String)>,
}

impl UpgradeHead {
    fn parse(head: &[u8], target: &str) -> Result<UpgradeHead, NetError> {
        let mut hbuf = [httparse::EMPTY_HEADER; 64];
        let mut resp = httparse::Response::new(&mut hbuf);
        resp.parse(head).map_err(|e| NetError::WebSocket {
            target: target.to_string(),
            why: format!("malformed upgrade reply: {e}"),
        })?;
        let headers = resp
            .headers
            .iter()
            .filter_map(|h| {
                let value = std::str::from_utf8(h.value).ok()?;
                Some((h.name.to_ascii_lowercase(), value.to_string()))
            })
            .collect();
        Ok(UpgradeHead {
            status: resp.code.unwrap_or(0),
            headers,
        })
    }

    /// A header by its name in lower case.
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

impl WebSocket {
    /// Connects to `url` + `path` and upgrades. `Ok(Err(refused))` when the server answered
    /// with another status (its body read, up to 1 MiB).
    pub async fn connect(
        client: &HttpClient,
        url: &Url,
        path: &str,
        headers: &[(&str, &str)],
    ) -> Result<Result<WebSocket, Refused>, NetError> {
        let mut conn = client.connect(url).await?;
        let target = url.authority();
        let ws_err = |why: String| NetError::WebSocket {
            target: target.clone(),
            why,
        };
        let key = generate_key();
        let req = upgrade_request(
            url,
            path,
            &target,
            &client.config().user_agent,
            &key,
            headers,
        )?;
        conn.write_all(req.as_bytes())
            .await
            .map_err(|e| ws_err(format!("writing the upgrade: {e}")))?;
        let t = client.config().timeouts.first_byte;
        let mut buf = vec![0u8; 16 * 1024];
        let (got, head_end) = read_reply_head(&mut conn, &target, t, &mut buf).await?;
        let head = match UpgradeHead::parse(&got[..head_end], &target)? {
            head if head.status != 101 => {
                let body = refusal_body(&mut conn, &got, t, &mut buf).await;
                return Ok(Err(Refused {
                    status: head.status,
                    retry_after: head.header("retry-after").map(str::to_string),
                    body,
                }));
            }
            head => head,
        };
        if head.header("sec-websocket-accept").unwrap_or_default()
            != derive_accept_key(key.as_bytes())
        {
            return Err(ws_err(
                "the server's Sec-WebSocket-Accept does not match the key".into(),
            ));
        }
        let kept = head.headers;
        let bridge = Bridge {
            rx: got[head_end..].to_vec(),
            ..Bridge::default()
        };
        Ok(Ok(WebSocket {
            conn,
            ws: tungstenite::WebSocket::from_raw_socket(bridge, Role::Client, None),
            target,
            idle: client.config().timeouts.idle,
            buf,
            closed_by_peer: false,
            headers: kept,
        }))
    }

    /// A header of the upgrade reply, by name (any case).
    pub fn header(&self, name: &str) -> Option<&str> {
        let name = name.to_ascii_lowercase();
        self.headers
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| v.as_str())
    }

    async fn flush(&mut self) -> Result<(), NetError> {
        let _ = self.ws.flush(); // moves queued frames (pongs, closes) into the bridge
        let tx = std::mem::take(&mut self.ws.get_mut().tx);
        if !tx.is_empty() {
            self.conn.write_all(&tx).await.map_err(|e| NetError::Io {
                target: self.target.clone(),
                why: e.to_string(),
            })?;
        }
        Ok(())
    }

    /// Starts the closing handshake: a close frame (1000, normal) is written. Best effort.
    pub async fn send_close(&mut self) {
        if self.ws.close(None).is_ok() {
            let _ = self.flush().await;
        }
    }

    /// Ends the closing handshake in a task of the shard's own: the server's close is read
    /// (up to `wait`) before the connection is dropped, so that no unread frame turns the TCP
    /// close into a reset.
    pub fn finish_close_detached(self, wait: std::time::Duration) {
        glommio::spawn_local(self.finish_close(wait)).detach();
    }

    async fn finish_close(mut self, wait: std::time::Duration) {
        let _ = with_timeout(wait, async {
            loop {
                match self.ws.read() {
                    Ok(_) => {}
                    Err(tungstenite::Error::Io(e)) if e.kind() == io::ErrorKind::WouldBlock => {
                        match self.conn.read(&mut self.buf).await {
                            Ok(n) if n > 0 => {
                                let got = &self.buf[..n];
                                self.ws.get_mut().rx.extend_from_slice(got);
                            }
                            _ => return,
                        }
                    }
                    Err(_) => return,
                }
            }
        })
        .await;
    }

    /// Sends a text message.
    pub async fn send_text(&mut self, text: String) -> Result<(), NetError> {
        self.ws
            .write(Message::text(text))
            .map_err(|e| NetError::WebSocket {
                target: self.target.clone(),
                why: e.to_string(),
            })?;
        self.flush().await
    }

    /// The next text message; `None` once the server closed the socket properly. Pings are
    /// answered; binary messages are refused as not of this protocol.
    pub async fn next_text(&mut self) -> Result<Option<String>, NetError> {
        loop {
            match self.ws.read() {
                Ok(Message::Text(t)) => return Ok(Some(t.as_str().to_string())),
                Ok(Message::Binary(_)) => {
                    return Err(NetError::WebSocket {
                        target: self.target.clone(),
                        why: "unexpected binary message".into(),
                    })
                }
                Ok(Message::Close(_)) => {
                    self.closed_by_peer = true;
                    self.flush().await?;
                }
                Ok(_) => self.flush().await?,
                Err(tungstenite::Error::ConnectionClosed | tungstenite::Error::AlreadyClosed) => {
                    self.flush().await.ok();
                    return Ok(None);
                }
                Err(tungstenite::Error::Io(e)) if e.kind() == io::ErrorKind::WouldBlock => {
                    self.flush().await?;
                    let n = match with_timeout(self.idle, self.conn.read(&mut self.buf)).await {
                        Err(()) => {
                            return Err(NetError::Timeout {
                                what: "WebSocket message",
                                target: self.target.clone(),
                                after: self.idle,
                            })
                        }
                        Ok(r) => r.map_err(|e| NetError::Io {
                            target: self.target.clone(),
                            why: e.to_string(),
                        })?,
                    };
                    if n == 0 && self.closed_by_peer {
                        return Ok(None);
                    }
                    if n == 0 {
                        return Err(NetError::Io {
                            target: self.target.clone(),
                            why: "the connection closed without a WebSocket close frame".into(),
                        });
                    }
                    self.ws.get_mut().rx.extend_from_slice(&self.buf[..n]);
                }
                Err(e) => {
                    return Err(NetError::WebSocket {
                        target: self.target.clone(),
                        why: e.to_string(),
                    })
                }
            }
        }
    }
}

/// Reads what there is of a refusal's body (best effort: a refusal is reported either way).
async fn refusal_body(
    conn: &mut Conn,
    got: &[u8],
    t: std::time::Duration,
    buf: &mut [u8],
) -> Vec<u8> {
    let limits = Limits {
        body_bytes_max: REFUSAL_BODY_MAX as u64,
        ..Limits::default()
    };
    let mut dec = ResponseDecoder::new(limits, false);
    let mut parts = Vec::new();
    let mut body = Vec::new();
    let mut feed = got.to_vec();
    loop {
        if dec.push(&feed, &mut parts).is_err() {
            return body;
        }
        for p in parts.drain(..) {
            if let Part::Body(b) = p {
                body.extend_from_slice(&b);
            }
        }
        if dec.is_done() {
            return body;
        }
        match with_timeout(t, conn.read(buf)).await {
            Ok(Ok(n)) if n > 0 => feed = buf[..n].to_vec(),
            _ => return body,
        }
    }
}

/// The `Sec-WebSocket-Accept` value for a client's key.
pub fn accept_key(client_key: &str) -> String {
    derive_accept_key(client_key.trim().as_bytes())
}

/// The server side of an upgraded connection, sans-IO: frames to write come out as bytes;
/// bytes read go in, and what the client sent (pings are answered, a close is noted) comes
/// back as bytes to write.
pub struct ServerFramer {
    ws: tungstenite::WebSocket<Bridge>,
}

impl Default for ServerFramer {
    fn default() -> Self {
        ServerFramer {
            ws: tungstenite::WebSocket::from_raw_socket(Bridge::default(), Role::Server, None),
        }
    }
}

impl ServerFramer {
    fn take(&mut self) -> Vec<u8> {
        let _ = self.ws.flush();
        std::mem::take(&mut self.ws.get_mut().tx)
    }

    /// The bytes of a text message.
    pub fn text(&mut self, text: String) -> Vec<u8> {
        let _ = self.ws.write(Message::text(text));
        self.take()
    }

    /// The bytes of a ping (a keepalive the client answers with a pong).
    pub fn ping(&mut self) -> Vec<u8> {
        let _ = self.ws.write(Message::Ping(Vec::new().into()));
        self.take()
    }

    /// The bytes of a close frame.
    pub fn close(&mut self) -> Vec<u8> {
        let _ = self.ws.close(None);
        self.take()
    }

    /// Takes bytes from the client; answers the bytes to write back (pongs, the close
    /// reply) and whether the client closed (or broke the protocol).
    pub fn feed(&mut self, bytes: &[u8]) -> (Vec<u8>, bool) {
        self.ws.get_mut().rx.extend_from_slice(bytes);
        let mut closed = false;
        loop {
            match self.ws.read() {
                Ok(Message::Close(_)) => closed = true,
                Ok(_) => {}
                Err(tungstenite::Error::Io(e)) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(_) => {
                    closed = true;
                    break;
                }
            }
        }
        (self.take(), closed)
    }
}
