//! A compaction provider's view (cortexkit-role-compaction W6), sans-IO: checked when the
//! provider hands it over ([`check`], W5.5 and W6.5), and rendered into the messages of a model
//! request ([`render`], W6.3) from the view library's render plan, so every part the view keeps
//! goes out as the transcript holds it: the same block, with its tag prefix (W4.7) in front of
//! a numbered text or tool result, or the provider's replaced bytes, which are final.
//!
//! The view library checks the view's shape, its targets and the provider rules; broca adds
//! what it cannot apply yet, refused `unsupported_edit` naming the edit: an inserted image (the
//! contract lets a runner refuse images it cannot apply), an inserted `system` message, and a
//! replace of a tool result's `attachments` or `delivered`.
//!
//! Rendering maps the neutral entries ([`crate::neutral`]) back onto the transcript: an
//! entry's message is found in the transcript in order; a user message of tool results belongs
//! to the assistant message before it, whose tool parts keep or leave out each result with its
//! call (P3); any other message is kept as it is.

use std::collections::HashMap;
use std::sync::Arc;

use broca_protocol::{Block, Json, Message, Role as MsgRole};
use cortexkit_compaction_view::render::{self, PlanItem, PlanPart, RenderPlan};
use cortexkit_compaction_view::{rules, tags};
use cortexkit_role_compaction::read::{Entry, Role};
use cortexkit_role_compaction::rules::ProviderRules;
use cortexkit_role_compaction::view::{EditOp, View, ViewRefusal};
use serde_json::Value;

use broca_core::entries::{Body, Entry as ReadEntry};

/// Checks a view handed over against the numbered transcript, the view the session applies
/// now and the rules it declared: its render plan, or why it is refused (nothing is stored).
pub fn check(
    transcript: &[Entry],
    previous: Option<&View>,
    view: &View,
    rules: &ProviderRules,
) -> Result<RenderPlan, ViewRefusal> {
    if !view.verify() {
        return Err(ViewRefusal::BadChecksum);
    }
    let latest = previous.map_or(0, |p| p.version);
    if view.version <= latest {
        return Err(ViewRefusal::StaleVersion {
            version: view.version,
            latest,
        });
    }
    render::check_carried(previous, view)?;
    for (index, edit) in view.edits.iter().enumerate() {
        let unsupported = match &edit.op {
            EditOp::Insert { message, .. } => {
                !message.images.is_empty() || !matches!(message.role, Role::User | Role::Assistant)
            }
            EditOp::Replace { field, .. } => field == "attachments" || field == "delivered",
            _ => false,
        };
        if unsupported {
            return Err(ViewRefusal::UnsupportedEdit {
                index: index as u64,
            });
        }
    }
    let plan = render::plan(transcript, &view.edits)?;
    rules::check(transcript, &view.edits, rules).map_err(ViewRefusal::Rule)?;
    Ok(plan)
}

/// The messages of a request of a provider's session under `view` (none yet: every part
/// behind its number, nothing left out): the transcript numbered, the view's render plan over
/// it, rendered. A view accepted against this transcript always plans; should one no longer
/// fit, the edits naming what is gone are left out (W6.6), and `None` (send the conversation
/// as it is) only when nothing plans at all.
pub fn request_messages(
    numbered: &[Entry],
    list: &[ReadEntry],
    transcript: &[Arc<Message>],
    view: Option<&View>,
) -> Option<Vec<Arc<Message>>> {
    let edits = view.map_or(&[][..], |v| &v.edits[..]);
    let plan = render::plan(numbered, edits).or_else(|_| {
        let kept = render::edits_for_transcript(numbered, edits);
        render::plan(numbered, &kept)
    });
    match plan {
        Ok(plan) => Some(render(list, transcript, &plan)),
        Err(_) => None,
    }
}

/// What a transcript message is to the render.
#[derive(Clone, Copy)]
enum Kind {
    /// The message of the read entry at this index.
    Entry(usize),
    /// A user message of tool results, after the assistant message of the read entry at this
    /// index.
    Results(usize),
    /// Anything else: kept as it is.
    Other,
}

/// The messages of a model request under a view: `transcript` is the session's conversation,
/// `list` its read entries (the neutral entries' sources, in the same order), `plan` the
/// accepted view's render plan over them.
pub fn render(
    list: &[ReadEntry],
    transcript: &[Arc<Message>],
    plan: &RenderPlan,
) -> Vec<Arc<Message>> {
    let kinds = kinds(list, transcript);
    // Each rendered entry's kept parts, by mid; inserts before the entry they precede.
    let mut kept: HashMap<&str, &[PlanPart]> = HashMap::new();
    let mut before: HashMap<&str, Vec<Arc<Message>>> = HashMap::new();
    let mut waiting: Vec<Arc<Message>> = Vec::new();
    for item in &plan.items {
        match item {
            PlanItem::Insert { role, texts, .. } => waiting.push(Arc::new(Message {
                role: if *role == Role::Assistant {
                    MsgRole::Assistant
                } else {
                    MsgRole::User
                },
                content: texts
                    .iter()
                    .map(|t| Block::Text { text: t.clone() })
                    .collect(),
            })),
            PlanItem::Entry { mid, parts, .. } => {
                kept.insert(mid, parts);
                if !waiting.is_empty() {
                    before.insert(mid, std::mem::take(&mut waiting));
                }
            }
        }
    }
    let mut out = Vec::with_capacity(transcript.len() + before.len() + waiting.len());
    for (j, message) in transcript.iter().enumerate() {
        match kinds[j] {
            Kind::Entry(i) => {
                let mid = list[i].mid.as_str();
                if let Some(inserts) = before.remove(mid) {
                    out.extend(inserts);
                }
                let own = kept.get(mid).copied();
                let owner = owner_parts(list, &kinds, j, &kept);
                push_filtered(&mut out, message, |k, b| block(k, b, own, owner.as_ref()));
            }
            Kind::Results(owner) => {
                let parts = kept.get(list[owner].mid.as_str()).copied();
                let calls = calls_of(list, owner);
                let mut any_result = false;
                let blocks: Vec<Block> = message
                    .content
                    .iter()
                    .filter_map(|b| match b {
                        Block::ToolResult { .. } => {
                            let r = result(b, parts, &calls);
                            any_result |= r.is_some();
                            r
                        }
                        other => Some(other.clone()),
                    })
                    .collect();
                // A result's media go with its result.
                if any_result {
                    push_blocks(&mut out, message, blocks);
                }
            }
            Kind::Other => out.push(message.clone()),
        }
    }
    out.extend(waiting);
    out
}

/// Each transcript message's kind: the read entries' messages are found in order.
fn kinds(list: &[ReadEntry], transcript: &[Arc<Message>]) -> Vec<Kind> {
    let mut kinds = vec![Kind::Other; transcript.len()];
    let mut from = 0;
    for (i, e) in list.iter().enumerate() {
        let Body::Message(m) = &e.body else { continue };
        if let Some(j) = (from..transcript.len())
            .find(|&j| Arc::ptr_eq(&transcript[j], m) || *transcript[j] == **m)
        {
            kinds[j] = Kind::Entry(i);
            from = j + 1;
        }
    }
    let mut assistant = None;
    for (j, m) in transcript.iter().enumerate() {
        match kinds[j] {
            Kind::Entry(i) if m.role == MsgRole::Assistant => assistant = Some(i),
            Kind::Other if m.role == MsgRole::User && is_results(m) => {
                if let Some(i) = assistant {
                    kinds[j] = Kind::Results(i);
                }
            }
            _ => {}
        }
    }
    debug_assert_eq!(kinds.len(), transcript.len(), "one kind per message");
    debug_assert!(
        kinds.iter().all(|k| match k {
            Kind::Entry(i) | Kind::Results(i) => *i < list.len(),
            Kind::Other => true,
        }),
        "every kind names an entry of the list"
    );
    kinds
}

fn is_results(m: &Message) -> bool {
    m.content
        .iter()
        .any(|b| matches!(b, Block::ToolResult { .. }))
        && m.content
            .iter()
            .all(|b| matches!(b, Block::ToolResult { .. } | Block::Media(_)))
}

/// The tool calls of the assistant entry at `i`: call id to its part id (its block's index).
fn calls_of(list: &[ReadEntry], i: usize) -> HashMap<&str, String> {
    let Body::Message(m) = &list[i].body else {
        return HashMap::new();
    };
    m.content
        .iter()
        .enumerate()
        .filter_map(|(k, b)| match b {
            Block::ToolUse { id, .. } => Some((id.as_str(), k.to_string())),
            _ => None,
        })
        .collect()
}

/// For an entry message holding tool results (an imported one), the kept parts and calls of
/// the assistant entry before it.
fn owner_parts<'a>(
    list: &'a [ReadEntry],
    kinds: &[Kind],
    j: usize,
    kept: &HashMap<&str, &'a [PlanPart]>,
) -> Option<(Option<&'a [PlanPart]>, HashMap<&'a str, String>)> {
    let owner = kinds[..j].iter().rev().find_map(|k| match k {
        Kind::Entry(i) if list[*i].role == "assistant" => Some(*i),
        _ => None,
    })?;
    Some((
        kept.get(list[owner].mid.as_str()).copied(),
        calls_of(list, owner),
    ))
}

/// Block `k` of an entry's message as rendered, if kept.
fn block(
    k: usize,
    b: &Block,
    own: Option<&[PlanPart]>,
    owner: Option<&(Option<&[PlanPart]>, HashMap<&str, String>)>,
) -> Option<Block> {
    if let Block::ToolResult { .. } = b {
        let (parts, calls) = owner?;
        return result(b, *parts, calls);
    }
    let own = own?;
    let Some(part) = own.iter().find(|p| p.id == k.to_string()) else {
        // Not a part (an empty text block): kept with its entry; a part left out: gone.
        return match b {
            Block::Text { text } if text.is_empty() => Some(b.clone()),
            _ => None,
        };
    };
    Some(match b {
        Block::Text { text } => Block::Text {
            text: shown_text(part, "text", text),
        },
        Block::Media(_) => match replaced(part, "text") {
            Some(text) => Block::Text { text },
            None => b.clone(),
        },
        Block::ToolUse { id, name, input } => Block::ToolUse {
            id: id.clone(),
            name: name.clone(),
            input: replaced_input(part, input),
        },
        other => other.clone(),
    })
}

/// A tool result as rendered: left out with its call's part, else its output (replaced, or
/// prefixed with its number).
fn result(b: &Block, parts: Option<&[PlanPart]>, calls: &HashMap<&str, String>) -> Option<Block> {
    let Block::ToolResult {
        tool_use_id,
        content,
        is_error,
    } = b
    else {
        return Some(b.clone());
    };
    let id = calls.get(tool_use_id.as_str())?;
    let part = parts?.iter().find(|p| &p.id == id)?;
    let content = match (replaced(part, "output"), &part.empty_result_label) {
        (Some(text), _) => text,
        (None, Some(label)) if content.is_empty() => format!("{}{label}", prefix(part)),
        (None, _) => format!("{}{content}", prefix(part)),
    };
    Some(Block::ToolResult {
        tool_use_id: tool_use_id.clone(),
        content,
        is_error: *is_error,
    })
}

fn prefix(part: &PlanPart) -> String {
    match part.tag {
        Some(tag) if part.prefix => tags::tag_prefix(tag),
        _ => String::new(),
    }
}

/// A text field as rendered: the view's bytes when it replaced it (final), else the stored
/// text behind the part's prefix.
fn shown_text(part: &PlanPart, field: &str, stored: &str) -> String {
    replaced(part, field).unwrap_or_else(|| format!("{}{stored}", prefix(part)))
}

fn replaced(part: &PlanPart, field: &str) -> Option<String> {
    part.replace
        .iter()
        .rev()
        .find(|r| r.field == field)
        .and_then(|r| r.value.as_str().map(str::to_string))
}

/// A call's arguments with the view's `input.<key>` replaces applied (the stored bytes when
/// none, so its text stays byte for byte).
fn replaced_input(part: &PlanPart, input: &Json) -> Json {
    let keys: Vec<(&str, &Value)> = part
        .replace
        .iter()
        .filter_map(|r| Some((r.field.strip_prefix("input.")?, &r.value)))
        .collect();
    if keys.is_empty() {
        return input.clone();
    }
    let Ok(Value::Object(mut args)) = serde_json::from_str::<Value>(input.get()) else {
        return input.clone();
    };
    for (key, value) in keys {
        args.insert(key.to_string(), value.clone());
    }
    Json::from_value(&Value::Object(args))
}

/// Keeps a message whose blocks all stay as the same message (shared, not copied), another
/// with what remains, none when nothing does.
fn push_filtered(
    out: &mut Vec<Arc<Message>>,
    message: &Arc<Message>,
    mut keep: impl FnMut(usize, &Block) -> Option<Block>,
) {
    let blocks: Vec<Block> = message
        .content
        .iter()
        .enumerate()
        .filter_map(|(k, b)| keep(k, b))
        .collect();
    push_blocks(out, message, blocks);
}

fn push_blocks(out: &mut Vec<Arc<Message>>, message: &Arc<Message>, blocks: Vec<Block>) {
    if blocks.is_empty() {
        return;
    }
    if blocks == message.content {
        out.push(message.clone());
    } else {
        out.push(Arc::new(Message {
            role: message.role,
            content: blocks,
        }));
    }
}

/// The compaction provider the session's plan names (`plan.compaction_item.provider`).
pub fn provider_of(session: &broca_core::replay::Session) -> Option<String> {
    broca_fetch_plan::plan::plan_provider(session.plan.as_ref()?).map(|(provider, _)| provider)
}

/// The number each part the session's next request shows carries, by `(mid, part id)`: the
/// numbered parts its view keeps (cortexkit-role-compaction A3). Empty for a session without
/// a compaction provider, whose requests show no numbers.
pub fn shown_numbers(session: &broca_core::replay::Session) -> HashMap<(String, String), u64> {
    let mut shown = HashMap::new();
    let Some(entries) = &session.entries else {
        return shown;
    };
    if provider_of(session).is_none() {
        return shown;
    }
    let numbered = crate::neutral::transcript(entries, 0);
    let edits = session.view.as_ref().map_or(&[][..], |v| &v.edits[..]);
    let Ok(plan) = render::plan(&numbered, edits) else {
        return shown;
    };
    for item in plan.items {
        if let PlanItem::Entry { mid, parts, .. } = item {
            for p in parts {
                if let Some(tag) = p.tag {
                    shown.insert((mid.clone(), p.id), tag);
                }
            }
        }
    }
    shown
}

/// Whether the attested `principal` is module `provider` (`reserved:<module>` or the bare id).
pub fn is_module(principal: Option<&str>, provider: &str) -> bool {
    principal.is_some_and(|p| p == provider || p.rsplit(':').next() == Some(provider))
}

/// The provider rules (W3.3) of the session's model: the view library's defaults for it.
pub fn session_rules(session: &broca_core::replay::Session) -> ProviderRules {
    let model = session.runs.last().map_or("", |r| r.config.model.as_str());
    rules::defaults(model)
}

#[cfg(test)]
#[path = "provided_tests.rs"]
mod tests;
