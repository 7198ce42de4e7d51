//! Canonical request -> OpenAI Chat Completions request bytes (deterministic). Tool results
//! become `tool` messages right after the assistant message that called them; thinking is
//! not sent back (the API takes none); usage is asked for with `stream_options`.

use crate::json::JsonWriter;

/// This family's name for its held prefixes.
const FAMILY: &str = "openai_chat";
use crate::{size_hint, Aliases, Rendered};
use broca_protocol::{Block, Request, Role};

fn content(w: &mut JsonWriter, texts: &[&str]) {
    match texts {
        [] => {
            w.null();
        }
        [one] => {
            w.str(one);
        }
        many => {
            w.array();
            for text in many {
                w.object()
                    .field_str("type", "text")
                    .field_str("text", text)
                    .end_object();
            }
            w.end_array();
        }
    }
}

/// The messages of a transcript in Chat's shape.
fn messages(w: &mut JsonWriter, req: &Request, aliases: &Aliases) {
    w.key("messages").array();
    if let Some(system) = req.system.as_deref().filter(|s| !s.is_empty()) {
        w.object()
            .field_str("role", "system")
            .field_str("content", system)
            .end_object();
    }
    let mut texts: Vec<&str> = Vec::new();
    // Every message renders the same at every step: the session's held prefix has them.
    let limit = req.messages.len();
    crate::prefix::messages(w, FAMILY, req, aliases, limit, |w, _, m| {
        texts.clear();
        texts.extend(m.content.iter().filter_map(|b| match b {
            Block::Text { text } if !text.is_empty() => Some(text.as_str()),
            _ => None,
        }));
        match m.role {
            Role::Assistant => {
                let mut calls = m
                    .content
                    .iter()
                    .filter(|b| matches!(b, Block::ToolUse { .. }))
                    .peekable();
                if texts.is_empty() && calls.peek().is_none() {
                    return;
                }
                w.object().field_str("role", "assistant").key("content");
                content(w, &texts);
                if calls.peek().is_some() {
                    tool_calls(w, calls, aliases);
                }
                w.end_object();
            }
            Role::User => {
                for b in &m.content {
                    if let Block::ToolResult {
                        tool_use_id,
                        content,
                        ..
                    } = b
                    {
                        w.object()
                            .field_str("role", "tool")
                            .field_str("tool_call_id", tool_use_id)
                            .field_str("content", content)
                            .end_object();
                    }
                }
                if m.content.iter().any(|b| matches!(b, Block::Media(_))) {
                    w.object().field_str("role", "user").key("content");
                    media_content(w, m, req);
                    w.end_object();
                } else if !texts.is_empty() {
                    w.object().field_str("role", "user").key("content");
                    content(w, &texts);
                    w.end_object();
                }
            }
        }
    });
    w.end_array();
}

/// A user message with media, as content parts in order: its text, its images as data
/// URLs, its documents as files with their data URLs.
fn media_content(w: &mut JsonWriter, m: &broca_protocol::Message, req: &Request) {
    w.array();
    for b in &m.content {
        let text = |w: &mut JsonWriter, text: &str| {
            w.object()
                .field_str("type", "text")
                .field_str("text", text)
                .end_object();
        };
        match b {
            Block::Text { text: t } if !t.is_empty() => text(w, t),
            Block::Media(x) => match crate::MediaPart::of(x, req) {
                crate::MediaPart::Bytes { kind, mime, data } => {
                    let url = format!("data:{mime};base64,");
                    if kind == broca_protocol::media::kind::IMAGE {
                        w.object()
                            .field_str("type", "image_url")
                            .key("image_url")
                            .object()
                            .key("url")
                            .base64(&url, data)
                            .end_object()
                            .end_object();
                    } else {
                        w.object()
                            .field_str("type", "file")
                            .key("file")
                            .object()
                            .field_str("filename", &crate::file_name(x))
                            .key("file_data")
                            .base64(&url, data)
                            .end_object()
                            .end_object();
                    }
                }
                crate::MediaPart::Marker(t) => text(w, &t),
            },
            _ => {}
        }
    }
    w.end_array();
}

/// An assistant message's `tool_calls`.
fn tool_calls<'a>(w: &mut JsonWriter, calls: impl Iterator<Item = &'a Block>, aliases: &Aliases) {
    w.key("tool_calls").array();
    for b in calls {
        if let Block::ToolUse { id, name, input } = b {
            w.object()
                .field_str("id", id)
                .field_str("type", "function")
                .key("function")
                .object()
                .field_str("name", aliases.wire(name))
                .field_str("arguments", input.get())
                .end_object()
                .end_object();
        }
    }
    w.end_array();
}

/// Renders the request.
pub fn render(req: &Request, aliases: &Aliases) -> Rendered {
    let g = &req.generation;
    let mut w = JsonWriter::with_capacity(size_hint(req));
    w.object().field_str("model", &req.model);
    messages(&mut w, req, aliases);
    let strict = req.shape.as_ref().and_then(|s| s.strict_tool.as_deref());
    if !req.tools.is_empty() {
        w.key("tools").array();
        for t in req.tools.iter() {
            w.object()
                .field_str("type", "function")
                .key("function")
                .object()
                .field_str("name", aliases.wire(&t.name));
            if !t.description.is_empty() {
                w.field_str("description", &t.description);
            }
            w.key("parameters").serde(&t.input_schema);
            if strict == Some(t.name.as_str()) {
                w.key("strict").bool(true);
            }
            w.end_object().end_object();
        }
        w.end_array();
    }
    // An enforced final-text shape: `response_format` json_schema, strict.
    if let Some(shape) = req.shape.as_ref() {
        if let Some(schema) = &shape.final_text {
            w.key("response_format")
                .object()
                .field_str("type", "json_schema")
                .key("json_schema")
                .object()
                .field_str("name", &shape.name)
                .key("schema")
                .serde(schema)
                .key("strict")
                .bool(true)
                .end_object()
                .end_object();
        }
    }
    if let Some(n) = g.max_output_tokens {
        w.key("max_completion_tokens").u64(n);
    }
    crate::json::sampling(&mut w, g, Some("stop"));
    w.key("stream")
        .bool(true)
        .key("stream_options")
        .object()
        .key("include_usage")
        .bool(true)
        .end_object()
        .end_object();
    Rendered {
        path: "/v1/chat/completions".into(),
        headers: vec![
            ("content-type".into(), "application/json".into()),
            ("accept".into(), "text/event-stream".into()),
        ],
        body: w.finish(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sample_request;

    #[test]
    fn the_sample_renders_to_the_documented_shape_byte_for_byte() {
        let (req, aliases, alias) = crate::sample_with_alias();
        let r = render(&req, &aliases);
        let expected = format!(
            concat!(
                r#"{{"model":"m-1","messages":[{{"role":"system","content":"Be brief."}},"#,
                r#"{{"role":"user","content":"Weather in Paris?"}},"#,
                r#"{{"role":"assistant","content":"Checking.","tool_calls":[{{"id":"call_1","type":"function","function":{{"name":"{alias}","arguments":"{{\"city\":\"Paris\"}}"}}}}]}},"#,
                r#"{{"role":"tool","tool_call_id":"call_1","content":"18C"}}],"#,
                r#""tools":[{{"type":"function","function":{{"name":"{alias}","description":"Current weather","parameters":{{"properties":{{"city":{{"type":"string"}}}},"type":"object"}}}}}},"#,
                r#"{{"type":"function","function":{{"name":"clock","parameters":{{"type":"object"}}}}}}],"#,
                r#""max_completion_tokens":256,"temperature":0.5,"stream":true,"stream_options":{{"include_usage":true}}}}"#
            ),
            alias = alias
        );
        assert_eq!(String::from_utf8(r.body.clone()).unwrap(), expected);
        assert_eq!(render(&req, &aliases), r);
        assert_eq!(r.path, "/v1/chat/completions");
    }

    #[test]
    fn an_assistant_turn_of_only_tool_calls_has_null_content() {
        let mut req = sample_request();
        std::sync::Arc::make_mut(&mut req.messages[1])
            .content
            .retain(|b| matches!(b, Block::ToolUse { .. }));
        let body: serde_json::Value =
            serde_json::from_slice(&render(&req, &Aliases::default()).body).unwrap();
        assert!(body["messages"][2]["content"].is_null(), "{body}");
        assert_eq!(
            body["messages"][2]["tool_calls"][0]["function"]["name"],
            "weather.get"
        );
    }
}
