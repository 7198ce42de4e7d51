//! The store's rows (what a session's projection holds) and its errors.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use broca_core::usage::SpendFact;
use broca_protocol::{Message, Usage};

/// What a session's projection is bound to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Mark {
    pub lineage_id: String,
    /// The last seq applied (0: the log has no records).
    pub last_seq: u64,
    /// Messages in the materialized transcript.
    pub messages: u64,
    /// Sends queued behind a run and not started yet (a session serve starts at boot).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub queued: u64,
    /// The session, as its WAL's header names it.
    pub project_root: String,
    pub harness: String,
    pub session: String,
    /// When its WAL was made (Unix ms).
    pub created_unix_ms: u64,
    /// Runs started in it.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub runs: u64,
    /// Its latest run, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_run: Option<LastRun>,
}

/// A session's latest run, as its mark keeps it (`sessions.list`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LastRun {
    pub run_id: String,
    pub state: String,
    pub model: String,
    pub started_unix_ms: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ended_unix_ms: Option<u64>,
}

impl Mark {
    /// When the session was last active: its latest run's end or start, else its WAL's
    /// making.
    pub fn active_unix_ms(&self) -> u64 {
        self.last_run
            .as_ref()
            .map(|r| r.ended_unix_ms.unwrap_or(r.started_unix_ms))
            .unwrap_or(self.created_unix_ms)
    }
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// A run as the index holds it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunRow {
    pub run_id: String,
    pub session: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub send_id: Option<String>,
    pub state: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
    pub provider: String,
    pub model: String,
    pub credential_id: String,
    pub steps: u32,
    /// Each measure summed over the metered steps that reported it (absent until one did).
    pub usage: Usage,
    /// Metered steps that reported no measure at all (the totals are lower bounds then).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub unreported_steps: u64,
    pub started_unix_ms: u64,
    /// When the run ended or paused; absent while it runs (or for logs written before the
    /// time was recorded).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ended_unix_ms: Option<u64>,
    pub started_seq: u64,
}

/// An admission checkpoint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Checkpoint {
    pub run_id: String,
    pub inputs_digest: String,
}

/// One session's projections, computed from its WAL.
#[derive(Debug, Clone, PartialEq)]
pub struct Projection {
    pub addr: [u8; 16],
    pub mark: Mark,
    pub runs: Vec<RunRow>,
    pub admission: Vec<(String, Checkpoint)>,
    pub facts: Vec<SpendFact>,
    pub transcript: Vec<std::sync::Arc<Message>>,
}

/// What a pass over the WALs did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Pass {
    pub sessions: u64,
    /// Sessions projected again (behind, another lineage, or new).
    pub projected: u64,
    pub facts: u64,
    /// WAL bytes read.
    pub wal_bytes: u64,
    /// WALs that could not be projected, each with why.
    pub failed: Vec<String>,
}

/// Why the store could not do what was asked. The WALs are authoritative: a caller that
/// meets one of these serves from the WALs, and the store is rebuilt from them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreError {
    /// LMDB failed an operation (`read`, `write`, `commit`, `clear`, `open`, ...).
    Lmdb { op: &'static str, message: String },
    /// A file or folder of the store, or of the state dir, could not be used.
    Io { path: PathBuf, message: String },
    /// A WAL could not be read (the error names the file).
    Wal(broca_wal::WalError),
    /// A WAL's records do not project (the WAL named once known).
    Project {
        path: Option<PathBuf>,
        reason: String,
    },
    /// A value the store holds does not decode (`what` names the table).
    Decode { what: &'static str, message: String },
    /// The store is unusable and could not be moved aside.
    Stuck {
        dir: PathBuf,
        why: String,
        message: String,
    },
    /// A read-only open found a store it cannot compare with the WALs (missing, damaged, of
    /// another state dir or format); only `broca store rebuild` changes that.
    Incomparable { dir: PathBuf, why: String },
}

impl std::fmt::Display for StoreError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StoreError::Lmdb { op, message } => write!(f, "store: {op}: {message}"),
            StoreError::Io { path, message } => write!(f, "{}: {message}", path.display()),
            StoreError::Wal(e) => write!(f, "{e}"),
            StoreError::Project {
                path: Some(path),
                reason,
            } => write!(f, "{}: {reason}", path.display()),
            StoreError::Project { path: None, reason } => f.write_str(reason),
            StoreError::Decode { what, message } => write!(f, "store: {what}: {message}"),
            StoreError::Stuck { dir, why, message } => write!(
                f,
                "store {} is unusable ({why}) and cannot be moved aside: {message}",
                dir.display()
            ),
            StoreError::Incomparable { dir, why } => write!(
                f,
                "the store {} cannot be compared with the WALs: {why}; `broca store rebuild` \
                 rebuilds it from them",
                dir.display()
            ),
        }
    }
}

impl std::error::Error for StoreError {}

impl From<StoreError> for String {
    fn from(e: StoreError) -> String {
        e.to_string()
    }
}

impl From<broca_wal::WalError> for StoreError {
    fn from(e: broca_wal::WalError) -> StoreError {
        StoreError::Wal(e)
    }
}
