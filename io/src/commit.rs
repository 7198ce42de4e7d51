//! The per-shard group-commit scheduler. Every log of a shard registers with one [`Committer`]:
//! it bounds how many batch writes (each a write plus its `fdatasync`) are in flight across the
//! shard at once, and it keeps the shard's durability counters (appends, fsyncs, fsync latency).

use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::time::Duration;

use glommio::sync::{Permit, Semaphore};

/// Batch writes in flight across one shard, by default.
pub const INFLIGHT_BATCHES_MAX_DEFAULT: usize = 4096;

/// Upper bounds, in microseconds, of the fsync latency histogram's buckets (the last bucket
/// takes everything above).
pub const FSYNC_LATENCY_BUCKETS_US: [u64; 12] = [
    50, 100, 200, 400, 800, 1_600, 3_200, 6_400, 12_800, 25_600, 51_200, 102_400,
];

/// A snapshot of a committer's counters.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CommitStats {
    /// Appends accepted into a batch.
    pub appends: u64,
    /// Bytes appended (frames, before alignment padding).
    pub append_bytes: u64,
    /// `fdatasync` calls completed successfully.
    pub fsyncs: u64,
    /// `fdatasync` calls that failed (each fatal for its log).
    pub fsync_errors: u64,
    /// Bytes handed to the kernel in batch writes, alignment padding and zeroing included.
    pub write_bytes: u64,
    /// Batches started because deferred appends waited `defer_max` with nothing urgent to
    /// carry them.
    pub defer_timeouts: u64,
    /// fsync latency histogram: counts per bucket of [`FSYNC_LATENCY_BUCKETS_US`], plus one
    /// overflow bucket at the end.
    pub fsync_latency_buckets: Vec<u64>,
    /// Sum of all fsync latencies, in microseconds.
    pub fsync_latency_sum_us: u64,
}

/// The group-commit scheduler of one shard; cheap to clone (a shared handle).
#[derive(Clone)]
pub struct Committer {
    inner: Rc<Inner>,
}

struct Inner {
    inflight: Semaphore,
    flushing_logs: Cell<usize>,
    appends: Cell<u64>,
    append_bytes: Cell<u64>,
    fsyncs: Cell<u64>,
    fsync_errors: Cell<u64>,
    write_bytes: Cell<u64>,
    defer_timeouts: Cell<u64>,
    latency: RefCell<[u64; FSYNC_LATENCY_BUCKETS_US.len() + 1]>,
    latency_sum_us: Cell<u64>,
}

impl Default for Committer {
    fn default() -> Self {
        Committer::new(INFLIGHT_BATCHES_MAX_DEFAULT)
    }
}

impl Committer {
    /// A committer that lets at most `inflight_batches_max` batch writes run at once.
    pub fn new(inflight_batches_max: usize) -> Committer {
        assert!(
            inflight_batches_max > 0,
            "a committer needs at least one in-flight batch"
        );
        Committer {
            inner: Rc::new(Inner {
                inflight: Semaphore::new(inflight_batches_max as u64),
                flushing_logs: Cell::new(0),
                appends: Cell::new(0),
                append_bytes: Cell::new(0),
                fsyncs: Cell::new(0),
                fsync_errors: Cell::new(0),
                write_bytes: Cell::new(0),
                defer_timeouts: Cell::new(0),
                latency: RefCell::new([0; FSYNC_LATENCY_BUCKETS_US.len() + 1]),
                latency_sum_us: Cell::new(0),
            }),
        }
    }

    /// Waits for room for one more batch write in flight.
    pub(crate) async fn admit_batch(&self) -> Permit<'_> {
        self.inner
            .inflight
            .acquire_permit(1)
            .await
            .expect("the committer's semaphore is never closed")
    }

    /// A log has appends to flush (its flush task started).
    pub(crate) fn flush_started(&self) {
        self.inner
            .flushing_logs
            .set(self.inner.flushing_logs.get() + 1);
    }

    /// A log's flush task ended.
    pub(crate) fn flush_ended(&self) {
        let n = self.inner.flushing_logs.get();
        assert!(n > 0, "flush_ended without flush_started");
        self.inner.flushing_logs.set(n - 1);
    }

    /// Logs of this shard with a flush task running.
    pub(crate) fn flushing_logs(&self) -> usize {
        self.inner.flushing_logs.get()
    }

    pub(crate) fn count_append(&self, bytes: usize) {
        bump(&self.inner.appends, 1);
        bump(&self.inner.append_bytes, bytes as u64);
    }

    pub(crate) fn count_defer_timeout(&self) {
        bump(&self.inner.defer_timeouts, 1);
    }

    pub(crate) fn count_write(&self, bytes: usize) {
        bump(&self.inner.write_bytes, bytes as u64);
    }

    pub(crate) fn count_fsync(&self, latency: Duration) {
        bump(&self.inner.fsyncs, 1);
        let us = latency.as_micros().min(u128::from(u64::MAX)) as u64;
        bump(&self.inner.latency_sum_us, us);
        let bucket = FSYNC_LATENCY_BUCKETS_US
            .iter()
            .position(|&upper| us <= upper)
            .unwrap_or(FSYNC_LATENCY_BUCKETS_US.len());
        self.inner.latency.borrow_mut()[bucket] += 1;
    }

    pub(crate) fn count_fsync_error(&self) {
        bump(&self.inner.fsync_errors, 1);
    }

    /// The counters so far.
    pub fn stats(&self) -> CommitStats {
        CommitStats {
            appends: self.inner.appends.get(),
            append_bytes: self.inner.append_bytes.get(),
            fsyncs: self.inner.fsyncs.get(),
            fsync_errors: self.inner.fsync_errors.get(),
            write_bytes: self.inner.write_bytes.get(),
            defer_timeouts: self.inner.defer_timeouts.get(),
            fsync_latency_buckets: self.inner.latency.borrow().to_vec(),
            fsync_latency_sum_us: self.inner.latency_sum_us.get(),
        }
    }
}

fn bump(cell: &Cell<u64>, by: u64) {
    cell.set(cell.get().wrapping_add(by));
}
