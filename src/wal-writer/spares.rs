//! Files for new WALs, made ahead. A file create on ext4 allocates an inode, and on a file
//! system without a journal that can mean scanning past many recently deleted ones while the
//! directory's lock is held (BENCHMARKS.md, "A file create"). A new session's WAL instead
//! takes an empty file made earlier in `wal/.spare/` and renames it into place (one rename,
//! refused if anything is at the WAL's path). The folder is topped up on the blocking pool
//! once it runs low, off any session's path.
//!
//! A spare is an empty owner-only file and nothing else: a crash leaves at worst a few of them,
//! which the next process adopts (or removes, if one is not empty). Only the WAL's folder
//! entry has to be durable, and the writer syncs the folder after the header, as for a file
//! it created.

use std::collections::HashMap;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// The folder of spare files, inside the WALs' folder (its name is no WAL's).
pub const SPARES_DIR: &str = ".spare";

/// Below this many spares a folder is topped up...
const LOW: usize = 32;
/// ...to this many.
const TARGET: usize = 128;
/// After a top-up fails (a full disk, no descriptor left), none is tried for this long: new
/// WALs are created when needed meanwhile, and the failure is not logged at every new session.
const RETRY_AFTER: std::time::Duration = std::time::Duration::from_secs(60);

#[derive(Default)]
struct Pool {
    files: Vec<PathBuf>,
    /// A top-up is under way (or queued).
    filling: bool,
    /// Whatever a previous process left was looked at.
    adopted: bool,
    /// When the last top-up failed.
    failed_at: Option<std::time::Instant>,
}

/// The spares of each WALs' folder this process writes to.
static POOLS: Mutex<Option<HashMap<PathBuf, Pool>>> = Mutex::new(None);

fn with_pool<T>(dir: &Path, f: impl FnOnce(&mut Pool) -> T) -> T {
    let mut pools = POOLS.lock().unwrap_or_else(|e| e.into_inner());
    let pool = pools
        .get_or_insert_with(HashMap::new)
        .entry(dir.to_path_buf())
        .or_default();
    f(pool)
}

/// What taking a spare for a new WAL came to.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Taken {
    /// A spare is now the (empty) file at the WAL's path.
    Created,
    /// Something is at the WAL's path already: the spare stays a spare.
    Exists,
    /// No spare is at hand: create the file.
    None,
}

/// Moves a spare of `dir` to `path`, if one is at hand.
pub(crate) fn take(dir: &Path, path: &Path) -> io::Result<Taken> {
    loop {
        let Some(spare) = with_pool(dir, |p| p.files.pop()) else {
            return Ok(Taken::None);
        };
        match broca_io::fs::rename_new(&spare, path) {
            Ok(()) => return Ok(Taken::Created),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                with_pool(dir, |p| p.files.push(spare));
                return Ok(Taken::Exists);
            }
            // Gone from under us (removed by hand): the next one.
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e),
        }
    }
}

/// Whether `dir`'s spares are low and no top-up is under way; `true` claims the top-up,
/// which the caller then runs ([`fill`]).
pub(crate) fn wants_fill(dir: &Path) -> bool {
    with_pool(dir, |p| {
        let resting = p.failed_at.is_some_and(|t| t.elapsed() < RETRY_AFTER);
        let want = !p.filling && !resting && p.files.len() < LOW;
        p.filling |= want;
        want
    })
}

/// Tops `dir`'s spares up to [`TARGET`], adopting first what a previous process left (empty
/// regular files; anything else in the folder is removed). Answers how many files it made.
/// On an error the files made so far are kept and the next top-up goes on.
pub(crate) fn fill(dir: &Path) -> io::Result<usize> {
    let made = fill_inner(dir);
    with_pool(dir, |p| {
        p.filling = false;
        p.failed_at = made.is_err().then(std::time::Instant::now);
    });
    made
}

fn fill_inner(dir: &Path) -> io::Result<usize> {
    let spares = dir.join(SPARES_DIR);
    use std::os::unix::fs::DirBuilderExt;
    match std::fs::DirBuilder::new().mode(0o700).create(&spares) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e),
    }
    if !with_pool(dir, |p| std::mem::replace(&mut p.adopted, true)) {
        let left = adopt(&spares)?;
        with_pool(dir, |p| p.files.extend(left));
    }
    let mut made = 0;
    let pid = std::process::id();
    let mut n: u64 = 0;
    while with_pool(dir, |p| p.files.len()) < TARGET {
        n += 1;
        let file = spares.join(format!("{pid}-{}-{n}", now_nanos()));
        match broca_io::fs::create_new(&file, 0o600) {
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(e),
        }
        with_pool(dir, |p| p.files.push(file));
        made += 1;
    }
    debug_assert!(made <= TARGET, "a top-up makes at most the pool's target");
    Ok(made)
}

/// The empty regular files a previous process left in `spares`; anything else there is
/// removed (nothing but broca's spares belongs in the folder).
fn adopt(spares: &Path) -> io::Result<Vec<PathBuf>> {
    let mut kept = Vec::new();
    for entry in std::fs::read_dir(spares)? {
        let entry = entry?;
        let path = entry.path();
        let meta = std::fs::symlink_metadata(&path)?;
        if meta.is_file() && meta.len() == 0 && kept.len() < TARGET {
            kept.push(path);
        } else if meta.is_dir() {
            tracing::warn!(path = %path.display(), "left alone: a folder among the WAL spares");
        } else {
            std::fs::remove_file(&path)?;
        }
    }
    Ok(kept)
}

fn now_nanos() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_wal_takes_a_spare_and_a_taken_path_keeps_it() {
        let dir = tempfile::tempdir().unwrap();
        let wal = dir.path().join("a.wal");
        assert_eq!(take(dir.path(), &wal).unwrap(), Taken::None);
        assert!(wants_fill(dir.path()));
        assert!(!wants_fill(dir.path()), "one top-up at a time");
        assert_eq!(fill(dir.path()).unwrap(), TARGET);
        assert_eq!(take(dir.path(), &wal).unwrap(), Taken::Created);
        let folder = std::fs::metadata(dir.path().join(SPARES_DIR)).unwrap();
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(folder.permissions().mode() & 0o777, 0o700);
        let meta = std::fs::metadata(&wal).unwrap();
        assert_eq!(meta.len(), 0);
        assert_eq!(meta.permissions().mode() & 0o777, 0o600);
        std::fs::write(&wal, b"a session's bytes").unwrap();
        assert_eq!(take(dir.path(), &wal).unwrap(), Taken::Exists);
        assert_eq!(std::fs::read(&wal).unwrap(), b"a session's bytes");
        let left = std::fs::read_dir(dir.path().join(SPARES_DIR))
            .unwrap()
            .count();
        assert_eq!(left, TARGET - 1, "the refused spare stays");
    }

    #[test]
    fn a_failed_top_up_is_not_tried_again_at_once() {
        let dir = tempfile::tempdir().unwrap();
        // The spares' folder cannot be made: a file is in its place.
        std::fs::write(dir.path().join(SPARES_DIR), b"").unwrap();
        assert!(wants_fill(dir.path()));
        assert!(fill(dir.path()).is_err());
        assert!(!wants_fill(dir.path()), "a failure rests the top-up");
        let wal = dir.path().join("a.wal");
        assert_eq!(take(dir.path(), &wal).unwrap(), Taken::None);
        with_pool(dir.path(), |p| {
            p.failed_at = Some(std::time::Instant::now() - RETRY_AFTER)
        });
        assert!(wants_fill(dir.path()), "tried again once the rest is over");
    }

    #[test]
    fn a_new_process_adopts_empty_spares_and_removes_the_rest() {
        let dir = tempfile::tempdir().unwrap();
        let spares = dir.path().join(SPARES_DIR);
        std::fs::create_dir(&spares).unwrap();
        std::fs::write(spares.join("left-empty"), b"").unwrap();
        std::fs::write(spares.join("left-written"), b"x").unwrap();
        let adopted = adopt(&spares).unwrap();
        assert_eq!(adopted, vec![spares.join("left-empty")]);
        assert!(!spares.join("left-written").exists());
    }
}
