//! The two ways a log file reaches the disk: O_DIRECT through glommio's DMA files (the normal
//! case), or buffered writes where the file system refuses O_DIRECT (a logged fallback).

use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::path::Path;

use glommio::io::{BufferedFile, DmaFile, OpenOptions};

/// An open log file, direct or buffered. The owner's `flock` lease is taken on this one
/// descriptor; dropping or closing the backend releases it at once (glommio closes a dropped
/// file later, in the background, and a reopen in this process must not find the lock held).
pub(crate) struct Backend {
    /// `None` only inside `close`.
    file: Option<Kind>,
    /// The power-loss mode: writes held in memory until their `fdatasync` (crash tests only).
    volatile: Option<(crate::power_loss::Volatile, std::time::Duration)>,
}

enum Kind {
    Direct(DmaFile),
    Buffered(BufferedFile),
}

impl Kind {
    fn raw_fd(&self) -> RawFd {
        match self {
            Kind::Direct(f) => f.as_raw_fd(),
            Kind::Buffered(f) => f.as_raw_fd(),
        }
    }
}

impl Drop for Backend {
    fn drop(&mut self) {
        if let Some(file) = &self.file {
            unlock(file.raw_fd());
        }
    }
}

/// Releases any `flock` held through `fd` (a no-op when none is).
fn unlock(fd: RawFd) {
    // SAFETY: the descriptor is open (its owner has not closed it yet).
    unsafe { libc::flock(fd, libc::LOCK_UN) };
}

/// glommio's error as an `io::Error`; an OS error stays one (its number is kept, so that
/// running out of descriptors can be told apart; the caller names the path and the call).
fn io_err<T>(e: glommio::GlommioError<T>) -> io::Error {
    match e.raw_os_error() {
        Some(code) => io::Error::from_raw_os_error(code),
        None => io::Error::from(e),
    }
}

/// glommio reads a block device's properties from sysfs at a thread's first O_DIRECT open of
/// a file on it, and panics when it cannot (with no descriptor left, say). Opening one probe
/// file in `dir` at a shard's start caches them, so that a later open on a thread out of
/// descriptors fails as an error instead. The probe is an unnamed file (`O_TMPFILE`, opened
/// again through `/proc/self/fd`), so that nobody listing `dir` ever sees it; where the file
/// system has no unnamed files it is `name`, removed at once. A file system that refuses
/// O_DIRECT is no error (its logs are written buffered).
pub async fn warm_device_cache(dir: &Path, name: &str) -> io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let unnamed = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_TMPFILE)
        .mode(0o600)
        .open(dir);
    let (path, _held, named): (std::path::PathBuf, Option<std::fs::File>, bool) = match unnamed {
        Ok(f) if Path::new("/proc/self/fd").exists() => (
            format!("/proc/self/fd/{}", f.as_raw_fd()).into(),
            Some(f),
            false,
        ),
        _ => {
            let path = dir.join(name);
            std::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .mode(0o600)
                .open(&path)?;
            (path, None, true)
        }
    };
    let opened = OpenOptions::new().read(true).dma_open(&path).await;
    if named {
        let _ = std::fs::remove_file(&path);
    }
    match opened {
        Ok(f) => {
            let _ = f.close().await;
            Ok(())
        }
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => Ok(()),
        Err(e) => Err(io_err(e)),
    }
}

impl Backend {
    pub(crate) async fn open(
        path: &Path,
        direct: bool,
        power_loss: Option<&crate::power_loss::PowerLoss>,
    ) -> io::Result<Backend> {
        let mut opts = OpenOptions::new();
        opts.read(true).write(true);
        let file = if direct {
            // glommio reads the file system's type by the path after it opened the file (a
            // statfs, and it panics when the path is gone by then: a pack removing an idle WAL
            // at that moment took a shard down). It is handed a path that names the open file
            // itself, whatever becomes of the directory entry; the writer's fence then sees a
            // path that no longer names its file, as for any other removal.
            let pinned = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open(path)?;
            let named = format!("/proc/self/fd/{}", pinned.as_raw_fd());
            let named = if Path::new(&named).exists() {
                std::path::PathBuf::from(named)
            } else {
                path.to_path_buf() // no /proc: the plain path, as before
            };
            let dma = opts.dma_open(&named).await.map_err(io_err);
            drop(pinned);
            Kind::Direct(dma?)
        } else {
            Kind::Buffered(opts.buffered_open(path).await.map_err(io_err)?)
        };
        Ok(Backend {
            file: Some(file),
            volatile: power_loss.map(|p| (Default::default(), p.sync_delay)),
        })
    }

    fn kind(&self) -> &Kind {
        self.file
            .as_ref()
            .expect("a backend is used only before close takes its file")
    }

    pub(crate) fn is_direct(&self) -> bool {
        matches!(self.kind(), Kind::Direct(_))
    }

    /// The O_DIRECT alignment glommio found for the device (at least 512), if direct.
    pub(crate) fn device_alignment(&self) -> Option<u64> {
        match self.kind() {
            Kind::Direct(f) => Some(f.alignment()),
            Kind::Buffered(_) => None,
        }
    }

    /// The file's length, asked of the open descriptor (glommio's `file_size` asks the path,
    /// which names a descriptor that is closed once the file is open: see `open`).
    pub(crate) async fn len(&self) -> io::Result<u64> {
        // SAFETY: fstat on this backend's open descriptor into a zeroed stat buffer.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        if unsafe { libc::fstat(self.raw_fd(), &mut st) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(st.st_size as u64)
    }

    /// Reads the whole file on the executor's blocking pool (a plain buffered read: recovery
    /// reads each file once, and O_DIRECT reads gain nothing there).
    pub(crate) async fn read_all(path: &Path) -> io::Result<Vec<u8>> {
        let path = path.to_path_buf();
        crate::blocking::run(crate::blocking::Kind::LogRead, move || std::fs::read(path)).await
    }

    pub(crate) fn raw_fd(&self) -> RawFd {
        self.kind().raw_fd()
    }

    /// Writes `len` bytes at `pos` (both aligned), filled by `fill` in one buffer: exactly one
    /// write. `Submit::Ring` goes through io_uring; `Submit::Inline` is a plain `pwrite` on
    /// this thread. A short write is an error.
    pub(crate) async fn write_filled(
        &self,
        pos: u64,
        len: usize,
        submit: Submit,
        fill: impl FnOnce(&mut [u8]),
    ) -> io::Result<()> {
        if let Some((held, _)) = &self.volatile {
            let mut buf = vec![0u8; len];
            fill(&mut buf);
            held.hold(pos, buf);
            return Ok(());
        }
        let written = match (self.kind(), submit) {
            (Kind::Direct(f), Submit::Ring) => {
                let mut buf = f.alloc_dma_buffer(len);
                fill(buf.as_bytes_mut());
                f.write_at(buf, pos).await.map_err(io_err)?
            }
            (Kind::Direct(f), Submit::Inline) => {
                let mut buf = f.alloc_dma_buffer(len);
                fill(buf.as_bytes_mut());
                pwrite_all(self.raw_fd(), buf.as_bytes(), pos)?
            }
            (Kind::Buffered(f), Submit::Ring) => {
                let mut buf = vec![0u8; len];
                fill(&mut buf);
                f.write_at(buf, pos).await.map_err(io_err)?
            }
            (Kind::Buffered(_), Submit::Inline) => {
                let mut buf = vec![0u8; len];
                fill(&mut buf);
                pwrite_all(self.raw_fd(), &buf, pos)?
            }
        };
        if written != len {
            return Err(io::Error::new(
                io::ErrorKind::WriteZero,
                format!("short write at offset {pos}: {written} of {len} bytes"),
            ));
        }
        Ok(())
    }

    pub(crate) async fn fdatasync(&self, submit: Submit) -> io::Result<()> {
        if let Some((held, delay)) = &self.volatile {
            // A slow disk: the writes reach the file only now, then the real sync.
            if !delay.is_zero() {
                glommio::timer::sleep(*delay).await;
            }
            for (pos, bytes) in held.take() {
                let n = pwrite_aligned(self.raw_fd(), &bytes, pos)?;
                if n != bytes.len() {
                    return Err(io::Error::new(
                        io::ErrorKind::WriteZero,
                        format!("short write at offset {pos}"),
                    ));
                }
            }
        }
        if submit == Submit::Inline {
            // SAFETY: the descriptor is open for the life of self.
            let rc = unsafe { libc::fdatasync(self.raw_fd()) };
            return if rc == 0 {
                Ok(())
            } else {
                Err(io::Error::last_os_error())
            };
        }
        match self.kind() {
            Kind::Direct(f) => f.fdatasync().await.map_err(io_err),
            Kind::Buffered(f) => f.fdatasync().await.map_err(io_err),
        }
    }

    pub(crate) async fn close(mut self) -> io::Result<()> {
        let Some(file) = self.file.take() else {
            return Ok(());
        };
        unlock(file.raw_fd());
        match file {
            Kind::Direct(f) => f.close().await.map_err(io_err),
            Kind::Buffered(f) => f.close().await.map_err(io_err),
        }
    }
}

/// How a write or sync is issued.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Submit {
    /// Through the executor's io_uring: many logs' batches overlap.
    Ring,
    /// A plain system call on this thread: for a lone batch, it saves the ring's hand-offs
    /// (the fsync's trip through the kernel's async workers costs tens of microseconds).
    Inline,
}

fn pwrite_all(fd: RawFd, mut buf: &[u8], mut pos: u64) -> io::Result<usize> {
    let total = buf.len();
    while !buf.is_empty() {
        // SAFETY: buf is valid for buf.len() bytes; fd is open.
        let n = unsafe { libc::pwrite(fd, buf.as_ptr().cast(), buf.len(), pos as libc::off_t) };
        if n < 0 {
            let err = io::Error::last_os_error();
            if err.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(err);
        }
        if n == 0 {
            break;
        }
        buf = &buf[n as usize..];
        pos += n as u64;
    }
    Ok(total - buf.len())
}

/// `pwrite_all` from a copy in memory aligned for O_DIRECT (the held writes of the power-loss
/// mode are plain vectors).
fn pwrite_aligned(fd: RawFd, bytes: &[u8], pos: u64) -> io::Result<usize> {
    if bytes.is_empty() {
        return Ok(0);
    }
    let layout = std::alloc::Layout::from_size_align(bytes.len(), 4096)
        .map_err(|e| io::Error::other(e.to_string()))?;
    // SAFETY: a non-zero size; the buffer is freed below on every path.
    let buf = unsafe { std::alloc::alloc(layout) };
    if buf.is_null() {
        return Err(io::Error::other("out of memory"));
    }
    // SAFETY: `buf` holds `bytes.len()` bytes and does not overlap `bytes`.
    let aligned = unsafe {
        std::ptr::copy_nonoverlapping(bytes.as_ptr(), buf, bytes.len());
        std::slice::from_raw_parts(buf, bytes.len())
    };
    let result = pwrite_all(fd, aligned, pos);
    // SAFETY: allocated above with this layout.
    unsafe { std::alloc::dealloc(buf, layout) };
    result
}

#[cfg(test)]
mod tests {
    /// The probe never names a file in the WAL directory (a lister there, `broca wal dump`
    /// over every file, a count of the session files, saw it while a shard started): a
    /// directory squatting on the fallback name is left alone and the probe still opens.
    #[test]
    fn the_device_probe_leaves_no_name_in_its_directory() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join(".probe")).unwrap();
        let dir_path = dir.path().to_path_buf();
        let probed = glommio::LocalExecutorBuilder::new(glommio::Placement::Unbound)
            .make()
            .unwrap()
            .run(async move { super::warm_device_cache(&dir_path, ".probe").await });
        probed.unwrap();
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, vec![std::ffi::OsString::from(".probe")]);
        assert!(dir.path().join(".probe").is_dir());
    }
}
