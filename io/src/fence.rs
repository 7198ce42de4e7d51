//! The stale-writer fence, kept off the hot path. A writer must never acknowledge bytes that no
//! longer land in the file its path names (the file was replaced or removed by someone else).
//! Checking the path with `stat` before every batch measurably slows the `fdatasync` that
//! follows on ext4 (BENCHMARKS.md), so each shard watches its log directories with inotify
//! instead: a batch reads the watch (one non-blocking `read`, normally EAGAIN) and stats its
//! path only after something in the directory was created, moved or removed.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::ffi::CString;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::rc::{Rc, Weak};

const WATCH_MASK: u32 = libc::IN_CREATE
    | libc::IN_DELETE
    | libc::IN_MOVED_FROM
    | libc::IN_MOVED_TO
    | libc::IN_DELETE_SELF
    | libc::IN_MOVE_SELF
    | libc::IN_ATTRIB;

/// An inotify watch on one directory, shared by the logs of one thread in that directory.
pub struct DirWatch {
    fd: libc::c_int,
    /// Bumped whenever an event arrives (or the event queue overflowed).
    generation: Cell<u64>,
}

thread_local! {
    static WATCHES: RefCell<HashMap<PathBuf, Weak<DirWatch>>> = RefCell::new(HashMap::new());
}

impl DirWatch {
    /// This thread's watch on `dir`, created on first use. `None` where inotify is unavailable
    /// (then the caller checks the path on every batch).
    pub fn for_dir(dir: &Path) -> Option<Rc<DirWatch>> {
        WATCHES.with(|w| {
            let mut watches = w.borrow_mut();
            if let Some(existing) = watches.get(dir).and_then(Weak::upgrade) {
                return Some(existing);
            }
            match DirWatch::new(dir) {
                Ok(watch) => {
                    let watch = Rc::new(watch);
                    watches.retain(|_, weak| weak.strong_count() > 0);
                    watches.insert(dir.to_path_buf(), Rc::downgrade(&watch));
                    Some(watch)
                }
                Err(e) => {
                    tracing::warn!(
                        dir = %dir.display(),
                        error = %e,
                        "inotify unavailable; the stale-writer fence checks the path every batch"
                    );
                    None
                }
            }
        })
    }

    fn new(dir: &Path) -> io::Result<DirWatch> {
        let c_dir = CString::new(dir.as_os_str().as_bytes())
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "NUL in path"))?;
        // SAFETY: plain system calls with valid arguments; the fd is owned by the DirWatch.
        let fd = unsafe { libc::inotify_init1(libc::IN_NONBLOCK | libc::IN_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: fd is a valid inotify descriptor and c_dir a valid C string.
        if unsafe { libc::inotify_add_watch(fd, c_dir.as_ptr(), WATCH_MASK) } < 0 {
            let err = io::Error::last_os_error();
            // SAFETY: fd was opened above.
            unsafe { libc::close(fd) };
            return Err(err);
        }
        Ok(DirWatch {
            fd,
            generation: Cell::new(1),
        })
    }

    /// Drains pending events and returns the generation: it changes whenever anything in the
    /// directory was created, moved, removed or had its attributes (link count) changed.
    pub fn poll(&self) -> u64 {
        let mut buf = [0u8; 4096];
        loop {
            // SAFETY: buf is valid for its length; fd is open for the life of self.
            let n = unsafe { libc::read(self.fd, buf.as_mut_ptr().cast(), buf.len()) };
            if n <= 0 {
                break; // EAGAIN: nothing pending (or an error, which the next stat will show)
            }
            self.generation.set(self.generation.get() + 1);
        }
        self.generation.get()
    }
}

impl Drop for DirWatch {
    fn drop(&mut self) {
        // SAFETY: fd was opened by DirWatch::new and is closed once.
        unsafe { libc::close(self.fd) };
    }
}
