//! OpenAI Responses stream events -> canonical events. Usage in the canonical measures
//! (docs/usage.md), from the final response: `input_tokens` is already the total input (its
//! cached part, `input_tokens_details.cached_tokens`, is the cache_read), `output_tokens` the
//! output (reasoning included, also given apart); the family reports no cache writes, so
//! cache_write stays absent, as does any measure not reported. Function calls are keyed by
//! their output index.

use serde::Deserialize;

use std::borrow::Cow;

use crate::scan::{self, Raw};
use crate::template::{Hole, Template};
use crate::{Aliases, FormatError, Normalized};
use broca_protocol::{ClassifiedError, FinishReason, StreamEvent, Usage};

#[derive(Deserialize)]
#[serde(tag = "type")]
enum Wire {
    #[serde(rename = "response.created")]
    Created { response: WireResponse },
    #[serde(rename = "response.output_item.added")]
    ItemAdded { output_index: u32, item: WireItem },
    #[serde(rename = "response.output_item.done")]
    ItemDone { output_index: u32, item: WireItem },
    #[serde(rename = "response.output_text.delta")]
    TextDelta { delta: String },
    #[serde(
        rename = "response.reasoning_summary_text.delta",
        alias = "response.reasoning_text.delta"
    )]
    ReasoningDelta { delta: String },
    #[serde(rename = "response.function_call_arguments.delta")]
    ArgsDelta { output_index: u32, delta: String },
    #[serde(rename = "response.completed", alias = "response.incomplete")]
    Completed { response: WireResponse },
    #[serde(rename = "response.failed")]
    Failed { response: WireResponse },
    #[serde(rename = "error")]
    Error {
        #[serde(default)]
        code: Option<String>,
        #[serde(default)]
        message: String,
        #[serde(default)]
        error: Option<crate::ErrorBody>,
    },
    #[serde(other)]
    Other,
}

#[derive(Deserialize)]
struct WireResponse {
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    status: Option<String>,
    #[serde(default)]
    usage: Option<WireUsage>,
    #[serde(default)]
    incomplete_details: Option<Incomplete>,
    #[serde(default)]
    error: Option<crate::ErrorBody>,
}

#[derive(Deserialize)]
struct Incomplete {
    #[serde(default)]
    reason: Option<String>,
}

#[derive(Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum WireItem {
    FunctionCall {
        call_id: String,
        name: String,
    },
    #[serde(other)]
    Other,
}

#[derive(Deserialize)]
struct WireUsage {
    input_tokens: Option<u64>,
    output_tokens: Option<u64>,
    #[serde(default)]
    input_tokens_details: Option<InputDetails>,
    #[serde(default)]
    output_tokens_details: Option<OutputDetails>,
}

#[derive(Deserialize)]
struct InputDetails {
    cached_tokens: Option<u64>,
}

#[derive(Deserialize)]
struct OutputDetails {
    reasoning_tokens: Option<u64>,
}

crate::normalizer_constructors!(Normalizer);

/// The state of one streamed response.
#[derive(Debug, Default)]
pub struct Normalizer {
    request_id: Option<String>,
    calls: u32,
    aliases: Aliases,
    /// The last delta the fast path read, as a template, and what its text makes.
    template: Template,
    delta_kind: Option<DeltaKind>,
    /// Tests: every event through the full parse (the fast path's reference).
    full_only: bool,
}

fn error(code: Option<&str>, kind: Option<&str>, message: &str) -> Normalized {
    let class = crate::openai_chat::normalize::classify(kind, code);
    Normalized::Error(ClassifiedError {
        class,
        message: format!("{}: {message}", code.or(kind).unwrap_or("error")),
        retry_after_ms: None,
    })
}

/// What a delta event the fast path read makes of its text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum DeltaKind {
    Text,
    Reasoning,
    Args { index: u32 },
}

impl DeltaKind {
    fn event(self, text: Cow<'_, str>) -> Normalized {
        let ev = match self {
            DeltaKind::Text if text.is_empty() => return Normalized::Events(Vec::new()),
            DeltaKind::Reasoning if text.is_empty() => return Normalized::Events(Vec::new()),
            DeltaKind::Text => StreamEvent::TextDelta(text.into_owned()),
            DeltaKind::Reasoning => StreamEvent::ThinkingDelta(text.into_owned()),
            DeltaKind::Args { index } => StreamEvent::ToolCallArgsDelta {
                index,
                json: text.into_owned(),
            },
        };
        Normalized::Events(vec![ev])
    }
}

impl Normalizer {
    /// The delta events that make up nearly all of a stream, read without a full parse;
    /// `None` hands the event to the full parse. A delta's event is kept as a template with
    /// holes for its sequence number, its text and its padding (`obfuscation`): the next
    /// delta of the same item repeats the rest of its bytes, and reads the same.
    fn fast_path(&mut self, data: &str) -> Option<Normalized> {
        if let Some(kind) = self.delta_kind {
            if let Some((text, _)) = self.template.fill(data) {
                return Some(kind.event(text.string()?));
            }
        }
        self.delta_kind = None;
        self.template.forget();
        let (mut kind, mut delta, mut index) = (None, None, None);
        let (mut holes, mut plain) = (Vec::new(), true);
        let span = |s: &str| s.as_ptr() as usize - data.as_ptr() as usize;
        scan::fields(data, |k, v| {
            match (k, v) {
                ("sequence_number", Raw::Scalar(s)) if v.u32().is_some() => {
                    holes.push((span(s), span(s) + s.len(), Hole::Other))
                }
                ("delta", Raw::Str { quoted, .. }) => {
                    holes.push((span(quoted), span(quoted) + quoted.len(), Hole::Text))
                }
                ("obfuscation", Raw::Str { quoted, .. }) => {
                    holes.push((span(quoted), span(quoted) + quoted.len(), Hole::Str))
                }
                ("sequence_number" | "delta" | "obfuscation", _) => plain = false,
                _ => {}
            }
            match k {
                "type" => kind = Some(v),
                "delta" => delta = Some(v),
                "output_index" => index = Some(v),
                _ => {}
            }
        })?;
        let kind = match kind?.plain()? {
            "response.output_text.delta" => DeltaKind::Text,
            "response.reasoning_summary_text.delta" | "response.reasoning_text.delta" => {
                DeltaKind::Reasoning
            }
            "response.function_call_arguments.delta" => DeltaKind::Args {
                index: index?.u32()?,
            },
            _ => return None,
        };
        let out = kind.event(delta?.string()?);
        if plain {
            self.template.record(data, &mut holes);
            self.delta_kind = Some(kind);
        }
        Some(out)
    }
}

impl Normalizer {
    /// The response completed: its usage, then its finish (from its incomplete reason, or
    /// whether it called tools).
    fn completed(&self, response: WireResponse, out: &mut Vec<StreamEvent>) {
        if let Some(u) = &response.usage {
            out.push(StreamEvent::Usage(Usage {
                input: u.input_tokens,
                output: u.output_tokens,
                cache_read: u
                    .input_tokens_details
                    .as_ref()
                    .and_then(|d| d.cached_tokens),
                cache_write: None,
                reasoning: u
                    .output_tokens_details
                    .as_ref()
                    .and_then(|d| d.reasoning_tokens),
            }));
        }
        let incomplete = response.status.as_deref() == Some("incomplete");
        let reason = match response.incomplete_details.and_then(|d| d.reason) {
            Some(r) if r == "max_output_tokens" => FinishReason::MaxTokens,
            Some(r) => FinishReason::Other(r),
            None if incomplete => FinishReason::MaxTokens,
            None if self.calls > 0 => FinishReason::ToolUse,
            None => FinishReason::EndTurn,
        };
        out.push(StreamEvent::Finish {
            reason,
            request_id: response.id.or_else(|| self.request_id.clone()),
        });
    }
}

impl crate::StreamNormalizer for Normalizer {
    fn push(&mut self, _event: Option<&str>, data: &str) -> Result<Normalized, FormatError> {
        if !self.full_only {
            if let Some(fast) = self.fast_path(data) {
                return Ok(fast);
            }
        }
        let wire: Wire = serde_json::from_str(data)
            .map_err(|e| FormatError(format!("an OpenAI Responses event does not parse: {e}")))?;
        let mut out = Vec::new();
        match wire {
            Wire::Created { response } => self.request_id = response.id,
            Wire::ItemAdded {
                output_index,
                item: WireItem::FunctionCall { call_id, name },
            } => {
                self.calls += 1;
                out.push(StreamEvent::ToolCallStart {
                    index: output_index,
                    id: call_id,
                    name: self.aliases.caller(name),
                });
            }
            Wire::ItemDone {
                output_index,
                item: WireItem::FunctionCall { .. },
            } => out.push(StreamEvent::ToolCallEnd {
                index: output_index,
            }),
            Wire::ItemAdded { .. } | Wire::ItemDone { .. } | Wire::Other => {}
            Wire::TextDelta { delta } if !delta.is_empty() => {
                out.push(StreamEvent::TextDelta(delta))
            }
            Wire::ReasoningDelta { delta } if !delta.is_empty() => {
                out.push(StreamEvent::ThinkingDelta(delta))
            }
            Wire::TextDelta { .. } | Wire::ReasoningDelta { .. } => {}
            Wire::ArgsDelta {
                output_index,
                delta,
            } => out.push(StreamEvent::ToolCallArgsDelta {
                index: output_index,
                json: delta,
            }),
            Wire::Completed { response } => self.completed(response, &mut out),
            Wire::Failed { response } => {
                let e = response.error.unwrap_or(crate::ErrorBody {
                    kind: None,
                    message: "the response failed".into(),
                    code: None,
                });
                return Ok(error(e.code.as_deref(), e.kind.as_deref(), &e.message));
            }
            Wire::Error {
                code,
                message,
                error: nested,
            } => {
                return Ok(match nested {
                    Some(e) => error(e.code.as_deref(), e.kind.as_deref(), &e.message),
                    None => error(code.as_deref(), None, &message),
                })
            }
        }
        Ok(Normalized::Events(out))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::StreamNormalizer;
    use broca_protocol::ErrorClass;

    /// The event sequence the Responses API documents for reasoning, text and a function
    /// call, with usage details in the final response.
    const STREAM: &str = "event: response.created\n\
data: {\"type\":\"response.created\",\"sequence_number\":0,\"response\":{\"id\":\"resp_1\",\"object\":\"response\",\"status\":\"in_progress\",\"output\":[],\"usage\":null}}\n\n\
event: response.in_progress\n\
data: {\"type\":\"response.in_progress\",\"sequence_number\":1,\"response\":{\"id\":\"resp_1\",\"status\":\"in_progress\"}}\n\n\
event: response.reasoning_summary_text.delta\n\
data: {\"type\":\"response.reasoning_summary_text.delta\",\"sequence_number\":2,\"item_id\":\"rs_1\",\"output_index\":0,\"summary_index\":0,\"delta\":\"Think\"}\n\n\
event: response.output_item.added\n\
data: {\"type\":\"response.output_item.added\",\"sequence_number\":3,\"output_index\":1,\"item\":{\"id\":\"msg_1\",\"type\":\"message\",\"status\":\"in_progress\",\"content\":[],\"role\":\"assistant\"}}\n\n\
event: response.output_text.delta\n\
data: {\"type\":\"response.output_text.delta\",\"sequence_number\":4,\"item_id\":\"msg_1\",\"output_index\":1,\"content_index\":0,\"delta\":\"On it \\u00e9\",\"logprobs\":[]}\n\n\
event: response.output_item.added\n\
data: {\"type\":\"response.output_item.added\",\"sequence_number\":5,\"output_index\":2,\"item\":{\"id\":\"fc_1\",\"type\":\"function_call\",\"status\":\"in_progress\",\"arguments\":\"\",\"call_id\":\"call_9\",\"name\":\"get_weather\"}}\n\n\
event: response.function_call_arguments.delta\n\
data: {\"type\":\"response.function_call_arguments.delta\",\"sequence_number\":6,\"item_id\":\"fc_1\",\"output_index\":2,\"delta\":\"{\\\"city\\\":\"}\n\n\
event: response.function_call_arguments.delta\n\
data: {\"type\":\"response.function_call_arguments.delta\",\"sequence_number\":7,\"item_id\":\"fc_1\",\"output_index\":2,\"delta\":\"\\\"Oslo\\\"}\"}\n\n\
event: response.function_call_arguments.done\n\
data: {\"type\":\"response.function_call_arguments.done\",\"sequence_number\":8,\"item_id\":\"fc_1\",\"output_index\":2,\"arguments\":\"{\\\"city\\\":\\\"Oslo\\\"}\"}\n\n\
event: response.output_item.done\n\
data: {\"type\":\"response.output_item.done\",\"sequence_number\":9,\"output_index\":2,\"item\":{\"id\":\"fc_1\",\"type\":\"function_call\",\"status\":\"completed\",\"arguments\":\"{\\\"city\\\":\\\"Oslo\\\"}\",\"call_id\":\"call_9\",\"name\":\"get_weather\"}}\n\n\
event: response.completed\n\
data: {\"type\":\"response.completed\",\"sequence_number\":10,\"response\":{\"id\":\"resp_1\",\"status\":\"completed\",\"usage\":{\"input_tokens\":40,\"input_tokens_details\":{\"cached_tokens\":32},\"output_tokens\":25,\"output_tokens_details\":{\"reasoning_tokens\":10},\"total_tokens\":65}}}\n\n";

    fn expected() -> Vec<StreamEvent> {
        vec![
            StreamEvent::ThinkingDelta("Think".into()),
            StreamEvent::TextDelta("On it é".into()),
            StreamEvent::ToolCallStart {
                index: 2,
                id: "call_9".into(),
                name: "get_weather".into(),
            },
            StreamEvent::ToolCallArgsDelta {
                index: 2,
                json: "{\"city\":".into(),
            },
            StreamEvent::ToolCallArgsDelta {
                index: 2,
                json: "\"Oslo\"}".into(),
            },
            StreamEvent::ToolCallEnd { index: 2 },
            StreamEvent::Usage(Usage {
                input: Some(40),
                output: Some(25),
                cache_read: Some(32),
                cache_write: None,
                reasoning: Some(10),
            }),
            StreamEvent::Finish {
                reason: FinishReason::ToolUse,
                request_id: Some("resp_1".into()),
            },
        ]
    }

    crate::recorded_stream_tests!(STREAM, expected());

    #[test]
    fn a_reused_template_never_hides_a_changed_value() {
        let delta = |kind: &str, seq: &str, index: &str, delta: &str, pad: &str| {
            format!(
                r#"{{"type":"response.{kind}.delta","sequence_number":{seq},"item_id":"msg_1","output_index":{index},"content_index":0,"delta":{delta},"obfuscation":{pad}}}"#
            )
        };
        let mut fast = Normalizer::default();
        let mut full = Normalizer::full_only();
        for d in [
            delta("output_text", "2", "0", r#""a""#, r#""Xq3""#),
            delta("output_text", "3", "0", r#""b""#, r#""Q""#),
            delta("output_text", "40", "0", r#""c\"d""#, r#""""#),
            delta("output_text", "41", "0", r#""""#, r#""Xq3""#),
            delta("output_text", "42", "0", "null", r#""Xq3""#),
            delta("output_text", "43", "0", r#""e""#, "7"),
            delta("output_text", "44", "0", r#""f""#, r#""Xq3""#),
            delta("reasoning_text", "45", "0", r#""g""#, r#""Xq3""#),
            delta("output_text", "46", "0", r#""h""#, r#""Xq3""#),
            delta(
                "function_call_arguments",
                "47",
                "1",
                r#""{\"a\""#,
                r#""Xq3""#,
            ),
            delta("function_call_arguments", "48", "2", r#""1}""#, r#""Xq3""#),
            delta("function_call_arguments", "49", "2", r#""2}""#, r#""Xq3""#),
            delta("function_call_arguments", "-1", "2", r#""3}""#, r#""Xq3""#),
            delta("output_text", "51", "0", r#""i", "x": 1"#, r#""Xq3""#),
        ] {
            assert_eq!(fast.push(None, &d).ok(), full.push(None, &d).ok(), "{d}");
        }
        // The template is in use: the next delta of the same item is read through it.
        let mut n = Normalizer::default();
        n.push(None, &delta("output_text", "1", "0", r#""a""#, r#""p""#))
            .unwrap();
        assert!(n
            .template
            .fill(&delta("output_text", "2", "0", r#""b""#, r#""pp""#))
            .is_some());
    }

    #[test]
    fn incomplete_responses_and_missing_usage() {
        let mut n = Normalizer::default();
        let data = r#"{"type":"response.incomplete","response":{"id":"r","status":"incomplete","incomplete_details":{"reason":"max_output_tokens"}}}"#;
        let Normalized::Events(evs) = n.push(None, data).unwrap() else {
            panic!()
        };
        assert_eq!(
            evs,
            [StreamEvent::Finish {
                reason: FinishReason::MaxTokens,
                request_id: Some("r".into())
            }],
            "no usage reported: no usage event, never zeros"
        );
    }

    #[test]
    fn usage_without_details_leaves_cache_and_reasoning_absent() {
        for usage in [
            r#"{"input_tokens":40,"output_tokens":25}"#,
            r#"{"input_tokens":40,"output_tokens":25,"input_tokens_details":{},"output_tokens_details":{}}"#,
            r#"{"input_tokens":40,"output_tokens":25,"input_tokens_details":null,"output_tokens_details":{"reasoning_tokens":null}}"#,
        ] {
            let mut n = Normalizer::default();
            let data = format!(
                r#"{{"type":"response.completed","response":{{"id":"r","status":"completed","usage":{usage}}}}}"#
            );
            let Normalized::Events(evs) = n.push(None, &data).unwrap() else {
                panic!("{data}")
            };
            assert_eq!(
                evs[0],
                StreamEvent::Usage(Usage {
                    input: Some(40),
                    output: Some(25),
                    ..Usage::default()
                }),
                "{usage}"
            );
        }
    }

    #[test]
    fn failures_and_error_events_are_classified() {
        let mut n = Normalizer::default();
        for (data, class) in [
            (
                r#"{"type":"response.failed","response":{"id":"r","status":"failed","error":{"code":"context_length_exceeded","message":"too long"}}}"#,
                ErrorClass::ContextOverflow,
            ),
            (
                r#"{"type":"error","code":"rate_limit_exceeded","message":"slow down","param":null}"#,
                ErrorClass::Transient,
            ),
            (
                r#"{"type":"error","error":{"type":"invalid_request_error","code":"invalid_api_key","message":"bad key"}}"#,
                ErrorClass::AuthRequired,
            ),
            (
                r#"{"type":"response.failed","response":{"id":"r","status":"failed","error":{"code":"server_error","message":"boom"}}}"#,
                ErrorClass::Transient,
            ),
            (
                r#"{"type":"response.failed","response":{"id":"r","status":"failed","error":{"code":"invalid_prompt","message":"no"}}}"#,
                ErrorClass::Permanent,
            ),
        ] {
            let Normalized::Error(e) = n.push(None, data).unwrap() else {
                panic!("{data}")
            };
            assert_eq!(e.class, class, "{data}");
        }
    }
}
