//! Canonical request -> OpenAI Responses request bytes (deterministic). The system text is
//! `instructions`; messages, function calls and their outputs are input items; nothing is
//! stored on the provider's side (`store: false`). Thinking is not sent back, and the API has
//! no stop sequences.

use crate::json::JsonWriter;
use crate::{size_hint, Aliases, Rendered};
use broca_protocol::{Block, Request, Role};

/// This family's name for its held prefixes.
const FAMILY: &str = "openai_responses";

/// Renders the request.
pub fn render(req: &Request, aliases: &Aliases) -> Rendered {
    let g = &req.generation;
    let mut w = JsonWriter::with_capacity(size_hint(req));
    w.object().field_str("model", &req.model);
    if let Some(system) = req.system.as_deref().filter(|s| !s.is_empty()) {
        w.field_str("instructions", system);
    }
    w.key("input").array();
    // Every message renders the same at every step: the session's held prefix has them.
    let limit = req.messages.len();
    crate::prefix::messages(&mut w, FAMILY, req, aliases, limit, |w, _, m| {
        input_items(w, m, aliases, req)
    });
    w.end_array();
    if !req.tools.is_empty() {
        tools(&mut w, req, aliases);
    }
    if let Some(n) = g.max_output_tokens {
        w.key("max_output_tokens").u64(n);
    }
    // An enforced final-text shape: `text.format` json_schema, strict.
    if let Some(shape) = req.shape.as_ref() {
        if let Some(schema) = &shape.final_text {
            w.key("text")
                .object()
                .key("format")
                .object()
                .field_str("type", "json_schema")
                .field_str("name", &shape.name)
                .key("schema")
                .serde(schema)
                .key("strict")
                .bool(true)
                .end_object()
                .end_object();
        }
    }
    crate::json::sampling(&mut w, g, None);
    w.key("store")
        .bool(false)
        .key("stream")
        .bool(true)
        .end_object();
    Rendered {
        path: "/v1/responses".into(),
        headers: vec![
            ("content-type".into(), "application/json".into()),
            ("accept".into(), "text/event-stream".into()),
        ],
        body: w.finish(),
    }
}

/// One message's input items: its text runs become message items; calls and outputs are
/// items of their own, in the transcript's order.
fn input_items(w: &mut JsonWriter, m: &broca_protocol::Message, aliases: &Aliases, req: &Request) {
    let (role, part) = match m.role {
        Role::User => ("user", "input_text"),
        Role::Assistant => ("assistant", "output_text"),
    };
    let mut open = false;
    let open_message = |w: &mut JsonWriter, open: &mut bool| {
        if !*open {
            w.object()
                .field_str("type", "message")
                .field_str("role", role)
                .key("content")
                .array();
            *open = true;
        }
    };
    for b in &m.content {
        match b {
            Block::Text { text } if !text.is_empty() => {
                open_message(w, &mut open);
                w.object()
                    .field_str("type", part)
                    .field_str("text", text)
                    .end_object();
            }
            Block::Media(x) => {
                open_message(w, &mut open);
                media_part(w, x, req, part);
            }
            Block::ToolUse { id, name, input } => {
                if std::mem::take(&mut open) {
                    w.end_array().end_object();
                }
                w.object()
                    .field_str("type", "function_call")
                    .field_str("call_id", id)
                    .field_str("name", aliases.wire(name))
                    .field_str("arguments", input.get())
                    .end_object();
            }
            Block::ToolResult {
                tool_use_id,
                content,
                ..
            } => {
                if std::mem::take(&mut open) {
                    w.end_array().end_object();
                }
                w.object()
                    .field_str("type", "function_call_output")
                    .field_str("call_id", tool_use_id)
                    .field_str("output", content)
                    .end_object();
            }
            Block::Text { .. } | Block::Thinking { .. } => {}
        }
    }
    if open {
        w.end_array().end_object();
    }
}

/// A media block of a message: an image as a data URL; a document as a file with its data
/// URL; one whose bytes are absent as its marker, a `part` of text.
fn media_part(w: &mut JsonWriter, x: &broca_protocol::media::Media, req: &Request, part: &str) {
    match crate::MediaPart::of(x, req) {
        crate::MediaPart::Bytes { kind, mime, data } => {
            let url = format!("data:{mime};base64,");
            if kind == broca_protocol::media::kind::IMAGE {
                w.object()
                    .field_str("type", "input_image")
                    .key("image_url")
                    .base64(&url, data)
                    .end_object();
            } else {
                w.object()
                    .field_str("type", "input_file")
                    .field_str("filename", &crate::file_name(x))
                    .key("file_data")
                    .base64(&url, data)
                    .end_object();
            }
        }
        crate::MediaPart::Marker(text) => {
            w.object()
                .field_str("type", part)
                .field_str("text", &text)
                .end_object();
        }
    }
}

/// The tools offered, each a strict-off function.
fn tools(w: &mut JsonWriter, req: &Request, aliases: &Aliases) {
    w.key("tools").array();
    for t in req.tools.iter() {
        w.object()
            .field_str("type", "function")
            .field_str("name", aliases.wire(&t.name));
        if !t.description.is_empty() {
            w.field_str("description", &t.description);
        }
        let strict = req.shape.as_ref().and_then(|s| s.strict_tool.as_deref());
        w.key("parameters")
            .serde(&t.input_schema)
            .key("strict")
            .bool(strict == Some(t.name.as_str()))
            .end_object();
    }
    w.end_array();
}

/// The WebSocket mode's first message: the same request as a `response.create` event.
pub fn websocket_message(rendered: &Rendered) -> String {
    let mut body: serde_json::Map<String, serde_json::Value> =
        serde_json::from_slice(&rendered.body).expect("a rendered body is a JSON object");
    body.remove("stream");
    body.insert("type".into(), "response.create".into());
    serde_json::to_string(&body).expect("a map serializes")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sample_renders_to_the_documented_shape_byte_for_byte() {
        let (req, aliases, alias) = crate::sample_with_alias();
        let r = render(&req, &aliases);
        let expected = format!(
            concat!(
                r#"{{"model":"m-1","instructions":"Be brief.","input":["#,
                r#"{{"type":"message","role":"user","content":[{{"type":"input_text","text":"Weather in Paris?"}}]}},"#,
                r#"{{"type":"message","role":"assistant","content":[{{"type":"output_text","text":"Checking."}}]}},"#,
                r#"{{"type":"function_call","call_id":"call_1","name":"{alias}","arguments":"{{\"city\":\"Paris\"}}"}},"#,
                r#"{{"type":"function_call_output","call_id":"call_1","output":"18C"}}],"#,
                r#""tools":[{{"type":"function","name":"{alias}","description":"Current weather","parameters":{{"properties":{{"city":{{"type":"string"}}}},"type":"object"}},"strict":false}},"#,
                r#"{{"type":"function","name":"clock","parameters":{{"type":"object"}},"strict":false}}],"#,
                r#""max_output_tokens":256,"temperature":0.5,"store":false,"stream":true}}"#
            ),
            alias = alias
        );
        assert_eq!(String::from_utf8(r.body.clone()).unwrap(), expected);
        assert_eq!(render(&req, &aliases), r);
        let ws: serde_json::Value = serde_json::from_str(&websocket_message(&r)).unwrap();
        assert_eq!(ws["type"], "response.create");
        assert!(ws.get("stream").is_none());
        assert_eq!(ws["input"][3]["output"], "18C");
    }
}
