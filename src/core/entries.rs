//! The session's entries as the llm-runner/v1 role reads them (`session.read`,
//! `session.head`, `session.history`, `run.tool_calls`): one entry per durable record that
//! adds to the conversation, so an entry's bytes never change once served. A send's RunStarted
//! is a user entry (the results it resolves and its prompt), a ModelStepFinished an assistant
//! entry, each ToolResult a tool entry of its own (the record's result: its reason and size
//! too) (the transcript merges a step's results into one message; an entry per result keeps
//! a read stable while the batch is still answering), an imported episode one entry per
//! message.
//!
//! An entry's `mid` is fixed by the log, so the same across restarts and readers: a user or
//! tool entry's is its record's seq, an assistant entry's its step's StepStarted seq (known
//! before the step's first word streams; a step record of an older log, which does not name
//! it, keeps its own seq), the i-th message of an import after the first `<seq>.<i>`.
//!
//! Beside each entry are the facts readers want without decoding bodies: for an assistant
//! entry its model and each tool call's key, module, times and result ([`CallFacts`]); for
//! a send's entry the caller's `client_message_id` and the attested sender.
//!
//! Kept only when asked for (`Session::with_entries`): the live actor does not need them.

use std::sync::Arc;

use broca_protocol::{Block, Json, Message, Role};
use broca_wal::runrec::{ResultBlock, ToolDispatchIntent};
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
    /// The tool calls an assistant entry carries, in the message's order.
    pub calls: Vec<CallFacts>,
    /// A send's entry: the caller's id for it.
    pub client_message_id: Option<String>,
    /// A send's entry: the attested principal that sent it (module routes).
    pub sender: Option<String>,
    /// An ordered send's entry (llm-runner/v1 §9.7): the mode it went out in, and for
    /// `tool_result` the call key of the result it went out with.
    pub delivered_as: Option<(String, Option<String>)>,
    /// An assistant entry a run wrote: `provider/model`.
    pub model: Option<String>,
}

/// What is known of one tool call of an assistant entry.
#[derive(Debug, Clone, PartialEq)]
pub struct CallFacts {
    /// The model's id (display only: not unique).
    pub id: String,
    pub name: String,
    /// The arguments as the model gave them (raw JSON text).
    pub args: Json,
    /// Minted in its dispatch intent.
    pub call_key: Option<String>,
    /// The module it was sent to (absent: never dispatched).
    pub dispatched_to: Option<String>,
    /// The tool-provider/v1 pin of the definition it was sent against (absent: never sent,
    /// or not a provider's tool).
    pub schema_pin: Option<String>,
    /// Its dispatch intent is durable.
    pub intent: bool,
    /// When it was handed to dispatch.
    pub started_at: Option<u64>,
    /// Its result, once recorded.
    pub result: Option<CallResult>,
}

/// A call's recorded result.
#[derive(Debug, Clone, PartialEq)]
pub struct CallResult {
    /// The index of the entry holding it.
    pub entry: usize,
    pub finished_at: Option<u64>,
    pub is_error: bool,
    /// Why broca wrote it itself (`outcome_unknown`, `not_dispatched`, ...).
    pub reason: Option<String>,
    /// The stored result's length in bytes.
    pub bytes: u64,
}

impl CallFacts {
    fn of(call: broca_protocol::ToolCall) -> CallFacts {
        CallFacts {
            id: call.id,
            name: call.name,
            args: call.input,
            call_key: None,
            dispatched_to: None,
            schema_pin: None,
            intent: false,
            started_at: None,
            result: None,
        }
    }

    /// A durable intent and no result: it may or may not have run.
    pub fn indeterminate(&self) -> bool {
        self.intent && self.result.is_none()
    }

    /// What happened to it, as `run.tool_calls` names it (`tool_calls::outcomes`), with
    /// `pending` for a call whose step is recorded and whose intent is not yet.
    pub fn outcome(&self) -> &'static str {
        match &self.result {
            Some(r) => result_outcome(r.is_error, r.reason.as_deref()),
            None if self.intent => "indeterminate",
            None => "pending",
        }
    }

    /// Why its provider never answered it (§4.7.1's `unanswered`), when it did not.
    pub fn unanswered(&self) -> Option<&'static str> {
        use broca_wal::runrec::result_reason as why;
        let r = self.result.as_ref()?;
        match r.reason.as_deref()? {
            why::OUTCOME_UNKNOWN => Some("interrupted"),
            why::TOOL_RESULT_TOO_LARGE => None,
            _ => Some("not_executed"),
        }
    }
}

/// What a call's recorded result says happened to it, as `run.tool_calls` names it
/// (`tool_calls::outcomes`): `succeeded`, `failed`, `indeterminate` (closed with its outcome
/// unknown), `not_executed` (a stop never sent it) or `refused`.
/// `reason` is why broca wrote the result itself, when it did.
pub fn result_outcome(is_error: bool, reason: Option<&str>) -> &'static str {
    use broca_wal::runrec::result_reason as why;
    match reason {
        None | Some(why::TOOL_RESULT_TOO_LARGE) if is_error => "failed",
        None => "succeeded",
        Some(why::OUTCOME_UNKNOWN) => "indeterminate",
        Some(
            why::NOT_DISPATCHED
            | why::BUDGET_EXHAUSTED
            | why::CONTEXT_CEILING
            | why::SKIPPED_AFTER_SUBMIT,
        ) => "not_executed",
        Some(_) => "refused",
    }
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
                // A result in parts is stored as its parts (llm-runner/v1's multi-part shape).
                let content = if r.parts.is_empty() {
                    serde_json::Value::String(r.content.clone())
                } else {
                    serde_json::to_value(&r.parts).expect("parts serialize")
                };
                let mut v = serde_json::json!({
                    "role": "tool",
                    "tool_use_id": r.call_id,
                    "content": content,
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
    /// The index of the last assistant entry (whose calls results answer).
    last_assistant: Option<usize>,
}

/// What a record adds, read before the record is applied (its run's index then).
pub(crate) enum Note {
    /// A send's prompt: the message the record's application pushes, with the results it
    /// resolves first.
    Sent {
        run: usize,
        at: u64,
        client_message_id: Option<String>,
        sender: Option<String>,
        resolved: Vec<ResultBlock>,
        /// An ordered send that started its run: `idle_start`.
        delivered_as: Option<String>,
    },
    /// A model step's message, `mid` its step's.
    Step {
        run: Option<usize>,
        mid: u64,
        at: Option<u64>,
        model: Option<String>,
    },
    /// A step's calls handed to dispatch.
    Intent(ToolDispatchIntent),
    /// One tool result.
    Result {
        run: Option<usize>,
        result: ResultBlock,
        at: Option<u64>,
    },
    /// An import (recorded at `at`): every message it pushes.
    Imported { at: u64 },
    /// A step (started at `at`) that renders steered sends: one user entry each.
    Steered {
        run: Option<usize>,
        steers: Vec<SteerNote>,
        at: Option<u64>,
    },
    /// A record that adds no entry but states a time (a terminal, a resume).
    Time(Option<u64>),
}

/// A steered send a step renders: its entry's facts.
pub(crate) struct SteerNote {
    pub(crate) mid: u64,
    pub(crate) at: u64,
    pub(crate) client_message_id: Option<String>,
    pub(crate) sender: Option<String>,
    pub(crate) blocks: Vec<Block>,
    /// An ordered send: its mode, and the model's id of the call whose result it went with.
    pub(crate) delivered: Option<(String, Option<String>)>,
}

impl Note {
    /// The note for `record` of `seq`; `next_run` is the index a RunStarted gets, `open` the
    /// open run's index and its `provider/model`.
    pub(crate) fn of(
        seq: u64,
        record: &Record,
        next_run: usize,
        open: Option<(usize, String)>,
    ) -> Note {
        let open_run = open.as_ref().map(|(i, _)| *i);
        match record {
            Record::RunStarted(r) => Note::Sent {
                run: next_run,
                at: r.at_unix_ms,
                client_message_id: r.client_message_id.clone(),
                sender: r.principal.clone(),
                resolved: r.resolved_calls.clone(),
                delivered_as: r.order.as_ref().map(|_| {
                    cortexkit_role_llm_runner::delivery_order::modes::IDLE_START.to_string()
                }),
            },
            Record::ModelStepFinished(r) => Note::Step {
                run: open_run,
                mid: assistant_mid(seq, r),
                at: r.at_unix_ms,
                model: open.map(|(_, model)| model),
            },
            Record::ToolDispatchIntent(r) => Note::Intent(r.clone()),
            Record::ToolResult(r) => Note::Result {
                run: open_run,
                result: r.result.clone(),
                at: r.at_unix_ms,
            },
            Record::EpisodeImported(r) => Note::Imported { at: r.at_unix_ms },
            Record::RunFinished(r) => Note::Time(r.at_unix_ms),
            Record::RunPaused(r) => Note::Time(r.at_unix_ms),
            Record::RunResumed(r) => Note::Time(Some(r.at_unix_ms)),
            Record::CancelRequested(r) => Note::Time(Some(r.at_unix_ms)),
            Record::SendQueued(r) => Note::Time(Some(r.at_unix_ms)),
            Record::SendRetracted(r) => Note::Time(Some(r.at_unix_ms)),
            Record::SendSteered(r) => Note::Time(Some(r.at_unix_ms)),
            Record::SessionChange(r) => Note::Time(r.activity_at()),
            _ => Note::Time(None),
        }
    }
}

/// The time a record says it was written, when it is activity: a send, a step or its tool
/// work, a terminal record (the times the entries' `updated_at` is the newest of). A lease
/// record is not: broca writes it on its own.
pub(crate) fn activity_at(record: &Record) -> Option<u64> {
    match record {
        Record::RunStarted(r) => Some(r.at_unix_ms),
        Record::StepStarted(r) if !r.steers.is_empty() => r.at_unix_ms,
        Record::ModelStepFinished(r) => r.at_unix_ms,
        Record::ToolDispatchIntent(r) => r.at_unix_ms,
        Record::ToolResult(r) => r.at_unix_ms,
        Record::EpisodeImported(r) => Some(r.at_unix_ms),
        Record::RunFinished(r) => r.at_unix_ms,
        Record::RunPaused(r) => r.at_unix_ms,
        Record::RunResumed(r) => Some(r.at_unix_ms),
        Record::CancelRequested(r) => Some(r.at_unix_ms),
        Record::SendQueued(r) => Some(r.at_unix_ms),
        Record::SendRetracted(r) => Some(r.at_unix_ms),
        Record::SendSteered(r) => Some(r.at_unix_ms),
        Record::SessionChange(r) => r.activity_at(),
        _ => None,
    }
}

/// The id of the `i`-th message of the import recorded at `seq`.
pub fn imported_mid(seq: u64, i: usize) -> String {
    if i == 0 {
        seq.to_string()
    } else {
        format!("{seq}.{i}")
    }
}

/// The calls an assistant message carries, in order.
fn calls_of(message: &Message) -> Vec<CallFacts> {
    message.tool_calls().map(CallFacts::of).collect()
}

impl Entries {
    /// Adds what the record of `seq` added; `pushed` are the transcript's messages its
    /// application pushed.
    pub(crate) fn add(&mut self, seq: u64, note: Note, pushed: &[Arc<Message>]) {
        let before = self.list.len();
        let at = match note {
            Note::Sent {
                run,
                at: t,
                client_message_id,
                sender,
                resolved,
                delivered_as,
            } => {
                if let Some(message) = pushed.last() {
                    let index = self.list.len();
                    for result in &resolved {
                        self.answer(index, result, Some(t));
                    }
                    self.list.push(Entry {
                        client_message_id,
                        sender,
                        delivered_as: delivered_as.map(|mode| (mode, None)),
                        ..Entry::new(seq.to_string(), Some(run), "user", Some(t), message)
                    });
                }
                Some(t)
            }
            Note::Step {
                run,
                mid,
                at: t,
                model,
            } => {
                // A step record of an older log states no time: the newest time before it.
                let written = t.or(self.updated_at);
                if let Some(message) = pushed.last() {
                    self.last_assistant = Some(self.list.len());
                    self.list.push(Entry {
                        calls: calls_of(message),
                        model,
                        ..Entry::new(mid.to_string(), run, "assistant", written, message)
                    });
                }
                t
            }
            Note::Intent(intent) => {
                self.intent(&intent);
                intent.at_unix_ms
            }
            Note::Result { run, result, at: t } => {
                self.result(seq, run, result, t);
                t
            }
            Note::Imported { at: t } => {
                self.imported(seq, t, pushed);
                Some(t)
            }
            Note::Steered { run, steers, at: t } => {
                self.steered(run, steers);
                t
            }
            Note::Time(t) => t,
        };
        assert!(self.list.len() >= before, "entries are only added");
        if let Some(t) = at {
            self.updated_at = Some(self.updated_at.map_or(t, |u| u.max(t)));
        }
    }

    /// A tool's result: its call answered, and its own entry.
    fn result(&mut self, seq: u64, run: Option<usize>, result: ResultBlock, t: Option<u64>) {
        let index = self.list.len();
        self.answer(index, &result, t);
        self.list.push(Entry {
            mid: seq.to_string(),
            run,
            role: "tool",
            // A result of an older log states no time: the newest time before it.
            written_at: t.or(self.updated_at),
            body: Body::Result(result),
            calls: Vec::new(),
            client_message_id: None,
            sender: None,
            delivered_as: None,
            model: None,
        });
    }

    /// The steered sends a step rendered: a user entry each, a `tool_result` delivery naming
    /// the call key of the result it went with.
    fn steered(&mut self, run: Option<usize>, steers: Vec<SteerNote>) {
        for s in steers {
            let message = Arc::new(Message {
                role: Role::User,
                content: s.blocks,
            });
            let delivered_as = s.delivered.map(|(mode, id)| {
                let key = id.and_then(|id| self.call_key_of(&id));
                (mode, key)
            });
            self.list.push(Entry {
                client_message_id: s.client_message_id,
                sender: s.sender,
                delivered_as,
                ..Entry::new(s.mid.to_string(), run, "user", Some(s.at), &message)
            });
        }
    }

    /// The call key of the last assistant entry's call `id` (the model's id), once minted.
    fn call_key_of(&self, id: &str) -> Option<String> {
        let e = self.list.get(self.last_assistant?)?;
        e.calls
            .iter()
            .rev()
            .find(|c| c.id == id)
            .and_then(|c| c.call_key.clone())
    }

    /// An import's messages: entries of no run; an imported result answers the call it
    /// names.
    fn imported(&mut self, seq: u64, at: u64, pushed: &[Arc<Message>]) {
        for (i, message) in pushed.iter().enumerate() {
            let index = self.list.len();
            let role = match message.role {
                Role::User => "user",
                Role::Assistant => "assistant",
            };
            for block in &message.content {
                if let Block::ToolResult {
                    tool_use_id,
                    content,
                    is_error,
                } = block
                {
                    let result = ResultBlock {
                        call_id: tool_use_id.clone(),
                        content: content.clone(),
                        is_error: *is_error,
                        reason: None,
                        size: None,
                        parts: Vec::new(),
                    };
                    self.answer(index, &result, None);
                }
            }
            // Written when broca took it in (the first ingest of a message another harness
            // stored).
            let mut entry = Entry::new(imported_mid(seq, i), None, role, Some(at), message);
            if message.role == Role::Assistant {
                entry.calls = calls_of(message);
                self.last_assistant = Some(index);
            }
            self.list.push(entry);
        }
    }

    /// The last assistant entry's calls get what the intent recorded of them.
    fn intent(&mut self, intent: &ToolDispatchIntent) {
        let Some(entry) = self.last_assistant.and_then(|i| self.list.get_mut(i)) else {
            return;
        };
        for (index, call) in intent.calls.iter().enumerate() {
            let Some(facts) = entry
                .calls
                .iter_mut()
                .find(|c| c.id == call.id && !c.intent && c.result.is_none())
            else {
                continue;
            };
            facts.intent = true;
            facts.call_key = intent.call_key(index).map(str::to_string);
            facts.dispatched_to = intent.dispatched_to.get(index).cloned().flatten();
            facts.schema_pin = intent.schema_pin(index).map(str::to_string);
            facts.started_at = intent.at_unix_ms;
        }
    }

    /// The call `result` answers (the last assistant entry's first unanswered call of its
    /// id) gets it, held by the entry at `entry`.
    fn answer(&mut self, entry: usize, result: &ResultBlock, at: Option<u64>) {
        let Some(holder) = self.last_assistant.and_then(|i| self.list.get_mut(i)) else {
            return;
        };
        let Some(facts) = holder
            .calls
            .iter_mut()
            .find(|c| c.id == result.call_id && c.result.is_none())
        else {
            return;
        };
        facts.result = Some(CallResult {
            entry,
            finished_at: at,
            is_error: result.is_error,
            reason: result.reason.clone(),
            bytes: result.content.len() as u64,
        });
    }

    /// The position of the entry `mid` (0-based).
    pub fn position(&self, mid: &str) -> Option<usize> {
        self.list.iter().position(|e| e.mid == mid)
    }
}

impl Entry {
    /// An entry of `message` with no facts beside it.
    fn new(
        mid: String,
        run: Option<usize>,
        role: &'static str,
        written_at: Option<u64>,
        message: &Arc<Message>,
    ) -> Entry {
        Entry {
            mid,
            run,
            role,
            written_at,
            body: Body::Message(message.clone()),
            calls: Vec::new(),
            client_message_id: None,
            sender: None,
            delivered_as: None,
            model: None,
        }
    }
}

/// The id (`mid`) of the assistant message the step record `seq` holds: its step's
/// StepStarted seq when the record names it, else (older logs) the record's own seq.
pub fn assistant_mid(seq: u64, r: &broca_wal::runrec::ModelStepFinished) -> u64 {
    r.step_seq.unwrap_or(seq)
}
