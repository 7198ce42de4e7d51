//! Gemini `streamGenerateContent?alt=sse` events -> canonical events. Each event is a whole
//! `GenerateContentResponse`; its candidate's parts arrive in order: text, thought parts
//! (`thought: true`), and function calls, each whole in one part (with its `id` when the API
//! gives one; else broca makes a stable one, `gemini-call-<event>-<index>`, which the WAL
//! records and the renderer never sends back as an id). A `thoughtSignature` on a thought part
//! belongs to that thought; on any other part it is kept as a Thinking block without text
//! right before that part (`StreamEvent::PartSignature`), so the renderer puts it back where
//! it came from.
//!
//! Usage in the canonical measures (docs/usage.md): `promptTokenCount` plus
//! `toolUsePromptTokenCount` (the results of the API's own tools, such as search grounding or
//! code execution, fed back as input) is the total input (its cached part is
//! `cachedContentTokenCount`, the cache_read); output is
//! `candidatesTokenCount` plus `thoughtsTokenCount` (what is billed as output), reasoning the
//! thoughts alone; the API reports no cache writes. Finish reasons: STOP (a tool use when the
//! answer called a function), MAX_TOKENS; any other (SAFETY, RECITATION, ...) is kept as the
//! API said it.

use serde::Deserialize;

use crate::scan::{Cursor, Raw};
use crate::{Aliases, FormatError, Normalized};
use broca_protocol::{ClassifiedError, FinishReason, StreamEvent, Usage};

use super::render::SYNTHETIC_ID_PREFIX;
use crate::template::{Counts, Hole, Template};

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
    #[serde(default)]
    tool_use_prompt_token_count: Option<u64>,
}

impl WireUsage {
    fn from_counts(c: Counts) -> WireUsage {
        WireUsage {
            prompt_token_count: c[0],
            candidates_token_count: c[1],
            cached_content_token_count: c[2],
            thoughts_token_count: c[3],
            tool_use_prompt_token_count: c[4],
        }
    }

    fn canonical(self) -> Usage {
        // A count of the two that was not reported adds nothing; with neither reported the
        // measure is absent.
        let sum = |a: Option<u64>, b: Option<u64>| match (a, b) {
            (None, None) => None,
            (a, b) => Some(a.unwrap_or(0).saturating_add(b.unwrap_or(0))),
        };
        Usage {
            input: sum(self.prompt_token_count, self.tool_use_prompt_token_count),
            output: sum(self.candidates_token_count, self.thoughts_token_count),
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
    /// The last event the fast path read, with holes for its text and usage counts:
    /// consecutive events of a stream repeat the rest of its bytes (`template`).
    envelope: Envelope,
    /// Tests: every event through the full parse (the fast path's reference).
    full_only: bool,
}

/// An event of one text part as a template, and what its bytes outside the holes read as.
#[derive(Default)]
struct Envelope {
    template: Template,
    thought: bool,
    finish: Option<String>,
    /// Whether the event had `usageMetadata` (its counts are the template's holes).
    usage: bool,
    response_id: Option<String>,
}

/// One text or thought part as the fast path read it: the text, the thought flag, the
/// signature.
type FastPart<'a> = (Raw<'a>, bool, Option<Raw<'a>>);

impl Normalizer {
    pub fn new(aliases: Aliases) -> Normalizer {
        Normalizer {
            aliases,
            events: 0,
            calls: 0,
            usage: None,
            request_id: None,
            finished: false,
            envelope: Envelope::default(),
            full_only: false,
        }
    }

    #[cfg(test)]
    pub(crate) fn full_only() -> Normalizer {
        Normalizer {
            full_only: true,
            ..Normalizer::new(Aliases::default())
        }
    }

    /// The events of the common shape, read in one pass: one candidate whose parts are text
    /// and thoughts (a thought's signature included), its finish reason, the usage, the
    /// response id and fields that do not matter. `None` for anything else (a function call,
    /// an error, prompt feedback, an escaped key, a value of another type), which the full
    /// parse then reads: it is the reference, and tests hold the two equal.
    fn fast_path(&mut self, data: &str) -> Option<Normalized> {
        if let Some((text, counts)) = self.envelope.template.fill(data) {
            let e = std::mem::take(&mut self.envelope);
            let usage = e.usage.then(|| WireUsage::from_counts(counts));
            let out = self.emit(
                &[(text, e.thought, None)],
                e.finish.as_deref(),
                usage,
                e.response_id.as_deref(),
            );
            self.envelope = e;
            return out;
        }
        self.envelope.template.forget();
        let mut c = Cursor::new(data);
        c.object()?;
        let mut parts: Vec<FastPart<'_>> = Vec::new();
        let (mut finish, mut usage, mut response_id) = (None, None, None);
        let mut count_spans: Vec<(&str, Hole)> = Vec::new();
        while let Some(key) = c.key()? {
            match key {
                "candidates" => finish = read_candidates(&mut c, &mut parts)?,
                "usageMetadata" => usage = Some(read_usage(&mut c, &mut count_spans)?),
                "responseId" => response_id = Some(c.value()?.plain()?),
                "modelVersion" | "createTime" => {
                    c.value()?;
                }
                _ => return None,
            }
        }
        if !c.at_end() {
            return None;
        }
        let out = self.emit(&parts, finish, usage, response_id)?;
        if let [(Raw::Str { quoted, .. }, thought, None)] = parts[..] {
            let recorded = Recorded {
                quoted,
                thought,
                finish,
                usage: usage.is_some(),
                response_id,
            };
            self.record(data, recorded, &count_spans);
        }
        Some(out)
    }

    /// Keeps an event of one text part as the template the next ones are read against.
    fn record(&mut self, data: &str, r: Recorded<'_>, count_spans: &[(&str, Hole)]) {
        let span = |s: &str| {
            let start = s.as_ptr() as usize - data.as_ptr() as usize;
            assert!(
                start + s.len() <= data.len(),
                "a hole lies inside the event"
            );
            (start, start + s.len())
        };
        let (start, end) = span(r.quoted);
        let mut holes = vec![(start, end, Hole::Text)];
        for &(s, hole) in count_spans {
            let (a, b) = span(s);
            holes.push((a, b, hole));
        }
        let e = &mut self.envelope;
        e.template.record(data, &mut holes);
        e.thought = r.thought;
        e.finish = r.finish.map(str::to_string);
        e.usage = r.usage;
        e.response_id = r.response_id.map(str::to_string);
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

    /// The events of one event the fast path read.
    fn emit(
        &mut self,
        parts: &[FastPart<'_>],
        finish: Option<&str>,
        usage: Option<WireUsage>,
        response_id: Option<&str>,
    ) -> Option<Normalized> {
        let mut out = Vec::with_capacity(parts.len() + 2);
        for &(text, thought, signature) in parts {
            let text = text.string()?;
            let signature = match signature {
                Some(s) => Some(s.string()?),
                None => None,
            };
            if thought {
                out.push(StreamEvent::ThinkingDelta(text.into_owned()));
                if let Some(s) = signature {
                    out.push(StreamEvent::ThinkingSignature(s.into_owned()));
                }
            } else {
                if let Some(s) = signature {
                    out.push(StreamEvent::PartSignature(s.into_owned()));
                }
                if !text.is_empty() {
                    out.push(StreamEvent::TextDelta(text.into_owned()));
                }
            }
        }
        self.events += 1;
        if let Some(id) = response_id {
            if self.request_id.as_deref() != Some(id) {
                self.request_id = Some(id.to_string());
            }
        }
        if usage.is_some() {
            self.usage = usage;
        }
        if self.finished {
            return Some(Normalized::Events(Vec::new()));
        }
        if let Some(reason) = finish.filter(|r| !r.is_empty()) {
            self.finish(&mut out, reason);
        }
        Some(Normalized::Events(out))
    }
}

/// What of a one-text-part event the fast path keeps as its template.
struct Recorded<'a> {
    quoted: &'a str,
    thought: bool,
    finish: Option<&'a str>,
    usage: bool,
    response_id: Option<&'a str>,
}

impl Normalizer {
    /// One part of the candidate of event `event`: a thought, text, or a function call (whole
    /// in one part: start, arguments and end at once; an id made up when it has none).
    fn part(&mut self, p: Part, event: u64, out: &mut Vec<StreamEvent>) {
        if p.thought {
            out.push(StreamEvent::ThinkingDelta(p.text.unwrap_or_default()));
            if let Some(s) = p.thought_signature {
                out.push(StreamEvent::ThinkingSignature(s));
            }
            return;
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
}

impl crate::StreamNormalizer for Normalizer {
    fn push(&mut self, _event: Option<&str>, data: &str) -> Result<Normalized, FormatError> {
        if !self.full_only {
            if let Some(fast) = self.fast_path(data) {
                return Ok(fast);
            }
        }
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
            self.part(p, event, &mut out);
        }
        if let Some(reason) = c.finish_reason.filter(|r| !r.is_empty()) {
            self.finish(&mut out, &reason);
        }
        Ok(Normalized::Events(out))
    }
}

/// The `candidates` of an event the fast path reads: at most one, whose parts are text
/// (into `parts`); answers its finish reason. `None` for anything else.
fn read_candidates<'a>(
    c: &mut Cursor<'a>,
    parts: &mut Vec<FastPart<'a>>,
) -> Option<Option<&'a str>> {
    let mut finish = None;
    let mut candidates = 0;
    c.array()?;
    while c.element()? {
        candidates += 1;
        if candidates > 1 {
            return None;
        }
        c.object()?;
        while let Some(key) = c.key()? {
            match key {
                "content" => {
                    c.object()?;
                    while let Some(key) = c.key()? {
                        match key {
                            "parts" => read_parts(c, parts)?,
                            "role" => {
                                c.value()?;
                            }
                            _ => return None,
                        }
                    }
                }
                "finishReason" => finish = Some(c.value()?.plain()?),
                "index" | "safetyRatings" | "citationMetadata" => {
                    c.value()?;
                }
                _ => return None,
            }
        }
    }
    Some(finish)
}

/// A candidate's parts, each text with its thought flag and signature; `None` on a part
/// that is not text (a function call) or on anything odd.
fn read_parts<'a>(c: &mut Cursor<'a>, parts: &mut Vec<FastPart<'a>>) -> Option<()> {
    c.array()?;
    while c.element()? {
        c.object()?;
        let (mut text, mut thought, mut signature) = (None, false, None);
        while let Some(key) = c.key()? {
            let v = c.value()?;
            match (key, v) {
                ("text", Raw::Str { .. }) => text = Some(v),
                ("thought", Raw::Scalar("true")) => thought = true,
                ("thought", Raw::Scalar("false")) => thought = false,
                ("thoughtSignature", Raw::Str { .. }) => signature = Some(v),
                _ => return None,
            }
        }
        parts.push((text?, thought, signature));
    }
    Some(())
}

/// `usageMetadata`: the counts the canonical usage needs, the rest skipped; `None` on a count
/// that is not a plain integer. Each top-level integer is noted in `holes` with where it stands
/// (the template's holes: Gemini sends running totals).
fn read_usage<'a>(c: &mut Cursor<'a>, holes: &mut Vec<(&'a str, Hole)>) -> Option<WireUsage> {
    let mut counts = [None; 5];
    c.object()?;
    while let Some(key) = c.key()? {
        let v = c.value()?;
        let k = match key {
            "promptTokenCount" => Some(0),
            "candidatesTokenCount" => Some(1),
            "cachedContentTokenCount" => Some(2),
            "thoughtsTokenCount" => Some(3),
            "toolUsePromptTokenCount" => Some(4),
            _ => None,
        };
        match (k, v) {
            (Some(k), Raw::Scalar(text)) => {
                counts[k] = Some(v.u64()?);
                holes.push((text, Hole::Count(k)));
            }
            (Some(_), _) => return None,
            (None, Raw::Scalar(text)) if v.u64().is_some() => holes.push((text, Hole::Other)),
            (None, _) => {}
        }
    }
    Some(WireUsage::from_counts(counts))
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
    fn canonical_usage_counts_the_tool_use_prompt_as_input() {
        // A grounded answer: the search results the API fed back are billed input, reported
        // apart from the prompt (totalTokenCount = prompt + toolUse + candidates + thoughts).
        // The second event repeats the first's shape, so it takes the fast path (the
        // template's holes) and must read the counts the same way.
        let mut n = Normalizer::new(Aliases::default());
        let event = |text: &str, counts: [u64; 4], finish: &str| {
            let [p, t, c, r] = counts;
            format!(
                r#"{{"candidates":[{{"content":{{"parts":[{{"text":"{text}"}}]}}{finish}}}],"usageMetadata":{{"promptTokenCount":{p},"toolUsePromptTokenCount":{t},"candidatesTokenCount":{c},"thoughtsTokenCount":{r},"totalTokenCount":{}}}}}"#,
                p + t + c + r
            )
        };
        let mut all = events(&mut n, &event("Hi", [7, 120, 1, 5], ""));
        all.extend(events(&mut n, &event("you", [7, 120, 2, 5], "")));
        all.extend(events(
            &mut n,
            &event("there", [7, 120, 4, 5], r#","finishReason":"STOP""#),
        ));
        let usage: Vec<&Usage> = all
            .iter()
            .filter_map(|e| match e {
                StreamEvent::Usage(u) => Some(u),
                _ => None,
            })
            .collect();
        assert_eq!(
            usage.last().copied(),
            Some(&Usage {
                input: Some(127),
                output: Some(9),
                cache_read: None,
                cache_write: None,
                reasoning: Some(5),
            }),
            "{all:?}"
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

    /// More recorded shapes beside the family's golden stream: a finish with text, usage with
    /// its per-modality details, several candidates, prompt feedback, an error.
    const MORE: &str = concat!(
        "data: {\"candidates\": [{\"content\": {\"parts\": [{\"text\": \"Done.\"}],\"role\": \"model\"},\"finishReason\": \"STOP\",\"index\": 0}],\"usageMetadata\": {\"promptTokenCount\": 5,\"candidatesTokenCount\": 2,\"totalTokenCount\": 7,\"promptTokensDetails\": [{\"modality\": \"TEXT\",\"tokenCount\": 5}],\"trafficType\": \"ON_DEMAND\"},\"modelVersion\": \"gemini-2.5-flash\",\"responseId\": \"r-2\"}\r\n\r\n",
        "data: {\"candidates\": [{\"content\": {\"parts\": [{\"text\": \"a\"}]}},{\"content\": {\"parts\": [{\"text\": \"b\"}]}}]}\r\n\r\n",
        "data: {\"candidates\": [{\"content\": {\"parts\": [{\"text\": \"\",\"thoughtSignature\": \"c2ln\"}]}}],\"usageMetadata\": {\"promptTokenCount\": null}}\r\n\r\n",
        "data: {\"promptFeedback\": {\"blockReason\": \"SAFETY\"},\"usageMetadata\": {\"promptTokenCount\": 5}}\r\n\r\n",
        "data: {\"candidates\": [{\"content\": null,\"finishReason\": \"MAX_TOKENS\"}]}\r\n\r\n",
        "data: {\"error\": {\"code\": 503,\"message\": \"overloaded\",\"status\": \"UNAVAILABLE\"}}\r\n\r\n",
    );

    #[test]
    fn the_fast_path_agrees_with_the_full_parse() {
        for stream in [super::super::tests::STREAM, MORE] {
            crate::assert_fast_path_agrees(
                stream.as_bytes(),
                Normalizer::new(Aliases::default()),
                Normalizer::full_only(),
            );
        }
    }

    #[test]
    fn a_reused_envelope_never_hides_a_changed_value() {
        let event = |text: &str, usage: &str, finish: &str| {
            format!(
                r#"{{"candidates": [{{"content": {{"parts": [{{"text": "{text}"}}],"role": "model"}}{finish},"index": 0}}],"usageMetadata": {{"promptTokenCount": {usage},"totalTokenCount": 9}},"responseId": "r"}}"#
            )
        };
        let mut fast = Normalizer::new(Aliases::default());
        let mut full = Normalizer::full_only();
        for d in [
            event("a", "4", ""),
            event("b", "4", ""),
            event(r#"c\""#, "4", ""),
            event("d", "40", ""),
            event("e", "4", ""),
            event("", "4", ""),
            event(r"f\u00e9", "4", ""),
            event(r"g\q", "4", ""),
            event(r#"\"},{\"text\": \"h"#, "4", ""),
            event("i", "4", r#","finishReason": "STOP""#),
            event("j", "4", ""),
        ] {
            assert_eq!(fast.push(None, &d).ok(), full.push(None, &d).ok(), "{d}");
        }
        // A text that closes the string early and goes on as JSON of its own is not one
        // string between the envelope's bytes.
        let mut fast = Normalizer::new(Aliases::default());
        let mut full = Normalizer::full_only();
        for d in [
            event("a", "4", ""),
            event(r#"x", "thought": true, "y": "z"#, "4", ""),
            event(r#"x"}, {"text": "y"#, "4", ""),
        ] {
            assert_eq!(fast.push(None, &d).ok(), full.push(None, &d).ok(), "{d}");
        }
    }

    #[test]
    fn the_fast_path_reads_the_common_shape_itself() {
        let mut n = Normalizer::new(Aliases::default());
        let text = r#"{"candidates": [{"content": {"parts": [{"text": "Hi \"you\""}],"role": "model"},"index": 0}],"usageMetadata": {"promptTokenCount": 4,"totalTokenCount": 4},"modelVersion": "gemini-2.5-flash","responseId": "r-9"}"#;
        assert_eq!(
            n.fast_path(text),
            Some(Normalized::Events(vec![StreamEvent::TextDelta(
                "Hi \"you\"".into()
            )]))
        );
        assert_eq!(n.request_id.as_deref(), Some("r-9"));
        // The next event with the same bytes around its text is read through the envelope.
        let next = text.replace(r#"Hi \"you\""#, "there");
        assert!(n.envelope.template.fill(&next).is_some());
        assert!(n
            .envelope
            .template
            .fill(&next.replace("\"r-9\"", "\"r-10\""))
            .is_none());
        // The usage counts are holes too: a running total reads through the template.
        let (_, counts) = n
            .envelope
            .template
            .fill(&next.replace("\"promptTokenCount\": 4", "\"promptTokenCount\": 47"))
            .unwrap();
        assert_eq!(counts, [Some(47), None, None, None, None]);
        let call =
            r#"{"candidates": [{"content": {"parts": [{"functionCall": {"name": "ls"}}]}}]}"#;
        assert_eq!(n.fast_path(call), None);
        assert!(
            n.envelope.template.fill(&next).is_none(),
            "an event the walk declined forgets it"
        );
    }
}
