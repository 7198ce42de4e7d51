//! The WAL's record kinds. Each record is a frame whose `kind` says how to read its JSON
//! payload. Kinds this build does not know are skipped and counted, never fatal, so a newer
//! writer's records do not stop an older reader.

use serde::{Deserialize, Serialize};

use super::changerec::SessionChangeRecord;
use super::cmdrec::UserCommandRecord;
use super::importrec::EpisodeImported;
use super::runrec::{
    CancelRequested, ContextCompacted, ModelAttemptFinished, ModelStepFinished, ReasoningPruned,
    RunFinished, RunPaused, RunResumed, RunStarted, SendQueued, SendRetracted, SendSteered,
    SessionReleased, StepStarted, ToolDispatchIntent, ToolResult, ToolResultLate, UploadBegun,
    UploadCommitted,
};
use super::viewrec::ViewAccepted;

/// Kind codes. Codes are never reused for another meaning.
pub mod kind {
    /// [`super::LeaseAcquired`].
    pub const LEASE_ACQUIRED: u16 = 1;
    pub const RUN_STARTED: u16 = 10;
    pub const STEP_STARTED: u16 = 11;
    pub const MODEL_ATTEMPT_FINISHED: u16 = 12;
    pub const MODEL_STEP_FINISHED: u16 = 13;
    pub const TOOL_DISPATCH_INTENT: u16 = 14;
    pub const TOOL_RESULT: u16 = 15;
    pub const RUN_PAUSED: u16 = 16;
    pub const RUN_FINISHED: u16 = 17;
    pub const RUN_RESUMED: u16 = 18;
    pub const CANCEL_REQUESTED: u16 = 19;
    /// [`super::EpisodeImported`].
    pub const EPISODE_IMPORTED: u16 = 20;
    /// [`crate::runrec::SendQueued`].
    pub const SEND_QUEUED: u16 = 21;
    /// [`crate::runrec::SendRetracted`].
    pub const SEND_RETRACTED: u16 = 22;
    /// [`crate::runrec::SendSteered`].
    pub const SEND_STEERED: u16 = 23;
    /// [`crate::runrec::UploadBegun`].
    pub const UPLOAD_BEGUN: u16 = 24;
    /// [`crate::runrec::UploadCommitted`].
    pub const UPLOAD_COMMITTED: u16 = 25;
    /// [`crate::runrec::ContextCompacted`].
    pub const CONTEXT_COMPACTED: u16 = 26;
    /// [`crate::runrec::ToolResultLate`].
    pub const TOOL_RESULT_LATE: u16 = 27;
    pub const SESSION_RELEASED: u16 = 28;
    /// [`crate::runrec::ReasoningPruned`].
    pub const REASONING_PRUNED: u16 = 29;
    /// [`crate::cmdrec::UserCommandRecord`].
    pub const USER_COMMAND: u16 = 30;
    /// [`crate::changerec::SessionChangeRecord`].
    pub const SESSION_CHANGE: u16 = 31;
    /// [`crate::viewrec::ViewAccepted`].
    pub const VIEW_ACCEPTED: u16 = 32;
}

/// A record of the WAL.
#[derive(Debug, Clone, PartialEq)]
pub enum Record {
    /// A writer took the lease: the epoch that fences older writers out.
    LeaseAcquired(LeaseAcquired),
    RunStarted(Box<RunStarted>),
    StepStarted(StepStarted),
    ModelAttemptFinished(ModelAttemptFinished),
    ModelStepFinished(Box<ModelStepFinished>),
    ToolDispatchIntent(ToolDispatchIntent),
    ToolResult(ToolResult),
    RunPaused(RunPaused),
    RunFinished(RunFinished),
    RunResumed(RunResumed),
    CancelRequested(CancelRequested),
    /// Another harness's log taken in as one episode.
    EpisodeImported(Box<EpisodeImported>),
    /// A send that came while a run was active, waiting for its turn.
    SendQueued(Box<SendQueued>),
    /// A queued send withdrawn before it started.
    SendRetracted(SendRetracted),
    /// A send steered into the running run, waiting for its next step boundary.
    SendSteered(Box<SendSteered>),
    /// An upload into the session's content store began.
    UploadBegun(UploadBegun),
    /// An upload's bytes are in the content store, checked and durable.
    UploadCommitted(UploadCommitted),
    /// Older turns summarized: the summary stands in for them in the model's requests.
    ContextCompacted(Box<ContextCompacted>),
    /// A tool call's answer that came after its run sealed it without an outcome.
    ToolResultLate(Box<ToolResultLate>),
    /// The session's owner released it (llm-runner/v1 `session.release`).
    SessionReleased(SessionReleased),
    /// [`crate::runrec::ReasoningPruned`].
    ReasoningPruned(Box<ReasoningPruned>),
    /// A person-only command relayed to its provider, one step of it.
    UserCommand(Box<UserCommandRecord>),
    /// A mid-session change accepted (a refresh, a rung, a flush).
    SessionChange(Box<SessionChangeRecord>),
    /// [`crate::viewrec::ViewAccepted`].
    ViewAccepted(Box<ViewAccepted>),
    /// A kind this build does not know; its payload is kept as it is.
    Unknown {
        kind: u16,
        payload: Vec<u8>,
    },
}

/// Written first by every writer that opens the log.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseAcquired {
    /// The lease epoch: one more than any epoch the log held before.
    pub epoch: u32,
    /// The writer's process id.
    pub pid: u32,
    /// When the lease was taken.
    pub at_unix_ms: u64,
    /// A torn tail this writer cut logically when it opened the log.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cut: Option<TailCut>,
}

/// Where a torn tail was cut, and how many bytes lay beyond the cut.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TailCut {
    pub at_offset: u64,
    pub bytes: u64,
}

impl Record {
    /// The frame kind code.
    pub fn kind(&self) -> u16 {
        match self {
            Record::LeaseAcquired(_) => kind::LEASE_ACQUIRED,
            Record::RunStarted(_) => kind::RUN_STARTED,
            Record::StepStarted(_) => kind::STEP_STARTED,
            Record::ModelAttemptFinished(_) => kind::MODEL_ATTEMPT_FINISHED,
            Record::ModelStepFinished(_) => kind::MODEL_STEP_FINISHED,
            Record::ToolDispatchIntent(_) => kind::TOOL_DISPATCH_INTENT,
            Record::ToolResult(_) => kind::TOOL_RESULT,
            Record::RunPaused(_) => kind::RUN_PAUSED,
            Record::RunFinished(_) => kind::RUN_FINISHED,
            Record::RunResumed(_) => kind::RUN_RESUMED,
            Record::CancelRequested(_) => kind::CANCEL_REQUESTED,
            Record::EpisodeImported(_) => kind::EPISODE_IMPORTED,
            Record::SendQueued(_) => kind::SEND_QUEUED,
            Record::SendRetracted(_) => kind::SEND_RETRACTED,
            Record::SendSteered(_) => kind::SEND_STEERED,
            Record::UploadBegun(_) => kind::UPLOAD_BEGUN,
            Record::UploadCommitted(_) => kind::UPLOAD_COMMITTED,
            Record::ContextCompacted(_) => kind::CONTEXT_COMPACTED,
            Record::ToolResultLate(_) => kind::TOOL_RESULT_LATE,
            Record::SessionReleased(_) => kind::SESSION_RELEASED,
            Record::ReasoningPruned(_) => kind::REASONING_PRUNED,
            Record::UserCommand(_) => kind::USER_COMMAND,
            Record::SessionChange(_) => kind::SESSION_CHANGE,
            Record::ViewAccepted(_) => kind::VIEW_ACCEPTED,
            Record::Unknown { kind, .. } => *kind,
        }
    }

    /// The kind's name, as `broca wal dump` shows it.
    pub fn kind_name(code: u16) -> Option<&'static str> {
        match code {
            kind::LEASE_ACQUIRED => Some("lease_acquired"),
            kind::RUN_STARTED => Some("run_started"),
            kind::STEP_STARTED => Some("step_started"),
            kind::MODEL_ATTEMPT_FINISHED => Some("model_attempt_finished"),
            kind::MODEL_STEP_FINISHED => Some("model_step_finished"),
            kind::TOOL_DISPATCH_INTENT => Some("tool_dispatch_intent"),
            kind::TOOL_RESULT => Some("tool_result"),
            kind::RUN_PAUSED => Some("run_paused"),
            kind::RUN_FINISHED => Some("run_finished"),
            kind::RUN_RESUMED => Some("run_resumed"),
            kind::CANCEL_REQUESTED => Some("cancel_requested"),
            kind::EPISODE_IMPORTED => Some("episode_imported"),
            kind::SEND_QUEUED => Some("send_queued"),
            kind::SEND_RETRACTED => Some("send_retracted"),
            kind::SEND_STEERED => Some("send_steered"),
            kind::UPLOAD_BEGUN => Some("upload_begun"),
            kind::UPLOAD_COMMITTED => Some("upload_committed"),
            kind::CONTEXT_COMPACTED => Some("context_compacted"),
            kind::TOOL_RESULT_LATE => Some("tool_result_late"),
            kind::SESSION_RELEASED => Some("session_released"),
            kind::REASONING_PRUNED => Some("reasoning_pruned"),
            kind::USER_COMMAND => Some("user_command"),
            kind::SESSION_CHANGE => Some("session_change"),
            kind::VIEW_ACCEPTED => Some("view_accepted"),
            _ => None,
        }
    }

    /// Writes the payload's JSON into `out` (cleared first).
    pub fn encode_payload(&self, out: &mut Vec<u8>) {
        out.clear();
        let w = &mut *out;
        match self {
            Record::LeaseAcquired(r) => serde_json::to_writer(w, r),
            Record::RunStarted(r) => serde_json::to_writer(w, r),
            Record::StepStarted(r) => serde_json::to_writer(w, r),
            Record::ModelAttemptFinished(r) => serde_json::to_writer(w, r),
            Record::ModelStepFinished(r) => serde_json::to_writer(w, r),
            Record::ToolDispatchIntent(r) => serde_json::to_writer(w, r),
            Record::ToolResult(r) => serde_json::to_writer(w, r),
            Record::RunPaused(r) => serde_json::to_writer(w, r),
            Record::RunFinished(r) => serde_json::to_writer(w, r),
            Record::RunResumed(r) => serde_json::to_writer(w, r),
            Record::CancelRequested(r) => serde_json::to_writer(w, r),
            Record::EpisodeImported(r) => serde_json::to_writer(w, r),
            Record::SendQueued(r) => serde_json::to_writer(w, r),
            Record::SendRetracted(r) => serde_json::to_writer(w, r),
            Record::SendSteered(r) => serde_json::to_writer(w, r),
            Record::UploadBegun(r) => serde_json::to_writer(w, r),
            Record::UploadCommitted(r) => serde_json::to_writer(w, r),
            Record::ContextCompacted(r) => serde_json::to_writer(w, r),
            Record::ToolResultLate(r) => serde_json::to_writer(w, r),
            Record::SessionReleased(r) => serde_json::to_writer(w, r),
            Record::ReasoningPruned(r) => serde_json::to_writer(w, r),
            Record::UserCommand(r) => serde_json::to_writer(w, r),
            Record::SessionChange(r) => serde_json::to_writer(w, r),
            Record::ViewAccepted(r) => serde_json::to_writer(w, r),
            Record::Unknown { payload, .. } => {
                out.extend_from_slice(payload);
                Ok(())
            }
        }
        .expect("records serialize to JSON");
    }

    /// Reads a payload of kind `code`. Unknown kinds come back as [`Record::Unknown`]; a known
    /// kind whose JSON does not parse is an error naming the kind.
    pub fn decode(code: u16, payload: &[u8]) -> Result<Record, DecodeError> {
        let bad = |e: serde_json::Error| DecodeError {
            kind: Record::kind_name(code).unwrap_or("?"),
            message: e.to_string(),
        };
        fn parse<'a, T: Deserialize<'a>>(
            payload: &'a [u8],
            bad: impl Fn(serde_json::Error) -> DecodeError,
        ) -> Result<T, DecodeError> {
            serde_json::from_slice(payload).map_err(bad)
        }
        match code {
            kind::LEASE_ACQUIRED => Ok(Record::LeaseAcquired(parse(payload, bad)?)),
            kind::RUN_STARTED => Ok(Record::RunStarted(Box::new(parse(payload, bad)?))),
            kind::STEP_STARTED => Ok(Record::StepStarted(parse(payload, bad)?)),
            kind::MODEL_ATTEMPT_FINISHED => Ok(Record::ModelAttemptFinished(parse(payload, bad)?)),
            kind::MODEL_STEP_FINISHED => {
                Ok(Record::ModelStepFinished(Box::new(parse(payload, bad)?)))
            }
            kind::TOOL_DISPATCH_INTENT => Ok(Record::ToolDispatchIntent(parse(payload, bad)?)),
            kind::TOOL_RESULT => Ok(Record::ToolResult(parse(payload, bad)?)),
            kind::RUN_PAUSED => Ok(Record::RunPaused(parse(payload, bad)?)),
            kind::RUN_FINISHED => Ok(Record::RunFinished(parse(payload, bad)?)),
            kind::RUN_RESUMED => Ok(Record::RunResumed(parse(payload, bad)?)),
            kind::CANCEL_REQUESTED => Ok(Record::CancelRequested(parse(payload, bad)?)),
            kind::EPISODE_IMPORTED => Ok(Record::EpisodeImported(Box::new(parse(payload, bad)?))),
            kind::SEND_QUEUED => Ok(Record::SendQueued(Box::new(parse(payload, bad)?))),
            kind::SEND_RETRACTED => Ok(Record::SendRetracted(parse(payload, bad)?)),
            kind::SEND_STEERED => Ok(Record::SendSteered(Box::new(parse(payload, bad)?))),
            kind::UPLOAD_BEGUN => Ok(Record::UploadBegun(parse(payload, bad)?)),
            kind::UPLOAD_COMMITTED => Ok(Record::UploadCommitted(parse(payload, bad)?)),
            kind::CONTEXT_COMPACTED => Ok(Record::ContextCompacted(Box::new(parse(payload, bad)?))),
            kind::TOOL_RESULT_LATE => Ok(Record::ToolResultLate(Box::new(parse(payload, bad)?))),
            kind::SESSION_RELEASED => Ok(Record::SessionReleased(parse(payload, bad)?)),
            kind::REASONING_PRUNED => Ok(Record::ReasoningPruned(Box::new(parse(payload, bad)?))),
            kind::USER_COMMAND => Ok(Record::UserCommand(Box::new(parse(payload, bad)?))),
            kind::SESSION_CHANGE => Ok(Record::SessionChange(Box::new(parse(payload, bad)?))),
            kind::VIEW_ACCEPTED => Ok(Record::ViewAccepted(Box::new(parse(payload, bad)?))),
            _ => Ok(Record::Unknown {
                kind: code,
                payload: payload.to_vec(),
            }),
        }
    }
}

/// A payload of a known kind whose JSON does not parse: the kind's name and the parser's
/// words.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecodeError {
    pub kind: &'static str,
    pub message: String,
}

impl std::fmt::Display for DecodeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} payload does not parse: {}", self.kind, self.message)
    }
}

impl std::error::Error for DecodeError {}
