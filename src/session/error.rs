//! Why a session actor's operation failed, and the management error each failure is.

use broca_core::admission::Refusal;
use broca_read::ReadError;
use broca_wal::WalError;

/// Why an actor operation failed.
#[derive(Debug)]
pub enum ActorError {
    /// The WAL failed (its error names the file).
    Wal(WalError),
    /// The WAL's records do not replay (names the file and the seq).
    Replay(ReadError),
    /// The send was refused; nothing was written.
    Refused(Refusal),
    /// A crash was injected here (tests only): after the append of `seq`.
    Crashed { seq: u64 },
    /// The run loop stopped without an event to wait for (a bug; the run stays open and is
    /// resumed on the next open).
    Stalled { run_id: String },
    /// An import was refused; nothing was written.
    Import(broca_import::ImportError),
}

impl std::fmt::Display for ActorError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ActorError::Wal(e) => write!(f, "{e}"),
            ActorError::Replay(e) => write!(f, "{e}"),
            ActorError::Refused(r) => write!(f, "{r}"),
            ActorError::Crashed { seq } => write!(f, "crash injected after record {seq}"),
            ActorError::Stalled { run_id } => write!(f, "run {run_id}: the run loop stalled"),
            ActorError::Import(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for ActorError {}

impl ActorError {
    /// The management error for this failure: a refusal keeps its code; anything else is
    /// an internal error naming what failed.
    pub fn to_rpc_error(&self) -> broca_wire::RpcError {
        match self {
            ActorError::Refused(r) => broca_wire::RpcError::refusal(r),
            ActorError::Import(e) => broca_wire::RpcError::new(e.code, e.to_string()),
            ActorError::Wal(e @ WalError::StorageFull { .. }) => {
                broca_wire::RpcError::new(broca_wire::Code::StorageFull, e.to_string())
            }
            other => broca_wire::RpcError::new(broca_wire::Code::Internal, other.to_string()),
        }
    }
}

impl From<WalError> for ActorError {
    fn from(e: WalError) -> ActorError {
        ActorError::Wal(e)
    }
}
