//! What one `broca serve` owns and no other process may take: its state dir (an exclusive
//! lock on `<state-dir>/serve.lock`, held for the daemon's life) and its Unix socket (created
//! only where nothing is, or where a stale socket of a previous broca serve of this state dir
//! was left; never an ordinary file, never another live process's socket).

use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};

/// The held lock on a state dir; dropping it releases the state dir.
#[derive(Debug)]
pub(crate) struct StateLock {
    _file: File,
}

/// Takes the state dir for this process, or says which daemon has it.
pub(crate) fn lock_state_dir(dir: &Path) -> Result<StateLock, String> {
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
            .map_err(|e| format!("cannot open {}: {e}", path.display()))?
    };
    match broca_io::fs::try_flock(file.as_raw_fd()) {
        Ok(true) => Ok(StateLock { _file: file }),
        Ok(false) => {
            let owner = previous_serve(dir)
                .map(|p| format!(" (pid {}, listening on {})", p.pid, p.listen))
                .unwrap_or_default();
            Err(format!(
                "another broca serve{owner} owns the state dir {}; stop it, or give this one \
                 another --state-dir",
                dir.display()
            ))
        }
        Err(e) => Err(format!("cannot lock {}: {e}", path.display())),
    }
}

/// What serve.json says about the daemon that wrote it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PreviousServe {
    pub pid: u64,
    pub listen: String,
    pub socket: Option<PathBuf>,
}

/// serve.json as a previous (or the running) daemon of `dir` left it.
pub(crate) fn previous_serve(dir: &Path) -> Option<PreviousServe> {
    let bytes = std::fs::read(super::serve_json(dir)).ok()?;
    let v: serde_json::Value = serde_json::from_slice(&bytes).ok()?;
    Some(PreviousServe {
        pid: v.get("pid")?.as_u64()?,
        listen: v.get("listen")?.as_str()?.to_string(),
        socket: v.get("socket").and_then(|s| s.as_str()).map(PathBuf::from),
    })
}

/// How many times (100 ms apart) a socket that takes connections is tried again before it is
/// called a running process's.
const SOCKET_SETTLE_TRIES: u32 = 20;

/// Makes `socket` free for this daemon to bind. Nothing there: fine. A socket nobody listens
/// on, that this state dir's default socket or its last daemon's serve.json names: removed.
/// Anything else is refused, naming what is in the way.
pub(crate) fn claim_socket(socket: &Path, state_dir: &Path) -> Result<(), String> {
    let meta = match std::fs::symlink_metadata(socket) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(format!("{}: {e}", socket.display())),
        Ok(m) => m,
    };
    if !meta.file_type().is_socket() {
        return Err(format!(
            "{} exists and is not a socket; broca only replaces a stale socket of its own \
             (choose another --socket)",
            socket.display()
        ));
    }
    // A daemon killed a moment ago may still hold its socket: the kernel tears its io_uring
    // down after the process is gone, and a pending accept keeps the listener open until then.
    // A socket that still takes connections after a while belongs to a running process.
    let mut tries = 0;
    loop {
        match std::os::unix::net::UnixStream::connect(socket) {
            Ok(_) if tries < SOCKET_SETTLE_TRIES => {
                tries += 1;
                std::thread::sleep(std::time::Duration::from_millis(100));
            }
            Ok(_) => {
                return Err(format!(
                    "{} is the socket of a running process; stop it or choose another --socket",
                    socket.display()
                ))
            }
            Err(e) if e.raw_os_error() == Some(libc::ECONNREFUSED) => break,
            Err(e) => return Err(format!("{}: {e}", socket.display())),
        }
    }
    let ours = socket == state_dir.join("broca.sock")
        || previous_serve(state_dir).and_then(|p| p.socket).as_deref() == Some(socket);
    if !ours {
        return Err(format!(
            "{} is a stale socket that no broca serve of this state dir made; remove it \
             yourself or choose another --socket",
            socket.display()
        ));
    }
    std::fs::remove_file(socket).map_err(|e| format!("{}: {e}", socket.display()))
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
        assert!(e.contains("pid 4242"), "{e}");
        drop(first);
        lock_state_dir(dir.path()).unwrap();
    }

    #[test]
    fn only_a_stale_socket_of_this_state_dir_is_replaced() {
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path();
        // An ordinary file is never removed.
        let notes = state.join("notes.txt");
        std::fs::write(&notes, "mine").unwrap();
        let e = claim_socket(&notes, state).unwrap_err();
        assert!(e.contains("not a socket"), "{e}");
        assert_eq!(std::fs::read_to_string(&notes).unwrap(), "mine");
        // A live socket is someone's: refused, left in place.
        let live = state.join("live.sock");
        let listener = std::os::unix::net::UnixListener::bind(&live).unwrap();
        let e = claim_socket(&live, state).unwrap_err();
        assert!(e.contains("running process"), "{e}");
        assert!(live.exists());
        drop(listener);
        // Now stale, but no serve of this state dir made it.
        let e = claim_socket(&live, state).unwrap_err();
        assert!(e.contains("stale socket"), "{e}");
        // The default socket, stale: replaced.
        let default = state.join("broca.sock");
        drop(std::os::unix::net::UnixListener::bind(&default).unwrap());
        claim_socket(&default, state).unwrap();
        assert!(!default.exists());
        // One the last serve.json names: replaced.
        std::fs::write(
            state.join("serve.json"),
            serde_json::json!({"pid": 1, "listen": "x", "socket": live}).to_string(),
        )
        .unwrap();
        claim_socket(&live, state).unwrap();
        assert!(!live.exists());
        claim_socket(&live, state).unwrap(); // nothing there
    }
}
