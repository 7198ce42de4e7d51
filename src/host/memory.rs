//! The process's memory by kind, for /metrics' `broca_memory_bytes` (docs/metrics.md): what
//! is anonymous (heap, stacks: what grows with sessions), the store's LMDB map (file-backed,
//! the kernel reclaims it under pressure), the other file-backed pages (the binary and its
//! libraries), and apart from the process's resident set, the kernel's page cache of the WAL
//! files (the WALs are appended with O_DIRECT; readers' buffered reads fill it). Read from
//! /proc/self/smaps and, per WAL file, the `cachestat` system call (Linux 6.5 and later).

use std::path::Path;

/// Memory by kind, in bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Memory {
    pub resident: u64,
    pub anonymous: u64,
    /// Resident pages of the store's map (`store/data.mdb`).
    pub store_map: u64,
    /// Other resident file-backed pages.
    pub file: u64,
    /// The page cache holding the WAL files (`None`: the kernel has no `cachestat`).
    pub wal_page_cache: Option<u64>,
}

/// How many WAL files are looked at, at most (a larger state dir reports the first ones).
const WAL_FILES_MAX: usize = 100_000;

/// Measures it now (blocking: run it on the blocking pool).
pub fn measure(wal_dir: &Path) -> Memory {
    let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap_or_default();
    let mut m = by_mapping(&smaps);
    m.wal_page_cache = wal_page_cache(wal_dir);
    m
}

/// Sums `/proc/self/smaps` by kind of mapping.
fn by_mapping(smaps: &str) -> Memory {
    let mut m = Memory::default();
    let mut store = false;
    for line in smaps.lines() {
        let mut words = line.split_whitespace();
        let Some(first) = words.next() else {
            continue;
        };
        if !first.ends_with(':') {
            // A mapping's header: range, perms, offset, device, inode, path.
            store = line.trim_end().ends_with("/store/data.mdb");
            continue;
        }
        let kib = || words.clone().next().and_then(|n| n.parse::<u64>().ok());
        match first {
            "Rss:" => {
                let bytes = kib().unwrap_or(0) * 1024;
                m.resident += bytes;
                if store {
                    m.store_map += bytes;
                }
            }
            "Anonymous:" => m.anonymous += kib().unwrap_or(0) * 1024,
            _ => {}
        }
    }
    m.file = m.resident.saturating_sub(m.anonymous + m.store_map);
    m
}

/// The kernel's `struct cachestat`.
#[repr(C)]
#[derive(Default)]
struct CacheStat {
    nr_cache: u64,
    nr_dirty: u64,
    nr_writeback: u64,
    nr_evicted: u64,
    nr_recently_evicted: u64,
}

/// The kernel's `struct cachestat_range` (a zero length: to the end of the file).
#[repr(C)]
struct CacheStatRange {
    off: u64,
    len: u64,
}

/// `cachestat`'s number on x86_64 and aarch64 (the same in the generic table).
const SYS_CACHESTAT: libc::c_long = 451;

/// Bytes of the WAL files in the page cache; `None` when the kernel cannot say.
fn wal_page_cache(wal_dir: &Path) -> Option<u64> {
    use std::os::fd::AsRawFd;
    let files = broca_wal::listing::wal_dir_files(wal_dir).ok()?;
    // SAFETY: sysconf reads a constant of the system.
    let page = u64::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap_or(4096);
    let mut pages = 0u64;
    for path in files.iter().take(WAL_FILES_MAX) {
        let Ok(f) = std::fs::File::open(path) else {
            continue; // deleted meanwhile
        };
        let range = CacheStatRange { off: 0, len: 0 };
        let mut stat = CacheStat::default();
        // SAFETY: the descriptor is open for the call, and both structs are the kernel's
        // layout and live across it.
        let rc = unsafe {
            libc::syscall(
                SYS_CACHESTAT,
                f.as_raw_fd(),
                &range as *const CacheStatRange,
                &mut stat as *mut CacheStat,
                0u32,
            )
        };
        if rc != 0 {
            return None; // ENOSYS: an older kernel
        }
        pages += stat.nr_cache;
    }
    Some(pages * page)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn smaps_are_summed_by_kind_of_mapping() {
        let smaps = "\
55d0-55e0 r-xp 00000000 08:01 12 /usr/bin/broca
Rss:                 100 kB
Anonymous:             0 kB
7f00-7f10 rw-p 00000000 00:00 0
Rss:                 300 kB
Anonymous:           300 kB
7f20-7f30 rw-s 00000000 08:01 99 /var/lib/broca/store/data.mdb
Rss:                  40 kB
Anonymous:             0 kB
";
        let m = by_mapping(smaps);
        assert_eq!(m.resident, 440 * 1024);
        assert_eq!(m.anonymous, 300 * 1024);
        assert_eq!(m.store_map, 40 * 1024);
        assert_eq!(m.file, 100 * 1024);
    }

    #[test]
    fn the_page_cache_of_a_wal_read_is_counted() {
        let dir = tempfile::tempdir().unwrap();
        let wal = dir.path().join("00112233445566778899aabbccddeeff.wal");
        std::fs::write(&wal, vec![7u8; 1 << 20]).unwrap();
        let _ = std::fs::read(&wal).unwrap();
        match wal_page_cache(dir.path()) {
            // A buffered write and read leave the file's pages cached.
            Some(bytes) => assert!(bytes >= 1 << 19, "{bytes}"),
            None => eprintln!("this kernel has no cachestat"),
        }
    }
}
