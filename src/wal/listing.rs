//! The WAL files of a folder, as every command that lists `wal/` sees them: regular files
//! named `*.wal`. Anything else so named (a FIFO, a device, a socket, a link, a folder) is
//! skipped with a warning: opening a FIFO would hang the command, and nothing broca writes
//! is ever one.

use std::path::{Path, PathBuf};

/// The regular `*.wal` files of `dir`, sorted by name; a missing `dir` holds none.
pub fn wal_dir_files(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let mut out = Vec::new();
    for entry in entries {
        let entry = entry?;
        let path = entry.path();
        if !path.extension().is_some_and(|x| x == "wal") {
            continue;
        }
        // The entry's own kind: a link is not followed.
        let kind = entry.file_type()?;
        match not_regular(&kind) {
            None => out.push(path),
            Some(what) => tracing::warn!(
                path = %path.display(),
                "skipped: {what}, not a WAL (a WAL is a regular file)"
            ),
        }
    }
    out.sort();
    Ok(out)
}

/// What a file of kind `kind` is, when it is not a regular file.
pub fn not_regular(kind: &std::fs::FileType) -> Option<&'static str> {
    use std::os::unix::fs::FileTypeExt;
    if kind.is_file() {
        None
    } else if kind.is_fifo() {
        Some("a FIFO")
    } else if kind.is_char_device() {
        Some("a character device")
    } else if kind.is_block_device() {
        Some("a block device")
    } else if kind.is_socket() {
        Some("a socket")
    } else if kind.is_symlink() {
        Some("a symbolic link")
    } else if kind.is_dir() {
        Some("a folder")
    } else {
        Some("not a regular file")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_regular_wal_files_are_listed() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        std::fs::write(d.join("b.wal"), b"x").unwrap();
        std::fs::write(d.join("a.wal"), b"x").unwrap();
        std::fs::write(d.join("notes.txt"), b"x").unwrap();
        std::fs::create_dir(d.join("dir.wal")).unwrap();
        std::os::unix::fs::symlink(d.join("a.wal"), d.join("link.wal")).unwrap();
        let fifo = std::ffi::CString::new(d.join("fifo.wal").to_str().unwrap()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0);
        assert_eq!(
            wal_dir_files(d).unwrap(),
            vec![d.join("a.wal"), d.join("b.wal")]
        );
        assert_eq!(
            wal_dir_files(&d.join("missing")).unwrap(),
            Vec::<PathBuf>::new()
        );
    }
}
