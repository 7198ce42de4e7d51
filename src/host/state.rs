//! What one daemon owns and no other process may take: its state dir (created 0700, refused if
//! others can write it, and an exclusive lock on `<state-dir>/serve.lock` held for the
//! daemon's life), its `wal/` folder and its bearer handle (`serve.handle`, owner-only).

use crate::error::{Stage, StartError};
use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

/// The held lock on a state dir; dropping it releases the state dir.
#[derive(Debug)]
pub(crate) struct StateLock {
    _file: File,
}

/// Takes the state dir for this process, or says which daemon has it.
pub(crate) fn lock_state_dir(dir: &Path) -> Result<StateLock, StartError> {
    let failed = |why: String| StartError::new(Stage::StateDir, why);
    let path = dir.join("serve.lock");
    let file = {
        use std::os::unix::fs::OpenOptionsExt;
        std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(&path)
            .map_err(|e| failed(format!("cannot open {}: {e}", path.display())))?
    };
    match broca_io::fs::try_flock(file.as_raw_fd()) {
        Ok(true) => Ok(StateLock { _file: file }),
        Ok(false) => {
            let owner = previous_serve(dir)
                .map(|p| format!(" (pid {}, listening on {})", p.pid, p.listen))
                .unwrap_or_default();
            Err(failed(format!(
                "another broca serve{owner} owns the state dir {}; stop it, or give this one \
                 another --state-dir",
                dir.display()
            )))
        }
        Err(e) => Err(failed(format!("cannot lock {}: {e}", path.display()))),
    }
}

/// What serve.json says about the daemon that wrote it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PreviousServe {
    pub pid: u64,
    pub listen: String,
    pub socket: Option<PathBuf>,
}

/// serve.json as a previous (or the running) daemon of `dir` left it.
pub fn previous_serve(dir: &Path) -> Option<PreviousServe> {
    let bytes = std::fs::read(serve_json(dir)).ok()?;
    let v: serde_json::Value = serde_json::from_slice(&bytes).ok()?;
    Some(PreviousServe {
        pid: v.get("pid")?.as_u64()?,
        listen: v.get("listen")?.as_str()?.to_string(),
        socket: v.get("socket").and_then(|s| s.as_str()).map(PathBuf::from),
    })
}

/// The path of serve.json in `state_dir`.
pub fn serve_json(state_dir: &Path) -> PathBuf {
    state_dir.join("serve.json")
}

/// The bearer handle's bytes of randomness (64 hex digits).
const HANDLE_BYTES: usize = 32;

/// What the daemon prepared in its state dir.
pub(crate) struct PreparedState {
    /// Held for the daemon's life: no other daemon uses this state dir meanwhile.
    pub(crate) lock: StateLock,
    pub(crate) wal_dir: PathBuf,
    pub(crate) handle: String,
    pub(crate) handle_file: PathBuf,
}

/// Creates (0700) or checks the state dir and its `wal/` folder, takes the state dir's lock
/// (refused while another daemon holds it), and makes the handle file.
pub(crate) fn prepare_state(dir: &Path) -> Result<PreparedState, StartError> {
    let failed = |why: String| StartError::new(Stage::StateDir, why);
    broca_owner_only::create_dir(dir)
        .map_err(|e| failed(format!("cannot create {}: {e}", dir.display())))?;
    broca_owner_only::check_dir(dir).map_err(StartError::at(Stage::StateDir))?;
    let lock = lock_state_dir(dir)?;
    let wal_dir = dir.join("wal");
    broca_owner_only::create_dir(&wal_dir)
        .map_err(|e| failed(format!("cannot create {}: {e}", wal_dir.display())))?;
    broca_owner_only::check_dir(&wal_dir).map_err(StartError::at(Stage::StateDir))?;
    let mut raw = [0u8; HANDLE_BYTES];
    random_bytes(&mut raw).map_err(|e| failed(format!("/dev/urandom: {e}")))?;
    let handle: String = raw.iter().map(|b| format!("{b:02x}")).collect();
    assert_eq!(handle.len(), 2 * HANDLE_BYTES);
    let handle_file = dir.join("serve.handle");
    broca_owner_only::write_file(&handle_file, handle.as_bytes())
        .map_err(|e| failed(format!("cannot write {}: {e}", handle_file.display())))?;
    Ok(PreparedState {
        lock,
        wal_dir,
        handle,
        handle_file,
    })
}

/// `bytes` random bytes from the kernel, as lower-case hex.
pub fn random_hex(bytes: usize) -> std::io::Result<String> {
    let mut raw = vec![0u8; bytes];
    random_bytes(&mut raw)?;
    let hex: String = raw.iter().map(|b| format!("{b:02x}")).collect();
    debug_assert_eq!(hex.len(), 2 * bytes, "two hex digits a byte");
    Ok(hex)
}

/// Fills `buf` from the kernel's randomness (`/dev/urandom`).
fn random_bytes(buf: &mut [u8]) -> std::io::Result<()> {
    let mut f = std::fs::File::open("/dev/urandom")?;
    std::io::Read::read_exact(&mut f, buf)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_lock_on_a_state_dir_is_refused_until_the_first_is_dropped() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("serve.json"),
            r#"{"pid": 4242, "listen": "127.0.0.1:9", "socket": "/x", "handle_file": "/y"}"#,
        )
        .unwrap();
        let first = lock_state_dir(dir.path()).unwrap();
        let e = lock_state_dir(dir.path()).unwrap_err();
        assert_eq!(e.stage, crate::Stage::StateDir);
        assert!(e.message.contains("pid 4242"), "{e}");
        drop(first);
        lock_state_dir(dir.path()).unwrap();
    }
}

/// The session a WAL (live or packed) belongs to, from its header.
pub(crate) fn session_of(path: &Path) -> Option<broca_wal::SessionTriple> {
    broca_wal::reader::PagedReader::open_if_any(path)
        .ok()
        .flatten()
        .map(|r| r.header().triple.clone())
}
