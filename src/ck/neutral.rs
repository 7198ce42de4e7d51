//! A session's transcript in the compaction contract's neutral part model
//! (cortexkit-role-compaction, CONTRACT.md W4), sans-IO: what a compaction provider reads with
//! `session.entries` (W5.4) and what its views address. One neutral entry per entry of the
//! role's reads ([`crate::entries`]), so ordinals are the same in both (llm-runner/v1 counts
//! by this contract, W4.1): ordinal `i + 1`, the same `mid`.
//!
//! - A send's entry is a `user` entry: its text and its media (`file` parts, metadata only). A
//!   module's send carries its sender as `notice`.
//! - An assistant entry holds its text, its reasoning (`signed` when the model signed it) and
//!   its media, and one `tool` part per call at the call's position, holding the call's result
//!   once recorded (P3): `running` until then, `error` for an error result, else `completed`.
//! - A tool result's own entry has no parts (W4.1: a record whose content belongs to another
//!   entry), and neither has an ordered send that went out with a result (`tool_result`): its
//!   text is in that call's `delivered` list (W4.4).
//! - Part ids are the role's part keys: the block's index in the stored message.
//!
//! Tag numbers (A3) are counted by the view library's `assign_tags` from a checkpoint (0 while
//! no compaction marker stands on the session), so a part's number is its position among the
//! numbered parts, and checksums are the contract's own (W7).

use broca_protocol::{media::Media, Block, Message, Role as MsgRole};
use broca_wal::runrec::{ResultBlock, ResultPart};
use cortexkit_compaction_view::tags;
use cortexkit_role_compaction::part::{
    Attachment, AttachmentItem, Delivered, FileMedia, Part, PartBody, Seal, ToolPart, ToolStatus,
};
use cortexkit_role_compaction::read::{
    Cursor, Detail, Entry, Head, NoticeOrigin, ReadPage, ReadRequest, Role, Select,
};
use cortexkit_role_compaction::view::AppliedView;
use cortexkit_role_compaction::wire::{self, Refusal};
use serde_json::Value;

use broca_core::entries::{Body, Entries, Entry as ReadEntry};

/// The session's transcript as neutral entries, numbered from `checkpoint` (A3 T1: 0 with no
/// compaction marker on the session).
pub fn transcript(entries: &Entries, checkpoint: u64) -> Vec<Entry> {
    let list = &entries.list;
    let mut out: Vec<Entry> = list
        .iter()
        .enumerate()
        .map(|(i, e)| entry(list, i, e))
        .collect();
    tags::assign_tags(checkpoint, &mut out);
    out
}

/// The numbered transcript kept between uses and brought up to date with what was appended
/// since ([`Numbered::refresh`]): only the entries from the session's last assistant entry on
/// are made again, since an entry before it no longer changes (its calls' results and the
/// sends that rode them are recorded before the next step's entry). A request, a notice and a
/// ride of a provider's session so cost what the newest entries cost, not the whole
/// transcript. Numbered from 0, as [`transcript`] is with no checkpoint.
#[derive(Debug, Clone, Default)]
pub struct Numbered {
    list: Vec<Entry>,
    /// Entries `..stable` are final.
    stable: usize,
    /// The last number the final entries took.
    tagged: u64,
}

impl Numbered {
    /// The numbered transcript of `entries`, made again from its last assistant entry on.
    pub fn refresh(&mut self, entries: &Entries) -> &[Entry] {
        let src = &entries.list;
        if src.len() < self.stable {
            *self = Numbered::default();
        }
        self.list.truncate(self.stable);
        let mut next = self.tagged;
        for (i, e) in src.iter().enumerate().skip(self.stable) {
            let mut e = entry(src, i, e);
            for p in &mut e.parts {
                p.tag = tags::is_numbered(&e.role, &p.body).then(|| {
                    next += 1;
                    next
                });
            }
            e.digest = cortexkit_role_compaction::read::entry_digest(
                e.role.clone(),
                e.notice.as_ref(),
                &e.parts,
            );
            self.list.push(e);
        }
        debug_assert_eq!(self.list.len(), src.len(), "one numbered entry per entry");
        debug_assert!(next >= self.tagged, "numbers only grow");
        if let Some(last) = src.iter().rposition(|e| e.role == "assistant") {
            if last > self.stable {
                self.tagged = self.list[..last]
                    .iter()
                    .rev()
                    .flat_map(|e| e.parts.iter().rev())
                    .find_map(|p| p.tag)
                    .unwrap_or(self.tagged);
                self.stable = last;
            }
        }
        debug_assert!(
            self.stable <= self.list.len(),
            "the final entries are among the list's"
        );
        &self.list
    }
}

/// One entry, its parts in full form.
fn entry(list: &[ReadEntry], i: usize, e: &ReadEntry) -> Entry {
    let ordinal = i as u64 + 1;
    let written_at = e.written_at.unwrap_or(0);
    let new =
        |role: Role, parts: Vec<Part>| Entry::new(ordinal, e.mid.clone(), role, written_at, parts);
    let Body::Message(m) = &e.body else {
        // A tool result: its content is in its call's tool part.
        return new(Role::User, Vec::new());
    };
    if e.role == "tool" || rides_a_result(e) {
        return new(Role::User, Vec::new());
    }
    let role = match m.role {
        MsgRole::Assistant => Role::Assistant,
        MsgRole::User => Role::User,
    };
    let parts = m
        .content
        .iter()
        .enumerate()
        .filter_map(|(k, b)| part(list, i, k, b, &role))
        .collect();
    let out = new(role.clone(), parts);
    match (&e.sender, role) {
        (Some(sender), Role::User) => out.with_notice(NoticeOrigin::new(module_of(sender))),
        _ => out,
    }
}

/// Whether an ordered send went out with a tool result (its text rides that call's part).
fn rides_a_result(e: &ReadEntry) -> bool {
    matches!(&e.delivered_as, Some((mode, Some(_))) if mode == "tool_result")
}

/// The module an attested principal names (`reserved:<module>` is the module).
fn module_of(principal: &str) -> &str {
    principal.rsplit(':').next().unwrap_or(principal)
}

/// The part block `k` of entry `i` makes, if any: an empty text block is not a part (W4.3), nor
/// a tool result stored in a user message (it is in its call's part).
fn part(list: &[ReadEntry], i: usize, k: usize, block: &Block, role: &Role) -> Option<Part> {
    let id = k.to_string();
    let body = match block {
        Block::Text { text } if text.is_empty() => return None,
        Block::Text { text } => PartBody::Text { text: text.clone() },
        Block::Thinking { text, signature } => {
            let body = PartBody::Reasoning {
                text: (!text.is_empty()).then(|| text.clone()),
                text_bytes: Some(text.len() as u64),
            };
            let seal = if signature.is_some() {
                Seal::Signed
            } else {
                Seal::None
            };
            return Some(Part::new(id, body).with_seal(seal));
        }
        Block::Media(m) => PartBody::File(file(m)),
        Block::ToolUse {
            id: call,
            name,
            input,
        } if *role == Role::Assistant => {
            let input: Value = serde_json::from_str(input.get()).unwrap_or(Value::Null);
            PartBody::Tool(tool_part(list, i, call, name, input))
        }
        Block::ToolUse { .. } | Block::ToolResult { .. } => return None,
    };
    Some(Part::new(id, body))
}

fn file(m: &Media) -> FileMedia {
    FileMedia::inline(m.mime.clone(), Some(m.bytes))
}

/// The tool part of call `call` of assistant entry `i`: its result is the first recorded for
/// the call before the next assistant entry (a run's results and its imported ones alike).
fn tool_part(list: &[ReadEntry], i: usize, call: &str, name: &str, input: Value) -> ToolPart {
    let mut part = ToolPart::new(call, name, input.clone(), ToolStatus::Running);
    for later in &list[i + 1..] {
        if later.role == "assistant" {
            break;
        }
        match &later.body {
            Body::Result(r) if r.call_id == call => {
                part = finished(
                    ToolPart::new(call, name, input.clone(), status(r.is_error)),
                    r,
                );
                break;
            }
            Body::Message(m) => {
                if let Some((is_error, text)) = result_block(m, call) {
                    part = ToolPart::new(call, name, input.clone(), status(is_error))
                        .with_output_bytes(text.len() as u64)
                        .with_output(text);
                    break;
                }
            }
            Body::Result(_) => {}
        }
    }
    for later in &list[i + 1..] {
        if later.role == "assistant" {
            break;
        }
        if let (Some((_, Some(key))), Body::Message(m)) = (&later.delivered_as, &later.body) {
            if key_of(list, i, call) == Some(key.as_str()) {
                let sender = later.sender.as_deref().map(module_of).unwrap_or("broca");
                part.delivered.push(Delivered::new(sender, m.text()));
            }
        }
    }
    part
}

/// The call key minted for call `call` of assistant entry `i`.
fn key_of<'a>(list: &'a [ReadEntry], i: usize, call: &str) -> Option<&'a str> {
    list[i]
        .calls
        .iter()
        .find(|c| c.id == call)
        .and_then(|c| c.call_key.as_deref())
}

fn status(is_error: bool) -> ToolStatus {
    if is_error {
        ToolStatus::Error
    } else {
        ToolStatus::Completed
    }
}

/// A recorded result into its call's part: the text joined, media as attachments.
fn finished(part: ToolPart, r: &ResultBlock) -> ToolPart {
    let mut attachments = Vec::new();
    let output = if r.parts.is_empty() {
        r.content.clone()
    } else {
        let mut text = String::new();
        for p in &r.parts {
            match p {
                ResultPart::Text { text: t } => text.push_str(t),
                ResultPart::Media(m) => attachments.push(Attachment::new(
                    attachments.len().to_string(),
                    AttachmentItem::File(file(m)),
                )),
            }
        }
        text
    };
    part.with_output_bytes(output.len() as u64)
        .with_output(output)
        .with_attachments(attachments)
}

/// A result block for `call` stored in a message (an imported episode's): whether it is an
/// error, and its text.
fn result_block<'a>(m: &'a Message, call: &str) -> Option<(bool, &'a str)> {
    m.content.iter().find_map(|b| match b {
        Block::ToolResult {
            tool_use_id,
            content,
            is_error,
        } if tool_use_id == call => Some((*is_error, content.as_str())),
        _ => None,
    })
}

/// A `session.entries` request's params (W5.4) answered from the numbered transcript, with
/// the view the session applies now (none yet); a request that does not decode is refused
/// `invalid_params` naming the field, as the contract's decoder names it.
pub fn read(
    transcript: &[Entry],
    params: Value,
    applied_view: Option<AppliedView>,
) -> Result<ReadPage, Refusal> {
    let request: ReadRequest = wire::params(params)?;
    let chosen: Vec<&Entry> = match &request.select {
        Select::After {
            after_ordinal,
            limit,
        } => {
            let from = after_ordinal.unwrap_or(0).min(transcript.len() as u64) as usize;
            let limit = limit.map_or(usize::MAX, |l| usize::try_from(l).unwrap_or(usize::MAX));
            transcript[from..].iter().take(limit).collect()
        }
        Select::Mids { mids } => transcript
            .iter()
            .filter(|e| mids.iter().any(|m| *m == e.mid))
            .collect(),
        Select::Tags { tags } => transcript
            .iter()
            .filter(|e| {
                e.parts
                    .iter()
                    .any(|p| p.tag.is_some_and(|t| tags.contains(&t)))
            })
            .collect(),
        _ => {
            return Err(Refusal::invalid_params(
                "select",
                "`select.by` must be `after`, `mids` or `tags`",
            ))
        }
    };
    let max = request
        .max_bytes
        .map_or(usize::MAX, |b| usize::try_from(b).unwrap_or(usize::MAX));
    let entries = fitting(chosen, request.detail, max);
    let mut head = Head::new();
    if let Some(last) = transcript.last() {
        head = head.with_newest(cursor(last));
    }
    if let Some(v) = applied_view {
        head = head.with_applied_view(v);
    }
    // `after` pages on while the transcript goes past the page's last entry.
    let next = match (&request.select, entries.last(), transcript.last()) {
        (Select::After { .. }, Some(shown), Some(newest)) if newest.ordinal > shown.ordinal => {
            Some(shown.ordinal)
        }
        _ => None,
    };
    let page = ReadPage::new(entries, head);
    Ok(match next {
        Some(after) => page.with_next_after(after),
        None => page,
    })
}

/// The entries of `chosen` in `detail` that fit `max` bytes, in order (the first always).
fn fitting(chosen: Vec<&Entry>, detail: Detail, max: usize) -> Vec<Entry> {
    let mut entries = Vec::new();
    let mut bytes = 0usize;
    for e in chosen {
        let shown = shown(e, detail);
        let size = serde_json::to_vec(&shown).map_or(0, |v| v.len());
        if !entries.is_empty() && bytes + size > max {
            break;
        }
        bytes += size;
        entries.push(shown);
    }
    debug_assert!(
        entries.len() <= 1 || bytes <= max,
        "a page of more than one entry fits"
    );
    entries
}

/// Where an entry sits (W3.6).
pub fn cursor(e: &Entry) -> Cursor {
    Cursor::new(e.ordinal, e.mid.clone(), e.digest.clone())
}

/// An entry in the detail asked for (W4.8: compact leaves out outputs and reasoning text; the
/// checksums stay the full content's).
fn shown(e: &Entry, detail: Detail) -> Entry {
    match detail {
        Detail::Full => e.clone(),
        Detail::Compact => {
            let mut c = e.clone();
            c.parts = e.parts.iter().map(Part::compact).collect();
            c
        }
    }
}

#[cfg(test)]
#[path = "neutral_tests.rs"]
mod tests;
