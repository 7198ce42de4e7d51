//! The session's entries as the llm-runner/v1 role reads them (`session.read`,
//! `session.head`): one entry per durable record that adds to the conversation, so an entry's
//! bytes never change once served. A send's RunStarted is a user entry (the results it
//! resolves and its prompt), a ModelStepFinished an assistant entry, each ToolResult a tool
//! entry of its own (the record's result: its reason and size too) (the transcript merges a step's results into one message; an entry per
//! result keeps a read stable while the batch is still answering), an imported episode one
//! entry per message. An entry's `mid` is its record's WAL sequence number (`<seq>.<i>` for
//! the i-th message of an import after the first): fixed by the log, so the same across
//! restarts and readers.
//!
//! Kept only when asked for (`Session::with_entries`): the live actor does not need them.

use std::sync::Arc;

use broca_protocol::{Message, Role};
use broca_wal::runrec::ResultBlock;
use broca_wal::Record;

/// One entry.
#[derive(Debug, Clone, PartialEq)]
pub struct Entry {
    pub mid: String,
    /// The index of the run that wrote it (absent for an imported message).
    pub run: Option<usize>,
    /// `user`, `assistant` or `tool`.
    pub role: &'static str,
    /// When it was written, in Unix milliseconds, when its record says.
    pub written_at: Option<u64>,
    pub body: Body,
}

/// What an entry holds.
#[derive(Debug, Clone, PartialEq)]
pub enum Body {
    /// A message of the conversation, as the transcript holds it.
    Message(Arc<Message>),
    /// One tool result, as its record holds it (with the reason and size broca wrote it
    /// with, when it wrote it itself).
    Result(ResultBlock),
}

impl Body {
    /// The entry's message in broca's own schema: a conversation message, or a tool result
    /// `{role: "tool", tool_use_id, content, is_error?, reason?, bytes?, limit?}`.
    pub fn to_json(&self) -> serde_json::Value {
        match self {
            Body::Message(m) => serde_json::to_value(&**m).expect("a message serializes"),
            Body::Result(r) => {
                let mut v = serde_json::json!({
                    "role": "tool",
                    "tool_use_id": r.call_id,
                    "content": r.content,
                });
                if r.is_error {
                    v["is_error"] = true.into();
                }
                if let Some(reason) = &r.reason {
                    v["reason"] = reason.clone().into();
                }
                if let Some(size) = r.size {
                    v["bytes"] = size.bytes.into();
                    v["limit"] = size.limit.into();
                }
                v
            }
        }
    }
}

/// The entries of a session, and when it last changed.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Entries {
    pub list: Vec<Entry>,
    /// The newest time a record stated.
    pub updated_at: Option<u64>,
}

/// What a record adds, read before the record is applied (its run's index then).
pub(crate) enum Note {
    /// A prompt: the message the record's application pushes.
    Pushed {
        run: Option<usize>,
        role: &'static str,
        at: Option<u64>,
    },
    /// One tool result.
    Result {
        run: Option<usize>,
        result: ResultBlock,
    },
    /// An import: every message it pushes.
    Imported,
    /// A record that adds no entry but states a time (a terminal, a resume).
    Time(Option<u64>),
}

impl Note {
    /// The note for `record`; `next_run` is the index a RunStarted gets, `open` the open run's.
    pub(crate) fn of(record: &Record, next_run: usize, open: Option<usize>) -> Note {
        match record {
            Record::RunStarted(r) => Note::Pushed {
                run: Some(next_run),
                role: "user",
                at: Some(r.at_unix_ms),
            },
            Record::ModelStepFinished(r) => Note::Pushed {
                run: open,
                role: "assistant",
                at: r.at_unix_ms,
            },
            Record::ToolResult(r) => Note::Result {
                run: open,
                result: r.result.clone(),
            },
            Record::EpisodeImported(_) => Note::Imported,
            Record::RunFinished(r) => Note::Time(r.at_unix_ms),
            Record::RunPaused(r) => Note::Time(r.at_unix_ms),
            Record::RunResumed(r) => Note::Time(Some(r.at_unix_ms)),
            Record::CancelRequested(r) => Note::Time(Some(r.at_unix_ms)),
            Record::SendQueued(r) => Note::Time(Some(r.at_unix_ms)),
            Record::SendRetracted(r) => Note::Time(Some(r.at_unix_ms)),
            _ => Note::Time(None),
        }
    }
}

impl Entries {
    /// Adds what the record of `seq` added; `pushed` are the transcript's messages its
    /// application pushed.
    pub(crate) fn add(&mut self, seq: u64, note: Note, pushed: &[Arc<Message>]) {
        let mut at = None;
        match note {
            Note::Pushed { run, role, at: t } => {
                at = t;
                if let Some(message) = pushed.last() {
                    self.list.push(Entry {
                        mid: seq.to_string(),
                        run,
                        role,
                        written_at: t,
                        body: Body::Message(message.clone()),
                    });
                }
            }
            Note::Result { run, result } => self.list.push(Entry {
                mid: seq.to_string(),
                run,
                role: "tool",
                written_at: None,
                body: Body::Result(result),
            }),
            Note::Imported => {
                for (i, message) in pushed.iter().enumerate() {
                    self.list.push(Entry {
                        mid: if i == 0 {
                            seq.to_string()
                        } else {
                            format!("{seq}.{i}")
                        },
                        run: None,
                        role: match message.role {
                            Role::User => "user",
                            Role::Assistant => "assistant",
                        },
                        written_at: None,
                        body: Body::Message(message.clone()),
                    });
                }
            }
            Note::Time(t) => at = t,
        }
        if let Some(t) = at {
            self.updated_at = Some(self.updated_at.map_or(t, |u| u.max(t)));
        }
    }

    /// The position of the entry `mid` (0-based).
    pub fn position(&self, mid: &str) -> Option<usize> {
        self.list.iter().position(|e| e.mid == mid)
    }
}
