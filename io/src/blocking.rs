//! The executor's blocking pool, counted: every job handed to it says what kind of work it is,
//! and each kind's jobs, the time they took from hand-off to answer (waiting for a thread
//! included) and the jobs under way are counted process-wide, for `/metrics` and
//! `health.check`. A job on a shard's pool is one the shard must not run itself: a file read
//! whole, a replay's decode, a name lookup.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

/// What a blocking job does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Decoding a WAL into a session as its writer opens it.
    WalReplay,
    /// Reading a session's WAL (or its archived copy) as a reader (reads, lists, imports).
    WalRead,
    /// Reading a subscription's backlog from the WAL.
    SubscriptionRead,
    /// Restoring an archived session before a write.
    ArchiveRestore,
    /// Reading the store (its listing).
    StoreRead,
    /// Projecting WALs into the store.
    StoreWrite,
    /// Reading another harness's log and checking it (imports).
    Import,
    /// Opening a route to a tool module.
    ToolRoute,
    /// A log file read whole at open.
    LogRead,
    /// A host name looked up.
    Dns,
    /// A session's content store (uploads taken, checked, read).
    Media,
    /// A session past its retention: its tombstone written, its content deleted.
    Retention,
    /// Files made ahead for new sessions' WALs.
    WalSpares,
    /// One session packed (and its reasoning pruned) now, at a request.
    ArchivePack,
}

impl Kind {
    /// Every kind, in the order metrics list them.
    pub const ALL: [Kind; 14] = [
        Kind::WalReplay,
        Kind::WalRead,
        Kind::SubscriptionRead,
        Kind::ArchiveRestore,
        Kind::StoreRead,
        Kind::StoreWrite,
        Kind::Import,
        Kind::ToolRoute,
        Kind::LogRead,
        Kind::Dns,
        Kind::Media,
        Kind::Retention,
        Kind::WalSpares,
        Kind::ArchivePack,
    ];

    /// The kind's label.
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::WalReplay => "wal_replay",
            Kind::WalRead => "wal_read",
            Kind::SubscriptionRead => "subscription_read",
            Kind::ArchiveRestore => "archive_restore",
            Kind::StoreRead => "store_read",
            Kind::StoreWrite => "store_write",
            Kind::Import => "import",
            Kind::ToolRoute => "tool_route",
            Kind::LogRead => "log_read",
            Kind::Dns => "dns",
            Kind::Media => "media",
            Kind::Retention => "retention",
            Kind::WalSpares => "wal_spares",
            Kind::ArchivePack => "archive_pack",
        }
    }

    fn index(self) -> usize {
        Kind::ALL
            .iter()
            .position(|k| *k == self)
            .expect("every kind is listed")
    }
}

/// One kind's counts.
struct Counts {
    jobs: AtomicU64,
    micros: AtomicU64,
    under_way: AtomicU64,
}

#[allow(clippy::declare_interior_mutable_const)]
const ZERO: Counts = Counts {
    jobs: AtomicU64::new(0),
    micros: AtomicU64::new(0),
    under_way: AtomicU64::new(0),
};

static COUNTS: [Counts; Kind::ALL.len()] = [ZERO; Kind::ALL.len()];

/// A kind's counts as they stand.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KindStats {
    pub kind: Kind,
    /// Jobs done.
    pub jobs: u64,
    /// Their time, hand-off to answer, in microseconds.
    pub micros: u64,
    /// Jobs handed off and not yet answered (waiting for a thread, or running).
    pub under_way: u64,
}

/// Every kind's counts.
pub fn stats() -> Vec<KindStats> {
    Kind::ALL
        .iter()
        .map(|&kind| {
            let c = &COUNTS[kind.index()];
            KindStats {
                kind,
                jobs: c.jobs.load(Ordering::Relaxed),
                micros: c.micros.load(Ordering::Relaxed),
                under_way: c.under_way.load(Ordering::Relaxed),
            }
        })
        .collect()
}

/// Runs `f` on the current executor's blocking pool, counted as `kind`.
pub async fn run<T: Send + 'static>(kind: Kind, f: impl FnOnce() -> T + Send + 'static) -> T {
    let c = &COUNTS[kind.index()];
    c.under_way.fetch_add(1, Ordering::Relaxed);
    let began = Instant::now();
    let out = glommio::executor().spawn_blocking(f).await;
    c.micros
        .fetch_add(began.elapsed().as_micros() as u64, Ordering::Relaxed);
    c.jobs.fetch_add(1, Ordering::Relaxed);
    c.under_way.fetch_sub(1, Ordering::Relaxed);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_job_is_counted_under_its_kind_with_its_time() {
        let before = stats()[Kind::Dns.index()];
        let out = glommio::LocalExecutorBuilder::default()
            .spawn(|| async {
                run(Kind::Dns, || {
                    std::thread::sleep(std::time::Duration::from_millis(5));
                    7
                })
                .await
            })
            .unwrap()
            .join()
            .unwrap();
        assert_eq!(out, 7);
        let after = stats()[Kind::Dns.index()];
        assert_eq!(after.jobs, before.jobs + 1);
        assert!(after.micros >= before.micros + 5_000, "{after:?}");
        assert_eq!(after.under_way, before.under_way);
    }
}
