//! Bedrock `ConverseStream` event-stream messages -> canonical events, by `:event-type`:
//! `messageStart`, `contentBlockStart` (a `toolUse` with its `toolUseId`), `contentBlockDelta`
//! (text, a tool's input JSON in pieces, reasoning text and its signature),
//! `contentBlockStop`, `messageStop` (the stop reason), `metadata` (usage, last). An exception
//! message (named by `:exception-type`) is classified: throttling, unavailable, model stream
//! and internal errors are transient; a validation error naming the input's length overflows
//! the context; access denied needs credentials.
//!
//! Usage in the canonical measures (docs/usage.md): `inputTokens` counts what no cache served,
//! so the total input is `inputTokens + cacheReadInputTokens + cacheWriteInputTokens`;
//! `outputTokens` is the output.

use serde::Deserialize;

use crate::scan::{Cursor, Raw};
use crate::template::{Hole, Template};
use crate::{Aliases, FormatError, Normalized};
use broca_protocol::{ClassifiedError, ErrorClass, FinishReason, StreamEvent, Usage};

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct BlockStart {
    #[serde(default)]
    content_block_index: u32,
    start: Start,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Start {
    #[serde(default)]
    tool_use: Option<ToolStart>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ToolStart {
    tool_use_id: String,
    name: String,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct BlockDelta {
    #[serde(default)]
    content_block_index: u32,
    delta: Delta,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Delta {
    #[serde(default)]
    text: Option<String>,
    #[serde(default)]
    tool_use: Option<ToolDelta>,
    #[serde(default)]
    reasoning_content: Option<ReasoningDelta>,
}

#[derive(Deserialize)]
struct ToolDelta {
    #[serde(default)]
    input: String,
}

#[derive(Deserialize)]
struct ReasoningDelta {
    #[serde(default)]
    text: Option<String>,
    #[serde(default)]
    signature: Option<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct BlockStop {
    #[serde(default)]
    content_block_index: u32,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct MessageStop {
    stop_reason: String,
}

#[derive(Deserialize)]
struct Metadata {
    #[serde(default)]
    usage: Option<WireUsage>,
}

#[derive(Deserialize, Clone, Copy)]
#[serde(rename_all = "camelCase")]
struct WireUsage {
    #[serde(default)]
    input_tokens: Option<u64>,
    #[serde(default)]
    output_tokens: Option<u64>,
    #[serde(default)]
    cache_read_input_tokens: Option<u64>,
    #[serde(default)]
    cache_write_input_tokens: Option<u64>,
}

impl WireUsage {
    fn canonical(self) -> Usage {
        let cached = self
            .cache_read_input_tokens
            .unwrap_or(0)
            .saturating_add(self.cache_write_input_tokens.unwrap_or(0));
        Usage {
            input: self.input_tokens.map(|i| i.saturating_add(cached)),
            output: self.output_tokens,
            cache_read: self.cache_read_input_tokens,
            cache_write: self.cache_write_input_tokens,
            reasoning: None,
        }
    }
}

#[derive(Deserialize)]
struct Exception {
    #[serde(default, alias = "Message")]
    message: String,
}

/// The class of a Bedrock exception (by its type, and for validation by what it says).
pub fn classify(kind: &str, message: &str) -> ErrorClass {
    let m = message.to_ascii_lowercase();
    match kind {
        "throttlingException"
        | "serviceUnavailableException"
        | "modelStreamErrorException"
        | "internalServerException"
        | "modelNotReadyException" => ErrorClass::Transient,
        "accessDeniedException" | "unrecognizedClientException" | "expiredTokenException" => {
            ErrorClass::AuthRequired
        }
        "validationException"
            if m.contains("too long")
                || m.contains("input length")
                || m.contains("too many input tokens")
                || m.contains("context window")
                || m.contains("max_tokens") && m.contains("exceed") =>
        {
            ErrorClass::ContextOverflow
        }
        _ => ErrorClass::Permanent,
    }
}

/// The `contentBlockDelta` events that carry text or a tool's input (nearly all of a
/// stream), read without a full parse; `None` hands the event to the full parse (also for a
/// key given twice, which the full parse refuses). A delta's event is kept as a template with
/// holes for its text (or input) and its padding (`p`): the next delta of the block repeats
/// the rest of its bytes, and reads the same.
fn fast_delta(data: &str, last: &mut Last) -> Option<StreamEvent> {
    if let Some(kind) = last.kind {
        if let Some((text, _)) = last.template.fill(data) {
            return kind.event(text);
        }
    }
    last.kind = None;
    last.template.forget();
    let mut d = FastDelta::default();
    let mut c = Cursor::new(data);
    c.object()?;
    let (mut seen_index, mut seen_delta) = (false, false);
    while let Some(key) = c.key()? {
        match key {
            "contentBlockIndex" if !seen_index => {
                seen_index = true;
                d.index = Some(c.value()?);
            }
            "delta" if !seen_delta => {
                // Exactly one member: `text`, or `toolUse` (whose `input` is all it reads).
                seen_delta = true;
                c.object()?;
                match c.key()? {
                    Some("text") => d.text = Some(c.value()?),
                    Some("toolUse") => d.tool(&mut c)?,
                    _ => return None,
                }
                c.key()?.is_none().then_some(())?;
            }
            "contentBlockIndex" | "delta" => return None,
            "p" => d.padding = Some(c.value()?),
            _ => {
                c.value()?;
            }
        }
    }
    if !c.at_end() {
        return None;
    }
    let (kind, value) = match (d.text, d.input) {
        (Some(t), None) => (DeltaKind::Text, t),
        (None, Some(input)) => (
            DeltaKind::Input {
                index: d.index?.u32()?,
            },
            input,
        ),
        _ => return None,
    };
    let ev = kind.event(value)?;
    let span = |s: &str| {
        let at = s.as_ptr() as usize - data.as_ptr() as usize;
        (at, at + s.len())
    };
    if let Raw::Str { quoted, .. } = value {
        let (a, b) = span(quoted);
        let mut holes = vec![(a, b, Hole::Text)];
        if let Some(Raw::Str { quoted, .. }) = d.padding {
            let (a, b) = span(quoted);
            holes.push((a, b, Hole::Str));
        }
        last.template.record(data, &mut holes);
        last.kind = Some(kind);
    }
    Some(ev)
}

/// What a delta's text makes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum DeltaKind {
    Text,
    Input { index: u32 },
}

impl DeltaKind {
    fn event(self, value: Raw<'_>) -> Option<StreamEvent> {
        let text = value.string()?.into_owned();
        Some(match self {
            DeltaKind::Text => StreamEvent::TextDelta(text),
            DeltaKind::Input { index } => StreamEvent::ToolCallArgsDelta { index, json: text },
        })
    }
}

/// The last delta the fast path read, as a template, and what its text makes.
#[derive(Default)]
struct Last {
    template: Template,
    kind: Option<DeltaKind>,
}

/// What the fast path read of a `contentBlockDelta`.
#[derive(Default)]
struct FastDelta<'a> {
    index: Option<Raw<'a>>,
    text: Option<Raw<'a>>,
    input: Option<Raw<'a>>,
    padding: Option<Raw<'a>>,
}

impl<'a> FastDelta<'a> {
    /// A `toolUse` value: its `input` is all that is read.
    fn tool(&mut self, c: &mut Cursor<'a>) -> Option<()> {
        c.object()?;
        while let Some(key) = c.key()? {
            let v = c.value()?;
            if key == "input" {
                self.input = Some(v);
            }
        }
        self.input.get_or_insert(Raw::Scalar("null"));
        Some(())
    }
}

/// One attempt's normalizer.
pub struct Normalizer {
    aliases: Aliases,
    /// Block indexes that are tool uses.
    tools: Vec<u32>,
    stop: Option<String>,
    finished: bool,
    /// Whether delta events may take the fast path (tests compare it with the full parse).
    fast: bool,
    /// The last delta the fast path read (`fast_delta`).
    last: Last,
}

impl Normalizer {
    pub fn new(aliases: Aliases) -> Normalizer {
        Normalizer {
            aliases,
            tools: Vec::new(),
            stop: None,
            finished: false,
            fast: true,
            last: Last::default(),
        }
    }

    /// A `contentBlockDelta` through the full parse.
    fn slow_delta(&mut self, kind: &str, data: &str) -> Result<Normalized, FormatError> {
        let d: BlockDelta = parse(kind, data)?;
        let mut out = Vec::new();
        let i = d.content_block_index;
        if let Some(t) = d.delta.text.filter(|t| !t.is_empty()) {
            out.push(StreamEvent::TextDelta(t));
        }
        if let Some(t) = d.delta.tool_use {
            out.push(StreamEvent::ToolCallArgsDelta {
                index: i,
                json: t.input,
            });
        }
        if let Some(r) = d.delta.reasoning_content {
            if let Some(t) = r.text {
                out.push(StreamEvent::ThinkingDelta(t));
            }
            if let Some(s) = r.signature {
                out.push(StreamEvent::ThinkingSignature(s));
            }
        }
        Ok(Normalized::Events(out))
    }
}

fn parse<'a, T: Deserialize<'a>>(kind: &str, data: &'a str) -> Result<T, FormatError> {
    serde_json::from_str(data).map_err(|e| FormatError(format!("a `{kind}` event: {e}")))
}

impl Normalizer {
    /// The stream's last event: its usage, and the finish the earlier `messageStop` said.
    fn metadata(&mut self, m: Metadata, out: &mut Vec<StreamEvent>) {
        if let Some(u) = m.usage {
            out.push(StreamEvent::Usage(u.canonical()));
        }
        let (Some(stop), false) = (self.stop.take(), self.finished) else {
            return;
        };
        let reason = match stop.as_str() {
            "end_turn" => FinishReason::EndTurn,
            "tool_use" => FinishReason::ToolUse,
            "max_tokens" => FinishReason::MaxTokens,
            "stop_sequence" => FinishReason::StopSequence,
            other => FinishReason::Other(other.to_string()),
        };
        out.push(StreamEvent::Finish {
            reason,
            request_id: None,
        });
        self.finished = true;
    }
}

impl crate::StreamNormalizer for Normalizer {
    fn push(&mut self, event: Option<&str>, data: &str) -> Result<Normalized, FormatError> {
        let kind = event.unwrap_or("");
        let mut out = Vec::new();
        match kind {
            "messageStart" => {}
            "contentBlockStart" => {
                let s: BlockStart = parse(kind, data)?;
                if let Some(t) = s.start.tool_use {
                    self.tools.push(s.content_block_index);
                    out.push(StreamEvent::ToolCallStart {
                        index: s.content_block_index,
                        id: t.tool_use_id,
                        name: self.aliases.caller(t.name),
                    });
                }
            }
            "contentBlockDelta" if self.fast => {
                if let Some(ev) = fast_delta(data, &mut self.last) {
                    if matches!(&ev, StreamEvent::TextDelta(t) if t.is_empty()) {
                        return Ok(Normalized::Events(out));
                    }
                    return Ok(Normalized::Events(vec![ev]));
                }
                return self.slow_delta(kind, data);
            }
            "contentBlockDelta" => return self.slow_delta(kind, data),
            "contentBlockStop" => {
                let s: BlockStop = parse(kind, data)?;
                if self.tools.contains(&s.content_block_index) {
                    out.push(StreamEvent::ToolCallEnd {
                        index: s.content_block_index,
                    });
                }
            }
            "messageStop" => {
                let s: MessageStop = parse(kind, data)?;
                self.stop = Some(s.stop_reason);
            }
            "metadata" => self.metadata(parse(kind, data)?, &mut out),
            k if k.ends_with("Exception") => {
                let e: Exception = parse(kind, data)?;
                return Ok(Normalized::Error(ClassifiedError {
                    class: classify(k, &e.message),
                    message: format!("{k}: {}", e.message),
                    retry_after_ms: None,
                }));
            }
            other => {
                return Err(FormatError(format!(
                    "`{other}` is not a ConverseStream event"
                )))
            }
        }
        Ok(Normalized::Events(out))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::StreamNormalizer;

    fn all(n: &mut Normalizer, events: &[(&str, &str)]) -> Vec<StreamEvent> {
        let mut out = Vec::new();
        for (k, d) in events {
            match n.push(Some(k), d).unwrap() {
                Normalized::Events(e) => out.extend(e),
                Normalized::Error(e) => panic!("{e:?}"),
            }
        }
        out
    }

    #[test]
    fn a_stream_with_reasoning_text_a_tool_and_cached_usage() {
        let mut n = Normalizer::new(Aliases::default());
        let got = all(
            &mut n,
            &[
                ("messageStart", r#"{"role":"assistant"}"#),
                (
                    "contentBlockDelta",
                    r#"{"contentBlockIndex":0,"delta":{"reasoningContent":{"text":"hmm"}}}"#,
                ),
                (
                    "contentBlockDelta",
                    r#"{"contentBlockIndex":0,"delta":{"reasoningContent":{"signature":"c2ln"}}}"#,
                ),
                ("contentBlockStop", r#"{"contentBlockIndex":0}"#),
                (
                    "contentBlockDelta",
                    r#"{"contentBlockIndex":1,"delta":{"text":"Let me look."}}"#,
                ),
                ("contentBlockStop", r#"{"contentBlockIndex":1}"#),
                (
                    "contentBlockStart",
                    r#"{"contentBlockIndex":2,"start":{"toolUse":{"toolUseId":"tooluse_1","name":"ls"}}}"#,
                ),
                (
                    "contentBlockDelta",
                    r#"{"contentBlockIndex":2,"delta":{"toolUse":{"input":"{\"pa"}}}"#,
                ),
                (
                    "contentBlockDelta",
                    r#"{"contentBlockIndex":2,"delta":{"toolUse":{"input":"th\":\"/\"}"}}}"#,
                ),
                ("contentBlockStop", r#"{"contentBlockIndex":2}"#),
                ("messageStop", r#"{"stopReason":"tool_use"}"#),
                (
                    "metadata",
                    r#"{"usage":{"inputTokens":10,"outputTokens":20,"totalTokens":2030,"cacheReadInputTokens":2000},"metrics":{"latencyMs":300}}"#,
                ),
            ],
        );
        assert_eq!(
            got,
            vec![
                StreamEvent::ThinkingDelta("hmm".into()),
                StreamEvent::ThinkingSignature("c2ln".into()),
                StreamEvent::TextDelta("Let me look.".into()),
                StreamEvent::ToolCallStart {
                    index: 2,
                    id: "tooluse_1".into(),
                    name: "ls".into()
                },
                StreamEvent::ToolCallArgsDelta {
                    index: 2,
                    json: "{\"pa".into()
                },
                StreamEvent::ToolCallArgsDelta {
                    index: 2,
                    json: "th\":\"/\"}".into()
                },
                StreamEvent::ToolCallEnd { index: 2 },
                StreamEvent::Usage(Usage {
                    input: Some(2010),
                    output: Some(20),
                    cache_read: Some(2000),
                    cache_write: None,
                    reasoning: None
                }),
                StreamEvent::Finish {
                    reason: FinishReason::ToolUse,
                    request_id: None
                },
            ]
        );
    }

    #[test]
    fn an_event_stream_normalizes_the_same_at_every_split() {
        let events: &[(&str, &str)] = &[
            ("messageStart", r#"{"p":"abcd","role":"assistant"}"#),
            (
                "contentBlockDelta",
                r#"{"contentBlockIndex":0,"delta":{"text":"Caf\u00e9 "},"p":"abcdefgh"}"#,
            ),
            ("contentBlockStop", r#"{"contentBlockIndex":0,"p":"ab"}"#),
            (
                "contentBlockStart",
                r#"{"contentBlockIndex":1,"p":"abc","start":{"toolUse":{"name":"ls","toolUseId":"tooluse_9"}}}"#,
            ),
            (
                "contentBlockDelta",
                r#"{"contentBlockIndex":1,"delta":{"toolUse":{"input":"{\"path\":\"/\"}"}},"p":"a"}"#,
            ),
            (
                "contentBlockStop",
                r#"{"contentBlockIndex":1,"p":"abcdef"}"#,
            ),
            ("messageStop", r#"{"p":"abc","stopReason":"tool_use"}"#),
            (
                "metadata",
                r#"{"metrics":{"latencyMs":120},"p":"ab","usage":{"cacheWriteInputTokens":100,"inputTokens":12,"outputTokens":7,"totalTokens":119}}"#,
            ),
        ];
        let mut bytes = Vec::new();
        for (kind, payload) in events {
            bytes.extend(broca_io::eventstream::encode(
                &[
                    (":event-type", kind),
                    (":content-type", "application/json"),
                    (":message-type", "event"),
                ],
                payload.as_bytes(),
            ));
        }
        let decode = |chunks: &[&[u8]]| {
            let mut d = broca_io::eventstream::EventStreamDecoder::new(1 << 20);
            let mut n = Normalizer::new(Aliases::default());
            let mut out = Vec::new();
            for c in chunks {
                d.push(c, &mut |m| {
                    let kind = m.header_str(":event-type").unwrap().to_string();
                    match n
                        .push(Some(&kind), std::str::from_utf8(&m.payload).unwrap())
                        .unwrap()
                    {
                        Normalized::Events(e) => out.extend(e),
                        Normalized::Error(e) => panic!("{e:?}"),
                    }
                })
                .unwrap();
            }
            out
        };
        let whole = decode(&[&bytes]);
        assert_eq!(whole[0], StreamEvent::TextDelta("Caf\u{e9} ".into()));
        assert_eq!(
            whole[whole.len() - 2],
            StreamEvent::Usage(Usage {
                input: Some(112),
                output: Some(7),
                cache_read: None,
                cache_write: Some(100),
                reasoning: None
            })
        );
        for i in 0..=bytes.len() {
            assert_eq!(decode(&[&bytes[..i], &bytes[i..]]), whole, "split at {i}");
        }
    }

    #[test]
    fn the_fast_path_agrees_with_the_full_parse() {
        for data in [
            r#"{"contentBlockIndex":0,"delta":{"text":"Caf\u00e9 \"x\"\n"},"p":"abc"}"#,
            r#"{"contentBlockIndex":0,"delta":{"text":""}}"#,
            r#"{"contentBlockIndex":3,"delta":{"toolUse":{"input":"{\"a\":"}},"p":"ab"}"#,
            r#"{"contentBlockIndex":0,"delta":{"reasoningContent":{"text":"hm"}}}"#,
            r#"{"contentBlockIndex":0,"delta":{"text":"a","extra":1}}"#,
            r#"{ "delta" : { "text" : "spaced" } , "contentBlockIndex" : 0 }"#,
            r#"{"contentBlockIndex":1,"delta":{"toolUse":{}}}"#,
            r#"{"contentBlockIndex":1,"delta":{"text":"a","toolUse":{"input":"{}"}}}"#,
            r#"{"contentBlockIndex":1,"delta":{"toolUse":{"input":"{}"},"text":"a"}}"#,
            r#"{"contentBlockIndex":0,"delta":"text"}"#,
            r#"{"contentBlockIndex":"0","delta":{"toolUse":{"input":"{}"}}}"#,
            r#"{"contentBlockIndex":0,"delta":{"text":"a"}} x"#,
        ] {
            let mut fast = Normalizer::new(Aliases::default());
            let mut full = Normalizer::new(Aliases::default());
            full.fast = false;
            assert_eq!(
                fast.push(Some("contentBlockDelta"), data).ok(),
                full.push(Some("contentBlockDelta"), data).ok(),
                "{data}"
            );
        }
    }

    #[test]
    fn a_reused_template_never_hides_a_changed_value() {
        let mut fast = Normalizer::new(Aliases::default());
        let mut full = Normalizer::new(Aliases::default());
        full.fast = false;
        for data in [
            r#"{"contentBlockIndex":0,"delta":{"text":"a"},"p":"abc"}"#,
            r#"{"contentBlockIndex":0,"delta":{"text":"b"},"p":"abcdefg"}"#,
            r#"{"contentBlockIndex":0,"delta":{"text":"c\"d"}}"#,
            r#"{"contentBlockIndex":0,"delta":{"text":"e","x":1}}"#,
            r#"{"contentBlockIndex":0,"delta":{"text":"f"},"delta":{"text":"g"}}"#,
            r#"{"contentBlockIndex":0,"delta":{"text":"h"},"contentBlockIndex":1}"#,
            r#"{"contentBlockIndex":0,"delta":{"text":1}}"#,
            r#"{"contentBlockIndex":0,"delta":{"text":"i"}} trailing"#,
            r#"{"contentBlockIndex":0,"delta":{"text":"j"},"p":"x"}"#,
            r#"{"contentBlockIndex":1,"delta":{"text":"k"}}"#,
            r#"{"contentBlockIndex":1,"delta":{"toolUse":{"input":"{}"}}}"#,
            r#"{"contentBlockIndex":1,"delta":{"text":"l"},"p":"ab"}"#,
            r#"{"contentBlockIndex":1,"delta":{"text":"l2"},"p":7}"#,
            r#"{"contentBlockIndex":1,"delta":{"text":"l3"},"p":"a"}"#,
        ] {
            assert_eq!(
                fast.push(Some("contentBlockDelta"), data).ok(),
                full.push(Some("contentBlockDelta"), data).ok(),
                "{data}"
            );
        }
        // The last delta is kept as a template: the next of its block reads through it.
        assert!(fast
            .last
            .template
            .fill(r#"{"contentBlockIndex":1,"delta":{"text":"m"},"p":"abcdef"}"#)
            .is_some());
    }

    #[test]
    fn exceptions_are_classified() {
        for (kind, msg, class) in [
            (
                "throttlingException",
                "Too many requests",
                ErrorClass::Transient,
            ),
            ("serviceUnavailableException", "busy", ErrorClass::Transient),
            ("modelStreamErrorException", "stream", ErrorClass::Transient),
            (
                "validationException",
                "Input is too long for requested model.",
                ErrorClass::ContextOverflow,
            ),
            (
                "validationException",
                "Malformed input request",
                ErrorClass::Permanent,
            ),
            (
                "accessDeniedException",
                "You don't have access",
                ErrorClass::AuthRequired,
            ),
        ] {
            let mut n = Normalizer::new(Aliases::default());
            match n
                .push(Some(kind), &format!(r#"{{"message":"{msg}"}}"#))
                .unwrap()
            {
                Normalized::Error(e) => assert_eq!(e.class, class, "{kind}: {msg}"),
                other => panic!("{other:?}"),
            }
        }
    }
}
