//! Reasoning pruned as the archive packs (llm-runner/v1 `archive_prunes_reasoning`,
//! docs/retention.md): with the serve config's `prune_reasoning` set, the archive rewrites
//! each session it packs through [`prune_reasoning`] (broca-read's `prune_log`), and the
//! copies this process keeps of a rewritten session are made again from the new bytes: the
//! readers' cache drops it, and the store takes its projection out and projects it anew.

use std::path::PathBuf;

use crate::Host;

/// The archive's rewrite of a session's WAL bytes: its reasoning pruned now (the sessions'
/// clock, which records' times use).
pub fn prune_reasoning(bytes: &[u8]) -> Result<Option<Vec<u8>>, broca_archive::RewriteError> {
    let now = broca_session::now_unix_ms();
    Ok(broca_read::prune::prune_log(bytes, now)?.map(|p| p.bytes))
}

/// The archive's options for this host: pruning when it prunes.
pub(crate) fn rewrite(host: &Host) -> Option<broca_archive::Rewrite> {
    host.opts
        .prune_reasoning
        .then_some(prune_reasoning as broca_archive::Rewrite)
}

impl Host {
    /// After a pack rewrote the WALs named `files` (in `wal/`): what this process keeps of
    /// them is made again from the new bytes. Blocking (the archive thread, the blocking
    /// pool).
    pub(crate) fn rewritten(&self, files: &[String]) {
        let paths: Vec<PathBuf> = files.iter().map(|f| self.wal_dir.join(f)).collect();
        for path in &paths {
            self.reads.forget(path);
        }
        let Some(store) = &self.store else {
            return;
        };
        for path in &paths {
            let Some(triple) = crate::state::session_of(path) else {
                continue;
            };
            if let Err(e) = store.forget(&triple.address().0) {
                tracing::error!("store: {e}; `broca store rebuild` makes it again");
            }
        }
        if let Some(tx) = &self.projector {
            let moved = paths.into_iter().map(broca_store::Moved::path).collect();
            crate::start::STORE_QUEUE.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
            let sent = tx.lock().unwrap_or_else(|e| e.into_inner()).try_send(moved);
            if sent.is_err() {
                crate::start::STORE_QUEUE.fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
                tracing::warn!("store: behind; the pruned sessions project with a later batch");
            }
        }
    }

    /// `broca.debug.archive_now` (a debug build's test hook): the session `t` packed now, as
    /// the archive thread packs an idle one (pruned when this host prunes). Its actor is
    /// closed first when the session is at rest; a run holding it leaves it live.
    #[cfg(debug_assertions)]
    pub(crate) async fn archive_now(
        &self,
        t: &broca_wal::SessionTriple,
    ) -> Result<serde_json::Value, broca_wire::RpcError> {
        use serde_json::json;
        let (reply, wait) = futures_channel::oneshot::channel();
        self.route(t.clone(), broca_session::SessionCommand::Close { reply })
            .map_err(crate::replies::unrouted)?;
        if !wait.await.unwrap_or(false) {
            return Ok(json!({"packed": false, "reason": "a run holds the session"}));
        }
        let file = broca_wal_writer::wal_path(&self.wal_dir, t)
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let state_dir = self.opts.state_dir.clone();
        let rewrite = rewrite(self);
        let report = broca_io::blocking::run(broca_io::blocking::Kind::ArchivePack, move || {
            pack_one(&state_dir, &file, rewrite)
        })
        .await;
        if let Ok(r) = &report {
            // A test hook: the store's copy is taken out on this thread.
            self.rewritten(&r.rewritten);
        }
        match report {
            Ok(r) => Ok(json!({
                "packed": !r.packed.is_empty(),
                "pruned": !r.rewritten.is_empty(),
                "skipped": r.skipped.iter().map(|(f, why)| format!("{f}: {why}"))
                    .collect::<Vec<_>>(),
            })),
            Err(e) => Err(broca_wire::RpcError::new(
                broca_wire::Code::Internal,
                format!("the archive could not pack the session: {e}"),
            )),
        }
    }
}

/// Packs the WAL named `file` alone, waiting a little for a closing actor's lease.
#[cfg(debug_assertions)]
fn pack_one(
    state_dir: &std::path::Path,
    file: &str,
    rewrite: Option<broca_archive::Rewrite>,
) -> Result<broca_archive::PackReport, broca_archive::Error> {
    let opts = broca_archive::PackOptions {
        only: Some(file.to_string()),
        rewrite,
        ..Default::default()
    };
    let mut tries = 0;
    loop {
        let report = broca_archive::pack(state_dir, &opts, &mut |_| {})?;
        let held = report
            .skipped
            .iter()
            .any(|(_, why)| matches!(why, broca_archive::Skip::LeaseHeld));
        if held && tries < 100 {
            tries += 1;
            std::thread::sleep(std::time::Duration::from_millis(10));
            continue;
        }
        return Ok(report);
    }
}
