//! What replay keeps of an open run for the machine that picks it up: where it resumes
//! ([`ResumePoint`]), its last completed step ([`LastStep`]), and where a tool's result goes
//! in the conversation ([`push_result`]), the same for replay and for the live run.

use std::sync::Arc;

use broca_protocol::{Block, FinishReason, Message, Role, Usage};
use broca_wal::runrec::ResultBlock;

/// Where a resumed run picks up, as replay found it.
#[derive(Debug, Clone, PartialEq)]
pub enum ResumePoint {
    /// The current step has no durable output: run a new model step.
    BeforeStep,
    /// The step's ModelStepFinished is durable; nothing after it.
    AfterStep {
        usage: Usage,
        finish_reason: FinishReason,
    },
    /// The intent is durable and some results are missing: their outcome is unknown.
    IntentOpen { missing: Vec<String> },
    /// Every result of the step's batch is durable.
    ToolsDone,
}

/// The last completed model step: what the next request's size is estimated from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LastStep {
    pub usage: Usage,
    /// The transcript's length right after the step's message.
    pub transcript_len: usize,
}

/// Puts a tool's result into the conversation: into the user message of results the step
/// started, or a new one, its parts' media after the step's results.
pub fn push_result(transcript: &mut Vec<Arc<Message>>, result: ResultBlock) {
    // The media of a result in parts follow the step's results (every family takes a user
    // message of results first, then other blocks).
    let media: Vec<Block> = result
        .parts
        .iter()
        .filter_map(|p| match p {
            broca_wal::runrec::ResultPart::Media(m) => Some(Block::Media(m.clone())),
            broca_wal::runrec::ResultPart::Text { .. } => None,
        })
        .collect();
    let block = Block::ToolResult {
        tool_use_id: result.call_id,
        content: result.content,
        is_error: result.is_error,
    };
    match transcript.last_mut() {
        Some(m)
            if m.role == Role::User
                && m.content
                    .iter()
                    .all(|b| matches!(b, Block::ToolResult { .. } | Block::Media(_)))
                && m.content
                    .iter()
                    .any(|b| matches!(b, Block::ToolResult { .. })) =>
        {
            // Copied first if a request in flight still shares it.
            let content = &mut Arc::make_mut(m).content;
            let at = content
                .iter()
                .position(|b| matches!(b, Block::Media(_)))
                .unwrap_or(content.len());
            content.insert(at, block);
            content.extend(media);
        }
        _ => transcript.push(Arc::new(Message {
            role: Role::User,
            content: std::iter::once(block).chain(media).collect(),
        })),
    }
}
