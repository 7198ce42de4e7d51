//! The durable log file: an append-only file written with O_DIRECT, one aligned write per
//! batch, and group commit.
//!
//! Cost per batch, whatever its number of appends: one `write` of the aligned span from the
//! start of the partial tail block to the end of the new bytes (plus zeroing, when the file
//! grows), one `fdatasync`, one non-blocking `read` of the log directory's inotify descriptor
//! (the fence: the path is `stat`ed only when the directory changed since the last batch, see
//! `crate::fence`), and two allocations: the aligned write buffer (glommio's DMA allocator) and
//! the copy of the partial tail block it starts with. Per append: one copy of the frame into
//! the pending batch, no allocation once the batch buffer has grown to its working size.
//!
//! Invariants:
//! - bytes below `durable_end` were written and `fdatasync` returned; a waiter is released only
//!   once its end is at or below `durable_end`;
//! - at most one batch write of a log is in flight, and it carries at most
//!   [`LogConfig::batch_bytes_max`] new bytes; the shard's [`Committer`] bounds the batch writes
//!   of all its logs;
//! - the partial tail block is rewritten with the acknowledged bytes it already holds, byte for
//!   byte: under the media assumption of docs/wal-format.md (a sector write leaves unchanged
//!   bytes unchanged) acknowledged bytes are never endangered;
//! - bytes from the tail up to `zeroed_end` are zero on disk, so a steady-state `fdatasync`
//!   commits no metadata;
//! - an error from `write` or `fdatasync` is fatal for the log: it is never retried (after a
//!   failed fsync, Linux may already have dropped the dirty pages), every waiter gets the error,
//!   and the owner must reopen the log and recover from what is on disk.

mod backend;
mod flush;

use std::cell::RefCell;
use std::fmt;
use std::future::poll_fn;
use std::io;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::sync::Arc;
use std::task::{Poll, Waker};

pub use backend::warm_device_cache;
use backend::{Backend, Submit};

use crate::commit::Committer;
use crate::fence::DirWatch;
use crate::fs::{self, align_down, align_up};

/// How a log file reaches the disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DirectIo {
    /// O_DIRECT where the file system accepts it, buffered with a logged warning where not.
    Auto,
    /// Always buffered writes (still aligned, still one `fdatasync` per batch).
    Off,
}

/// Batches of at least this many bytes extend the file without zeroing ahead.
pub const ZERO_AHEAD_BATCH_BYTES_MAX: usize = 64 * 1024;

/// The largest single append. One larger than [`LogConfig::batch_bytes_max`] waits for the
/// bytes pending before it and is written as a batch of its own.
pub const APPEND_BYTES_MAX: usize = 32 * 1024 * 1024;

/// A point in a batch where a fault can be injected (for crash and fault tests).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultPoint {
    /// Before the batch write of `len` bytes at `pos`: an error here means nothing was written.
    Write { pos: u64, len: usize },
    /// After the batch write of `len` bytes at `pos` on descriptor `fd`, before its sync (crash
    /// tests tear the write here); an error here is a failed write.
    Written { fd: i32, pos: u64, len: usize },
    /// Instead of the batch's `fdatasync`: an error here is a failed sync.
    Sync,
}

/// Injects I/O errors at [`FaultPoint`]s: `None` lets the operation run, `Some(e)` fails it.
#[derive(Clone)]
pub struct FaultHook(pub Arc<dyn Fn(FaultPoint) -> Option<io::Error> + Send + Sync>);

impl fmt::Debug for FaultHook {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("FaultHook")
    }
}

/// Limits and policies of one log file.
#[derive(Debug, Clone)]
pub struct LogConfig {
    /// The most new bytes one batch write carries. It is also the largest single append.
    pub batch_bytes_max: usize,
    /// The least the zeroed space ahead of the tail grows by at a time.
    pub zero_ahead_min_bytes: u64,
    /// The most the zeroed space ahead of the tail grows by at a time.
    pub zero_ahead_max_bytes: u64,
    /// O_DIRECT or buffered.
    pub direct_io: DirectIo,
    /// Injected faults; `None` outside fault tests.
    pub faults: Option<FaultHook>,
    /// The simulated power loss of crash tests (see [`crate::power_loss`]); `None` otherwise.
    pub power_loss: Option<crate::power_loss::PowerLoss>,
    /// The longest a deferred append ([`LogFile::append_deferred_with`]) waits for a write
    /// before one is made for it alone.
    pub defer_max: std::time::Duration,
}

impl Default for LogConfig {
    fn default() -> Self {
        LogConfig {
            batch_bytes_max: 1024 * 1024,
            zero_ahead_min_bytes: 4 * 1024,
            zero_ahead_max_bytes: 4 * 1024 * 1024,
            direct_io: DirectIo::Auto,
            faults: None,
            power_loss: None,
            defer_max: DEFER_MAX_DEFAULT,
        }
    }
}

/// How long a deferred append may wait for an urgent one to carry it, by default.
pub const DEFER_MAX_DEFAULT: std::time::Duration = std::time::Duration::from_millis(50);

/// What went wrong with a log file. Every variant names the file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LogError {
    /// An I/O call failed; `op` says which. A failed write or fsync also kills the log.
    Io {
        path: PathBuf,
        op: &'static str,
        kind: io::ErrorKind,
        /// The OS error number, where the call set one.
        os_error: Option<i32>,
        message: String,
    },
    /// The log died earlier (a failed write or fsync) and takes no more appends; `os_error`
    /// is the OS error number of the failure that killed it, where it had one.
    Dead {
        path: PathBuf,
        cause: String,
        os_error: Option<i32>,
    },
    /// The path no longer names the file this writer holds: another writer replaced it.
    Stale { path: PathBuf },
    /// One append larger than a batch may carry.
    TooLarge {
        path: PathBuf,
        len: usize,
        max: usize,
    },
}

impl fmt::Display for LogError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LogError::Io {
                path, op, message, ..
            } => {
                write!(f, "{}: {op} failed: {message}", path.display())
            }
            LogError::Dead { path, cause, .. } => write!(
                f,
                "{}: the log is closed for writing after an earlier failure ({cause}); reopen it \
                 to recover from what is durable",
                path.display()
            ),
            LogError::Stale { path } => write!(
                f,
                "{}: stale writer: the file was replaced by another writer; this writer's lease \
                 is gone",
                path.display()
            ),
            LogError::TooLarge { path, len, max } => write!(
                f,
                "{}: an append of {len} bytes is larger than the {max}-byte batch limit",
                path.display()
            ),
        }
    }
}

impl std::error::Error for LogError {}

impl LogError {
    fn io(path: &Path, op: &'static str, e: io::Error) -> LogError {
        LogError::Io {
            path: path.to_path_buf(),
            op,
            kind: e.kind(),
            os_error: e.raw_os_error(),
            message: e.to_string(),
        }
    }
}

/// Waits for a log's durability from another task of its shard. It holds the log weakly: a
/// watch never keeps the file (and the lease its descriptor holds) open after the log is
/// closed; a closed log's watch answers from the end its close made durable.
#[derive(Clone)]
pub struct DurableWatch {
    shared: std::rc::Weak<Shared>,
    closed_end: Rc<std::cell::Cell<Option<u64>>>,
    path: PathBuf,
}

impl DurableWatch {
    /// Waits until every byte below `end` is durable (or the log died, or was dropped without
    /// a close that made `end` durable).
    pub async fn wait_durable(&self, end: u64) -> Result<(), LogError> {
        poll_fn(|cx| {
            let Some(shared) = self.shared.upgrade() else {
                return Poll::Ready(match self.closed_end.get() {
                    Some(durable) if end <= durable => Ok(()),
                    _ => Err(LogError::Dead {
                        path: self.path.clone(),
                        cause: "the log was dropped before this end was durable".into(),
                        os_error: None,
                    }),
                });
            };
            let mut st = shared.state.borrow_mut();
            if st.durable_end >= end {
                return Poll::Ready(Ok(()));
            }
            if let Some(dead) = &st.dead {
                return Poll::Ready(Err(dead.clone()));
            }
            st.durable_waiters.push((end, cx.waker().clone()));
            Poll::Pending
        })
        .await
    }
}

/// A log file opened for appending. Not `Send`: it lives on the shard that opened it.
pub struct LogFile {
    shared: Rc<Shared>,
}

struct Shared {
    path: PathBuf,
    /// Set by a clean close: everything below is durable (read by watches afterwards).
    closed_end: Rc<std::cell::Cell<Option<u64>>>,
    /// The directory watch that tells when the fence needs a real check.
    watch: Option<Rc<DirWatch>>,
    /// The watch generation at the last successful fence check.
    fenced_generation: std::cell::Cell<u64>,
    file: Backend,
    align: u64,
    identity: (u64, u64),
    cfg: LogConfig,
    committer: Committer,
    state: RefCell<State>,
}

struct State {
    /// Logical end: durable bytes, the batch in flight and the pending batch.
    end: u64,
    /// Everything below is durable.
    durable_end: u64,
    /// Bytes from the tail up to here are zero on disk.
    zeroed_end: u64,
    /// The bytes of the partial block `[align_down(durable_end), durable_end)`.
    tail_block: Vec<u8>,
    /// Appends not yet handed to a write.
    pending: Vec<u8>,
    /// Bytes below this are due to be written now: urgent appends, waits, deferred appends
    /// whose time ran out. Pending bytes above it wait for one of those.
    urgent_end: u64,
    /// A timer is set to make the deferred appends urgent.
    defer_armed: bool,
    /// A spare batch buffer, swapped with `pending` at each flush to keep its capacity.
    spare: Vec<u8>,
    flushing: bool,
    dead: Option<LogError>,
    durable_waiters: Vec<(u64, Waker)>,
    room_waiters: Vec<Waker>,
}

/// A log file open, but not yet positioned at its logical end: the owner reads it, decides
/// where the valid bytes end, then calls [`OpenedLog::position`] or [`OpenedLog::initialize`].
pub struct OpenedLog {
    path: PathBuf,
    file: Backend,
    align: u64,
    identity: (u64, u64),
    len: u64,
    cfg: LogConfig,
    committer: Committer,
}

impl OpenedLog {
    /// Opens the existing file at `path` for reading and writing. The (device, inode) of the
    /// file opened is its identity: a path that names another file later makes the log stale.
    /// One descriptor per log: the owner's lease ([`OpenedLog::try_lock`]) is taken on it too.
    pub async fn open(
        path: &Path,
        cfg: LogConfig,
        committer: Committer,
    ) -> Result<OpenedLog, LogError> {
        let direct = match cfg.direct_io {
            DirectIo::Off => false,
            DirectIo::Auto => {
                let ok = fs::supports_o_direct(path).map_err(|e| LogError::io(path, "open", e))?;
                if !ok {
                    tracing::warn!(
                        path = %path.display(),
                        "the file system refuses O_DIRECT; falling back to buffered writes \
                         (still one fdatasync per batch)"
                    );
                }
                ok
            }
        };
        let file = Backend::open(path, direct, cfg.power_loss.as_ref())
            .await
            .map_err(|e| LogError::io(path, "open", e))?;
        let probed = fs::probe_dio_alignment(path);
        let align = probed
            .into_iter()
            .chain(file.device_alignment())
            .max()
            .unwrap_or(fs::ALIGNMENT_MIN)
            .clamp(fs::ALIGNMENT_MIN, fs::ALIGNMENT_MAX);
        assert!(
            align.is_power_of_two(),
            "O_DIRECT alignment {align} is not a power of two"
        );
        let len = file
            .len()
            .await
            .map_err(|e| LogError::io(path, "stat", e))?;
        let identity = fs::fd_identity(file.raw_fd()).map_err(|e| LogError::io(path, "stat", e))?;
        tracing::debug!(path = %path.display(), align, direct = file.is_direct(), len, "log opened");
        Ok(OpenedLog {
            path: path.to_path_buf(),
            file,
            align,
            identity,
            len,
            cfg,
            committer,
        })
    }

    /// Takes an exclusive `flock` on this log's descriptor without waiting; `Ok(false)` means
    /// another open file description holds it. The lock lives as long as the descriptor: until
    /// the log is closed or the process dies.
    pub fn try_lock(&self) -> Result<bool, LogError> {
        fs::try_flock(self.file.raw_fd()).map_err(|e| LogError::io(&self.path, "lock", e))
    }

    /// Whether the path still names the file this log opened (it may have been removed or
    /// replaced since the open, before this log took its lock).
    pub fn still_named(&self) -> bool {
        fs::path_identity(&self.path).is_ok_and(|id| id == self.identity)
    }

    /// Closes the file without using it (for example when its lock is held elsewhere).
    pub async fn close(self) -> Result<(), LogError> {
        self.file
            .close()
            .await
            .map_err(|e| LogError::io(&self.path, "close", e))
    }

    /// The file's length in bytes.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether the file holds no bytes at all.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The write alignment in use (probed from the file, at least 512).
    pub fn alignment(&self) -> u64 {
        self.align
    }

    /// Reads the whole file.
    pub async fn read_all(&self) -> Result<Vec<u8>, LogError> {
        Backend::read_all(&self.path)
            .await
            .map_err(|e| LogError::io(&self.path, "read", e))
    }

    /// Writes `header` at offset 0, zeroes up to `data_offset` and some space ahead of it,
    /// makes it durable, and returns the log positioned at `data_offset`. For a file that holds
    /// nothing durable yet.
    pub async fn initialize(self, header: &[u8], data_offset: u64) -> Result<LogFile, LogError> {
        assert!(
            header.len() as u64 <= data_offset,
            "the header overlaps the data"
        );
        assert_eq!(data_offset % self.align, 0, "data_offset must be aligned");
        let zeroed_end = data_offset + align_up(self.cfg.zero_ahead_min_bytes, self.align);
        let len = usize::try_from(zeroed_end).expect("the initial region fits in memory");
        self.file
            .write_filled(0, len, Submit::Ring, |buf| {
                buf.fill(0);
                buf[..header.len()].copy_from_slice(header);
            })
            .await
            .map_err(|e| LogError::io(&self.path, "write", e))?;
        self.file
            .fdatasync(Submit::Ring)
            .await
            .map_err(|e| LogError::io(&self.path, "fdatasync", e))?;
        self.committer.count_write(len);
        Ok(self.into_log(data_offset, Vec::new(), zeroed_end))
    }

    /// Positions the log at `end`, where the owner found its valid bytes to stop; `contents`
    /// is the whole file as read. Any non-zero bytes at or after `end` (a torn tail) are zeroed
    /// and made durable first, so that no stale bytes lie ahead of new appends.
    pub async fn position(self, end: u64, contents: &[u8]) -> Result<LogFile, LogError> {
        assert!(
            end <= contents.len() as u64,
            "the logical end lies beyond the file"
        );
        let end_usize = end as usize;
        let block_start = align_down(end, self.align);
        let tail_block = contents[block_start as usize..end_usize].to_vec();
        let last_nonzero = contents[end_usize..].iter().rposition(|&b| b != 0);
        let mut zeroed_end = contents.len() as u64;
        if let Some(last) = last_nonzero {
            let stale_end = align_up(end + last as u64 + 1, self.align);
            let len = (stale_end - block_start) as usize;
            tracing::info!(
                path = %self.path.display(),
                cut_at = end,
                stale_bytes = last + 1,
                "zeroing the torn tail before appending"
            );
            self.file
                .write_filled(block_start, len, Submit::Ring, |buf| {
                    buf.fill(0);
                    buf[..tail_block.len()].copy_from_slice(&tail_block);
                })
                .await
                .map_err(|e| LogError::io(&self.path, "write", e))?;
            self.file
                .fdatasync(Submit::Ring)
                .await
                .map_err(|e| LogError::io(&self.path, "fdatasync", e))?;
            self.committer.count_write(len);
            zeroed_end = zeroed_end.max(stale_end);
        }
        let zeroed_end = align_down(zeroed_end, self.align).max(end);
        Ok(self.into_log(end, tail_block, zeroed_end))
    }

    fn into_log(self, end: u64, tail_block: Vec<u8>, zeroed_end: u64) -> LogFile {
        let watch = self.path.parent().and_then(DirWatch::for_dir);
        LogFile {
            shared: Rc::new(Shared {
                closed_end: Rc::default(),
                watch,
                fenced_generation: std::cell::Cell::new(0),
                path: self.path,
                file: self.file,
                align: self.align,
                identity: self.identity,
                cfg: self.cfg,
                committer: self.committer,
                state: RefCell::new(State {
                    end,
                    durable_end: end,
                    zeroed_end,
                    tail_block,
                    pending: Vec::new(),
                    urgent_end: end,
                    defer_armed: false,
                    spare: Vec::new(),
                    flushing: false,
                    dead: None,
                    durable_waiters: Vec::new(),
                    room_waiters: Vec::new(),
                }),
            }),
        }
    }
}

impl LogFile {
    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.shared.path
    }

    /// The logical end, pending appends included.
    pub fn end(&self) -> u64 {
        self.shared.state.borrow().end
    }

    /// Everything below this offset is durable.
    pub fn durable_end(&self) -> u64 {
        self.shared.state.borrow().durable_end
    }

    /// The write alignment in use.
    pub fn alignment(&self) -> u64 {
        self.shared.align
    }

    /// The error that killed the log, if one did.
    pub fn dead(&self) -> Option<LogError> {
        self.shared.state.borrow().dead.clone()
    }

    /// Appends `len` bytes that `fill` writes into place; `fill` also receives the durable end
    /// at the time of the append (a lower bound a reader can trust). Waits only for room in the
    /// pending batch, never for the disk; returns the log's end after this append, for
    /// [`LogFile::wait_durable`]. The write starts at once (with whatever else is pending).
    pub async fn append_with(
        &self,
        len: usize,
        fill: impl FnOnce(&mut [u8], u64),
    ) -> Result<u64, LogError> {
        self.append_inner(len, fill, true).await
    }

    /// As [`LogFile::append_with`], but no write starts for these bytes alone: they ride on
    /// the next urgent append's write or wait, or after [`LogConfig::defer_max`] get a write
    /// of their own. For records whose loss in a crash the reader tolerates, so that a record
    /// and the urgent one after it share one fdatasync.
    pub async fn append_deferred_with(
        &self,
        len: usize,
        fill: impl FnOnce(&mut [u8], u64),
    ) -> Result<u64, LogError> {
        self.append_inner(len, fill, false).await
    }

    async fn append_inner(
        &self,
        len: usize,
        fill: impl FnOnce(&mut [u8], u64),
        urgent: bool,
    ) -> Result<u64, LogError> {
        let max = self.shared.cfg.batch_bytes_max;
        if len > APPEND_BYTES_MAX {
            return Err(LogError::TooLarge {
                path: self.shared.path.clone(),
                len,
                max: APPEND_BYTES_MAX,
            });
        }
        self.wait_for_room(len).await?;
        let mut st = self.shared.state.borrow_mut();
        let start = st.pending.len();
        assert!(
            start + len <= max || start == 0,
            "an append waits for room in the batch (one larger than a batch, for an empty one)"
        );
        st.pending.resize(start + len, 0);
        let durable_end = st.durable_end;
        fill(&mut st.pending[start..], durable_end);
        st.end += len as u64;
        let end = st.end;
        assert!(
            st.durable_end <= end,
            "nothing is durable past the log's end"
        );
        if urgent {
            st.urgent_end = end;
            flush::start_flush(&self.shared, &mut st);
        } else if !st.flushing {
            flush::arm_defer(&self.shared, &mut st);
        }
        drop(st);
        self.shared.committer.count_append(len);
        Ok(end)
    }

    /// Appends `bytes` (see [`LogFile::append_with`]).
    pub async fn append(&self, bytes: &[u8]) -> Result<u64, LogError> {
        self.append_with(bytes.len(), |buf, _| buf.copy_from_slice(bytes))
            .await
    }

    /// Waits until every byte below `end` is durable, starting the write of deferred bytes
    /// below it (a [`DurableWatch`] waits without hurrying anything).
    pub async fn wait_durable(&self, end: u64) -> Result<(), LogError> {
        {
            let mut st = self.shared.state.borrow_mut();
            if end > st.urgent_end {
                st.urgent_end = end.min(st.end);
                assert!(st.urgent_end >= st.durable_end);
                flush::start_flush(&self.shared, &mut st);
            }
        }
        self.watch().wait_durable(end).await
    }

    /// A handle that can wait for durability elsewhere on this shard (it keeps neither the
    /// log's state nor its file alive).
    pub fn watch(&self) -> DurableWatch {
        DurableWatch {
            shared: Rc::downgrade(&self.shared),
            closed_end: self.shared.closed_end.clone(),
            path: self.shared.path.clone(),
        }
    }

    /// Makes every append so far durable.
    pub async fn sync(&self) -> Result<(), LogError> {
        let end = self.end();
        self.wait_durable(end).await
    }

    /// Makes every append durable, then closes the file.
    pub async fn close(self) -> Result<(), LogError> {
        self.sync().await?;
        let shared = self.shared;
        shared
            .closed_end
            .set(Some(shared.state.borrow().durable_end));
        // The flush task may still hold its handle for a moment after waking us.
        while shared.state.borrow().flushing {
            futures_lite::future::yield_now().await;
        }
        match Rc::try_unwrap(shared) {
            Ok(shared) => {
                let path = shared.path;
                shared
                    .file
                    .close()
                    .await
                    .map_err(|e| LogError::io(&path, "close", e))
            }
            // Another handle keeps it open a moment (the last drop closes it).
            Err(_) => Ok(()),
        }
    }

    async fn wait_for_room(&self, len: usize) -> Result<(), LogError> {
        let max = self.shared.cfg.batch_bytes_max;
        poll_fn(|cx| {
            let mut st = self.shared.state.borrow_mut();
            if let Some(dead) = &st.dead {
                return Poll::Ready(Err(dead.clone()));
            }
            // One larger than a batch goes alone, once the bytes before it are taken.
            if st.pending.len() + len <= max || st.pending.is_empty() {
                return Poll::Ready(Ok(()));
            }
            st.room_waiters.push(cx.waker().clone());
            Poll::Pending
        })
        .await
    }
}
