//! Claude Code's session JSONL: one JSON object per line; `user` and `assistant` lines carry
//! an Anthropic Messages `message` (an assistant answer is split over several lines, one per
//! content block, each repeating the message's id and usage); every other line type
//! (attachments, queue operations, request shapes, summaries, cost state) is the harness's
//! own bookkeeping and not part of the conversation. Subagent (`isSidechain`) and meta
//! (`isMeta`) lines are left out.

use serde_json::Value;

use broca_protocol::{Block, Json, Usage};

use crate::episode::Episode;
use crate::{count_of, str_of, Identity, ImportError, Lines};

/// The texts Claude Code writes as a tool's result for a call it interrupted.
const PLACEHOLDERS: &[&str] = &[
    "[Request interrupted by user for tool use]",
    "[Tool call interrupted",
];

pub(crate) fn identify(mut lines: Lines<'_>) -> Result<Option<Identity>, ImportError> {
    let (mut session, mut cwd) = (None, None);
    while let Some(next) = lines.next_value() {
        let (_, v) = next?;
        session = session.or_else(|| str_of(&v, "sessionId").map(str::to_string));
        cwd = cwd.or_else(|| str_of(&v, "cwd").map(str::to_string));
        if session.is_some() && cwd.is_some() {
            break;
        }
    }
    Ok(session.map(|session| Identity { session, cwd }))
}

/// Reads the lines into `episode`; answers the last line's number.
pub(crate) fn read(mut lines: Lines<'_>, episode: &mut Episode) -> Result<u64, ImportError> {
    while let Some(next) = lines.next_value() {
        let (line, v) = next?;
        let kind = str_of(&v, "type").unwrap_or("");
        if !matches!(kind, "user" | "assistant") {
            continue;
        }
        if v.get("isSidechain").and_then(Value::as_bool) == Some(true)
            || v.get("isMeta").and_then(Value::as_bool) == Some(true)
        {
            continue;
        }
        let Some(message) = v.get("message").filter(|m| m.is_object()) else {
            return Err(lines.error(line, format!("a `{kind}` line without a message")));
        };
        if kind == "user" {
            user(&lines, line, &v, message, episode)?;
        } else {
            assistant(&lines, line, message, episode)?;
        }
    }
    Ok(lines.last_line())
}

fn user(
    lines: &Lines<'_>,
    line: u64,
    v: &Value,
    message: &Value,
    episode: &mut Episode,
) -> Result<(), ImportError> {
    let blocks = match message.get("content") {
        Some(Value::String(text)) => {
            episode.user_text(text.clone());
            return Ok(());
        }
        Some(Value::Array(blocks)) => blocks,
        _ => return Err(lines.error(line, "a user message without content".into())),
    };
    let interrupted = str_of(v, "toolDenialKind") == Some("interrupted");
    for b in blocks {
        match str_of(b, "type") {
            Some("text") => episode.user_text(str_of(b, "text").unwrap_or("").to_string()),
            Some("tool_result") => {
                let Some(id) = str_of(b, "tool_use_id") else {
                    return Err(lines.error(line, "a tool_result without its tool_use_id".into()));
                };
                let content = result_text(b.get("content"), line, episode);
                let placeholder =
                    interrupted || PLACEHOLDERS.iter().any(|p| content.starts_with(p));
                let is_error = b.get("is_error").and_then(Value::as_bool) == Some(true);
                episode.tool_result(line, id.to_string(), content, is_error, placeholder);
            }
            other => episode.note(
                line,
                format!("a user `{}` block: left out", other.unwrap_or("?")),
            ),
        }
    }
    Ok(())
}

/// A tool result's text: a string, or the text blocks of a list (others noted).
fn result_text(content: Option<&Value>, line: u64, episode: &mut Episode) -> String {
    match content {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(parts)) => {
            let mut texts = Vec::new();
            for p in parts {
                match (str_of(p, "type"), str_of(p, "text")) {
                    (Some("text"), Some(t)) => texts.push(t),
                    (kind, _) => episode.note(
                        line,
                        format!("a tool result's `{}` part: left out", kind.unwrap_or("?")),
                    ),
                }
            }
            texts.join("\n")
        }
        _ => String::new(),
    }
}

fn assistant(
    lines: &Lines<'_>,
    line: u64,
    message: &Value,
    episode: &mut Episode,
) -> Result<(), ImportError> {
    let mut blocks = Vec::new();
    match message.get("content") {
        Some(Value::String(text)) => blocks.push(Block::Text { text: text.clone() }),
        Some(Value::Array(parts)) => {
            for b in parts {
                if let Some(block) = assistant_block(lines, line, b, episode)? {
                    blocks.push(block);
                }
            }
        }
        _ => return Err(lines.error(line, "an assistant message without content".into())),
    }
    episode.assistant(blocks);
    let model = str_of(message, "model");
    if let Some(u) = message.get("usage").filter(|u| u.is_object()) {
        if model == Some("<synthetic>") {
            episode.note(
                line,
                "the usage of a message Claude Code wrote itself (model <synthetic>): left out",
            );
        } else {
            episode.usage(
                line,
                usage(u),
                Json::from_value(u),
                model.map(str::to_string),
                str_of(message, "id").map(str::to_string),
            );
        }
    }
    Ok(())
}

fn assistant_block(
    lines: &Lines<'_>,
    line: u64,
    b: &Value,
    episode: &mut Episode,
) -> Result<Option<Block>, ImportError> {
    Ok(match str_of(b, "type") {
        Some("text") => Some(Block::Text {
            text: str_of(b, "text").unwrap_or("").to_string(),
        }),
        Some("tool_use") => {
            let (Some(id), Some(name)) = (str_of(b, "id"), str_of(b, "name")) else {
                return Err(lines.error(line, "a tool_use without its id or name".into()));
            };
            let input = b
                .get("input")
                .cloned()
                .unwrap_or(Value::Object(Default::default()));
            Some(Block::ToolUse {
                id: id.to_string(),
                name: name.to_string(),
                input: Json::from_value(&input),
            })
        }
        Some("thinking") => match str_of(b, "signature").filter(|s| !s.is_empty()) {
            Some(signature) => Some(Block::Thinking {
                text: str_of(b, "thinking").unwrap_or("").to_string(),
                signature: Some(signature.to_string()),
            }),
            None => {
                episode.note(
                    line,
                    "a thinking block without its signature cannot be sent back: left out",
                );
                None
            }
        },
        Some("redacted_thinking") => {
            episode.note(line, "a redacted thinking block cannot be kept: left out");
            None
        }
        other => {
            episode.note(
                line,
                format!("an assistant `{}` block: left out", other.unwrap_or("?")),
            );
            None
        }
    })
}

/// Anthropic's counts in the canonical measures: the total input is the uncached input plus
/// the cache reads and writes; a count not reported stays absent.
fn usage(u: &Value) -> Usage {
    let cache_read = count_of(u, "cache_read_input_tokens");
    let cache_write = count_of(u, "cache_creation_input_tokens");
    Usage {
        input: count_of(u, "input_tokens").map(|i| {
            i.saturating_add(cache_read.unwrap_or(0))
                .saturating_add(cache_write.unwrap_or(0))
        }),
        output: count_of(u, "output_tokens"),
        cache_read,
        cache_write,
        reasoning: u
            .get("output_tokens_details")
            .and_then(|d| count_of(d, "thinking_tokens")),
    }
}
