//! Late results (tool-provider/v1 §7), sans-IO: the `late_results` read and its ack, and
//! what an entry settles. A module that declares the `late_results` session capability may
//! answer a call with a held first reply (`held-reply/v1`); the call's answer is then the
//! terminal entry of its call key (`result`, `not_started`, `expired`), which broca, the
//! call's custodian, pulls. Entries are deduplicated on their event id: the same late result
//! always carries the same one, across a provider's restarts and lost acks.

use cortexkit_role_tool_provider::late_results::{
    AckRequest, Cursor, EntryKind, LateResultsReply, LateResultsRequest, CURSOR_INCARNATION_CHANGED,
};
use cortexkit_role_tool_provider::ops;
use serde_json::Value;
use subc_protocol::FrameType;

use super::{error_body, op_request, read_result_v1, Part, Reply};
use crate::frames::FrameIn;

pub use cortexkit_role_tool_provider::late_results::{
    Cursor as LateCursor, LateEntry, LateResultsReply as LateRead,
};
pub use cortexkit_role_tool_provider::result::is_person_wait;

/// Entries asked for at most per read.
pub const READ_LIMIT: u32 = 100;

/// The `late_results` request: entries after `since` (`None`: from the start).
pub fn read_request(since: Option<&Cursor>) -> Vec<u8> {
    let mut req = LateResultsRequest::new().with_limit(READ_LIMIT);
    if let Some(c) = since {
        req = req.with_since(c.clone());
    }
    op_request(
        ops::LATE_RESULTS,
        serde_json::to_value(req).expect("a late_results request serializes"),
    )
}

/// The `late_results.ack` request: every entry through `through` is taken.
pub fn ack_request(through: &Cursor) -> Vec<u8> {
    let ack = AckRequest {
        through: through.clone(),
    };
    op_request(
        ops::LATE_RESULTS_ACK,
        serde_json::to_value(ack).expect("an ack serializes"),
    )
}

/// What a `late_results` read answered.
#[derive(Debug)]
pub enum Read {
    Entries(LateResultsReply),
    /// The cursor is from another provider incarnation (or past its log): read again from
    /// the start, and deduplicate on the event ids.
    FromStart,
    Failed(String),
}

pub fn read_answer(module_id: &str, frame: &FrameIn) -> Read {
    match frame.header.ty {
        FrameType::Response => match serde_json::from_slice::<LateResultsReply>(&frame.body) {
            Ok(reply) => Read::Entries(reply),
            Err(e) => Read::Failed(format!(
                "tool module `{module_id}`'s late_results answer does not decode: {e}"
            )),
        },
        FrameType::Error => {
            let e = error_body(&frame.body);
            if e.code == CURSOR_INCARNATION_CHANGED {
                Read::FromStart
            } else {
                Read::Failed(format!(
                    "tool module `{module_id}` refused late_results ({}): {}",
                    e.code, e.message
                ))
            }
        }
        other => Read::Failed(format!("a {other:?} frame answered late_results")),
    }
}

/// What one entry means for its call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Settled {
    /// The call's answer (a result, or the outcome a reduced entry kept).
    Answer(Reply),
    /// The call never ran (its reason).
    NotStarted(String),
    /// The provider kept the call past its retention: its outcome is unknown.
    Expired,
    /// Not terminal: a held call's new reason, a progress note, or a kind broca does not
    /// know (recorded and acked, never retried).
    Note(String),
}

/// Reads `entry` for a call of `module_id` whose answers are `tool-result/v1` bodies.
pub fn settle(module_id: &str, entry: &LateEntry) -> Settled {
    match entry.kind() {
        EntryKind::Result if entry.reduced || entry.result.is_none() => {
            Settled::Answer(Reply::Answer {
                text: entry
                    .outcome
                    .clone()
                    .or_else(|| entry.text.clone())
                    .unwrap_or_else(|| "the tool settled; its result was not kept".into()),
                is_error: false,
            })
        }
        EntryKind::Result => Settled::Answer(result_reply(
            module_id,
            entry.result.as_ref().expect("checked above"),
        )),
        EntryKind::NotStarted => Settled::NotStarted(
            entry
                .reason
                .clone()
                .unwrap_or_else(|| "no reason given".into()),
        ),
        EntryKind::Expired => Settled::Expired,
        EntryKind::Held => Settled::Note(format!(
            "held: {}",
            entry
                .held()
                .ok()
                .flatten()
                .map_or_else(|| "?".to_string(), |h| h.reason)
        )),
        EntryKind::Progress => Settled::Note("progress".into()),
        EntryKind::Unknown(kind) => Settled::Note(format!("an entry of kind `{kind}`")),
        _ => Settled::Note(format!("an entry of kind `{}`", entry.kind)),
    }
}

/// A late `result`: a `tool-result/v1` body (an object with `content`), else a legacy body
/// (a string is the text, anything else its JSON).
fn result_reply(module_id: &str, result: &Value) -> Reply {
    if result.get("content").is_some_and(Value::is_array) {
        let bytes = serde_json::to_vec(result).expect("JSON serializes");
        return match read_result_v1(&bytes) {
            Ok(r) if r.held.is_some() => Reply::Answer {
                text: format!("tool module `{module_id}` settled a call with another held reply"),
                is_error: true,
            },
            Ok(r) => Reply::Parts {
                parts: r.parts,
                is_error: r.is_error,
            },
            Err(why) => Reply::Answer {
                text: format!(
                    "tool module `{module_id}` settled a call with a tool-result/v1 body that \
                     does not hold: {why}"
                ),
                is_error: true,
            },
        };
    }
    match result {
        Value::String(text) => Reply::Answer {
            text: text.clone(),
            is_error: false,
        },
        other => Reply::Answer {
            text: other.to_string(),
            is_error: false,
        },
    }
}

/// A result's text parts joined (for a record that keeps text only).
pub fn text_of(parts: &[Part]) -> String {
    parts
        .iter()
        .filter_map(|p| match p {
            Part::Text(t) => Some(t.as_str()),
            Part::Image { .. } => None,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

#[cfg(test)]
mod tests;
