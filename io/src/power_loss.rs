//! A simulated power loss, for crash tests of real processes. A `kill -9` keeps everything a
//! process wrote (the page cache survives it), so a missing `fdatasync` is invisible to tests
//! that only kill processes. In this mode a log's writes stay in the process's memory until
//! their `fdatasync` is issued, and files created since their directory's last fsync are
//! listed in a ledger; after the kill, [`cut_power`] removes those files. A killed process
//! then leaves on disk exactly what a power cut at that moment could have left in the
//! pessimistic case:
//!
//! - every write a completed `fdatasync` covered, and nothing written after it (no unsynced
//!   byte survives, not even in part);
//! - no file whose directory entry was never made durable (created, then killed before the
//!   fsync of its directory).
//!
//! What it does not model: a device's volatile cache that lies about a flush (the WAL trusts
//! `fdatasync`, see docs/wal-format.md); the partial survival of unsynced writes, sector by
//! sector (the `mid_write` kill point and the storage simulation cover torn writes); writes
//! reordered across a barrier; metadata other than directory entries (a file's size is
//! covered by its `fdatasync`); and files written by LMDB (the store is a projection,
//! rebuilt from the WALs).
//!
//! A slow disk widens the window between a write and its durability: `sync_delay` holds each
//! `fdatasync` that long before it runs (on the executor, without blocking it), so a test can
//! see whether anything acts on bytes that are not durable yet.

use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The power-loss mode of this process, when `BROCA_POWER_LOSS=<ledger file>` asks for it
/// (`BROCA_POWER_LOSS_SYNC_MS` holds each fdatasync that long, default 0). Read once. The
/// directory-entry ledger is kept here, by this crate's own wrappers ([`crate::fs`]): every
/// writer that creates, renames, links or syncs through them is seen as it is, with nothing
/// for a caller to report (or to forget).
pub fn mode() -> Option<&'static PowerLoss> {
    static MODE: std::sync::OnceLock<Option<PowerLoss>> = std::sync::OnceLock::new();
    MODE.get_or_init(|| {
        let ledger = std::env::var_os("BROCA_POWER_LOSS")?;
        let sync_ms = std::env::var("BROCA_POWER_LOSS_SYNC_MS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        tracing::warn!(
            "BROCA_POWER_LOSS: writes stay in memory until their fdatasync ({sync_ms} ms late)"
        );
        Some(PowerLoss {
            sync_delay: Duration::from_millis(sync_ms),
            ledger: Arc::new(Ledger::new(ledger)),
        })
    })
    .as_ref()
}

/// In the power-loss mode, notes that `file`'s directory entry was just made (created,
/// renamed or linked there) and is not durable until its directory is synced.
pub(crate) fn note_created(file: &Path) -> io::Result<()> {
    match mode() {
        Some(p) => p.ledger.created(file),
        None => Ok(()),
    }
}

/// In the power-loss mode, notes that `dir` was synced.
pub(crate) fn note_dir_synced(dir: &Path) -> io::Result<()> {
    match mode() {
        Some(p) => p.ledger.dir_synced(dir),
        None => Ok(()),
    }
}

/// How the power-loss mode runs.
#[derive(Debug, Clone)]
pub struct PowerLoss {
    /// Each `fdatasync` waits this long before it runs.
    pub sync_delay: Duration,
    /// Where created files and directory fsyncs are noted.
    pub ledger: Arc<Ledger>,
}

/// The ledger of files created and directories synced (one line each, appended).
#[derive(Debug)]
pub struct Ledger {
    path: PathBuf,
    lock: Mutex<()>,
}

impl Ledger {
    pub fn new(path: impl Into<PathBuf>) -> Ledger {
        Ledger {
            path: path.into(),
            lock: Mutex::new(()),
        }
    }

    fn note(&self, kind: &str, path: &Path) -> io::Result<()> {
        let _held = self
            .lock
            .lock()
            .map_err(|_| io::Error::other("ledger lock"))?;
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.path)?;
        let line = serde_line(kind, path);
        f.write_all(line.as_bytes())
    }

    /// `file` was just created: its directory entry is not durable yet.
    pub fn created(&self, file: &Path) -> io::Result<()> {
        self.note("created", file)
    }

    /// `dir` was fsynced: the entries of the files created in it before are durable.
    pub fn dir_synced(&self, dir: &Path) -> io::Result<()> {
        self.note("dir_synced", dir)
    }
}

fn serde_line(kind: &str, path: &Path) -> String {
    // Tab-separated; paths with a newline or a tab are not used by broca.
    format!("{kind}\t{}\n", path.display())
}

/// Cuts the power after a kill: removes every file the ledger lists as created and not
/// covered by a later fsync of its directory, then empties the ledger. Answers the files
/// removed. A missing ledger is an empty one.
pub fn cut_power(ledger: &Path) -> io::Result<Vec<PathBuf>> {
    let text = match std::fs::read_to_string(ledger) {
        Ok(t) => t,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let mut undurable: Vec<PathBuf> = Vec::new();
    for line in text.lines() {
        let Some((kind, path)) = line.split_once('\t') else {
            continue; // a line cut by the kill itself
        };
        let path = PathBuf::from(path);
        match kind {
            "created" => undurable.push(path),
            "dir_synced" => undurable.retain(|f| f.parent() != Some(path.as_path())),
            _ => {}
        }
    }
    let mut removed = Vec::new();
    for f in undurable {
        match std::fs::remove_file(&f) {
            Ok(()) => removed.push(f),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
    }
    std::fs::write(ledger, b"")?;
    Ok(removed)
}

/// Writes held back until their `fdatasync`.
#[derive(Debug, Default)]
pub(crate) struct Volatile {
    writes: std::cell::RefCell<Vec<(u64, Vec<u8>)>>,
}

impl Volatile {
    pub(crate) fn hold(&self, pos: u64, bytes: Vec<u8>) {
        self.writes.borrow_mut().push((pos, bytes));
    }

    pub(crate) fn take(&self) -> Vec<(u64, Vec<u8>)> {
        std::mem::take(&mut *self.writes.borrow_mut())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_created_since_their_directory_was_synced_are_removed() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (dir.path().join("a"), dir.path().join("b"));
        let other = dir.path().join("sub");
        std::fs::create_dir(&other).unwrap();
        let c = other.join("c");
        let ledger_path = dir.path().join("ledger");
        let ledger = Ledger::new(&ledger_path);
        for f in [&a, &b, &c] {
            std::fs::write(f, b"x").unwrap();
        }
        ledger.created(&a).unwrap();
        ledger.created(&c).unwrap();
        ledger.dir_synced(dir.path()).unwrap(); // a's entry is durable; c's is in another dir
        ledger.created(&b).unwrap();
        let removed = cut_power(&ledger_path).unwrap();
        assert_eq!(removed, vec![c.clone(), b.clone()]);
        assert!(a.exists() && !b.exists() && !c.exists());
        assert!(
            cut_power(&ledger_path).unwrap().is_empty(),
            "the ledger was emptied"
        );
    }
}
