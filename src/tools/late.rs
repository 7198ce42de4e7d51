//! Late results that no call waits for any more (tool-provider/v1 §7): a tool module settled
//! a call after a restart sealed it without an outcome. broca-tools reads them
//! (`ModuleTools` of `modules`) and hands each to a [`LateSink`], which the host implements:
//! it finds the session by the entry's scope ref and has the session record it durably
//! (`ToolResultLate` in its WAL) before the entry is acked.

use std::future::Future;
use std::pin::Pin;

/// A late result for a call no call waits for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LateResult {
    pub module: String,
    /// The session's scope (its ref, as broca registered it) and the call's key.
    pub scope_ref: String,
    pub call_key: String,
    pub event_id: String,
    /// `result`, `not_started` or `expired`.
    pub outcome: String,
    pub content: String,
    pub is_error: bool,
    pub settled_at_unix_ms: u64,
    /// A person-only command's entry (its call key is a command's) as the command's update:
    /// progress or its result, which the session records for the command it awaits.
    pub command: Option<CommandUpdate>,
}

/// What became of a late result.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LateRecorded {
    /// Recorded in its session, durably.
    Recorded,
    /// Its session had recorded it already.
    AlreadyRecorded,
    /// No session of this broca waits for it (the call was answered, or is not broca's).
    NotAwaited,
    /// Its call's run is still open (a restart's run not sealed yet): read it again later.
    NotYet,
}

/// Why a late result was not recorded this time (it is read again).
#[derive(Debug)]
pub enum NotRecorded {
    /// broca is stopping.
    Stopping,
    /// The store is not open, so the result's session cannot be found.
    NoStore,
    /// The store could not list its sessions.
    Store(String),
    /// The session's shard took no command (its queue full, or it is gone).
    Shard(String),
    /// The session ended without answering.
    Unanswered,
    /// The session refused to record it (its reason).
    Refused(String),
}

impl std::fmt::Display for NotRecorded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NotRecorded::Stopping => f.write_str("broca is stopping"),
            NotRecorded::NoStore => {
                f.write_str("the store is not open, so the late result's session cannot be found")
            }
            NotRecorded::Store(why) => write!(f, "the store: {why}"),
            NotRecorded::Shard(why) => write!(f, "the session's shard: {why}"),
            NotRecorded::Unanswered => f.write_str("the session did not answer"),
            NotRecorded::Refused(why) => f.write_str(why),
        }
    }
}

impl std::error::Error for NotRecorded {}

/// Where late results go (the host's sessions).
pub trait LateSink: Send + Sync {
    /// Records `late` in its session; `Err` says why it could not be (it is read again).
    fn record(
        &self,
        late: LateResult,
    ) -> Pin<Box<dyn Future<Output = Result<LateRecorded, NotRecorded>> + 'static>>;
}

/// A late entry of a person-only command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CommandUpdate {
    /// Progress text for the person (not terminal).
    Progress { event_id: String, text: String },
    /// The command's result: `{state, text, job?}` as the module settled it, else `None` for
    /// an entry that cannot be read as one (a result not kept, a command never started, an
    /// expired one: the reason in `why`).
    Result {
        event_id: String,
        reply: Option<(String, String, Option<String>)>,
        why: String,
    },
}
