//! Owner-only private state (the brief's broca-owner-only role): folders created 0700 and
//! files 0600, and the check that refuses a state dir others could tamper with.
//!
//! Where things are: folders 0700, files 0600 written atomically, the state-dir check,
//! `read_private`

use std::fmt;
use std::fs;
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// Creates `dir` and its missing parents owner-only (0700).
pub fn create_dir(dir: &Path) -> std::io::Result<()> {
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|e| {
            // Name the part of the path that is in the way, rather than "File exists".
            let in_the_way = dir
                .ancestors()
                .find(|p| fs::symlink_metadata(p).is_ok_and(|m| !m.is_dir() && !m.is_symlink()));
            match in_the_way {
                Some(p) => std::io::Error::new(
                    e.kind(),
                    format!(
                        "{} is a file, not a folder; remove it or choose another path",
                        p.display()
                    ),
                ),
                None => e,
            }
        })
}

/// Why a path is refused as private state. Its display is one line naming the path, the
/// problem and the fix; it never includes a file's contents.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OwnerOnlyError {
    pub path: PathBuf,
    pub problem: Problem,
}

/// What is wrong with a path held as private state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Problem {
    /// It could not be read (missing, unreadable): the system's words.
    Io(String),
    /// A state dir that is not a folder.
    NotAFolder,
    /// Another user owns it.
    ForeignOwner { uid: u32, me: u32 },
    /// A folder group or others may write.
    FolderOpen { mode: u32 },
    /// A file group or others may read or write.
    FileOpen { mode: u32 },
}

impl fmt::Display for OwnerOnlyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let p = self.path.display();
        match &self.problem {
            Problem::Io(message) => write!(f, "{p}: {message}"),
            Problem::NotAFolder => write!(f, "{p} is not a folder"),
            Problem::ForeignOwner { uid, me } => write!(
                f,
                "{p} belongs to uid {uid}, not to this user (uid {me}); use a state dir of \
                 your own"
            ),
            Problem::FolderOpen { mode } => write!(
                f,
                "{p} is writable by group or others (mode {mode:03o}); run `chmod 700 {p}`"
            ),
            Problem::FileOpen { mode } => write!(
                f,
                "{p} may be read or written by group or others (mode {mode:03o}); run \
                 `chmod 600 {p}`"
            ),
        }
    }
}

impl std::error::Error for OwnerOnlyError {}

impl From<OwnerOnlyError> for String {
    fn from(e: OwnerOnlyError) -> String {
        e.to_string()
    }
}

fn refuse(path: &Path, problem: Problem) -> OwnerOnlyError {
    OwnerOnlyError {
        path: path.to_path_buf(),
        problem,
    }
}

/// The metadata of `path`, refused when another user owns it.
fn own_metadata(path: &Path) -> Result<fs::Metadata, OwnerOnlyError> {
    let meta = fs::metadata(path).map_err(|e| refuse(path, Problem::Io(e.to_string())))?;
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    if meta.uid() != me {
        let uid = meta.uid();
        return Err(refuse(path, Problem::ForeignOwner { uid, me }));
    }
    Ok(meta)
}

/// Refuses `dir` when group or others may write it, or another user owns it.
pub fn check_dir(dir: &Path) -> Result<(), OwnerOnlyError> {
    let meta = fs::metadata(dir).map_err(|e| refuse(dir, Problem::Io(e.to_string())))?;
    if !meta.is_dir() {
        return Err(refuse(dir, Problem::NotAFolder));
    }
    let meta = own_metadata(dir)?;
    let mode = meta.permissions().mode() & 0o777;
    if mode & 0o022 != 0 {
        return Err(refuse(dir, Problem::FolderOpen { mode }));
    }
    Ok(())
}

/// Reads a private file (credentials, caches): refused when group or others may read or
/// write it, or another user owns it.
pub fn read_private(path: &Path) -> Result<Vec<u8>, OwnerOnlyError> {
    let meta = own_metadata(path)?;
    let mode = meta.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        return Err(refuse(path, Problem::FileOpen { mode }));
    }
    fs::read(path).map_err(|e| refuse(path, Problem::Io(e.to_string())))
}

/// Writes `bytes` to `path` owner-only (0600) through a temporary file, synced, renamed over
/// it, and the folder synced, so a reader, and a restart after a crash or a power cut, sees
/// the old contents or the new, never a part. (This floor is below broca-io: the power-loss
/// mode's ledger does not see these files; the store's own go through broca-io.)
pub fn write_file(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let tmp = path.with_extension("tmp");
    let _ = fs::remove_file(&tmp);
    let mut f = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)?;
    f.write_all(bytes)?;
    f.sync_all()?;
    fs::rename(&tmp, path)?;
    let dir = path.parent().filter(|p| !p.as_os_str().is_empty());
    fs::File::open(dir.unwrap_or(Path::new(".")))?.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dir_others_can_write_is_refused_and_files_are_owner_only() {
        let d = tempfile::tempdir().unwrap();
        let state = d.path().join("a/b");
        create_dir(&state).unwrap();
        assert_eq!(
            fs::metadata(&state).unwrap().permissions().mode() & 0o777,
            0o700
        );
        check_dir(&state).unwrap();
        fs::set_permissions(&state, fs::Permissions::from_mode(0o770)).unwrap();
        let err = check_dir(&state).unwrap_err();
        assert_eq!(err.problem, Problem::FolderOpen { mode: 0o770 });
        assert!(err.to_string().contains("chmod 700"), "{err}");
        fs::set_permissions(&state, fs::Permissions::from_mode(0o700)).unwrap();
        let f = state.join("x.json");
        write_file(&f, b"{}").unwrap();
        write_file(&f, b"{\"a\":1}").unwrap();
        assert_eq!(fs::read(&f).unwrap(), b"{\"a\":1}");
        assert_eq!(
            fs::metadata(&f).unwrap().permissions().mode() & 0o777,
            0o600
        );
        assert_eq!(read_private(&f).unwrap(), b"{\"a\":1}");
        fs::set_permissions(&f, fs::Permissions::from_mode(0o640)).unwrap();
        let err = read_private(&f).unwrap_err();
        assert_eq!(err.problem, Problem::FileOpen { mode: 0o640 });
        let err = err.to_string();
        assert!(err.contains("chmod 600") && !err.contains("\"a\""), "{err}");
    }
}
