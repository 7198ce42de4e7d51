//! The built-in compaction's pure parts (docs/compaction.md): where the conversation is cut,
//! the text the run's model is asked to summarize, the summary's message, and the view the
//! model's requests carry once a summary stands in for older turns. The machine decides when
//! (`machine/compact.rs`); replay puts a recorded summary back in the same place.

use std::sync::Arc;

use broca_protocol::{Block, Message, Role};

/// A summary standing in for the conversation's first `replaced` messages.
#[derive(Debug, Clone, PartialEq)]
pub struct Compacted {
    pub replaced: usize,
    pub summary: Arc<Message>,
}

/// The system text of a summary's request.
pub const SUMMARY_SYSTEM: &str = "You condense conversations between a user and an AI \
assistant that uses tools. Your summary replaces the turns it covers: the assistant will \
see only your summary and the turns after it. Keep what the assistant needs to go on: the \
user's goals and instructions, decisions made, facts learned, files, names and values that \
matter, what tools did and found, and what is still to do. Write plain prose or terse \
notes; no preamble.";

/// The words that end a summary's request (the conversation to summarize comes before them).
pub const SUMMARY_INSTRUCTION: &str = "Summarize the conversation above for the assistant \
that continues it (broca-compaction).";

/// What a summary's message says before the summary itself.
const SUMMARY_LEAD: &str = "[Summary of the conversation's earlier turns, which are no \
longer shown]\n\n";

/// The most of one text, argument or result the summary's request quotes (bytes).
pub const QUOTE_BYTES_MAX: usize = 4096;

/// The message a summary's text makes: the first of the model's requests from then on.
pub fn summary_message(summary: &str) -> Message {
    Message {
        role: Role::User,
        content: vec![Block::Text {
            text: format!("{SUMMARY_LEAD}{summary}"),
        }],
    }
}

/// The messages a request carries: the summary and what follows what it replaced, or the
/// whole conversation.
pub fn view(transcript: &[Arc<Message>], compacted: Option<&Compacted>) -> Vec<Arc<Message>> {
    match compacted {
        None => transcript.to_vec(),
        Some(c) => {
            let from = c.replaced.min(transcript.len());
            let mut v = Vec::with_capacity(transcript.len() - from + 1);
            v.push(c.summary.clone());
            v.extend_from_slice(&transcript[from..]);
            v
        }
    }
}

/// Where to cut: the index of the assistant message the kept turns start at, keeping at most
/// about `keep_bytes` of the latest turns (always the latest assistant message and what
/// follows it), and covering more than the summary before did. `None` when nothing more can
/// be summarized (no assistant message after the last cut).
pub fn cut(
    transcript: &[Arc<Message>],
    compacted: Option<&Compacted>,
    keep_bytes: usize,
    bytes_of: impl Fn(&Message) -> usize,
) -> Option<usize> {
    let start = compacted.map_or(0, |c| c.replaced);
    let mut tail = 0usize;
    let mut best = None;
    for i in (start + 1..transcript.len()).rev() {
        tail = tail.saturating_add(bytes_of(&transcript[i]));
        if transcript[i].role != Role::Assistant {
            continue;
        }
        if best.is_some() && tail > keep_bytes {
            break;
        }
        best = Some(i);
    }
    best
}

/// The text of a summary's request: the earlier summary, then the turns it and this one cover
/// (texts, calls and results quoted up to [`QUOTE_BYTES_MAX`], reasoning left out), then
/// [`SUMMARY_INSTRUCTION`].
pub fn request_text(
    transcript: &[Arc<Message>],
    compacted: Option<&Compacted>,
    cut: usize,
) -> String {
    let start = compacted.map_or(0, |c| c.replaced);
    let mut out = String::new();
    if let Some(c) = compacted {
        out.push_str("## Summary of the turns before\n\n");
        for b in &c.summary.content {
            if let Block::Text { text } = b {
                out.push_str(text.strip_prefix(SUMMARY_LEAD).unwrap_or(text));
            }
        }
        out.push_str("\n\n");
    }
    for m in &transcript[start.min(cut)..cut.min(transcript.len())] {
        out.push_str(match m.role {
            Role::User => "## User\n\n",
            Role::Assistant => "## Assistant\n\n",
        });
        for b in &m.content {
            match b {
                Block::Text { text } => quote(&mut out, "", text),
                Block::Thinking { .. } => {}
                Block::ToolUse { name, input, .. } => {
                    quote(&mut out, &format!("[tool call {name}] "), input.get())
                }
                Block::ToolResult {
                    content, is_error, ..
                } => {
                    let lead = if *is_error {
                        "[tool result, an error] "
                    } else {
                        "[tool result] "
                    };
                    quote(&mut out, lead, content)
                }
                Block::Media(m) => {
                    out.push_str(&format!("[attachment: {}]\n", m.mime));
                }
            }
        }
        out.push('\n');
    }
    out.push_str("---\n\n");
    out.push_str(SUMMARY_INSTRUCTION);
    out
}

/// Appends `lead` and `text`, cut at [`QUOTE_BYTES_MAX`] on a character boundary.
fn quote(out: &mut String, lead: &str, text: &str) {
    out.push_str(lead);
    if text.len() <= QUOTE_BYTES_MAX {
        out.push_str(text);
    } else {
        let mut end = QUOTE_BYTES_MAX;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        out.push_str(&text[..end]);
        out.push_str(&format!(" [... {} more bytes]", text.len() - end));
    }
    out.push('\n');
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msg(role: Role, text: &str) -> Arc<Message> {
        Arc::new(Message {
            role,
            content: vec![Block::Text { text: text.into() }],
        })
    }

    fn bytes(m: &Message) -> usize {
        m.content
            .iter()
            .map(|b| match b {
                Block::Text { text } => text.len(),
                _ => 0,
            })
            .sum()
    }

    /// u a u a u a u: seven messages of ten bytes each.
    fn turns() -> Vec<Arc<Message>> {
        (0..7)
            .map(|i| {
                let role = if i % 2 == 0 {
                    Role::User
                } else {
                    Role::Assistant
                };
                msg(role, &format!("message {i}."))
            })
            .collect()
    }

    #[test]
    fn the_cut_keeps_about_the_budget_and_starts_at_an_assistant_message() {
        let t = turns();
        // 30 bytes kept: messages 4, 5, 6 (the cut at 5 keeps 20; at 3, 40 is over).
        assert_eq!(cut(&t, None, 30, bytes), Some(5));
        assert_eq!(cut(&t, None, 40, bytes), Some(3));
        // A budget smaller than the latest turn still keeps the latest assistant message.
        assert_eq!(cut(&t, None, 1, bytes), Some(5));
        // After a summary that replaced up to 5, nothing more can be cut.
        let c = Compacted {
            replaced: 5,
            summary: Arc::new(summary_message("s")),
        };
        assert_eq!(cut(&t, Some(&c), 1, bytes), None);
        let earlier = Compacted {
            replaced: 1,
            summary: Arc::new(summary_message("s")),
        };
        assert_eq!(cut(&t, Some(&earlier), 1000, bytes), Some(3));
        // Only users' messages: nothing to cut at.
        let users = vec![msg(Role::User, "a"), msg(Role::User, "b")];
        assert_eq!(cut(&users, None, 0, bytes), None);
    }

    #[test]
    fn the_view_is_the_summary_then_the_kept_turns() {
        let t = turns();
        let c = Compacted {
            replaced: 5,
            summary: Arc::new(summary_message("what happened")),
        };
        let v = view(&t, Some(&c));
        assert_eq!(v.len(), 3);
        assert_eq!(v[0].role, Role::User);
        assert!(
            matches!(&v[0].content[0], Block::Text { text } if text.ends_with("what happened"))
        );
        assert!(Arc::ptr_eq(&v[1], &t[5]));
        assert_eq!(view(&t, None).len(), 7);
    }

    #[test]
    fn the_request_quotes_the_earlier_summary_and_the_covered_turns_only() {
        let mut t = turns();
        t.insert(
            2,
            Arc::new(Message {
                role: Role::User,
                content: vec![Block::ToolResult {
                    tool_use_id: "c1".into(),
                    content: "x".repeat(QUOTE_BYTES_MAX + 10),
                    is_error: true,
                }],
            }),
        );
        let c = Compacted {
            replaced: 1,
            summary: Arc::new(summary_message("the gist")),
        };
        let text = request_text(&t, Some(&c), 4);
        assert!(text.starts_with("## Summary of the turns before\n\nthe gist"));
        assert!(!text.contains("message 0."), "{text}");
        assert!(text.contains("message 1."));
        assert!(text.contains("[tool result, an error] "));
        assert!(text.contains("[... 10 more bytes]"));
        assert!(
            !text.contains("message 4."),
            "the kept turns are not summarized"
        );
        assert!(text.ends_with(SUMMARY_INSTRUCTION));
    }
}
