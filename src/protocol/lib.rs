//! Canonical protocol types, with no I/O: messages of content blocks, the canonical request,
//! stream events, usage and error classes. Providers render from these and normalize into
//! them; the WAL stores them; nothing here knows a wire format.
//!
//! Where things are: canonical types, no I/O: messages of content blocks, tool arguments as raw
//! JSON text (byte-exact), the canonical request, stream events, usage (every measure optional;
//! docs/usage.md), error classes, cache policy, credential-id syntax; the model interface
//! (`model.rs`: `ModelClient`, `ModelStream`, `Failure`, `ProviderCheck`); media (`media.rs`: a
//! media block's reference, which types each family renders, a catalog's input facts, the bytes
//! a request carries, the role's marker); the demo model's script and its built-in tool
//! (`demo.rs`, docs/demo.md); tool-argument checks (`schema.rs`: JSON Schema by the
//! `jsonschema` crate, nothing fetched); the wire families typed (`family.rs`: `Family`, each
//! id spelled once, with the facts core and protocol need of each: the media types it renders,
//! the structured-output modes its provider enforces, its strict schema subset)

pub mod compaction;
pub mod delivery;
pub mod demo;
pub mod family;
pub mod media;
pub mod model;
pub mod ops;
pub mod schema;
pub mod structured;

use std::sync::Arc;

use serde::{Deserialize, Serialize};

/// Whether `id` is a credential id broca can resolve (`env:`, `file:` or `vault:` and a name):
/// runs record the id, never a secret.
pub fn is_credential_id(id: &str) -> bool {
    matches!(id.split_once(':'), Some(("env" | "file" | "vault", name)) if !name.is_empty()
        && name.chars().all(|c| c.is_ascii_alphanumeric() || "_-.".contains(c)))
}

/// A JSON value kept as its raw text (tool arguments): byte-exact as the model produced it,
/// and cheap to store and replay (one string, no map of allocations).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Json(pub Box<serde_json::value::RawValue>);

impl Json {
    /// The raw JSON text.
    pub fn get(&self) -> &str {
        self.0.get()
    }

    /// Raw JSON from a value.
    pub fn from_value(value: &serde_json::Value) -> Json {
        Json(serde_json::value::to_raw_value(value).expect("a Value serializes"))
    }

    /// Raw JSON from text that must be valid JSON.
    pub fn from_text(text: String) -> Result<Json, serde_json::Error> {
        serde_json::value::RawValue::from_string(text).map(Json)
    }

    /// An empty JSON object.
    pub fn empty_object() -> Json {
        Json::from_text("{}".into()).expect("{} is JSON")
    }

    /// Whether the text is a JSON object.
    pub fn is_object(&self) -> bool {
        self.get().trim_start().starts_with('{')
    }
}

impl PartialEq for Json {
    fn eq(&self, other: &Json) -> bool {
        self.get() == other.get()
    }
}

impl Eq for Json {}

/// Who a message is from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    User,
    Assistant,
}

/// One message of a conversation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Message {
    pub role: Role,
    pub content: Vec<Block>,
}

/// A content block. Stored externally tagged (`{"text": {...}}`): it reads without the
/// buffering an internally tagged enum costs, which replay speed depends on.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Block {
    Text {
        text: String,
    },
    /// A tool call, with the caller's id and name (never a provider alias).
    ToolUse {
        id: String,
        name: String,
        input: Json,
    },
    /// A tool's result for the call `tool_use_id`.
    ToolResult {
        tool_use_id: String,
        content: String,
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        is_error: bool,
    },
    /// Model reasoning; `signature` is the provider's opaque token, kept byte for byte.
    Thinking {
        text: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        signature: Option<String>,
    },
    /// An attachment (image or document), its bytes in the session's content store.
    Media(media::Media),
}

/// The blocks a send's user message holds: its prompt's text, then the media it attached.
pub fn user_blocks(prompt: &str, media: &[media::Media]) -> Vec<Block> {
    std::iter::once(Block::Text {
        text: prompt.to_string(),
    })
    .chain(media.iter().cloned().map(Block::Media))
    .collect()
}

impl Message {
    /// A user message of one text block.
    pub fn user_text(text: impl Into<String>) -> Message {
        Message {
            role: Role::User,
            content: vec![Block::Text { text: text.into() }],
        }
    }

    /// The concatenated text blocks.
    pub fn text(&self) -> String {
        self.content
            .iter()
            .filter_map(|b| match b {
                Block::Text { text } => Some(text.as_str()),
                _ => None,
            })
            .collect()
    }

    /// The tool calls in this message, in order.
    pub fn tool_calls(&self) -> impl Iterator<Item = ToolCall> + '_ {
        self.content.iter().filter_map(|b| match b {
            Block::ToolUse { id, name, input } => Some(ToolCall {
                id: id.clone(),
                name: name.clone(),
                input: input.clone(),
            }),
            _ => None,
        })
    }
}

/// A tool call to dispatch.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolCall {
    pub id: String,
    pub name: String,
    pub input: Json,
}

/// A tool offered to the model.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolSpec {
    pub name: String,
    #[serde(default)]
    pub description: String,
    pub input_schema: serde_json::Value,
    /// Which module provides the tool (`mcp:<server>`); never rendered to a provider.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub route: String,
    /// A tool module's reply deadline metadata as its catalog declared it (tool-provider/v1
    /// `reply`: `{max_ms, hold_argument?}`), checked when the catalog was read and frozen
    /// with the tool: how long a call of it is waited for. Never rendered to a provider.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reply: Option<serde_json::Value>,
}

/// The routes a [`ToolSpec`] names: which module provides the tool.
pub mod route {
    /// Tools a daemon module serves over its routes (`subc:<module>@<schema pin>`).
    pub const SUBC_PREFIX: &str = "subc:";
    /// Tools an MCP server of the tools config provides (`mcp:<server>`).
    pub const MCP_PREFIX: &str = "mcp:";
    /// Tools broca itself provides (the demo model's, `crate::demo`).
    pub const BUILTIN_PREFIX: &str = "builtin:";

    /// The tool-provider/v1 schema pin a daemon module's route names (none for another).
    pub fn schema_pin(route: &str) -> Option<&str> {
        let rest = route.strip_prefix(SUBC_PREFIX)?;
        rest.split_once('@')
            .map(|(_, pin)| pin)
            .filter(|p| !p.is_empty())
    }

    /// The module a route names: a daemon module's id, else the route itself
    /// (`mcp:<server>`); what llm-runner/v1 reads calls dispatched to.
    pub fn module(route: &str) -> &str {
        match route.strip_prefix(SUBC_PREFIX) {
            Some(rest) => rest.split_once('@').map_or(rest, |(module, _)| module),
            None => route,
        }
    }
}

/// Generation settings.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Generation {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_output_tokens: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temperature: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_p: Option<f64>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub stop_sequences: Vec<String>,
}

/// The canonical request a renderer turns into a provider's bytes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Request {
    /// The catalog provider id whose wire family renders this request.
    #[serde(default)]
    pub provider: String,
    pub model: String,
    /// Which credential pays (an id such as `env:ANTHROPIC_API_KEY`, never a secret).
    #[serde(default)]
    pub credential_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub system: Option<String>,
    /// Shared with the run's transcript: a request copies pointers, not messages.
    pub messages: Vec<Arc<Message>>,
    /// Shared with the run's frozen config.
    #[serde(default, skip_serializing_if = "no_tools")]
    pub tools: Arc<[ToolSpec]>,
    #[serde(default)]
    pub generation: Generation,
    /// Ask the provider to cache the stable prefix where it supports marking one.
    #[serde(default)]
    pub prompt_cache: bool,
    /// Where the request goes, as the run's frozen catalog entry says (`None` for runs
    /// admitted before entries were frozen: the catalog in use says then).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub route: Option<ProviderRoute>,
    /// The output shape the provider is asked to enforce (a run's enforced
    /// `structured_output`); shared with the run's frozen config.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shape: Option<Arc<OutputShape>>,
    /// The bytes of the media blocks this request's model takes, loaded by the session
    /// before the call (never serialized: a request's record holds the references).
    #[serde(skip)]
    pub media: media::MediaBytes,
}

/// What a provider is asked to constrain: the final text to a schema, or one tool's input
/// to its own schema (the tool rendered in the family's strict form).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OutputShape {
    /// The name a provider takes for a schema.
    pub name: String,
    /// The schema the final text must match, in the route's strict form.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub final_text: Option<serde_json::Value>,
    /// The tool whose input the provider enforces (its spec holds the strict-form schema).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub strict_tool: Option<String>,
}

/// A provider's wire family and base URL, as frozen into a run at admission.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProviderRoute {
    pub family: String,
    pub base_url: String,
}

/// Token usage in the canonical measures, with one meaning in every wire family (each
/// family's normalizer maps its fields onto them; docs/usage.md). A measure not reported
/// stays `None`: absent is not zero.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    /// The total input: the tokens read from no cache, plus those read from a cache
    /// (`cache_read`), plus those written to one (`cache_write`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input: Option<u64>,
    /// Every output token, reasoning included.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output: Option<u64>,
    /// The part of `input` read from a prompt cache.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_read: Option<u64>,
    /// The part of `input` written to a prompt cache.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_write: Option<u64>,
    /// The part of `output` spent reasoning, when the family reports it apart.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning: Option<u64>,
}

impl Usage {
    /// Adds `other` measure by measure, as llm-runner/v1 sums usage: each measure is the sum
    /// over the sides that reported it, absent only when neither did (an unreported count is
    /// never taken as 0). A sum over steps some of which did not report a measure is a lower
    /// bound; whoever needs an exact total (a budget) counts those steps apart.
    pub fn add(&self, other: &Usage) -> Usage {
        let sum = |a: Option<u64>, b: Option<u64>| match (a, b) {
            (Some(a), Some(b)) => Some(a.saturating_add(b)),
            (a, b) => a.or(b),
        };
        let total = Usage {
            input: sum(self.input, other.input),
            output: sum(self.output, other.output),
            cache_read: sum(self.cache_read, other.cache_read),
            cache_write: sum(self.cache_write, other.cache_write),
            reasoning: sum(self.reasoning, other.reasoning),
        };
        // A sum never drops a measure either side reported, nor falls below it.
        debug_assert!(total.input >= self.input.max(other.input));
        debug_assert!(total.output >= self.output.max(other.output));
        debug_assert!(total.reasoning >= self.reasoning.max(other.reasoning));
        total
    }

    /// Merges a later report of the same step: measures reported later replace earlier ones.
    pub fn merge(&mut self, later: &Usage) {
        let pick = |a: &mut Option<u64>, b: Option<u64>| {
            if b.is_some() {
                *a = b;
            }
        };
        pick(&mut self.input, later.input);
        pick(&mut self.output, later.output);
        pick(&mut self.cache_read, later.cache_read);
        pick(&mut self.cache_write, later.cache_write);
        pick(&mut self.reasoning, later.reasoning);
        debug_assert!(
            later.input.is_none() || self.input == later.input,
            "a later report wins"
        );
    }
}

/// Error classes, decided where the error arises; consumers never infer them from messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorClass {
    Transient,
    Permanent,
    AuthRequired,
    ContextOverflow,
}

impl ErrorClass {
    /// The class's wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorClass::Transient => "transient",
            ErrorClass::Permanent => "permanent",
            ErrorClass::AuthRequired => "auth_required",
            ErrorClass::ContextOverflow => "context_overflow",
        }
    }
}

/// An error with its class.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClassifiedError {
    pub class: ErrorClass,
    pub message: String,
    /// How long the provider asked to wait before a retry, when it said.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_after_ms: Option<u64>,
}

/// Why the model stopped a step.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FinishReason {
    /// The model ended its turn.
    EndTurn,
    /// The model asked for tools.
    ToolUse,
    /// The output token limit was reached.
    MaxTokens,
    /// A stop sequence was produced.
    StopSequence,
    /// Anything else the provider said, kept as it said it.
    Other(String),
}

/// What a provider said of its quota when it answered (ChatGPT's `x-codex-*` headers): one
/// entry per window it reports.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Quota {
    pub windows: Vec<QuotaWindow>,
}

/// One quota window.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct QuotaWindow {
    /// The provider's name for it (`primary`, `secondary`).
    pub name: String,
    /// How much of it is used, in hundredths of a percent (4250 = 42.5 %).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub used_basis_points: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window_minutes: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resets_in_seconds: Option<u64>,
}

/// A canonical stream event, as a normalizer produces it.
#[derive(Debug, Clone, PartialEq)]
pub enum StreamEvent {
    TextDelta(String),
    ThinkingDelta(String),
    ThinkingSignature(String),
    /// An opaque signature the provider attached to the part that follows (Gemini's
    /// `thoughtSignature` on a text or function-call part): kept as a Thinking block without
    /// text just before that part's block, and sent back on it.
    PartSignature(String),
    /// The provider's quota as its answer's headers said it (before any other event).
    Quota(Quota),
    ToolCallStart {
        index: u32,
        id: String,
        name: String,
    },
    ToolCallArgsDelta {
        index: u32,
        json: String,
    },
    ToolCallEnd {
        index: u32,
    },
    Usage(Usage),
    Finish {
        reason: FinishReason,
        request_id: Option<String>,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn absent_usage_stays_absent_when_added_and_serialized() {
        let a = Usage {
            input: Some(10),
            output: Some(1),
            ..Usage::default()
        };
        let b = Usage {
            input: Some(3),
            cache_read: Some(5),
            ..Usage::default()
        };
        // Each measure is summed over the sides that reported it; one neither reported stays
        // absent, never 0.
        let sum = a.add(&b);
        assert_eq!(
            sum,
            Usage {
                input: Some(13),
                output: Some(1),
                cache_read: Some(5),
                ..Usage::default()
            }
        );
        assert_eq!(
            serde_json::to_string(&sum).unwrap(),
            r#"{"input":13,"output":1,"cache_read":5}"#
        );
        assert_eq!(Usage::default().add(&Usage::default()), Usage::default());
        assert_eq!(serde_json::to_string(&Usage::default()).unwrap(), "{}");
    }

    #[test]
    fn a_thinking_signature_round_trips_byte_for_byte() {
        let sig = "EqQBCkYIARgCIkD+/=\u{1F600}\\\"x";
        let b = Block::Thinking {
            text: "t".into(),
            signature: Some(sig.into()),
        };
        let back: Block = serde_json::from_str(&serde_json::to_string(&b).unwrap()).unwrap();
        assert_eq!(back, b);
    }
}

/// For serde: a tool list that is left out when empty.
pub fn no_tools(tools: &Arc<[ToolSpec]>) -> bool {
    tools.is_empty()
}

/// Prompt caching policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CachePolicy {
    /// Let the renderer mark cache breakpoints where the provider supports them.
    Auto,
    /// Never ask for caching.
    Off,
}
