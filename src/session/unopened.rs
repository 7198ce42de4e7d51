//! The answers of a session no actor holds: what needs no actor is answered here (a status
//! from the WAL read as a reader; a session never written answered from nothing, without
//! creating its WAL), and the rest is handed back to be answered by an actor opened for it.

use std::path::{Path, PathBuf};

use futures_channel::oneshot;

use broca_core::admission::Refusal;
use broca_wire::request::uploads::UploadOp;
use broca_wire::{Code, RpcError};

use crate::command::{Cancelled, Release, Retracted, SessionCommand};

/// What became of a command for a session no actor holds.
#[derive(Debug)]
pub enum Unopened {
    /// Answered (or its answer is on its way from the WAL).
    Answered,
    /// Only an actor answers it: open one and hand it the command.
    Open(SessionCommand),
    /// An expiry of a session never written or deleted: the keeper's retention says when it
    /// expired, if it did.
    Expire(oneshot::Sender<Option<u64>>),
}

/// Answers `cmd` for the session whose WAL is `wal`, no actor holding it. A session that was
/// written (or is in the archive) is handed back for an actor, except a status, which is read
/// from its WAL on the blocking pool (no lease, nothing written).
pub fn answer_unopened(wal: &Path, cmd: SessionCommand) -> Unopened {
    if let SessionCommand::Status { run_id, reply } = cmd {
        glommio::spawn_local(view_from_wal(wal.to_path_buf(), run_id, reply)).detach();
        return Unopened::Answered;
    }
    if writes(&cmd) || broca_wal::archive::exists(wal) {
        return Unopened::Open(cmd);
    }
    never_written(cmd)
}

/// Whether `cmd` writes a session never written (a send admission let through, an import, a
/// host's start with its plan): an actor must open (and create) its WAL.
fn writes(cmd: &SessionCommand) -> bool {
    matches!(cmd, SessionCommand::Send { admission, .. } if admission.is_ok())
        || matches!(cmd, SessionCommand::Import { .. })
        || matches!(cmd, SessionCommand::HostStart { plan: Some(_), .. })
}

/// Whether an actor holding a session never written answers `cmd` as if none held it: all
/// but what writes, and what only an actor answers (its status, a barrier, a close or an
/// expiry at rest).
pub(crate) fn as_never_written(cmd: &SessionCommand) -> bool {
    use SessionCommand as C;
    let actor_only = matches!(
        cmd,
        C::Status { .. } | C::Barrier { .. } | C::Close { .. } | C::Expire { .. }
    );
    !actor_only && !writes(cmd)
}

/// The answers of a session nothing was ever sent to (a refused send's send_id names no run
/// here either).
pub(crate) fn never_written(cmd: SessionCommand) -> Unopened {
    use SessionCommand as C;
    match cmd {
        C::Cancel { reply, .. } => drop(reply.send(Cancelled::NotActive)),
        C::Retract { reply, .. } => drop(reply.send(Ok(Retracted::NotPending))),
        C::Release { reply, .. } => drop(reply.send(Ok(Release::Absent))),
        C::Barrier { reply } => drop(reply.send(None)),
        C::Send { admission, reply } => {
            if let Err(u) = *admission {
                drop(reply.send(Err(RpcError::refusal(&u.refusal))));
            }
        }
        // There are no uploads into a session never written (llm-runner/v1 §9.12).
        C::Upload { op, reply, .. } => drop(reply.send(no_session_upload(&op))),
        // Nor calls a late result could settle.
        C::LateResult { reply, .. } => {
            drop(reply.send(Ok(broca_tools::late::LateRecorded::NotAwaited)))
        }
        C::CommandLate { reply, .. } => drop(reply.send(Ok(false))),
        C::Expire { reply } => return Unopened::Expire(reply),
        // No actor holds its WAL.
        C::Close { reply } => drop(reply.send(true)),
        C::Status { .. } | C::Import { .. } => unreachable!("answered or opened before"),
        planned => never_planned(planned),
    }
    Unopened::Answered
}

/// The answers of a session no plan was ever frozen in: no person-only command, no change,
/// no view; what its host's start comes to (its plan is fetched next), and an adoption's
/// refusal.
fn never_planned(cmd: SessionCommand) {
    use SessionCommand as C;
    let fresh = broca_core::Session::default();
    let unknown = || RpcError::refusal(&Refusal::UnknownInvocation);
    match cmd {
        C::UserCommand { request, reply, .. } => {
            let command = request.command.clone();
            let r = Refusal::UnknownUserCommand { command };
            drop(reply.send(Err(RpcError::refusal(&r))))
        }
        C::CommandReplied { reply, .. } => drop(reply.send(Err(unknown()))),
        C::CommandStatus { reply, .. } => drop(reply.send(Err(unknown()))),
        C::HostStart {
            identity,
            caller,
            reply,
            ..
        } => {
            let step = broca_core::adopt::host_start(&fresh, &caller, &identity);
            drop(reply.send(step.map_err(|r| RpcError::refusal(&r))))
        }
        C::Adopt {
            request,
            identity,
            required,
            caller,
            reply,
        } => {
            let answer =
                broca_core::adopt::adopt(&fresh, &caller, &request, &identity, required, 0)
                    .and_then(|(record, answer)| match record {
                        None => Ok(answer),
                        // No plan was applied here: an adoption always drifts.
                        Some(_) => Err(Refusal::PlanDrift {
                            frozen: None,
                            sent: identity.clone(),
                        }),
                    });
            drop(reply.send(answer.map_err(|r| RpcError::refusal(&r))))
        }
        C::Refresh { reply, .. } => drop(reply.send(Err(not_yet()))),
        C::RefreshPolicy { reply, .. } | C::FlushPrefix { reply, .. } => {
            drop(reply.send(Err(not_yet())))
        }
        // No session, so no provider to hand a view over.
        C::ApplyView { reply, .. } => drop(reply.send(Err(not_yet()))),
        other => unreachable!("{} is answered by never_written", other.name()),
    }
}

/// Answers a status from the session's WAL, read as a reader on the blocking pool. A WAL that
/// cannot be read drops the reply: the caller says the session is unavailable.
async fn view_from_wal(
    path: PathBuf,
    run_id: Option<String>,
    reply: oneshot::Sender<Option<broca_core::RunView>>,
) {
    let view = broca_io::blocking::run(broca_io::blocking::Kind::WalRead, move || {
        let Some(read) = broca_read::read_session(&path, broca_read::Keep::State)? else {
            return Ok(None);
        };
        let session = read.session;
        Ok::<_, broca_read::ReadError>(match run_id {
            Some(id) => session.run(&id).cloned(),
            None => session.runs.last().cloned(),
        })
    })
    .await;
    match view {
        Ok(v) => drop(reply.send(v)),
        Err(e) => tracing::error!("{e}"),
    }
}

/// What an upload operation on a session never written answers: its status `gone`, a begin
/// `unknown_session`, anything else `unknown_upload`.
fn no_session_upload(op: &UploadOp) -> Result<serde_json::Value, RpcError> {
    match op {
        UploadOp::Status { .. } => Ok(serde_json::json!({"state": "gone", "received": 0})),
        UploadOp::Begin { .. }
        | UploadOp::Refused {
            method: broca_wire::Method::UploadBegin,
            ..
        } => Err(RpcError::new(
            Code::UnknownSession,
            "this session was never written; an upload goes into an existing session",
        )),
        UploadOp::Refused { error, .. } => Err(error.clone()),
        other => Err(RpcError::new(
            Code::UnknownUpload,
            format!(
                "no upload `{}` in this session",
                other.upload_id().unwrap_or_default().escape_debug()
            ),
        )),
    }
}

/// A change op on a session nothing was ever sent to.
fn not_yet() -> RpcError {
    RpcError::new(
        Code::UnknownSession,
        "nothing was sent to this session yet; a change applies to a session's plan",
    )
}
