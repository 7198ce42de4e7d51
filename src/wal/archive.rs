//! Sealed WAL containers (`<state-dir>/wal-archive/<digest>.wac`), read side: the format, the
//! index, finding the newest sealed copy of a session, and reading a member with its digest
//! checked. Writing containers (pack, restore) is broca-archive's; the format and its recovery
//! table are in docs/wal-archive.md.
//!
//! A container is the magic, the members' WAL bytes back to back, a JSON index and a fixed
//! trailer that seals it: the index's place and the blake3 digest of every byte before the
//! trailer, which is also the file's name. A file that is not named by its own digest, or
//! whose trailer does not check, is never read as truth.

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};

use crate::recovery::ReadAt;

/// The first bytes of a container (the last one is the format version).
pub const MAGIC: &[u8; 16] = b"BROCA-WAL-ARCH\0\x01";
/// The trailer's first bytes.
pub const TRAILER_MAGIC: &[u8; 8] = b"BWACEND1";
/// The trailer's length: magic, index offset, index length, digest, crc32c, zero padding.
pub const TRAILER_BYTES: u64 = 64;
/// A container's file name ends so.
pub const EXTENSION: &str = "wac";
/// The folder beside `wal/`.
pub const DIR_NAME: &str = "wal-archive";
/// The largest index read (a damaged length must not allocate without bound).
const INDEX_BYTES_MAX: u64 = 256 << 20;

/// One session's WAL in a container.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Member {
    /// The WAL's file name in `wal/` (`<address>.wal`).
    pub file: String,
    pub project_root: String,
    pub harness: String,
    pub session: String,
    /// The WAL header's lineage id (hex).
    pub lineage_id: String,
    /// Where its bytes start in the container, and how many.
    pub offset: u64,
    pub size: u64,
    /// blake3 of its bytes (hex).
    pub blake3: String,
    /// The WAL's last seq when it was packed.
    pub last_seq: u64,
}

/// A medium of a packed session's content store (`media/<address>/<sha256>`), after the
/// members' WAL bytes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MediaMember {
    /// The WAL member (its file name) whose session holds it.
    pub file: String,
    pub sha256: String,
    pub offset: u64,
    pub size: u64,
    /// blake3 of its bytes (hex).
    pub blake3: String,
}

impl MediaMember {
    /// The medium as a member its bytes are read and checked as (named for errors).
    fn as_member(&self) -> Member {
        Member {
            file: format!("{} medium {}", self.file, self.sha256),
            project_root: String::new(),
            harness: String::new(),
            session: String::new(),
            lineage_id: String::new(),
            offset: self.offset,
            size: self.size,
            blake3: self.blake3.clone(),
            last_seq: 0,
        }
    }
}

/// A container's index.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Index {
    pub format: u32,
    /// When the pack sealed it: the newer of two containers holding a session wins.
    pub created_unix_ms: u64,
    pub members: Vec<Member>,
    /// The packed sessions' media (absent in containers without any).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub media: Vec<MediaMember>,
}

/// A container that checked: its path, digest and index.
#[derive(Debug)]
pub struct Container {
    pub path: PathBuf,
    pub digest: String,
    pub index: Index,
    by_file: HashMap<String, usize>,
}

impl Container {
    pub fn member(&self, file: &str) -> Option<&Member> {
        self.by_file.get(file).map(|i| &self.index.members[*i])
    }

    /// The media of the session whose WAL member is `file`.
    pub fn media_of<'a>(&'a self, file: &'a str) -> impl Iterator<Item = &'a MediaMember> + 'a {
        self.index.media.iter().filter(move |m| m.file == file)
    }
}

/// What is wrong with a container, naming where.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ArchiveError {
    pub path: PathBuf,
    /// The member concerned, if any.
    pub member: Option<String>,
    pub offset: u64,
    pub reason: String,
}

impl std::fmt::Display for ArchiveError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.path.display())?;
        if let Some(m) = &self.member {
            write!(f, ": member {m}")?;
        }
        write!(f, ": at offset {}: {}", self.offset, self.reason)
    }
}

impl std::error::Error for ArchiveError {}

/// The trailer of a container, written by the pack that seals it.
pub fn encode_trailer(index_offset: u64, index_len: u64, digest: &[u8; 32]) -> [u8; 64] {
    let mut t = [0u8; 64];
    t[..8].copy_from_slice(TRAILER_MAGIC);
    t[8..16].copy_from_slice(&index_offset.to_le_bytes());
    t[16..24].copy_from_slice(&index_len.to_le_bytes());
    t[24..56].copy_from_slice(digest);
    let crc = crc32c::crc32c(&t[..56]);
    t[56..60].copy_from_slice(&crc.to_le_bytes());
    t
}

pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The archive folder of a WAL folder (`<state-dir>/wal` -> `<state-dir>/wal-archive`).
pub fn dir_of(wal_dir: &Path) -> PathBuf {
    wal_dir
        .parent()
        .unwrap_or_else(|| Path::new("."))
        .join(DIR_NAME)
}

/// The sealed containers' paths in `archive_dir`, sorted by name (files that are not
/// `<64 hex>.wac` are not containers: a pack's temporary file among them).
pub fn container_paths(archive_dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    let entries = match std::fs::read_dir(archive_dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(out),
        Err(e) => return Err(e),
    };
    for e in entries {
        let p = e?.path();
        if is_container_name(&p) {
            out.push(p);
        }
    }
    out.sort();
    Ok(out)
}

fn is_container_name(p: &Path) -> bool {
    p.extension().is_some_and(|x| x == EXTENSION)
        && p.file_stem()
            .and_then(|s| s.to_str())
            .is_some_and(|s| s.len() == 64 && s.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// Opens a container and checks its trailer and index (not its digest: [`verify`] reads
/// every byte; a member's digest is checked when it is read).
pub fn open(path: &Path) -> Result<Container, ArchiveError> {
    let err = |offset: u64, reason: String| ArchiveError {
        path: path.to_path_buf(),
        member: None,
        offset,
        reason,
    };
    let file = File::open(path).map_err(|e| err(0, format!("cannot open: {e}")))?;
    let len = file.len_bytes();
    if len < MAGIC.len() as u64 + TRAILER_BYTES {
        return Err(err(
            len,
            "truncated: shorter than a magic and a trailer".into(),
        ));
    }
    let mut magic = [0u8; 16];
    read_exact_at(&file, 0, &mut magic).map_err(|e| err(0, format!("cannot read: {e}")))?;
    if &magic != MAGIC {
        return Err(err(0, "not a broca WAL container (bad magic)".into()));
    }
    let trailer = read_trailer(&file, path, len)?;
    let index = read_index(&file, &trailer).map_err(|(offset, why)| err(offset, why))?;
    // Every member's and medium's bytes lie between the magic and the index.
    let media = index.media.iter().map(MediaMember::as_member);
    for m in index.members.iter().cloned().chain(media) {
        let fits = m.offset >= MAGIC.len() as u64
            && m.offset
                .checked_add(m.size)
                .is_some_and(|end| end <= trailer.index_offset);
        if !fits {
            return Err(ArchiveError {
                member: Some(m.file.clone()),
                ..err(
                    m.offset,
                    format!("its range ({} bytes) is outside the members", m.size),
                )
            });
        }
    }
    let mut by_file = HashMap::with_capacity(index.members.len());
    for (i, m) in index.members.iter().enumerate() {
        by_file.insert(m.file.clone(), i);
    }
    assert_eq!(
        by_file.len(),
        index.members.len(),
        "an index names each file once"
    );
    Ok(Container {
        path: path.to_path_buf(),
        digest: trailer.digest,
        index,
        by_file,
    })
}

/// A sealed container's trailer: where its index is and the digest it seals.
struct Trailer {
    index_offset: u64,
    index_len: u64,
    digest: String,
}

/// Reads and checks the trailer at the end of the `len`-byte container `path`: its magic
/// and checksum, the digest the file is named for, an index that fits before it.
fn read_trailer(file: &File, path: &Path, len: u64) -> Result<Trailer, ArchiveError> {
    let at = len - TRAILER_BYTES;
    let err = |reason: String| ArchiveError {
        path: path.to_path_buf(),
        member: None,
        offset: at,
        reason,
    };
    let mut t = [0u8; TRAILER_BYTES as usize];
    read_exact_at(file, at, &mut t).map_err(|e| err(format!("cannot read: {e}")))?;
    let word = |from: usize| u64::from_le_bytes(t[from..from + 8].try_into().expect("8 bytes"));
    let crc = u32::from_le_bytes(t[56..60].try_into().expect("4 bytes"));
    if &t[..8] != TRAILER_MAGIC || crc != crc32c::crc32c(&t[..56]) {
        return Err(err(
            "no valid trailer: the container is not sealed or is truncated".into(),
        ));
    }
    let (index_offset, index_len) = (word(8), word(16));
    let digest = hex(&t[24..56]);
    let name = path.file_stem().and_then(|s| s.to_str()).unwrap_or("");
    if name != digest {
        return Err(err(format!(
            "named {name}, but its trailer seals digest {digest}"
        )));
    }
    if index_offset < MAGIC.len() as u64
        || index_len > INDEX_BYTES_MAX
        || index_offset.checked_add(index_len) != Some(at)
    {
        return Err(err(format!(
            "the trailer's index ({index_offset}, {index_len} bytes) does not fit the file"
        )));
    }
    Ok(Trailer {
        index_offset,
        index_len,
        digest,
    })
}

/// Reads and parses the index the trailer points at; `Err` is the offset and what is wrong.
fn read_index(file: &File, t: &Trailer) -> Result<Index, (u64, String)> {
    assert!(
        t.index_len <= INDEX_BYTES_MAX,
        "the trailer's index was checked"
    );
    let at = t.index_offset;
    let mut raw = vec![0u8; t.index_len as usize];
    read_exact_at(file, at, &mut raw).map_err(|e| (at, format!("cannot read the index: {e}")))?;
    let index: Index =
        serde_json::from_slice(&raw).map_err(|e| (at, format!("the index does not parse: {e}")))?;
    if index.format != 1 {
        return Err((
            at,
            format!("format {} is not one this build reads", index.format),
        ));
    }
    Ok(index)
}

fn read_exact_at(file: &File, offset: u64, buf: &mut [u8]) -> std::io::Result<()> {
    let n = file.read_at_most(offset, buf)?;
    if n < buf.len() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::UnexpectedEof,
            format!("{} bytes short", buf.len() - n),
        ));
    }
    Ok(())
}

/// Reads every byte of a container: the digest that names it, and each member's digest.
pub fn verify(path: &Path) -> Result<Container, ArchiveError> {
    let c = open(path)?;
    let err = |member: Option<String>, offset: u64, reason: String| ArchiveError {
        path: path.to_path_buf(),
        member,
        offset,
        reason,
    };
    let file = File::open(path).map_err(|e| err(None, 0, format!("cannot open: {e}")))?;
    // Each member first: damage inside one is named by the member and its offset.
    for m in &c.index.members {
        member_bytes(&file, path, m)?;
    }
    for m in &c.index.media {
        media_bytes(&file, path, m)?;
    }
    let sealed = file.len_bytes() - TRAILER_BYTES;
    let mut whole = blake3::Hasher::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut at = 0;
    while at < sealed {
        let n = buf.len().min((sealed - at) as usize);
        read_exact_at(&file, at, &mut buf[..n])
            .map_err(|e| err(None, at, format!("cannot read: {e}")))?;
        whole.update(&buf[..n]);
        at += n as u64;
    }
    if hex(whole.finalize().as_bytes()) != c.digest {
        let spans = c
            .index
            .members
            .iter()
            .map(|m| (m.offset, m.size))
            .chain(c.index.media.iter().map(|m| (m.offset, m.size)));
        let gaps = uncovered(spans, sealed);
        let first = gaps.first().map_or(0, |g| g.0);
        let shown: Vec<String> = gaps.iter().map(|(a, b)| format!("{a}..{b}")).collect();
        return Err(err(
            None,
            first,
            format!(
                "its bytes do not match the digest that seals it, though every member's do: \
                 the damage is outside the members, in bytes {} (the magic, or the index)",
                shown.join(", ")
            ),
        ));
    }
    Ok(c)
}

/// The byte ranges below `end` that no member (`(offset, size)`) covers, in order.
fn uncovered(members: impl Iterator<Item = (u64, u64)>, end: u64) -> Vec<(u64, u64)> {
    let mut spans: Vec<(u64, u64)> = members
        .map(|(offset, size)| (offset, offset.saturating_add(size)))
        .collect();
    spans.sort_unstable();
    let (mut gaps, mut at) = (Vec::new(), 0);
    for (start, stop) in spans {
        if start > at {
            gaps.push((at, start.min(end)));
        }
        at = at.max(stop);
    }
    if at < end {
        gaps.push((at, end));
    }
    gaps
}

/// A member's bytes, its digest checked.
pub fn member_bytes(file: &File, path: &Path, m: &Member) -> Result<Vec<u8>, ArchiveError> {
    let mut bytes = vec![0u8; m.size as usize];
    read_exact_at(file, m.offset, &mut bytes).map_err(|e| ArchiveError {
        path: path.to_path_buf(),
        member: Some(m.file.clone()),
        offset: m.offset,
        reason: format!("cannot read: {e}"),
    })?;
    if hex(blake3::hash(&bytes).as_bytes()) != m.blake3 {
        return Err(ArchiveError {
            path: path.to_path_buf(),
            member: Some(m.file.clone()),
            offset: m.offset,
            reason: "its bytes do not match its digest".into(),
        });
    }
    Ok(bytes)
}

/// A packed medium's bytes, its digest checked.
pub fn media_bytes(file: &File, path: &Path, m: &MediaMember) -> Result<Vec<u8>, ArchiveError> {
    member_bytes(file, path, &m.as_member())
}

/// The bytes of medium `sha256` of the session of `wal_path`, from the newest sealed container
/// holding it (digest checked); `None` when none does.
pub fn archived_media(wal_path: &Path, sha256: &str) -> Result<Option<Vec<u8>>, ArchiveError> {
    newest_bytes(wal_path, |c, file| {
        c.media_of(file)
            .find(|m| m.sha256 == sha256)
            .map(MediaMember::as_member)
    })
}

/// The bytes of what `pick` finds for the session of `wal_path` in the newest sealed container
/// holding it (digest checked); `None` when none does.
fn newest_bytes(
    wal_path: &Path,
    pick: impl Fn(&Container, &str) -> Option<Member>,
) -> Result<Option<Vec<u8>>, ArchiveError> {
    let (dir, file) = split(wal_path);
    let listed = containers(&dir).map_err(|e| ArchiveError {
        path: dir.clone(),
        member: None,
        offset: 0,
        reason: format!("cannot list: {e}"),
    })?;
    let Some((c, m)) = listed
        .into_iter()
        .rev()
        .find_map(|c| pick(&c, &file).map(|m| (c, m)))
    else {
        return Ok(None);
    };
    let f = File::open(&c.path).map_err(|e| ArchiveError {
        path: c.path.clone(),
        member: Some(m.file.clone()),
        offset: 0,
        reason: format!("cannot open: {e}"),
    })?;
    member_bytes(&f, &c.path, &m).map(Some)
}

/// Containers already opened, by path (a sealed container never changes).
fn cache() -> &'static Mutex<HashMap<PathBuf, Arc<Container>>> {
    static CACHE: std::sync::OnceLock<Mutex<HashMap<PathBuf, Arc<Container>>>> =
        std::sync::OnceLock::new();
    CACHE.get_or_init(Default::default)
}

/// The sealed containers of `archive_dir` that open, oldest first; those that do not are
/// skipped (`broca wal verify` names them).
pub fn containers(archive_dir: &Path) -> std::io::Result<Vec<Arc<Container>>> {
    let paths = container_paths(archive_dir)?;
    let mut out = Vec::with_capacity(paths.len());
    for p in paths {
        let cached = cache().lock().ok().and_then(|c| c.get(&p).cloned());
        let c = match cached {
            Some(c) => c,
            None => match open(&p) {
                Ok(c) => {
                    let c = Arc::new(c);
                    if let Ok(mut cache) = cache().lock() {
                        cache.insert(p.clone(), c.clone());
                    }
                    c
                }
                Err(_) => continue,
            },
        };
        out.push(c);
    }
    out.sort_by(|a, b| {
        (a.index.created_unix_ms, &a.digest).cmp(&(b.index.created_unix_ms, &b.digest))
    });
    Ok(out)
}

/// The newest sealed container holding the WAL named `file`, and its member.
pub fn find(archive_dir: &Path, file: &str) -> std::io::Result<Option<(Arc<Container>, Member)>> {
    Ok(containers(archive_dir)?
        .into_iter()
        .rev()
        .find_map(|c| c.member(file).cloned().map(|m| (c, m))))
}

/// The archived bytes of the WAL at `wal_path` (`<state-dir>/wal/<address>.wal`), from the
/// newest sealed container holding it, digest checked; `None` when none holds it.
pub fn archived_bytes(wal_path: &Path) -> Result<Option<Vec<u8>>, ArchiveError> {
    newest_bytes(wal_path, |c, file| c.member(file).cloned())
}

/// Whether the session of `wal_path` has a live WAL or an archived one.
pub fn exists(wal_path: &Path) -> bool {
    wal_path.exists() || is_archived(wal_path)
}

/// Whether a sealed container holds the session of `wal_path` (live or not).
pub fn is_archived(wal_path: &Path) -> bool {
    let (dir, file) = split(wal_path);
    matches!(find(&dir, &file), Ok(Some(_)))
}

fn split(wal_path: &Path) -> (PathBuf, String) {
    let wal_dir = wal_path.parent().unwrap_or_else(|| Path::new("."));
    let file = wal_path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    (dir_of(wal_dir), file)
}

/// The WAL file names every sealed container of `archive_dir` holds.
pub fn archived_files(archive_dir: &Path) -> std::io::Result<Vec<String>> {
    let mut names: Vec<String> = containers(archive_dir)?
        .iter()
        .flat_map(|c| c.index.members.iter().map(|m| m.file.clone()))
        .collect();
    names.sort();
    names.dedup();
    Ok(names)
}

/// An archived copy that cannot be read, as a WAL error naming the container and member.
impl From<ArchiveError> for crate::WalError {
    fn from(e: ArchiveError) -> crate::WalError {
        crate::WalError::Corrupt {
            offset: e.offset,
            reason: match &e.member {
                Some(m) => format!("archived member {m}: {}", e.reason),
                None => e.reason.clone(),
            },
            path: e.path,
        }
    }
}
