//! OpenAI Chat Completions chunks -> canonical events. Usage in the canonical measures
//! (docs/usage.md; asked for with `stream_options.include_usage`): `prompt_tokens` is already
//! the total input (its cached part is `prompt_tokens_details.cached_tokens`, the
//! cache_read; the part written to a cache is `prompt_tokens_details.cache_write_tokens`, the
//! cache_write, where the server reports it, as OpenRouter does), `completion_tokens` the
//! output (reasoning included); a measure not reported stays absent. Tool calls are keyed by
//! their index.

use serde::Deserialize;

use crate::scan::Cursor;
use crate::{Aliases, FormatError, Normalized};
use broca_protocol::{ClassifiedError, ErrorClass, FinishReason, StreamEvent, Usage};

#[derive(Deserialize)]
struct Chunk {
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    choices: Vec<Choice>,
    #[serde(default)]
    usage: Option<WireUsage>,
    #[serde(default)]
    error: Option<WireError>,
}

#[derive(Deserialize)]
struct Choice {
    #[serde(default)]
    delta: Delta,
    #[serde(default)]
    finish_reason: Option<String>,
}

#[derive(Deserialize, Default)]
struct Delta {
    #[serde(default)]
    content: Option<String>,
    #[serde(default)]
    reasoning_content: Option<String>,
    #[serde(default)]
    tool_calls: Vec<ToolCallDelta>,
}

#[derive(Deserialize)]
struct ToolCallDelta {
    index: u32,
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    function: Option<FunctionDelta>,
}

#[derive(Deserialize)]
struct FunctionDelta {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    arguments: Option<String>,
}

#[derive(Deserialize)]
struct WireUsage {
    prompt_tokens: Option<u64>,
    completion_tokens: Option<u64>,
    #[serde(default)]
    prompt_tokens_details: Option<PromptDetails>,
    #[serde(default)]
    completion_tokens_details: Option<CompletionDetails>,
}

#[derive(Deserialize)]
struct PromptDetails {
    cached_tokens: Option<u64>,
    cache_write_tokens: Option<u64>,
}

#[derive(Deserialize)]
struct CompletionDetails {
    reasoning_tokens: Option<u64>,
}

#[derive(Deserialize)]
struct WireError {
    #[serde(default)]
    message: String,
    #[serde(default, rename = "type")]
    kind: Option<String>,
    #[serde(default)]
    code: Option<serde_json::Value>,
}

crate::normalizer_constructors!(Normalizer);

/// The state of one streamed completion.
#[derive(Debug, Default)]
pub struct Normalizer {
    request_id: Option<String>,
    open_tools: Vec<u32>,
    finish: Option<FinishReason>,
    aliases: Aliases,
    /// The bytes before `choices` in the last chunk read by the fast path, and whether a
    /// member preceded `choices` there.
    envelope: Option<(Vec<u8>, bool)>,
    /// Tests: every event through the full parse (the fast path's reference).
    full_only: bool,
}

/// The class of an OpenAI error (by code or type, never by HTTP reason text).
pub fn classify(kind: Option<&str>, code: Option<&str>) -> ErrorClass {
    match (kind, code) {
        (_, Some("context_length_exceeded")) => ErrorClass::ContextOverflow,
        (_, Some("invalid_api_key")) | (Some("authentication_error"), _) => {
            ErrorClass::AuthRequired
        }
        (_, Some("rate_limit_exceeded" | "server_error" | "server_is_overloaded"))
        | (Some("server_error" | "rate_limit_error" | "overloaded_error"), _) => {
            ErrorClass::Transient
        }
        _ => ErrorClass::Permanent,
    }
}

impl crate::StreamNormalizer for Normalizer {
    /// Normalizes one event's data. `[DONE]` ends the stream: the finish reason seen earlier
    /// is emitted then, after the usage chunk that comes between.
    fn push(&mut self, _event: Option<&str>, data: &str) -> Result<Normalized, FormatError> {
        if data.trim() == "[DONE]" {
            let mut out = self.close_tools();
            if let Some(reason) = self.finish.take() {
                out.push(StreamEvent::Finish {
                    reason,
                    request_id: self.request_id.clone(),
                });
            }
            return Ok(Normalized::Events(out));
        }
        if !self.full_only {
            if let Some(fast) = self.fast_path(data) {
                return Ok(fast);
            }
        }
        let chunk: Chunk = serde_json::from_str(data)
            .map_err(|e| FormatError(format!("an OpenAI chat chunk does not parse: {e}")))?;
        if let Some(err) = chunk.error {
            let code = err
                .code
                .as_ref()
                .and_then(|c| c.as_str().map(str::to_string));
            return Ok(Normalized::Error(ClassifiedError {
                class: classify(err.kind.as_deref(), code.as_deref()),
                message: err.message,
                retry_after_ms: None,
            }));
        }
        if self.request_id.is_none() {
            self.request_id = chunk.id;
        }
        let mut out = Vec::new();
        if let Some(choice) = chunk.choices.into_iter().next() {
            self.choice(choice, &mut out);
        }
        if let Some(u) = chunk.usage {
            let details = u.prompt_tokens_details;
            out.push(StreamEvent::Usage(Usage {
                input: u.prompt_tokens,
                output: u.completion_tokens,
                cache_read: details.as_ref().and_then(|d| d.cached_tokens),
                cache_write: details.as_ref().and_then(|d| d.cache_write_tokens),
                reasoning: u.completion_tokens_details.and_then(|d| d.reasoning_tokens),
            }));
        }
        Ok(Normalized::Events(out))
    }
}

impl Normalizer {
    /// A chunk of text or reasoning (nearly all of a stream), read without a full parse;
    /// `None` hands the chunk to the full parse (tool calls, finish, usage, errors).
    fn fast_path(&mut self, data: &str) -> Option<Normalized> {
        let (mut id, mut content, mut reasoning, mut seen_choice) = (None, None, None, false);
        // Every chunk repeats the envelope before `choices` (id, model, fingerprint...): when
        // these bytes equal the last chunk's, they read the same, and are not read again.
        let (mut c, reused) = match &self.envelope {
            Some((prefix, started)) if data.as_bytes().starts_with(prefix) => {
                (Cursor::resume(data, prefix.len(), *started), true)
            }
            _ => {
                let mut c = Cursor::new(data);
                c.object()?;
                (c, false)
            }
        };
        let mut envelope = None;
        loop {
            let before = c.position();
            let Some(key) = c.key()? else { break };
            match key {
                "id" => id = Some(c.value()?),
                "usage" | "error" => {
                    if !c.value()?.is_null() {
                        return None;
                    }
                }
                "choices" => {
                    if !reused && envelope.is_none() {
                        envelope = Some(before);
                    }
                    (content, reasoning) = fast_choice(&mut c)?;
                    seen_choice = true;
                }
                _ => {
                    c.value()?;
                }
            }
        }
        if !seen_choice || !c.at_end() {
            return None;
        }
        let reasoning = match reasoning {
            Some(r) => Some(r.string()?),
            None => None,
        };
        let content = match content {
            Some(c) => Some(c.string()?),
            None => None,
        };
        if self.request_id.is_none() {
            self.request_id = Some(id?.string()?.into_owned());
        }
        if let Some((at, started)) = envelope {
            self.envelope = Some((data.as_bytes()[..at].to_vec(), started));
        }
        let mut out = Vec::with_capacity(1);
        if let Some(r) = reasoning.filter(|r| !r.is_empty()) {
            out.push(StreamEvent::ThinkingDelta(r.into_owned()));
        }
        if let Some(c) = content.filter(|c| !c.is_empty()) {
            out.push(StreamEvent::TextDelta(c.into_owned()));
        }
        Some(Normalized::Events(out))
    }

    /// The first choice's delta: reasoning, text, tool calls, and its finish reason (which
    /// closes the open tool calls; it is emitted at `[DONE]`).
    fn choice(&mut self, choice: Choice, out: &mut Vec<StreamEvent>) {
        if let Some(r) = choice.delta.reasoning_content.filter(|t| !t.is_empty()) {
            out.push(StreamEvent::ThinkingDelta(r));
        }
        if let Some(text) = choice.delta.content.filter(|t| !t.is_empty()) {
            out.push(StreamEvent::TextDelta(text));
        }
        for call in choice.delta.tool_calls {
            self.tool_call(call, out);
        }
        if let Some(reason) = choice.finish_reason {
            out.extend(self.close_tools());
            self.finish = Some(match reason.as_str() {
                "stop" => FinishReason::EndTurn,
                "tool_calls" => FinishReason::ToolUse,
                "length" => FinishReason::MaxTokens,
                _ => FinishReason::Other(reason),
            });
        }
    }

    /// A tool call's delta: its start (with its id and name), then its arguments' pieces.
    fn tool_call(&mut self, call: ToolCallDelta, out: &mut Vec<StreamEvent>) {
        if let Some(id) = call.id {
            let name = call
                .function
                .as_ref()
                .and_then(|f| f.name.clone())
                .unwrap_or_default();
            let name = self.aliases.caller(name);
            self.open_tools.push(call.index);
            out.push(StreamEvent::ToolCallStart {
                index: call.index,
                id,
                name,
            });
        }
        if let Some(args) = call
            .function
            .and_then(|f| f.arguments)
            .filter(|a| !a.is_empty())
        {
            out.push(StreamEvent::ToolCallArgsDelta {
                index: call.index,
                json: args,
            });
        }
    }

    fn close_tools(&mut self) -> Vec<StreamEvent> {
        self.open_tools
            .drain(..)
            .map(|index| StreamEvent::ToolCallEnd { index })
            .collect()
    }
}

/// A chunk's `choices` read without a full parse: its one choice's text and reasoning;
/// `None` (the full parse) for no choice, a finish reason or tool calls.
#[allow(clippy::type_complexity)]
fn fast_choice<'a>(
    c: &mut Cursor<'a>,
) -> Option<(Option<crate::scan::Raw<'a>>, Option<crate::scan::Raw<'a>>)> {
    let (mut content, mut reasoning) = (None, None);
    c.array()?;
    if !c.element()? {
        return None;
    }
    c.object()?;
    while let Some(key) = c.key()? {
        match key {
            "finish_reason" => {
                if !c.value()?.is_null() {
                    return None;
                }
            }
            "delta" => {
                c.object()?;
                while let Some(key) = c.key()? {
                    let v = c.value()?;
                    match key {
                        "content" if !v.is_null() => content = Some(v),
                        "reasoning_content" if !v.is_null() => reasoning = Some(v),
                        "tool_calls" if !v.is_null() => return None,
                        _ => {}
                    }
                }
            }
            _ => {
                c.value()?;
            }
        }
    }
    c.finish_array()?;
    Some((content, reasoning))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::StreamNormalizer;

    const STREAM: &str = "data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"},\"finish_reason\":null}],\"usage\":null}\n\n\
data: {\"id\":\"chatcmpl-1\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hi \\u00e9\"},\"finish_reason\":null}],\"usage\":null}\n\n\
data: {\"id\":\"chatcmpl-1\",\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"id\":\"call_a\",\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"arguments\":\"\"}}]},\"finish_reason\":null}],\"usage\":null}\n\n\
data: {\"id\":\"chatcmpl-1\",\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"function\":{\"arguments\":\"{\\\"city\\\":\"}}]},\"finish_reason\":null}],\"usage\":null}\n\n\
data: {\"id\":\"chatcmpl-1\",\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"function\":{\"arguments\":\"\\\"Paris\\\"}\"}}]},\"finish_reason\":null}],\"usage\":null}\n\n\
data: {\"id\":\"chatcmpl-1\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"tool_calls\"}],\"usage\":null}\n\n\
data: {\"id\":\"chatcmpl-1\",\"choices\":[],\"usage\":{\"prompt_tokens\":30,\"completion_tokens\":12,\"total_tokens\":42,\"prompt_tokens_details\":{\"cached_tokens\":8},\"completion_tokens_details\":{\"reasoning_tokens\":0}}}\n\n\
data: [DONE]\n\n";

    fn normalize(chunks: &[&[u8]]) -> Vec<StreamEvent> {
        crate::normalize_chunks(&super::super::Family, &Aliases::default(), chunks)
    }

    fn expected() -> Vec<StreamEvent> {
        vec![
            StreamEvent::TextDelta("Hi é".into()),
            StreamEvent::ToolCallStart {
                index: 0,
                id: "call_a".into(),
                name: "get_weather".into(),
            },
            StreamEvent::ToolCallArgsDelta {
                index: 0,
                json: "{\"city\":".into(),
            },
            StreamEvent::ToolCallArgsDelta {
                index: 0,
                json: "\"Paris\"}".into(),
            },
            StreamEvent::ToolCallEnd { index: 0 },
            StreamEvent::Usage(Usage {
                input: Some(30),
                output: Some(12),
                cache_read: Some(8),
                cache_write: None,
                reasoning: Some(0),
            }),
            StreamEvent::Finish {
                reason: FinishReason::ToolUse,
                request_id: Some("chatcmpl-1".into()),
            },
        ]
    }

    crate::recorded_stream_tests!(STREAM, expected());

    #[test]
    fn a_reused_envelope_never_hides_a_changed_value() {
        let chunk = |created: &str, text: &str| {
            format!(
                r#"{{"id":"c","created":{created},"choices":[{{"index":0,"delta":{{"content":"{text}"}}}}],"usage":null}}"#
            )
        };
        let mut fast = Normalizer::default();
        let mut full = Normalizer::full_only();
        for (created, text) in [
            ("17", "a"),
            ("17", "b"),
            ("170", "c"),
            ("1", "d"),
            ("17", "e"),
        ] {
            let d = chunk(created, text);
            assert_eq!(
                fast.push(None, &d).unwrap(),
                full.push(None, &d).unwrap(),
                "{d}"
            );
        }
        let usage = r#"{"id":"c","created":17,"choices":[],"usage":{"prompt_tokens":3}}"#;
        assert_eq!(
            fast.push(None, usage).unwrap(),
            full.push(None, usage).unwrap()
        );
    }

    #[test]
    fn a_stream_without_usage_reports_none_never_zero() {
        let s = "data: {\"id\":\"c\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"x\"},\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n";
        let evs = normalize(&[s.as_bytes()]);
        assert!(!evs.iter().any(|e| matches!(e, StreamEvent::Usage(_))));
        assert_eq!(
            evs.last(),
            Some(&StreamEvent::Finish {
                reason: FinishReason::EndTurn,
                request_id: Some("c".into())
            })
        );
    }

    #[test]
    fn cache_writes_are_kept_where_the_server_reports_them() {
        // OpenRouter's usage object: cache reads and writes both inside prompt_tokens.
        let data = r#"{"id":"c","choices":[],"usage":{"prompt_tokens":194,"completion_tokens":2,"prompt_tokens_details":{"cached_tokens":0,"cache_write_tokens":100,"audio_tokens":0},"completion_tokens_details":{"reasoning_tokens":0},"cost":0.95}}"#;
        for mut n in [Normalizer::default(), Normalizer::full_only()] {
            let Normalized::Events(evs) = n.push(None, data).unwrap() else {
                panic!("{data}")
            };
            assert_eq!(
                evs,
                [StreamEvent::Usage(Usage {
                    input: Some(194),
                    output: Some(2),
                    cache_read: Some(0),
                    cache_write: Some(100),
                    reasoning: Some(0),
                })]
            );
        }
    }

    #[test]
    fn usage_without_details_leaves_cache_and_reasoning_absent() {
        // The counts without their details objects, with empty ones, and with nulls: each
        // detail the provider did not report stays absent, never 0.
        for usage in [
            r#"{"prompt_tokens":30,"completion_tokens":12}"#,
            r#"{"prompt_tokens":30,"completion_tokens":12,"prompt_tokens_details":{},"completion_tokens_details":{}}"#,
            r#"{"prompt_tokens":30,"completion_tokens":12,"prompt_tokens_details":null,"completion_tokens_details":{"reasoning_tokens":null}}"#,
        ] {
            for mut n in [Normalizer::default(), Normalizer::full_only()] {
                let data = format!(r#"{{"id":"c","choices":[],"usage":{usage}}}"#);
                let Normalized::Events(evs) = n.push(None, &data).unwrap() else {
                    panic!("{data}")
                };
                assert_eq!(
                    evs,
                    [StreamEvent::Usage(Usage {
                        input: Some(30),
                        output: Some(12),
                        ..Usage::default()
                    })],
                    "{usage}"
                );
            }
        }
    }

    #[test]
    fn errors_in_the_stream_are_classified_by_code() {
        let mut n = Normalizer::default();
        let data = r#"{"error":{"message":"This model's maximum context length is 128000 tokens","type":"invalid_request_error","code":"context_length_exceeded"}}"#;
        let Normalized::Error(e) = n.push(None, data).unwrap() else {
            panic!()
        };
        assert_eq!(e.class, ErrorClass::ContextOverflow);
        let data =
            r#"{"error":{"message":"slow down","type":"requests","code":"rate_limit_exceeded"}}"#;
        let Normalized::Error(e) = n.push(None, data).unwrap() else {
            panic!()
        };
        assert_eq!(e.class, ErrorClass::Transient);
    }
}
