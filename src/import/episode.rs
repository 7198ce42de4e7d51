//! The episode as a log's lines build it, whatever the log's format: messages merged by
//! role (the canonical transcript alternates), tool calls followed to their results, and
//! every call the conversation moved past without a result resolved as outcome unknown.

use std::collections::HashSet;

use broca_protocol::{Block, Json, Message, Role, Usage};
use broca_wal::importrec::{outcome_unknown_text, ImportNote, ImportedUsage};

/// What the lines built.
#[derive(Debug, Default)]
pub(crate) struct Built {
    pub messages: Vec<Message>,
    pub usage: Vec<ImportedUsage>,
    pub outcome_unknown: Vec<String>,
    pub pending: Vec<String>,
    pub notes: Vec<ImportNote>,
}

/// Builds an episode line by line.
pub(crate) struct Episode {
    format: &'static str,
    out: Built,
    /// Calls without a result yet, in the order they were made.
    pending: Vec<String>,
    /// Every call the conversation holds (before this episode too), and the results seen.
    calls: HashSet<String>,
    answered: HashSet<String>,
    /// The usage entry of each provider message id (a message split over lines reports
    /// its usage on each: the last report is the message's).
    usage_of: Vec<(String, usize)>,
}

impl Episode {
    /// An episode after a transcript whose last assistant message left `open_calls`
    /// without a result.
    pub fn new(format: &'static str, open_calls: &[String]) -> Episode {
        Episode {
            format,
            out: Built::default(),
            pending: open_calls.to_vec(),
            calls: open_calls.iter().cloned().collect(),
            answered: HashSet::new(),
            usage_of: Vec::new(),
        }
    }

    pub fn note(&mut self, line: u64, note: impl Into<String>) {
        self.out.notes.push(ImportNote {
            line,
            note: note.into(),
        });
    }

    /// Whether the episode has messages yet.
    pub fn is_empty(&self) -> bool {
        self.out.messages.is_empty()
    }

    /// The last message, if it has `role` (to merge into), else a new one.
    fn message(&mut self, role: Role) -> &mut Message {
        if self.out.messages.last().map(|m| m.role) != Some(role) {
            self.out.messages.push(Message {
                role,
                content: Vec::new(),
            });
        }
        self.out.messages.last_mut().expect("pushed")
    }

    /// Resolves every pending call as outcome unknown: the conversation went on without
    /// their results. The results open the next user message, as providers want them.
    fn resolve_pending(&mut self) {
        if self.pending.is_empty() {
            return;
        }
        let text = outcome_unknown_text(self.format, None);
        let pending = std::mem::take(&mut self.pending);
        let results = pending.iter().map(|id| Block::ToolResult {
            tool_use_id: id.clone(),
            content: text.clone(),
            is_error: true,
        });
        let user = self.message(Role::User);
        let at = results_end(user);
        user.content.splice(at..at, results);
        self.answered.extend(pending.iter().cloned());
        self.out.outcome_unknown.extend(pending);
    }

    /// Blocks of an assistant message.
    pub fn assistant(&mut self, blocks: Vec<Block>) {
        if blocks.is_empty() {
            return;
        }
        // A new assistant turn after calls still open: their results never came.
        if self.out.messages.last().map(|m| m.role) != Some(Role::Assistant) {
            self.resolve_pending();
        }
        for b in &blocks {
            if let Block::ToolUse { id, .. } = b {
                self.calls.insert(id.clone());
                self.pending.push(id.clone());
            }
        }
        self.message(Role::Assistant).content.extend(blocks);
    }

    /// A user's text (a prompt): any call still open is resolved first.
    pub fn user_text(&mut self, text: String) {
        self.resolve_pending();
        self.message(Role::User).content.push(Block::Text { text });
    }

    /// A tool's result. `placeholder`: the harness wrote it for a call it aborted or
    /// interrupted, so the outcome is unknown (the call may have run).
    pub fn tool_result(
        &mut self,
        line: u64,
        id: String,
        content: String,
        is_error: bool,
        placeholder: bool,
    ) {
        if !self.calls.contains(&id) {
            self.note(
                line,
                format!("a result for tool call {id}, which the conversation never made: left out"),
            );
            return;
        }
        if self.answered.contains(&id) {
            self.note(
                line,
                format!("a second result for tool call {id}: left out"),
            );
            return;
        }
        self.pending.retain(|p| *p != id);
        self.answered.insert(id.clone());
        let (content, is_error) = if placeholder {
            self.out.outcome_unknown.push(id.clone());
            (outcome_unknown_text(self.format, Some(&content)), true)
        } else {
            (content, is_error)
        };
        let user = self.message(Role::User);
        // Results come before any text of the message.
        let at = results_end(user);
        user.content.insert(
            at,
            Block::ToolResult {
                tool_use_id: id,
                content,
                is_error,
            },
        );
    }

    /// Usage the log reported for the last assistant message (`response_id`: the
    /// provider's id for it; a later report for the same id replaces the earlier one).
    pub fn usage(
        &mut self,
        line: u64,
        usage: Usage,
        reported: Json,
        model: Option<String>,
        response_id: Option<String>,
    ) {
        let Some(message) = self
            .out
            .messages
            .iter()
            .rposition(|m| m.role == Role::Assistant)
        else {
            self.note(
                line,
                "usage reported before any assistant message: left out",
            );
            return;
        };
        let entry = ImportedUsage {
            message: message as u32,
            usage,
            reported,
            line,
            model,
            response_id: response_id.clone(),
        };
        let earlier = response_id
            .as_ref()
            .and_then(|id| self.usage_of.iter().find(|(i, _)| i == id))
            .map(|&(_, at)| at);
        match earlier {
            Some(at) => self.out.usage[at] = entry,
            None => {
                if let Some(id) = response_id {
                    self.usage_of.push((id, self.out.usage.len()));
                }
                self.out.usage.push(entry);
            }
        }
    }

    /// The episode; calls still open stay pending (a longer log, or the next send,
    /// resolves them).
    pub fn finish(mut self) -> Built {
        self.out.pending = self.pending;
        self.out
    }
}

/// Where a user message's tool results end (they come before its text, as providers want).
fn results_end(user: &Message) -> usize {
    user.content
        .iter()
        .take_while(|b| matches!(b, Block::ToolResult { .. }))
        .count()
}
