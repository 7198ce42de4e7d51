//! A shard's part of retention, owned by the shard's thread (Seastar's `sharded<>`): every
//! tombstone (a copy on each shard, told to all as one is written or superseded, so a read on
//! any shard answers `expired` without a lock or a disk read), and, for the sessions the shard
//! owns, when each is due, which its policy has the archive pack, and the index entries the
//! shard wrote. No lock is taken: only the shard's own thread reaches its part.

use std::cell::RefCell;
use std::collections::{HashMap, HashSet};
use std::time::Duration;

use broca_core::Expiry;
use broca_wal::SessionTriple;

use super::{Ended, Tombstone};

thread_local! {
    static LOCAL: RefCell<ShardRetention> = RefCell::new(ShardRetention::default());
}

/// Runs `f` on this thread's (this shard's) part of retention.
pub(crate) fn with<R>(f: impl FnOnce(&mut ShardRetention) -> R) -> R {
    LOCAL.with(|local| f(&mut local.borrow_mut()))
}

/// A tombstone as a shard keeps it.
#[derive(Debug, Clone)]
struct Tomb {
    stone: Tombstone,
    /// A fresh record (a WAL of another lineage) was made since.
    superseded: bool,
}

/// One shard's part of retention.
#[derive(Debug, Default)]
pub(crate) struct ShardRetention {
    tombs: HashMap<String, Tomb>,
    due: HashMap<String, (SessionTriple, Expiry)>,
    archive: HashMap<String, Duration>,
    /// `(address, history version)` of the index entries this shard wrote (a record expired
    /// since has the next version, whose entry is written again).
    indexed: HashSet<(String, u64)>,
}

impl ShardRetention {
    /// A fresh part, with the tombstones and (of the sessions `owns`) the due times and
    /// policies read at start.
    pub(crate) fn seeded(loaded: &super::Loaded, owns: impl Fn(&SessionTriple) -> bool) -> Self {
        let mut me = ShardRetention::default();
        for (stone, superseded) in &loaded.tombs {
            me.put(stone.clone(), *superseded);
        }
        for (triple, expiry) in loaded.due.iter().filter(|(t, _)| owns(t)) {
            if me.ended(&triple.address().to_string()).is_none() {
                me.note(triple, *expiry);
            }
        }
        for (triple, idle) in loaded.archive.iter().filter(|(t, _)| owns(t)) {
            me.archive.insert(wal_name(triple), *idle);
        }
        me
    }

    /// Keeps a tombstone (written now, or read at start).
    pub(crate) fn put(&mut self, stone: Tombstone, superseded: bool) {
        let addr = stone.address.clone();
        self.tombs.insert(addr, Tomb { stone, superseded });
    }

    /// A record of lineage `lineage` is the session `addr`'s now: a tombstone of another
    /// lineage no longer stands for it.
    pub(crate) fn supersede(&mut self, addr: &str, lineage: &str) {
        if let Some(t) = self.tombs.get_mut(addr) {
            t.superseded |= t.stone.lineage != lineage;
        }
    }

    /// Whether a tombstone of another lineage than `lineage` stands for `addr` (a fresh
    /// record supersedes it, and every shard must hear of that).
    pub(crate) fn superseded_by(&self, addr: &str, lineage: &str) -> bool {
        self.tombs
            .get(addr)
            .is_some_and(|t| !t.superseded && t.stone.lineage != lineage)
    }

    /// How the session of `addr` ended, while a tombstone stands for it.
    pub(crate) fn ended(&self, addr: &str) -> Option<Ended> {
        let tomb = self.tombs.get(addr).filter(|t| !t.superseded)?;
        Some(Ended {
            at_ms: tomb.stone.expired_at_ms,
            deleted: tomb.stone.deleted,
        })
    }

    /// The tombstone standing for the record of lineage `lineage` of `addr`, when one was
    /// written and not superseded: an expiry met again reuses it.
    pub(crate) fn standing(&self, addr: &str, lineage: &str) -> Option<Tombstone> {
        self.tombs
            .get(addr)
            .filter(|t| !t.superseded && t.stone.lineage == lineage)
            .map(|t| t.stone.clone())
    }

    /// The history version of `addr`'s current record: 1, or one past the expired record's.
    pub(crate) fn history_version(&self, addr: &str) -> u64 {
        self.tombs
            .get(addr)
            .map_or(1, |t| t.stone.history_version.saturating_add(1))
    }

    /// When the session `triple` (this shard's) is due, as its actor last saw it (`Never`:
    /// not kept). `true` when it is the first this shard keeps (its look must start).
    pub(crate) fn note(&mut self, triple: &SessionTriple, expiry: Expiry) -> bool {
        let addr = triple.address().to_string();
        let was_empty = self.due.is_empty();
        match expiry {
            Expiry::Never => drop(self.due.remove(&addr)),
            e => drop(self.due.insert(addr, (triple.clone(), e))),
        }
        was_empty && !self.due.is_empty()
    }

    /// Notes the `archive_after_days` of the session `triple`'s policy; `true` when it is the
    /// first session this shard's policies have the archive pack.
    pub(crate) fn note_archive(&mut self, triple: &SessionTriple, days: u32) -> bool {
        let name = wal_name(triple);
        if days == 0 {
            self.archive.remove(&name);
            return false;
        }
        let day = Duration::from_millis(broca_wire::role::DAY_MS);
        let was_empty = self.archive.is_empty();
        self.archive.insert(name, day.saturating_mul(days));
        was_empty
    }

    /// The WALs this shard's policies have the archive pack, and how idle each must be.
    pub(crate) fn archived(&self) -> HashMap<String, Duration> {
        self.archive.clone()
    }

    /// This shard's sessions past their expiry at `now_ms`.
    pub(crate) fn due_now(&self, now_ms: u64) -> Vec<SessionTriple> {
        self.due
            .values()
            .filter(|(_, e)| e.due_at().is_some_and(|t| t <= now_ms))
            .map(|(t, _)| t.clone())
            .collect()
    }

    /// The earliest time one of this shard's sessions is due (`u64::MAX`: none is).
    pub(crate) fn earliest_due(&self) -> u64 {
        self.due
            .values()
            .filter_map(|(_, e)| e.due_at())
            .min()
            .unwrap_or(u64::MAX)
    }

    /// Whether any of this shard's sessions has a retention (its look sleeps otherwise).
    pub(crate) fn any_due(&self) -> bool {
        !self.due.is_empty()
    }

    /// The session of `addr` was deleted: nothing is due or packed for it any more.
    pub(crate) fn forget(&mut self, addr: &str) {
        self.due.remove(addr);
        self.archive.remove(&format!("{addr}.wal"));
    }

    /// Whether this shard wrote `addr`'s index entry for its record of `version`.
    pub(crate) fn indexed(&self, addr: &str, version: u64) -> bool {
        self.indexed.contains(&(addr.to_string(), version))
    }

    pub(crate) fn mark_indexed(&mut self, addr: String, version: u64) {
        self.indexed.insert((addr, version));
    }
}

/// The file name of `triple`'s WAL.
fn wal_name(triple: &SessionTriple) -> String {
    format!("{}.wal", triple.address())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn triple(s: &str) -> SessionTriple {
        SessionTriple::new("/p", "h", s).expect("a triple")
    }

    fn stone(t: &SessionTriple, lineage: &str, version: u64) -> Tombstone {
        Tombstone {
            address: t.address().to_string(),
            lineage: lineage.into(),
            history_version: version,
            expired_at_ms: 50,
            tombstoned_at_ms: 60,
            runs: Vec::new(),
            deleted: false,
        }
    }

    #[test]
    fn a_tombstone_stands_until_a_record_of_another_lineage_supersedes_it() {
        let t = triple("a");
        let addr = t.address().to_string();
        let mut r = ShardRetention::default();
        assert_eq!(r.history_version(&addr), 1, "a session never expired");
        r.put(stone(&t, "l1", 1), false);
        assert_eq!(r.ended(&addr).map(|e| e.at_ms), Some(50));
        assert_eq!(r.history_version(&addr), 2, "the next record's version");
        assert!(r.standing(&addr, "l1").is_some());
        assert!(
            !r.superseded_by(&addr, "l1"),
            "its own record does not supersede it"
        );
        r.supersede(&addr, "l1");
        assert!(r.ended(&addr).is_some(), "still standing");
        assert!(r.superseded_by(&addr, "l2"));
        r.supersede(&addr, "l2");
        assert_eq!(r.ended(&addr), None, "a fresh record is served");
        assert!(r.standing(&addr, "l1").is_none());
        assert_eq!(
            r.history_version(&addr),
            2,
            "the fresh record keeps its version"
        );
    }

    #[test]
    fn due_times_and_index_entries_are_the_shards_own() {
        let (a, b) = (triple("a"), triple("b"));
        let mut r = ShardRetention::default();
        assert_eq!(r.earliest_due(), u64::MAX, "nothing is due");
        assert!(
            r.note(&a, Expiry::At(200)),
            "the first kept starts the look"
        );
        assert!(!r.note(&b, Expiry::Delete(100)), "the look runs already");
        assert_eq!(r.earliest_due(), 100);
        assert_eq!(r.due_now(150), vec![b.clone()]);
        assert!(!r.note(&b, Expiry::Never));
        assert_eq!(r.earliest_due(), 200, "b is kept no more");
        r.forget(&a.address().to_string());
        assert!(!r.any_due(), "a deleted session is due no more");
        let addr = a.address().to_string();
        assert!(!r.indexed(&addr, 1));
        r.mark_indexed(addr.clone(), 1);
        assert!(r.indexed(&addr, 1));
        assert!(
            !r.indexed(&addr, 2),
            "a record after an expiry is listed again"
        );
        assert!(r.note_archive(&a, 3), "the first packed by its policy");
        assert!(!r.note_archive(&b, 1));
        assert_eq!(r.archived().len(), 2);
        assert!(!r.note_archive(&a, 0));
        assert_eq!(r.archived().len(), 1);
    }
}
