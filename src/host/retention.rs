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
//! reading every WAL; the host keeps when each is due ([`Retention::note`]), and shard 0 looks
//! for those due every [`broca_wire::role::RETENTION_SWEEP_MS`].

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

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

struct Tomb {
    stone: Tombstone,
    /// A fresh record (a WAL of another lineage) was made since.
    superseded: bool,
}

/// The host's retention state: tombstones by address, and when each session with a retention
/// is due.
pub struct Retention {
    state_dir: PathBuf,
    wal_dir: PathBuf,
    tombs: Mutex<HashMap<String, Tomb>>,
    due: Mutex<HashMap<String, (SessionTriple, Expiry)>>,
    /// Sessions whose index entry is written (this process's).
    indexed: Mutex<std::collections::HashSet<String>>,
    /// The WALs (by file name) whose storage policy packs them once idle this long
    /// (`archive_after_days`).
    archive: Mutex<HashMap<String, std::time::Duration>>,
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
    /// thread: at start, before any shard runs). A session listed whose WAL is gone, or that
    /// has no retention any more, leaves the list.
    pub fn load(state_dir: &Path, wal_dir: &Path) -> std::io::Result<Retention> {
        let r = Retention {
            state_dir: state_dir.to_path_buf(),
            wal_dir: wal_dir.to_path_buf(),
            tombs: Mutex::default(),
            due: Mutex::default(),
            indexed: Mutex::default(),
            archive: Mutex::default(),
        };
        for dir in [TOMB_DIR, INDEX_DIR] {
            broca_owner_only::create_dir(&state_dir.join(dir))?;
        }
        for (name, bytes) in json_files(&state_dir.join(TOMB_DIR))? {
            match serde_json::from_slice::<Tombstone>(&bytes) {
                Ok(stone) => r.put_tomb(stone),
                Err(e) => tracing::error!("{TOMB_DIR}/{name}: not a tombstone, skipped: {e}"),
            }
        }
        for (name, bytes) in json_files(&state_dir.join(INDEX_DIR))? {
            let Ok(triple) = serde_json::from_slice::<SessionTriple>(&bytes) else {
                tracing::error!("{INDEX_DIR}/{name}: not a session triple, skipped");
                continue;
            };
            let path = broca_wal_writer::wal_path(wal_dir, &triple);
            let expiry = match broca_core::read_session(&path, broca_core::Keep::State) {
                Ok(Some(read)) => {
                    r.note_archive(&triple, read.session.policy.as_ref());
                    read.session.expiry()
                }
                Ok(None) => Expiry::Never,
                Err(e) => {
                    // Kept listed: it is looked at again when its session is next opened.
                    tracing::error!(
                        "session {}: its retention cannot be read: {e}",
                        triple.address()
                    );
                    continue;
                }
            };
            let addr = triple.address().to_string();
            r.indexed.lock().unwrap().insert(addr.clone());
            r.note(&triple, expiry);
        }
        Ok(r)
    }

    fn put_tomb(&self, stone: Tombstone) {
        let path = self.wal_dir.join(format!("{}.wal", stone.address));
        let superseded = record_lineage(&path).is_some_and(|l| l != stone.lineage);
        self.tombs
            .lock()
            .unwrap()
            .insert(stone.address.clone(), Tomb { stone, superseded });
    }

    /// The tombstones whose deletion may not have finished (a crash cut it short): each is
    /// deleted again at start (deleting is idempotent).
    pub fn pending(&self) -> Vec<Tombstone> {
        let tombs = self.tombs.lock().unwrap();
        tombs
            .values()
            .filter(|t| !t.superseded)
            .map(|t| t.stone.clone())
            .collect()
    }

    /// When the session of `addr` expired, while it is expired: a tombstone stands for it and
    /// no fresh record was made since. Reads the WAL's header for a tombstoned session (at
    /// most once past its supersession).
    pub fn expired_at(&self, addr: &str) -> Option<u64> {
        self.ended(addr).map(|e| e.at_ms)
    }

    /// How the session of `addr` ended, while a tombstone stands for it and no fresh record
    /// was made since.
    pub fn ended(&self, addr: &str) -> Option<Ended> {
        let mut tombs = self.tombs.lock().unwrap();
        let tomb = tombs.get_mut(addr)?;
        if tomb.superseded {
            return None;
        }
        let path = self.wal_dir.join(format!("{addr}.wal"));
        if record_lineage(&path).is_some_and(|l| l != tomb.stone.lineage) {
            tomb.superseded = true;
            return None;
        }
        Some(Ended {
            at_ms: tomb.stone.expired_at_ms,
            deleted: tomb.stone.deleted,
        })
    }

    /// The tombstone standing for the record of lineage `lineage` of `addr`, when one was
    /// written and its deletion did not finish: an expiry met again reuses it.
    pub fn standing(&self, addr: &str, lineage: &str) -> Option<Tombstone> {
        let tombs = self.tombs.lock().unwrap();
        tombs
            .get(addr)
            .filter(|t| !t.superseded && t.stone.lineage == lineage)
            .map(|t| t.stone.clone())
    }

    /// The history version of the session of `addr`'s current record: 1, or one past the
    /// expired record's.
    pub fn history_version(&self, addr: &str) -> u64 {
        let tombs = self.tombs.lock().unwrap();
        tombs
            .get(addr)
            .map_or(1, |t| t.stone.history_version.saturating_add(1))
    }

    /// When the session `triple` is due, as its actor last saw it (`Never`: not kept).
    /// `true` when it is the first session kept since none was (shard 0's look must start).
    pub fn note(&self, triple: &SessionTriple, expiry: Expiry) -> bool {
        let addr = triple.address().to_string();
        let mut due = self.due.lock().unwrap();
        let was_empty = due.is_empty();
        match expiry {
            Expiry::Never => {
                due.remove(&addr);
            }
            e => {
                due.insert(addr, (triple.clone(), e));
            }
        }
        was_empty && !due.is_empty()
    }

    /// Notes the `archive_after_days` of the session `triple`'s policy; `true` when it is the
    /// first session the archive packs by its policy (its thread must start).
    pub fn note_archive(
        &self,
        triple: &SessionTriple,
        policy: Option<&cortexkit_role_llm_runner::session_retention::RetentionPolicy>,
    ) -> bool {
        let days = policy.map_or(0, |p| p.archive_after_days);
        let name = format!("{}.wal", triple.address());
        let mut archive = self.archive.lock().unwrap();
        if days == 0 {
            archive.remove(&name);
            return false;
        }
        let idle = std::time::Duration::from_millis(
            u64::from(days).saturating_mul(broca_wire::role::DAY_MS),
        );
        let was_empty = archive.is_empty();
        archive.insert(name, idle);
        was_empty
    }

    /// Whether any session's policy asks the archive to pack it.
    pub fn any_archived(&self) -> bool {
        !self.archive.lock().unwrap().is_empty()
    }

    /// The WALs the archive packs by their policy, and how idle each must be.
    pub fn archived(&self) -> HashMap<String, std::time::Duration> {
        self.archive.lock().unwrap().clone()
    }

    /// Whether the session of `addr` is past its expiry and not yet tombstoned.
    pub fn is_due(&self, addr: &str, now_ms: u64) -> bool {
        let due = self.due.lock().unwrap();
        due.get(addr)
            .and_then(|(_, e)| e.due_at())
            .is_some_and(|t| t <= now_ms)
    }

    /// The sessions past their expiry now.
    pub fn due_now(&self, now_ms: u64) -> Vec<SessionTriple> {
        let due = self.due.lock().unwrap();
        due.values()
            .filter(|(_, e)| e.due_at().is_some_and(|t| t <= now_ms))
            .map(|(t, _)| t.clone())
            .collect()
    }

    /// Whether any session has a retention (shard 0's sweep sleeps otherwise).
    pub fn any_due(&self) -> bool {
        !self.due.lock().unwrap().is_empty()
    }

    /// Lists `triple` among the sessions with a retention (durable, once per process), before
    /// a send giving it one is admitted.
    pub fn index(&self, triple: &SessionTriple) -> std::io::Result<()> {
        let addr = triple.address().to_string();
        if self.indexed.lock().unwrap().contains(&addr) {
            return Ok(());
        }
        let bytes = serde_json::to_vec(triple).expect("a triple serializes");
        let path = self.state_dir.join(INDEX_DIR).join(format!("{addr}.json"));
        broca_owner_only::write_file(&path, &bytes)?;
        self.indexed.lock().unwrap().insert(addr);
        Ok(())
    }

    /// Writes the tombstone of an expiring session, durably, and keeps it.
    pub fn tombstone(&self, stone: &Tombstone) -> std::io::Result<()> {
        let path = self
            .state_dir
            .join(TOMB_DIR)
            .join(format!("{}.json", stone.address));
        let bytes = serde_json::to_vec(stone).expect("a tombstone serializes");
        broca_owner_only::write_file(&path, &bytes)?;
        self.tombs.lock().unwrap().insert(
            stone.address.clone(),
            Tomb {
                stone: stone.clone(),
                superseded: false,
            },
        );
        Ok(())
    }

    /// Deletes every copy of the record `stone` stands for (blocking: the caller runs it on
    /// the blocking pool, or at start): its WAL (only of that lineage: a fresh record's is
    /// never touched), its archived copies, its media, its store projection, its cached
    /// reading, and its index entry. Idempotent.
    pub fn delete(
        &self,
        stone: &Tombstone,
        store: Option<&broca_store::Store>,
        reads: &broca_core::read::ReadCache,
    ) -> Result<(), String> {
        let wal = self.wal_dir.join(format!("{}.wal", stone.address));
        // A later record (live, or packed by the archive) is never touched.
        if record_lineage(&wal).is_some_and(|l| l != stone.lineage) {
            return Ok(());
        }
        match wal_lineage(&wal) {
            Some(l) if l != stone.lineage => return Ok(()),
            Some(_) => {
                std::fs::remove_file(&wal).map_err(|e| format!("{}: {e}", wal.display()))?;
                sync_dir(&self.wal_dir)?;
            }
            None if wal.exists() => {
                // A WAL whose header never reached the disk: nothing readable, removed too.
                std::fs::remove_file(&wal).map_err(|e| format!("{}: {e}", wal.display()))?;
                sync_dir(&self.wal_dir)?;
            }
            None => {}
        }
        reads.forget(&wal);
        broca_archive::forget(&wal).map_err(|e| format!("its archived copies: {e}"))?;
        let media = self.state_dir.join("media").join(&stone.address);
        if media.exists() {
            std::fs::remove_dir_all(&media).map_err(|e| format!("{}: {e}", media.display()))?;
            sync_dir(&self.state_dir.join("media"))?;
        }
        if let Some(store) = store {
            let addr = parse_address(&stone.address)?;
            store
                .forget(&addr)
                .map_err(|e| format!("its store projection: {e}"))?;
        }
        let index = self
            .state_dir
            .join(INDEX_DIR)
            .join(format!("{}.json", stone.address));
        match std::fs::remove_file(&index) {
            Ok(()) => sync_dir(&self.state_dir.join(INDEX_DIR))?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(format!("{}: {e}", index.display())),
        }
        self.indexed.lock().unwrap().remove(&stone.address);
        self.due.lock().unwrap().remove(&stone.address);
        self.archive
            .lock()
            .unwrap()
            .remove(&format!("{}.wal", stone.address));
        Ok(())
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
            let state = broca_core::read_session(&path, broca_core::Keep::State);
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

fn sync_dir(dir: &Path) -> Result<(), String> {
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| format!("{}: {e}", dir.display()))
}

fn parse_address(hex: &str) -> Result<[u8; 16], String> {
    let bad = || format!("`{hex}` is not a session address");
    if hex.len() != 32 {
        return Err(bad());
    }
    let mut out = [0u8; 16];
    for (i, b) in out.iter_mut().enumerate() {
        *b = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).map_err(|_| bad())?;
    }
    Ok(out)
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
        assert_eq!(parse_address(&hex).unwrap(), a);
        assert!(parse_address("zz").is_err());
        assert!(parse_address(&"g".repeat(32)).is_err());
    }
}
