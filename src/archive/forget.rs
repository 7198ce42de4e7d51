//! A session's archived copies taken out of every sealed container that holds one (a
//! session past its retention, docs/retention.md): each such container is written again
//! without it (sealed, durable) before the old one is removed, so a crash between the two
//! leaves the other sessions readable and the forgetting to be done again.

use std::fs::File;
use std::path::Path;

use broca_wal::archive as format;

use crate::{pack_lock, sync_dir, write_container, Error};

/// Takes the WAL at `wal_path` (`<state-dir>/wal/<address>.wal`) and its media out of every
/// sealed container; answers how many containers held it. Refused `Busy` while a pack runs
/// (the caller tries again later).
pub fn forget(wal_path: &Path) -> Result<usize, Error> {
    let wal_dir = wal_path.parent().unwrap_or(Path::new("."));
    let archive_dir = format::dir_of(wal_dir);
    if !archive_dir.exists() {
        return Ok(0);
    }
    let file = wal_path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let state_dir = wal_dir.parent().unwrap_or(Path::new("."));
    let holding = holding(&archive_dir, &file, None)?;
    if holding.is_empty() {
        return Ok(0);
    }
    let _lock = pack_lock(state_dir, &archive_dir)?;
    forget_in(&archive_dir, &file, &holding)?;
    Ok(holding.len())
}

/// The sealed containers holding the WAL named `file`, but `except`.
pub(crate) fn holding(
    archive_dir: &Path,
    file: &str,
    except: Option<&Path>,
) -> Result<Vec<std::sync::Arc<format::Container>>, Error> {
    Ok(format::containers(archive_dir)
        .map_err(|e| Error::io(archive_dir, "read", e))?
        .into_iter()
        .filter(|c| c.member(file).is_some() && Some(c.path.as_path()) != except)
        .collect())
}

/// Takes the WAL named `file` out of each of `holding` (the pack lock held).
pub(crate) fn forget_in(
    archive_dir: &Path,
    file: &str,
    holding: &[std::sync::Arc<format::Container>],
) -> Result<(), Error> {
    for c in holding {
        let src = File::open(&c.path).map_err(|e| Error::io(&c.path, "open", e))?;
        let others: Vec<_> = c
            .index
            .members
            .iter()
            .filter(|m| m.file != file)
            .cloned()
            .collect();
        if !others.is_empty() {
            let mut bytes = Vec::with_capacity(others.len());
            for m in &others {
                bytes.push(format::member_bytes(&src, &c.path, m).map_err(Error::Container)?);
            }
            let mut media = Vec::new();
            for m in c.index.media.iter().filter(|m| m.file != file) {
                let b = format::media_bytes(&src, &c.path, m).map_err(Error::Container)?;
                media.push((m.file.clone(), m.sha256.clone(), b));
            }
            let bytes_ref: Vec<&[u8]> = bytes.iter().map(Vec::as_slice).collect();
            let media_ref: Vec<(&str, &str, &[u8])> = media
                .iter()
                .map(|(f, s, b)| (f.as_str(), s.as_str(), b.as_slice()))
                .collect();
            // Its place among the containers kept: a copy of another session sealed later
            // elsewhere still wins over this one.
            let created = c.index.created_unix_ms;
            write_container(archive_dir, created, &others, &bytes_ref, &media_ref)?;
        }
        std::fs::remove_file(&c.path).map_err(|e| Error::io(&c.path, "remove", e))?;
    }
    sync_dir(archive_dir)?;
    Ok(())
}
