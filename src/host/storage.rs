//! What the daemon knows of its storage's health: WAL writes that failed, by kind, and
//! whether the file system was last seen full. A full disk refuses writes by name
//! (`storage_full`, 503, retryable) while reads go on; `/healthz` says `degraded` with the
//! reason until a write succeeds again (space freed: no restart needed, the session's log is
//! reopened by its next command).

use std::sync::atomic::{AtomicU64, Ordering};

use broca_session::ActorError;
use broca_wal::WalError;

/// The kinds of failed WAL writes counted (`broca_wal_write_errors_total{kind}`).
pub const WRITE_ERROR_KINDS: [&str; 4] = ["storage_full", "out_of_descriptors", "closed", "io"];

#[derive(Debug, Default)]
pub struct StorageHealth {
    /// Failed WAL writes (or opens for writing), by [`WRITE_ERROR_KINDS`].
    write_errors: [AtomicU64; 4],
    /// Commands answered `storage_full`.
    full_refusals: AtomicU64,
    /// When a write last found the file system full (Unix ms; 0: not since the last
    /// write that succeeded).
    full_since_ms: AtomicU64,
}

impl StorageHealth {
    /// Counts `e` when it is a failed WAL write; answers whether it was a full file system.
    pub fn failed(&self, e: &ActorError) -> bool {
        let ActorError::Wal(w) = e else {
            return false;
        };
        let kind = match w {
            WalError::StorageFull { .. } => 0,
            WalError::OutOfDescriptors { .. } => 1,
            WalError::Closed { .. } => 2,
            WalError::Io { .. } => 3,
            _ => return false,
        };
        self.write_errors[kind].fetch_add(1, Ordering::Relaxed);
        let full = kind == 0;
        if full {
            self.full_refusals.fetch_add(1, Ordering::Relaxed);
            let now = now_unix_ms().max(1);
            let _ =
                self.full_since_ms
                    .compare_exchange(0, now, Ordering::AcqRel, Ordering::Acquire);
        }
        full
    }

    /// A WAL write succeeded: the file system takes writes again.
    pub fn wrote(&self) {
        if self.full_since_ms.load(Ordering::Relaxed) != 0 {
            self.full_since_ms.store(0, Ordering::Release);
        }
    }

    /// Since when (Unix ms) writes find the file system full, while they do.
    pub fn full_since(&self) -> Option<u64> {
        match self.full_since_ms.load(Ordering::Acquire) {
            0 => None,
            t => Some(t),
        }
    }

    /// Each kind's count of failed writes.
    pub fn write_errors(&self) -> impl Iterator<Item = (&'static str, u64)> + '_ {
        WRITE_ERROR_KINDS
            .iter()
            .zip(&self.write_errors)
            .map(|(k, n)| (*k, n.load(Ordering::Relaxed)))
    }

    pub fn full_refusals(&self) -> u64 {
        self.full_refusals.load(Ordering::Relaxed)
    }

    /// The health answer's JSON: `ok`, or `degraded` with its reasons.
    pub fn health_json(&self) -> serde_json::Value {
        match self.full_since() {
            None => serde_json::json!({"status": "ok"}),
            Some(since) => serde_json::json!({
                "status": "degraded",
                "reasons": [{
                    "code": "storage_full",
                    "since_unix_ms": since,
                    "message": "the file system holding the WALs is full: sends and imports \
                                are refused storage_full (retry once space is freed); reads \
                                go on",
                }],
            }),
        }
    }
}

fn now_unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    #[test]
    fn a_full_file_system_degrades_health_until_a_write_succeeds() {
        let h = StorageHealth::default();
        assert_eq!(h.health_json()["status"], "ok");
        let full = ActorError::Wal(WalError::StorageFull {
            path: PathBuf::from("/s/wal/x.wal"),
            op: "write",
        });
        assert!(h.failed(&full));
        let since = h.full_since().unwrap();
        assert!(!h.failed(&ActorError::Wal(WalError::Io {
            path: PathBuf::from("/s/wal/x.wal"),
            op: "fdatasync",
            message: "EIO".into(),
        })));
        assert!(h.failed(&full));
        assert_eq!(h.full_since(), Some(since), "the first failure dates it");
        let v = h.health_json();
        assert_eq!(
            (&v["status"], &v["reasons"][0]["code"]),
            (
                &serde_json::json!("degraded"),
                &serde_json::json!("storage_full")
            )
        );
        let counts: Vec<_> = h.write_errors().collect();
        assert_eq!(
            counts,
            [
                ("storage_full", 2),
                ("out_of_descriptors", 0),
                ("closed", 0),
                ("io", 1)
            ]
        );
        assert_eq!(h.full_refusals(), 2);
        h.wrote();
        assert_eq!(h.health_json()["status"], "ok");
    }
}
