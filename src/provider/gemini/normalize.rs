//! Gemini `streamGenerateContent?alt=sse` events -> canonical events. Each event is a whole
//! `GenerateContentResponse`; its candidate's parts arrive in order: text, thought parts
//! (`thought: true`), and function calls, each whole in one part (with its `id` when the API
//! gives one; else broca makes a stable one, `gemini-call-<event>-<index>`, which the WAL
//! records and the renderer never sends back as an id). A `thoughtSignature` on a thought part
//! belongs to that thought; on any other part it is kept as a Thinking block without text
//! right before that part (`StreamEvent::PartSignature`), so the renderer puts it back where
//! it came from.
//!
//! Usage in the canonical measures (docs/usage.md): `promptTokenCount` is the total input
//! (its cached part is `cachedContentTokenCount`, the cache_read); output is
//! `candidatesTokenCount` plus `thoughtsTokenCount` (what is billed as output), reasoning the
//! thoughts alone; the API reports no cache writes. Finish reasons: STOP (a tool use when the
//! answer called a function), MAX_TOKENS; any other (SAFETY, RECITATION, ...) is kept as the
//! API said it.

use serde::Deserialize;

use crate::{Aliases, FormatError, Normalized};
use broca_protocol::{ClassifiedError, FinishReason, StreamEvent, Usage};

use super::render::SYNTHETIC_ID_PREFIX;

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Response {
    #[serde(default)]
    candidates: Vec<Candidate>,
    #[serde(default)]
    usage_metadata: Option<WireUsage>,
    #[serde(default)]
    response_id: Option<String>,
    #[serde(default)]
    prompt_feedback: Option<PromptFeedback>,
    #[serde(default)]
    error: Option<super::GoogleError>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct PromptFeedback {
    #[serde(default)]
    block_reason: Option<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Candidate {
    #[serde(default)]
    content: Option<Content>,
    #[serde(default)]
    finish_reason: Option<String>,
}

#[derive(Deserialize)]
struct Content {
    #[serde(default)]
    parts: Vec<Part>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Part {
    #[serde(default)]
    text: Option<String>,
    #[serde(default)]
    thought: bool,
    #[serde(default)]
    thought_signature: Option<String>,
    #[serde(default)]
    function_call: Option<FunctionCall>,
}

#[derive(Deserialize)]
struct FunctionCall {
    #[serde(default)]
    id: Option<String>,
    name: String,
    #[serde(default)]
    args: Option<Box<serde_json::value::RawValue>>,
}

#[derive(Deserialize, Clone, Copy, Default)]
#[serde(rename_all = "camelCase")]
struct WireUsage {
    #[serde(default)]
    prompt_token_count: Option<u64>,
    #[serde(default)]
    candidates_token_count: Option<u64>,
    #[serde(default)]
    cached_content_token_count: Option<u64>,
    #[serde(default)]
    thoughts_token_count: Option<u64>,
}

impl WireUsage {
    fn canonical(self) -> Usage {
        Usage {
            input: self.prompt_token_count,
            output: self
                .candidates_token_count
                .map(|c| c.saturating_add(self.thoughts_token_count.unwrap_or(0))),
            cache_read: self.cached_content_token_count,
            cache_write: None,
            reasoning: self.thoughts_token_count,
        }
    }
}

/// One attempt's normalizer.
pub struct Normalizer {
    aliases: Aliases,
    events: u64,
    calls: u32,
    usage: Option<WireUsage>,
    request_id: Option<String>,
    finished: bool,
}

impl Normalizer {
    pub fn new(aliases: Aliases) -> Normalizer {
        Normalizer {
            aliases,
            events: 0,
            calls: 0,
            usage: None,
            request_id: None,
            finished: false,
        }
    }

    fn finish(&mut self, out: &mut Vec<StreamEvent>, said: &str) {
        if let Some(u) = self.usage {
            out.push(StreamEvent::Usage(u.canonical()));
        }
        let reason = match said {
            "STOP" | "FUNCTION_CALL" if self.calls > 0 => FinishReason::ToolUse,
            "STOP" => FinishReason::EndTurn,
            "MAX_TOKENS" => FinishReason::MaxTokens,
            other => FinishReason::Other(other.to_string()),
        };
        out.push(StreamEvent::Finish {
            reason,
            request_id: self.request_id.clone(),
        });
        self.finished = true;
    }
}

impl crate::StreamNormalizer for Normalizer {
    fn push(&mut self, _event: Option<&str>, data: &str) -> Result<Normalized, FormatError> {
        let r: Response = serde_json::from_str(data)
            .map_err(|e| FormatError(format!("not a GenerateContentResponse: {e}")))?;
        if let Some(e) = r.error {
            let (class, message) = e.classify();
            return Ok(Normalized::Error(ClassifiedError {
                class,
                message,
                retry_after_ms: e.retry_delay_ms(),
            }));
        }
        let event = self.events;
        self.events += 1;
        if r.response_id.is_some() {
            self.request_id = r.response_id;
        }
        if let Some(u) = r.usage_metadata {
            self.usage = Some(u);
        }
        let mut out = Vec::new();
        if self.finished {
            return Ok(Normalized::Events(out));
        }
        if let Some(reason) = r.prompt_feedback.and_then(|p| p.block_reason) {
            if r.candidates.is_empty() {
                self.finish(&mut out, &format!("PROMPT_BLOCKED_{reason}"));
                return Ok(Normalized::Events(out));
            }
        }
        let Some(c) = r.candidates.into_iter().next() else {
            return Ok(Normalized::Events(out));
        };
        for p in c.content.map(|c| c.parts).unwrap_or_default() {
            if p.thought {
                out.push(StreamEvent::ThinkingDelta(p.text.unwrap_or_default()));
                if let Some(s) = p.thought_signature {
                    out.push(StreamEvent::ThinkingSignature(s));
                }
                continue;
            }
            if let Some(s) = p.thought_signature {
                out.push(StreamEvent::PartSignature(s));
            }
            if let Some(f) = p.function_call {
                let index = self.calls;
                self.calls += 1;
                let id =
                    f.id.filter(|id| !id.is_empty())
                        .unwrap_or_else(|| format!("{SYNTHETIC_ID_PREFIX}{event}-{index}"));
                out.push(StreamEvent::ToolCallStart {
                    index,
                    id,
                    name: self.aliases.caller(f.name),
                });
                out.push(StreamEvent::ToolCallArgsDelta {
                    index,
                    json: f
                        .args
                        .map_or_else(|| "{}".to_string(), |a| a.get().to_string()),
                });
                out.push(StreamEvent::ToolCallEnd { index });
            } else if let Some(t) = p.text.filter(|t| !t.is_empty()) {
                out.push(StreamEvent::TextDelta(t));
            }
        }
        if let Some(reason) = c.finish_reason.filter(|r| !r.is_empty()) {
            self.finish(&mut out, &reason);
        }
        Ok(Normalized::Events(out))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::StreamNormalizer;
    use broca_protocol::ErrorClass;

    fn events(n: &mut Normalizer, data: &str) -> Vec<StreamEvent> {
        match n.push(None, data).unwrap() {
            Normalized::Events(e) => e,
            Normalized::Error(e) => panic!("{e:?}"),
        }
    }

    #[test]
    fn text_thoughts_calls_signatures_and_usage_normalize_in_order() {
        let mut n = Normalizer::new(Aliases::default());
        let mut all = Vec::new();
        all.extend(events(
            &mut n,
            r#"{"candidates":[{"content":{"role":"model","parts":[{"text":"Thinking about it","thought":true,"thoughtSignature":"c2lnLXQ="}]}}],"responseId":"resp-1"}"#,
        ));
        all.extend(events(
            &mut n,
            r#"{"candidates":[{"content":{"role":"model","parts":[{"text":"Let me check."}]}}]}"#,
        ));
        all.extend(events(
            &mut n,
            r#"{"candidates":[{"content":{"role":"model","parts":[{"functionCall":{"name":"ls","args":{"path":"/"}},"thoughtSignature":"c2lnLWM="},{"functionCall":{"id":"fc-9","name":"cat","args":{}}}]},"finishReason":"STOP"}],"usageMetadata":{"promptTokenCount":1200,"cachedContentTokenCount":1000,"candidatesTokenCount":40,"thoughtsTokenCount":25,"totalTokenCount":1265}}"#,
        ));
        assert_eq!(
            all,
            vec![
                StreamEvent::ThinkingDelta("Thinking about it".into()),
                StreamEvent::ThinkingSignature("c2lnLXQ=".into()),
                StreamEvent::TextDelta("Let me check.".into()),
                StreamEvent::PartSignature("c2lnLWM=".into()),
                StreamEvent::ToolCallStart {
                    index: 0,
                    id: "gemini-call-2-0".into(),
                    name: "ls".into()
                },
                StreamEvent::ToolCallArgsDelta {
                    index: 0,
                    json: r#"{"path":"/"}"#.into()
                },
                StreamEvent::ToolCallEnd { index: 0 },
                StreamEvent::ToolCallStart {
                    index: 1,
                    id: "fc-9".into(),
                    name: "cat".into()
                },
                StreamEvent::ToolCallArgsDelta {
                    index: 1,
                    json: "{}".into()
                },
                StreamEvent::ToolCallEnd { index: 1 },
                StreamEvent::Usage(Usage {
                    input: Some(1200),
                    output: Some(65),
                    cache_read: Some(1000),
                    cache_write: None,
                    reasoning: Some(25),
                }),
                StreamEvent::Finish {
                    reason: FinishReason::ToolUse,
                    request_id: Some("resp-1".into())
                },
            ]
        );
    }

    #[test]
    fn usage_without_details_leaves_cache_and_reasoning_absent() {
        let mut n = Normalizer::new(Aliases::default());
        let e = events(
            &mut n,
            r#"{"candidates":[{"content":{"parts":[{"text":"Hi"}]},"finishReason":"STOP"}],"usageMetadata":{"promptTokenCount":7,"candidatesTokenCount":2}}"#,
        );
        assert_eq!(
            e[1],
            StreamEvent::Usage(Usage {
                input: Some(7),
                output: Some(2),
                cache_read: None,
                cache_write: None,
                reasoning: None,
            })
        );
        assert_eq!(
            e[2],
            StreamEvent::Finish {
                reason: FinishReason::EndTurn,
                request_id: None
            }
        );
    }

    #[test]
    fn finish_reasons_map_and_others_are_kept_as_said() {
        for (said, want) in [
            ("MAX_TOKENS", FinishReason::MaxTokens),
            ("SAFETY", FinishReason::Other("SAFETY".into())),
            ("RECITATION", FinishReason::Other("RECITATION".into())),
        ] {
            let mut n = Normalizer::new(Aliases::default());
            let e = events(
                &mut n,
                &format!(r#"{{"candidates":[{{"finishReason":"{said}"}}]}}"#),
            );
            assert_eq!(
                e.last(),
                Some(&StreamEvent::Finish {
                    reason: want,
                    request_id: None
                })
            );
        }
    }

    #[test]
    fn an_error_in_the_stream_is_classified_with_its_retry_delay() {
        let mut n = Normalizer::new(Aliases::default());
        let got = n
            .push(
                None,
                r#"{"error":{"code":429,"message":"Resource has been exhausted","status":"RESOURCE_EXHAUSTED","details":[{"@type":"type.googleapis.com/google.rpc.RetryInfo","retryDelay":"12.5s"}]}}"#,
            )
            .unwrap();
        match got {
            Normalized::Error(e) => {
                assert_eq!(e.class, ErrorClass::Transient);
                assert_eq!(e.retry_after_ms, Some(12_500));
            }
            other => panic!("{other:?}"),
        }
        assert!(n.push(None, "not json").is_err());
    }
}
