//! What the daemon does in the background once it runs: the runs a crash left open found and
//! handed to their shards (at most a few resumed at a time per shard), and the opt-in archive
//! scheduler packing idle sessions, each on a thread of its own (never on a shard).

use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use broca_wal::SessionTriple;

use crate::{Host, ShardMsg};

/// How often the archive thread looks whether the daemon stops, while it waits.
const ARCHIVE_STOP_POLL: Duration = Duration::from_millis(200);

/// The WALs the sessions' policies have the archive pack, and how idle each must be: each
/// shard's own, asked of it (a stopped shard has none to give).
fn archived_by_policy(ctx: &Host) -> std::collections::HashMap<String, Duration> {
    let mut all = std::collections::HashMap::new();
    for shard in 0..ctx.shards() {
        let (reply, wait) = futures_channel::oneshot::channel();
        if ctx
            .mesh
            .send_blocking(shard, ShardMsg::Archived(reply))
            .is_ok()
        {
            if let Ok(part) = futures_lite::future::block_on(wait) {
                all.extend(part);
            }
        }
    }
    all
}

/// Packs the sessions idle for `archive_after` every `archive_every`, on a thread of its own
/// (never on a shard): a session whose actor is open holds its WAL's lease and is left live; a
/// send to a packed session restores its WAL first. A session whose storage policy names
/// `archive_after_days` is packed once idle that long, whether or not `archive_after` is
/// set: the thread then starts with the first such session (`Host::archive_sooner`).
pub(crate) fn start_archive_scheduler(
    ctx: &Arc<Host>,
    by_policy: bool,
) -> Result<(), crate::StartError> {
    if ctx.opts.archive_after.is_none() && !by_policy {
        return Ok(());
    }
    if ctx.archiving.swap(true, Ordering::AcqRel) {
        return Ok(());
    }
    let idle = ctx.opts.archive_after.unwrap_or(Duration::MAX);
    let ctx = ctx.clone();
    let every = ctx.opts.archive_every.max(Duration::from_secs(1));
    std::thread::Builder::new()
        .name("archive".into())
        .spawn(move || loop {
            let until = std::time::Instant::now() + every;
            while std::time::Instant::now() < until {
                if ctx.stopping.load(Ordering::Acquire) {
                    return;
                }
                std::thread::sleep(ARCHIVE_STOP_POLL.min(every));
            }
            let opts = broca_archive::PackOptions {
                idle,
                sooner: archived_by_policy(&ctx),
                rewrite: crate::prune::rewrite(&ctx),
                ..Default::default()
            };
            let started = std::time::Instant::now();
            let packed = broca_archive::pack(&ctx.opts.state_dir, &opts, &mut |_| {});
            if let Ok(r) = &packed {
                ctx.rewritten(&r.rewritten);
                for (file, why) in &r.not_rewritten {
                    tracing::warn!("archive: the reasoning of {file} is kept: {why}");
                }
            }
            match packed {
                Ok(r) if !r.packed.is_empty() => tracing::info!(
                    pruned = r.rewritten.len(),
                    sessions = r.packed.len(),
                    bytes = r.bytes,
                    containers = r.containers.len(),
                    ms = started.elapsed().as_millis() as u64,
                    "packed idle sessions"
                ),
                Ok(_) => {}
                Err(e) => tracing::warn!("archive pack: {e}"),
            }
        })
        .map(|_| ())
        .map_err(|e| {
            let why = format!("cannot start the archive thread: {e}");
            crate::StartError::new(crate::Stage::Shards, why)
        })
}

/// Finds the runs a crash left open and has their shards resume them, in the background:
/// from the store's run index once the store has caught up with the WALs, or, without a
/// store, from the WALs themselves. Admission is open meanwhile; a read of a run being
/// resumed answers at once from the WAL (`active`).
pub(crate) fn resume_open_runs(
    ctx: Arc<Host>,
    caught_up: Option<std::sync::mpsc::Receiver<()>>,
) -> Result<(), crate::StartError> {
    std::thread::Builder::new()
        .name("resume".into())
        .spawn(move || {
            let sessions = match (&ctx.store, caught_up) {
                (Some(store), Some(caught_up)) => {
                    let _ = caught_up.recv();
                    match store.sessions_with_open_runs() {
                        Ok(addrs) => addrs
                            .iter()
                            .filter_map(|a| {
                                crate::state::session_of(&ctx.wal_dir.join(wal_name(a)))
                            })
                            .collect(),
                        Err(e) => {
                            tracing::error!("{e}; looking for open runs in the WALs instead");
                            open_runs_in_wals(&ctx.wal_dir)
                        }
                    }
                }
                _ => open_runs_in_wals(&ctx.wal_dir),
            };
            if !sessions.is_empty() {
                tracing::warn!(runs = sessions.len(), "resuming the runs a crash left open");
            }
            for triple in sessions {
                let shard = ctx.shard_of(&triple);
                if ctx
                    .mesh
                    .send_blocking(shard, ShardMsg::Resume { triple })
                    .is_err()
                {
                    return; // the shards stopped
                }
            }
        })
        .map(|_| ())
        .map_err(|e| {
            let why = format!("cannot start the resume thread: {e}");
            crate::StartError::new(crate::Stage::Shards, why)
        })
}

fn wal_name(addr: &[u8; 16]) -> String {
    broca_wal::SessionAddr(*addr).wal_file_name()
}

/// The sessions whose WAL ends with a run open (every WAL read: without a store only).
fn open_runs_in_wals(wal_dir: &Path) -> Vec<SessionTriple> {
    let Ok(files) = broca_store::wal_files(wal_dir) else {
        return Vec::new();
    };
    files
        .iter()
        .filter_map(|path| {
            let read = match broca_read::read_session(path, broca_read::Keep::State) {
                Ok(read) => read?,
                Err(e) => {
                    tracing::error!("looking for an open run: {e}");
                    return None;
                }
            };
            let s = &read.session;
            (s.open.is_some() || !s.queued.is_empty()).then_some(read.triple)
        })
        .collect()
}
