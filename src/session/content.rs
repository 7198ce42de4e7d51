//! A session's content store (llm-runner/v1 `attachments`): one owner-only folder per
//! session (`media/<address>/` beside the WAL folder) holding committed media under their
//! SHA-256 and the uploads still taking bytes as `<upload_id>.part`. Every call is plain file
//! I/O, run on the blocking pool (`Kind::Media`) by its callers. A commit checks the bytes
//! against what the begin declared, syncs them and renames them to their digest, and syncs
//! the folder, all before the WAL records the commit; a part left by a process that stopped
//! is removed when its session opens. Nothing is ever read from outside the folder: names
//! are an upload id broca minted or a digest checked as lowercase hex.

use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use cortexkit_role_llm_runner::content_digest::is_sha256_hex;

/// The largest upload (decoded bytes).
pub const UPLOAD_BYTES_MAX: u64 = 64 * 1024 * 1024;
/// The most a session's uploads may hold together (committed and open, as declared).
pub const SESSION_MEDIA_BYTES_MAX: u64 = 512 * 1024 * 1024;

/// Why a commit's bytes are refused (each leaves the upload open as it was).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CommitRefusal {
    Size,
    Sha256,
}

/// A session's content store.
#[derive(Debug, Clone)]
pub struct ContentStore {
    dir: PathBuf,
}

fn part_name(upload_id: &str) -> Option<String> {
    // broca mints ids of `[a-z0-9_]`; anything else names no part of this folder.
    (!upload_id.is_empty()
        && upload_id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_'))
    .then(|| format!("{upload_id}.part"))
}

impl ContentStore {
    pub fn new(dir: PathBuf) -> ContentStore {
        ContentStore { dir }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn part(&self, upload_id: &str) -> std::io::Result<PathBuf> {
        part_name(upload_id)
            .map(|n| self.dir.join(n))
            .ok_or_else(|| std::io::Error::other(format!("`{upload_id}` is not an upload id")))
    }

    /// Where the committed media of digest `sha256` is (`None`: not a digest).
    pub fn media_path(&self, sha256: &str) -> Option<PathBuf> {
        is_sha256_hex(sha256).then(|| self.dir.join(sha256))
    }

    /// An empty part for a new upload (the folder made owner-only first).
    pub fn begin(&self, upload_id: &str) -> std::io::Result<()> {
        broca_owner_only::create_dir(&self.dir)?;
        let path = self.part(upload_id)?;
        let _ = std::fs::remove_file(&path);
        broca_io::fs::create_new(&path, 0o600).map(drop)
    }

    /// How many bytes the open upload holds.
    pub fn received(&self, upload_id: &str) -> u64 {
        self.part(upload_id)
            .and_then(std::fs::metadata)
            .map_or(0, |m| m.len())
    }

    /// Writes `data` at `offset` of the upload's part (the caller checked the offset against
    /// what it holds); answers what it holds then.
    pub fn append(&self, upload_id: &str, offset: u64, data: &[u8]) -> std::io::Result<u64> {
        let path = self.part(upload_id)?;
        let mut f = std::fs::OpenOptions::new().write(true).open(&path)?;
        f.set_len(offset)?;
        f.seek(SeekFrom::Start(offset))?;
        f.write_all(data)?;
        Ok(offset + data.len() as u64)
    }

    /// Checks the upload's bytes against its declared size and digest; then syncs them, names
    /// them by their digest and syncs the folder. `Ok(Err)` leaves the part as it was.
    pub fn commit(
        &self,
        upload_id: &str,
        bytes: u64,
        sha256: &str,
    ) -> std::io::Result<Result<(), CommitRefusal>> {
        let path = self.part(upload_id)?;
        let Some(target) = self.media_path(sha256) else {
            return Ok(Err(CommitRefusal::Sha256));
        };
        let mut f = std::fs::File::open(&path)?;
        if f.metadata()?.len() != bytes {
            return Ok(Err(CommitRefusal::Size));
        }
        let mut data = Vec::with_capacity(usize::try_from(bytes).unwrap_or(0));
        f.read_to_end(&mut data)?;
        match cortexkit_role_llm_runner::attachments::verify_commit(bytes, sha256, &data) {
            Ok(()) => {}
            Err("upload_size_mismatch") => return Ok(Err(CommitRefusal::Size)),
            Err(_) => return Ok(Err(CommitRefusal::Sha256)),
        }
        f.sync_all()?;
        drop(f);
        broca_io::fs::rename(&path, &target)?;
        broca_io::fs::sync_dir(&self.dir)?;
        Ok(Ok(()))
    }

    /// Keeps `data` (a tool's image) under its SHA-256, synced with its folder before this
    /// answers; answers its digest.
    pub fn put(&self, data: &[u8]) -> std::io::Result<String> {
        let sha = cortexkit_role_llm_runner::content_digest::sha256_hex(data);
        let target = self.dir.join(&sha);
        if target.exists() {
            return Ok(sha);
        }
        broca_owner_only::create_dir(&self.dir)?;
        let tmp = self.dir.join(format!("{sha}.tmp"));
        let _ = std::fs::remove_file(&tmp);
        let mut f = broca_io::fs::create_new(&tmp, 0o600)?;
        f.write_all(data)?;
        f.sync_all()?;
        drop(f);
        broca_io::fs::rename(&tmp, &target)?;
        broca_io::fs::sync_dir(&self.dir)?;
        debug_assert!(
            self.media_path(&sha).is_some(),
            "a digest names a media file"
        );
        Ok(sha)
    }

    /// Bytes `offset..offset + length` of the media of digest `sha256` (short at its end), and
    /// its whole size.
    pub fn read(&self, sha256: &str, offset: u64, length: u64) -> std::io::Result<(Vec<u8>, u64)> {
        let path = self
            .media_path(sha256)
            .ok_or_else(|| std::io::Error::other("not a digest"))?;
        let mut f = std::fs::File::open(&path)?;
        let size = f.metadata()?.len();
        let end = offset.saturating_add(length).min(size);
        let mut data = vec![0; usize::try_from(end.saturating_sub(offset)).unwrap_or(0)];
        debug_assert!(
            data.len() as u64 <= length,
            "a read is never longer than asked"
        );
        if !data.is_empty() {
            f.seek(SeekFrom::Start(offset))?;
            f.read_exact(&mut data)?;
        }
        Ok((data, size))
    }

    /// The whole media of digest `sha256`, checked against its digest (a file changed on
    /// disk is an error naming it, never bytes sent as another's).
    pub fn load(&self, sha256: &str) -> std::io::Result<Vec<u8>> {
        let path = self
            .media_path(sha256)
            .ok_or_else(|| std::io::Error::other(format!("`{sha256}` is not a digest")))?;
        let data = std::fs::read(&path)
            .map_err(|e| std::io::Error::new(e.kind(), format!("{}: {e}", path.display())))?;
        if cortexkit_role_llm_runner::content_digest::sha256_hex(&data) != sha256 {
            return Err(std::io::Error::other(format!(
                "{}: its bytes no longer match their digest",
                path.display()
            )));
        }
        Ok(data)
    }

    /// Removes the parts of uploads that are not open (`open` says which are).
    pub fn sweep_parts(&self, open: impl Fn(&str) -> bool) {
        let Ok(entries) = std::fs::read_dir(&self.dir) else {
            return;
        };
        for e in entries.flatten() {
            let name = e.file_name();
            let Some(id) = name.to_str().and_then(|n| n.strip_suffix(".part")) else {
                continue;
            };
            if !open(id) {
                let _ = std::fs::remove_file(e.path());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cortexkit_role_llm_runner::content_digest::sha256_hex;

    #[test]
    fn an_upload_is_taken_checked_named_by_its_digest_and_read_back() {
        let dir = tempfile::tempdir().unwrap();
        let store = ContentStore::new(dir.path().join("m"));
        store.begin("upl_1").unwrap();
        assert_eq!(store.append("upl_1", 0, b"hello ").unwrap(), 6);
        assert_eq!(store.append("upl_1", 6, b"world").unwrap(), 11);
        assert_eq!(store.received("upl_1"), 11);
        let sha = sha256_hex(b"hello world");
        assert_eq!(
            store.commit("upl_1", 12, &sha).unwrap(),
            Err(CommitRefusal::Size)
        );
        assert_eq!(
            store.commit("upl_1", 11, &sha256_hex(b"other")).unwrap(),
            Err(CommitRefusal::Sha256)
        );
        assert_eq!(
            store.received("upl_1"),
            11,
            "a refused commit keeps the part"
        );
        assert_eq!(store.commit("upl_1", 11, &sha).unwrap(), Ok(()));
        assert_eq!(store.read(&sha, 6, 100).unwrap(), (b"world".to_vec(), 11));
        assert_eq!(store.read(&sha, 11, 1).unwrap(), (Vec::new(), 11));
        assert_eq!(store.load(&sha).unwrap(), b"hello world");
        std::fs::write(store.media_path(&sha).unwrap(), b"tampered").unwrap();
        assert!(store.load(&sha).unwrap_err().to_string().contains("digest"));
        assert!(store.begin("../x").is_err(), "a name outside the folder");
        assert!(store.media_path("../etc/passwd").is_none());
    }
}
