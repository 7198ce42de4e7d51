//! An MCP server reached over Streamable HTTP: each JSON-RPC message is a POST to the
//! server's URL; the answer is a JSON body or a server-sent event stream that carries it. The
//! session id the server gives at `initialize` (`Mcp-Session-Id`) is shared by every shard.
//!
//! Requests go through the calling shard's HTTP client, on a connection used for nothing
//! else (the client for tool servers keeps no idle connections): a pooled connection that
//! turns out closed is retried by the client, and a tool call must never be sent twice.

use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use broca_io::net::{with_timeout, HttpClient, NetError, Request, Url};
use broca_io::sse::SseDecoder;
use serde_json::{json, Value};

use super::{
    classify, initialize_params, list_tools, notification, request, Answer, CallError, Incoming,
    McpError, McpTool, Slots, PROTOCOL_VERSION,
};
use crate::config::{ServerConfig, Transport};

/// The largest answer body broca reads from a tool server.
const BODY_BYTES_MAX: usize = 64 * 1024 * 1024;

/// One configured Streamable HTTP server.
pub struct HttpServer {
    cfg: ServerConfig,
    url: Url,
    headers: Vec<(String, String)>,
    session: Mutex<Option<Session>>,
    next_id: AtomicU64,
    slots: Arc<Slots>,
}

#[derive(Clone)]
struct Session {
    id: Option<String>,
    version: String,
}

/// How one POST went.
enum Posted {
    /// The JSON-RPC answer to our request.
    Answer(Answer),
    /// Accepted without an answer (202: a notification).
    Accepted,
}

/// Why a POST has no answer, by whether it reached the server.
enum PostError {
    /// The request did not reach the server (no connection), or the server refused it
    /// unprocessed (a 4xx answer).
    NotDelivered(String),
    /// The server no longer knows our session (404): it did not process the request.
    SessionGone,
    /// The request may have reached the server.
    Lost(String),
}

impl HttpServer {
    /// A server of `cfg` (an HTTP transport). The URL must parse; plain http only on
    /// loopback, as for providers.
    pub fn new(cfg: ServerConfig) -> Result<Arc<HttpServer>, McpError> {
        let Transport::Http { url, headers } = cfg.transport.clone() else {
            unreachable!("an HTTP server is made from an HTTP config");
        };
        let parsed =
            Url::parse(&url).map_err(|e| McpError::Unavailable(e.to_string()).of(&cfg.name))?;
        if parsed.scheme == broca_io::net::Scheme::Http && !parsed.is_loopback() {
            let plain = "plain http is accepted only for loopback hosts";
            return Err(McpError::Unavailable(plain.into()).of(&cfg.name));
        }
        Ok(Arc::new(HttpServer {
            slots: Slots::new(cfg.max_concurrency),
            url: parsed,
            headers: headers.into_iter().collect(),
            cfg,
            session: Mutex::new(None),
            next_id: AtomicU64::new(1),
        }))
    }

    pub fn name(&self) -> &str {
        &self.cfg.name
    }

    /// Initializes a session if there is none, and lists the tools.
    pub async fn tools(&self, http: &Rc<HttpClient>) -> Result<Vec<McpTool>, McpError> {
        let work = async {
            let session = self.session(http).await?;
            let ask = |params| self.ask(http, &session, "tools/list", params);
            list_tools(&self.cfg.name, ask).await
        };
        with_timeout(self.cfg.startup_timeout, work)
            .await
            .unwrap_or_else(|()| {
                Err(McpError::Unavailable(format!(
                    "tool server `{}` did not list its tools within {} ms",
                    self.cfg.name,
                    self.cfg.startup_timeout.as_millis()
                )))
            })
    }

    /// Calls tool `name` with `args`.
    pub async fn call(
        &self,
        http: &Rc<HttpClient>,
        name: &str,
        args: &Value,
    ) -> Result<Answer, CallError> {
        let _slot = self.slots.acquire().await;
        let params = json!({"name": name, "arguments": args});
        // A session the server forgot is renewed once: the request was not processed.
        for _ in 0..2 {
            let session = with_timeout(self.cfg.startup_timeout, self.session(http))
                .await
                .unwrap_or_else(|()| Err(McpError::Unavailable("initialize timed out".into())))
                .map_err(|e| CallError::Refused(format!("tool server `{}`: {e}", self.cfg.name)))?;
            let id = self.next_id.fetch_add(1, Ordering::Relaxed);
            let body = request(id, "tools/call", &params);
            let posted = with_timeout(
                self.cfg.call_timeout,
                self.post(http, &session, &body, Some(id)),
            )
            .await;
            return match posted {
                Ok(Ok(Posted::Answer(a))) => Ok(a),
                Ok(Ok(Posted::Accepted)) => Err(CallError::Indeterminate(format!(
                    "tool server `{}` accepted the call without answering it",
                    self.cfg.name
                ))),
                Ok(Err(PostError::SessionGone)) => {
                    self.forget(&session);
                    continue;
                }
                Ok(Err(PostError::NotDelivered(why))) => Err(CallError::Refused(format!(
                    "tool server `{}`: {why}",
                    self.cfg.name
                ))),
                Ok(Err(PostError::Lost(why))) => Err(CallError::Indeterminate(format!(
                    "tool server `{}`: {why} after the call was sent",
                    self.cfg.name
                ))),
                Err(()) => Err(CallError::Indeterminate(format!(
                    "tool server `{}` did not answer within {} ms after the call was sent",
                    self.cfg.name,
                    self.cfg.call_timeout.as_millis()
                ))),
            };
        }
        Err(CallError::Refused(format!(
            "tool server `{}` keeps forgetting its session",
            self.cfg.name
        )))
    }

    /// The current session, initialized first if there is none.
    async fn session(&self, http: &Rc<HttpClient>) -> Result<Session, McpError> {
        if let Some(s) = self.session.lock().expect("the session lock").clone() {
            return Ok(s);
        }
        let fresh = Session {
            id: None,
            version: PROTOCOL_VERSION.into(),
        };
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let body = request(id, "initialize", &initialize_params());
        let (answer, session_id) = self.post_initialize(http, &fresh, &body, id).await?;
        let result = match answer {
            Answer::Result(v) => v,
            Answer::Error { code, message } => {
                return Err(McpError::Rpc {
                    method: "initialize".into(),
                    code,
                    message,
                })
            }
        };
        let version = result
            .get("protocolVersion")
            .and_then(Value::as_str)
            .ok_or_else(|| {
                McpError::Protocol("initialize answered without a protocolVersion".into())
            })?
            .to_string();
        let session = Session {
            id: session_id,
            version,
        };
        match self
            .post(
                http,
                &session,
                &notification("notifications/initialized", None),
                None,
            )
            .await
        {
            Ok(_) => {}
            Err(PostError::NotDelivered(e) | PostError::Lost(e)) => {
                return Err(McpError::Unavailable(e))
            }
            Err(PostError::SessionGone) => {
                return Err(McpError::Unavailable("the session ended at once".into()))
            }
        }
        *self.session.lock().expect("the session lock") = Some(session.clone());
        Ok(session)
    }

    fn forget(&self, stale: &Session) {
        let mut s = self.session.lock().expect("the session lock");
        if s.as_ref().is_some_and(|cur| cur.id == stale.id) {
            *s = None;
        }
    }

    /// A request whose result is needed now (initialize, tools/list).
    async fn ask(
        &self,
        http: &Rc<HttpClient>,
        session: &Session,
        method: &str,
        params: Value,
    ) -> Result<Value, McpError> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        match self
            .post(http, session, &request(id, method, &params), Some(id))
            .await
        {
            Ok(Posted::Answer(Answer::Result(v))) => Ok(v),
            Ok(Posted::Answer(Answer::Error { code, message })) => Err(McpError::Rpc {
                method: method.into(),
                code,
                message,
            }),
            Ok(Posted::Accepted) => Err(McpError::Protocol(format!(
                "{method} was accepted without an answer"
            ))),
            Err(PostError::SessionGone) => {
                self.forget(session);
                Err(McpError::Unavailable(format!(
                    "{method}: the server forgot the session"
                )))
            }
            Err(PostError::NotDelivered(e) | PostError::Lost(e)) => {
                Err(McpError::Unavailable(format!("{method}: {e}")))
            }
        }
    }

    async fn post_initialize(
        &self,
        http: &Rc<HttpClient>,
        session: &Session,
        body: &[u8],
        id: u64,
    ) -> Result<(Answer, Option<String>), McpError> {
        let unavailable = |e: PostError| match e {
            PostError::NotDelivered(e) | PostError::Lost(e) => McpError::Unavailable(e),
            PostError::SessionGone => McpError::Unavailable("initialize: 404".into()),
        };
        let mut resp = self.send(http, session, body).await.map_err(unavailable)?;
        let sid = resp.head.header("mcp-session-id").map(str::to_string);
        match read_answer(&mut resp, id).await {
            Ok(Posted::Answer(a)) => Ok((a, sid)),
            Ok(Posted::Accepted) => Err(McpError::Protocol(
                "initialize was accepted without an answer".into(),
            )),
            Err(e) => Err(unavailable(e)),
        }
    }

    /// POSTs one message and reads the answer to `id` (none for a notification).
    async fn post(
        &self,
        http: &Rc<HttpClient>,
        session: &Session,
        body: &[u8],
        id: Option<u64>,
    ) -> Result<Posted, PostError> {
        let mut resp = self.send(http, session, body).await?;
        match id {
            Some(id) => read_answer(&mut resp, id).await,
            None => {
                let _ = resp.body(64 * 1024).await;
                Ok(Posted::Accepted)
            }
        }
    }

    async fn send(
        &self,
        http: &Rc<HttpClient>,
        session: &Session,
        body: &[u8],
    ) -> Result<broca_io::net::Response, PostError> {
        let mut headers: Vec<(&str, &str)> = vec![
            ("content-type", "application/json"),
            ("accept", "application/json, text/event-stream"),
            ("mcp-protocol-version", &session.version),
        ];
        if let Some(sid) = &session.id {
            headers.push(("mcp-session-id", sid));
        }
        for (k, v) in &self.headers {
            headers.push((k, v));
        }
        let req = Request {
            method: "POST",
            url: &self.url,
            path: if self.url.prefix.is_empty() { "/" } else { "" },
            headers: &headers,
            body,
        };
        let mut resp = http.send(&req).await.map_err(|e| match e {
            // Nothing was sent: no connection, or a request broca would not send.
            NetError::Url(_)
            | NetError::Resolve { .. }
            | NetError::Connect { .. }
            | NetError::Tls { .. }
            | NetError::Proxy { .. } => PostError::NotDelivered(e.to_string()),
            NetError::Timeout {
                what: "connect", ..
            } => PostError::NotDelivered(e.to_string()),
            other => PostError::Lost(other.to_string()),
        })?;
        let status = resp.status();
        if status == 404 && session.id.is_some() {
            let _ = resp.body(64 * 1024).await;
            return Err(PostError::SessionGone);
        }
        if (400..500).contains(&status) {
            let text = resp.body(4096).await.unwrap_or_default();
            return Err(PostError::NotDelivered(format!(
                "HTTP {status}: {}",
                String::from_utf8_lossy(&text)
                    .chars()
                    .take(300)
                    .collect::<String>()
            )));
        }
        if !(200..300).contains(&status) {
            return Err(PostError::Lost(format!("HTTP {status}")));
        }
        Ok(resp)
    }
}

/// Reads the answer to request `id` from a JSON body or an event stream.
async fn read_answer(resp: &mut broca_io::net::Response, id: u64) -> Result<Posted, PostError> {
    if resp.status() == 202 {
        let _ = resp.body(64 * 1024).await;
        return Ok(Posted::Accepted);
    }
    let lost = |e: NetError| PostError::Lost(e.to_string());
    let event_stream = resp
        .head
        .header("content-type")
        .is_some_and(|t| t.trim_start().starts_with("text/event-stream"));
    if !event_stream {
        let body = resp.body(BODY_BYTES_MAX).await.map_err(lost)?;
        let v: Value = serde_json::from_slice(&body)
            .map_err(|e| PostError::Lost(format!("the answer is not JSON: {e}")))?;
        // A batch answer is an array; take ours from it.
        let msgs = match v {
            Value::Array(items) => items,
            one => vec![one],
        };
        for m in &msgs {
            if let Incoming::Answer { id: got, answer } = classify(m) {
                if got == id {
                    return Ok(Posted::Answer(answer));
                }
            }
        }
        return Err(PostError::Lost(
            "the answer does not answer the request".into(),
        ));
    }
    let mut dec = SseDecoder::new(BODY_BYTES_MAX);
    let mut found: Option<Answer> = None;
    let mut bad: Option<String> = None;
    while found.is_none() {
        let Some(chunk) = resp.chunk().await.map_err(lost)? else {
            break;
        };
        dec.push(&chunk, &mut |ev| {
            if found.is_some() || ev.data.is_empty() {
                return;
            }
            match serde_json::from_str::<Value>(ev.data) {
                Ok(v) => {
                    if let Incoming::Answer { id: got, answer } = classify(&v) {
                        if got == id {
                            found = Some(answer);
                        }
                    }
                }
                Err(e) => bad = Some(format!("an event is not JSON: {e}")),
            }
        })
        .map_err(|e| PostError::Lost(e.to_string()))?;
    }
    match found {
        Some(a) => Ok(Posted::Answer(a)),
        None => Err(PostError::Lost(bad.unwrap_or_else(|| {
            "the event stream ended without the answer".into()
        }))),
    }
}
