//! Anthropic Messages stream events -> canonical events. Usage in the canonical measures
//! (docs/usage.md): Anthropic's `input_tokens` counts only the input read from neither cache,
//! so the canonical input is `input_tokens + cache_read_input_tokens +
//! cache_creation_input_tokens`; cache creation is cache_write, cache read is cache_read; a
//! measure not reported stays absent. The counts of a message arrive in parts (at its start,
//! and cumulatively at its end): they are merged before the canonical measures are derived.

use serde::Deserialize;

use crate::scan::{self, Raw};
use crate::{Aliases, FormatError, Normalized};
use broca_protocol::{ClassifiedError, ErrorClass, FinishReason, StreamEvent, Usage};

#[derive(Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum Wire {
    MessageStart {
        message: WireMessage,
    },
    ContentBlockStart {
        index: u32,
        content_block: WireBlock,
    },
    ContentBlockDelta {
        index: u32,
        delta: WireDelta,
    },
    ContentBlockStop {
        index: u32,
    },
    MessageDelta {
        delta: WireMessageDelta,
        #[serde(default)]
        usage: Option<WireUsage>,
    },
    MessageStop,
    Ping,
    Error {
        error: WireError,
    },
    #[serde(other)]
    Unknown,
}

#[derive(Deserialize)]
struct WireMessage {
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    usage: Option<WireUsage>,
}

#[derive(Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum WireBlock {
    Text {
        #[serde(default)]
        text: String,
    },
    ToolUse {
        id: String,
        name: String,
    },
    Thinking {
        #[serde(default)]
        thinking: String,
    },
    #[serde(other)]
    Other,
}

#[derive(Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum WireDelta {
    TextDelta {
        text: String,
    },
    InputJsonDelta {
        partial_json: String,
    },
    ThinkingDelta {
        thinking: String,
    },
    SignatureDelta {
        signature: String,
    },
    #[serde(other)]
    Other,
}

#[derive(Deserialize)]
struct WireMessageDelta {
    #[serde(default)]
    stop_reason: Option<String>,
}

#[derive(Debug, Deserialize, Default)]
struct WireUsage {
    input_tokens: Option<u64>,
    output_tokens: Option<u64>,
    cache_creation_input_tokens: Option<u64>,
    cache_read_input_tokens: Option<u64>,
}

#[derive(Deserialize)]
struct WireError {
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    message: String,
}

impl WireUsage {
    /// Takes the counts `later` reports (each a running total), keeping the others.
    fn merge(&mut self, later: WireUsage) {
        let pick = |a: &mut Option<u64>, b: Option<u64>| {
            if b.is_some() {
                *a = b;
            }
        };
        pick(&mut self.input_tokens, later.input_tokens);
        pick(&mut self.output_tokens, later.output_tokens);
        pick(
            &mut self.cache_creation_input_tokens,
            later.cache_creation_input_tokens,
        );
        pick(
            &mut self.cache_read_input_tokens,
            later.cache_read_input_tokens,
        );
    }

    /// The canonical measures. The cache counts are part of the total input; a message that
    /// reports none touched no cache (the API reports them whenever a cache was read or
    /// written), so its total input is `input_tokens` alone.
    fn canonical(&self) -> Usage {
        let cached = self
            .cache_read_input_tokens
            .unwrap_or(0)
            .saturating_add(self.cache_creation_input_tokens.unwrap_or(0));
        Usage {
            input: self
                .input_tokens
                .map(|uncached| uncached.saturating_add(cached)),
            output: self.output_tokens,
            cache_read: self.cache_read_input_tokens,
            cache_write: self.cache_creation_input_tokens,
            reasoning: None,
        }
    }
}

crate::normalizer_constructors!(Normalizer);

/// The state of one streamed message.
#[derive(Debug, Default)]
pub struct Normalizer {
    request_id: Option<String>,
    /// The message's counts so far, as the wire reports them.
    usage: WireUsage,
    tool_blocks: Vec<u32>,
    aliases: Aliases,
    /// Tests: every event through the full parse (the fast path's reference).
    full_only: bool,
}

/// The class of an Anthropic error type.
pub fn classify(kind: &str, message: &str) -> ErrorClass {
    match kind {
        "overloaded_error" | "rate_limit_error" | "api_error" | "timeout_error" => {
            ErrorClass::Transient
        }
        "authentication_error" | "permission_error" => ErrorClass::AuthRequired,
        "invalid_request_error"
            if message.contains("prompt is too long") || message.contains("context window") =>
        {
            ErrorClass::ContextOverflow
        }
        _ => ErrorClass::Permanent,
    }
}

/// A text or argument delta in the exact form the API writes it
/// (`{"type":"content_block_delta","index":N,"delta":{"type":"text_delta","text":"..."}}`):
/// recognised by its bytes. Anything else is left to the field reader.
fn canonical_delta(data: &str) -> Option<StreamEvent> {
    const HEAD: &str = r#"{"type":"content_block_delta","index":"#;
    const TEXT: &str = r#","delta":{"type":"text_delta","text":"#;
    const ARGS: &str = r#","delta":{"type":"input_json_delta","partial_json":"#;
    let rest = data.strip_prefix(HEAD)?;
    let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
    if digits > 1 && rest.starts_with('0') {
        return None; // not a JSON number
    }
    let index: u32 = rest[..digits].parse().ok()?;
    let rest = &rest[digits..];
    let (is_text, rest) = match rest.strip_prefix(TEXT) {
        Some(r) => (true, r),
        None => (false, rest.strip_prefix(ARGS)?),
    };
    let (end, escaped) = scan::string_end(rest.as_bytes(), 0)?;
    if &rest[end..] != "}}" {
        return None;
    }
    let raw = &rest[1..end - 1];
    let text = if escaped {
        scan::unescape(raw)?
    } else {
        raw.to_string()
    };
    Some(if is_text {
        StreamEvent::TextDelta(text)
    } else {
        StreamEvent::ToolCallArgsDelta { index, json: text }
    })
}

/// The delta events that make up nearly all of a stream, read without a full parse; `None`
/// hands the event to the full parse.
fn fast_path(data: &str) -> Option<Normalized> {
    if let Some(ev) = canonical_delta(data) {
        return Some(Normalized::Events(vec![ev]));
    }
    let (mut kind, mut index, mut delta) = (None, None, None);
    scan::fields(data, |k, v| match k {
        "type" => kind = Some(v),
        "index" => index = Some(v),
        "delta" => delta = Some(v),
        _ => {}
    })?;
    match kind?.plain()? {
        "ping" => Some(Normalized::Events(Vec::new())),
        "content_block_delta" => {
            let index = index?.u32()?;
            let Raw::Obj(delta) = delta? else {
                return None;
            };
            let (mut dkind, mut text) = (None, None);
            scan::fields(delta, |k, v| match k {
                "type" => dkind = Some(v),
                "text" | "partial_json" | "thinking" | "signature" => text = Some((k, v)),
                _ => {}
            })?;
            let (field, text) = text?;
            let text = text.string()?.into_owned();
            let ev = match (dkind?.plain()?, field) {
                ("text_delta", "text") => StreamEvent::TextDelta(text),
                ("input_json_delta", "partial_json") => {
                    StreamEvent::ToolCallArgsDelta { index, json: text }
                }
                ("thinking_delta", "thinking") => StreamEvent::ThinkingDelta(text),
                ("signature_delta", "signature") => StreamEvent::ThinkingSignature(text),
                _ => return None,
            };
            Some(Normalized::Events(vec![ev]))
        }
        _ => None,
    }
}

impl Normalizer {
    /// A content block's start: text or thinking it already holds, or a tool call.
    fn block_start(&mut self, index: u32, block: WireBlock) -> Option<StreamEvent> {
        match block {
            WireBlock::Text { text } if !text.is_empty() => Some(StreamEvent::TextDelta(text)),
            WireBlock::ToolUse { id, name } => {
                self.tool_blocks.push(index);
                let name = self.aliases.caller(name);
                Some(StreamEvent::ToolCallStart { index, id, name })
            }
            WireBlock::Thinking { thinking } if !thinking.is_empty() => {
                Some(StreamEvent::ThinkingDelta(thinking))
            }
            _ => None,
        }
    }
}

/// A content block's delta as the canonical event.
fn block_delta(index: u32, delta: WireDelta) -> Option<StreamEvent> {
    Some(match delta {
        WireDelta::TextDelta { text } => StreamEvent::TextDelta(text),
        WireDelta::InputJsonDelta { partial_json } => StreamEvent::ToolCallArgsDelta {
            index,
            json: partial_json,
        },
        WireDelta::ThinkingDelta { thinking } => StreamEvent::ThinkingDelta(thinking),
        WireDelta::SignatureDelta { signature } => StreamEvent::ThinkingSignature(signature),
        WireDelta::Other => return None,
    })
}

/// Anthropic's stop reason, canonical.
fn finish_reason(reason: String) -> FinishReason {
    match reason.as_str() {
        "end_turn" => FinishReason::EndTurn,
        "tool_use" => FinishReason::ToolUse,
        "max_tokens" => FinishReason::MaxTokens,
        "stop_sequence" => FinishReason::StopSequence,
        _ => FinishReason::Other(reason),
    }
}

impl crate::StreamNormalizer for Normalizer {
    /// Normalizes one event's JSON data. A line that is not an event of this family is an
    /// error naming it.
    fn push(&mut self, _event: Option<&str>, data: &str) -> Result<Normalized, FormatError> {
        if !self.full_only {
            if let Some(fast) = fast_path(data) {
                return Ok(fast);
            }
        }
        let wire: Wire = serde_json::from_str(data)
            .map_err(|e| FormatError(format!("an Anthropic stream event does not parse: {e}")))?;
        let mut out = Vec::new();
        match wire {
            Wire::MessageStart { message } => {
                self.request_id = message.id;
                if let Some(u) = message.usage {
                    self.usage.merge(u);
                    out.push(StreamEvent::Usage(self.usage.canonical()));
                }
            }
            Wire::ContentBlockStart {
                index,
                content_block,
            } => out.extend(self.block_start(index, content_block)),
            Wire::ContentBlockDelta { index, delta } => out.extend(block_delta(index, delta)),
            Wire::ContentBlockStop { index } => {
                if self.tool_blocks.contains(&index) {
                    out.push(StreamEvent::ToolCallEnd { index });
                }
            }
            Wire::MessageDelta { delta, usage } => {
                if let Some(u) = usage {
                    self.usage.merge(u);
                    out.push(StreamEvent::Usage(self.usage.canonical()));
                }
                if let Some(reason) = delta.stop_reason {
                    out.push(StreamEvent::Finish {
                        reason: finish_reason(reason),
                        request_id: self.request_id.clone(),
                    });
                }
            }
            Wire::MessageStop | Wire::Ping | Wire::Unknown => {}
            Wire::Error { error } => {
                return Ok(Normalized::Error(ClassifiedError {
                    class: classify(&error.kind, &error.message),
                    message: format!("{}: {}", error.kind, error.message),
                    retry_after_ms: None,
                }))
            }
        }
        Ok(Normalized::Events(out))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::StreamNormalizer;

    /// A stream in the shape the Messages API documents: thinking with a signature, text, a
    /// tool call with its arguments in pieces, usage at start and at the end.
    const STREAM: &str = "event: message_start\n\
data: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_01\",\"type\":\"message\",\"role\":\"assistant\",\"content\":[],\"model\":\"claude-x\",\"usage\":{\"input_tokens\":25,\"cache_creation_input_tokens\":0,\"cache_read_input_tokens\":12,\"output_tokens\":1}}}\n\n\
event: content_block_start\n\
data: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"thinking\",\"thinking\":\"\"}}\n\n\
event: content_block_delta\n\
data: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"thinking_delta\",\"thinking\":\"Let me see\"}}\n\n\
event: content_block_delta\n\
data: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"signature_delta\",\"signature\":\"EqQB+/==\"}}\n\n\
event: content_block_stop\n\
data: {\"type\":\"content_block_stop\",\"index\":0}\n\n\
event: ping\n\
data: {\"type\": \"ping\"}\n\n\
event: content_block_start\n\
data: {\"type\":\"content_block_start\",\"index\":1,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n\
event: content_block_delta\n\
data: {\"type\":\"content_block_delta\",\"index\":1,\"delta\":{\"type\":\"text_delta\",\"text\":\"Checking \\u00e9\"}}\n\n\
event: content_block_stop\n\
data: {\"type\":\"content_block_stop\",\"index\":1}\n\n\
event: content_block_start\n\
data: {\"type\":\"content_block_start\",\"index\":2,\"content_block\":{\"type\":\"tool_use\",\"id\":\"toolu_01\",\"name\":\"get_weather\",\"input\":{}}}\n\n\
event: content_block_delta\n\
data: {\"type\":\"content_block_delta\",\"index\":2,\"delta\":{\"type\":\"input_json_delta\",\"partial_json\":\"{\\\"city\\\": \\\"Pa\"}}\n\n\
event: content_block_delta\n\
data: {\"type\":\"content_block_delta\",\"index\":2,\"delta\":{\"type\":\"input_json_delta\",\"partial_json\":\"ris\\\"}\"}}\n\n\
event: content_block_stop\n\
data: {\"type\":\"content_block_stop\",\"index\":2}\n\n\
event: message_delta\n\
data: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"tool_use\",\"stop_sequence\":null},\"usage\":{\"output_tokens\":89}}\n\n\
event: message_stop\n\
data: {\"type\":\"message_stop\"}\n\n";

    fn expected() -> Vec<StreamEvent> {
        vec![
            // The total input: 25 read from no cache, 12 from the cache, 0 written to it.
            StreamEvent::Usage(Usage {
                input: Some(37),
                output: Some(1),
                cache_read: Some(12),
                cache_write: Some(0),
                reasoning: None,
            }),
            StreamEvent::ThinkingDelta("Let me see".into()),
            StreamEvent::ThinkingSignature("EqQB+/==".into()),
            StreamEvent::TextDelta("Checking é".into()),
            StreamEvent::ToolCallStart {
                index: 2,
                id: "toolu_01".into(),
                name: "get_weather".into(),
            },
            StreamEvent::ToolCallArgsDelta {
                index: 2,
                json: "{\"city\": \"Pa".into(),
            },
            StreamEvent::ToolCallArgsDelta {
                index: 2,
                json: "ris\"}".into(),
            },
            StreamEvent::ToolCallEnd { index: 2 },
            // The end's running totals, merged with the start's.
            StreamEvent::Usage(Usage {
                input: Some(37),
                output: Some(89),
                cache_read: Some(12),
                cache_write: Some(0),
                reasoning: None,
            }),
            StreamEvent::Finish {
                reason: FinishReason::ToolUse,
                request_id: Some("msg_01".into()),
            },
        ]
    }

    crate::recorded_stream_tests!(STREAM, expected());

    #[test]
    fn usage_without_cache_fields_leaves_them_absent() {
        // message_start with the counts only, then message_delta with the output only: the
        // cache measures (and reasoning, which this family never reports) stay absent.
        let mut n = Normalizer::default();
        let start = r#"{"type":"message_start","message":{"id":"m","usage":{"input_tokens":25,"output_tokens":1}}}"#;
        let delta = r#"{"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"output_tokens":7}}"#;
        let mut usage = Vec::new();
        for data in [start, delta] {
            if let Normalized::Events(evs) = n.push(None, data).unwrap() {
                usage.extend(evs.into_iter().filter_map(|e| match e {
                    StreamEvent::Usage(u) => Some(u),
                    _ => None,
                }));
            }
        }
        assert!(!usage.is_empty(), "the counts are reported");
        for u in &usage {
            assert_eq!(
                (u.cache_read, u.cache_write, u.reasoning),
                (None, None, None),
                "{u:?}"
            );
        }
        assert_eq!(usage[0].input, Some(25));
    }

    /// Golden: the canonical measures of an Anthropic message (docs/usage.md). The total
    /// input adds the cache counts to `input_tokens`; the end's cumulative counts replace the
    /// start's, field by field.
    #[test]
    fn canonical_usage_counts_cached_input_in_the_total() {
        let mut n = Normalizer::default();
        let start = r#"{"type":"message_start","message":{"id":"m","usage":{"input_tokens":10,"cache_creation_input_tokens":100,"cache_read_input_tokens":2000,"output_tokens":1}}}"#;
        let delta = r#"{"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"output_tokens":50}}"#;
        let mut last = None;
        for data in [start, delta] {
            if let Normalized::Events(evs) = n.push(None, data).unwrap() {
                for e in evs {
                    if let StreamEvent::Usage(u) = e {
                        last = Some(u);
                    }
                }
            }
        }
        assert_eq!(
            last,
            Some(Usage {
                input: Some(2110),
                output: Some(50),
                cache_read: Some(2000),
                cache_write: Some(100),
                reasoning: None,
            })
        );
    }

    #[test]
    fn stream_errors_are_classified_where_they_arise() {
        let mut n = Normalizer::default();
        let cases = [
            (
                r#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#,
                ErrorClass::Transient,
            ),
            (
                r#"{"type":"error","error":{"type":"authentication_error","message":"bad key"}}"#,
                ErrorClass::AuthRequired,
            ),
            (
                r#"{"type":"error","error":{"type":"invalid_request_error","message":"prompt is too long: 210000 tokens > 200000 maximum"}}"#,
                ErrorClass::ContextOverflow,
            ),
            (
                r#"{"type":"error","error":{"type":"invalid_request_error","message":"bad field"}}"#,
                ErrorClass::Permanent,
            ),
        ];
        for (data, class) in cases {
            match n.push(None, data).unwrap() {
                Normalized::Error(e) => assert_eq!(e.class, class, "{data}"),
                other => panic!("{other:?}"),
            }
        }
        assert!(n
            .push(None, "not json")
            .unwrap_err()
            .0
            .contains("does not parse"));
    }
}
