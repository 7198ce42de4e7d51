//! The import record: another harness's session log (Claude Code, Codex) taken into a
//! session as one episode. The whole import is one record, so it is durable whole or not
//! at all; its origin names the source file and the blake3 of the bytes it covers, so the
//! same source imported again is recognised, and a longer version of it appends only the
//! lines after the ones already taken.

use serde::{Deserialize, Serialize};

use broca_protocol::{Json, Message, Usage};

/// An imported episode: messages in the canonical form, with what the log said of them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EpisodeImported {
    /// `imp_<lineage>_<seq>`, like a run id.
    pub import_id: String,
    pub origin: ImportOrigin,
    /// The conversation as the log holds it, in order (tool results of calls whose outcome
    /// is unknown carry broca's own text, and their ids are in `outcome_unknown`).
    pub messages: Vec<Message>,
    /// Usage exactly as the log reported it, per assistant message that had any.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub usage: Vec<ImportedUsage>,
    /// Tool calls resolved in this episode as outcome unknown: the log has no result for
    /// them before the conversation went on, or only the placeholder its harness writes
    /// for an aborted or interrupted call. Never counted as successes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub outcome_unknown: Vec<String>,
    /// Tool calls of the last assistant message still without a result when the log ends:
    /// a longer version of the log may bring it; the next send resolves them as outcome
    /// unknown otherwise.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pending: Vec<String>,
    /// What the import left out or changed, each with the line it concerns.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<ImportNote>,
    pub at_unix_ms: u64,
}

/// Where an import came from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImportOrigin {
    /// `claude-code` or `codex`.
    pub format: String,
    /// The source file's path, as resolved when it was imported.
    pub source: String,
    /// The log's own session id: with the format, what makes two files the same source.
    pub source_session: String,
    /// blake3 (hex) of the source's first `bytes` bytes: everything imported so far.
    pub blake3: String,
    /// The bytes covered: up to the end of the last complete line.
    pub bytes: u64,
    /// The 1-based line numbers this episode took: `first_line..=last_line`.
    pub first_line: u64,
    pub last_line: u64,
    /// The import this one continues (a longer version of the same log), if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub continues: Option<String>,
}

/// One assistant message's usage, as the log reported it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ImportedUsage {
    /// Index into the episode's messages.
    pub message: u32,
    /// The log's counts in the canonical measures (docs/usage.md); a count the log did not
    /// report stays absent.
    pub usage: Usage,
    /// The log's own usage object, byte for byte.
    pub reported: Json,
    /// The line it was read from.
    pub line: u64,
    /// The model the log names for it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// The provider's message or response id the log names for it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response_id: Option<String>,
}

/// Something the import left out or changed, and where.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImportNote {
    pub line: u64,
    pub note: String,
}

/// The text of a tool result whose outcome is unknown (`placeholder`: what the harness
/// wrote in its place, if it wrote anything).
pub fn outcome_unknown_text(format: &str, placeholder: Option<&str>) -> String {
    match placeholder {
        Some(p) => format!(
            "outcome unknown: the {format} session stopped before this call's result was \
             recorded (it wrote {p:?}); it may or may not have taken effect"
        ),
        None => format!(
            "outcome unknown: the {format} log has no result for this call; it may or may \
             not have taken effect"
        ),
    }
}
