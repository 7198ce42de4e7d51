//! The commands a session's actor answers, in order, and what some of them did.

use std::sync::Arc;

use futures_channel::oneshot;

use broca_core::admission::{Prepared, Unprepared};
use broca_core::replay::RunView;

use broca_import::{Format, Identity};

/// A command for a live session; each is answered in order. (Closing an idle session and
/// stopping are the shard registry's own messages, `broca_shards::registry::Msg`.)
pub enum SessionCommand {
    /// Admit a send (the run then runs in the actor).
    Send {
        /// The send as admission's first part left it (see
        /// [`crate::SessionActor::send_prepared`]); boxed, as it carries the resolved config.
        admission: Box<Result<Prepared, Unprepared>>,
        reply: oneshot::Sender<Result<SendReply, broca_wire::RpcError>>,
    },
    /// The view of a run (the latest when `None`).
    Status {
        run_id: Option<String>,
        reply: oneshot::Sender<Option<RunView>>,
    },
    /// Release the session (llm-runner/v1 `session.release`; the principal of its first send
    /// only): recorded durably before the answer.
    Release {
        caller: broca_wire::Caller,
        reply: oneshot::Sender<Result<Release, broca_wire::RpcError>>,
    },
    /// Withdraw a queued send before it starts (owner-only).
    Retract {
        submission_id: String,
        caller: broca_wire::Caller,
        reply: oneshot::Sender<Result<Retracted, broca_wire::RpcError>>,
    },
    /// Cancel the run if it is the active one and the caller owns the session.
    Cancel {
        run_id: String,
        /// Where the run stops.
        at: broca_wire::CancelAt,
        caller: broca_wire::Caller,
        reply: oneshot::Sender<Cancelled>,
    },
    /// Wait until everything appended is durable; answer the last seq (`None` if the log
    /// failed).
    Barrier { reply: oneshot::Sender<Option<u64>> },
    /// An upload operation (`attachments`), of `caller`.
    Upload {
        op: broca_wire::request::uploads::UploadOp,
        caller: broca_wire::Caller,
        reply: oneshot::Sender<Result<serde_json::Value, broca_wire::RpcError>>,
    },
    /// Close the actor if the session is at rest (no run active, nothing queued), so that a
    /// maintenance may take its WAL's lease (the archive packing it now): answered `true`
    /// once the actor has closed its WAL, `false` while a run holds it.
    Close { reply: oneshot::Sender<bool> },
    /// Record a tool module's late result, for a call the session sealed without an outcome.
    LateResult {
        late: broca_tools::late::LateResult,
        reply: oneshot::Sender<Result<broca_tools::late::LateRecorded, broca_wire::RpcError>>,
    },
    /// Expire the session if it is past its retention (llm-runner/v1 `retention`): its
    /// shard writes the tombstone, closes the actor and deletes the session, then answers
    /// when it expired; `None` when it is not expired.
    Expire { reply: oneshot::Sender<Option<u64>> },
    /// A person-only command of `caller` (llm-runner/v1 `session.user_command`, owner-only):
    /// answered from the session, or recorded durably and handed back to be forwarded.
    UserCommand {
        request: Box<cortexkit_role_llm_runner::user_commands::UserCommandRequest>,
        caller: broca_wire::Caller,
        reply: oneshot::Sender<Result<CommandStep, broca_wire::RpcError>>,
    },
    /// The first reply of a forwarded command (its provider's, or broca's `failed` /
    /// `outcome_unknown`): recorded durably, then the invocation's answer.
    CommandReplied {
        call_key: String,
        answer: broca_wal::cmdrec::CommandReply,
        reply: oneshot::Sender<Result<serde_json::Value, broca_wire::RpcError>>,
    },
    /// `session.user_command_status` of `caller` (owner-only).
    CommandStatus {
        call_key: String,
        caller: broca_wire::Caller,
        reply: oneshot::Sender<Result<StatusAnswer, broca_wire::RpcError>>,
    },
    /// Late entries of an accepted command (progress, its result): recorded durably and
    /// once each; answered whether the command still waits for its result.
    CommandLate {
        call_key: String,
        entries: Vec<broca_wal::cmdrec::UserCommandRecord>,
        reply: oneshot::Sender<Result<bool, broca_wire::RpcError>>,
    },
    /// `session.refresh` of `caller` (owner-only; llm-runner/v1 `session_change`): without
    /// `plan`, what the request comes to (a repeat's answer, or a plan to fetch); with the
    /// fetched `plan`, accepted durably and answered.
    Refresh {
        request: Box<cortexkit_role_llm_runner::session_change::RefreshRequest>,
        identity: String,
        plan: Option<Box<broca_wal::planrec::FrozenPlan>>,
        caller: broca_wire::Caller,
        reply: oneshot::Sender<Result<RefreshStep, broca_wire::RpcError>>,
    },
    /// `session.host_start` of `caller` (the host's own surface): without `plan`, what it
    /// comes to (a repeat's answer, or a plan to fetch); with the fetched `plan`, recorded
    /// durably and answered.
    HostStart {
        identity: String,
        plan: Option<Box<broca_wal::planrec::FrozenPlan>>,
        caller: broca_wire::Caller,
        reply: oneshot::Sender<Result<broca_core::adopt::HostStart, broca_wire::RpcError>>,
    },
    /// `session.adopt` of `caller` (llm-runner/v1 `adopt`; `required`: a first adoption
    /// must name a storage policy).
    Adopt {
        request: Box<cortexkit_role_llm_runner::adopt::AdoptRequest>,
        identity: String,
        required: bool,
        caller: broca_wire::Caller,
        reply: oneshot::Sender<Result<serde_json::Value, broca_wire::RpcError>>,
    },
    /// `session.refresh_policy` of `caller` (owner-only).
    RefreshPolicy {
        request: Box<cortexkit_role_llm_runner::session_change::RefreshPolicyRequest>,
        caller: broca_wire::Caller,
        reply: oneshot::Sender<Result<serde_json::Value, broca_wire::RpcError>>,
    },
    /// `session.flush_prefix` of `caller` (owner-only).
    FlushPrefix {
        send_id: String,
        caller: broca_wire::Caller,
        reply: oneshot::Sender<Result<serde_json::Value, broca_wire::RpcError>>,
    },
    /// A view from the session's compaction provider `provider`, checked already against
    /// the transcript: recorded durably and applied from the run's next step boundary, unless
    /// the session has accepted a view as new since (`stale_version`).
    ApplyView {
        provider: String,
        view: std::sync::Arc<cortexkit_role_compaction::view::View>,
        reply: oneshot::Sender<
            Result<Result<(), cortexkit_role_compaction::view::ViewRefusal>, broca_wire::RpcError>,
        >,
    },
    /// Import another harness's log (refused while a run is active).
    Import {
        input: Box<ImportInput>,
        reply: oneshot::Sender<Result<ImportReply, broca_wire::RpcError>>,
    },
}

impl std::fmt::Debug for SessionCommand {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl SessionCommand {
    /// The command's name, for logs and assertions (never its content).
    pub fn name(&self) -> &'static str {
        match self {
            SessionCommand::Send { .. } => "send",
            SessionCommand::Status { .. } => "status",
            SessionCommand::Release { .. } => "release",
            SessionCommand::Retract { .. } => "retract",
            SessionCommand::Cancel { .. } => "cancel",
            SessionCommand::Barrier { .. } => "barrier",
            SessionCommand::Upload { .. } => "upload",
            SessionCommand::Close { .. } => "close",
            SessionCommand::LateResult { .. } => "late_result",
            SessionCommand::Expire { .. } => "expire",
            SessionCommand::UserCommand { .. } => "user_command",
            SessionCommand::CommandReplied { .. } => "command_replied",
            SessionCommand::CommandStatus { .. } => "command_status",
            SessionCommand::CommandLate { .. } => "command_late",
            SessionCommand::Refresh { .. } => "refresh",
            SessionCommand::HostStart { .. } => "host_start",
            SessionCommand::Adopt { .. } => "adopt",
            SessionCommand::RefreshPolicy { .. } => "refresh_policy",
            SessionCommand::FlushPrefix { .. } => "flush_prefix",
            SessionCommand::ApplyView { .. } => "apply_view",
            SessionCommand::Import { .. } => "import",
        }
    }

    /// Answers a command that cannot be served with `err` (a status, cancel or barrier,
    /// which carry no error, drops its reply: the caller reads that as unavailable).
    pub fn fail(self, err: &broca_wire::RpcError) {
        match self {
            SessionCommand::Send { reply, .. } => drop(reply.send(Err(err.clone()))),
            SessionCommand::Retract { reply, .. } => drop(reply.send(Err(err.clone()))),
            SessionCommand::Release { reply, .. } => drop(reply.send(Err(err.clone()))),
            SessionCommand::Import { reply, .. } => drop(reply.send(Err(err.clone()))),
            SessionCommand::Upload { reply, .. } => drop(reply.send(Err(err.clone()))),
            SessionCommand::LateResult { reply, .. } => drop(reply.send(Err(err.clone()))),
            SessionCommand::UserCommand { reply, .. } => drop(reply.send(Err(err.clone()))),
            SessionCommand::CommandReplied { reply, .. } => drop(reply.send(Err(err.clone()))),
            SessionCommand::CommandStatus { reply, .. } => drop(reply.send(Err(err.clone()))),
            SessionCommand::CommandLate { reply, .. } => drop(reply.send(Err(err.clone()))),
            SessionCommand::Refresh { reply, .. } => drop(reply.send(Err(err.clone()))),
            SessionCommand::HostStart { reply, .. } => drop(reply.send(Err(err.clone()))),
            SessionCommand::Adopt { reply, .. } => drop(reply.send(Err(err.clone()))),
            SessionCommand::RefreshPolicy { reply, .. } => drop(reply.send(Err(err.clone()))),
            SessionCommand::FlushPrefix { reply, .. } => drop(reply.send(Err(err.clone()))),
            SessionCommand::ApplyView { reply, .. } => drop(reply.send(Err(err.clone()))),
            SessionCommand::Status { reply, .. } => drop(reply),
            SessionCommand::Cancel { reply, .. } => drop(reply),
            SessionCommand::Barrier { reply } => drop(reply),
            SessionCommand::Expire { reply } => drop(reply),
            SessionCommand::Close { reply } => drop(reply),
        }
    }
}

/// What a `session.user_command` came to in its session's actor.
#[derive(Debug, Clone, PartialEq)]
pub enum CommandStep {
    /// The answer (a retry's stored reply, or `outcome_unknown` recorded for a lost one).
    Answer(serde_json::Value),
    /// The invocation is being forwarded by an earlier request: ask again shortly.
    InFlight,
    /// The invocation is durable: forward it to `provider` on the session's route (its scope
    /// of epoch `scope_epoch`), then hand the reply back ([`SessionCommand::CommandReplied`]).
    Forward {
        call_key: String,
        provider: String,
        command: String,
        scope_epoch: u64,
    },
}

/// What a `session.refresh` came to in its session's actor.
#[derive(Debug, Clone, PartialEq)]
pub enum RefreshStep {
    /// The answer (an identical repeat's, or the accepted refresh's).
    Answer(serde_json::Value),
    /// A new generation: fetch its plan, then ask again with it.
    Fetch,
}

/// A `session.user_command_status` answer, and the provider of a command still waiting for
/// its result (its late entries are to be pulled).
#[derive(Debug, Clone, PartialEq)]
pub struct StatusAnswer {
    pub value: serde_json::Value,
    pub provider: Option<String>,
}

/// What a `session.release` found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Release {
    /// Nothing was ever sent or imported into the session.
    Absent,
    /// Its release is durable (now, or before); it is deleted at `delete_after_ms` at the
    /// earliest, once no run of it is left.
    Pending { delete_after_ms: u64 },
}

/// What a `session.retract` did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Retracted {
    /// The queued send is durably withdrawn and never starts.
    Retracted,
    /// It already started a run.
    AlreadyStarted,
    /// No queued send has that id (nothing was written).
    NotPending,
}

impl Retracted {
    /// The answer's wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            Retracted::Retracted => "retracted",
            Retracted::AlreadyStarted => "already_started",
            Retracted::NotPending => "not_pending",
        }
    }
}

/// What a `run.cancel` did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cancelled {
    /// The active run was told to stop.
    Ack,
    /// No such run is active: nothing was written.
    NotActive,
    /// The run is active, and the caller does not own the session.
    NotOwner,
}

/// The answer to a send.
#[derive(Debug, Clone, PartialEq)]
pub struct SendReply {
    /// The run the send started or named (empty for a queued send).
    pub run_id: String,
    /// True when the send_id named an existing run (or queued send) and nothing was written.
    pub existing: bool,
    /// The queued send's submission, when the send waits for the active run to end.
    pub pending: Option<String>,
    /// The whole answer when the session gives it itself: a steered send's
    /// (`views::steer_answer`), or an ordered send's that ended undelivered (`{state, slot?}`).
    pub steer: Option<serde_json::Value>,
    /// What the run being driven must hear of this send.
    pub joins: Option<Joins>,
}

/// How an admitted send bears on the run being driven.
#[derive(Debug, Clone, PartialEq)]
pub enum Joins {
    /// A steer (its record's seq and prompt) for the next step boundary.
    Steer {
        seq: u64,
        blocks: Vec<broca_protocol::Block>,
    },
    /// An interrupt: the run is cancelled, and the send starts next.
    Interrupt,
    /// An ordered send waiting for the run's boundaries (llm-runner/v1 `delivery_order`).
    Ordered(broca_core::machine::Waiting),
}

/// A log to import, read whole.
#[derive(Debug, Clone)]
pub struct ImportInput {
    pub format: Format,
    /// The file's path as it is to be recorded (resolved).
    pub file: String,
    pub bytes: Arc<Vec<u8>>,
    pub identity: Identity,
}

/// What an import did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImportReply {
    /// The episode written, or the import that holds the source already.
    pub import_id: String,
    /// True when nothing was written (the session holds the source as it is).
    pub existing: bool,
    pub messages: usize,
    pub first_line: u64,
    pub last_line: u64,
    pub outcome_unknown: Vec<String>,
    pub pending: Vec<String>,
    /// The notes of what was left out, as `line N: note`.
    pub notes: Vec<String>,
}
