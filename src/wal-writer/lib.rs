//! broca-wal-writer: the lease-holding WAL writer, on broca-io's durable log. One writer per
//! WAL across threads and processes: an exclusive `flock` on the file, plus a lease epoch recorded in the log (every frame carries it, and a
//! `lease_acquired` record opens each epoch) and a fence that refuses to write through a path
//! that another writer has replaced.
//!
//! Where things are: the lease-holding writer on broca-io's log: flock, lease epoch, fence,
//! tail cut at open, restore before open; new WALs' files made ahead in `wal/.spare/` and
//! renamed into place (`spares.rs`)

use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use broca_io::fs::{out_of_descriptors, storage_full, sync_dir};
use broca_io::log::OpenedLog;
use broca_io::{Committer, LogConfig, LogFile};

use broca_io::LogError;
use broca_wal::frame::{write_frame, FRAME_HEADER_BYTES, PAYLOAD_BYTES_MAX};
use broca_wal::header::{HeaderError, WalHeader};
use broca_wal::record::{LeaseAcquired, Record, TailCut};
use broca_wal::recovery::{Scan, Verdict};
use broca_wal::{SessionTriple, WalError};

pub mod spares;

/// What the durable log said, as a WAL error.
fn log_err(e: LogError) -> WalError {
    match e {
        LogError::Stale { path } => WalError::LeaseStale { path },
        LogError::Io {
            path, op, os_error, ..
        } if out_of_descriptors(os_error) => WalError::OutOfDescriptors { path, op },
        LogError::Io {
            path, op, os_error, ..
        } if storage_full(os_error) => WalError::StorageFull { path, op },
        LogError::Io {
            path, op, message, ..
        } => WalError::Io { path, op, message },
        LogError::Dead { path, os_error, .. } if storage_full(os_error) => {
            WalError::StorageFull { path, op: "write" }
        }
        LogError::Dead { path, cause, .. } => WalError::Closed { path, cause },
        LogError::TooLarge { path, len, .. } => WalError::TooLarge { path, bytes: len },
    }
}

/// What a writer found when it opened the log.
#[derive(Debug)]
pub struct Recovered {
    /// The file's bytes as read at open (the records' payloads point into them).
    pub bytes: Vec<u8>,
    /// The scan of those bytes; `None` for a log created by this open.
    pub scan: Option<Scan>,
    /// The torn tail cut at open, if any.
    pub cut: Option<TailCut>,
}

/// A record appended: its seq and the log end to wait for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Appended {
    pub seq: u64,
    pub end: u64,
}

/// Writes one session's WAL. Lives on the shard that opened it.
pub struct WalWriter {
    path: PathBuf,
    log: LogFile,
    header: WalHeader,
    epoch: u32,
    next_seq: u64,
    scratch: Vec<u8>,
}

/// `dir/<address>.wal`.
pub fn wal_path(dir: &Path, triple: &SessionTriple) -> PathBuf {
    dir.join(triple.address().wal_file_name())
}

fn now_unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

fn io_err(path: &Path, op: &'static str) -> impl FnOnce(std::io::Error) -> WalError {
    let path = path.to_path_buf();
    move |e| {
        if out_of_descriptors(e.raw_os_error()) {
            return WalError::OutOfDescriptors { path, op };
        }
        if storage_full(e.raw_os_error()) {
            return WalError::StorageFull { path, op };
        }
        WalError::Io {
            path,
            op,
            message: e.to_string(),
        }
    }
}

/// Creates the file if it is new (owner-only), answering whether it was: the log opens its
/// own descriptor, and the lease is a flock on that one, so an open WAL costs one descriptor.
fn create_if_new(path: &Path) -> Result<bool, WalError> {
    match broca_io::fs::create_new(path, 0o600) {
        Ok(_) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(false),
        Err(e) => Err(io_err(path, "open")(e)),
    }
}

/// What the scan of an existing WAL allows: the session it belongs to, a torn tail to cut
/// (said on the log), or corruption, which refuses the open and leaves the file as it is.
fn check_recovered(
    path: &Path,
    triple: &SessionTriple,
    scan: &Scan,
) -> Result<Option<TailCut>, WalError> {
    if scan.header.triple != *triple {
        return Err(WalError::WrongSession {
            path: path.to_path_buf(),
            found: scan.header.triple.clone(),
        });
    }
    match &scan.verdict {
        Verdict::Clean => Ok(None),
        Verdict::Torn { bytes, reason } => {
            tracing::warn!(
                path = %path.display(),
                at = scan.end,
                bytes,
                reason = reason.as_str(),
                "cutting a torn tail"
            );
            Ok(Some(TailCut {
                at_offset: scan.end,
                bytes: *bytes,
            }))
        }
        Verdict::Corrupt { reason } => Err(WalError::Corrupt {
            path: path.to_path_buf(),
            offset: scan.end,
            reason: broca_wal::verify::corruption_text(reason),
        }),
    }
}

/// The log positioned where recovery leaves it: an empty file given its header (its directory
/// entry durable before anything in it), an existing one scanned, its torn tail cut,
/// corruption refused.
async fn recover(
    dir: &Path,
    path: &Path,
    triple: &SessionTriple,
    opened: OpenedLog,
    bytes: &[u8],
) -> Result<(LogFile, WalHeader, Option<Scan>, Option<TailCut>), WalError> {
    match broca_wal::scan(bytes) {
        Err(HeaderError::Empty | HeaderError::Uninitialized) => {
            // Nothing was ever acknowledged in this file: give it its header now.
            let header = WalHeader::new(triple.clone(), now_unix_ms());
            let log = opened
                .initialize(&header.encode(), header.data_offset)
                .await
                .map_err(log_err)?;
            sync_dir(dir).map_err(io_err(path, "fsync directory"))?;
            Ok((log, header, None, None))
        }
        Err(error) => Err(WalError::Header {
            path: path.to_path_buf(),
            error,
        }),
        Ok(scan) => {
            let cut = check_recovered(path, triple, &scan)?;
            assert!(
                scan.end as usize <= bytes.len(),
                "a scan ends inside the bytes read"
            );
            let log = opened.position(scan.end, bytes).await.map_err(log_err)?;
            Ok((log, scan.header.clone(), Some(scan), cut))
        }
    }
}

/// How long a writer waits for a pack that holds its WAL's lease.
const PACK_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// WAL files are created one at a time in a process: a create holds its directory's lock
/// while the file system finds a free inode, which on ext4 without a journal can mean
/// scanning past many recently deleted ones; two shards creating at once spin on that lock
/// (BENCHMARKS.md). Waiting here, a blocking-pool thread sleeps instead.
static CREATING: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Tops up the spare files of `path`'s folder on the blocking pool when they run low, without
/// waiting for it (see [`spares`]).
fn top_up_spares(path: &Path) {
    let dir = path.parent().unwrap_or(Path::new(".")).to_path_buf();
    if !spares::wants_fill(&dir) {
        return;
    }
    glommio::spawn_local(async move {
        let kind = broca_io::blocking::Kind::WalSpares;
        let filled = broca_io::blocking::run(kind, move || {
            let made = spares::fill(&dir);
            (made, dir)
        })
        .await;
        if let (Err(e), dir) = filled {
            tracing::warn!(
                dir = %dir.join(spares::SPARES_DIR).display(),
                "cannot make spare files for new WALs (each is created when needed; tried again in a minute): {e}"
            );
        }
    })
    .detach();
}

/// Where no live WAL is, on the blocking pool (never the shard's thread): restores the
/// archived one (a restore writes and fsyncs the whole WAL once), or creates the file
/// (owner-only). Answers whether it created it.
async fn restore_or_create(path: &Path) -> Result<bool, WalError> {
    let p = path.to_path_buf();
    let done = broca_io::blocking::run(broca_io::blocking::Kind::ArchiveRestore, move || {
        match broca_archive::restore(&p) {
            Ok(broca_archive::Restored::From(container)) => Ok((false, Some(container))),
            Ok(_) => {
                let dir = p.parent().unwrap_or(Path::new("."));
                match spares::take(dir, &p) {
                    Ok(spares::Taken::Created) => return Ok((true, None)),
                    Ok(spares::Taken::Exists) => return Ok((false, None)),
                    // None at hand, or the rename failed: the file is made here.
                    Ok(spares::Taken::None) | Err(_) => {}
                }
                let _one = CREATING.lock().unwrap_or_else(|e| e.into_inner());
                create_if_new(&p).map(|created| (created, None))
            }
            Err(e) if out_of_descriptors(e.os_error()) => Err(WalError::OutOfDescriptors {
                path: p.clone(),
                op: "restore from the archive",
            }),
            Err(e) => Err(WalError::Io {
                path: p.clone(),
                op: "restore from the archive",
                message: e.to_string(),
            }),
        }
    })
    .await?;
    top_up_spares(path);
    if let (_, Some(container)) = &done {
        tracing::info!(
            wal = %path.display(),
            container = %container.display(),
            "restored an archived WAL before opening it for writes"
        );
    }
    Ok(done.0)
}

/// What one try at opening a WAL under its lease met: the races with a pack (which holds a
/// WAL's lease from reading it until it removes the file, and whose sealed copy a writer
/// restores) decide whether the writer goes on, tries again, or gives up. The table, in the
/// order [`try_open`] meets its rows:
///
/// | what the try met | answer |
/// |---|---|
/// | no file: the archive holds the session, or not | restored, or created; then opened |
/// | the file went between the look and the open (a pack removed it) | again, within [`PACK_WAIT`] |
/// | the lease is held, and a pack runs | wait 10 ms, again, within [`PACK_WAIT`] |
/// | the lease is held, no pack runs, first time | again once: a pack may have just ended |
/// | the lease is held | [`WalError::LeaseHeld`] |
/// | the file held is no longer the path's (a pack removed it after the lock) | again, within [`PACK_WAIT`]; then [`WalError::LeaseHeld`] |
/// | the file is new and empty, and the archive holds the session | removed; again |
/// | otherwise | [`Try::Opened`] with the file's bytes |
enum Try {
    Opened(OpenedLog, Vec<u8>),
    Again,
    /// Again, after a pause (a pack runs).
    Wait,
}

/// How far a writer's open has come through the table of [`Try`].
struct Attempts {
    until: std::time::Instant,
    tried_after_pack: bool,
}

impl Attempts {
    fn waiting(&self) -> bool {
        std::time::Instant::now() < self.until
    }
}

/// One try at opening the WAL at `path` under its lease (see [`Try`]).
async fn try_open(
    dir: &Path,
    path: &Path,
    cfg: &LogConfig,
    committer: &Committer,
    attempts: &mut Attempts,
) -> Result<Try, WalError> {
    // A new or restored file's directory entry is noted by broca-io's wrappers for the
    // power-loss mode; `sync_dir` after its header makes it durable.
    let created = !path.exists() && restore_or_create(path).await?;
    let opened = match OpenedLog::open(path, cfg.clone(), committer.clone()).await {
        Ok(opened) => opened,
        Err(LogError::Io {
            kind: std::io::ErrorKind::NotFound,
            ..
        }) if attempts.waiting() => return Ok(Try::Again),
        Err(e) => return Err(log_err(e)),
    };
    let held = || WalError::LeaseHeld {
        path: path.to_path_buf(),
    };
    if !opened.try_lock().map_err(log_err)? {
        opened.close().await.map_err(log_err)?;
        if broca_archive::pack_running(dir) && attempts.waiting() {
            return Ok(Try::Wait);
        }
        if attempts.waiting() && !attempts.tried_after_pack {
            attempts.tried_after_pack = true;
            return Ok(Try::Again);
        }
        return Err(held());
    }
    if !opened.still_named() {
        opened.close().await.map_err(log_err)?;
        return if attempts.waiting() {
            Ok(Try::Again)
        } else {
            Err(held())
        };
    }
    let bytes = opened.read_all().await.map_err(log_err)?;
    let empty = matches!(
        broca_wal::scan(&bytes),
        Err(HeaderError::Empty | HeaderError::Uninitialized)
    );
    if empty && created && broca_wal::archive::is_archived(path) {
        std::fs::remove_file(path).map_err(io_err(path, "remove"))?;
        opened.close().await.map_err(log_err)?;
        return Ok(Try::Again);
    }
    Ok(Try::Opened(opened, bytes))
}

/// How long an open waits between tries while a pack holds the lease.
const PACK_POLL: std::time::Duration = std::time::Duration::from_millis(10);

impl WalWriter {
    /// Opens (or creates) the WAL of `triple` in `dir`, takes its lease, recovers its tail and
    /// records the new epoch durably before returning.
    pub async fn open(
        dir: &Path,
        triple: &SessionTriple,
        cfg: LogConfig,
        committer: Committer,
    ) -> Result<(WalWriter, Recovered), WalError> {
        let path = wal_path(dir, triple);
        let mut attempts = Attempts {
            until: std::time::Instant::now() + PACK_WAIT,
            tried_after_pack: false,
        };
        let (opened, bytes) = loop {
            match try_open(dir, &path, &cfg, &committer, &mut attempts).await? {
                Try::Opened(opened, bytes) => break (opened, bytes),
                Try::Again => {}
                Try::Wait => glommio::timer::sleep(PACK_POLL).await,
            }
        };
        let (log, header, scan, cut) = recover(dir, &path, triple, opened, &bytes).await?;
        let epoch_max = scan.as_ref().map_or(0, |s| s.epoch_max);
        // A value read from disk: at its maximum, the file is refused rather than wrapped.
        let Some(epoch) = epoch_max.checked_add(1) else {
            return Err(WalError::Corrupt {
                path,
                offset: scan.as_ref().map_or(0, |s| s.end),
                reason: format!("the lease epoch is {epoch_max}, the largest there is"),
            });
        };
        let next_seq = scan.as_ref().map_or(1, Scan::next_seq);
        assert!(next_seq >= 1, "seqs start at 1");
        let mut writer = WalWriter {
            path,
            log,
            header,
            epoch,
            next_seq,
            scratch: Vec::new(),
        };
        let lease = Record::LeaseAcquired(LeaseAcquired {
            epoch,
            pid: std::process::id(),
            at_unix_ms: now_unix_ms(),
            cut: cut.clone(),
        });
        writer.append_durable(&lease).await?;
        Ok((writer, Recovered { bytes, scan, cut }))
    }

    /// The WAL's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The WAL's header.
    pub fn header(&self) -> &WalHeader {
        &self.header
    }

    /// This writer's lease epoch.
    pub fn epoch(&self) -> u32 {
        self.epoch
    }

    /// The seq the next record gets.
    pub fn next_seq(&self) -> u64 {
        self.next_seq
    }

    /// The underlying log.
    pub fn log(&self) -> &LogFile {
        &self.log
    }

    /// Appends `record` to the pending batch without waiting for the disk; its write starts
    /// at once.
    pub async fn append(&mut self, record: &Record) -> Result<Appended, WalError> {
        self.append_as(record, true).await
    }

    /// Appends `record` without starting a write for it: it becomes durable with the next
    /// urgent append or wait, or within the log's `defer_max` (see
    /// `LogFile::append_deferred_with`). For records a crash may lose.
    pub async fn append_deferred(&mut self, record: &Record) -> Result<Appended, WalError> {
        self.append_as(record, false).await
    }

    async fn append_as(&mut self, record: &Record, urgent: bool) -> Result<Appended, WalError> {
        record.encode_payload(&mut self.scratch);
        let payload = &self.scratch;
        if payload.len() > PAYLOAD_BYTES_MAX {
            return Err(WalError::TooLarge {
                path: self.path.clone(),
                bytes: payload.len(),
            });
        }
        let seq = self.next_seq;
        debug_assert!(seq >= 1, "seqs start at 1");
        let (tag, epoch, kind) = (self.header.lineage_tag(), self.epoch, record.kind());
        let len = FRAME_HEADER_BYTES + payload.len();
        let fill = |buf: &mut [u8], synced_end| {
            write_frame(buf, seq, tag, synced_end, epoch, kind, payload)
        };
        let end = if urgent {
            self.log.append_with(len, fill).await
        } else {
            self.log.append_deferred_with(len, fill).await
        }
        .map_err(log_err)?;
        assert!(
            end >= self.header.data_offset + len as u64,
            "a frame ends past the data's start by its own length at least"
        );
        self.next_seq += 1;
        Ok(Appended { seq, end })
    }

    /// Appends `record` and waits until it is durable.
    pub async fn append_durable(&mut self, record: &Record) -> Result<u64, WalError> {
        let appended = self.append(record).await?;
        self.wait_durable(appended.end).await?;
        debug_assert_eq!(
            appended.seq + 1,
            self.next_seq,
            "the next record takes the next seq"
        );
        Ok(appended.seq)
    }

    /// A handle that waits for this log's durability from another task of the shard.
    pub fn watch(&self) -> broca_io::log::DurableWatch {
        self.log.watch()
    }

    /// Waits until everything up to `end` is durable.
    pub async fn wait_durable(&self, end: u64) -> Result<(), WalError> {
        self.log.wait_durable(end).await.map_err(log_err)
    }

    /// Makes every append durable, closes the file and releases the lease.
    pub async fn close(self) -> Result<(), WalError> {
        self.log.close().await.map_err(log_err)
    }
}
