//! A status read from the WAL for a session no actor holds.

use futures_channel::oneshot;

/// Answers a status from the session's WAL, read as a reader on the blocking pool (no lease,
/// nothing written). A WAL that cannot be read drops the reply: the caller says the session is
/// unavailable.
pub(crate) async fn view_from_wal(
    path: std::path::PathBuf,
    run_id: Option<String>,
    reply: oneshot::Sender<Option<broca_core::RunView>>,
) {
    let view = broca_io::blocking::run(broca_io::blocking::Kind::WalRead, move || {
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
