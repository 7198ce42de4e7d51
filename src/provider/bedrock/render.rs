//! Canonical request -> Bedrock `ConverseStream` request bytes (deterministic). Tool calls are
//! `toolUse` blocks with the caller's `toolUseId`; a tool result is a `toolResult` block of a
//! user turn (`status: error` for an error result); reasoning goes back as `reasoningContent`
//! with its signature, byte for byte; tool schemas go as `inputSchema.json`.

use crate::json::JsonWriter;
use crate::{size_hint, Aliases, MediaPart};
use broca_protocol::{Block, Request, Role};

fn messages(w: &mut JsonWriter, req: &Request, aliases: &Aliases) {
    w.key("messages").array();
    for m in &req.messages {
        let blocks: Vec<&Block> = m
            .content
            .iter()
            .filter(|b| match b {
                Block::Text { text } => !text.is_empty(),
                // A reasoning block goes back only with the signature that proves it.
                Block::Thinking { signature, .. } => signature.is_some(),
                _ => true,
            })
            .collect();
        if blocks.is_empty() {
            continue;
        }
        let role = match m.role {
            Role::Assistant => "assistant",
            Role::User => "user",
        };
        w.object().field_str("role", role).key("content").array();
        for b in blocks {
            block(w, b, aliases, req);
        }
        w.end_array().end_object();
    }
    w.end_array();
}

/// One content block.
fn block(w: &mut JsonWriter, b: &Block, aliases: &Aliases, req: &Request) {
    w.object();
    match b {
        Block::Text { text } => {
            w.field_str("text", text);
        }
        Block::Thinking { text, signature } => {
            w.key("reasoningContent")
                .object()
                .key("reasoningText")
                .object()
                .field_str("text", text);
            if let Some(s) = signature {
                w.field_str("signature", s);
            }
            w.end_object().end_object();
        }
        Block::ToolUse { id, name, input } => {
            w.key("toolUse")
                .object()
                .field_str("toolUseId", id)
                .field_str("name", aliases.wire(name))
                .key("input")
                .raw(input.get())
                .end_object();
        }
        Block::ToolResult {
            tool_use_id,
            content,
            is_error,
        } => {
            w.key("toolResult")
                .object()
                .field_str("toolUseId", tool_use_id)
                .key("content")
                .array()
                .object()
                .field_str("text", content)
                .end_object()
                .end_array();
            if *is_error {
                w.field_str("status", "error");
            }
            w.end_object();
        }
        Block::Media(m) => match MediaPart::of(m, req) {
            // Converse names the format by its subtype (`png`, `jpeg`, `pdf`); a document
            // also takes a name (letters, digits, hyphens: no dot).
            MediaPart::Bytes { kind, mime, data } => {
                let format = mime.rsplit('/').next().unwrap_or(mime);
                if kind == broca_protocol::media::kind::IMAGE {
                    w.key("image").object().field_str("format", format);
                } else {
                    let name = format!("document-{}", &m.sha256[..m.sha256.len().min(12)]);
                    w.key("document")
                        .object()
                        .field_str("format", format)
                        .field_str("name", &name);
                }
                w.key("source")
                    .object()
                    .key("bytes")
                    .base64("", data)
                    .end_object()
                    .end_object();
            }
            MediaPart::Marker(text) => {
                w.field_str("text", &text);
            }
        },
    }
    w.end_object();
}

/// The request body.
pub fn body(req: &Request, aliases: &Aliases) -> Vec<u8> {
    let mut w = JsonWriter::with_capacity(size_hint(req));
    w.object();
    messages(&mut w, req, aliases);
    if let Some(system) = req.system.as_deref().filter(|s| !s.is_empty()) {
        w.key("system")
            .array()
            .object()
            .field_str("text", system)
            .end_object()
            .end_array();
    }
    // Bedrock's route takes no schema-constrained form (admission never asks it to).
    crate::json::camel_generation(
        &mut w,
        &req.generation,
        "inferenceConfig",
        "maxTokens",
        None,
    );
    if !req.tools.is_empty() {
        w.key("toolConfig").object().key("tools").array();
        for t in req.tools.iter() {
            w.object()
                .key("toolSpec")
                .object()
                .field_str("name", aliases.wire(&t.name));
            if !t.description.is_empty() {
                w.field_str("description", &t.description);
            }
            w.key("inputSchema")
                .object()
                .key("json")
                .serde(&t.input_schema)
                .end_object()
                .end_object()
                .end_object();
        }
        w.end_array().end_object();
    }
    w.end_object();
    w.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sample_renders_to_the_documented_shape_byte_for_byte() {
        let (req, aliases, alias) = crate::sample_with_alias();
        let got = String::from_utf8(body(&req, &aliases)).unwrap();
        let expected = format!(
            concat!(
                r#"{{"messages":[{{"role":"user","content":[{{"text":"Weather in Paris?"}}]}},"#,
                r#"{{"role":"assistant","content":[{{"reasoningContent":{{"reasoningText":{{"text":"need the tool","signature":"sig=="}}}}}},{{"text":"Checking."}},"#,
                r#"{{"toolUse":{{"toolUseId":"call_1","name":"{alias}","input":{{"city":"Paris"}}}}}}]}},"#,
                r#"{{"role":"user","content":[{{"toolResult":{{"toolUseId":"call_1","content":[{{"text":"18C"}}]}}}}]}}],"#,
                r#""system":[{{"text":"Be brief."}}],"inferenceConfig":{{"maxTokens":256,"temperature":0.5}},"#,
                r#""toolConfig":{{"tools":[{{"toolSpec":{{"name":"{alias}","description":"Current weather","inputSchema":{{"json":{{"properties":{{"city":{{"type":"string"}}}},"type":"object"}}}}}}}},"#,
                r#"{{"toolSpec":{{"name":"clock","inputSchema":{{"json":{{"type":"object"}}}}}}}}]}}}}"#
            ),
            alias = alias
        );
        assert_eq!(got, expected);
    }
}
