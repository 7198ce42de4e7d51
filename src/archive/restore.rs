//! A session's archived WAL restored where no live WAL is (docs/wal-archive.md, Restore).

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::time::{SystemTime, UNIX_EPOCH};

use broca_wal::archive::{self as format, Member};

use crate::{crash_point, media_dir, now_ms, sync_dir, Error, RESTORED};

/// What a restore did.
#[derive(Debug, PartialEq, Eq)]
pub enum Restored {
    /// The session has a live WAL: nothing to do.
    AlreadyLive,
    /// No sealed container holds it.
    NotArchived,
    /// Restored from this container.
    From(PathBuf),
}

/// Restores the archived WAL of `wal_path` where no live WAL is: the member's bytes (digest
/// checked) written to a temporary file, fsynced, linked in under the WAL's name (never over
/// a live WAL), the folder fsynced; the restore is recorded in `wal-archive/restored.jsonl`.
pub fn restore(wal_path: &Path) -> Result<Restored, Error> {
    if wal_path.exists() {
        return Ok(Restored::AlreadyLive);
    }
    let wal_dir = wal_path.parent().unwrap_or(Path::new("."));
    let archive_dir = format::dir_of(wal_dir);
    let file_name = wal_path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let Some((container, member)) =
        format::find(&archive_dir, &file_name).map_err(|e| Error::io(&archive_dir, "read", e))?
    else {
        return Ok(Restored::NotArchived);
    };
    let src = File::open(&container.path).map_err(|e| Error::io(&container.path, "open", e))?;
    let bytes = format::member_bytes(&src, &container.path, &member).map_err(Error::Container)?;
    // Its media first, each checked and synced with its folder: once the WAL is live again,
    // everything it references is in place.
    restore_media(wal_path, &container, &src)?;
    broca_owner_only::create_dir(wal_dir).map_err(|e| Error::io(wal_dir, "create", e))?;
    let tmp = wal_dir.join(format!(
        ".restore-{file_name}-{}-{}.tmp",
        std::process::id(),
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos())
    ));
    write_synced(&tmp, &bytes)?;
    crash_point("archive_restore_written");
    let linked = broca_io::fs::hard_link(&tmp, wal_path);
    let _ = std::fs::remove_file(&tmp);
    match linked {
        Ok(()) => {}
        // Restored meanwhile by another opener: the live WAL wins.
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            sync_dir(wal_dir)?;
            return Ok(Restored::AlreadyLive);
        }
        Err(e) => return Err(Error::io(wal_path, "link", e)),
    }
    crash_point("archive_restore_linked");
    sync_dir(wal_dir)?;
    RESTORED.fetch_add(1, Ordering::Relaxed);
    record_restore(&archive_dir, &member, &container.path);
    Ok(Restored::From(container.path.clone()))
}

/// Writes the media the container holds for the session of `wal_path` back into its content
/// store, those not there already; the folder synced once.
fn restore_media(wal_path: &Path, c: &format::Container, src: &File) -> Result<(), Error> {
    let file = wal_path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let dir = media_dir(wal_path);
    let mut wrote = false;
    for m in c.media_of(&file) {
        let target = dir.join(&m.sha256);
        if target.exists() {
            continue;
        }
        let bytes = format::media_bytes(src, &c.path, m).map_err(Error::Container)?;
        broca_owner_only::create_dir(&dir).map_err(|e| Error::io(&dir, "create", e))?;
        let tmp = dir.join(format!("{}.tmp", m.sha256));
        let _ = std::fs::remove_file(&tmp);
        write_synced(&tmp, &bytes)?;
        broca_io::fs::rename(&tmp, &target).map_err(|e| Error::io(&tmp, "rename", e))?;
        wrote = true;
    }
    if wrote {
        sync_dir(&dir)?;
    }
    Ok(())
}

/// Writes `bytes` to the new owner-only file `path` and syncs it.
fn write_synced(path: &Path, bytes: &[u8]) -> Result<(), Error> {
    let io = |op: &'static str, e: std::io::Error| Error::io(path, op, e);
    let mut f = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .map_err(|e| io("create", e))?;
    f.write_all(bytes).map_err(|e| io("write", e))?;
    f.sync_all().map_err(|e| io("fsync", e))
}

/// Appends the restore to `wal-archive/restored.jsonl` (what `archive list` shows). The WAL
/// itself is already durable: a failure here is only logged by the caller's reads.
fn record_restore(archive_dir: &Path, m: &Member, container: &Path) {
    let line = serde_json::json!({
        "file": m.file, "project_root": m.project_root, "harness": m.harness,
        "session": m.session, "blake3": m.blake3,
        "container": container.file_name().map(|n| n.to_string_lossy().into_owned()),
        "at_unix_ms": now_ms(),
    });
    let path = archive_dir.join("restored.jsonl");
    if let Ok(mut f) = OpenOptions::new()
        .append(true)
        .create(true)
        .mode(0o600)
        .open(&path)
    {
        let _ = writeln!(f, "{line}").and_then(|_| f.sync_data());
    }
}
