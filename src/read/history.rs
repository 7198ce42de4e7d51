//! `session.history` (llm-runner/v1 `host_history`, `history_display`): the session's whole
//! history, paged forward or backward by opaque cursors, as raw entries (the `session.read`
//! envelope, byte for byte) or as display rows. broca is its own host: its WAL holds every
//! entry, so every page is read from it; and it never rewrites a session's history, so a
//! cursor stays valid for the life of the session's WAL (a WAL made anew, another lineage,
//! expires it).
//!
//! A cursor is `h1.<incarnation>.<o|n><index>`: the page older than the entry at `index`
//! (`o`, exclusive) or newer from it (`n`, inclusive).

use cortexkit_role_llm_runner::display::{
    DisplayPage, DisplayPart, DisplayRow, FilePart, Limits, TextPart, ToolCallPart, ToolResultPart,
};
use cortexkit_role_llm_runner::history::HistoryRequest;
use cortexkit_role_llm_runner::history::{HistoryEntry, HistoryForm, HistoryMode, HistoryPage};
use serde_json::Value;

use crate::role::{entries_of, entry, last_entries, Facts};
use broca_core::entries::{Body, Entry};
use broca_core::replay::Session;
use broca_protocol::Block;

/// Why a history request was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HistoryRefusal {
    /// `invalid_params` naming `field`.
    Invalid { field: &'static str, why: String },
    /// `unknown_mid`.
    UnknownMid(String),
    /// `unknown_ordinal`.
    UnknownOrdinal(u64),
    /// `cursor_expired`: a cursor of another session or incarnation.
    CursorExpired,
}

/// Which way a page is gathered, and from where.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Walk {
    /// From this index forward.
    Forward(usize),
    /// The entries directly before this index, gathered backward.
    Backward(usize),
}

/// A cursor's text.
fn cursor(incarnation: &str, older: bool, index: usize) -> String {
    format!("h1.{incarnation}.{}{index}", if older { 'o' } else { 'n' })
}

/// Reads a cursor back: where it walks, or why it cannot.
fn parse_cursor(text: &str, incarnation: &str, total: usize) -> Result<Walk, HistoryRefusal> {
    let bad = || HistoryRefusal::Invalid {
        field: "cursor",
        why: "the cursor does not parse (pass back a page's `older` or `newer` as it came)".into(),
    };
    let rest = text.strip_prefix("h1.").ok_or_else(bad)?;
    let (lineage, at) = rest.rsplit_once('.').ok_or_else(bad)?;
    let (dir, index) = at.split_at_checked(1).ok_or_else(bad)?;
    let index: usize = index.parse().map_err(|_| bad())?;
    let walk = match dir {
        "o" => Walk::Backward(index),
        "n" => Walk::Forward(index),
        _ => return Err(bad()),
    };
    if lineage != incarnation || index > total {
        return Err(HistoryRefusal::CursorExpired);
    }
    Ok(walk)
}

/// Where `req` starts, over `total` entries.
fn walk(
    s: Option<&Session>,
    incarnation: &str,
    req: &HistoryRequest,
    total: usize,
) -> Result<Walk, HistoryRefusal> {
    let mode = req.mode().map_err(|field| HistoryRefusal::Invalid {
        field,
        why: format!("`{field}` cannot be combined with what the request names before it"),
    })?;
    let position = |mid: &str| {
        s.and_then(|s| s.entries.as_ref())
            .and_then(|e| e.position(mid))
            .ok_or_else(|| HistoryRefusal::UnknownMid(mid.to_string()))
    };
    let assigned = |ordinal: u64| {
        if ordinal >= 1 && ordinal <= total as u64 {
            Ok(ordinal as usize - 1)
        } else {
            Err(HistoryRefusal::UnknownOrdinal(ordinal))
        }
    };
    Ok(match mode {
        HistoryMode::Newest => Walk::Backward(total),
        HistoryMode::Cursor(c) => parse_cursor(c, incarnation, total)?,
        HistoryMode::FromMid(mid) => Walk::Forward(position(mid)?),
        HistoryMode::BeforeMid(mid) => Walk::Backward(position(mid)?),
        HistoryMode::FromOrdinal(n) => Walk::Forward(assigned(n)?),
        HistoryMode::BeforeOrdinal(n) => Walk::Backward(assigned(n)?),
    })
}

/// A `session.history` page of `s` (replayed with its entries; `None` for a session never
/// written) under `incarnation`: the role's `HistoryPage`, or its `DisplayPage` for `form:
/// "display"`.
pub fn history_page(
    s: Option<&Session>,
    version: u64,
    incarnation: &str,
    req: &HistoryRequest,
    part_keys: bool,
) -> Result<Value, HistoryRefusal> {
    if matches!(req.view, Some(v) if v != cortexkit_role_llm_runner::read::ReadView::Raw) {
        return Err(HistoryRefusal::Invalid {
            field: "view",
            why: "history serves raw entries only".into(),
        });
    }
    let total = s.map_or(0, |s| entries_of(s).len());
    let start = walk(s, incarnation, req, total)?;
    let bounds = crate::role::page_bounds(req.limit, req.max_bytes).map_err(|e| {
        HistoryRefusal::Invalid {
            field: "limit",
            why: e.to_string(),
        }
    })?;
    let (page, range) = match s {
        Some(s) => gather(
            s,
            start,
            total,
            bounds,
            req.media.unwrap_or_default(),
            part_keys,
        ),
        None => (Vec::new(), 0..0),
    };
    let rows = s.map_or_else(Vec::new, |s| {
        crate::role::pruned_rows(s, page.iter().map(|e| e.mid.as_str()))
    });
    let mut out = HistoryPage::new(version, incarnation, page);
    if range.start > 0 {
        out = out.with_older(cursor(incarnation, true, range.start));
    }
    if range.end < total {
        out = out.with_newer(cursor(incarnation, false, range.end));
    }
    if req.form() != HistoryForm::Display {
        let out = out.with_pruned_reasoning(rows);
        return Ok(serde_json::to_value(out).expect("a history page serializes"));
    }
    let s = s.expect("a page with entries has a session");
    let limits = req.limits;
    let display = DisplayPage::from_history(&out, |e| {
        Ok::<_, std::convert::Infallible>(row(&entries_of(s)[e.ordinal as usize - 1], limits))
    })
    .unwrap_or_else(|never| match never {})
    .with_pruned_reasoning(rows);
    Ok(serde_json::to_value(display).expect("a display page serializes"))
}

/// The entries of a page starting at `start`, and the index range they cover.
fn gather(
    s: &Session,
    start: Walk,
    total: usize,
    bounds: crate::role::Bounds,
    media: cortexkit_role_llm_runner::read::MediaMode,
    part_keys: bool,
) -> (Vec<HistoryEntry>, std::ops::Range<usize>) {
    let last = last_entries(s);
    let mut messages = Vec::new();
    let mut bytes = 0;
    let facts = Facts {
        media,
        part_keys,
        ..Facts::default()
    };
    let one = |i: usize| {
        let read = entry(s, i, &last, facts);
        let n = crate::role::size(&read);
        let entry = HistoryEntry::from_read(read).expect("every entry states when it was written");
        (entry, n)
    };
    let range = match start {
        Walk::Forward(from) => {
            let mut next = from;
            while next < total {
                let (e, n) = one(next);
                if !bounds.room(messages.len(), bytes, n) {
                    break;
                }
                bytes += n;
                messages.push(e);
                next += 1;
            }
            from..next
        }
        Walk::Backward(before) => {
            let mut first = before;
            while first > 0 {
                let (e, n) = one(first - 1);
                if !bounds.room(messages.len(), bytes, n) {
                    break;
                }
                bytes += n;
                messages.push(e);
                first -= 1;
            }
            messages.reverse();
            first..before
        }
    };
    assert_eq!(messages.len(), range.len(), "a page holds its range");
    assert!(
        bounds.holds(messages.len(), bytes),
        "a page keeps its bounds"
    );
    debug_assert!(range.end <= total, "a page lies within the history");
    (messages, range)
}

/// The display row of `e` (broca's own projection of its schema): each content block a
/// part keyed by its index, a tool call with its recorded times and unanswered outcome, a
/// tool result cut by `limits` when given; the recorded model, client id and sender beside.
pub fn row(e: &Entry, limits: Option<Limits>) -> DisplayRow {
    let limits = limits.as_ref();
    let parts = match &e.body {
        Body::Result(r) => vec![DisplayPart::ToolResult(ToolResultPart::new(
            "0",
            r.call_id.clone(),
            r.is_error,
            &r.content,
            Vec::new(),
            limits,
        ))],
        Body::Message(m) => {
            let mut calls = e.calls.iter();
            m.content
                .iter()
                .enumerate()
                .map(|(i, b)| part(i.to_string(), b, &mut calls, limits))
                .collect()
        }
    };
    let mut row = DisplayRow::new(e.role, parts);
    if let Some(model) = &e.model {
        row = row.with_model(model.clone());
    }
    if let Some(id) = &e.client_message_id {
        row = row.with_client_message_id(id.clone());
    }
    if let Some(sender) = &e.sender {
        row = row.with_sender(bare_module(sender));
    }
    row
}

/// A principal's module id (`reserved:<id>` is the daemon's display form of one).
fn bare_module(principal: &str) -> String {
    principal
        .strip_prefix("reserved:")
        .unwrap_or(principal)
        .to_string()
}

/// The display part of block `b`, keyed `key`; a tool call takes its facts from `calls`.
fn part<'a>(
    key: String,
    b: &Block,
    calls: &mut impl Iterator<Item = &'a broca_core::entries::CallFacts>,
    limits: Option<&Limits>,
) -> DisplayPart {
    match b {
        Block::Text { text } => DisplayPart::Text(TextPart::new(key, text.clone())),
        Block::Thinking { text, .. } => DisplayPart::Reasoning(TextPart::new(key, text.clone())),
        Block::ToolUse { id, name, input } => {
            let args: Value = serde_json::from_str(input.get()).unwrap_or(Value::Null);
            let mut p = ToolCallPart::new(key, id.clone(), name.clone(), &args, limits);
            if let Some(facts) = calls.next() {
                if let Some(at) = facts.started_at {
                    p = p.with_started_at(at);
                }
                if let Some(at) = facts.result.as_ref().and_then(|r| r.finished_at) {
                    p = p.with_finished_at(at);
                }
                if let Some(why) = facts.unanswered() {
                    p = p.with_unanswered(why);
                }
                if let Some(key) = &facts.call_key {
                    p = p.with_call_key(key.clone());
                }
                if let Some(pin) = &facts.schema_pin {
                    p = p.with_schema_pin(pin.clone());
                }
            }
            DisplayPart::ToolCall(p)
        }
        Block::ToolResult {
            tool_use_id,
            content,
            is_error,
        } => DisplayPart::ToolResult(ToolResultPart::new(
            key,
            tool_use_id.clone(),
            *is_error,
            content,
            Vec::new(),
            limits,
        )),
        Block::Media(m) => {
            DisplayPart::File(FilePart::media(key, crate::media::media_ref(m, None)))
        }
    }
}
