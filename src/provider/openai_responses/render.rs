//! Canonical request -> OpenAI Responses request bytes (deterministic). The system text is
//! `instructions`; messages, function calls and their outputs are input items; nothing is
//! stored on the provider's side (`store: false`). Thinking is not sent back, and the API has
//! no stop sequences.

use serde::Serialize;

use crate::protocol::{Block, Request, Role};
use crate::provider::{to_body, Aliases, Rendered};

#[derive(Serialize)]
struct Body<'a> {
    model: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    instructions: Option<&'a str>,
    input: Vec<Item<'a>>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    tools: Vec<WTool<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    max_output_tokens: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    temperature: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    top_p: Option<f64>,
    store: bool,
    stream: bool,
}

#[derive(Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum Item<'a> {
    Message {
        role: &'static str,
        content: Vec<Part<'a>>,
    },
    FunctionCall {
        call_id: &'a str,
        name: &'a str,
        arguments: &'a str,
    },
    FunctionCallOutput {
        call_id: &'a str,
        output: &'a str,
    },
}

#[derive(Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum Part<'a> {
    InputText { text: &'a str },
    OutputText { text: &'a str },
}

#[derive(Serialize)]
struct WTool<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    name: &'a str,
    #[serde(skip_serializing_if = "str::is_empty")]
    description: &'a str,
    parameters: &'a serde_json::Value,
    strict: bool,
}

/// Ends a message item with the text parts gathered so far, if any.
fn flush<'a>(role: &'static str, parts: &mut Vec<Part<'a>>, input: &mut Vec<Item<'a>>) {
    if !parts.is_empty() {
        input.push(Item::Message {
            role,
            content: std::mem::take(parts),
        });
    }
}

/// Renders the request.
pub fn render(req: &Request, aliases: &Aliases) -> Rendered {
    let mut input = Vec::with_capacity(req.messages.len() * 2);
    for m in &req.messages {
        let mut parts = Vec::new();
        let role = match m.role {
            Role::User => "user",
            Role::Assistant => "assistant",
        };
        for b in &m.content {
            match b {
                Block::Text { text } if !text.is_empty() => parts.push(match m.role {
                    Role::User => Part::InputText { text },
                    Role::Assistant => Part::OutputText { text },
                }),
                Block::ToolUse {
                    id,
                    name,
                    input: args,
                } => {
                    // Items keep the transcript's order: text before a call stays before it.
                    flush(role, &mut parts, &mut input);
                    input.push(Item::FunctionCall {
                        call_id: id,
                        name: aliases.wire(name),
                        arguments: args.get(),
                    });
                }
                Block::ToolResult {
                    tool_use_id,
                    content,
                    ..
                } => {
                    flush(role, &mut parts, &mut input);
                    input.push(Item::FunctionCallOutput {
                        call_id: tool_use_id,
                        output: content,
                    });
                }
                Block::Text { .. } | Block::Thinking { .. } => {}
            }
        }
        flush(role, &mut parts, &mut input);
    }
    let g = &req.generation;
    let body = Body {
        model: &req.model,
        instructions: req.system.as_deref().filter(|s| !s.is_empty()),
        input,
        tools: req
            .tools
            .iter()
            .map(|t| WTool {
                kind: "function",
                name: aliases.wire(&t.name),
                description: &t.description,
                parameters: &t.input_schema,
                strict: false,
            })
            .collect(),
        max_output_tokens: g.max_output_tokens,
        temperature: g.temperature,
        top_p: g.top_p,
        store: false,
        stream: true,
    };
    Rendered {
        path: "/v1/responses".into(),
        headers: vec![
            ("content-type".into(), "application/json".into()),
            ("accept".into(), "text/event-stream".into()),
        ],
        body: to_body(&body),
    }
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
    use crate::provider::sample_request;

    #[test]
    fn the_sample_renders_to_the_documented_shape_byte_for_byte() {
        let req = sample_request();
        let aliases = Aliases::for_tools(&req.tools);
        let alias = aliases.wire("weather.get");
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
