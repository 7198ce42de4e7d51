//! The per-session write-ahead log's format: file header, record framing, record kinds,
//! recovery, paged reads, and `wal verify|dump`, with plain reads only (the lease-holding
//! writer is broca-wal-writer, on broca-io's durable log). The byte format and the recovery case table
//! are in docs/wal-format.md.
//!
//! Where things are: the WAL's format with plain reads only: triple and address (a project root
//! absolute and in one spelling, no control characters in any part), the listing of `wal/`
//! every command uses (`listing.rs`: regular `*.wal` files only, the rest skipped with a
//! warning), header, framing, record kinds and the run records' payloads (`runrec.rs`; what a
//! run freezes at its start in `frozen.rs`; the session's own release, prune and upload records
//! in `sessionrec.rs`; a send's own records, queued, steered, withdrawn or ended, in
//! `sendrec.rs`; a frozen plan's in `planrec.rs`, a person-only command's in `cmdrec.rs`, a
//! mid-session change's in `changerec.rs`, a compaction provider's accepted view in
//! `viewrec.rs`), the recovery case table (`recovery.rs`), the paged reader, verify and dump,
//! sealed containers' format and lookup (docs/wal-format.md)

pub mod address;
pub mod archive;
pub mod changerec;
pub mod cmdrec;
pub mod frame;
pub mod frozen;
pub mod header;
pub mod importrec;
pub mod listing;
pub mod planrec;
pub mod reader;
pub mod record;
pub mod recovery;
pub mod runrec;
pub mod sendrec;
pub mod sessionrec;
pub mod verify;
pub mod viewrec;

use std::fmt;
use std::path::PathBuf;

pub use address::{normal_root, SessionAddr, SessionTriple, TripleError};
pub use header::{HeaderError, WalHeader};
pub use record::{DecodeError, Record};
pub use recovery::{scan, Corruption, FrameInfo, Scan, Verdict};

/// What went wrong with a WAL. Every variant names the file; corruption names the offset.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WalError {
    /// Reading, writing or syncing the file failed.
    Io {
        path: PathBuf,
        op: &'static str,
        message: String,
    },
    /// The header cannot be read: not a WAL, truncated, damaged, unsupported.
    Header { path: PathBuf, error: HeaderError },
    /// The records are damaged at `offset`; nothing at or after it is trusted.
    Corrupt {
        path: PathBuf,
        offset: u64,
        reason: String,
    },
    /// The WAL belongs to another session than the one asked for.
    WrongSession { path: PathBuf, found: SessionTriple },
    /// Another writer holds the lease on this WAL.
    LeaseHeld { path: PathBuf },
    /// This writer's lease was taken over; it may not write.
    LeaseStale { path: PathBuf },
    /// The process (or the system) has no file descriptor left to open the WAL with.
    OutOfDescriptors { path: PathBuf, op: &'static str },
    /// The log takes no more writes: an earlier write or fdatasync failed (`cause`), and
    /// nothing is retried. What is durable stays; reopening the WAL recovers it.
    Closed { path: PathBuf, cause: String },
    /// A record too large to frame.
    TooLarge { path: PathBuf, bytes: usize },
    /// The file system holding the WAL is full (no space left, or the quota spent): `op`
    /// failed. What was durable before stays; nothing after it was written.
    StorageFull { path: PathBuf, op: &'static str },
}

impl fmt::Display for WalError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WalError::Io { path, op, message } => {
                write!(f, "{}: {op} failed: {message}", path.display())
            }
            WalError::Header { path, error } => write!(f, "{}: {error}", path.display()),
            WalError::Corrupt {
                path,
                offset,
                reason,
            } => write!(
                f,
                "{}: corrupt at offset {offset}: {reason}; the file is left as it is (inspect \
                 it with `broca wal dump`)",
                path.display()
            ),
            WalError::WrongSession { path, found } => write!(
                f,
                "{}: this WAL belongs to session ({}, {}, {}), not the one asked for",
                path.display(),
                found.project_root,
                found.harness,
                found.session
            ),
            WalError::LeaseHeld { path } => write!(
                f,
                "{}: another writer holds this WAL's lease (another broca process or actor); \
                 stop it or send through it",
                path.display()
            ),
            WalError::LeaseStale { path } => write!(
                f,
                "{}: lease_stale: a newer writer took this WAL over; this writer may not write",
                path.display()
            ),
            WalError::OutOfDescriptors { path, op } => write!(
                f,
                "{}: {op} failed: out of file descriptors (raise the open-files limit, or \
                 lower open_sessions_max)",
                path.display()
            ),
            WalError::Closed { path, cause } => write!(
                f,
                "{}: the log is closed for writing after an earlier failure ({cause}); reopen \
                 it to recover from what is durable",
                path.display()
            ),
            WalError::StorageFull { path, op } => write!(
                f,
                "{}: {op} failed: the file system is full (no space left on the device, or the \
                 quota is spent); what was durable before is kept, and writes go on once space \
                 is freed",
                path.display()
            ),
            WalError::TooLarge { path, bytes } => {
                write!(
                    f,
                    "{}: a record of {bytes} bytes is over the frame limit",
                    path.display()
                )
            }
        }
    }
}

impl std::error::Error for WalError {}
