//! The Unix socket one `broca serve` owns: created only where nothing is, or where a stale
//! socket of a previous broca serve of this state dir was left; never an ordinary file, never
//! another live process's socket.

use broca_host::{Stage, StartError};
use std::os::unix::fs::FileTypeExt;
use std::path::Path;

/// How many times (100 ms apart) a socket that takes connections is tried again before it is
/// called a running process's.
const SOCKET_SETTLE_TRIES: u32 = 20;

/// Makes `socket` free for this daemon to bind. Nothing there: fine. A socket nobody listens
/// on, that this state dir's default socket or its last daemon's serve.json names: removed.
/// Anything else is refused, naming what is in the way.
pub(crate) fn claim_socket(socket: &Path, state_dir: &Path) -> Result<(), StartError> {
    // In a folder others may write, another user could rename the socket and bind their own
    // in its place, and read what clients send.
    let folder = match socket.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    broca_owner_only::check_dir(folder).map_err(|e| {
        front(format!(
            "cannot put the socket {} there: {e}; a socket in a folder others can write may be \
             replaced by another user's (choose a --socket in a folder of your own)",
            socket.display()
        ))
    })?;
    let meta = match std::fs::symlink_metadata(socket) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(front(format!("{}: {e}", socket.display()))),
        Ok(m) => m,
    };
    if !meta.file_type().is_socket() {
        return Err(front(format!(
            "{} exists and is not a socket; broca only replaces a stale socket of its own \
             (choose another --socket)",
            socket.display()
        )));
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
                return Err(front(format!(
                    "{} is the socket of a running process; stop it or choose another --socket",
                    socket.display()
                )))
            }
            Err(e) if e.raw_os_error() == Some(libc::ECONNREFUSED) => break,
            Err(e) => return Err(front(format!("{}: {e}", socket.display()))),
        }
    }
    let ours = socket == state_dir.join("broca.sock")
        || broca_host::previous_serve(state_dir)
            .and_then(|p| p.socket)
            .as_deref()
            == Some(socket);
    if !ours {
        return Err(front(format!(
            "{} is a stale socket that no broca serve of this state dir made; remove it \
             yourself or choose another --socket",
            socket.display()
        )));
    }
    std::fs::remove_file(socket).map_err(|e| front(format!("{}: {e}", socket.display())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_stale_socket_of_this_state_dir_is_replaced() {
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path();
        // An ordinary file is never removed.
        let notes = state.join("notes.txt");
        std::fs::write(&notes, "mine").unwrap();
        let e = claim_socket(&notes, state).unwrap_err();
        assert!(e.message.contains("not a socket"), "{e}");
        assert_eq!(std::fs::read_to_string(&notes).unwrap(), "mine");
        // A live socket is someone's: refused, left in place.
        let live = state.join("live.sock");
        let listener = std::os::unix::net::UnixListener::bind(&live).unwrap();
        let e = claim_socket(&live, state).unwrap_err();
        assert!(e.message.contains("running process"), "{e}");
        assert!(live.exists());
        drop(listener);
        // Now stale, but no serve of this state dir made it.
        let e = claim_socket(&live, state).unwrap_err();
        assert!(e.message.contains("stale socket"), "{e}");
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

/// A failure of the front's listeners.
pub(crate) fn front(why: String) -> StartError {
    StartError::new(Stage::Front, why)
}
