//! Canonical request -> Anthropic Messages request bytes. Deterministic: fields render in a
//! fixed order and the tool schemas' keys are sorted, so the same request gives the same bytes
//! on every call and on replay.
//!
//! What the API refuses is left out rather than sent: empty text blocks, thinking without its
//! signature (a step from another family), messages left empty. Cache breakpoints (with the
//! run's cache policy on) go on the last tool, the system text and the last block.

use std::borrow::Cow;

use serde::Serialize;
use serde_json::value::RawValue;

use crate::protocol::{Block, Request, Role};
use crate::provider::{to_body, Aliases, Rendered};

/// The output cap sent when the run sets none: the API requires one, and every current
/// model accepts this many.
pub const DEFAULT_MAX_TOKENS: u64 = 4096;

/// The API version header value.
pub const API_VERSION: &str = "2023-06-01";

#[derive(Serialize)]
struct Body<'a> {
    model: &'a str,
    max_tokens: u64,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    system: Vec<WBlock<'a>>,
    messages: Vec<WMessage<'a>>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    tools: Vec<WTool<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    temperature: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    top_p: Option<f64>,
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    stop_sequences: &'a [String],
    stream: bool,
}

#[derive(Serialize)]
struct WMessage<'a> {
    role: &'static str,
    content: Vec<WBlock<'a>>,
}

#[derive(Serialize, Clone, Copy)]
struct Ephemeral {
    #[serde(rename = "type")]
    kind: &'static str,
}

const EPHEMERAL: Ephemeral = Ephemeral { kind: "ephemeral" };

#[derive(Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum WBlock<'a> {
    Text {
        text: &'a str,
        #[serde(skip_serializing_if = "Option::is_none")]
        cache_control: Option<Ephemeral>,
    },
    Thinking {
        thinking: &'a str,
        signature: &'a str,
    },
    ToolUse {
        id: Cow<'a, str>,
        name: &'a str,
        input: &'a RawValue,
        #[serde(skip_serializing_if = "Option::is_none")]
        cache_control: Option<Ephemeral>,
    },
    ToolResult {
        tool_use_id: Cow<'a, str>,
        content: &'a str,
        #[serde(skip_serializing_if = "std::ops::Not::not")]
        is_error: bool,
        #[serde(skip_serializing_if = "Option::is_none")]
        cache_control: Option<Ephemeral>,
    },
}

impl WBlock<'_> {
    fn set_cache(&mut self) {
        match self {
            WBlock::Text { cache_control, .. }
            | WBlock::ToolUse { cache_control, .. }
            | WBlock::ToolResult { cache_control, .. } => *cache_control = Some(EPHEMERAL),
            WBlock::Thinking { .. } => {}
        }
    }
}

#[derive(Serialize)]
struct WTool<'a> {
    name: &'a str,
    #[serde(skip_serializing_if = "str::is_empty")]
    description: &'a str,
    input_schema: &'a serde_json::Value,
    #[serde(skip_serializing_if = "Option::is_none")]
    cache_control: Option<Ephemeral>,
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

/// Renders the request.
pub fn render(req: &Request, aliases: &Aliases) -> Rendered {
    let mut messages: Vec<WMessage> = Vec::with_capacity(req.messages.len());
    for m in &req.messages {
        let content: Vec<WBlock> = m
            .content
            .iter()
            .filter_map(|b| match b {
                Block::Text { text } if !text.is_empty() => Some(WBlock::Text {
                    text,
                    cache_control: None,
                }),
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
                    input: &input.0,
                    cache_control: None,
                }),
                Block::ToolResult {
                    tool_use_id,
                    content,
                    is_error,
                } => Some(WBlock::ToolResult {
                    tool_use_id: safe_id(tool_use_id),
                    content,
                    is_error: *is_error,
                    cache_control: None,
                }),
            })
            .collect();
        if content.is_empty() {
            continue;
        }
        messages.push(WMessage {
            role: match m.role {
                Role::User => "user",
                Role::Assistant => "assistant",
            },
            content,
        });
    }
    let mut system: Vec<WBlock> = req
        .system
        .as_deref()
        .filter(|s| !s.is_empty())
        .map(|text| WBlock::Text {
            text,
            cache_control: None,
        })
        .into_iter()
        .collect();
    let mut tools: Vec<WTool> = req
        .tools
        .iter()
        .map(|t| WTool {
            name: aliases.wire(&t.name),
            description: &t.description,
            input_schema: &t.input_schema,
            cache_control: None,
        })
        .collect();
    if req.prompt_cache {
        if let Some(t) = tools.last_mut() {
            t.cache_control = Some(EPHEMERAL);
        }
        if let Some(s) = system.last_mut() {
            s.set_cache();
        }
        if let Some(b) = messages.last_mut().and_then(|m| m.content.last_mut()) {
            b.set_cache();
        }
    }
    let g = &req.generation;
    let body = Body {
        model: &req.model,
        max_tokens: g.max_output_tokens.unwrap_or(DEFAULT_MAX_TOKENS),
        system,
        messages,
        tools,
        temperature: g.temperature,
        top_p: g.top_p,
        stop_sequences: &g.stop_sequences,
        stream: true,
    };
    Rendered {
        path: "/v1/messages".into(),
        headers: vec![
            ("content-type".into(), "application/json".into()),
            ("accept".into(), "text/event-stream".into()),
            ("anthropic-version".into(), API_VERSION.into()),
        ],
        body: to_body(&body),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::provider::sample_request;

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
        req.messages[1].content[0] = Block::Thinking {
            text: "x".into(),
            signature: None,
        };
        req.messages[1].content[1] = Block::Text {
            text: String::new(),
        };
        if let Block::ToolUse { id, .. } = &mut req.messages[1].content[2] {
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
