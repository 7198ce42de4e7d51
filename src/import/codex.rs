//! Codex's rollout JSONL: one `{timestamp, type, payload}` object per line. `session_meta`
//! names the session and its working directory; `response_item` lines are the Responses
//! API's items as the model saw them (messages, function calls and their outputs,
//! reasoning); usage comes from `token_usage_record` lines (one per response) or, in logs
//! without them, from the `last_token_usage` of `token_count` events. Everything else is
//! the harness's own bookkeeping. A bare item (no wrapper) is read as a response item.

use serde_json::Value;

use broca_protocol::{Block, Json, Usage};

use crate::episode::Episode;
use crate::{count_of, str_of, Identity, ImportError, Lines};

pub(crate) fn identify(mut lines: Lines<'_>) -> Result<Option<Identity>, ImportError> {
    while let Some(next) = lines.next_value() {
        let (_, v) = next?;
        if str_of(&v, "type") == Some("session_meta") {
            let p = v.get("payload").unwrap_or(&Value::Null);
            let session = str_of(p, "id").or_else(|| str_of(p, "session_id"));
            return Ok(session.map(|s| Identity {
                session: s.to_string(),
                cwd: str_of(p, "cwd").map(str::to_string),
            }));
        }
    }
    Ok(None)
}

/// Reads the lines into `episode`; answers the last line's number.
pub(crate) fn read(mut lines: Lines<'_>, episode: &mut Episode) -> Result<u64, ImportError> {
    let mut model: Option<String> = None;
    let mut usage_records = false;
    while let Some(next) = lines.next_value() {
        let (line, v) = next?;
        let kind = str_of(&v, "type").unwrap_or("");
        let payload = v.get("payload");
        match kind {
            "response_item" => {
                let Some(item) = payload else {
                    return Err(lines.error(line, "a response_item without its payload".into()));
                };
                response_item(&lines, line, item, episode)?;
            }
            "turn_context" => {
                if let Some(m) = payload.and_then(|p| str_of(p, "model")) {
                    model = Some(m.to_string());
                }
            }
            "token_usage_record" => {
                usage_records = true;
                let p = payload.unwrap_or(&Value::Null);
                if let Some(u) = p.get("usage").filter(|u| u.is_object()) {
                    episode.usage(
                        line,
                        usage(u),
                        Json::from_value(u),
                        model.clone(),
                        str_of(p, "response_id").map(str::to_string),
                    );
                }
            }
            "event_msg" if !usage_records => {
                let p = payload.unwrap_or(&Value::Null);
                let last_usage = p
                    .get("info")
                    .and_then(|i| i.get("last_token_usage"))
                    .filter(|u| u.is_object());
                if let (Some("token_count"), Some(u)) = (str_of(p, "type"), last_usage) {
                    episode.usage(line, usage(u), Json::from_value(u), model.clone(), None);
                }
            }
            "message"
            | "function_call"
            | "function_call_output"
            | "custom_tool_call"
            | "custom_tool_call_output"
            | "reasoning"
            | "local_shell_call" => {
                response_item(&lines, line, &v, episode)?;
            }
            _ => {}
        }
    }
    Ok(lines.last_line())
}

fn response_item(
    lines: &Lines<'_>,
    line: u64,
    item: &Value,
    episode: &mut Episode,
) -> Result<(), ImportError> {
    let call_id = || {
        str_of(item, "call_id")
            .map(str::to_string)
            .ok_or_else(|| lines.error(line, "a tool item without its call_id".into()))
    };
    match str_of(item, "type").unwrap_or("") {
        "message" => message(line, item, episode),
        "function_call" => {
            let raw = str_of(item, "arguments").unwrap_or("{}");
            let input = match Json::from_text(raw.to_string()) {
                Ok(j) if j.is_object() => j,
                _ => {
                    episode.note(
                        line,
                        "function call arguments that are not a JSON object: kept as \
                         {\"arguments\": text}",
                    );
                    Json::from_value(&serde_json::json!({ "arguments": raw }))
                }
            };
            tool_use(line, call_id()?, item, input, episode);
        }
        "custom_tool_call" => {
            let input = serde_json::json!({ "input": str_of(item, "input").unwrap_or("") });
            tool_use(line, call_id()?, item, Json::from_value(&input), episode);
        }
        "local_shell_call" => {
            let action = item.get("action").cloned().unwrap_or(Value::Null);
            let input = Json::from_value(&serde_json::json!({ "action": action }));
            let id = call_id()?;
            episode.assistant(vec![Block::ToolUse {
                id,
                name: "local_shell".into(),
                input,
            }]);
        }
        "function_call_output" | "custom_tool_call_output" => {
            let (content, failed) = match item.get("output") {
                Some(Value::String(s)) => (s.clone(), false),
                Some(o @ Value::Object(_)) => (
                    str_of(o, "content").unwrap_or("").to_string(),
                    o.get("success").and_then(Value::as_bool) == Some(false),
                ),
                _ => (String::new(), false),
            };
            let placeholder = content.trim() == "aborted" || content.starts_with("aborted by");
            episode.tool_result(line, call_id()?, content, failed, placeholder);
        }
        "reasoning" => episode.note(
            line,
            "a reasoning item (encrypted for the provider that wrote it) cannot be sent back: \
             left out",
        ),
        other => episode.note(line, format!("a `{other}` item: left out")),
    }
    Ok(())
}

fn tool_use(line: u64, id: String, item: &Value, input: Json, episode: &mut Episode) {
    let name = str_of(item, "name").unwrap_or("");
    if name.is_empty() {
        episode.note(
            line,
            format!("tool call {id} without a name: named `unknown`"),
        );
    }
    episode.assistant(vec![Block::ToolUse {
        id,
        name: if name.is_empty() { "unknown" } else { name }.to_string(),
        input,
    }]);
}

fn message(line: u64, item: &Value, episode: &mut Episode) {
    let role = str_of(item, "role").unwrap_or("");
    let parts = item
        .get("content")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or(&[]);
    let mut texts = Vec::new();
    for p in parts {
        match (str_of(p, "type"), str_of(p, "text")) {
            (Some("input_text" | "output_text" | "text"), Some(t)) => texts.push(t.to_string()),
            (Some("refusal"), _) => texts.push(str_of(p, "refusal").unwrap_or("").to_string()),
            (kind, _) => episode.note(
                line,
                format!("a message's `{}` part: left out", kind.unwrap_or("?")),
            ),
        }
    }
    match role {
        "user" => texts.into_iter().for_each(|t| episode.user_text(t)),
        "assistant" => {
            episode.assistant(texts.into_iter().map(|text| Block::Text { text }).collect())
        }
        other => episode.note(
            line,
            format!("a `{other}` message (the harness's instructions): left out"),
        ),
    }
}

/// The Responses API's counts in the canonical measures: `input_tokens` is the total
/// input, its cached part the cache read; `output_tokens` includes the reasoning.
fn usage(u: &Value) -> Usage {
    Usage {
        input: count_of(u, "input_tokens"),
        output: count_of(u, "output_tokens"),
        cache_read: count_of(u, "cached_input_tokens"),
        cache_write: count_of(u, "cache_write_input_tokens"),
        reasoning: count_of(u, "reasoning_output_tokens"),
    }
}
