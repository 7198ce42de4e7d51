//! `broca wal verify`'s check of a session's content store: every medium its WAL references
//! (a send's attachments, a tool's images, a committed upload) is in `media/<address>/` beside
//! the WAL folder, its bytes of the size and SHA-256 the records state.

use std::collections::BTreeMap;
use std::path::Path;

use broca_protocol::media::Media;

/// The media `wal` references, checked: how many, or the first that is missing or damaged.
pub(super) fn check(wal: &Path) -> Result<usize, String> {
    let Some(read) =
        broca_core::read_session(wal, broca_core::Keep::State).map_err(|e| e.to_string())?
    else {
        return Ok(0);
    };
    let s = &read.session;
    let mut media: BTreeMap<String, Media> = BTreeMap::new();
    for m in s.transcript.iter().flat_map(|m| m.content.iter()) {
        if let broca_protocol::Block::Media(x) = m {
            media.insert(x.sha256.clone(), x.clone());
        }
    }
    for u in s.uploads.values().filter(|u| u.committed_at.is_some()) {
        media.insert(u.begun.sha256.clone(), u.media());
    }
    if media.is_empty() {
        return Ok(0);
    }
    let dir = read
        .triple
        .address()
        .media_dir(wal.parent().unwrap_or(Path::new(".")));
    for (sha, m) in &media {
        let path = dir.join(sha);
        let bytes = std::fs::read(&path)
            .map_err(|e| format!("{}: a {} it references: {e}", path.display(), m.mime))?;
        if bytes.len() as u64 != m.bytes
            || cortexkit_role_llm_runner::content_digest::sha256_hex(&bytes) != *sha
        {
            return Err(format!(
                "{}: its bytes no longer match the size and SHA-256 its records state",
                path.display()
            ));
        }
    }
    Ok(media.len())
}
