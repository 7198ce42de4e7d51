//! The scripted model: a loopback HTTP/1.1 server speaking Anthropic's Messages API (SSE),
//! outside broca's process. A request's `model` names its session (the adapter's sends use
//! `anthropic/<session>`); it is answered with the session's scripted turn, the turn picked
//! by how many assistant messages the request carries (so a step redone after a crash gets
//! the same turn, and the next step the next one). Every request is recorded as it arrived:
//! the suite observes model requests here, never from broca's replies.

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
            let Some((head_len, body_len)) = read_head(&mut stream, &mut buf).await else {
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
            let (status, content_type, answer) = self.answer(body);
            let head = format!(
                "HTTP/1.1 {status}\r\ncontent-type: {content_type}\r\ncontent-length: {}\r\n\r\n",
                answer.len()
            );
            if stream.write_all(head.as_bytes()).await.is_err()
                || stream.write_all(answer.as_bytes()).await.is_err()
            {
                return;
            }
        }
    }

    fn answer(&self, body: Value) -> (&'static str, &'static str, String) {
        let session = body["model"].as_str().unwrap_or_default().to_string();
        let turn = body["messages"]
            .as_array()
            .map_or(0, |m| m.iter().filter(|m| m["role"] == "assistant").count());
        let mut sessions = self.sessions.lock().unwrap();
        let s = sessions.entry(session.clone()).or_default();
        s.requests.push(body.clone());
        let Some(t) = s.script.turns.get(turn) else {
            let e = json!({"type": "error", "error": {"type": "invalid_request_error",
                "message": format!("the script of {session} has no turn {turn}")}});
            return ("400 Bad Request", "application/json", e.to_string());
        };
        let max = body["max_tokens"].as_u64();
        (
            "200 OK",
            "text/event-stream",
            render(&session, turn, t, max),
        )
    }
}

/// Reads until a whole request head is buffered; answers its length and the body's
/// (Content-Length). `None` when the connection ended.
async fn read_head(stream: &mut TcpStream, buf: &mut Vec<u8>) -> Option<(usize, usize)> {
    loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
            let len = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(0);
            return Some((end + 4, len));
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

/// One turn as Anthropic's stream: a block per part, the turn's usage at face value (absent
/// when the script has none), its finish reason as `stop_reason`. A request whose `max_tokens`
/// is below the turn's output is answered as a model would: cut at that many tokens (a token
/// is a word here), the output usage what was produced, and `stop_reason: max_tokens`.
fn render(session: &str, turn: usize, t: &ScriptedTurn, max_tokens: Option<u64>) -> String {
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
    let t = &t;
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
    out
}
