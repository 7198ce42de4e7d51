//! The MCP client: JSON-RPC 2.0 to tool servers over a child process's stdio (`stdio.rs`) or
//! Streamable HTTP (`http.rs`). Written here rather than taken from the official `rmcp` crate,
//! which needs a tokio runtime: broca's shards run glommio executors, and the client is small.
//!
//! What a call can come to, for the run loop's at-most-once rule:
//! - an answer (a result, or a JSON-RPC error, which is the server's answer too);
//! - refused before delivery: nothing reached the server (it could not be started, the
//!   connection was refused, not one byte of the request was written); the run records a
//!   refused result and the call never ran;
//! - indeterminate: the request was delivered and then the answer was lost (the server died,
//!   the call timed out); it may have run, so it is never sent again.

pub mod http;
pub mod stdio;

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use futures_channel::oneshot;
use serde_json::{json, Value};

/// The MCP protocol version broca asks for; the server's answer is used from then on.
pub const PROTOCOL_VERSION: &str = "2025-06-18";

/// A tool as a server lists it.
#[derive(Debug, Clone, PartialEq)]
pub struct McpTool {
    pub name: String,
    pub description: String,
    pub input_schema: Value,
}

/// What a delivered call was answered with.
#[derive(Debug, Clone, PartialEq)]
pub enum Answer {
    /// The `result` member.
    Result(Value),
    /// A JSON-RPC error: the server's answer, no result.
    Error { code: i64, message: String },
}

/// Why a call has no answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CallError {
    /// Nothing reached the server; the call did not run.
    Refused(String),
    /// The request was delivered and its answer lost; it may have run.
    Indeterminate(String),
}

/// The `initialize` request's params.
pub(crate) fn initialize_params() -> Value {
    json!({
        "protocolVersion": PROTOCOL_VERSION,
        "capabilities": {},
        "clientInfo": {"name": "broca", "version": env!("CARGO_PKG_VERSION")}
    })
}

/// A JSON-RPC request line's bytes.
pub(crate) fn request(id: u64, method: &str, params: &Value) -> Vec<u8> {
    serde_json::to_vec(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}))
        .expect("a JSON value serializes")
}

/// A JSON-RPC notification's bytes.
pub(crate) fn notification(method: &str, params: Option<&Value>) -> Vec<u8> {
    let v = match params {
        Some(p) => json!({"jsonrpc": "2.0", "method": method, "params": p}),
        None => json!({"jsonrpc": "2.0", "method": method}),
    };
    serde_json::to_vec(&v).expect("a JSON value serializes")
}

/// A message read from a server, classified.
pub(crate) enum Incoming {
    /// The answer to our request `id`.
    Answer { id: u64, answer: Answer },
    /// A request from the server (`ping`, `roots/list`, ...), to be answered.
    Request { id: Value, method: String },
    /// A notification (logging, progress, list changes).
    Notification { method: String },
    /// Not JSON-RPC.
    Garbage,
}

pub(crate) fn classify(v: &Value) -> Incoming {
    let Some(obj) = v.as_object() else {
        return Incoming::Garbage;
    };
    if let Some(method) = obj.get("method").and_then(Value::as_str) {
        return match obj.get("id") {
            Some(id) if !id.is_null() => Incoming::Request {
                id: id.clone(),
                method: method.to_string(),
            },
            _ => Incoming::Notification {
                method: method.to_string(),
            },
        };
    }
    let Some(id) = obj.get("id").and_then(Value::as_u64) else {
        return Incoming::Garbage;
    };
    if let Some(result) = obj.get("result") {
        return Incoming::Answer {
            id,
            answer: Answer::Result(result.clone()),
        };
    }
    if let Some(err) = obj.get("error") {
        return Incoming::Answer {
            id,
            answer: Answer::Error {
                code: err.get("code").and_then(Value::as_i64).unwrap_or(0),
                message: err
                    .get("message")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_string(),
            },
        };
    }
    Incoming::Garbage
}

/// The answer broca gives a request from a server: `ping` gets an empty result, everything
/// else (sampling, roots, elicitation) is not offered by broca.
pub(crate) fn answer_server_request(id: &Value, method: &str) -> Vec<u8> {
    let v = if method == "ping" {
        json!({"jsonrpc": "2.0", "id": id, "result": {}})
    } else {
        json!({"jsonrpc": "2.0", "id": id, "error": {
            "code": -32601, "message": format!("broca does not offer `{method}`")}})
    };
    serde_json::to_vec(&v).expect("a JSON value serializes")
}

/// The tools of a `tools/list` result page, and the cursor of the next page.
pub(crate) fn parse_tools_page(
    server: &str,
    result: &Value,
) -> Result<(Vec<McpTool>, Option<String>), McpError> {
    let protocol = |what: &str| McpError::Protocol(format!("server `{server}`: {what}"));
    let list = result
        .get("tools")
        .and_then(Value::as_array)
        .ok_or_else(|| protocol("tools/list answered without a tools array"))?;
    let mut tools = Vec::with_capacity(list.len());
    for t in list {
        let name = t
            .get("name")
            .and_then(Value::as_str)
            .filter(|n| !n.is_empty())
            .ok_or_else(|| protocol("tools/list lists a tool without a name"))?;
        tools.push(McpTool {
            name: name.to_string(),
            description: t
                .get("description")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string(),
            input_schema: t
                .get("inputSchema")
                .cloned()
                .unwrap_or_else(|| json!({"type": "object"})),
        });
    }
    let next = result
        .get("nextCursor")
        .and_then(Value::as_str)
        .map(str::to_string);
    Ok((tools, next))
}

/// Tool-list pages a server may return at most (a guard against a cursor that never ends).
const TOOL_PAGES_MAX: usize = 100;

/// Every page of `tools/list`, each asked for with `ask(params)`.
pub(crate) async fn list_tools<F, Fut>(server: &str, mut ask: F) -> Result<Vec<McpTool>, McpError>
where
    F: FnMut(Value) -> Fut,
    Fut: std::future::Future<Output = Result<Value, McpError>>,
{
    let mut tools = Vec::new();
    let mut cursor: Option<String> = None;
    for _ in 0..TOOL_PAGES_MAX {
        let params = match &cursor {
            Some(c) => json!({"cursor": c}),
            None => json!({}),
        };
        let (mut more, next) = parse_tools_page(server, &ask(params).await?)?;
        tools.append(&mut more);
        match next {
            Some(c) => cursor = Some(c),
            None => return Ok(tools),
        }
    }
    Err(McpError::Protocol(format!(
        "tools/list gave more than {TOOL_PAGES_MAX} pages"
    )))
}

/// Why a tool server could not be started, initialized or asked for its tools.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum McpError {
    /// A JSON-RPC error answer to `method`.
    Rpc {
        method: String,
        code: i64,
        message: String,
    },
    /// The server answered against the protocol: what it did.
    Protocol(String),
    /// The server could not be started, reached or written to, or it stopped: how.
    Unavailable(String),
    /// `error`, of the server `server`.
    Server {
        server: String,
        error: Box<McpError>,
    },
}

impl McpError {
    /// `self`, named by its server.
    pub(crate) fn of(self, server: &str) -> McpError {
        McpError::Server {
            server: server.to_string(),
            error: Box::new(self),
        }
    }
}

impl std::fmt::Display for McpError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            McpError::Rpc {
                method,
                code,
                message,
            } => write!(f, "{method} failed: {message} (code {code})"),
            McpError::Protocol(what) | McpError::Unavailable(what) => f.write_str(what),
            McpError::Server { server, error } => write!(f, "tool server `{server}`: {error}"),
        }
    }
}

impl std::error::Error for McpError {}

impl From<McpError> for String {
    fn from(e: McpError) -> String {
        e.to_string()
    }
}

/// A counting semaphore whose waiters may be on any thread (calls come from every shard).
pub struct Slots {
    inner: Mutex<SlotsInner>,
}

struct SlotsInner {
    free: usize,
    waiters: VecDeque<oneshot::Sender<()>>,
}

/// One slot, given back when dropped.
pub struct Slot {
    slots: Arc<Slots>,
}

impl Slots {
    pub fn new(n: usize) -> Arc<Slots> {
        Arc::new(Slots {
            inner: Mutex::new(SlotsInner {
                free: n,
                waiters: VecDeque::new(),
            }),
        })
    }

    /// Waits for a free slot (first come, first served).
    pub async fn acquire(self: &Arc<Self>) -> Slot {
        let wait = {
            let mut inner = self.inner.lock().expect("the slots lock");
            if inner.free > 0 {
                inner.free -= 1;
                None
            } else {
                let (tx, rx) = oneshot::channel();
                inner.waiters.push_back(tx);
                Some(rx)
            }
        };
        if let Some(rx) = wait {
            // The sender is only dropped by `release` after handing the slot over, or when
            // the slots themselves are dropped (not while we hold an Arc).
            let _ = rx.await;
        }
        Slot {
            slots: self.clone(),
        }
    }

    fn release(&self) {
        let mut inner = self.inner.lock().expect("the slots lock");
        while let Some(w) = inner.waiters.pop_front() {
            if w.send(()).is_ok() {
                return; // handed straight to a waiter
            }
        }
        inner.free += 1;
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.slots.release();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_are_classified() {
        let answer = classify(&json!({"jsonrpc": "2.0", "id": 3, "result": {"x": 1}}));
        assert!(matches!(
            answer,
            Incoming::Answer {
                id: 3,
                answer: Answer::Result(_)
            }
        ));
        let err = classify(
            &json!({"jsonrpc": "2.0", "id": 4, "error": {"code": -32602, "message": "bad"}}),
        );
        assert!(matches!(
            err,
            Incoming::Answer {
                id: 4,
                answer: Answer::Error { code: -32602, .. }
            }
        ));
        assert!(matches!(
            classify(&json!({"jsonrpc": "2.0", "id": "a", "method": "ping"})),
            Incoming::Request { .. }
        ));
        assert!(matches!(
            classify(&json!({"jsonrpc": "2.0", "method": "notifications/message"})),
            Incoming::Notification { .. }
        ));
        assert!(matches!(classify(&json!([1, 2])), Incoming::Garbage));
        assert!(matches!(classify(&json!({"id": 1})), Incoming::Garbage));
    }

    #[test]
    fn a_tools_page_needs_names() {
        let (tools, next) = parse_tools_page(
            "s",
            &json!({"tools": [{"name": "a", "inputSchema": {"type": "object"}}, {"name": "b"}], "nextCursor": "c2"}),
        )
        .unwrap();
        assert_eq!(tools.len(), 2);
        assert_eq!(tools[1].input_schema, json!({"type": "object"}));
        assert_eq!(next.as_deref(), Some("c2"));
        assert!(
            parse_tools_page("s", &json!({"tools": [{"description": "x"}]}))
                .unwrap_err()
                .to_string()
                .contains("without a name")
        );
        assert!(matches!(
            parse_tools_page("s", &json!({})),
            Err(McpError::Protocol(_))
        ));
    }

    #[test]
    fn slots_hand_over_in_order_across_threads() {
        let slots = Slots::new(1);
        let first = futures_lite::future::block_on(slots.acquire());
        let s2 = slots.clone();
        let waiter = std::thread::spawn(move || {
            let _slot = futures_lite::future::block_on(s2.acquire());
        });
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert!(
            !waiter.is_finished(),
            "the second caller waits for the slot"
        );
        drop(first);
        waiter.join().unwrap();
        // Both given back: two acquisitions in a row succeed at once.
        drop(futures_lite::future::block_on(slots.acquire()));
        drop(futures_lite::future::block_on(slots.acquire()));
    }
}
