//! A session read from its WAL as a reader: the one read-then-replay of the workspace. No
//! lease is taken and nothing is written; the file (or, for a session without a live WAL, its
//! newest sealed copy) is read with broca-wal's plain reads, so callers on an executor run
//! this on their blocking pool. Every caller gets the same errors: the file's, naming it, or
//! the record that does not replay, naming the file and its seq.

use std::fmt;
use std::path::{Path, PathBuf};

use broca_wal::WalError;

use super::replay::{ReplayError, Session};

/// A session as its WAL holds it now.
#[derive(Debug, Clone)]
pub struct ReadSession {
    /// The session replayed.
    pub session: Session,
    /// Whose WAL it is (its header's triple).
    pub triple: broca_wal::SessionTriple,
    /// The WAL's lineage, in hex (the role's `incarnation`).
    pub lineage: String,
    /// The seq of its last record (`None`: the WAL holds its header only).
    pub last_seq: Option<u64>,
}

/// What to keep while replaying.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Keep {
    /// The session's state only.
    State,
    /// The role's entries too (`session.read`, `session.head`).
    Entries,
}

/// Why a session could not be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReadError {
    /// The file could not be read, or is damaged (the error names it).
    Wal(WalError),
    /// A record does not replay where it stands.
    Replay { path: PathBuf, error: ReplayError },
}

impl fmt::Display for ReadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ReadError::Wal(e) => write!(f, "{e}"),
            ReadError::Replay { path, error } => {
                write!(f, "{}: the log does not replay ({error})", path.display())
            }
        }
    }
}

impl std::error::Error for ReadError {}

impl From<WalError> for ReadError {
    fn from(e: WalError) -> ReadError {
        ReadError::Wal(e)
    }
}

/// Reads and replays the session of the WAL at `path`; `None` when no WAL (live or
/// archived) holds one yet.
pub fn read_session(path: &Path, keep: Keep) -> Result<Option<ReadSession>, ReadError> {
    let Some((bytes, scan)) = broca_wal::verify::read_and_scan_if_any(path)? else {
        return Ok(None);
    };
    let start = match keep {
        Keep::State => Session::default(),
        Keep::Entries => Session::with_entries(),
    };
    let session = start
        .replay_scan_into(&scan, &bytes)
        .map_err(|error| ReadError::Replay {
            path: path.to_path_buf(),
            error,
        })?;
    Ok(Some(ReadSession {
        session,
        triple: scan.header.triple.clone(),
        lineage: scan.header.lineage_hex(),
        last_seq: scan.frames.last().map(|f| f.seq),
    }))
}
