//! Canonical request -> Gemini `GenerateContentRequest` bytes (deterministic). The assistant
//! is the `model` role; a tool result is a `functionResponse` part of a `user` turn, named
//! after the call it answers; thought parts and every `thoughtSignature` go back byte for byte
//! where they came from (a signature on a text or function-call part is kept as a Thinking
//! block without text just before that part's block). Tool schemas go as
//! `parametersJsonSchema` (JSON Schema as it is).

use crate::json::JsonWriter;
use crate::{size_hint, Aliases};
use broca_protocol::{Block, Request, Role};

/// Ids broca made for calls the provider sent without one: never sent back as ids.
pub const SYNTHETIC_ID_PREFIX: &str = "gemini-call-";

fn part_signature(w: &mut JsonWriter, signature: Option<&str>) {
    if let Some(s) = signature {
        w.field_str("thoughtSignature", s);
    }
}

/// The name of the call `id` that a tool result in message `at` answers: a tool result
/// names the function it answers. Sought from the message before it backwards (where the
/// call nearly always is).
fn call_name<'a>(req: &'a Request, at: usize, id: &str) -> Option<&'a str> {
    req.messages[..at]
        .iter()
        .rev()
        .flat_map(|m| m.content.iter().rev())
        .find_map(|b| match b {
            Block::ToolUse { id: i, name, .. } if i == id => Some(name.as_str()),
            _ => None,
        })
}

/// The `contents` of a transcript.
fn contents(w: &mut JsonWriter, req: &Request, aliases: &Aliases) {
    w.key("contents").array();
    for (at, m) in req.messages.iter().enumerate() {
        let role = match m.role {
            Role::Assistant => "model",
            Role::User => "user",
        };
        if !m.content.iter().any(renders) {
            continue;
        }
        w.object().field_str("role", role).key("parts").array();
        let mut pending: Option<&str> = None;
        for b in &m.content {
            match b {
                Block::Thinking { text, signature } if text.is_empty() => {
                    if let Some(earlier) = pending.replace_if(signature.as_deref()) {
                        // Two signatures in a row: the first had no part after it.
                        w.object().field_str("text", "");
                        part_signature(w, Some(earlier));
                        w.end_object();
                    }
                }
                Block::Thinking { text, signature } => {
                    w.object().key("thought").bool(true).field_str("text", text);
                    part_signature(w, signature.as_deref().or(pending.take()));
                    w.end_object();
                }
                Block::Text { text } => {
                    if text.is_empty() && pending.is_none() {
                        continue;
                    }
                    w.object().field_str("text", text);
                    part_signature(w, pending.take());
                    w.end_object();
                }
                Block::ToolUse { id, name, input } => {
                    function_call(w, id, aliases.wire(name), input.get());
                    part_signature(w, pending.take());
                    w.end_object();
                }
                Block::ToolResult {
                    tool_use_id,
                    content,
                    is_error,
                } => {
                    let name = aliases.wire(call_name(req, at, tool_use_id).unwrap_or(""));
                    function_response(w, tool_use_id, name, content, *is_error);
                }
                Block::Media(x) => inline_media(w, x, req),
            }
        }
        if let Some(s) = pending {
            w.object().field_str("text", "");
            part_signature(w, Some(s));
            w.end_object();
        }
        w.end_array().end_object();
    }
    w.end_array();
}

/// Whether a block renders a part: text or reasoning that says something (a signature
/// counts), any other block.
fn renders(b: &Block) -> bool {
    match b {
        Block::Text { text } => !text.is_empty(),
        Block::Thinking { text, signature } => !text.is_empty() || signature.is_some(),
        _ => true,
    }
}

/// A media block, inline: its type and its bytes in base64 (its marker where the bytes are
/// absent).
fn inline_media(w: &mut JsonWriter, x: &broca_protocol::media::Media, req: &Request) {
    match crate::MediaPart::of(x, req) {
        crate::MediaPart::Bytes { mime, data, .. } => {
            w.object()
                .key("inlineData")
                .object()
                .field_str("mimeType", mime)
                .key("data")
                .base64("", data)
                .end_object()
                .end_object();
        }
        crate::MediaPart::Marker(text) => {
            w.object().field_str("text", &text).end_object();
        }
    }
}

/// A `functionCall` part, left open for its signature (a made-up id is not sent back).
fn function_call(w: &mut JsonWriter, id: &str, name: &str, args: &str) {
    w.object().key("functionCall").object();
    if !id.starts_with(SYNTHETIC_ID_PREFIX) {
        w.field_str("id", id);
    }
    w.field_str("name", name).key("args").raw(args).end_object();
}

/// A `functionResponse` part: the call's output, or its error.
fn function_response(w: &mut JsonWriter, id: &str, name: &str, content: &str, is_error: bool) {
    w.object().key("functionResponse").object();
    if !id.starts_with(SYNTHETIC_ID_PREFIX) {
        w.field_str("id", id);
    }
    w.field_str("name", name)
        .key("response")
        .object()
        .field_str(if is_error { "error" } else { "output" }, content)
        .end_object()
        .end_object()
        .end_object();
}

trait ReplaceIf<'a> {
    /// Sets the value when `new` is some; returns what was there if it was replaced.
    fn replace_if(&mut self, new: Option<&'a str>) -> Option<&'a str>;
}

impl<'a> ReplaceIf<'a> for Option<&'a str> {
    fn replace_if(&mut self, new: Option<&'a str>) -> Option<&'a str> {
        match new {
            Some(n) => self.replace(n),
            None => None,
        }
    }
}

/// The request body.
pub fn body(req: &Request, aliases: &Aliases) -> Vec<u8> {
    let mut w = JsonWriter::with_capacity(size_hint(req));
    w.object();
    write_request(&mut w, req, aliases);
    w.end_object();
    w.finish()
}

/// The fields of a `GenerateContentRequest` (inside an object the caller opened: Code Assist
/// wraps them in its envelope).
pub(crate) fn write_request(w: &mut JsonWriter, req: &Request, aliases: &Aliases) {
    contents(w, req, aliases);
    if let Some(system) = req.system.as_deref().filter(|s| !s.is_empty()) {
        w.key("systemInstruction")
            .object()
            .key("parts")
            .array()
            .object()
            .field_str("text", system)
            .end_object()
            .end_array()
            .end_object();
    }
    if !req.tools.is_empty() {
        w.key("tools")
            .array()
            .object()
            .key("functionDeclarations")
            .array();
        for t in req.tools.iter() {
            w.object().field_str("name", aliases.wire(&t.name));
            if !t.description.is_empty() {
                w.field_str("description", &t.description);
            }
            w.key("parametersJsonSchema")
                .serde(&t.input_schema)
                .end_object();
        }
        w.end_array().end_object().end_array();
    }
    let schema = req.shape.as_ref().and_then(|s| s.final_text.as_ref());
    crate::json::camel_generation(
        w,
        &req.generation,
        "generationConfig",
        "maxOutputTokens",
        schema,
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sample_request;
    use broca_protocol::Message;
    use std::sync::Arc;

    #[test]
    fn the_sample_renders_to_the_documented_shape_byte_for_byte() {
        let (req, aliases, alias) = crate::sample_with_alias();
        let got = String::from_utf8(body(&req, &aliases)).unwrap();
        let expected = format!(
            concat!(
                r#"{{"contents":[{{"role":"user","parts":[{{"text":"Weather in Paris?"}}]}},"#,
                r#"{{"role":"model","parts":[{{"thought":true,"text":"need the tool","thoughtSignature":"sig=="}},{{"text":"Checking."}},{{"functionCall":{{"id":"call_1","name":"{alias}","args":{{"city":"Paris"}}}}}}]}},"#,
                r#"{{"role":"user","parts":[{{"functionResponse":{{"id":"call_1","name":"{alias}","response":{{"output":"18C"}}}}}}]}}],"#,
                r#""systemInstruction":{{"parts":[{{"text":"Be brief."}}]}},"#,
                r#""tools":[{{"functionDeclarations":[{{"name":"{alias}","description":"Current weather","parametersJsonSchema":{{"properties":{{"city":{{"type":"string"}}}},"type":"object"}}}},"#,
                r#"{{"name":"clock","parametersJsonSchema":{{"type":"object"}}}}]}}],"#,
                r#""generationConfig":{{"maxOutputTokens":256,"temperature":0.5}}}}"#
            ),
            alias = alias
        );
        assert_eq!(got, expected);
        assert_eq!(body(&req, &aliases), got.as_bytes(), "deterministic");
    }

    #[test]
    fn thought_signatures_go_back_on_the_parts_they_came_with() {
        let mut req = sample_request();
        let m = Arc::make_mut(&mut req.messages[1]);
        m.content = vec![
            Block::Thinking {
                text: "Let me look.".into(),
                signature: Some("sig-thought==".into()),
            },
            Block::Thinking {
                text: String::new(),
                signature: Some("sig-call==".into()),
            },
            Block::ToolUse {
                id: format!("{SYNTHETIC_ID_PREFIX}0-0"),
                name: "weather.get".into(),
                input: broca_protocol::Json::from_text(r#"{"city":"Paris"}"#.into()).unwrap(),
            },
        ];
        let r = Arc::make_mut(&mut req.messages[2]);
        r.content = vec![Block::ToolResult {
            tool_use_id: format!("{SYNTHETIC_ID_PREFIX}0-0"),
            content: "no such city".into(),
            is_error: true,
        }];
        req.messages.push(Arc::new(Message::user_text("thanks")));
        let body: serde_json::Value =
            serde_json::from_slice(&body(&req, &Aliases::default())).unwrap();
        let model = &body["contents"][1]["parts"];
        assert_eq!(
            model[0],
            serde_json::json!({"thought": true, "text": "Let me look.", "thoughtSignature": "sig-thought=="})
        );
        assert_eq!(
            model[1],
            serde_json::json!({"functionCall": {"name": "weather.get", "args": {"city": "Paris"}}, "thoughtSignature": "sig-call=="}),
            "a made-up id is not sent; the signature rides on its call"
        );
        assert_eq!(
            body["contents"][2]["parts"][0],
            serde_json::json!({"functionResponse": {"name": "weather.get", "response": {"error": "no such city"}}})
        );
    }
}
