//! `broca wal verify`'s check of a session's content store: every medium its WAL references
//! (a send's attachments, a tool's images, a committed upload) is in `media/<address>/` beside
//! the WAL folder, its bytes of the size and SHA-256 the records state. The WAL is read page
//! by page (`broca_wal::verify::referenced_media`), as verify reads it.

use std::path::Path;

/// The media `wal` references, checked: how many, or the first that is missing or damaged.
pub(super) fn check(wal: &Path) -> Result<usize, String> {
    let media = broca_wal::verify::referenced_media(wal).map_err(|e| e.to_string())?;
    if media.is_empty() {
        return Ok(0);
    }
    // `<state>/wal/<address>.wal` keeps its media in `<state>/media/<address>/`.
    let (Some(stem), Some(wal_dir)) = (wal.file_stem(), wal.parent()) else {
        return Ok(0);
    };
    let dir = wal_dir
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."))
        .join("media")
        .join(stem);
    for m in &media {
        let path = dir.join(&m.sha256);
        let bytes = std::fs::read(&path).map_err(|e| {
            format!(
                "{}: a {} its records reference: {e}",
                path.display(),
                m.mime
            )
        })?;
        if bytes.len() as u64 != m.bytes
            || cortexkit_role_llm_runner::content_digest::sha256_hex(&bytes) != m.sha256
        {
            return Err(format!(
                "{}: its bytes no longer match the size and SHA-256 its records state",
                path.display()
            ));
        }
    }
    Ok(media.len())
}
