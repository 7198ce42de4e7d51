//! The management requests: the envelope `{"method", "params"}`, the method names, and each
//! method's parameters, parsed strictly (an unknown parameter is refused by name). One parser
//! for every surface that takes these requests (serve's `/v1/rpc`, the fuzz targets).

use serde::Deserialize;
use serde_json::{Map, Value};

use crate::{Code, RpcError, SendRequest};

mod envelope;
use envelope::parse_envelope;
pub mod lists;
mod send_params;
pub mod uploads;
use cortexkit_role_llm_runner::history::HistoryRequest;
use cortexkit_role_llm_runner::read::ReadRequest;
use cortexkit_role_llm_runner::tool_calls::ToolCallsRequest;
use send_params::role_send_members;
pub use send_params::{list_not_admitted, plan_not_admitted};

/// The management methods.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    SessionSend,
    SessionRead,
    SessionHead,
    SessionRetract,
    SessionSendStatus,
    SendStatus,
    RunStatus,
    RunResult,
    RunCancel,
    SessionImport,
    RoleDescribe,
    SessionBaseline,
    SessionHistory,
    RunToolCalls,
    SessionsList,
    RunsList,
    UploadBegin,
    UploadAppend,
    UploadStatus,
    UploadCommit,
    MediaRead,
    /// llm-runner/v1 `session.release`: the owner ends the session sooner.
    SessionRelease,
    /// llm-runner/v1 `session.user_command`: the owner relays a person-only command.
    SessionUserCommand,
    /// llm-runner/v1 `session.user_command_status`: a relayed command's state.
    SessionUserCommandStatus,
    /// llm-runner/v1 `session.refresh` (`session_change`): the owner changes the plan.
    SessionRefresh,
    /// llm-runner/v1 `session.refresh_policy`: a pending change's rung.
    SessionRefreshPolicy,
    /// llm-runner/v1 `session.flush_prefix`: a pending change applies at the next run.
    SessionFlushPrefix,
    /// llm-runner/v1 `session.adopt` (`adopt`): a consumer becomes the owner of a session
    /// its host started.
    SessionAdopt,
    /// `session.host_start {plan}` (broca's own): the host's surface (a person's app) starts
    /// a session with the installation's fetch plan applied.
    SessionHostStart,
    /// `broca.debug.advance_clock {ms}`: moves the process's clock forward (the
    /// llm-runner/v1 suite's retention clock). A debug build's test hook, not in [`Method::ALL`]:
    /// a release build parses no such method.
    DebugAdvanceClock,
    /// `broca.debug.archive_now {}` on a session: packs it now, as the archive would once it
    /// is idle (its reasoning pruned when serve prunes). A debug build's test hook, like
    /// [`Method::DebugAdvanceClock`].
    DebugArchiveNow,
}

impl Method {
    /// Every method, in the order the docs list them.
    pub const ALL: [Method; 29] = [
        Method::SessionSend,
        Method::RunStatus,
        Method::RunResult,
        Method::RunCancel,
        Method::RunToolCalls,
        Method::SessionRead,
        Method::SessionHead,
        Method::SessionHistory,
        Method::SessionRetract,
        Method::SessionSendStatus,
        Method::SendStatus,
        Method::SessionImport,
        Method::RoleDescribe,
        Method::SessionBaseline,
        Method::SessionsList,
        Method::RunsList,
        Method::UploadBegin,
        Method::UploadAppend,
        Method::UploadStatus,
        Method::UploadCommit,
        Method::MediaRead,
        Method::SessionRelease,
        Method::SessionUserCommand,
        Method::SessionUserCommandStatus,
        Method::SessionRefresh,
        Method::SessionRefreshPolicy,
        Method::SessionFlushPrefix,
        Method::SessionAdopt,
        Method::SessionHostStart,
    ];

    /// The method's wire name.
    pub fn as_str(self) -> &'static str {
        use cortexkit_role_llm_runner::ops;
        match self {
            Method::SessionSend => ops::SESSION_SEND,
            Method::SessionRead => ops::SESSION_READ,
            Method::SessionHead => ops::SESSION_HEAD,
            Method::SessionRetract => ops::SESSION_RETRACT,
            Method::SessionSendStatus => ops::SESSION_SEND_STATUS,
            Method::SendStatus => ops::SEND_STATUS,
            Method::RunStatus => ops::RUN_STATUS,
            Method::RunResult => ops::RUN_RESULT,
            Method::RunCancel => ops::RUN_CANCEL,
            Method::SessionImport => broca_protocol::ops::SESSION_IMPORT,
            Method::RoleDescribe => ops::ROLE_DESCRIBE,
            Method::SessionBaseline => ops::SESSION_BASELINE,
            Method::SessionHistory => ops::SESSION_HISTORY,
            Method::RunToolCalls => ops::RUN_TOOL_CALLS,
            Method::SessionsList => broca_protocol::ops::SESSIONS_LIST,
            Method::RunsList => broca_protocol::ops::RUNS_LIST,
            Method::UploadBegin => ops::SESSION_UPLOAD_BEGIN,
            Method::UploadAppend => ops::SESSION_UPLOAD_APPEND,
            Method::UploadStatus => ops::SESSION_UPLOAD_STATUS,
            Method::UploadCommit => ops::SESSION_UPLOAD_COMMIT,
            Method::MediaRead => ops::SESSION_MEDIA_READ,
            Method::SessionRelease => ops::SESSION_RELEASE,
            Method::SessionUserCommand => ops::SESSION_USER_COMMAND,
            Method::SessionUserCommandStatus => ops::SESSION_USER_COMMAND_STATUS,
            Method::SessionRefresh => ops::SESSION_REFRESH,
            Method::SessionRefreshPolicy => ops::SESSION_REFRESH_POLICY,
            Method::SessionFlushPrefix => ops::SESSION_FLUSH_PREFIX,
            Method::SessionAdopt => ops::SESSION_ADOPT,
            Method::SessionHostStart => broca_protocol::ops::SESSION_HOST_START,
            Method::DebugAdvanceClock => broca_protocol::ops::DEBUG_ADVANCE_CLOCK,
            Method::DebugArchiveNow => broca_protocol::ops::DEBUG_ARCHIVE_NOW,
        }
    }

    /// Whether the method changes anything (a send, a cancel, a retraction, an import):
    /// the web view's sign-in, which only reads, is refused these.
    pub fn writes(self) -> bool {
        matches!(
            self,
            Method::SessionSend
                | Method::SessionRetract
                | Method::RunCancel
                | Method::SessionImport
                | Method::UploadBegin
                | Method::UploadAppend
                | Method::UploadCommit
                | Method::SessionRelease
                | Method::SessionUserCommand
                | Method::SessionRefresh
                | Method::SessionRefreshPolicy
                | Method::SessionFlushPrefix
                | Method::SessionAdopt
                | Method::SessionHostStart
        )
    }

    /// The method named `name`.
    pub fn parse(name: &str) -> Option<Method> {
        if cfg!(debug_assertions) {
            for m in [Method::DebugAdvanceClock, Method::DebugArchiveNow] {
                if name == m.as_str() {
                    return Some(m);
                }
            }
        }
        Method::ALL.into_iter().find(|m| m.as_str() == name)
    }
}

/// The session a request names: its triple, as given (the WAL's rules check it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionName {
    pub project_root: String,
    pub harness: String,
    pub session: String,
}

/// A parsed management request.
#[derive(Debug, Clone, PartialEq)]
pub enum Request {
    Send {
        session: SessionName,
        send: Box<SendRequest>,
    },
    Status {
        session: SessionName,
        run_id: Option<String>,
    },
    Result {
        session: SessionName,
        run_id: String,
        /// broca's long poll: wait up to this long (at most [`RESULT_WAIT_MAX_MS`]) for an
        /// active run to end before answering.
        wait_ms: Option<u64>,
    },
    Cancel {
        session: SessionName,
        run_id: String,
        /// Where the run stops.
        at: CancelAt,
    },
    /// llm-runner/v1's `run.tool_calls`: a run's tool calls, paged.
    ToolCalls {
        session: SessionName,
        calls: Box<ToolCallsRequest>,
    },
    /// llm-runner/v1's `session.history`: the whole history, paged by opaque cursors, raw or
    /// as display rows.
    History {
        session: SessionName,
        history: Box<HistoryRequest>,
    },
    /// llm-runner/v1's `session.read`, its request as the role defines it.
    Read {
        session: SessionName,
        read: Box<ReadRequest>,
    },
    /// llm-runner/v1's `session.head`.
    Head { session: SessionName },
    /// llm-runner/v1's `session.release` (`session_retention`): the owner ends the session.
    Release { session: SessionName },
    /// llm-runner/v1's `session.send_status` (also `send.status`): what a re-send of
    /// `send_id` would answer, without acting.
    SendStatus {
        session: SessionName,
        send_id: String,
    },
    /// llm-runner/v1's `session.retract`: withdraw a queued send.
    Retract {
        session: SessionName,
        submission_id: String,
        /// The request named a `sender`: refused once the caller is checked (a sender is the
        /// route's attested principal, never a request field).
        named_sender: bool,
    },
    /// What this build serves of the llm-runner/v1 role (names no session; a route's session,
    /// put in its params, is ignored).
    Describe,
    /// What the session froze (llm-runner/v1's `session.baseline`).
    Baseline { session: SessionName },
    /// llm-runner/v1's `session.user_command`: relay a person-only command (owner-only).
    UserCommand {
        session: SessionName,
        command: Box<cortexkit_role_llm_runner::user_commands::UserCommandRequest>,
    },
    /// llm-runner/v1's `session.user_command_status`: a relayed command's state.
    UserCommandStatus {
        session: SessionName,
        call_key: String,
    },
    /// llm-runner/v1's `session.refresh` (`session_change`, owner-only).
    Refresh {
        session: SessionName,
        refresh: Box<cortexkit_role_llm_runner::session_change::RefreshRequest>,
    },
    /// llm-runner/v1's `session.refresh_policy` (owner-only).
    RefreshPolicy {
        session: SessionName,
        policy: Box<cortexkit_role_llm_runner::session_change::RefreshPolicyRequest>,
    },
    /// llm-runner/v1's `session.flush_prefix` (owner-only).
    FlushPrefix {
        session: SessionName,
        send_id: String,
    },
    /// llm-runner/v1's `session.adopt`.
    Adopt {
        session: SessionName,
        adopt: Box<cortexkit_role_llm_runner::adopt::AdoptRequest>,
    },
    /// broca's `session.host_start {plan}`.
    HostStart {
        session: SessionName,
        plan: Map<String, Value>,
    },
    /// Every session the daemon holds, filtered and paged (broca's own; not on a route).
    SessionsList { list: Box<lists::SessionsList> },
    /// llm-runner/v1's uploads into the session's content store.
    Upload {
        session: SessionName,
        op: uploads::UploadOp,
    },
    /// llm-runner/v1's `session.media_read`: media the session's history references.
    MediaRead {
        session: SessionName,
        read: cortexkit_role_llm_runner::attachments::MediaReadRequest,
    },
    /// One session's runs, newest first, paged (broca's own).
    RunsList {
        session: SessionName,
        list: Box<lists::RunsList>,
    },
    /// A debug build's test hook: move the clock forward by `ms` ([`Method::DebugAdvanceClock`]).
    AdvanceClock { ms: u64 },
    /// A debug build's test hook: pack the session now ([`Method::DebugArchiveNow`]).
    ArchiveNow { session: SessionName },
    /// Import a log (or every log under a folder): each part of the session not given
    /// comes from the log.
    Import {
        /// `claude-code` or `codex`.
        format: String,
        /// An absolute path, on the daemon's machine.
        path: String,
        project_root: Option<String>,
        harness: Option<String>,
        session: Option<String>,
    },
}

impl Request {
    pub fn method(&self) -> Method {
        match self {
            Request::Send { .. } => Method::SessionSend,
            Request::Status { .. } => Method::RunStatus,
            Request::Result { .. } => Method::RunResult,
            Request::Cancel { .. } => Method::RunCancel,
            Request::Read { .. } => Method::SessionRead,
            Request::Head { .. } => Method::SessionHead,
            Request::Release { .. } => Method::SessionRelease,
            Request::Retract { .. } => Method::SessionRetract,
            Request::SendStatus { .. } => Method::SessionSendStatus,
            Request::Import { .. } => Method::SessionImport,
            Request::Describe => Method::RoleDescribe,
            Request::Baseline { .. } => Method::SessionBaseline,
            Request::UserCommand { .. } => Method::SessionUserCommand,
            Request::UserCommandStatus { .. } => Method::SessionUserCommandStatus,
            Request::Refresh { .. } => Method::SessionRefresh,
            Request::RefreshPolicy { .. } => Method::SessionRefreshPolicy,
            Request::FlushPrefix { .. } => Method::SessionFlushPrefix,
            Request::Adopt { .. } => Method::SessionAdopt,
            Request::HostStart { .. } => Method::SessionHostStart,
            Request::ToolCalls { .. } => Method::RunToolCalls,
            Request::History { .. } => Method::SessionHistory,
            Request::SessionsList { .. } => Method::SessionsList,
            Request::RunsList { .. } => Method::RunsList,
            Request::Upload { op, .. } => match op {
                uploads::UploadOp::Begin { .. } => Method::UploadBegin,
                uploads::UploadOp::Append { .. } => Method::UploadAppend,
                uploads::UploadOp::Status { .. } => Method::UploadStatus,
                uploads::UploadOp::Commit { .. } => Method::UploadCommit,
                uploads::UploadOp::Refused { method, .. } => *method,
            },
            Request::MediaRead { .. } => Method::MediaRead,
            Request::AdvanceClock { .. } => Method::DebugAdvanceClock,
            Request::ArchiveNow { .. } => Method::DebugArchiveNow,
        }
    }

    /// The session the request names (an import may name none: its logs do).
    pub fn session(&self) -> Option<&SessionName> {
        match self {
            Request::Send { session, .. }
            | Request::Status { session, .. }
            | Request::Result { session, .. }
            | Request::Cancel { session, .. }
            | Request::Read { session, .. }
            | Request::Head { session }
            | Request::Release { session }
            | Request::Retract { session, .. }
            | Request::SendStatus { session, .. }
            | Request::ToolCalls { session, .. }
            | Request::History { session, .. }
            | Request::RunsList { session, .. }
            | Request::Upload { session, .. }
            | Request::MediaRead { session, .. }
            | Request::ArchiveNow { session }
            | Request::UserCommand { session, .. }
            | Request::UserCommandStatus { session, .. }
            | Request::Refresh { session, .. }
            | Request::RefreshPolicy { session, .. }
            | Request::FlushPrefix { session, .. }
            | Request::Adopt { session, .. }
            | Request::HostStart { session, .. }
            | Request::Baseline { session } => Some(session),
            Request::Import { .. }
            | Request::Describe
            | Request::SessionsList { .. }
            | Request::AdvanceClock { .. } => None,
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Envelope {
    method: String,
    #[serde(default)]
    params: Option<Map<String, Value>>,
}

fn invalid(why: impl Into<String>) -> RpcError {
    RpcError::new(Code::InvalidParams, why)
}

fn not_an_envelope(e: serde_json::Error) -> RpcError {
    RpcError::new(
        Code::InvalidRequest,
        format!("the body is not a request envelope {{\"method\", \"params\"}}: {e}"),
    )
}

/// Parses a request body: the envelope, the method, and its parameters.
pub fn parse(body: &[u8]) -> Result<Request, RpcError> {
    let env: Envelope = serde_json::from_slice(body).map_err(not_an_envelope)?;
    parse_envelope(env)
}

/// Parses a request that arrived on a route bound to `session` (module mode): the route
/// names the session, so params that name one are refused, and the route's goes in.
pub fn parse_on_route(body: &[u8], session: &SessionName) -> Result<Request, RpcError> {
    let mut v: Value = serde_json::from_slice(body).map_err(not_an_envelope)?;
    let Some(obj) = v.as_object_mut() else {
        return Err(RpcError::new(
            Code::InvalidRequest,
            "the body is not an object",
        ));
    };
    let Value::Object(params) = obj
        .entry("params")
        .or_insert_with(|| Value::Object(Map::new()))
    else {
        return Err(invalid("`params` is not an object").with_field("params"));
    };
    for key in ["project_root", "harness", "session"] {
        if params.contains_key(key) {
            return Err(invalid(format!(
                "`{key}`: a request on a route names no session (the route does)"
            ))
            .with_field(key));
        }
    }
    params.insert("project_root".into(), session.project_root.clone().into());
    params.insert("harness".into(), session.harness.clone().into());
    params.insert("session".into(), session.session.clone().into());
    let env: Envelope = serde_json::from_value(v).map_err(not_an_envelope)?;
    parse_envelope(env)
}

/// The most bytes of a person-only command's input (llm-runner/v1 §9.10).
pub const USER_COMMAND_INPUT_MAX: usize = 4096;

/// The refusal of a method this build does not know, listing those it does.
fn unknown_method(name: &str) -> RpcError {
    let known: Vec<&str> = Method::ALL.iter().map(|m| m.as_str()).collect();
    RpcError::new(
        Code::UnknownMethod,
        format!(
            "unknown method `{}` (known: {})",
            name.escape_debug(),
            known.join(", ")
        ),
    )
}

/// Where `run.cancel` stops a run (llm-runner/v1 `run_cancel.at`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CancelAt {
    /// At once: the step in flight is dropped, calls out are left as they are.
    Now,
    /// Once the current model step and its whole tool batch are recorded; no further step.
    StepBoundary,
}

impl CancelAt {
    /// The points broca serves, as `role.describe` lists them.
    pub const ALL: [&'static str; 2] = ["now", "step_boundary"];
}

/// A cancel's `at`: `now` (what an absent one means) or `step_boundary`.
fn cancel_at(at: Option<Value>) -> Result<CancelAt, RpcError> {
    match at {
        None | Some(Value::Null) => Ok(CancelAt::Now),
        Some(Value::String(at)) if at == "now" => Ok(CancelAt::Now),
        Some(Value::String(at)) if at == "step_boundary" => Ok(CancelAt::StepBoundary),
        Some(other) => Err(invalid(format!(
            "`at` must be now or step_boundary (the cancellation points broca serves), not \
             {other}"
        ))
        .with_field("at")),
    }
}

/// Refuses a parameter the method does not take, by name.
fn no_more(params: &Map<String, Value>, method: Method) -> Result<(), RpcError> {
    match params.keys().next() {
        Some(k) => Err(invalid(format!(
            "unknown parameter `{}` for {}",
            k.escape_debug(),
            method.as_str()
        ))
        .with_field(k.as_str())),
        None => Ok(()),
    }
}

/// A role request decoded strictly from `params`; a refusal names the field at fault (an
/// unknown one, or the first whose value the request type refuses).
fn strict<T: serde::de::DeserializeOwned>(
    params: Map<String, Value>,
    method: Method,
) -> Result<Box<T>, RpcError> {
    match serde_json::from_value::<T>(Value::Object(params.clone())) {
        Ok(t) => Ok(Box::new(t)),
        Err(e) => {
            let field = params
                .iter()
                .find(|(k, v)| {
                    let alone: Map<String, Value> =
                        std::iter::once(((*k).clone(), (*v).clone())).collect();
                    serde_json::from_value::<T>(Value::Object(alone))
                        .err()
                        .is_some_and(|e| !e.to_string().starts_with("missing field"))
                })
                .map(|(k, _)| k.clone());
            let e = invalid(format!("{}: {e}", method.as_str()));
            Err(match field {
                Some(f) => e.with_field(f),
                None => e,
            })
        }
    }
}

/// session.import's parameters: `format`, an absolute `path`, and any of the session's
/// parts.
fn import(mut params: Map<String, Value>) -> Result<Request, RpcError> {
    let format = take_str(&mut params, "format")?.ok_or_else(|| invalid("`format` is required"))?;
    if !matches!(format.as_str(), "claude-code" | "codex") {
        return Err(invalid(format!(
            "`format` must be claude-code or codex, not `{}`",
            format.escape_debug()
        )));
    }
    let path = take_str(&mut params, "path")?.ok_or_else(|| invalid("`path` is required"))?;
    if !path.starts_with('/') {
        return Err(invalid(
            "`path` must be absolute (the daemon's working directory is not yours)",
        ));
    }
    let request = Request::Import {
        format,
        path,
        project_root: take_str(&mut params, "project_root")?,
        harness: take_str(&mut params, "harness")?,
        session: take_str(&mut params, "session")?,
    };
    no_more(&params, Method::SessionImport)?;
    Ok(request)
}

fn take_str(params: &mut Map<String, Value>, key: &str) -> Result<Option<String>, RpcError> {
    match params.remove(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(other) => Err(invalid(format!("`{key}` must be a string, not {other}"))),
    }
}

/// The longest `run.result` long poll (`wait_ms`).
pub const RESULT_WAIT_MAX_MS: u64 = 60_000;

fn wait_ms(params: &mut Map<String, Value>) -> Result<Option<u64>, RpcError> {
    match params.remove("wait_ms") {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(n)) if n.as_u64().is_some_and(|n| n <= RESULT_WAIT_MAX_MS) => {
            Ok(n.as_u64())
        }
        Some(other) => Err(invalid(format!(
            "`wait_ms` must be a whole number of milliseconds from 0 to {RESULT_WAIT_MAX_MS}, \
             not {other}"
        ))
        .with_field("wait_ms")),
    }
}

fn required_run_id(params: &mut Map<String, Value>) -> Result<String, RpcError> {
    take_str(params, "run_id")?.ok_or_else(|| invalid("`run_id` is required"))
}

fn session_name(params: &mut Map<String, Value>) -> Result<SessionName, RpcError> {
    let mut part =
        |key: &str| take_str(params, key)?.ok_or_else(|| invalid(format!("`{key}` is required")));
    Ok(SessionName {
        project_root: part("project_root")?,
        harness: part("harness")?,
        session: part("session")?,
    })
}

#[cfg(test)]
mod tests;
