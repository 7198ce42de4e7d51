//! Canonical request -> Anthropic Messages request bytes. Deterministic: fields render in a
//! fixed order and the tool schemas' keys are sorted, so the same request gives the same bytes
//! on every call and on replay.
//!
//! What the API refuses is left out rather than sent: empty text blocks, thinking without its
//! signature (a step from another family), messages left empty. Cache breakpoints (with the
//! run's cache policy on) go on the last tool, the system text and the last block.

use std::borrow::Cow;

use crate::json::JsonWriter;
use crate::{size_hint, Aliases, MediaPart, Rendered};

/// This family's name for its held prefixes.
const FAMILY: &str = "anthropic";
use broca_protocol::{Block, Request, Role};

/// The output cap sent when the run sets none: the API requires one, and every current
/// model accepts this many.
pub const DEFAULT_MAX_TOKENS: u64 = 4096;

/// The API version header value.
pub const API_VERSION: &str = "2023-06-01";

/// A content block as rendered (borrowed from the request).
enum WBlock<'a> {
    Text(&'a str),
    Thinking {
        thinking: &'a str,
        signature: &'a str,
    },
    ToolUse {
        id: Cow<'a, str>,
        name: &'a str,
        input: &'a str,
    },
    ToolResult {
        tool_use_id: Cow<'a, str>,
        content: &'a str,
        is_error: bool,
    },
    /// An image or a document block (or, for media its model does not take, its marker).
    Media(MediaPart<'a>),
}

/// A tool-use id the API accepts (`[A-Za-z0-9_-]+`): ids from other families may carry
/// other characters; those become `_` (the same id always maps the same way).
fn safe_id(id: &str) -> Cow<'_, str> {
    if !id.is_empty()
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
    {
        Cow::Borrowed(id)
    } else if id.is_empty() {
        Cow::Borrowed("_")
    } else {
        Cow::Owned(
            id.chars()
                .map(|c| {
                    if c.is_ascii_alphanumeric() || c == '-' {
                        c
                    } else {
                        '_'
                    }
                })
                .collect(),
        )
    }
}

/// The blocks of `m` the API takes, as rendered.
fn blocks<'a>(
    m: &'a broca_protocol::Message,
    aliases: &'a Aliases,
    req: &'a Request,
) -> impl Iterator<Item = WBlock<'a>> + 'a {
    m.content.iter().filter_map(move |b| match b {
        Block::Text { text } if !text.is_empty() => Some(WBlock::Text(text)),
        Block::Text { .. } => None,
        Block::Thinking {
            text,
            signature: Some(signature),
        } if m.role == Role::Assistant => Some(WBlock::Thinking {
            thinking: text,
            signature,
        }),
        Block::Thinking { .. } => None,
        Block::ToolUse { id, name, input } => Some(WBlock::ToolUse {
            id: safe_id(id),
            name: aliases.wire(name),
            input: input.get(),
        }),
        Block::ToolResult {
            tool_use_id,
            content,
            is_error,
        } => Some(WBlock::ToolResult {
            tool_use_id: safe_id(tool_use_id),
            content,
            is_error: *is_error,
        }),
        Block::Media(x) => Some(WBlock::Media(MediaPart::of(x, req))),
    })
}

fn ephemeral(w: &mut JsonWriter) {
    w.key("cache_control")
        .object()
        .field_str("type", "ephemeral")
        .end_object();
}

fn write_block(w: &mut JsonWriter, b: &WBlock<'_>, cache: bool) {
    w.object();
    match b {
        WBlock::Text(text) => {
            w.field_str("type", "text").field_str("text", text);
        }
        WBlock::Thinking {
            thinking,
            signature,
        } => {
            w.field_str("type", "thinking")
                .field_str("thinking", thinking)
                .field_str("signature", signature);
        }
        WBlock::ToolUse { id, name, input } => {
            w.field_str("type", "tool_use")
                .field_str("id", id)
                .field_str("name", name)
                .key("input")
                .raw(input);
        }
        WBlock::ToolResult {
            tool_use_id,
            content,
            is_error,
        } => {
            w.field_str("type", "tool_result")
                .field_str("tool_use_id", tool_use_id)
                .field_str("content", content);
            if *is_error {
                w.key("is_error").bool(true);
            }
        }
        WBlock::Media(MediaPart::Bytes { kind, mime, data }) => {
            let kind = if *kind == broca_protocol::media::kind::IMAGE {
                "image"
            } else {
                "document"
            };
            w.field_str("type", kind)
                .key("source")
                .object()
                .field_str("type", "base64")
                .field_str("media_type", mime)
                .key("data")
                .base64("", data)
                .end_object();
        }
        WBlock::Media(MediaPart::Marker(text)) => {
            w.field_str("type", "text").field_str("text", text);
        }
    }
    // Thinking blocks take no cache breakpoint.
    if cache && !matches!(b, WBlock::Thinking { .. }) {
        ephemeral(w);
    }
    w.end_object();
}

/// The tool whose input the provider enforces (rendered `strict`), if any.
fn strict_tool(req: &Request) -> Option<&str> {
    req.shape.as_ref().and_then(|s| s.strict_tool.as_deref())
}

/// The tools offered (the enforced one `strict`), the last one a cache breakpoint.
fn tools(w: &mut JsonWriter, req: &Request, aliases: &Aliases) {
    if req.tools.is_empty() {
        return;
    }
    w.key("tools").array();
    for (i, t) in req.tools.iter().enumerate() {
        w.object().field_str("name", aliases.wire(&t.name));
        if !t.description.is_empty() {
            w.field_str("description", &t.description);
        }
        w.key("input_schema").serde(&t.input_schema);
        if strict_tool(req) == Some(t.name.as_str()) {
            w.key("strict").bool(true);
        }
        if req.prompt_cache && i + 1 == req.tools.len() {
            ephemeral(w);
        }
        w.end_object();
    }
    w.end_array();
}

/// Renders the request.
pub fn render(req: &Request, aliases: &Aliases) -> Rendered {
    // Messages with nothing the API takes are left out; the last one kept carries the
    // cache breakpoint on its last block.
    let kept =
        |m: &&std::sync::Arc<broca_protocol::Message>| blocks(m, aliases, req).next().is_some();
    let last = req.messages.iter().rposition(|m| kept(&m));
    let g = &req.generation;
    let mut w = JsonWriter::with_capacity(size_hint(req));
    w.object()
        .field_str("model", &req.model)
        .key("max_tokens")
        .u64(g.max_output_tokens.unwrap_or(DEFAULT_MAX_TOKENS));
    if let Some(system) = req.system.as_deref().filter(|s| !s.is_empty()) {
        w.key("system").array();
        write_block(&mut w, &WBlock::Text(system), req.prompt_cache);
        w.end_array();
    }
    w.key("messages").array();
    // The messages before the last kept one render the same at every step: the session's
    // held prefix has them.
    let limit = last.unwrap_or(0);
    crate::prefix::messages(&mut w, FAMILY, req, aliases, limit, |w, i, m| {
        if !kept(&m) {
            return;
        }
        let role = match m.role {
            Role::User => "user",
            Role::Assistant => "assistant",
        };
        w.object().field_str("role", role).key("content").array();
        let mut content = blocks(m, aliases, req).peekable();
        while let Some(b) = content.next() {
            let cache = req.prompt_cache && Some(i) == last && content.peek().is_none();
            write_block(w, &b, cache);
        }
        w.end_array().end_object();
    });
    w.end_array();
    tools(&mut w, req, aliases);
    // An enforced final-text shape: Anthropic's structured outputs (`output_config.format`).
    if let Some(schema) = req.shape.as_ref().and_then(|s| s.final_text.as_ref()) {
        w.key("output_config")
            .object()
            .key("format")
            .object()
            .field_str("type", "json_schema")
            .key("schema")
            .serde(schema)
            .end_object()
            .end_object();
    }
    crate::json::sampling(&mut w, g, Some("stop_sequences"));
    w.key("stream").bool(true).end_object();
    Rendered {
        path: "/v1/messages".into(),
        headers: vec![
            ("content-type".into(), "application/json".into()),
            ("accept".into(), "text/event-stream".into()),
            ("anthropic-version".into(), API_VERSION.into()),
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
        let req = sample_request();
        let aliases = Aliases::for_tools(&req.tools);
        let r = render(&req, &aliases);
        let alias = aliases.wire("weather.get");
        let expected = format!(
            concat!(
                r#"{{"model":"m-1","max_tokens":256,"#,
                r#""system":[{{"type":"text","text":"Be brief.","cache_control":{{"type":"ephemeral"}}}}],"#,
                r#""messages":[{{"role":"user","content":[{{"type":"text","text":"Weather in Paris?"}}]}},"#,
                r#"{{"role":"assistant","content":[{{"type":"thinking","thinking":"need the tool","signature":"sig=="}},"#,
                r#"{{"type":"text","text":"Checking."}},"#,
                r#"{{"type":"tool_use","id":"call_1","name":"{alias}","input":{{"city":"Paris"}}}}]}},"#,
                r#"{{"role":"user","content":[{{"type":"tool_result","tool_use_id":"call_1","content":"18C","cache_control":{{"type":"ephemeral"}}}}]}}],"#,
                r#""tools":[{{"name":"{alias}","description":"Current weather","input_schema":{{"properties":{{"city":{{"type":"string"}}}},"type":"object"}}}},"#,
                r#"{{"name":"clock","input_schema":{{"type":"object"}},"cache_control":{{"type":"ephemeral"}}}}],"#,
                r#""temperature":0.5,"stream":true}}"#
            ),
            alias = alias
        );
        assert_eq!(String::from_utf8(r.body.clone()).unwrap(), expected);
        assert_eq!(render(&req, &aliases), r, "rendering is deterministic");
        assert_eq!(r.path, "/v1/messages");
    }

    #[test]
    fn what_the_api_refuses_is_left_out() {
        let mut req = sample_request();
        req.prompt_cache = false;
        // Thinking from another family (no signature), an empty text, an id with a dot.
        std::sync::Arc::make_mut(&mut req.messages[1]).content[0] = Block::Thinking {
            text: "x".into(),
            signature: None,
        };
        std::sync::Arc::make_mut(&mut req.messages[1]).content[1] = Block::Text {
            text: String::new(),
        };
        if let Block::ToolUse { id, .. } =
            &mut std::sync::Arc::make_mut(&mut req.messages[1]).content[2]
        {
            *id = "fc.1".into();
        }
        let body: serde_json::Value =
            serde_json::from_slice(&render(&req, &Aliases::default()).body).unwrap();
        let assistant = &body["messages"][1]["content"];
        assert_eq!(assistant.as_array().unwrap().len(), 1, "{assistant}");
        assert_eq!(assistant[0]["id"], "fc_1");
        assert!(!body.to_string().contains("cache_control"));
        assert_eq!(body["max_tokens"], 256);
        req.generation.max_output_tokens = None;
        let body: serde_json::Value =
            serde_json::from_slice(&render(&req, &Aliases::default()).body).unwrap();
        assert_eq!(body["max_tokens"], DEFAULT_MAX_TOKENS);
    }
}
