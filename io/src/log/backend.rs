//! The two ways a log file reaches the disk: O_DIRECT through glommio's DMA files (the normal
//! case), or buffered writes where the file system refuses O_DIRECT (a logged fallback).

use std::io;
use std::path::Path;

use glommio::io::{BufferedFile, DmaFile, OpenOptions};

/// An open log file, direct or buffered.
pub(crate) enum Backend {
    Direct(DmaFile),
    Buffered(BufferedFile),
}

fn io_err<T>(e: glommio::GlommioError<T>) -> io::Error {
    io::Error::from(e)
}

impl Backend {
    pub(crate) async fn open(path: &Path, direct: bool) -> io::Result<Backend> {
        let mut opts = OpenOptions::new();
        opts.read(true).write(true);
        if direct {
            Ok(Backend::Direct(opts.dma_open(path).await.map_err(io_err)?))
        } else {
            Ok(Backend::Buffered(
                opts.buffered_open(path).await.map_err(io_err)?,
            ))
        }
    }

    pub(crate) fn is_direct(&self) -> bool {
        matches!(self, Backend::Direct(_))
    }

    /// The O_DIRECT alignment glommio found for the device (at least 512), if direct.
    pub(crate) fn device_alignment(&self) -> Option<u64> {
        match self {
            Backend::Direct(f) => Some(f.alignment()),
            Backend::Buffered(_) => None,
        }
    }

    pub(crate) async fn len(&self) -> io::Result<u64> {
        match self {
            Backend::Direct(f) => f.file_size().await.map_err(io_err),
            Backend::Buffered(f) => f.file_size().await.map_err(io_err),
        }
    }

    /// Reads the whole file on the executor's blocking pool (a plain buffered read: recovery
    /// reads each file once, and O_DIRECT reads gain nothing there).
    pub(crate) async fn read_all(path: &Path) -> io::Result<Vec<u8>> {
        let path = path.to_path_buf();
        glommio::executor()
            .spawn_blocking(move || std::fs::read(path))
            .await
    }

    /// Writes `len` bytes at `pos` (both aligned), filled by `fill` in one buffer: exactly one
    /// write system call. A short write is an error.
    pub(crate) async fn write_filled(
        &self,
        pos: u64,
        len: usize,
        fill: impl FnOnce(&mut [u8]),
    ) -> io::Result<()> {
        let written = match self {
            Backend::Direct(f) => {
                let mut buf = f.alloc_dma_buffer(len);
                fill(buf.as_bytes_mut());
                f.write_at(buf, pos).await.map_err(io_err)?
            }
            Backend::Buffered(f) => {
                let mut buf = vec![0u8; len];
                fill(&mut buf);
                f.write_at(buf, pos).await.map_err(io_err)?
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

    pub(crate) async fn fdatasync(&self) -> io::Result<()> {
        match self {
            Backend::Direct(f) => f.fdatasync().await.map_err(io_err),
            Backend::Buffered(f) => f.fdatasync().await.map_err(io_err),
        }
    }

    pub(crate) async fn close(self) -> io::Result<()> {
        match self {
            Backend::Direct(f) => f.close().await.map_err(io_err),
            Backend::Buffered(f) => f.close().await.map_err(io_err),
        }
    }
}
