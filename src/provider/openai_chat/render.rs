//! Canonical request -> OpenAI Chat Completions request bytes (deterministic). Tool results
//! become `tool` messages right after the assistant message that called them; thinking is
//! not sent back (the API takes none); usage is asked for with `stream_options`.

use serde::Serialize;

use crate::protocol::{Block, Request, Role};
use crate::provider::{to_body, Aliases, Rendered};

#[derive(Serialize)]
struct Body<'a> {
    model: &'a str,
    messages: Vec<WMsg<'a>>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    tools: Vec<WTool<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    max_completion_tokens: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    temperature: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    top_p: Option<f64>,
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    stop: &'a [String],
    stream: bool,
    stream_options: StreamOptions,
}

#[derive(Serialize)]
struct StreamOptions {
    include_usage: bool,
}

#[derive(Serialize)]
#[serde(tag = "role", rename_all = "snake_case")]
enum WMsg<'a> {
    System {
        content: &'a str,
    },
    User {
        content: Content<'a>,
    },
    Assistant {
        content: Option<Content<'a>>,
        #[serde(skip_serializing_if = "Vec::is_empty")]
        tool_calls: Vec<WCall<'a>>,
    },
    Tool {
        tool_call_id: &'a str,
        content: &'a str,
    },
}

#[derive(Serialize)]
#[serde(untagged)]
enum Content<'a> {
    Text(&'a str),
    Parts(Vec<Part<'a>>),
}

#[derive(Serialize)]
struct Part<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    text: &'a str,
}

#[derive(Serialize)]
struct WCall<'a> {
    id: &'a str,
    #[serde(rename = "type")]
    kind: &'static str,
    function: WFunction<'a>,
}

#[derive(Serialize)]
struct WFunction<'a> {
    name: &'a str,
    arguments: &'a str,
}

#[derive(Serialize)]
struct WTool<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    function: WToolFn<'a>,
}

#[derive(Serialize)]
struct WToolFn<'a> {
    name: &'a str,
    #[serde(skip_serializing_if = "str::is_empty")]
    description: &'a str,
    parameters: &'a serde_json::Value,
}

fn content<'a>(texts: Vec<&'a str>) -> Option<Content<'a>> {
    match texts.len() {
        0 => None,
        1 => Some(Content::Text(texts[0])),
        _ => Some(Content::Parts(
            texts
                .into_iter()
                .map(|text| Part { kind: "text", text })
                .collect(),
        )),
    }
}

/// The messages of a transcript in Chat's shape (shared with families that speak it).
fn messages<'a>(req: &'a Request, aliases: &'a Aliases) -> Vec<WMsg<'a>> {
    let mut out = Vec::with_capacity(req.messages.len() + 1);
    if let Some(system) = req.system.as_deref().filter(|s| !s.is_empty()) {
        out.push(WMsg::System { content: system });
    }
    for m in &req.messages {
        let texts: Vec<&str> = m
            .content
            .iter()
            .filter_map(|b| match b {
                Block::Text { text } if !text.is_empty() => Some(text.as_str()),
                _ => None,
            })
            .collect();
        match m.role {
            Role::Assistant => {
                let tool_calls: Vec<WCall> = m
                    .content
                    .iter()
                    .filter_map(|b| match b {
                        Block::ToolUse { id, name, input } => Some(WCall {
                            id,
                            kind: "function",
                            function: WFunction {
                                name: aliases.wire(name),
                                arguments: input.get(),
                            },
                        }),
                        _ => None,
                    })
                    .collect();
                if texts.is_empty() && tool_calls.is_empty() {
                    continue;
                }
                out.push(WMsg::Assistant {
                    content: content(texts),
                    tool_calls,
                });
            }
            Role::User => {
                for b in &m.content {
                    if let Block::ToolResult {
                        tool_use_id,
                        content,
                        ..
                    } = b
                    {
                        out.push(WMsg::Tool {
                            tool_call_id: tool_use_id,
                            content,
                        });
                    }
                }
                if let Some(content) = content(texts) {
                    out.push(WMsg::User { content });
                }
            }
        }
    }
    out
}

/// Renders the request.
pub fn render(req: &Request, aliases: &Aliases) -> Rendered {
    let g = &req.generation;
    let body = Body {
        model: &req.model,
        messages: messages(req, aliases),
        tools: req
            .tools
            .iter()
            .map(|t| WTool {
                kind: "function",
                function: WToolFn {
                    name: aliases.wire(&t.name),
                    description: &t.description,
                    parameters: &t.input_schema,
                },
            })
            .collect(),
        max_completion_tokens: g.max_output_tokens,
        temperature: g.temperature,
        top_p: g.top_p,
        stop: &g.stop_sequences,
        stream: true,
        stream_options: StreamOptions {
            include_usage: true,
        },
    };
    Rendered {
        path: "/v1/chat/completions".into(),
        headers: vec![
            ("content-type".into(), "application/json".into()),
            ("accept".into(), "text/event-stream".into()),
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
        let alias = aliases.wire("weather.get");
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
        req.messages[1]
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
