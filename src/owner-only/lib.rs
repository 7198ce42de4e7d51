//! Owner-only private state (the brief's broca-owner-only role): folders created 0700 and
//! files 0600, and the check that refuses a state dir others could tamper with.

use std::fs;
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;

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

/// Refuses `dir` when group or others may write it, or another user owns it. `Err` is one
/// line naming the folder, the problem and the fix.
pub fn check_dir(dir: &Path) -> Result<(), String> {
    let meta = fs::metadata(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    if !meta.is_dir() {
        return Err(format!("{} is not a folder", dir.display()));
    }
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    if meta.uid() != me {
        return Err(format!(
            "{} belongs to uid {}, not to this user (uid {me}); use a state dir of your own",
            dir.display(),
            meta.uid()
        ));
    }
    let mode = meta.permissions().mode() & 0o777;
    if mode & 0o022 != 0 {
        return Err(format!(
            "{} is writable by group or others (mode {mode:03o}); run `chmod 700 {}`",
            dir.display(),
            dir.display()
        ));
    }
    Ok(())
}

/// Reads a private file (credentials, caches): refused when group or others may read or
/// write it, or another user owns it. `Err` is one line naming the file, the problem and the
/// fix; it never includes the contents.
pub fn read_private(path: &Path) -> Result<Vec<u8>, String> {
    let meta = fs::metadata(path).map_err(|e| format!("{}: {e}", path.display()))?;
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    if meta.uid() != me {
        return Err(format!(
            "{} belongs to uid {}, not to this user (uid {me})",
            path.display(),
            meta.uid()
        ));
    }
    let mode = meta.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        return Err(format!(
            "{} may be read or written by group or others (mode {mode:03o}); run `chmod 600 {}`",
            path.display(),
            path.display()
        ));
    }
    fs::read(path).map_err(|e| format!("{}: {e}", path.display()))
}

/// Writes `bytes` to `path` owner-only (0600) through a temporary file and a rename, so a
/// reader sees the old contents or the new, never a part.
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
    fs::rename(&tmp, path)
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
        assert!(check_dir(&state).unwrap_err().contains("chmod 700"));
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
        assert!(err.contains("chmod 600") && !err.contains("\"a\""), "{err}");
    }
}
