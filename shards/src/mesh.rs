//! The shard mesh: one queue into each shard, bounded by count. A message that finds its
//! shard's queue full is refused at once ([`MeshError::Full`], counted) rather than queued
//! without limit; a thread outside the shards waits for room instead
//! ([`Mesh::send_blocking`]), and the shards' own control messages ([`Mesh::send`]: stop, the
//! end of the mesh) are never refused, since losing one would leave a shard running. Every
//! cross-shard hop is one of these calls.
//!
//! The bound is a count kept beside the channel (the channel itself is unbounded): a bounded
//! `futures` channel guarantees each sender one slot past its buffer, so a sender cloned per
//! message never meets the bound.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use futures_channel::mpsc;
use futures_lite::StreamExt;

/// Messages that may wait in one shard's queue.
pub const MESH_QUEUE_MAX: usize = 4096;

/// How long a thread outside the shards sleeps while a shard's queue is full.
const BLOCKING_RETRY: std::time::Duration = std::time::Duration::from_millis(1);

/// Why a message did not reach its shard.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MeshError {
    /// The shard's queue is full: the caller should refuse and let the client retry.
    Full,
    /// The shard has stopped.
    Gone,
}

/// One shard's queue: its sender and how many messages wait in it.
struct Lane<M> {
    tx: mpsc::UnboundedSender<M>,
    queued: Arc<AtomicUsize>,
}

/// The senders into every shard, with the count of messages refused for a full queue.
pub struct Mesh<M> {
    lanes: Vec<Lane<M>>,
    full: AtomicU64,
}

/// The receiving end of one shard's queue.
pub struct Inbound<M> {
    rx: mpsc::UnboundedReceiver<M>,
    queued: Arc<AtomicUsize>,
}

impl<M> Inbound<M> {
    /// The next message; `None` once every sender is gone.
    pub async fn next(&mut self) -> Option<M> {
        let msg = self.rx.next().await?;
        let before = self.queued.fetch_sub(1, Ordering::AcqRel);
        assert!(
            before > 0,
            "a message received was counted when it was sent"
        );
        Some(msg)
    }
}

impl<M> Mesh<M> {
    /// Messages waiting in each shard's queue, in shard order.
    pub fn depths(&self) -> Vec<usize> {
        self.lanes
            .iter()
            .map(|l| l.queued.load(Ordering::Acquire))
            .collect()
    }

    /// A mesh of `shards` queues, and the receiving end of each, in shard order.
    pub fn new(shards: usize) -> (Mesh<M>, Vec<Inbound<M>>) {
        assert!(shards > 0, "a mesh has at least one shard");
        let (lanes, receivers): (Vec<_>, Vec<_>) = (0..shards)
            .map(|_| {
                let (tx, rx) = mpsc::unbounded::<M>();
                let queued = Arc::new(AtomicUsize::new(0));
                let lane = Lane {
                    tx,
                    queued: queued.clone(),
                };
                (lane, Inbound { rx, queued })
            })
            .unzip();
        assert_eq!(lanes.len(), shards);
        let mesh = Mesh {
            lanes,
            full: AtomicU64::new(0),
        };
        (mesh, receivers)
    }

    /// How many shards the mesh joins.
    pub fn shards(&self) -> usize {
        self.lanes.len()
    }

    /// The shard that owns `key` (see [`crate::shard_for`]).
    pub fn shard_of(&self, key: u64) -> usize {
        crate::shard_for(key, self.shards())
    }

    fn lane(&self, shard: usize) -> &Lane<M> {
        assert!(shard < self.lanes.len(), "shard {shard} is not in the mesh");
        &self.lanes[shard]
    }

    /// Puts `msg` in the lane, counted; it was given room already.
    fn push(lane: &Lane<M>, msg: M) -> Result<(), MeshError> {
        match lane.tx.unbounded_send(msg) {
            Ok(()) => Ok(()),
            Err(_) => {
                lane.queued.fetch_sub(1, Ordering::AcqRel);
                Err(MeshError::Gone)
            }
        }
    }

    /// Sends `msg` to `shard` if its queue has room.
    pub fn try_send(&self, shard: usize, msg: M) -> Result<(), MeshError> {
        let lane = self.lane(shard);
        if lane.queued.fetch_add(1, Ordering::AcqRel) >= MESH_QUEUE_MAX {
            lane.queued.fetch_sub(1, Ordering::AcqRel);
            self.full.fetch_add(1, Ordering::Relaxed);
            return Err(MeshError::Full);
        }
        Self::push(lane, msg)
    }

    /// Sends a control message of the shards to `shard`: never refused for a full queue
    /// (there are a few per shard in a daemon's life).
    pub async fn send(&self, shard: usize, msg: M) -> Result<(), MeshError> {
        let lane = self.lane(shard);
        lane.queued.fetch_add(1, Ordering::AcqRel);
        Self::push(lane, msg)
    }

    /// Sends `msg` from a thread outside the shards, waiting for room (signals, the resume
    /// of runs found at start).
    pub fn send_blocking(&self, shard: usize, msg: M) -> Result<(), MeshError> {
        let lane = self.lane(shard);
        while lane.queued.fetch_add(1, Ordering::AcqRel) >= MESH_QUEUE_MAX {
            lane.queued.fetch_sub(1, Ordering::AcqRel);
            if lane.tx.is_closed() {
                return Err(MeshError::Gone);
            }
            std::thread::sleep(BLOCKING_RETRY);
        }
        Self::push(lane, msg)
    }

    /// Messages refused because their shard's queue was full.
    pub fn full_count(&self) -> u64 {
        self.full.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_queue_refuses_and_counts_until_its_shard_takes_a_message() {
        let (mesh, mut receivers) = Mesh::<usize>::new(2);
        for i in 0..MESH_QUEUE_MAX {
            mesh.try_send(1, i).unwrap();
        }
        assert_eq!(mesh.try_send(1, 0), Err(MeshError::Full));
        assert_eq!(mesh.full_count(), 1);
        // Shard 0's queue is its own: not full.
        mesh.try_send(0, 7).unwrap();
        crate::run_local(async {
            assert_eq!(receivers[0].next().await, Some(7));
            // Shard 1 takes one: there is room for one more, in order after the rest.
            assert_eq!(receivers[1].next().await, Some(0));
            mesh.try_send(1, MESH_QUEUE_MAX).unwrap();
            assert_eq!(mesh.try_send(1, 0), Err(MeshError::Full));
            // A control message goes past the bound.
            mesh.send(1, usize::MAX).await.unwrap();
            let mut last = 0;
            for _ in 0..MESH_QUEUE_MAX + 1 {
                last = receivers[1].next().await.unwrap();
            }
            assert_eq!(last, usize::MAX);
        })
        .unwrap();
        // A stopped shard is gone, not full.
        drop(receivers.remove(0));
        assert_eq!(mesh.try_send(0, 1), Err(MeshError::Gone));
        assert_eq!(mesh.send_blocking(0, 1), Err(MeshError::Gone));
    }
}
