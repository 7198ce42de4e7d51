//! broca-archive: packs idle WALs into sealed, digest-verified containers under
//! `<state-dir>/wal-archive/`, and restores them. The format, the read side and the lookup are
//! broca-wal's (`broca_wal::archive`); the steps and their recovery table are in
//! docs/wal-archive.md.
//!
//! Every step keeps each session readable exactly once: a live WAL is removed only after the
//! container holding its bytes is sealed, fsynced and its directory entry durable; a restore
//! links the checked bytes in only where no live WAL is. A pack holds each WAL's lease (the
//! writers' flock) from reading it until it is removed, so no writer appends in between.
//!
//! Where things are: packs idle WALs into sealed containers (a pack may rewrite each WAL's
//! bytes first, `PackOptions::rewrite`: the reasoning prune, after which every older copy of
//! the session is taken out) and restores them (`restore.rs`; docs/wal-archive.md); takes an
//! expired session out of every container holding it (`forget.rs`)

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use broca_wal::archive::{self as format, hex, Index, MediaMember, Member};

mod forget;
mod restore;
use broca_wal::{Record, Verdict};
pub use forget::forget;
pub use restore::{restore, Restored};

/// Sessions packed and restored by this process (for `/metrics`).
pub static PACKED: AtomicU64 = AtomicU64::new(0);
pub static RESTORED: AtomicU64 = AtomicU64::new(0);

/// Members per container at most: a pack holds one descriptor per member until its
/// container is sealed.
pub const MEMBERS_PER_CONTAINER: usize = 512;
/// Bytes per container at most (a WAL larger than this gets a container of its own).
pub const CONTAINER_BYTES_MAX: u64 = 256 << 20;

/// The crash-test hook: `BROCA_CRASH_AT=archive_<step>` aborts at that step of a pack or a
/// restore (the first time it is passed).
pub const CRASH_POINTS: &[&str] = &[
    "archive_written",
    "archive_sealed",
    "archive_removed_one",
    "archive_packed",
    "archive_restore_written",
    "archive_restore_linked",
];

fn crash_point(name: &str) {
    if std::env::var("BROCA_CRASH_AT").is_ok_and(|v| v == name) {
        std::process::abort();
    }
}

/// What to pack.
#[derive(Debug, Clone, Default)]
pub struct PackOptions {
    /// A WAL not modified for this long is idle.
    pub idle: Duration,
    /// Say what would be packed; touch nothing.
    pub dry_run: bool,
    /// WALs (by file name) packed once idle this long, when it is sooner than `idle`: the
    /// sessions whose storage policy names `archive_after_days` (llm-runner/v1
    /// `session_retention`).
    pub sooner: std::collections::HashMap<String, Duration>,
    /// Pack this WAL (by file name) alone, whatever its idle time: a maintenance asked for
    /// one session now.
    pub only: Option<String>,
    /// Rewrites each chosen WAL's bytes before they are sealed (the reasoning prune,
    /// `broca_read::prune`): `Ok(None)` keeps them as they are, `Err` says why it could not
    /// (the WAL is then packed as it is). The rewritten bytes replace every older sealed copy
    /// of the session once the container holding them is durable.
    pub rewrite: Option<Rewrite>,
}

/// A rewrite of a WAL's bytes as it is packed ([`PackOptions::rewrite`]).
pub type Rewrite = fn(&[u8]) -> Result<Option<Vec<u8>>, RewriteError>;

/// Why a rewrite could not be made (the WAL is then packed as it is).
pub type RewriteError = Box<dyn std::error::Error + Send + Sync>;

/// One line of progress.
#[derive(Debug, Clone)]
pub enum Progress {
    /// `done` of `total` candidate WALs looked at.
    Looked { done: usize, total: usize },
    /// A container was sealed with this many members.
    Sealed { path: PathBuf, members: usize },
}

/// What a pack did.
#[derive(Debug, Default)]
pub struct PackReport {
    /// The WALs packed (or, in a dry run, that would be).
    pub packed: Vec<Member>,
    /// WALs left live, each with why.
    pub skipped: Vec<(String, Skip)>,
    /// The containers sealed.
    pub containers: Vec<PathBuf>,
    /// Bytes of WAL packed.
    pub bytes: u64,
    /// Temporary files of an interrupted pack that were removed.
    pub cleaned: usize,
    /// The WALs the rewrite changed.
    pub rewritten: Vec<String>,
    /// The WALs the rewrite could not change, each with why (packed as they were).
    pub not_rewritten: Vec<(String, String)>,
}

/// A WAL chosen for packing, its lease held until it is removed.
struct Chosen {
    path: PathBuf,
    /// Holds the flock.
    file: File,
    /// The file's length when it was read (its records and the space kept ahead).
    file_len: u64,
    bytes: Vec<u8>,
    member: Member,
    /// The session's media (its content store's files named by digest): digest and bytes.
    media: Vec<(String, Vec<u8>)>,
    /// The newest container already holds these exact bytes (and every medium).
    already_sealed: bool,
    /// The rewrite changed its bytes: every older sealed copy goes once they are sealed.
    rewritten: bool,
}

/// A session's content store: `media/<address>/` beside the WAL folder of `wal_path`.
fn media_dir(wal_path: &Path) -> PathBuf {
    let stem = wal_path.file_stem().unwrap_or_default();
    wal_path
        .parent()
        .and_then(Path::parent)
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."))
        .join("media")
        .join(stem)
}

/// The media of the session of `wal_path` (files named by a lowercase SHA-256), read.
fn read_media(wal_path: &Path) -> std::io::Result<Vec<(String, Vec<u8>)>> {
    let dir = media_dir(wal_path);
    let entries = match std::fs::read_dir(&dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let mut media = Vec::new();
    for e in entries {
        let e = e?;
        let name = e.file_name().to_string_lossy().into_owned();
        let digest = name.len() == 64
            && name
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
        if digest && e.file_type()?.is_file() {
            media.push((name, std::fs::read(e.path())?));
        }
    }
    media.sort();
    Ok(media)
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

fn try_flock(file: &File, how: libc::c_int) -> std::io::Result<bool> {
    // SAFETY: flock on a descriptor this function borrows; no memory is passed.
    let rc = unsafe { libc::flock(file.as_raw_fd(), how | libc::LOCK_NB) };
    if rc == 0 {
        return Ok(true);
    }
    let e = std::io::Error::last_os_error();
    if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
        Ok(false)
    } else {
        Err(e)
    }
}

pub(crate) fn sync_dir(dir: &Path) -> Result<(), Error> {
    broca_io::fs::sync_dir(dir).map_err(|e| Error::io(dir, "fsync directory", e))
}

/// The pack lock (`wal-archive/pack.lock`): one pack at a time; a writer that finds a WAL's
/// lease held while it is taken waits for the pack instead of failing.
fn pack_lock_path(archive_dir: &Path) -> PathBuf {
    archive_dir.join("pack.lock")
}

/// Whether a pack is running on `wal_dir`'s archive (a writer then waits for a held lease).
pub fn pack_running(wal_dir: &Path) -> bool {
    let path = pack_lock_path(&format::dir_of(wal_dir));
    match File::open(&path) {
        Ok(f) => matches!(try_flock(&f, libc::LOCK_SH), Ok(false)),
        Err(_) => false,
    }
}

/// The first run of the scanned WAL without a terminal record, if any (a session with a run
/// open is not packed).
fn open_run(scan: &broca_wal::Scan, bytes: &[u8]) -> Result<Option<String>, Skip> {
    let records = scan
        .decode(bytes)
        .map_err(|(seq, why)| Skip::Undecodable {
            seq,
            why: why.to_string(),
        })?
        .records;
    let mut open = std::collections::BTreeSet::new();
    for (_, r) in &records {
        match r {
            Record::RunStarted(r) => {
                open.insert(r.run_id.clone());
            }
            Record::RunFinished(r) => {
                open.remove(&r.run_id);
            }
            _ => {}
        }
    }
    Ok(open.first().cloned())
}

/// Why the WAL at `path` may not be packed now, or its chosen state.
fn choose(
    path: &Path,
    idle: Duration,
    now: SystemTime,
    rewrite: Option<Rewrite>,
    report: &mut PackReport,
) -> Result<Chosen, Skip> {
    let file_name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let io = |op: &'static str| {
        move |e: std::io::Error| Skip::Io {
            op,
            message: e.to_string(),
        }
    };
    let meta = std::fs::metadata(path).map_err(io("stat"))?;
    let modified = meta.modified().map_err(io("read the modification time"))?;
    let quiet = now.duration_since(modified).unwrap_or(Duration::ZERO);
    if quiet < idle {
        return Err(Skip::Recent { quiet, idle });
    }
    let file = OpenOptions::new()
        .read(true)
        .open(path)
        .map_err(io("open"))?;
    if !try_flock(&file, libc::LOCK_EX).map_err(io("lock"))? {
        return Err(Skip::LeaseHeld);
    }
    let mut bytes = std::fs::read(path).map_err(io("read"))?;
    let file_len = bytes.len() as u64;
    let scan = broca_wal::scan(&bytes).map_err(|e| Skip::Unreadable(e.to_string()))?;
    if let Verdict::Corrupt { .. } = scan.verdict {
        return Err(Skip::Damaged);
    }
    if let Some(run) = open_run(&scan, &bytes)? {
        return Err(Skip::OpenRun(run));
    }
    // Only the records are kept: the zeroed space a writer keeps ahead (and a torn tail,
    // which recovery would cut) is not the session's.
    bytes.truncate(scan.end as usize);
    let mut last_seq = scan.frames.last().map_or(0, |f| f.seq);
    let rewritten = match rewrite.map(|r| rewritten_bytes(r, &bytes, &file_name, report)) {
        Some(Some((new, seq))) => {
            bytes = new;
            last_seq = seq;
            true
        }
        _ => false,
    };
    let digest = hex(blake3::hash(&bytes).as_bytes());
    let media = read_media(path).map_err(io("read the session's media"))?;
    let already_sealed = sealed_already(path, &file_name, &digest, &media);
    let h = &scan.header;
    let member = Member {
        file: file_name,
        project_root: h.triple.project_root.clone(),
        harness: h.triple.harness.clone(),
        session: h.triple.session.clone(),
        lineage_id: h.lineage_hex(),
        offset: 0,
        size: bytes.len() as u64,
        blake3: digest,
        last_seq,
    };
    Ok(Chosen {
        path: path.to_path_buf(),
        file,
        file_len,
        bytes,
        member,
        media,
        already_sealed,
        rewritten,
    })
}

/// The log `bytes` of `file_name` as `rewrite` makes them, checked whole, with the seq of
/// their last record; `None` when it keeps them (its reason in `report` when it could not).
fn rewritten_bytes(
    rewrite: Rewrite,
    bytes: &[u8],
    file_name: &str,
    report: &mut PackReport,
) -> Option<(Vec<u8>, u64)> {
    match rewrite(bytes).and_then(|new| new.map(checked).transpose()) {
        Ok(Some(new)) => {
            report.rewritten.push(file_name.to_string());
            Some(new)
        }
        Ok(None) => None,
        Err(why) => {
            let why = why.to_string();
            report.not_rewritten.push((file_name.to_string(), why));
            None
        }
    }
}

/// Whether a container beside the WAL at `path` holds it with this digest and its media
/// already (a pack cut short after sealing it).
fn sealed_already(path: &Path, file_name: &str, digest: &str, media: &[(String, Vec<u8>)]) -> bool {
    let archive_dir = format::dir_of(path.parent().unwrap_or(Path::new(".")));
    format::find(&archive_dir, file_name)
        .ok()
        .flatten()
        .is_some_and(|(c, m)| {
            m.blake3 == digest
                && media
                    .iter()
                    .all(|(sha, _)| c.media_of(file_name).any(|x| &x.sha256 == sha))
        })
}

/// Rewritten bytes checked to be a whole, undamaged log: with the seq of their last record.
fn checked(bytes: Vec<u8>) -> Result<(Vec<u8>, u64), RewriteError> {
    let scan = broca_wal::scan(&bytes).map_err(|e| format!("the rewritten log: {e}"))?;
    if scan.end != bytes.len() as u64 || matches!(scan.verdict, Verdict::Corrupt { .. }) {
        return Err("the rewritten log does not scan whole".into());
    }
    Ok((bytes, scan.frames.last().map_or(0, |f| f.seq)))
}

/// The lock one pack of the state dir holds while it runs; refused while another pack holds it.
pub(crate) fn pack_lock(state_dir: &Path, archive_dir: &Path) -> Result<File, Error> {
    let lock_path = pack_lock_path(archive_dir);
    let lock = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .open(&lock_path)
        .map_err(|e| Error::io(&lock_path, "open", e))?;
    if !try_flock(&lock, libc::LOCK_EX).map_err(|e| Error::io(&lock_path, "lock", e))? {
        return Err(Error::Busy {
            state_dir: state_dir.to_path_buf(),
            lock: lock_path,
        });
    }
    Ok(lock)
}

/// Packs the idle WALs of `state_dir`. A crash at any step leaves every session readable
/// exactly once; a later pack cleans up what an interrupted one left.
pub fn pack(
    state_dir: &Path,
    opts: &PackOptions,
    progress: &mut dyn FnMut(Progress),
) -> Result<PackReport, Error> {
    let wal_dir = state_dir.join("wal");
    let archive_dir = state_dir.join(format::DIR_NAME);
    broca_owner_only::create_dir(&archive_dir).map_err(|e| Error::io(&archive_dir, "create", e))?;
    let lock = pack_lock(state_dir, &archive_dir)?;
    let mut report = PackReport::default();
    if !opts.dry_run {
        report.cleaned = clean_temporaries(&archive_dir, &wal_dir)?;
    }
    let paths = wal_files(&wal_dir)?;
    let now = SystemTime::now();
    let total = paths.len();
    let mut batch: Vec<Chosen> = Vec::new();
    let mut batch_bytes = 0u64;
    for (i, path) in paths.iter().enumerate() {
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let idle = match &opts.only {
            Some(only) if *only != name => continue,
            Some(_) => Duration::ZERO,
            None => opts
                .sooner
                .get(&name)
                .map_or(opts.idle, |d| (*d).min(opts.idle)),
        };
        match choose(path, idle, now, opts.rewrite, &mut report) {
            Err(why) => report.skipped.push((name, why)),
            Ok(c) if opts.dry_run => {
                report.bytes += c.member.size;
                report.packed.push(c.member);
            }
            Ok(c) => {
                let size = c.member.size + c.media.iter().map(|m| m.1.len() as u64).sum::<u64>();
                if !batch.is_empty()
                    && (batch.len() >= MEMBERS_PER_CONTAINER
                        || batch_bytes + size > CONTAINER_BYTES_MAX)
                {
                    seal_and_remove(
                        &archive_dir,
                        &wal_dir,
                        std::mem::take(&mut batch),
                        &mut report,
                        progress,
                    )?;
                    batch_bytes = 0;
                }
                batch_bytes += size;
                batch.push(c);
            }
        }
        if (i + 1) % 256 == 0 || i + 1 == total {
            progress(Progress::Looked { done: i + 1, total });
        }
    }
    if !batch.is_empty() {
        seal_and_remove(&archive_dir, &wal_dir, batch, &mut report, progress)?;
    }
    drop(lock);
    Ok(report)
}

/// Writes a container of `batch`, seals it, makes it durable, then removes the live WALs.
fn seal_and_remove(
    archive_dir: &Path,
    wal_dir: &Path,
    batch: Vec<Chosen>,
    report: &mut PackReport,
    progress: &mut dyn FnMut(Progress),
) -> Result<(), Error> {
    let (sealed, fresh): (Vec<Chosen>, Vec<Chosen>) =
        batch.into_iter().partition(|c| c.already_sealed);
    if !fresh.is_empty() {
        let members: Vec<Member> = fresh.iter().map(|c| c.member.clone()).collect();
        let bytes: Vec<&[u8]> = fresh.iter().map(|c| c.bytes.as_slice()).collect();
        let media: Vec<(&str, &str, &[u8])> = fresh
            .iter()
            .flat_map(|c| {
                c.media
                    .iter()
                    .map(|(sha, b)| (c.member.file.as_str(), sha.as_str(), b.as_slice()))
            })
            .collect();
        let (path, _) = write_container(archive_dir, now_ms(), &members, &bytes, &media)?;
        progress(Progress::Sealed {
            path: path.clone(),
            members: members.len(),
        });
        // A rewritten session's older copies go before its live WAL does: a crash between
        // leaves the live WAL, which the next pack rewrites again.
        for c in fresh.iter().filter(|c| c.rewritten) {
            let older = forget::holding(archive_dir, &c.member.file, Some(&path))?;
            forget::forget_in(archive_dir, &c.member.file, &older)?;
        }
        report.containers.push(path);
    }
    // Every byte of every chosen WAL is now in a durable, sealed container.
    let chosen = sealed.len() + fresh.len();
    let mut removed = 0;
    let mut media_removed = false;
    for c in sealed.into_iter().chain(fresh) {
        // The lease was held since the bytes were read: a WAL that changed anyway (a writer
        // that ignores the lease) stays live.
        let same = std::fs::metadata(&c.path).is_ok_and(|m| {
            m.size() == c.file_len && c.file.metadata().is_ok_and(|f| f.ino() == m.ino())
        });
        if !same {
            report.skipped.push((c.member.file.clone(), Skip::Changed));
            continue;
        }
        std::fs::remove_file(&c.path).map_err(|e| Error::io(&c.path, "remove", e))?;
        // Its media are in the container too: the content store goes with the WAL (an open
        // upload's part, lost with the process that took it, with them).
        let media = media_dir(&c.path);
        if media.exists() {
            std::fs::remove_dir_all(&media).map_err(|e| Error::io(&media, "remove", e))?;
            media_removed = true;
        }
        removed += 1;
        if removed == 1 {
            crash_point("archive_removed_one");
        }
        report.bytes += c.member.size;
        PACKED.fetch_add(1, Ordering::Relaxed);
        report.packed.push(c.member);
        drop(c.file);
    }
    assert!(removed <= chosen, "only chosen WALs are removed");
    sync_dir(wal_dir)?;
    if media_removed {
        let root = wal_dir
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or(Path::new("."))
            .join("media");
        sync_dir(&root)?;
    }
    crash_point("archive_packed");
    Ok(())
}

/// Writes and seals one container: a temporary file, fsynced, renamed to its digest, the
/// folder fsynced. Returns its path and digest. `created_unix_ms` orders it among the others
/// (the newer of two holding a session wins): a pack's is now, a rewrite keeps the old one's.
pub(crate) fn write_container(
    archive_dir: &Path,
    created_unix_ms: u64,
    members: &[Member],
    bytes: &[&[u8]],
    media: &[(&str, &str, &[u8])],
) -> Result<(PathBuf, String), Error> {
    let (tmp, file) = create_tmp(archive_dir)?;
    let io = |op: &'static str, e: std::io::Error| Error::io(&tmp, op, e);
    let mut out = Sealing {
        out: std::io::BufWriter::with_capacity(1 << 20, file),
        digest: blake3::Hasher::new(),
        at: 0,
    };
    out.put(format::MAGIC).map_err(|e| io("write", e))?;
    let mut index = Index {
        format: 1,
        created_unix_ms,
        members: Vec::with_capacity(members.len()),
        media: Vec::with_capacity(media.len()),
    };
    assert_eq!(members.len(), bytes.len(), "each member has its bytes");
    assert!(!members.is_empty(), "a container holds a member");
    for (m, b) in members.iter().zip(bytes) {
        assert_eq!(b.len() as u64, m.size, "a member's size is its bytes'");
        let offset = out.put(b).map_err(|e| io("write", e))?;
        index.members.push(Member {
            offset,
            ..m.clone()
        });
    }
    assert_eq!(
        out.at,
        format::MAGIC.len() as u64 + index.members.iter().map(|m| m.size).sum::<u64>(),
        "the members lie end to end after the magic"
    );
    // The sessions' media after them, each with its digest.
    for (file, sha256, b) in media {
        let offset = out.put(b).map_err(|e| io("write", e))?;
        index.media.push(MediaMember {
            file: file.to_string(),
            sha256: sha256.to_string(),
            offset,
            size: b.len() as u64,
            blake3: hex(blake3::hash(b).as_bytes()),
        });
    }
    let raw = serde_json::to_vec(&index).map_err(|e| Error::Index(e.to_string()))?;
    let index_at = out.put(&raw).map_err(|e| io("write", e))?;
    let sealed = out.digest.finalize();
    let trailer = format::encode_trailer(index_at, raw.len() as u64, sealed.as_bytes());
    out.out.write_all(&trailer).map_err(|e| io("write", e))?;
    let file = out
        .out
        .into_inner()
        .map_err(|e| io("write", e.into_error()))?;
    crash_point("archive_written");
    file.sync_all().map_err(|e| io("fsync", e))?;
    drop(file);
    let name = hex(sealed.as_bytes());
    let path = archive_dir.join(format!("{name}.{}", format::EXTENSION));
    broca_io::fs::rename(&tmp, &path).map_err(|e| io("rename", e))?;
    sync_dir(archive_dir)?;
    crash_point("archive_sealed");
    Ok((path, name))
}

/// A new temporary container in `archive_dir` (owner-only; never read, and removed by the
/// next pack's sweep when a crash leaves it).
fn create_tmp(archive_dir: &Path) -> Result<(PathBuf, File), Error> {
    let tmp = archive_dir.join(format!(
        ".pack-{}-{}.tmp",
        std::process::id(),
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos())
    ));
    let file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)
        .map_err(|e| Error::io(&tmp, "create", e))?;
    Ok((tmp, file))
}

/// A container as it is written: every byte before its trailer goes into its digest, and
/// where the next one lands.
struct Sealing {
    out: std::io::BufWriter<File>,
    digest: blake3::Hasher,
    at: u64,
}

impl Sealing {
    /// Writes `b`; the offset it was written at.
    fn put(&mut self, b: &[u8]) -> std::io::Result<u64> {
        let at = self.at;
        self.digest.update(b);
        self.out.write_all(b)?;
        self.at += b.len() as u64;
        Ok(at)
    }
}

/// Removes what an interrupted pack or restore left: temporary containers (never sealed,
/// never read) and temporary restores. Returns how many.
fn clean_temporaries(archive_dir: &Path, wal_dir: &Path) -> Result<usize, Error> {
    let mut n = 0;
    for (dir, prefix) in [(archive_dir, ".pack-"), (wal_dir, ".restore-")] {
        let Ok(entries) = std::fs::read_dir(dir) else {
            continue;
        };
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if name.starts_with(prefix) && name.ends_with(".tmp") {
                // A restore's temporary file may belong to a writer restoring right now:
                // only those older than a minute are left over.
                let old = prefix == ".pack-"
                    || e.metadata()
                        .and_then(|m| m.modified())
                        .ok()
                        .and_then(|t| t.elapsed().ok())
                        .is_some_and(|d| d > Duration::from_secs(60));
                if old {
                    std::fs::remove_file(e.path())
                        .map_err(|err| Error::io(&e.path(), "remove", err))?;
                    n += 1;
                }
            }
        }
    }
    Ok(n)
}

/// The `.wal` files of `wal_dir`, sorted.
fn wal_files(wal_dir: &Path) -> Result<Vec<PathBuf>, Error> {
    broca_wal::listing::wal_dir_files(wal_dir).map_err(|e| Error::io(wal_dir, "list", e))
}

/// Why a pack or a restore failed.
#[derive(Debug)]
pub enum Error {
    /// A call on `path` failed; `os_error` is its OS error number, where it had one (running
    /// out of descriptors is told apart by it).
    Io {
        path: PathBuf,
        op: &'static str,
        message: String,
        os_error: Option<i32>,
    },
    /// Another pack of the state dir holds the lock.
    Busy { state_dir: PathBuf, lock: PathBuf },
    /// A sealed container's member does not read back.
    Container(format::ArchiveError),
    /// A container's index could not be encoded.
    Index(String),
}

impl Error {
    pub(crate) fn io(path: &Path, op: &'static str, e: std::io::Error) -> Error {
        Error::Io {
            path: path.to_path_buf(),
            op,
            message: e.to_string(),
            os_error: e.raw_os_error(),
        }
    }

    /// The OS error number of the call that failed, where one did.
    pub fn os_error(&self) -> Option<i32> {
        match self {
            Error::Io { os_error, .. } => *os_error,
            _ => None,
        }
    }
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Error::Io {
                path, op, message, ..
            } => write!(f, "{}: {op}: {message}", path.display()),
            Error::Busy { state_dir, lock } => write!(
                f,
                "another pack is running on {} (it holds {})",
                state_dir.display(),
                lock.display()
            ),
            Error::Container(e) => write!(f, "{e}"),
            Error::Index(e) => write!(f, "the index: {e}"),
        }
    }
}

impl std::error::Error for Error {}

impl From<Error> for String {
    fn from(e: Error) -> String {
        e.to_string()
    }
}

/// Why a WAL is left live by a pack.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Skip {
    /// A call on it failed (`op`: stat, open, lock, read).
    Io { op: &'static str, message: String },
    /// Written too recently.
    Recent { quiet: Duration, idle: Duration },
    /// A writer holds its lease.
    LeaseHeld,
    /// It does not scan as a WAL.
    Unreadable(String),
    /// Its records end in damage.
    Damaged,
    /// A record does not decode.
    Undecodable { seq: u64, why: String },
    /// A run of it has no terminal record.
    OpenRun(String),
    /// It changed while it was packed (a writer that ignores the lease).
    Changed,
}

impl std::fmt::Display for Skip {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Skip::Io { op, message } => write!(f, "cannot {op}: {message}"),
            Skip::Recent { quiet, idle } => write!(
                f,
                "written {} s ago, not idle for {} s",
                quiet.as_secs(),
                idle.as_secs()
            ),
            Skip::LeaseHeld => f.write_str("a writer holds its lease"),
            Skip::Unreadable(e) => write!(f, "not packed: {e}"),
            Skip::Damaged => f.write_str("damaged; run `broca wal verify` on it"),
            Skip::Undecodable { seq, why } => write!(f, "record seq {seq} does not decode: {why}"),
            Skip::OpenRun(run) => write!(f, "run {run} is open"),
            Skip::Changed => f.write_str("changed while it was packed"),
        }
    }
}
