//! Answers to commands no actor takes (a child of `registry`): refused while the shard
//! closes, failed with the error that kept the session from opening, and a status read from
//! the WAL for a session that is not open.

use futures_channel::oneshot;

use crate::session::SessionCommand;
use broca_core::admission::Refusal;
use broca_wire::RpcError;

pub(super) fn refuse_closing(cmd: SessionCommand) {
    let r = Refusal::ShuttingDown;
    fail(cmd, &RpcError::refusal(&r));
}

/// Answers a command that cannot be served (a dropped reply reads as unavailable).
pub(super) fn fail(cmd: SessionCommand, err: &RpcError) {
    match cmd {
        SessionCommand::Send { reply, .. } => {
            let _ = reply.send(Err(err.clone()));
        }
        SessionCommand::Status { reply, .. } => drop(reply),
        SessionCommand::Cancel { reply, .. } => drop(reply),
        SessionCommand::Retract { reply, .. } => {
            let _ = reply.send(Err(err.clone()));
        }
        SessionCommand::Barrier { reply } => drop(reply),
        SessionCommand::Import { reply, .. } => {
            let _ = reply.send(Err(err.clone()));
        }
        SessionCommand::Shutdown | SessionCommand::Close => {}
    }
}

/// Answers a status from the session's WAL, read as a reader on the blocking pool (no lease,
/// nothing written). A WAL that cannot be read drops the reply: the caller says the session is
/// unavailable.
pub(super) async fn view_from_wal(
    path: std::path::PathBuf,
    run_id: Option<String>,
    reply: oneshot::Sender<Option<broca_core::RunView>>,
) {
    let view = glommio::executor()
        .spawn_blocking(move || {
            let Some(read) = broca_core::read_session(&path, broca_core::Keep::State)? else {
                return Ok(None);
            };
            let session = read.session;
            Ok::<_, broca_core::ReadError>(match run_id {
                Some(id) => session.run(&id).cloned(),
                None => session.runs.last().cloned(),
            })
        })
        .await;
    match view {
        Ok(v) => {
            let _ = reply.send(v);
        }
        Err(e) => tracing::error!("{e}"),
    }
}
