//! File-system helpers the log file builds on: alignment probing, O_DIRECT support probing,
//! directory fsync and exclusive advisory locks.

use std::ffi::CString;
use std::fs::File;
use std::io;
use std::os::fd::RawFd;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// The smallest O_DIRECT alignment broca ever uses, whatever a probe says.
pub const ALIGNMENT_MIN: u64 = 512;
/// The largest alignment broca accepts from a probe.
pub const ALIGNMENT_MAX: u64 = 64 * 1024;

/// Asks the kernel (statx with STATX_DIOALIGN) which file-offset alignment O_DIRECT needs for
/// the file at `path`. Returns `None` when the kernel or file system does not say.
pub fn probe_dio_alignment(path: &Path) -> Option<u64> {
    let c_path = CString::new(path.as_os_str().as_bytes()).ok()?;
    // SAFETY: statx is plain data; a zeroed value is a valid initial state.
    let mut stx: libc::statx = unsafe { std::mem::zeroed() };
    // SAFETY: c_path is a valid NUL-terminated string and stx a valid out-pointer.
    let rc = unsafe {
        libc::statx(
            libc::AT_FDCWD,
            c_path.as_ptr(),
            0,
            libc::STATX_DIOALIGN,
            &mut stx,
        )
    };
    if rc != 0 || stx.stx_mask & libc::STATX_DIOALIGN == 0 {
        return None;
    }
    let align = u64::from(stx.stx_dio_offset_align);
    if align == 0 {
        return None; // the file system does not support O_DIRECT on this file
    }
    Some(align.clamp(ALIGNMENT_MIN, ALIGNMENT_MAX))
}

/// Tries to open `path` with O_DIRECT. `Ok(false)` means the file system refused O_DIRECT
/// (EINVAL), so the caller must fall back to buffered I/O.
pub fn supports_o_direct(path: &Path) -> io::Result<bool> {
    use std::os::unix::fs::OpenOptionsExt;
    match std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(path)
    {
        Ok(_) => Ok(true),
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => Ok(false),
        Err(e) => Err(e),
    }
}

/// Whether an OS error number says no file descriptor is left (the process's or the
/// system's).
pub fn out_of_descriptors(os_error: Option<i32>) -> bool {
    matches!(os_error, Some(libc::EMFILE | libc::ENFILE))
}

/// Whether an OS error number says the file system is full (no space, or the user's quota).
pub fn storage_full(os_error: Option<i32>) -> bool {
    matches!(os_error, Some(libc::ENOSPC | libc::EDQUOT))
}

/// fsyncs the directory `dir`, so that a file just created in it survives a crash (and, in
/// the power-loss mode, says so to its ledger).
pub fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()?;
    crate::power_loss::note_dir_synced(dir)
}

/// Creates `path` if nothing is there (mode `mode`), open for reading and writing: its
/// directory entry is durable only after [`sync_dir`] of its folder.
pub fn create_new(path: &Path, mode: u32) -> io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(path)?;
    crate::power_loss::note_created(path)?;
    Ok(f)
}

/// Renames `from` to `to`: the new entry is durable only after [`sync_dir`] of `to`'s folder.
pub fn rename(from: &Path, to: &Path) -> io::Result<()> {
    std::fs::rename(from, to)?;
    crate::power_loss::note_created(to)
}

/// Replaces `path` with `bytes` (mode `mode`) through a temporary file beside it, synced,
/// renamed over it, and the folder synced: a reader, and a restart after a crash or a power
/// cut, sees the old contents or the new, never a part.
pub fn replace_file(path: &Path, bytes: &[u8], mode: u32) -> io::Result<()> {
    use std::io::Write;
    let tmp = path.with_extension("tmp");
    let _ = std::fs::remove_file(&tmp);
    let mut f = create_new(&tmp, mode)?;
    f.write_all(bytes)?;
    f.sync_all()?;
    rename(&tmp, path)?;
    sync_dir(
        path.parent()
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or(Path::new(".")),
    )
}

/// Renames `from` to `to` unless something is at `to` (then `AlreadyExists`, and `from` is
/// left where it was): the new entry is durable only after [`sync_dir`] of `to`'s folder.
pub fn rename_new(from: &Path, to: &Path) -> io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let c = |p: &Path| {
        std::ffi::CString::new(p.as_os_str().as_bytes())
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a path with a NUL byte"))
    };
    let (f, t) = (c(from)?, c(to)?);
    // SAFETY: both are NUL-terminated paths that live across the call.
    let rc = unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            f.as_ptr(),
            libc::AT_FDCWD,
            t.as_ptr(),
            libc::RENAME_NOREPLACE,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    crate::power_loss::note_created(to)
}

/// Links `to` to the file `from`: the new entry is durable only after [`sync_dir`] of `to`'s
/// folder.
pub fn hard_link(from: &Path, to: &Path) -> io::Result<()> {
    std::fs::hard_link(from, to)?;
    crate::power_loss::note_created(to)
}

/// Takes an exclusive advisory lock (`flock`) on `fd` without waiting; `Ok(false)` means
/// another holder has it. flock locks belong to the open file description, so two opens of one
/// file conflict even inside one process, across threads; the lock lasts until the description
/// is closed, and the kernel drops it when the process dies.
pub fn try_flock(fd: RawFd) -> io::Result<bool> {
    // SAFETY: flock only reads the descriptor number; a closed one yields EBADF.
    let rc = unsafe { libc::flock(fd, libc::LOCK_EX | libc::LOCK_NB) };
    if rc == 0 {
        return Ok(true);
    }
    let err = io::Error::last_os_error();
    if err.raw_os_error() == Some(libc::EWOULDBLOCK) {
        Ok(false)
    } else {
        Err(err)
    }
}

/// The (device, inode) identity of an open descriptor, to tell whether a path still names the
/// file a writer holds.
pub fn fd_identity(fd: RawFd) -> io::Result<(u64, u64)> {
    // SAFETY: fstat writes a plain struct; a zeroed one is a valid initial value.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: st is a valid out-pointer; a bad descriptor yields EBADF.
    if unsafe { libc::fstat(fd, &mut st) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok((st.st_dev, st.st_ino))
}

/// The (device, inode) identity of the file `path` names now.
pub fn path_identity(path: &Path) -> io::Result<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(path)?;
    Ok((meta.dev(), meta.ino()))
}

/// Rounds `value` down to a multiple of `align` (a power of two).
pub fn align_down(value: u64, align: u64) -> u64 {
    debug_assert!(align.is_power_of_two());
    value & !(align - 1)
}

/// Rounds `value` up to a multiple of `align` (a power of two).
pub fn align_up(value: u64, align: u64) -> u64 {
    debug_assert!(align.is_power_of_two());
    (value + align - 1) & !(align - 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alignment_rounding() {
        assert_eq!(align_down(1023, 512), 512);
        assert_eq!(align_up(1023, 512), 1024);
        assert_eq!(align_up(1024, 512), 1024);
        assert_eq!(align_down(0, 4096), 0);
    }

    #[test]
    fn a_second_lock_on_one_file_is_refused_until_the_first_is_closed() {
        use std::os::fd::AsRawFd;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, b"x").unwrap();
        let first = File::open(&path).unwrap();
        assert!(try_flock(first.as_raw_fd()).unwrap());
        let second = File::open(&path).unwrap();
        assert!(!try_flock(second.as_raw_fd()).unwrap());
        assert_eq!(
            fd_identity(first.as_raw_fd()).unwrap(),
            fd_identity(second.as_raw_fd()).unwrap()
        );
        drop(first);
        assert!(try_flock(second.as_raw_fd()).unwrap());
    }

    #[test]
    fn probe_reports_a_power_of_two_alignment_on_a_real_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, b"x").unwrap();
        if let Some(align) = probe_dio_alignment(&path) {
            assert!(align.is_power_of_two());
            assert!(align >= ALIGNMENT_MIN);
        }
    }
}
