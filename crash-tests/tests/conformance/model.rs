//! The scripted model: a loopback HTTP/1.1 server speaking Anthropic's Messages API (SSE),
//! and OpenAI's Chat Completions (SSE, with the usage members OpenAI-compatible servers such
//! as OpenRouter report), outside broca's process. A script is served on the wire that can
//! carry what it reports: Anthropic's, unless a turn reports reasoning tokens, which
//! Anthropic's usage has no member for (then the chat wire, whose usage carries cache
//! reads, cache writes and reasoning together). A request's `model` names its session (the
//! adapter's sends use `<provider>/<session>`); it is answered with the session's scripted
//! turn, the turn picked by how many assistant messages the request carries (so a step
//! redone after a crash gets the same turn, and the next step the next one). Every request
//! is recorded as it arrived: the suite observes model requests here, never from broca's
//! replies.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use cortexkit_role_llm_runner_conformance::{Script, ScriptedPart, ScriptedTurn};
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

#[derive(Default)]
struct Session {
    script: Script,
    /// Every request body received for the session, in order.
    requests: Vec<Value>,
    /// The hold the session's next answer takes, and the one its answer in flight is under.
    armed: Option<Arc<Hold>>,
    held: Option<Arc<Hold>>,
    /// The conversations (each request's messages) a failing turn answered.
    failed: Vec<String>,
    /// Assistant messages the session holds from elsewhere than the script (imported).
    seeded: usize,
}

/// The server and what it saw.
#[derive(Clone)]
pub struct Model {
    pub url: String,
    sessions: Arc<Mutex<HashMap<String, Session>>>,
}

impl Model {
    pub async fn start() -> Model {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("the model's listener");
        let url = format!("http://{}", listener.local_addr().unwrap());
        let model = Model {
            url,
            sessions: Arc::default(),
        };
        let me = model.clone();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let me = me.clone();
                tokio::spawn(async move { me.serve(stream).await });
            }
        });
        model
    }

    /// The catalog provider whose wire the session's script is served on.
    pub fn provider(&self, session: &str) -> &'static str {
        let sessions = self.sessions.lock().unwrap();
        let reasoning = sessions.get(session).is_some_and(|s| {
            s.script.turns.iter().any(|t| {
                t.usage
                    .as_ref()
                    .is_some_and(|u| u.reasoning_tokens.is_some())
            })
        });
        if reasoning {
            "openai"
        } else {
            "anthropic"
        }
    }

    /// The session holds `n` assistant messages that are not the script's answers.
    pub fn seeded(&self, session: &str, n: usize) {
        self.sessions
            .lock()
            .unwrap()
            .entry(session.to_string())
            .or_default()
            .seeded += n;
    }

    pub fn install(&self, session: &str, script: Script) {
        self.sessions
            .lock()
            .unwrap()
            .entry(session.to_string())
            .or_default()
            .script = script;
    }

    /// The request bodies the session's model received.
    pub fn requests(&self, session: &str) -> Vec<Value> {
        self.sessions
            .lock()
            .unwrap()
            .get(session)
            .map(|s| s.requests.clone())
            .unwrap_or_default()
    }

    async fn serve(&self, mut stream: TcpStream) {
        let mut buf = Vec::new();
        loop {
            let Some((head_len, body_len, path)) = read_head(&mut stream, &mut buf).await else {
                return;
            };
            while buf.len() < head_len + body_len {
                let mut chunk = [0u8; 16384];
                match stream.read(&mut chunk).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => buf.extend_from_slice(&chunk[..n]),
                }
            }
            let body: Value =
                serde_json::from_slice(&buf[head_len..head_len + body_len]).unwrap_or(Value::Null);
            buf.drain(..head_len + body_len);
            let chat = path.ends_with("/chat/completions");
            let answer = self.answer(body, chat);
            if write_answer(&mut stream, answer).await.is_err() {
                return;
            }
        }
    }

    fn answer(&self, body: Value, chat: bool) -> Answer {
        let session = body["model"].as_str().unwrap_or_default().to_string();
        let assistant = body["messages"]
            .as_array()
            .map_or(0, |m| m.iter().filter(|m| m["role"] == "assistant").count());
        let mut sessions = self.sessions.lock().unwrap();
        let s = sessions.entry(session.clone()).or_default();
        s.requests.push(body.clone());
        // A failing turn leaves no assistant message: it answers every request of the step it
        // failed (broca's retries), and a request of another conversation takes the next turn.
        let key = body["messages"].to_string();
        let failed_before = s.failed.iter().filter(|k| **k != key).count();
        let turn = (assistant + failed_before).saturating_sub(s.seeded);
        if s.script
            .turns
            .get(turn)
            .is_some_and(|t| t.model_failure.is_some())
            && !s.failed.contains(&key)
        {
            s.failed.push(key);
        }
        let Some(t) = s.script.turns.get(turn) else {
            let e = json!({"type": "error", "error": {"type": "invalid_request_error",
                "message": format!("the script of {session} has no turn {turn}")}});
            return Answer {
                status: "400 Bad Request",
                content_type: "application/json",
                pieces: vec![e.to_string()],
                hold: None,
                headers: String::new(),
            };
        };
        if let Some(failure) = &t.model_failure {
            return failed(failure, chat);
        }
        let max = body["max_tokens"]
            .as_u64()
            .or(body["max_completion_tokens"].as_u64());
        let t = cut(t, max);
        let pieces = if chat {
            render_chat(&session, turn, &t)
        } else {
            render(&session, turn, &t)
        };
        // An armed hold takes this answer: it is in flight now, for the case to await and
        // release.
        let hold = s.armed.take();
        s.held = hold.clone();
        Answer {
            status: "200 OK",
            content_type: "text/event-stream",
            pieces,
            hold,
            headers: String::new(),
        }
    }

    /// Holds `session`'s next answer after its first `parts` parts (0: before any) until
    /// [`Model::release`].
    pub fn hold(&self, session: &str, parts: usize) {
        let mut sessions = self.sessions.lock().unwrap();
        let s = sessions.entry(session.to_string()).or_default();
        s.armed = Some(Arc::new(Hold {
            parts,
            reached: Default::default(),
            released: Default::default(),
            changed: Default::default(),
        }));
    }

    /// Waits (up to 30 s) until the session's held answer has streamed what it holds after.
    pub async fn await_held(&self, session: &str) -> Result<(), String> {
        let until = tokio::time::Instant::now() + std::time::Duration::from_secs(30);
        loop {
            let hold = self
                .sessions
                .lock()
                .unwrap()
                .get(session)
                .and_then(|s| s.held.clone().or_else(|| s.armed.clone()));
            let Some(hold) = hold else {
                return Err(format!("no answer of {session} is held"));
            };
            let changed = hold.changed.notified();
            if hold.reached.load(std::sync::atomic::Ordering::SeqCst) {
                return Ok(());
            }
            // The hold may be reached before this waiter registered: look again shortly.
            let wait = tokio::time::sleep(std::time::Duration::from_millis(20));
            tokio::select! {
                () = changed => {}
                () = wait => {}
            }
            if tokio::time::Instant::now() > until {
                return Err(format!(
                    "the held answer of {session} was not asked for within 30 s"
                ));
            }
        }
    }

    /// Lets the session's held answer go on (the armed one too, if not taken yet).
    pub fn release(&self, session: &str) {
        let sessions = self.sessions.lock().unwrap();
        if let Some(s) = sessions.get(session) {
            for hold in s.held.iter().chain(s.armed.iter()) {
                hold.released
                    .store(true, std::sync::atomic::Ordering::SeqCst);
                hold.changed.notify_waiters();
            }
        }
    }
}

/// A failed model request as the wire says it: an overloaded server for a transient error
/// (429, with the delay in `retry-after-ms`), an invalid request for any other, the
/// provider's own error body; broca's transport classifies it, as it would a real one.
fn failed(error: &cortexkit_role_llm_runner::run::RunError, chat: bool) -> Answer {
    let transient = error.class == "transient";
    let status = if transient {
        "429 Too Many Requests"
    } else {
        "400 Bad Request"
    };
    let body = if chat {
        json!({"error": {"message": error.message, "type": if transient { "rate_limit_error" } else { "invalid_request_error" }, "code": error.provider_code}})
    } else {
        json!({"type": "error", "error": {"type": if transient { "rate_limit_error" } else { "invalid_request_error" }, "message": error.message}})
    };
    let mut headers = String::new();
    if let Some(secs) = error.retry_after_secs {
        headers.push_str(&format!(
            "retry-after-ms: {}\r\n",
            (secs * 1000.0).round() as u64
        ));
    }
    Answer {
        status,
        content_type: "application/json",
        pieces: vec![body.to_string()],
        hold: None,
        headers,
    }
}

/// An answer held after its first parts until the case releases it.
struct Hold {
    /// Parts streamed before the hold.
    parts: usize,
    reached: std::sync::atomic::AtomicBool,
    released: std::sync::atomic::AtomicBool,
    changed: tokio::sync::Notify,
}

/// One answer: its status, its body in pieces (a prefix, one piece per part, a suffix), and
/// the hold it is under.
struct Answer {
    status: &'static str,
    content_type: &'static str,
    pieces: Vec<String>,
    hold: Option<Arc<Hold>>,
    /// Header lines of its own (each ending in CRLF).
    headers: String,
}

/// Writes an answer: whole with its length, or, under a hold, chunked: the prefix and the
/// held parts, then (once released) the rest.
async fn write_answer(stream: &mut TcpStream, a: Answer) -> std::io::Result<()> {
    let Some(hold) = a.hold else {
        let body = a.pieces.concat();
        let head = format!(
            "HTTP/1.1 {}\r\ncontent-type: {}\r\ncontent-length: {}\r\n{}\r\n",
            a.status,
            a.content_type,
            body.len(),
            a.headers
        );
        stream.write_all(head.as_bytes()).await?;
        return stream.write_all(body.as_bytes()).await;
    };
    let head = format!(
        "HTTP/1.1 {}\r\ncontent-type: {}\r\ntransfer-encoding: chunked\r\n\r\n",
        a.status, a.content_type
    );
    stream.write_all(head.as_bytes()).await?;
    let split = (1 + hold.parts).min(a.pieces.len());
    for piece in &a.pieces[..split] {
        write_chunk(stream, piece).await?;
    }
    stream.flush().await?;
    hold.reached
        .store(true, std::sync::atomic::Ordering::SeqCst);
    hold.changed.notify_waiters();
    loop {
        let changed = hold.changed.notified();
        if hold.released.load(std::sync::atomic::Ordering::SeqCst) {
            break;
        }
        tokio::select! {
            () = changed => {}
            () = tokio::time::sleep(std::time::Duration::from_millis(20)) => {}
        }
    }
    for piece in &a.pieces[split..] {
        write_chunk(stream, piece).await?;
    }
    stream.write_all(b"0\r\n\r\n").await
}

async fn write_chunk(stream: &mut TcpStream, piece: &str) -> std::io::Result<()> {
    if piece.is_empty() {
        return Ok(());
    }
    stream
        .write_all(format!("{:x}\r\n{piece}\r\n", piece.len()).as_bytes())
        .await
}

/// Reads until a whole request head is buffered; answers its length, the body's
/// (Content-Length) and the request's path. `None` when the connection ended.
async fn read_head(stream: &mut TcpStream, buf: &mut Vec<u8>) -> Option<(usize, usize, String)> {
    loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
            let len = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(0);
            let path = head
                .lines()
                .next()
                .and_then(|l| l.split_whitespace().nth(1))
                .unwrap_or_default()
                .to_string();
            return Some((end + 4, len, path));
        }
        let mut chunk = [0u8; 16384];
        match stream.read(&mut chunk).await {
            Ok(0) | Err(_) => return None,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
}

fn event(out: &mut String, data: Value) {
    out.push_str(&format!(
        "event: {}\ndata: {data}\n\n",
        data["type"].as_str().unwrap_or("message")
    ));
}

/// The turn as a model answers a request whose output cap is `max_tokens`: when the cap is
/// below the turn's output, cut at that many tokens (a token is a word here), the output
/// usage what was produced, and finished by the length limit.
fn cut(t: &ScriptedTurn, max_tokens: Option<u64>) -> ScriptedTurn {
    let scripted = t.usage.as_ref().map(|u| u.output_tokens);
    let cut = match (max_tokens, scripted) {
        (Some(max), Some(out)) if max < out => Some(max),
        _ => None,
    };
    let mut t = t.clone();
    if let Some(max) = cut {
        let mut left = max as usize;
        for part in &mut t.parts {
            if let ScriptedPart::Text(text) = part {
                let words: Vec<&str> = text.split_whitespace().take(left).collect();
                left -= words.len();
                *text = words.join(" ");
            }
        }
        if let Some(u) = &mut t.usage {
            u.output_tokens = max;
        }
        t.finish_reason = Some("max_tokens".into());
    }
    t
}

/// One turn as Anthropic's stream: a block per part, the turn's usage at face value (absent
/// when the script has none), its finish reason as `stop_reason`.
fn render(session: &str, turn: usize, t: &ScriptedTurn) -> Vec<String> {
    let mut pieces = Vec::new();
    let mut out = String::new();
    let mut message = json!({"id": format!("msg_{session}_{turn}"), "type": "message",
        "role": "assistant", "model": session, "content": [], "stop_reason": null,
        "stop_sequence": null});
    if let Some(u) = &t.usage {
        message["usage"] = json!({"input_tokens": u.input_tokens,
            "cache_read_input_tokens": u.cache_read_tokens,
            "cache_creation_input_tokens": u.cache_write_tokens, "output_tokens": 0});
    }
    event(
        &mut out,
        json!({"type": "message_start", "message": message}),
    );
    pieces.push(std::mem::take(&mut out));
    for (index, part) in t.parts.iter().enumerate() {
        let (start, deltas) = match part {
            ScriptedPart::Text(text) => (
                json!({"type": "text", "text": ""}),
                vec![json!({"type": "text_delta", "text": text})],
            ),
            ScriptedPart::Reasoning(text) => (
                json!({"type": "thinking", "thinking": ""}),
                vec![
                    json!({"type": "thinking_delta", "thinking": text}),
                    json!({"type": "signature_delta", "signature": format!("sig-{session}-{turn}-{index}")}),
                ],
            ),
            ScriptedPart::ToolCall(call) => (
                json!({"type": "tool_use", "id": call.tool_call_id, "name": call.tool, "input": {}}),
                vec![
                    json!({"type": "input_json_delta", "partial_json": call.arguments.to_string()}),
                ],
            ),
        };
        event(
            &mut out,
            json!({"type": "content_block_start", "index": index, "content_block": start}),
        );
        for delta in deltas {
            event(
                &mut out,
                json!({"type": "content_block_delta", "index": index, "delta": delta}),
            );
        }
        event(
            &mut out,
            json!({"type": "content_block_stop", "index": index}),
        );
        pieces.push(std::mem::take(&mut out));
    }
    // Anthropic's stream always states a reason: a turn whose script names none stops the way
    // the wire says a turn with (or without) tool calls stops.
    let natural = if t
        .parts
        .iter()
        .any(|p| matches!(p, ScriptedPart::ToolCall(_)))
    {
        "tool_use"
    } else {
        "end_turn"
    };
    let reason = t.finish_reason.as_deref().unwrap_or(natural);
    let mut delta = json!({"type": "message_delta",
        "delta": {"stop_reason": reason, "stop_sequence": null}});
    if let Some(u) = &t.usage {
        delta["usage"] = json!({"output_tokens": u.output_tokens});
    }
    event(&mut out, delta);
    event(&mut out, json!({"type": "message_stop"}));
    pieces.push(out);
    pieces
}

/// One turn as OpenAI's Chat Completions stream: a chunk per part (reasoning as
/// `reasoning_content`), then the finish reason, then the usage chunk. The usage at face
/// value in the wire's own terms: `prompt_tokens` the whole input, its cached and written
/// parts in `prompt_tokens_details`, `completion_tokens` the whole output with its
/// reasoning part in `completion_tokens_details` (absent when the script reports none).
fn render_chat(session: &str, turn: usize, t: &ScriptedTurn) -> Vec<String> {
    let id = format!("chatcmpl_{session}_{turn}");
    let chunk = |delta: Value, finish: Value| {
        json!({"id": id, "object": "chat.completion.chunk", "model": session,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})
    };
    let mut chunks = vec![chunk(
        json!({"role": "assistant", "content": ""}),
        Value::Null,
    )];
    let mut calls = 0;
    for part in &t.parts {
        chunks.push(match part {
            ScriptedPart::Text(text) => chunk(json!({"content": text}), Value::Null),
            ScriptedPart::Reasoning(text) => chunk(json!({"reasoning_content": text}), Value::Null),
            ScriptedPart::ToolCall(call) => {
                calls += 1;
                chunk(
                    json!({"tool_calls": [{"index": calls - 1, "id": call.tool_call_id,
                        "type": "function", "function": {"name": call.tool,
                        "arguments": call.arguments.to_string()}}]}),
                    Value::Null,
                )
            }
        });
    }
    let natural = if calls > 0 { "tool_calls" } else { "stop" };
    let reason = match t.finish_reason.as_deref() {
        Some("max_tokens") => "length",
        Some(other) => other,
        None => natural,
    };
    chunks.push(chunk(json!({}), json!(reason)));
    if let Some(u) = &t.usage {
        let mut usage = json!({
            "prompt_tokens": u.input_tokens + u.cache_read_tokens + u.cache_write_tokens,
            "completion_tokens": u.output_tokens,
            "total_tokens": u.input_tokens + u.cache_read_tokens + u.cache_write_tokens + u.output_tokens,
            "prompt_tokens_details": {"cached_tokens": u.cache_read_tokens,
                "cache_write_tokens": u.cache_write_tokens},
        });
        if let Some(r) = u.reasoning_tokens {
            usage["completion_tokens_details"] = json!({"reasoning_tokens": r});
        }
        chunks.push(
            json!({"id": id, "object": "chat.completion.chunk", "model": session,
            "choices": [], "usage": usage}),
        );
    }
    let mut pieces: Vec<String> = chunks.iter().map(|c| format!("data: {c}\n\n")).collect();
    pieces.push("data: [DONE]\n\n".into());
    pieces
}

/// Every text a request carried, in request order, as the model received it: each text
/// part of each message (a string content whole), each tool result's text.
pub fn rendered_texts(body: &Value) -> Vec<String> {
    let mut out = Vec::new();
    if let Some(system) = body["system"].as_str() {
        out.push(system.to_string());
    }
    for m in body["messages"].as_array().into_iter().flatten() {
        match &m["content"] {
            Value::String(text) => out.push(text.clone()),
            Value::Array(blocks) => {
                for b in blocks {
                    match b["type"].as_str() {
                        Some("text") => out.extend(b["text"].as_str().map(str::to_string)),
                        Some("tool_result") => match &b["content"] {
                            Value::String(text) => out.push(text.clone()),
                            Value::Array(parts) => out.extend(
                                parts
                                    .iter()
                                    .filter_map(|p| p["text"].as_str().map(str::to_string)),
                            ),
                            _ => {}
                        },
                        _ => {}
                    }
                }
            }
            _ => {}
        }
    }
    out
}
