//! A session read from its WAL as a reader: the one read-then-replay of the workspace. No
//! lease is taken and nothing is written; the file (or, for a session without a live WAL, its
//! newest sealed copy) is read with broca-wal's plain reads, so callers on an executor run
//! this on their blocking pool. Every caller gets the same errors: the file's, naming it, or
//! the record that does not replay, naming the file and its seq.

use std::fmt;
use std::path::{Path, PathBuf};

use broca_wal::WalError;

use broca_core::replay::{ReplayError, Session};

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
    /// Its transcript numbered in the compaction contract's part model, kept while the
    /// readers' cache keeps the session and numbered again only from its last assistant entry
    /// on ([`ReadSession::numbered`]).
    pub numbered: std::sync::Arc<std::sync::Mutex<broca_ck::neutral::Numbered>>,
}

impl ReadSession {
    /// `f` over the session's numbered transcript (cortexkit-role-compaction W4), brought up
    /// to date with what was appended since the last use; empty for a session read without
    /// its entries.
    pub fn numbered<R>(&self, f: impl FnOnce(&[cortexkit_role_compaction::read::Entry]) -> R) -> R {
        let Some(entries) = &self.session.entries else {
            return f(&[]);
        };
        let mut kept = self
            .numbered
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        f(kept.refresh(entries))
    }
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
        numbered: Default::default(),
    }))
}

/// Payload bytes decoded at once while catching a cached session up.
const CATCH_UP_PAGE_BYTES: usize = 256 * 1024;

/// Sessions read lately, kept replayed with their entries so that the next read of one
/// applies only the records appended since (from the last record applied, which the reader
/// checks is still there: its seq, lineage and checksum at its offset; a WAL made anew, cut
/// or replaced since is read whole). What a read answers is a function of the WAL alone, as
/// if it were read whole: the cache only saves the reading. Up to `sessions_max` sessions are
/// kept, the least lately read dropped first. Meant for the blocking pool: it reads files.
pub struct ReadCache {
    sessions_max: usize,
    slots: std::sync::Mutex<Slots>,
}

#[derive(Default)]
struct Slots {
    clock: u64,
    map:
        std::collections::HashMap<PathBuf, (u64, std::sync::Arc<std::sync::Mutex<Option<Cached>>>)>,
}

/// A session as far as its WAL has been read.
struct Cached {
    read: ReadSession,
    /// The last record applied: its seq and offset.
    last: (u64, u64),
}

/// How catching a cached session up went.
enum CatchUp {
    Done,
    /// The seek point no longer holds: read it whole.
    Whole,
}

impl ReadCache {
    pub fn new(sessions_max: usize) -> ReadCache {
        ReadCache {
            sessions_max,
            slots: Default::default(),
        }
    }

    /// Calls `f` with the session of the WAL at `path` as it is now (replayed with its
    /// entries), or `None` when no WAL holds one yet.
    pub fn with<R>(
        &self,
        path: &Path,
        f: impl FnOnce(Option<&ReadSession>) -> R,
    ) -> Result<R, ReadError> {
        let slot = self.slot(path);
        let mut held = slot.lock().unwrap_or_else(|p| p.into_inner());
        let current = match held.as_mut() {
            Some(c) => matches!(catch_up(path, c), CatchUp::Done),
            None => false,
        };
        if !current {
            *held = None;
            *held = read_whole(path)?;
        }
        if held.is_none() {
            self.forget(path);
        }
        Ok(f(held.as_ref().map(|c| &c.read)))
    }

    /// Sessions kept now.
    pub fn len(&self) -> usize {
        self.slots.lock().map_or(0, |s| s.map.len())
    }

    /// Whether no session is kept.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The slot of `path`, made if new; the least lately read dropped past the bound.
    fn slot(&self, path: &Path) -> std::sync::Arc<std::sync::Mutex<Option<Cached>>> {
        let mut slots = self.slots.lock().unwrap_or_else(|p| p.into_inner());
        slots.clock += 1;
        let now = slots.clock;
        let slot = {
            let entry = slots
                .map
                .entry(path.to_path_buf())
                .or_insert_with(|| (now, Default::default()));
            entry.0 = now;
            entry.1.clone()
        };
        while slots.map.len() > self.sessions_max.max(1) {
            let oldest = slots
                .map
                .iter()
                .min_by_key(|(_, (used, _))| *used)
                .map(|(p, _)| p.clone())
                .expect("a map over its bound holds a session");
            slots.map.remove(&oldest);
        }
        assert!(slots.map.len() <= self.sessions_max.max(1));
        slot
    }

    /// Drops what is kept of the WAL at `path` (a session deleted: past its retention).
    pub fn forget(&self, path: &Path) {
        if let Ok(mut slots) = self.slots.lock() {
            slots.map.remove(path);
        }
    }
}

/// Reads the WAL at `path` whole, as [`read_session`] does, keeping where it ended.
fn read_whole(path: &Path) -> Result<Option<Cached>, ReadError> {
    let Some((bytes, scan)) = broca_wal::verify::read_and_scan_if_any(path)? else {
        return Ok(None);
    };
    let session = Session::with_entries()
        .replay_scan_into(&scan, &bytes)
        .map_err(|error| ReadError::Replay {
            path: path.to_path_buf(),
            error,
        })?;
    let last = scan.frames.last().map_or((0, 0), |f| (f.seq, f.offset));
    Ok(Some(Cached {
        read: ReadSession {
            session,
            triple: scan.header.triple.clone(),
            lineage: scan.header.lineage_hex(),
            last_seq: scan.frames.last().map(|f| f.seq),
            numbered: Default::default(),
        },
        last,
    }))
}

/// Applies the records the WAL gained since `c` was read.
fn catch_up(path: &Path, c: &mut Cached) -> CatchUp {
    use broca_wal::reader::PagedReader;
    let (last_seq, last_offset) = c.last;
    if last_seq == 0 {
        return CatchUp::Whole;
    }
    let Ok(Some(mut r)) = PagedReader::open_from(path, last_seq, last_offset) else {
        return CatchUp::Whole;
    };
    let at_last = r.last_seq() + 1 == last_seq && r.end() == last_offset;
    if !at_last || r.header().lineage_hex() != c.read.lineage {
        return CatchUp::Whole;
    }
    loop {
        let Ok(frames) = r.next_frames(CATCH_UP_PAGE_BYTES, false) else {
            return CatchUp::Whole;
        };
        if frames.is_empty() {
            c.read.session.refresh_unresolved();
            return CatchUp::Done;
        }
        let applied = c.last.0;
        for frame in frames.into_iter().filter(|f| f.seq > applied) {
            match broca_wal::Record::decode(frame.kind, &frame.payload) {
                Ok(record) => {
                    if c.read.session.apply(frame.seq, record).is_err() {
                        return CatchUp::Whole;
                    }
                }
                Err(_) => return CatchUp::Whole,
            }
            c.last = (frame.seq, frame.offset);
            c.read.last_seq = Some(frame.seq);
        }
    }
}
