//! Whole-session retention (llm-runner/v1 `retention`; docs/retention.md). A session sent
//! with a retention expires at its last activity plus it, never while a run of it is not
//! over. At expiry its actor writes a content-free tombstone (`tombstones/<address>.json`,
//! durable), then the session's every copy is deleted: its WAL, its media, its archived
//! copies and its store projection. Reads of it then answer `expired`; a send starts a fresh
//! session record (a new WAL, the next history version). A restart finishes a deletion a
//! crash cut short.
//!
//! The sessions that have a retention are listed in `retention/<address>.json` (their triple,
//! written before their first such send is admitted), so a restart finds them without
//! reading every WAL. What is read at start ([`Retention::load`]) seeds each shard's own part
//! ([`local`]): the tombstones (a copy on every shard), and when each of its sessions is due;
//! each shard looks for its own sessions due every [`broca_wire::role::RETENTION_SWEEP_MS`].
//! Nothing here is locked: the shared part is read only, and the files are written on the
//! blocking pool.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

pub(crate) mod local;

use broca_core::Expiry;
use broca_wal::SessionTriple;
use serde::{Deserialize, Serialize};

/// The folder of tombstones, in the state dir.
pub const TOMB_DIR: &str = "tombstones";
/// The folder listing the sessions that have a retention, in the state dir.
pub const INDEX_DIR: &str = "retention";

/// What remains of an expired session record: identity and times, never content.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Tombstone {
    /// The session's address (hex).
    pub address: String,
    /// The expired record's WAL lineage (its `incarnation`).
    pub lineage: String,
    /// The expired record's history version (a fresh record's is the next).
    pub history_version: u64,
    /// Its last activity plus its retention.
    pub expired_at_ms: u64,
    /// When the tombstone was written.
    pub tombstoned_at_ms: u64,
    /// Its runs' ids.
    #[serde(default)]
    pub runs: Vec<String>,
    /// Deleted by its storage policy or its release (llm-runner/v1 `session_retention`):
    /// its reads answer `unknown_session`, not `expired`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub deleted: bool,
}

/// How a session record ended, while no fresh one was made since.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ended {
    /// When it expired or was due to be deleted (ms since the Unix epoch).
    pub at_ms: u64,
    /// Deleted by its storage policy or its release, not expired by its retention.
    pub deleted: bool,
}

/// What the state dir held at start: the tombstones (with whether a fresh record superseded
/// each), the sessions kept with a retention, a policy or a release and when each is due, and
/// those a policy's `archive_after_days` has the archive pack.
#[derive(Debug, Default)]
pub struct Loaded {
    pub(crate) tombs: Vec<(Tombstone, bool)>,
    pub(crate) due: Vec<(SessionTriple, Expiry)>,
    pub(crate) archive: Vec<(SessionTriple, std::time::Duration)>,
}

/// Retention's shared part: where its files are, what was read at start, and, per shard,
/// the earliest time one of its sessions is due (a request of a session elsewhere asks its
/// shard to expire it only once that time has come). Each shard's own part is [`local`].
pub struct Retention {
    state_dir: PathBuf,
    wal_dir: PathBuf,
    loaded: Loaded,
    earliest_due_ms: Box<[AtomicU64]>,
}

/// The lineage (hex) of the WAL at `path`, when there is one whose header reads.
fn wal_lineage(path: &Path) -> Option<String> {
    use std::io::Read;
    let mut f = std::fs::File::open(path).ok()?;
    let mut head = vec![0u8; broca_wal::header::DATA_ALIGN as usize];
    let mut n = 0;
    while n < head.len() {
        match f.read(&mut head[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(_) => return None,
        }
    }
    broca_wal::header::WalHeader::decode(&head[..n])
        .ok()
        .map(|h| h.lineage_hex())
}

/// The lineage of the session record at `path`: its live WAL's, else its newest archived
/// copy's (a record packed by the archive is still the current one).
fn record_lineage(path: &Path) -> Option<String> {
    if let Some(l) = wal_lineage(path) {
        return Some(l);
    }
    let wal_dir = path.parent()?;
    let file = path.file_name()?.to_string_lossy().into_owned();
    let (_, member) = broca_wal::archive::find(&broca_wal::archive::dir_of(wal_dir), &file)
        .ok()
        .flatten()?;
    Some(member.lineage_id)
}

impl Retention {
    /// Loads the tombstones and the sessions with a retention of `state_dir` (on the caller's
    /// thread: at start, before any shard runs), for `shards` shards. A session listed whose
    /// WAL is gone, or that has no retention any more, leaves the list.
    pub fn load(state_dir: &Path, wal_dir: &Path, shards: usize) -> std::io::Result<Retention> {
        assert!(shards > 0, "retention is kept by at least one shard");
        for dir in [TOMB_DIR, INDEX_DIR] {
            broca_owner_only::create_dir(&state_dir.join(dir))?;
        }
        let mut loaded = Loaded::default();
        for (name, bytes) in json_files(&state_dir.join(TOMB_DIR))? {
            match serde_json::from_slice::<Tombstone>(&bytes) {
                Ok(stone) => {
                    let path = wal_dir.join(format!("{}.wal", stone.address));
                    let superseded = record_lineage(&path).is_some_and(|l| l != stone.lineage);
                    loaded.tombs.push((stone, superseded));
                }
                Err(e) => tracing::error!("{TOMB_DIR}/{name}: not a tombstone, skipped: {e}"),
            }
        }
        for (name, bytes) in json_files(&state_dir.join(INDEX_DIR))? {
            let Ok(triple) = serde_json::from_slice::<SessionTriple>(&bytes) else {
                tracing::error!("{INDEX_DIR}/{name}: not a session triple, skipped");
                continue;
            };
            load_listed(&mut loaded, wal_dir, triple);
        }
        Ok(Retention {
            state_dir: state_dir.to_path_buf(),
            wal_dir: wal_dir.to_path_buf(),
            loaded,
            earliest_due_ms: (0..shards).map(|_| AtomicU64::new(u64::MAX)).collect(),
        })
    }

    /// What the state dir held at start (each shard seeds its own part from it).
    pub(crate) fn loaded(&self) -> &Loaded {
        &self.loaded
    }

    /// The tombstones whose deletion may not have finished (a crash cut it short): each is
    /// deleted again at start (deleting is idempotent).
    pub fn pending(&self) -> Vec<Tombstone> {
        let standing = self
            .loaded
            .tombs
            .iter()
            .filter(|(_, superseded)| !superseded);
        standing.map(|(stone, _)| stone.clone()).collect()
    }

    /// Whether a session `shard` owns may be due at `now_ms` (its shard answers precisely).
    pub(crate) fn may_be_due(&self, shard: usize, now_ms: u64) -> bool {
        self.earliest_due_ms[shard].load(Ordering::Acquire) <= now_ms
    }

    /// Shard `shard`'s earliest due time, as its own part says after a change.
    pub(crate) fn set_earliest_due(&self, shard: usize, at_ms: u64) {
        self.earliest_due_ms[shard].store(at_ms, Ordering::Release);
    }

    /// Lists `triple` among the sessions with a retention (durable), before a send giving it
    /// one is admitted (blocking: the caller runs it on the blocking pool).
    pub fn index(&self, triple: &SessionTriple) -> std::io::Result<()> {
        let addr = triple.address().to_string();
        let bytes = serde_json::to_vec(triple).map_err(std::io::Error::other)?;
        let path = self.state_dir.join(INDEX_DIR).join(format!("{addr}.json"));
        broca_owner_only::write_file(&path, &bytes)
    }

    /// Writes the tombstone of an expiring session, durably (blocking: the caller runs it on
    /// the blocking pool; every shard then keeps it, `ShardMsg::Tomb`).
    pub fn tombstone(&self, stone: &Tombstone) -> std::io::Result<()> {
        let path = self
            .state_dir
            .join(TOMB_DIR)
            .join(format!("{}.json", stone.address));
        let bytes = serde_json::to_vec(stone).map_err(std::io::Error::other)?;
        broca_owner_only::write_file(&path, &bytes)
    }

    /// Deletes every copy of the record `stone` stands for (blocking: the caller runs it on
    /// the blocking pool, or at start): its WAL (only of that lineage: a fresh record's is
    /// never touched), its archived copies, its media, its store projection, its cached
    /// reading, and its index entry. Idempotent. The owning shard forgets it then
    /// ([`local::ShardRetention::forget`]).
    pub fn delete(
        &self,
        stone: &Tombstone,
        store: Option<&broca_store::Store>,
        reads: &broca_read::read::ReadCache,
    ) -> Result<(), DeleteError> {
        let wal = self.wal_dir.join(format!("{}.wal", stone.address));
        // A later record (live, or packed by the archive) is never touched.
        if record_lineage(&wal).is_some_and(|l| l != stone.lineage) {
            return Ok(());
        }
        match wal_lineage(&wal) {
            Some(l) if l != stone.lineage => return Ok(()),
            Some(_) => {
                std::fs::remove_file(&wal).map_err(DeleteError::io(&wal))?;
                sync_dir(&self.wal_dir)?;
            }
            None if wal.exists() => {
                // A WAL whose header never reached the disk: nothing readable, removed too.
                std::fs::remove_file(&wal).map_err(DeleteError::io(&wal))?;
                sync_dir(&self.wal_dir)?;
            }
            None => {}
        }
        reads.forget(&wal);
        broca_archive::forget(&wal).map_err(DeleteError::Archive)?;
        let media = self.state_dir.join("media").join(&stone.address);
        if media.exists() {
            std::fs::remove_dir_all(&media).map_err(DeleteError::io(&media))?;
            sync_dir(&self.state_dir.join("media"))?;
        }
        if let Some(store) = store {
            let addr = parse_address(&stone.address)
                .ok_or_else(|| DeleteError::Address(stone.address.clone()))?;
            store.forget(&addr).map_err(DeleteError::Store)?;
        }
        let index = self
            .state_dir
            .join(INDEX_DIR)
            .join(format!("{}.json", stone.address));
        match std::fs::remove_file(&index) {
            Ok(()) => sync_dir(&self.state_dir.join(INDEX_DIR))?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(DeleteError::io(&index)(e)),
        }
        Ok(())
    }
}

/// Reads the session `triple` listed among those kept: when it is due, and whether its
/// policy has the archive pack it. One whose WAL cannot be read stays listed: it is looked at
/// again when its session is next opened.
fn load_listed(loaded: &mut Loaded, wal_dir: &Path, triple: SessionTriple) {
    let path = broca_wal_writer::wal_path(wal_dir, &triple);
    let read = match broca_read::read_session(&path, broca_read::Keep::State) {
        Ok(Some(read)) => read,
        Ok(None) => return,
        Err(e) => {
            let addr = triple.address();
            return tracing::error!("session {addr}: its retention cannot be read: {e}");
        }
    };
    let days = read
        .session
        .policy
        .as_ref()
        .map_or(0, |p| p.archive_after_days);
    if days > 0 {
        let day = std::time::Duration::from_millis(broca_wire::role::DAY_MS);
        loaded
            .archive
            .push((triple.clone(), day.saturating_mul(days)));
    }
    let expiry = read.session.expiry();
    if expiry != Expiry::Never {
        loaded.due.push((triple, expiry));
    }
}

/// What retention will do to one session, as the state dir holds it now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Planned {
    /// Kept with a retention, a storage policy or a release (`rule` says which): it is
    /// deleted then.
    Expires {
        triple: SessionTriple,
        rule: String,
        at_ms: u64,
    },
    /// As `Expires`, a run of it not over: nothing deletes it until that run ends.
    Held { triple: SessionTriple, rule: String },
    /// Listed, but its WAL cannot be read (the reason).
    Unreadable { triple: SessionTriple, why: String },
    /// Expired, its tombstone written and its content not yet deleted: the next start (or
    /// the running daemon) deletes it.
    Deleting { address: String, expired_at_ms: u64 },
}

/// What retention will do, session by session (`broca archive retention`): read only, while
/// a daemon runs or not.
pub fn plan(state_dir: &Path, wal_dir: &Path) -> std::io::Result<Vec<Planned>> {
    let mut out = Vec::new();
    let index = state_dir.join(INDEX_DIR);
    if index.exists() {
        for (_, bytes) in json_files(&index)? {
            let Ok(triple) = serde_json::from_slice::<SessionTriple>(&bytes) else {
                continue;
            };
            let path = broca_wal_writer::wal_path(wal_dir, &triple);
            let state = broca_read::read_session(&path, broca_read::Keep::State);
            let (rule, expiry) = match state {
                Ok(Some(read)) => (rule_of(&read.session), read.session.expiry()),
                Ok(None) => continue,
                Err(e) => {
                    let why = e.to_string();
                    out.push(Planned::Unreadable { triple, why });
                    continue;
                }
            };
            out.push(match expiry {
                Expiry::Never => continue,
                Expiry::Held => Planned::Held { triple, rule },
                Expiry::At(at_ms) | Expiry::Delete(at_ms) => Planned::Expires {
                    triple,
                    rule,
                    at_ms,
                },
            });
        }
    }
    let tombs = state_dir.join(TOMB_DIR);
    if tombs.exists() {
        for (_, bytes) in json_files(&tombs)? {
            let Ok(stone) = serde_json::from_slice::<Tombstone>(&bytes) else {
                continue;
            };
            let wal = wal_dir.join(format!("{}.wal", stone.address));
            if wal_lineage(&wal).is_some_and(|l| l == stone.lineage) {
                out.push(Planned::Deleting {
                    address: stone.address,
                    expired_at_ms: stone.expired_at_ms,
                });
            }
        }
    }
    Ok(out)
}

/// What deletes `s`, in words: its release, its storage policy, or its retention.
fn rule_of(s: &broca_core::Session) -> String {
    use cortexkit_role_llm_runner::session_retention::Keep;
    if let Some(r) = &s.released {
        return format!("released at {}", r.at_unix_ms);
    }
    let policy = s.policy.as_ref().and_then(|p| match p.keep {
        Keep::Days { days } => Some(format!("keep {days} days")),
        Keep::None => Some("keep none".to_string()),
        _ => None,
    });
    match (policy, s.retention) {
        (Some(p), Some(secs)) => format!("{p}, retention {secs} s"),
        (Some(p), None) => p,
        (None, Some(secs)) => format!("retention {secs} s"),
        (None, None) => "kept".to_string(),
    }
}

/// Why an expired session's content was not all deleted (it is done again at the next
/// start).
#[derive(Debug)]
pub enum DeleteError {
    /// A file or folder could not be removed, or its folder synced.
    Io {
        path: std::path::PathBuf,
        source: std::io::Error,
    },
    /// Its archived copies could not be taken out.
    Archive(broca_archive::Error),
    /// Its store projection could not be forgotten.
    Store(broca_store::StoreError),
    /// The tombstone names no session address.
    Address(String),
}

impl DeleteError {
    fn io(path: &Path) -> impl FnOnce(std::io::Error) -> DeleteError + '_ {
        move |source| DeleteError::Io {
            path: path.to_path_buf(),
            source,
        }
    }
}

impl std::fmt::Display for DeleteError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DeleteError::Io { path, source } => write!(f, "{}: {source}", path.display()),
            DeleteError::Archive(e) => write!(f, "its archived copies: {e}"),
            DeleteError::Store(e) => write!(f, "its store projection: {e}"),
            DeleteError::Address(a) => write!(f, "`{a}` is not a session address"),
        }
    }
}

impl std::error::Error for DeleteError {}

fn sync_dir(dir: &Path) -> Result<(), DeleteError> {
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(DeleteError::io(dir))
}

fn parse_address(hex: &str) -> Option<[u8; 16]> {
    if hex.len() != 32 || !hex.is_ascii() {
        return None;
    }
    let mut out = [0u8; 16];
    for (i, b) in out.iter_mut().enumerate() {
        *b = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(out)
}

/// The `*.json` files of `dir`, by name, with their bytes (regular files only).
fn json_files(dir: &Path) -> std::io::Result<Vec<(String, Vec<u8>)>> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if !name.ends_with(".json") || !entry.file_type()?.is_file() {
            continue;
        }
        out.push((name, std::fs::read(entry.path())?));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_address_reads_back_and_a_malformed_one_is_refused() {
        let a = [7u8; 16];
        let hex: String = a.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(parse_address(&hex), Some(a));
        assert_eq!(parse_address("zz"), None);
        assert_eq!(parse_address(&"g".repeat(32)), None);
        assert_eq!(
            parse_address(&"é".repeat(16)),
            None,
            "never a panic on a char boundary"
        );
    }
}
